#!/usr/bin/env bash
# One device call (~3 minutes) that checks branch wip/merge-v3 (psa_merge_splits v3: channels over CTAs, splits
# over warps; not yet run on a GPU): the split-KV tests, then the dense kernel at the three model shapes and the
# Gemma dense step kernel by kernel (the merge was 10.2 of 28.7 µs at 32K B = 1; NOTES has the prediction).
#   run(command="bash benchmarks/device_pending.sh", carry=[".gl/gemma3_xml_l17_32k.npz"])
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD:$PWD/benchmarks" OUT="${OUT:-/tmp/psa-out}"
mkdir -p "$OUT"
timeout 150 python3 -m pytest -q -p no:cacheprovider -W ignore -rf --tb=short tests/test_fast.py \
    -k "split or dense or topk" > "$OUT/t_split.log" 2>&1; echo "tests rc=$?"; tail -4 "$OUT/t_split.log"
cd benchmarks
for shape in gemma3 llama8b smollm2; do
  timeout 90 python3 exp_dense_tune.py --shape $shape --sizes 8192,32768 --batches 1,8,32 --default-only \
      --out "$OUT/dense_shapes.jsonl" 2>&1 | grep -v Warn | grep "^#\|^T=\|warps"
done
[ -f ../.gl/gemma3_xml_l17_32k.npz ] && timeout 60 python3 profile_decode_step.py --kv ../.gl/gemma3_xml_l17_32k.npz \
    --shape gemma3 --batches 1,8 --variants dense 2>&1 | grep -v Warn | grep "^T=\|psa_"
