"""The attend stage alone, dense against the sparse paths at the same bytes, with the processing order set by hand.

Issue 14's rows show the sparse paths reading their blocks more slowly than dense reads the whole cache: on Gemma
3's layer 17 at 32K, B = 8 (H100, s54), top-k of 1,280 blocks a group took 99.5 µs where dense took 99.1 for 2,048,
and PSA's loop attends its 62.5% at ~2.1 TB/s against dense's ~2.7. This script separates what could cause it, on
random K/V (the kernels read every block they are given whatever it holds):

- the order: the identity (blocks in memory order) against a random permutation (each block a scattered piece),
  and that permutation with each chunk's blocks sorted by index ("sorted": the same chunks, read in memory order);
- the count: top-k's split build over k blocks a group against dense over all of them;
- the loop: PSA's loop told to read everything (threshold 1: no stop before the cache ends) at a small step and at
  one step of the whole cache, so that the difference is its iterations' cost (barrier, decision, drain);
- the ring: cp.async stages a warp.

Each row is the attend stage only (estimate and order not run: the order buffer is written once by hand), timed as
bench_decode times a stage (16 calls over rotating layers in one CUDA graph, median of ``--reps``, CUDA events),
with its bytes (K and V of the blocks read) over the copy ceiling measured in the same run.

    python benchmarks/exp_order_rate.py --shape gemma3 --sizes 32768 --batches 8 --ks 1280,2048 --steps 320,2048
"""

from __future__ import annotations

import argparse
import itertools

from bench_decode import SHAPES, copy_ceiling_gbs, parse_ints, per_call_us, random_cache, rotating_layers


def main() -> None:
    import cupy

    import psa_fast

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="gemma3", choices=sorted(SHAPES))
    ap.add_argument("--sizes", default="32768")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--ks", default="1280,2048", help="top-k's blocks a group")
    ap.add_argument("--steps", default="320,2048", help="PSA loop steps (threshold 1: every block read)")
    ap.add_argument("--stages", default="", help="cp.async stages to try beside the plan's (comma list)")
    ap.add_argument("--orders", default="identity,random,sorted")
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    shape = SHAPES[args.shape]
    stream = cupy.cuda.Stream(non_blocking=True)
    ceiling = copy_ceiling_gbs(stream)
    stage_list = [None] + (parse_ints(args.stages, "--stages") if args.stages.strip() else [])
    orders = args.orders.split(",")
    print(f"# {shape.name}: Hq {shape.hq}, Hkv {shape.hkv}, D {shape.d}, S {shape.s}; copy ceiling {ceiling:.0f} GB/s")
    print("| T | B | path | order | blocks a group | step | stages | µs | GB/s | % ceiling | iterations |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for t, b in itertools.product(parse_ints(args.sizes, "--sizes"), parse_ints(args.batches, "--batches")):
        n = -(-t // shape.s)
        layers = rotating_layers(shape, t, b)
        with stream:
            rng = cupy.random.default_rng(0)
            cache = random_cache(shape, t, b, layers, rng)
            q = rng.standard_normal((b, shape.hq, shape.d), dtype=cupy.float32).astype(cupy.float16)
            block_bytes = 2 * shape.s * shape.d * 2  # K and V of one block of one KV head, float16
            gn = shape.hkv
            made = {"identity": cupy.broadcast_to(cupy.arange(n, dtype=cupy.int32), (b, gn, n)),
                    "random": cupy.argsort(rng.random((b, gn, n)), axis=-1).astype(cupy.int32)}

            def chunk_sorted(step):
                """The random permutation with positions [c step, (c + 1) step) sorted, chunk by chunk."""
                r = made["random"].copy()
                for c0 in range(0, n, step):
                    r[..., c0:c0 + step] = cupy.sort(r[..., c0:c0 + step], axis=-1)
                return r

            def row(path, order, blocks, step, p, extra=""):
                p.load_query(q, 0)
                if order is not None:
                    p.order_buf[...] = chunk_sorted(step or blocks) if order == "sorted" else made[order]
                p.attend(0)
                us = per_call_us(lambda layer: p.attend(layer), layers, stream, args.reps)
                its = "-" if path != "psa loop" else f"{float(cupy.asnumpy(p.iterations).max()):.0f}"
                gbs = b * gn * blocks * block_bytes / us / 1e3
                print(f"| {t} | {b} | {path}{extra} | {order or '-'} | {blocks} | {step or '-'} | "
                      f"{p.stages or 'plan'} | {us:.1f} | {gbs:.0f} | {100 * gbs / ceiling:.0f}% | {its} |",
                      flush=True)

            for stages in stage_list:
                try:
                    row("dense", None, n, None, psa_fast.DecodePlan(cache, num_q_heads=shape.hq, mode="dense",
                                                                     stages=stages))
                except Exception as exc:  # a launch shape this GPU or kernel refuses: say so, go on
                    print(f"dense stages {stages}: {type(exc).__name__}: {str(exc)[:120]}")
                for k, order in itertools.product(parse_ints(args.ks, "--ks"), orders):
                    try:
                        p = psa_fast.DecodePlan(cache, num_q_heads=shape.hq, mode="topk", k=min(k, n), stages=stages)
                        row("top-k", order, min(k, n), None, p, f" ({p.splits} splits)")
                    except Exception as exc:
                        print(f"top-k {k} {order} stages {stages}: {type(exc).__name__}: {str(exc)[:120]}")
                for step, order in itertools.product(parse_ints(args.steps, "--steps"), orders):
                    try:
                        p = psa_fast.DecodePlan(cache, num_q_heads=shape.hq, mode="psa", threshold=1.0, stop="ema",
                                                step=min(step, n), stages=stages)
                        row("psa loop", order, n, p.step, p)
                    except Exception as exc:
                        print(f"psa step {step} {order} stages {stages}: {type(exc).__name__}: {str(exc)[:120]}")
        cache = made = None
        cupy.get_default_memory_pool().free_all_blocks()


if __name__ == "__main__":
    main()
