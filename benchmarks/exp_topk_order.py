"""Top-k's order stage against PSA's at the same shapes: the radix select of the head (``psa_order_head``, one CTA a
group) against the full processing order (``_kernels.order``'s fastest method), timed alone.

Top-k needs only the first k positions of the processing order; ``DecodePlan.order`` selects them with one CTA per
group. exp_order_rate.py (fifty-ninth session, H100) put top-k's estimate and select at ~31 µs of a 99.5 µs step on
Gemma 3's layer 17 at 32K, B = 8, k = 1,280, where PSA's estimate and full order take ~13. If the full order is
faster at large k, top-k (our baseline) should take it: the comparison of PSA with top-k is only as fair as top-k.

Random scores (the order reads nothing else), one layer, each stage as bench_decode times one (16 calls in one CUDA
graph, median of ``--reps``, CUDA events); beside them, what ``DecodePlan(mode="topk")`` takes
(``_kernels.topk_uses_head``) and the two cost models it compares.

    python benchmarks/exp_topk_order.py --shape gemma3 --sizes 32768 --batches 1,8,32 --ks 64,256,640,1280
"""

from __future__ import annotations

import argparse
import itertools

from bench_decode import SHAPES, parse_ints, per_call_us, random_cache, rotating_layers


def main() -> None:
    import cupy

    import psa_fast
    from psa_fast import _kernels

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="gemma3", choices=sorted(SHAPES))
    ap.add_argument("--sizes", default="32768")
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--ks", default="64,256,640,1280", help="top-k's blocks a group")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--step", action="store_true", help="also time top-k's whole step (random K/V over rotating "
                    "layers) with the select and with the full order")
    args = ap.parse_args()
    shape = SHAPES[args.shape]
    stream = cupy.cuda.Stream(non_blocking=True)
    print(f"# {shape.name}: Hq {shape.hq}, Hkv {shape.hkv}, D {shape.d}, S {shape.s}")
    print("| T | B | groups | blocks a group | full order (method) µs | k | select µs | select / full | the plan "
          "takes | model: select / full µs |" + (" top-k step µs: select / full |" if args.step else ""))
    print("|---|---|---|---|---|---|---|---|---|---|" + ("---|" if args.step else ""))
    for t, b in itertools.product(parse_ints(args.sizes, "--sizes"), parse_ints(args.batches, "--batches")):
        n = -(-t // shape.s)
        layers = rotating_layers(shape, t, b) if args.step else 1
        with stream:
            rng = cupy.random.default_rng(0)
            if args.step:
                cache = random_cache(shape, t, b, layers, rng, summaries=True)
            else:  # (the order reads only the scores and the lengths)
                cache = psa_fast.PagedKVCache(num_layers=1, batch=b, num_kv_heads=shape.hkv, head_dim=shape.d,
                                              max_tokens=t, block_size=shape.s)
                cache.seq_lens[...] = t
                cache.host_lens[...] = t
            q = rng.standard_normal((b, shape.hq, shape.d), dtype=cupy.float32).astype(cupy.float16)
            full = psa_fast.DecodePlan(cache, num_q_heads=shape.hq, mode="psa", stop="ema")
            full.scores[...] = rng.standard_normal(full.scores.shape, dtype=cupy.float32)
            full.order(0)
            full_us = per_call_us(lambda layer: full.order(layer), 1, stream, args.reps)
            method = _kernels.order_method(b, full.gn, cache.nmax, workspace=full.sort_workspace is not None)
            for k in parse_ints(args.ks, "--ks"):
                if k > n:
                    continue
                p = psa_fast.DecodePlan(cache, num_q_heads=shape.hq, mode="topk", k=k)
                picked = "select" if p._topk_head else "full"
                out = cupy.full_like(full.order_buf, -2)

                def select(layer):
                    _kernels.order_head(full.scores, cache.seq_lens[layer], out, s=shape.s, g=p.g, nmax=n,
                                        sink_blocks=0, recent_blocks=0, head=k)
                try:
                    select(0)
                    us = per_call_us(select, 1, stream, args.reps)
                except Exception as exc:  # e.g. more blocks than one CTA's select holds
                    print(f"k {k}: {type(exc).__name__}: {str(exc)[:120]}")
                    continue
                same = bool((out[..., :k] == full.order_buf[..., :k]).all())
                model = (_kernels.head_cost_us(b, full.gn, n, k),
                         _kernels.order_cost_us(method, b, full.gn, n))
                steps = ""
                if args.step:
                    timed = []
                    for head in (True, False):
                        p._topk_head = head
                        p.run(q, 0)
                        timed.append(per_call_us(lambda layer: p.run(q, layer), layers, stream, args.reps))
                    steps = f" {timed[0]:.1f} / {timed[1]:.1f} |"
                print(f"| {t} | {b} | {b * full.gn} | {n} | {full_us:.1f} ({method}) | {k} | {us:.1f} | "
                      f"{us / full_us:.2f}{'' if same else ' (ORDER DIFFERS)'} | "
                      f"{picked} | {model[0]:.1f} / {model[1]:.1f} |{steps}", flush=True)
        cache = full = p = None
        cupy.get_default_memory_pool().free_all_blocks()


if __name__ == "__main__":
    main()
