"""One-off timing experiments on the GPU (not the benchmark of record; see bench_decode.py).

    python benchmarks/experiments.py [--sizes 32768x1,131072x1] [--configs px8x3,2px4x3,16x4x3]

For each size (tokens x batch) and decode configuration (cluster x warps x stages; cluster `p` is the one
psa_fast picks for the batch, `2p` twice that) it times the
whole PSA step (τ 0.95, the default rule), the attention alone and the dense kernel, each as CUDA-graph
replays over two layers. Results and what they showed go to benchmarks/NOTES.md.
"""

import argparse


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="32768x1,131072x1,131072x8")
    ap.add_argument("--configs", default="px8x3,2px4x3,px4x3")
    args = ap.parse_args()
    import cupy

    import psa_fast
    from psa_fast import _kernels
    from bench_decode import capture, median_us
    from psa_fast.synthetic import fill_skewed, trace_block_offsets

    offsets = trace_block_offsets()
    stream = cupy.cuda.Stream(non_blocking=True)
    sizes = [tuple(int(x) for x in s.split("x")) for s in args.sizes.split(",")]
    configs = [c.split("x") for c in args.configs.split(",")]
    for t, b in sizes:
        with stream:
            cache = psa_fast.PagedKVCache(num_layers=2, batch=b, num_kv_heads=8, head_dim=128, max_tokens=t)
            qs = [fill_skewed(cache, layer, 32, offsets, seed=layer) for layer in range(2)]
            step = max(64, cache.nmax // 64)

            def graph_us(fn):
                graphs = [capture(lambda layer=layer: fn(layer), stream) for layer in range(2)]
                return median_us(lambda i: graphs[i].launch(stream), stream, 40, 2)

            picked = _kernels.pick_cluster(b * 8)
            for c, w, st in configs:
                cluster = {"p": picked, "2p": 2 * picked}.get(c) or int(c)
                warps, stages = int(w), int(st)
                try:
                    p = psa_fast.plan(cache, num_q_heads=32, threshold=0.95, step=step, cluster=cluster, warps=warps,
                                      stages=stages)
                    d = psa_fast.plan(cache, num_q_heads=32, mode="dense", cluster=cluster, warps=warps, stages=stages)
                    for layer in range(2):
                        p.run(qs[layer], layer)
                        d.run(qs[layer], layer)
                    us = graph_us(lambda layer: p.run(qs[layer], layer))
                    us_att = graph_us(p.attend)
                    us_dense = graph_us(lambda layer: d.run(qs[layer], layer))
                    used = float(cupy.asnumpy(p.num_used).mean())
                    print(f"T {t} B {b} cluster {cluster} warps {warps} stages {stages} step {step}: PSA step "
                          f"{us:.1f} us, attend alone {us_att:.1f} us, dense {us_dense:.1f} us, blocks {used:.0f}, "
                          f"iterations {float(cupy.asnumpy(p.iterations).mean()):.1f}", flush=True)
                except Exception as e:  # a configuration that does not launch is a result too
                    print(f"T {t} B {b} cluster {cluster} warps {warps} stages {stages}: {type(e).__name__}: {e}",
                          flush=True)
            cache = qs = None
            cupy.get_default_memory_pool().free_all_blocks()


if __name__ == "__main__":
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    main()
