#!/usr/bin/env bash
# What waits for a GPU (benchmarks/NOTES.md has each prediction). Two parts, one device call each:
#   run(command="bash benchmarks/device_pending.sh tests")
#   run(command="bash benchmarks/device_pending.sh bench", carry=[".gl/gemma3_xml_l17_32k.npz"])
#  tests: every GPU suite of psa_fast on the current build (estimate_mma v2, the split build's launch shape at
#         D <= 64, the quant3 estimate v4 alone);
#  bench: the dense kernel's default launch shape at the three model shapes; one PSA step on the real Gemma
#         layer-17 K/V, kernel by kernel (the default rule speculating 1.0 and ema speculating 2.0).
set -u
PART="${1:-tests}"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD:$PWD/benchmarks" OUT="${OUT:-/tmp/psa-out}"
mkdir -p "$OUT"
if [ "$PART" = tests ]; then
  timeout 540 python3 -m pytest -q -p no:cacheprovider -W ignore -rfs --tb=short --durations=15 tests/test_fast.py \
      tests/test_fast_bf16.py tests/test_stop_rules.py tests/test_fast_offload.py tests/test_fast_metadata.py \
      tests/test_first_chunk.py tests/test_fast_pool.py tests/test_fast_hf.py > "$OUT/t_all.log" 2>&1
  echo "tests rc=$?"; grep -E "passed|failed|FAILED|Error" "$OUT/t_all.log" | tail -15
  exit 0
fi
cd benchmarks
for shape in gemma3 llama8b smollm2; do
  timeout 90 python3 exp_dense_tune.py --shape $shape --sizes 8192,32768 --batches 1,8,32 --default-only \
      --out "$OUT/dense_shapes.jsonl" 2>&1 | grep -v Warn | grep "^#\|^T=\|warps" | uniq
done
mkdir -p "$OUT/real"
timeout 120 python3 profile_decode_step.py --kv ../.gl/gemma3_xml_l17_32k.npz --shape gemma3 --size 32768 \
    --batches 32,8,1 --variants dense,default:s1.0,ema:s2.0 --out "$OUT/real" 2>&1 | grep -v Warn \
    | grep "^T=\|psa_"
