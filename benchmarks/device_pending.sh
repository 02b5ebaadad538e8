#!/usr/bin/env bash
# One device call (~8 minutes) that checks the transposed products of decode.cu (PSA_TRANS, the default; not yet
# run on a GPU): the kernel suites on the new default, then the dense paged kernel old (trans=0) against new
# (trans=1) at the Gemma 3 and Llama-3.1-8B shapes. NOTES has the prediction.
#   run(command="bash benchmarks/device_pending.sh")
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD:$PWD/benchmarks" OUT="${OUT:-/tmp/psa-out}"
mkdir -p "$OUT"
timeout 330 python3 -m pytest -q -p no:cacheprovider -W ignore -rf --tb=short -x tests/test_fast.py \
    tests/test_fast_bf16.py tests/test_stop_rules.py tests/test_fast_offload.py > "$OUT/t_kernels.log" 2>&1
echo "tests rc=$?"; tail -6 "$OUT/t_kernels.log"
cd benchmarks
for t in 0 1; do
  timeout 60 python3 exp_kernel_defines.py decode trans=$t -- exp_dense_tune.py --shape gemma3 --sizes 32768 \
      --batches 1,8,32 --default-only --out "$OUT/dense_trans$t.jsonl" 2>&1 | grep -v Warn | grep "^#\|^T=\|warps"
  timeout 40 python3 exp_kernel_defines.py decode trans=$t -- exp_dense_tune.py --shape llama8b --sizes 32768 \
      --batches 1,8 --default-only --out "$OUT/dense_trans$t.jsonl" 2>&1 | grep -v Warn | grep "^T=\|warps"
done
