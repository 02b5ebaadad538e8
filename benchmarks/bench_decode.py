"""Decode-step benchmark on the GPU: torch SDPA dense vs psa_fast dense, top-k and PSA.

Llama-3.1-8B attention shapes (32 query / 8 KV heads, D 128, S 16, float16), KV caches filled
with synthetic keys whose block masses follow the shipped SmolLM2 trace (psa_fast.synthetic).
Each row: median µs over CUDA-graph replays timed with CUDA events, the L2 cold by rotating
over several layers' caches; GB/s on the bytes the method touches against the measured copy
ceiling; speedup over SDPA in the same run; mean relative output error vs dense.

    python benchmarks/bench_decode.py                 # every size
    python benchmarks/bench_decode.py --quick         # 8K and 32K, B = 1 and 8
    python benchmarks/bench_decode.py --profile per-head   # heads as different as the trace's
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

HQ, HKV, D, S = 32, 8, 128, 16
L2_BYTES = 60 * 2**20
CEILING_GBS = 4229.0  # HBM copy, DESIGN.md; re-measured below
VERSIONS: list[int] = []


def median_us(fn_launch, stream, reps: int, rotate: int) -> float:
    import cupy

    starts = [cupy.cuda.Event() for _ in range(reps)]
    ends = [cupy.cuda.Event() for _ in range(reps)]
    for i in range(reps):
        starts[i].record(stream)
        fn_launch(i % rotate)
        ends[i].record(stream)
    ends[-1].synchronize()
    return float(np.median([cupy.cuda.get_elapsed_time(a, b) * 1e3 for a, b in zip(starts, ends)]))


def capture(run, stream):
    """A CUDA graph of ``run()`` on ``stream`` (CuPy stream capture)."""
    stream.begin_capture()
    run()
    return stream.end_capture()


def copy_ceiling_gbs(stream) -> float:
    import cupy

    with stream:
        a = cupy.empty(2**31, cupy.uint8)
        b = cupy.empty_like(a)
        b[...] = a
        t = median_us(lambda i: cupy.copyto(b, a), stream, 10, 1)
    return 2 * a.nbytes / t / 1e3


def rel_err(out, ref) -> float:
    import cupy

    o, r = out.astype(cupy.float64), ref.astype(cupy.float64)
    return float((cupy.linalg.norm(o - r, axis=-1) / cupy.linalg.norm(r, axis=-1)).mean())


def bench_size(t: int, b: int, offsets, reps: int, stream, log) -> list[dict]:
    import cupy
    import torch

    import psa_fast
    from psa_fast import _kernels
    from psa_fast.synthetic import fill_skewed

    per_layer = b * HKV * t * D * 2 * 2
    layers = max(2, -(-4 * L2_BYTES // per_layer))  # rotate over >= 4x L2 of KV
    rows = []
    with stream:
        cache = psa_fast.PagedKVCache(num_layers=layers, batch=b, num_kv_heads=HKV, head_dim=D, max_tokens=t,
                                      block_size=S)
        qs = [fill_skewed(cache, layer, HQ, offsets, seed=layer) for layer in range(layers)]
        n = cache.nmax

        def graph_us(fn):
            """Median µs of ``fn(layer)`` replayed as CUDA graphs, rotating over the layers."""
            graphs = [capture(lambda layer=layer: fn(layer), stream) for layer in range(layers)]
            for gr in graphs[:2]:
                gr.launch(stream)
            return median_us(lambda i: graphs[i].launch(stream), stream, reps, layers)

        def timed(plan_obj):
            """(median µs, outputs per layer, mean blocks attended per group)."""
            outs, used = [], []
            for layer in range(layers):  # warm-up (compiles) and results
                dec = plan_obj.run(qs[layer], layer)
                outs.append(cupy.array(dec.out))
                used.append(float(cupy.asnumpy(dec.num_used).mean()) if dec.order is not None else n)
            return graph_us(lambda layer: plan_obj.run(qs[layer], layer)), outs, float(np.mean(used))

        def stage_times(p, total):
            """Each stage before the attention alone; the attention is the rest of the step (replayed
            alone, it would attend with whichever layer's order was computed last)."""
            parts = {name: graph_us(fn) for name, fn in (
                ("query", lambda layer: p.load_query(qs[layer], layer)), ("estimate", p.estimate), ("order", p.order))}
            parts["attend (rest of the step)"] = total - sum(parts.values())
            return parts

        dense_plan = psa_fast.plan(cache, num_q_heads=HQ, mode="dense")
        us_dense, refs, _ = timed(dense_plan)

        # torch SDPA on the same memory: the resident pool is [L, B, Hkv, T, D] when T = Nmax * S
        tstream = torch.cuda.ExternalStream(stream.ptr)
        kviews = cache.k_pool.reshape(layers, b, HKV, n * S, D)
        vviews = cache.v_pool.reshape(layers, b, HKV, n * S, D)
        tk = [torch.from_dlpack(kviews[layer]) for layer in range(layers)]
        tv = [torch.from_dlpack(vviews[layer]) for layer in range(layers)]
        tq = [torch.from_dlpack(q).unsqueeze(2) for q in qs]

        def sdpa(layer):
            return torch.nn.functional.scaled_dot_product_attention(tq[layer], tk[layer], tv[layer], enable_gqa=True)

        with torch.cuda.stream(tstream):
            sdpa_out = sdpa(0)
            sdpa(1)
            tgraphs = []
            for layer in range(layers):
                gr = torch.cuda.CUDAGraph()
                with torch.cuda.graph(gr, stream=tstream):
                    sdpa(layer)
                tgraphs.append(gr)
            us_sdpa = median_us(lambda i: tgraphs[i].replay(), stream, reps, layers)
        sdpa_err = rel_err(cupy.from_dlpack(sdpa_out.squeeze(2).float()), refs[0])

        kv_bytes = b * HKV * n * S * D * 2 * 2
        meta_bytes = b * HKV * n * (2 * D * 2)  # centre + radius, float16
        small = b * HKV * n * 12  # scores written and read, order written

        def row(method, us, touched, err, used=None, launches=0, extra=""):
            r = dict(T=t, B=b, method=method, us=us, gbs=touched / us / 1e3, pct=touched / us / 1e3 / CEILING_GBS,
                     speedup=us_sdpa / us, err=err, frac=(used / n if used is not None else 1.0), launches=launches,
                     note=extra)
            rows.append(r)
            log(r)

        def mean_err(outs):
            return float(np.mean([rel_err(o, r) for o, r in zip(outs, refs)]))

        row("torch SDPA", us_sdpa, kv_bytes, sdpa_err, launches=1)
        row("psa_fast dense", us_dense, kv_bytes, 0.0, launches=3, extra=f"cluster {dense_plan.cluster}")
        for v in VERSIONS:
            usv, outsv, _ = timed(psa_fast.plan(cache, num_q_heads=HQ, mode="dense", version=v))
            row(f"psa_fast dense (decode v{v})", usv, kv_bytes, rel_err(outsv[0], refs[0]), launches=3)

        cluster = _kernels.pick_cluster(b * HKV)
        # at least one block per warp per iteration, and at most ~64 iterations over the whole cache
        step = max(cluster * 8, n // 64)
        psa = {}
        for tau in (0.9, 0.95):
            p = psa_fast.plan(cache, num_q_heads=HQ, mode="psa", threshold=tau, step=step)
            us, outs, used = timed(p)
            psa[tau] = (mean_err(outs), used)
            row(f"PSA τ={tau}", us, meta_bytes + small + used / n * kv_bytes, psa[tau][0], used, 5,
                f"stop {p.stop}, step {p.step}, cluster {p.cluster}")
            if tau == 0.95:  # where the time goes: each stage alone
                log(dict(T=t, B=b, breakdown_us=stage_times(p, us)))
                for v in [3] + VERSIONS:  # the paper's rule, and the other kernels (which implement it)
                    pv = psa_fast.plan(cache, num_q_heads=HQ, mode="psa", threshold=tau, step=step, stop="remaining",
                                       version=v)
                    usv, outsv, usedv = timed(pv)
                    row(f"PSA τ={tau} remaining" + (f" (decode v{v})" if v != 3 else ""), usv,
                        meta_bytes + small + usedv / n * kv_bytes, mean_err(outsv), usedv, 5)

        # stop="sketch" on metadata="quant3": the same KV (same seeds) in a second cache with 3-bit codes
        q3 = psa_fast.PagedKVCache(num_layers=layers, batch=b, num_kv_heads=HKV, head_dim=D, max_tokens=t,
                                   block_size=S, metadata="quant3")
        for layer in range(layers):
            fill_skewed(q3, layer, HQ, offsets, seed=layer)
        meta_q3 = b * HKV * n * (2 * D * 2 + S * D // 2)  # lo/hi float16 + 4-bit codes
        small_q3 = small + b * HQ * n * 4 * 3  # per-head estimates written and read, their suffix sums
        p3 = psa_fast.plan(q3, num_q_heads=HQ, mode="psa", threshold=0.95, step=step, stop="sketch")
        us3, outs3, used3 = timed(p3)
        row("PSA τ=0.95 sketch (quant3)", us3, meta_q3 + small_q3 + used3 / n * kv_bytes, mean_err(outs3), used3, 5,
            f"stop sketch, metadata quant3, step {p3.step}, cluster {p3.cluster}")
        log(dict(T=t, B=b, breakdown_us=stage_times(p3, us3), of="PSA τ=0.95 sketch (quant3)"))
        del q3, p3, outs3

        def topk(k):
            us, outs, _ = timed(psa_fast.plan(cache, num_q_heads=HQ, mode="topk", k=int(k)))
            return us, mean_err(outs)

        err95, used95 = psa[0.95]
        k_budget = max(1, int(round(used95)))
        us, err = topk(k_budget)
        row(f"top-k k={k_budget} (PSA τ=0.95 budget)", us, meta_bytes + small + k_budget / n * kv_bytes, err,
            k_budget, 5)
        for factor in (1.25, 1.5, 2, 3, 4, 6, 8, 12, 16):  # the smallest k on this grid with PSA's error
            k = min(n, int(round(k_budget * factor)))
            us_k, err_k = topk(k)
            if err_k <= err95 or k == n:
                row(f"top-k k={k} (error ≤ PSA τ=0.95)", us_k, meta_bytes + small + k / n * kv_bytes, err_k, k, 5)
                break
        del cache, qs, tk, tv, tq, tgraphs, kviews, vviews
    cupy.get_default_memory_pool().free_all_blocks()
    torch.cuda.empty_cache()
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--reps", type=int, default=60)
    parser.add_argument("--versions", default="", help="also time these other decode kernels, e.g. 2 (CUDA cores)")
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--profile", choices=("pooled", "per-head"), default="pooled",
                        help="block masses: every head from the trace's pooled distribution (the run of record), "
                             "or each KV head from one (layer, position, head) of the trace")
    args = parser.parse_args(argv)

    import cupy

    from psa_fast.synthetic import trace_block_offsets, trace_block_profiles

    global CEILING_GBS, VERSIONS
    VERSIONS = [int(v) for v in args.versions.split(",") if v]
    stream = cupy.cuda.Stream(non_blocking=True)
    measured = copy_ceiling_gbs(stream)
    print(f"device {cupy.cuda.runtime.getDeviceProperties(0)['name'].decode()}, copy ceiling measured "
          f"{measured:.0f} GB/s (DESIGN.md: {CEILING_GBS:.0f})", flush=True)
    offsets = trace_block_offsets() if args.profile == "pooled" else trace_block_profiles()
    suffix = "" if args.profile == "pooled" else "_per_head"
    sizes = [(t, b) for t in (8192, 32768, 131072) for b in (1, 8, 32)]
    if args.quick:
        sizes = [(t, b) for t in (8192, 32768) for b in (1, 8)]
    rows = []
    start = time.time()
    with open(os.path.join(args.out, f"bench_decode{suffix}.jsonl"), "w") as f:
        def log(r):
            f.write(json.dumps(r) + "\n")
            f.flush()
            if "breakdown_us" in r:
                print(f"  {r['T']:>6} {r['B']:>3} {r.get('of', 'PSA τ=0.95')} stages alone (µs): "
                      + ", ".join(f"{k} {v:.1f}" for k, v in r["breakdown_us"].items()), flush=True)
                return
            print(f"  {r['T']:>6} {r['B']:>3} {r['method']:<38} {r['us']:9.1f} us {r['gbs']:7.0f} GB/s "
                  f"x{r['speedup']:.2f} err {r['err']:.4f} frac {r['frac']:.3f} {r['note']}", flush=True)

        for t, b in sizes:
            rows += bench_size(t, b, offsets, args.reps, stream, log)
    print(f"\n{len(rows)} rows in {time.time() - start:.0f} s\n")
    lines = ["| T | B | method | median µs | GB/s touched | % of 4229 | blocks read | launches | vs SDPA | rel. error |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['T'] // 1024}K | {r['B']} | {r['method']} | {r['us']:.1f} | {r['gbs']:.0f} | "
                     f"{100 * r['pct']:.0f}% | {100 * r['frac']:.1f}% | {r['launches']} | {r['speedup']:.2f}× | "
                     f"{r['err']:.4f} |")
    table = "\n".join(lines)
    with open(os.path.join(args.out, f"bench_decode{suffix}.md"), "w") as f:
        f.write(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
