"""Host offload on the GPU, three tables:

1. transfers: the zero-copy gather of KV blocks from mapped pinned host memory, against one bulk
   pinned copy (the PCIe ceiling) and one cudaMemcpyAsync per block;
2. decode step: PSA with the KV cache in host memory (OffloadDecoder, pool cold or warm) against
   the same step on a resident cache (compute) and the time to move its missing blocks at the
   gather's measured rate (transfer); target: offload <= 1.1 x max(transfer, compute);
3. pools: unified vs per-layer GPU pool at 10/25/50% of the KV cache, hit rate and step time over
   decode steps of a model whose layers need very different budgets.

    python benchmarks/bench_offload.py [--sections transfers,access,step,pools] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

HQ, HKV, D, S = 32, 8, 128, 16  # Llama-3.1-8B attention


def transfers(stream) -> tuple[list, float]:
    """Table 1; returns its rows and the gather's GB/s at 8 KiB blocks."""
    import cupy

    from bench_decode import median_us
    from psa_fast.offload import HostKVStore

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
            if s == 16:
                gather_gbs = count * blk / us / 1e3
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
        print(f"| {name} | {b / 2**20:.0f} MiB | {us:.0f} | {gbs:.1f} | {gbs / bulk:.2f} |", flush=True)
    return [dict(transfer=n, bytes=b, us=u, gbs=g, vs_bulk=g / bulk) for n, b, u, g in rows], gather_gbs


def _events_us(fn, stream, reps: int, before=None) -> float:
    """Median µs of ``fn()`` between CUDA events on ``stream`` (``before()`` runs untimed first)."""
    import cupy

    times = []
    for _ in range(reps):
        if before:
            before()
        stream.synchronize()
        a, b = cupy.cuda.Event(), cupy.cuda.Event()
        a.record(stream)
        fn()
        b.record(stream)
        b.synchronize()
        times.append(cupy.cuda.get_elapsed_time(a, b) * 1e3)
    return float(np.median(times))


def pool_access(stream, reps: int) -> list:
    """The pool's policy kernels alone: µs per access of n ids, all hits or all misses, for the
    sequential twin of psa_ref's loop and the parallel kernels the offload decoder uses. Each access
    is replayed as a CUDA graph (as the decoder does), so the times are the GPU's, not Python's."""
    import cupy

    from bench_decode import capture, median_us
    from psa_fast.pool import GPUSlotPool

    rows = []
    print("\n| pool access | kernel | ids | median µs | µs per id |")
    print("|---|---|---|---|---|")
    cases = [("cuda", n) for n in (64, 512, 2048)] + [("parallel", n) for n in (64, 512, 2048, 16384)]
    with stream:
        for kernel, n in cases:
            pool = GPUSlotPool(4 * n, num_store_blocks=1 << 22, pin_window=2, kernel=kernel)
            hot = cupy.arange(n, dtype=cupy.int32) * 7
            pool.access(hot)  # allocates the outputs of n ids, which a capture may not do
            hit = capture(lambda: pool.access(hot), stream)
            us_hit = median_us(lambda i: hit.launch(stream), stream, reps, 1)
            fresh = [cupy.arange(n, dtype=cupy.int32) + 100_000 + n * i for i in range(reps + 4)]
            for f in fresh[:4]:  # fill every slot: the timed accesses each evict n blocks
                pool.access(f)
            misses = [capture(lambda f=f: pool.access(f), stream) for f in fresh[4:]]
            us_miss = median_us(lambda i: misses[i].launch(stream), stream, reps, reps)
            for kind, us in (("hits", us_hit), ("misses (evicting)", us_miss)):
                rows.append(dict(kernel=kernel, ids=n, kind=kind, us=us, us_per_id=us / n))
                name = "one thread (CUDA C twin)" if kernel == "cuda" else "parallel (grid + one CTA)"
                print(f"| all {kind} | {name} | {n} | {us:.1f} | {us / n:.4f} |", flush=True)
    return rows


