"""Does the copy ceiling that every floor divides by depend on the bytes copied? bench_decode.copy_ceiling_gbs copies
a fresh ``cupy.empty`` buffer of 2 GiB, whose contents are whatever the allocator hands back: zeros from the driver in
a process's first measurement, old K/V from CuPy's memory pool in a later one. In the fifty-second session (H100)
exp_dense_tune's runs inside one exp_kernels_attr process measured 3,026 GB/s first and 2,590-2,601 after, while the
read-only ceiling stayed ~3,030. This times the same copy and the same read-only kernel over zeros, random bytes and
float16 noise like the K/V, in the order zeros / random / float16 / float16 / random / zeros, in one process (CUDA
events, median of 10 a row). Answer (s53, H100): every kind copies alike; the drop follows the process's history.

    python benchmarks/exp_ceiling.py
"""

from __future__ import annotations

import numpy as np

from bench_decode import _READ_SOURCE, median_us

NBYTES = 2**31


def fill(a, kind: str) -> None:
    """``a`` (uint8, on the GPU) set to ``kind``: zeros, uniform random bytes, or float16 standard normals."""
    if kind not in ("zeros", "random", "float16"):
        raise ValueError(f"kind: expected 'zeros', 'random' or 'float16', got {kind!r}")
    import cupy

    if kind == "zeros":
        a.fill(0)
    elif kind == "random":
        a.view(cupy.int32)[...] = cupy.random.randint(-2**31, 2**31 - 1, a.size // 4, dtype=cupy.int32)
    else:
        a.view(cupy.float16)[...] = cupy.random.standard_normal(a.size // 2, dtype=cupy.float32).astype(cupy.float16)


def main() -> None:
    import cupy

    from psa_fast import _kernels

    stream = cupy.cuda.Stream(non_blocking=True)
    read = cupy.RawKernel(_READ_SOURCE, "psa_bench_read")
    print("| data | copy GB/s (read + write) | read-only GB/s |")
    print("|---|---|---|")
    with stream:
        a = cupy.empty(NBYTES, cupy.uint8)
        b = cupy.empty_like(a)
        out = cupy.zeros(1, cupy.uint32)
        n = np.int64(a.nbytes // 16)
        for kind in ("zeros", "random", "float16", "float16", "random", "zeros"):
            fill(a, kind)
            b[...] = a  # the destination holds the same bytes as the source, as after the first copy
            stream.synchronize()
            copy = median_us(lambda i: cupy.copyto(b, a), stream, 10, 1)
            ro = median_us(lambda i: read((8 * _kernels.num_sms(),), (256,), (a, n, out)), stream, 10, 1)
            print(f"| {kind} | {2 * a.nbytes / copy / 1e3:.0f} | {a.nbytes / ro / 1e3:.0f} |", flush=True)


if __name__ == "__main__":
    main()
