#!/usr/bin/env bash
# One device call (~8 minutes) that checks branch wip/pending = wip/merge-v3 + wip/sketch-v4 + wip/estimate-mma (none
# run on a GPU yet; NOTES has each prediction):
#  1. the split-KV, estimate and stop-rule tests on the new builds;
#  2. psa_merge_splits v3: the dense kernel at the three model shapes (SmolLM2's D 64 measured for the first time);
#  3. the quant3 estimate v3 (est_v=3) against v4 (est_v=4) on the real Gemma layer-17 K/V, kernel by kernel, and
#     the cuboid_mean estimate on the tensor cores (ema rows; the CUDA-core version took 34.2 / 5.1 µs at B = 32 / 1).
#   run(command="bash benchmarks/device_pending.sh", carry=[".gl/gemma3_xml_l17_32k.npz"])
# or in two calls when one would pass the 600 s limit: `... device_pending.sh tests`, then `... device_pending.sh bench`.
set -u
PART="${1:-all}"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD:$PWD/benchmarks" OUT="${OUT:-/tmp/psa-out}"
mkdir -p "$OUT"
if [ "$PART" != bench ]; then
timeout 300 python3 -m pytest -q -p no:cacheprovider -W ignore -rf --tb=short tests/test_fast.py \
    tests/test_fast_bf16.py tests/test_stop_rules.py -k "split or dense or topk or sketch or quant3 or stop or auto or estimate or conform or ema" \
    > "$OUT/t_pending.log" 2>&1
echo "tests rc=$?"; tail -6 "$OUT/t_pending.log"
fi
[ "$PART" = tests ] && exit 0
cd benchmarks
for shape in gemma3 llama8b smollm2; do
  timeout 90 python3 exp_dense_tune.py --shape $shape --sizes 8192,32768 --batches 1,8,32 --default-only \
      --out "$OUT/dense_shapes.jsonl" 2>&1 | grep -v Warn | grep "^#\|^T=\|warps"
done
for v in 3 4; do
  mkdir -p "$OUT/est_v$v"
  timeout 90 python3 exp_kernel_defines.py sketch est_v=$v -- profile_decode_step.py --kv ../.gl/gemma3_xml_l17_32k.npz \
      --shape gemma3 --size 32768 --batches 32,8,1 --variants dense,default:s1.0,ema:s2.0 --out "$OUT/est_v$v" 2>&1 \
      | grep -v Warn | grep "^#\|^T=\|estimate\|decode_spec\|verify\|merge\|psa_decode "
done
# Llama-3.1-8B's dense step at 32K, B = 1 (0.85x SDPA before merge v3), kernel by kernel
timeout 60 python3 profile_decode_step.py --share 0.05 --shape llama8b --size 32768 --batches 1,8 --variants dense \
    2>&1 | grep -v Warn | grep "^T=\|psa_"
# ncu on the estimates at 32K B = 32 (the next version's question: issue- or latency-bound?): the quant3 estimate
# (v4) and the cuboid_mean estimate (46% of HBM), speed of light, warp states and the instruction mix
for v in default:s1.0 ema:s2.0; do
  timeout 120 ncu --clock-control none -k regex:psa_estimate --launch-skip 3 --launch-count 1 --section SpeedOfLight \
      --section WarpStateStats --section InstructionStats --section Occupancy python3 profile_decode_step.py \
      --kv ../.gl/gemma3_xml_l17_32k.npz --shape gemma3 --batches 32 --variants $v --steps 2 --no-profiler > "$OUT/ncu_est_${v%%:*}.txt" 2>&1
  echo "ncu $v rc=$?"; grep -E "Duration|Memory Throughput|DRAM Throughput|Issue Slots Busy|Achieved Occupancy|Stall" \
      "$OUT/ncu_est_${v%%:*}.txt" | head -14
done
