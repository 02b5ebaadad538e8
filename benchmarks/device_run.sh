#!/usr/bin/env bash
# One call on the lent GPU: environment, smoke check, GPU tests, benchmark; logs under $OUT.
#   bash benchmarks/device_run.sh [quick|full|none] [test-profile]
# env: TESTS (test files), TEST_TIMEOUT, BENCH_TIMEOUT, BENCH_ARGS, OFFLOAD=1 (+ OFFLOAD_ARGS, OFFLOAD_TIMEOUT)
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD" OUT="${OUT:-/tmp/psa-out}"
mkdir -p "$OUT"
mode="${1:-quick}"
profile="${2:-dev}"
{ nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem,driver_version --format=csv
  python3 -c "import cupy, numba, torch, numpy; from numba import cuda; print('cupy', cupy.__version__, 'numba', numba.__version__, 'torch', torch.__version__, 'numpy', numpy.__version__)"
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
echo "== smoke"; timeout 120 python3 benchmarks/smoke.py 2>&1 | tee "$OUT/smoke.log"
echo "== tests"; HYPOTHESIS_PROFILE="$profile" timeout ${TEST_TIMEOUT:-240} python3 -m pytest -q -p no:cacheprovider \
    ${TESTS:-tests/test_fast_metadata.py tests/test_fast_pool.py tests/test_fast.py tests/test_fast_offload.py tests/test_conformance.py} 2>&1 | tee "$OUT/tests.log" | tail -25
if [ "$mode" != "none" ]; then
  echo "== bench"; timeout ${BENCH_TIMEOUT:-190} python3 benchmarks/bench_decode.py $([ "$mode" = quick ] && echo --quick) ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log"
fi
if [ -n "${OFFLOAD:-}" ]; then
  echo "== offload"; timeout ${OFFLOAD_TIMEOUT:-240} python3 benchmarks/bench_offload.py ${OFFLOAD_ARGS:-} 2>&1 | tee "$OUT/offload.log"
fi
