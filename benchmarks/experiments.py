"""One-off timing experiments on the GPU (not the benchmark of record; see bench_decode.py).

    python benchmarks/experiments.py
"""


def main() -> None:
    import cupy

    import psa_fast
    from bench_decode import capture, median_us
    from psa_fast.synthetic import fill_skewed, trace_block_offsets

    offsets = trace_block_offsets()
    stream = cupy.cuda.Stream(non_blocking=True)
    for t, b in ((131072, 1), (131072, 8)):
        with stream:
            cache = psa_fast.PagedKVCache(num_layers=2, batch=b, num_kv_heads=8, head_dim=128, max_tokens=t)
            qs = [fill_skewed(cache, layer, 32, offsets, seed=layer) for layer in range(2)]
            for warps, stages, step in ((8, 3, 128), (4, 6, 128), (6, 4, 128), (8, 3, 256), (8, 2, 128)):
                p = psa_fast.plan(cache, num_q_heads=32, threshold=0.95, step=step, warps=warps, stages=stages)
                for layer in range(2):
                    p.run(qs[layer], layer)
                graphs = [capture(lambda layer=layer: p.run(qs[layer], layer), stream) for layer in range(2)]
                us = median_us(lambda i: graphs[i].launch(stream), stream, 40, 2)
                att = [capture(lambda layer=layer: p.attend(layer), stream) for layer in range(2)]
                us_att = median_us(lambda i: att[i].launch(stream), stream, 40, 2)
                used = float(cupy.asnumpy(p.num_used).mean())
                print(f"T {t} B {b} warps {warps} stages {stages} step {step}: step {us:.1f} us, attend alone "
                      f"{us_att:.1f} us, blocks {used:.0f}, iterations {float(cupy.asnumpy(p.iterations).mean()):.1f}",
                      flush=True)
            del cache, qs
            cupy.get_default_memory_pool().free_all_blocks()


if __name__ == "__main__":
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    main()
