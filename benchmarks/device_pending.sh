#!/usr/bin/env bash
# One device call (~2 minutes) for main: the dense paged kernel (transposed products) at the three model shapes,
# SmolLM2's D 64 measured for the first time (issue 14: dense >= 0.95x SDPA at every size, D 64 included).
# Kernel changes waiting for a GPU live on wip/* branches, each with its own version of this script.
#   run(command="bash benchmarks/device_pending.sh")
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD:$PWD/benchmarks" OUT="${OUT:-/tmp/psa-out}"
mkdir -p "$OUT"
cd benchmarks
for shape in smollm2 gemma3 llama8b; do
  timeout 90 python3 exp_dense_tune.py --shape $shape --sizes 8192,32768 --batches 1,8,32 --default-only \
      --out "$OUT/dense_shapes.jsonl" 2>&1 | grep -v Warn | grep "^#\|^T=\|warps"
done
# Llama-3.1-8B's dense step at 32K, B = 1 (0.85x SDPA), kernel by kernel: decode against merge
timeout 60 python3 profile_decode_step.py --share 0.05 --shape llama8b --size 32768 --batches 1,8 --variants dense \
    2>&1 | grep -v Warn | grep "^T=\|psa_"
