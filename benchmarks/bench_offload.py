"""Offload transfers on the GPU: the zero-copy gather of KV blocks from mapped pinned host memory,
against one bulk pinned copy (the PCIe ceiling) and one cudaMemcpyAsync per block.

    python benchmarks/bench_offload.py
"""

from __future__ import annotations

import os
import sys

import numpy as np


def main() -> None:
    import cupy

    sys.path.insert(0, os.path.dirname(__file__))
    from bench_decode import median_us
    from psa_fast.offload import HostKVStore

    stream = cupy.cuda.Stream(non_blocking=True)
    rt = cupy.cuda.runtime
    rows = []
    with stream:
        # the ceiling: one bulk copy of 256 MiB from pinned memory
        nbytes = 256 * 2**20
        host = rt.hostAlloc(nbytes, 0)
        dev = cupy.empty(nbytes, cupy.uint8)
        us = median_us(lambda i: rt.memcpyAsync(dev.data.ptr, host, nbytes, rt.memcpyHostToDevice, stream.ptr),
                       stream, 10, 1)
        bulk = nbytes / us / 1e3
        rows.append(("bulk pinned cudaMemcpyAsync, 256 MiB", nbytes, us, bulk))
        for s in (16, 128):  # 8 KiB and 64 KiB per (K + V) block at D = 128
            blk = 2 * s * 128 * 2
            count = (64 * 2**20) // blk  # 64 MiB per measurement
            store = HostKVStore(4 * count, block_size=s, head_dim=128)
            store.k[...] = 1
            store.v[...] = 1
            k_pool = cupy.empty((count, s, 128), cupy.float16)
            v_pool = cupy.empty_like(k_pool)
            rng = np.random.default_rng(0)
            src = cupy.asarray(rng.choice(4 * count, size=count, replace=False), cupy.int64)
            dst = cupy.arange(count, dtype=cupy.int32)
            store.gather(src, dst, k_pool, v_pool)
            us = median_us(lambda i: store.gather(src, dst, k_pool, v_pool), stream, 10, 1)
            rows.append((f"gather kernel, {count} random blocks of {blk // 1024} KiB", count * blk, us,
                         count * blk / us / 1e3))
            # one cudaMemcpyAsync per K and per V block
            n_copies = min(count, 2048)
            srcs = cupy.asnumpy(src[:n_copies])
            kp, vp = (p for p in store._ptrs)
            half = s * 128 * 2

            def per_block(_):
                for j, b in enumerate(srcs):
                    rt.memcpyAsync(k_pool.data.ptr + j * half, kp + int(b) * half, half, rt.memcpyHostToDevice,
                                   stream.ptr)
                    rt.memcpyAsync(v_pool.data.ptr + j * half, vp + int(b) * half, half, rt.memcpyHostToDevice,
                                   stream.ptr)

            us = median_us(per_block, stream, 5, 1)
            rows.append((f"cudaMemcpyAsync per K/V block, {n_copies} blocks of {blk // 1024} KiB", n_copies * blk,
                         us, n_copies * blk / us / 1e3))
            store.close()
        rt.freeHost(host)
    print("| transfer | bytes | median µs | GB/s | vs bulk |")
    print("|---|---|---|---|---|")
    for name, b, us, gbs in rows:
        print(f"| {name} | {b / 2**20:.0f} MiB | {us:.0f} | {gbs:.1f} | {gbs / bulk:.2f} |")


if __name__ == "__main__":
    main()
