#!/usr/bin/env bash
# One device call (~3 minutes) that checks branch wip/merge-v2 (psa_merge_splits v2, not yet run on a GPU):
# the split-KV tests, then the launch-shape sweep whose B = 1 rows should fall from ~51 to ~17 µs (NOTES).
#   run(command="bash benchmarks/device_pending.sh")
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD:$PWD/benchmarks" OUT="${OUT:-/tmp/psa-out}"
mkdir -p "$OUT"
timeout 120 python3 -m pytest -q -p no:cacheprovider -W ignore -rf --tb=short tests/test_fast.py \
    -k "split or dense or topk" > "$OUT/t_split.log" 2>&1; echo "tests rc=$?"; tail -4 "$OUT/t_split.log"
cd benchmarks
timeout 120 python3 exp_dense_tune.py --shape gemma3 --sizes 32768 --batches 1,8,32 --out "$OUT/dense_tune_v2.jsonl" \
    2>&1 | grep -v Warn | grep -A3 "^T="
timeout 60 python3 exp_dense_tune.py --shape llama8b --sizes 32768 --batches 1 --out "$OUT/dense_tune_v2.jsonl" \
    2>&1 | grep -v Warn | grep -A2 "^T="
