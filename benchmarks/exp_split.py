"""Split-KV experiment (issue 14, item 3): the dense and top-k kernels with and without splits, against
torch SDPA, for the shapes users run: Llama-3.1-8B (32 q / 8 KV heads, D 128), Gemma 3 270M's global
layers (4 q / 1 KV head, D 256, scale 0.0625) and SmolLM2-135M (9 q / 3 KV heads, D 64).

    python benchmarks/exp_split.py [--cases llama:32768:1,gemma:32768:1] [--splits 0,1] [--reps 40]

Each row: median µs per call, 16 calls (layers in turn, K/V and metadata each >= 4x the L2, as
``bench_decode.rotating_layers`` takes them) captured in one CUDA
graph and timed with CUDA events (a graph of one call would time the host's graph-launch latency, ~3.5 µs
and more, not the GPU's work),
GB/s on the KV bytes against the copy ceiling measured in the same run, the floor (those bytes at
that ceiling) and step / floor, the ratio to SDPA on the same memory, and the relative error against
SDPA. ``--splits 0`` is psa_fast's choice, 1 is the unsplit kernel (cluster as before).
"""

from __future__ import annotations

import argparse
import itertools


SHAPES = {"llama": "llama8b", "gemma": "gemma3", "smollm2": "smollm2"}  # this script's names of bench_decode's shapes


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default="llama:32768:1,llama:131072:1,llama:131072:8,gemma:32768:1,gemma:32768:8,"
                                       "smollm2:8192:1,smollm2:32768:1")
    ap.add_argument("--splits", default="0,1")
    ap.add_argument("--topk-share", type=float, default=0.04, help="top-k rows at this share of the blocks")
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--warps", default="8", help="warps per CTA to try, e.g. 8,4")
    ap.add_argument("--modes", default="dense,topk")
    ap.add_argument("--detail", action="store_true", help="also time the query stage and the attention alone")
    args = ap.parse_args(argv)

    import cupy
    import torch

    import psa_fast
    from bench_decode import SHAPES as MODEL_SHAPES
    from bench_decode import PER_GRAPH, copy_ceiling_gbs, median_us, per_call_us, rotating_layers

    stream = cupy.cuda.Stream(non_blocking=True)
    ceiling = copy_ceiling_gbs(stream)
    print(f"copy ceiling {ceiling:.0f} GB/s", flush=True)
    table = []
    for case in args.cases.split(","):
        name, t, b = case.split(":")
        t, b = int(t), int(b)
        shape = MODEL_SHAPES[SHAPES[name]]
        hq, hkv, d, scale = shape.hq, shape.hkv, shape.d, shape.scale
        layers = rotating_layers(shape, t, b)  # K/V and metadata 4x L2, as the runs of record
        with stream:
            cache = psa_fast.PagedKVCache(num_layers=layers, batch=b, num_kv_heads=hkv, head_dim=d, max_tokens=t)
            rs = cupy.random.RandomState(0)
            qs = []
            for layer in range(layers):
                for r in range(b):
                    k = rs.standard_normal((hkv, t, d), dtype=cupy.float32).astype(cupy.float16)
                    v = rs.standard_normal((hkv, t, d), dtype=cupy.float32).astype(cupy.float16)
                    cache.prefill(layer, r, k, v)
                qs.append((2 * rs.standard_normal((b, hq, d), dtype=cupy.float32)).astype(cupy.float16))
            n = cache.nmax

            def graph_us(fn):
                return per_call_us(fn, layers, stream, args.reps)

            # SDPA on the same memory: the pool of a full cache is [L, B, Hkv, T, D]
            tstream = torch.cuda.ExternalStream(stream.ptr)
            kv = [cache.k_pool.reshape(layers, b, hkv, n * 16, d), cache.v_pool.reshape(layers, b, hkv, n * 16, d)]
            tk = [torch.from_dlpack(kv[0][la]) for la in range(layers)]
            tv = [torch.from_dlpack(kv[1][la]) for la in range(layers)]
            tq = [torch.from_dlpack(q).unsqueeze(2) for q in qs]

            def sdpa(la):
                return torch.nn.functional.scaled_dot_product_attention(tq[la], tk[la], tv[la], enable_gqa=True,
                                                                        scale=scale)

            with torch.cuda.stream(tstream):
                ref = cupy.from_dlpack(sdpa(0).squeeze(2).float()).astype(cupy.float64)
                sdpa(1)
                tgraphs = []
                for la in range(layers):
                    gr = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(gr, stream=tstream):
                        sdpa(la)
                    tgraphs.append(gr)
                gr = torch.cuda.CUDAGraph()
                with torch.cuda.graph(gr, stream=tstream):
                    for i in range(PER_GRAPH):
                        sdpa(i % layers)
                gr.replay()
                us_sdpa = median_us(lambda i: gr.replay(), stream, args.reps, 1) / PER_GRAPH
                us_sdpa_one = median_us(lambda i: tgraphs[i % layers].replay(), stream, args.reps, layers)
            kv_bytes = b * hkv * n * 16 * d * 4

            def row(label, us, nbytes, err):
                fl = nbytes / ceiling / 1e3
                r = (f"{name:7s} {t:>6d} {b:>2d}  {label:28s} {us:8.1f} µs  {nbytes / us / 1e3:6.0f} GB/s "
                     f"({nbytes / us / 1e3 / ceiling:4.0%})  floor {fl:6.1f}  step/floor {us / fl:5.2f}  "
                     f"x SDPA {us_sdpa / us:5.2f}  err {err:.1e}")
                print(r, flush=True)
                table.append(r)

            row("torch SDPA", us_sdpa, kv_bytes, 0.0)
            print(f"    (SDPA one call per graph, host launch latency included: {us_sdpa_one:.1f} µs)", flush=True)
            k_top = max(2, int(round(args.topk_share * n)))
            for sp, w, mode in itertools.product((int(x) for x in args.splits.split(",")),
                                                 (int(x) for x in args.warps.split(",")), args.modes.split(",")):
                if True:
                    p = psa_fast.plan(cache, num_q_heads=hq, mode=mode, k=k_top, scale=scale, warps=w,
                                      splits=None if sp == 0 else sp)
                    out = cupy.array(p.run(qs[0], 0).out, dtype=cupy.float64)
                    err = float((cupy.linalg.norm(out - ref, axis=-1) / cupy.linalg.norm(ref, axis=-1)).mean())
                    us = graph_us(lambda la, p=p: p.run(qs[la], la))
                    nbytes = kv_bytes if mode == "dense" else kv_bytes * k_top / n + b * hkv * n * 2 * d * 2
                    label = f"{mode}{'' if mode == 'dense' else f' k={k_top}'} sp {p.splits} cl {p.cluster} w {w}"
                    row(label, us, nbytes, err if mode == "dense" else float("nan"))
                    if args.detail:
                        uq = graph_us(lambda la, p=p: p.load_query(qs[la], la))
                        ua = graph_us(lambda la, p=p: p.attend(la))
                        parts = f"query {uq:.1f}, attend {ua:.1f}"
                        if mode != "dense":
                            parts += f", estimate {graph_us(p.estimate):.1f}, order {graph_us(p.order):.1f}"
                        print(f"    stages alone (µs): {parts}", flush=True)
                        table.append(f"    stages alone (µs): {parts}")
            cache = tk = tv = kv = None  # (freed before the next size)
            cupy.get_default_memory_pool().free_all_blocks()
    print("\n".join(["", "== split-KV table"] + table))


if __name__ == "__main__":
    main()
