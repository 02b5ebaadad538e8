"""What folding the query's scaling into the attention kernel could save for one request: the dense step
(``plan.run``: ``psa_scale_query``, then the split decode and ``psa_merge_splits``) against its attention alone
(``plan.attend`` on the query loaded before) and the query's load alone, each timed as bench_decode times a step
(16 calls in one CUDA graph, median of ``--reps`` replays, CUDA events), at the model shapes.

    python benchmarks/exp_query_fold.py --shapes smollm2,llama8b,gemma3 --sizes 8192,32768 --batches 1

``step - attend`` is the most a decode kernel that reads the caller's query could save (the launch and the gap
before the next kernel). SDPA's times at the same shapes are bench_decode's (its runs of record).
"""

from __future__ import annotations

import argparse

from bench_decode import SHAPES, per_call_us, rotating_layers, sparsity_fill


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="smollm2,llama8b,gemma3")
    ap.add_argument("--sizes", default="8192,32768", help="tokens a request, comma-separated")
    ap.add_argument("--batches", default="1")
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args(argv)
    import cupy

    import psa_fast

    stream = cupy.cuda.Stream(non_blocking=True)
    print("| shape | T | B | dense step µs | attend alone | query alone | step - attend |")
    print("|---|---|---|---|---|---|---|")
    for name in args.shapes.split(","):
        shape = SHAPES[name]
        for t in (int(x) for x in args.sizes.split(",")):
            for b in (int(x) for x in args.batches.split(",")):
                layers = rotating_layers(shape, t, b)
                with stream:
                    cache = psa_fast.PagedKVCache(num_layers=layers, batch=b, num_kv_heads=shape.hkv,
                                                  head_dim=shape.d, max_tokens=t, block_size=shape.s)
                    fill = sparsity_fill(shape, 0.05, recent_blocks=2)
                    qs = [fill(cache, layer) for layer in range(layers)]
                    plan = psa_fast.plan(cache, num_q_heads=shape.hq, mode="dense")
                    for layer in range(layers):
                        plan.run(qs[layer], layer)
                    step = per_call_us(lambda layer: plan.run(qs[layer], layer), layers, stream, args.reps)
                    attend = per_call_us(plan.attend, layers, stream, args.reps)
                    query = per_call_us(lambda layer: plan.load_query(qs[layer], layer), layers, stream, args.reps)
                print(f"| {name} | {t // 1024}K | {b} | {step:.1f} | {attend:.1f} | {query:.1f} | "
                      f"{step - attend:.1f} |", flush=True)
                cache = plan = qs = None  # (freed before the next size)
                cupy.get_default_memory_pool().free_all_blocks()


if __name__ == "__main__":
    main()
