"""One-off timing experiments on the GPU (not the benchmark of record; see bench_decode.py).

    python benchmarks/experiments.py [--sizes 32768x1,131072x1] [--configs px8x3,2px4x3,16x4x3] [--steps 0,256]

For each size (tokens x batch) and decode configuration (cluster x warps x stages; cluster `p` is the one
psa_fast picks for the batch, `2p` twice that) and step (0: the benchmark's, max(64, blocks / 64)) it times the whole
PSA step (τ 0.95, the default rule) and the dense kernel, each as CUDA-graph replays over two layers, and reports the
blocks attended, the iterations and PSA's mean relative output error against dense. Results and what they showed go to
benchmarks/NOTES.md.
"""

import argparse
import itertools

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="32768x1,131072x1,131072x8")
    ap.add_argument("--configs", default="px8x3,2px4x3,px4x3")
    ap.add_argument("--steps", default="0")
    ap.add_argument("--topk", default="", help="also top-k at these multiples of the last PSA run's blocks")
    ap.add_argument("--topk-max", action="store_true", help="also top-k at the last PSA run's largest group budget")
    ap.add_argument("--profile", choices=("pooled", "per-head"), default="pooled")
    args = ap.parse_args()
    import cupy

    import psa_fast
    from psa_fast import _kernels
    from bench_decode import capture, median_us
    from psa_fast.synthetic import fill_skewed, trace_block_offsets, trace_block_profiles

    offsets = trace_block_offsets() if args.profile == "pooled" else trace_block_profiles()
    stream = cupy.cuda.Stream(non_blocking=True)
    sizes = [tuple(int(x) for x in s.split("x")) for s in args.sizes.split(",")]
    configs = [c.split("x") for c in args.configs.split(",")]
    for t, b in sizes:
        with stream:
            cache = psa_fast.PagedKVCache(num_layers=2, batch=b, num_kv_heads=8, head_dim=128, max_tokens=t)
            qs = [fill_skewed(cache, layer, 32, offsets, seed=layer) for layer in range(2)]
            steps = [int(x) or max(64, cache.nmax // 64) for x in args.steps.split(",")]

            def graph_us(fn):
                graphs = [capture(lambda layer=layer: fn(layer), stream) for layer in range(2)]
                return median_us(lambda i: graphs[i].launch(stream), stream, 40, 2)

            picked = _kernels.pick_cluster(b * 8)
            for (c, w, st), step in itertools.product(configs, steps):
                cluster = {"p": picked, "2p": 2 * picked}.get(c) or int(c)
                warps, stages = int(w), int(st)
                try:
                    p = psa_fast.plan(cache, num_q_heads=32, threshold=0.95, step=step, cluster=cluster, warps=warps,
                                      stages=stages)
                    d = psa_fast.plan(cache, num_q_heads=32, mode="dense", cluster=cluster, warps=warps, stages=stages)
                    err = []
                    for layer in range(2):
                        o = cupy.array(p.run(qs[layer], layer).out, dtype=cupy.float64)
                        r = cupy.array(d.run(qs[layer], layer).out, dtype=cupy.float64)
                        err.append(float((cupy.linalg.norm(o - r, axis=-1) / cupy.linalg.norm(r, axis=-1)).mean()))
                    per_group = cupy.asnumpy(p.num_used).ravel()
                    used = float(per_group.mean())
                    iters = float(cupy.asnumpy(p.iterations).mean())
                    us = graph_us(lambda layer: p.run(qs[layer], layer))
                    us_dense = graph_us(lambda layer: d.run(qs[layer], layer))
                    print(f"T {t} B {b} cluster {cluster} warps {warps} stages {stages} step {step}: PSA step "
                          f"{us:.1f} us, dense {us_dense:.1f} us, blocks {used:.0f}, iterations {iters:.1f}, "
                          f"error {np.mean(err):.4f}; blocks per group p10/p50/p90/max "
                          f"{'/'.join(str(int(x)) for x in np.percentile(per_group, [10, 50, 90, 100]))}", flush=True)
                except Exception as e:  # a configuration that does not launch is a result too
                    print(f"T {t} B {b} cluster {cluster} warps {warps} stages {stages} step {step}: "
                          f"{type(e).__name__}: {e}", flush=True)
            ks = [int(round(used * float(x))) for x in args.topk.split(",") if x]
            for k in ks + ([int(per_group.max())] if args.topk_max else []):
                tk = psa_fast.plan(cache, num_q_heads=32, mode="topk", k=k)
                d = psa_fast.plan(cache, num_q_heads=32, mode="dense")
                err = []
                for layer in range(2):
                    o = cupy.array(tk.run(qs[layer], layer).out, dtype=cupy.float64)
                    r = cupy.array(d.run(qs[layer], layer).out, dtype=cupy.float64)
                    err.append(float((cupy.linalg.norm(o - r, axis=-1) / cupy.linalg.norm(r, axis=-1)).mean()))
                us = graph_us(lambda layer: tk.run(qs[layer], layer))
                print(f"T {t} B {b} top-k k={k}: {us:.1f} us, error {np.mean(err):.4f}", flush=True)
            cache = qs = None
            cupy.get_default_memory_pool().free_all_blocks()


if __name__ == "__main__":
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    main()
