#!/usr/bin/env bash
# What waits for a GPU (benchmarks/NOTES.md has each prediction), one device call (~5 minutes):
#   run(command="bash benchmarks/device_pending.sh", carry=[".gl/gemma3_xml_l17_32k.npz"])
#  1. the quant3 estimate v5 (the 1/2 on the codes, q . lo once a block) against v4 (est_v5=0), kernel by kernel on
#     the real Gemma layer-17 K/V;
#  2. estimate_mma with 64 blocks a warp (one wave at B = 32) against 32;
#  3. the sketch / quant3 / stop-rule tests on the v5 build.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD:$PWD/benchmarks" OUT="${OUT:-/tmp/psa-out}"
mkdir -p "$OUT"
cd benchmarks
for v in 0 1; do
  mkdir -p "$OUT/v5_$v"
  timeout 60 python3 exp_kernel_defines.py sketch est_v5=$v -- profile_decode_step.py --kv ../.gl/gemma3_xml_l17_32k.npz \
      --shape gemma3 --size 32768 --batches 32,8,1 --variants default:s1.0 --out "$OUT/v5_$v" 2>&1 \
      | grep -v Warn | grep "^#\|^T=\|estimate"
done
for launch in "4,32,16" "4,64,64"; do
  mkdir -p "$OUT/mma_$launch"
  timeout 60 python3 -c "
import runpy, sys
from psa_fast import _kernels
_kernels.ESTIMATE_MMA_LAUNCH = ($launch)
sys.argv = ['profile_decode_step.py', '--kv', '../.gl/gemma3_xml_l17_32k.npz', '--shape', 'gemma3', '--size', '32768',
            '--batches', '32,8', '--variants', 'ema:s2.0', '--out', '$OUT/mma_$launch']
runpy.run_path('profile_decode_step.py', run_name='__main__')" 2>&1 | grep -v Warn | grep "^T=\|estimate" | sed "s/^/[$launch] /"
done
cd ..
timeout 170 python3 -m pytest -q -p no:cacheprovider -W ignore -rf --tb=short tests/test_fast.py tests/test_stop_rules.py \
    -k "sketch or quant3 or stop or auto or estimat" > "$OUT/t_v5.log" 2>&1
echo "tests rc=$?"; tail -4 "$OUT/t_v5.log"
