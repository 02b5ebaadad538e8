#!/usr/bin/env bash
# One device call (~5 minutes) that checks branch wip/sketch-v4 (the quant3 estimate with the product transposed,
# PSA_EST_V 4, the default; not yet run on a GPU): the estimate and stop-rule tests on the new build, then the
# estimate stage old (est_v=3) against new (est_v=4) on the real Gemma layer-17 K/V, kernel by kernel.
#   run(command="bash benchmarks/device_pending.sh", carry=[".gl/gemma3_xml_l17_32k.npz"])
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD:$PWD/benchmarks" OUT="${OUT:-/tmp/psa-out}"
mkdir -p "$OUT"
timeout 240 python3 -m pytest -q -p no:cacheprovider -W ignore -rf --tb=short tests/test_fast.py \
    tests/test_fast_bf16.py tests/test_stop_rules.py -k "sketch or quant3 or stop or auto or estimate" \
    > "$OUT/t_sketch.log" 2>&1
echo "tests rc=$?"; tail -6 "$OUT/t_sketch.log"
cd benchmarks
for v in 3 4; do
  mkdir -p "$OUT/est_v$v"
  timeout 90 python3 exp_kernel_defines.py sketch est_v=$v -- profile_decode_step.py --kv ../.gl/gemma3_xml_l17_32k.npz \
      --shape gemma3 --size 32768 --batches 32,8,1 --variants default:s1.0 --out "$OUT/est_v$v" 2>&1 \
      | grep -v Warn | grep "^#\|^T=\|estimate\|decode_spec\|verify"
done