def decode_step(stream, gather_gbs: float, reps: int) -> list:
    """Table 2: one layer's PSA step with offload vs resident compute and the transfer of its misses."""
    import cupy

    import psa_fast
    from psa_fast.offload import OffloadDecoder, OffloadKVCache
    from psa_fast.synthetic import fill_skewed, trace_block_offsets

    offsets = trace_block_offsets()
    rows = []
    print("\n| T | B | pool | τ | blocks used | loaded/step | transfer µs | compute µs | offload µs | "
          "offload / max | iterations |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for t, b in ((32768, 1), (32768, 4), (131072, 1)):
        dims = dict(num_layers=1, batch=b, num_kv_heads=HKV, head_dim=D, max_tokens=t, block_size=S)
        with stream:
            res = psa_fast.PagedKVCache(**dims)
            q = fill_skewed(res, 0, HQ, offsets, seed=1)
            nblocks = b * HKV * res.nmax
            off = OffloadKVCache(num_slots=nblocks // 2, **dims)  # half the KV cache fits on the GPU
            for r in range(b):       # the same KV, copied into the host store
                off.prefill(0, r, res._dense_view(res.k_pool, 0, r)[:, :t], res._dense_view(res.v_pool, 0, r)[:, :t])
            for tau in (0.9, 0.95):
                opts = dict(num_q_heads=HQ, threshold=tau, stop="ema", step=64)
                plan = psa_fast.plan(res, **opts)
                dec = OffloadDecoder(off, **opts)
                compute = _events_us(lambda: plan.run(q), stream, reps)
                used = float(cupy.asnumpy(plan.run(q).num_used).mean())
                for state in ("cold", "warm"):
                    before = off.pool.clear if state == "cold" else None
                    dec.run(q)
                    stream.synchronize()
                    st0 = off.pool.stats()
                    it0 = dec.stats["iterations"]
                    us = _events_us(lambda: dec.run(q), stream, reps, before)
                    st1 = off.pool.stats()
                    if state == "cold":  # clear() zeroed the counters: count one cold step
                        off.pool.clear()
                        dec.run(q)
                        stream.synchronize()
                        st0, st1 = {"loads": 0}, off.pool.stats()
                        per_step = st1["loads"]
                    else:
                        per_step = (st1["loads"] - st0["loads"]) / reps
                    iters = (dec.stats["iterations"] - it0) / max(reps, 1)
                    transfer = per_step * 2 * S * D * 2 / gather_gbs / 1e3
                    ratio = us / max(transfer, compute)
                    row = dict(t=t, b=b, pool=state, tau=tau, blocks_used=used, loaded=per_step, transfer_us=transfer,
                               compute_us=compute, offload_us=us, ratio=ratio, iterations=iters)
                    rows.append(row)
                    print(f"| {t // 1024}K | {b} | {state} | {tau} | {used:.0f} | {per_step:.0f} | {transfer:.0f} | "
                          f"{compute:.0f} | {us:.0f} | {ratio:.2f} | {iters:.0f} |", flush=True)
            res = off = plan = dec = None  # (freed before the next size)
            cupy.get_default_memory_pool().free_all_blocks()
    return rows


def pools(stream, steps: int) -> list:
    """Table 3: unified vs per-layer pools over ``steps`` decode steps of 8 layers with different skews."""
    import cupy

    import psa_fast
    from psa_fast.offload import OffloadDecoder, OffloadKVCache
    from psa_fast.synthetic import fill_skewed, trace_block_offsets

    layers, t, b = 8, 16384, 1
    offsets = trace_block_offsets()
    scales = np.geomspace(0.5, 4.0, layers)  # layer 0 flat (needs many blocks), layer 7 peaked (few)
    dims = dict(num_layers=layers, batch=b, num_kv_heads=HKV, head_dim=D, max_tokens=t + steps, block_size=S)
    rows = []
    print("\n| pool | % of KV | slots | blocks named per step (% of KV) | hit rate | loaded MiB/step | "
          "step µs (8 layers) |")
    print("|---|---|---|---|---|---|---|")
    with stream:
        res = psa_fast.PagedKVCache(**{**dims, "max_tokens": t})  # the KV source, filled to t tokens
        qs = [fill_skewed(res, layer, HQ, offsets * scales[layer], seed=layer) for layer in range(layers)]
        total = layers * b * HKV * res.nmax
        rng = np.random.default_rng(0)
        appends = [[(rng.standard_normal((b, HKV, D)) * 0.5).astype(np.float16) for _ in range(2)]
                   for _ in range(steps)]
        for frac in (0.10, 0.25, 0.50):
            for kind in ("unified", "per_layer"):
                slots = int(total * frac) // layers * layers
                off = OffloadKVCache(num_slots=slots, pool=kind, **dims)
                for layer in range(layers):
                    for r in range(b):
                        off.prefill(layer, r, res._dense_view(res.k_pool, layer, r)[:, :t],
                                    res._dense_view(res.v_pool, layer, r)[:, :t])
                dec = OffloadDecoder(off, num_q_heads=HQ, threshold=0.95, stop="ema", step=32)
                times = []
                for i in range(steps):
                    if i == 1:
                        st0 = off.pool.stats()
                    stream.synchronize()
                    a, e = cupy.cuda.Event(), cupy.cuda.Event()
                    a.record(stream)
                    for layer in range(layers):
                        q = qs[layer]
                        dec.run(q, layer=layer)
                        k, v = appends[i]
                        off.append(layer, cupy.asarray(k), cupy.asarray(v))
                    e.record(stream)
                    e.synchronize()
                    times.append(cupy.cuda.get_elapsed_time(a, e) * 1e3)
                st1 = off.pool.stats()
                hits, misses = st1["hits"] - st0["hits"], st1["misses"] - st0["misses"]
                rate = hits / max(hits + misses, 1)
                named = (hits + misses) / (steps - 1)
                mib = (st1["loads"] - st0["loads"]) * 2 * S * D * 2 / 2**20 / (steps - 1)
                us = float(np.median(times[1:]))
                rows.append(dict(pool=kind, fraction=frac, slots=slots, named=named, hit_rate=rate, loaded_mib=mib,
                                 step_us=us))
                print(f"| {kind} | {frac:.0%} | {slots} | {named:.0f} ({named / total:.0%}) | {rate:.3f} | {mib:.1f} | "
                      f"{us:.0f} |", flush=True)
                off = dec = None
                cupy.get_default_memory_pool().free_all_blocks()
    return rows


def main(argv=None) -> None:
    import cupy

    sys.path.insert(0, os.path.dirname(__file__))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sections", default="transfers,access,step,pools")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args(argv)
    sections = args.sections.split(",")
    stream = cupy.cuda.Stream(non_blocking=True)
    results = {}
    start = time.time()
    rows, gather_gbs = transfers(stream)
    results["transfers"] = rows
    if "access" in sections:
        results["access"] = pool_access(stream, args.reps)
    if "step" in sections:
        results["step"] = decode_step(stream, gather_gbs, args.reps)
    if "pools" in sections:
        results["pools"] = pools(stream, args.steps)
    with open(os.path.join(args.out, "bench_offload.json"), "w") as f:
        json.dump(results, f, indent=1)
    print(f"\n{time.time() - start:.0f} s", flush=True)


if __name__ == "__main__":
    main()
