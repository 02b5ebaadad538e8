"""What an eager (not captured) decode step costs the host: ``DecodePlan.run`` called back to back without a CUDA
graph, as a user timing ``psa_fast`` eagerly or a model decoding without ``CapturedDecoder`` does. For each mode:
the host's µs a call (perf_counter around N calls that launch without waiting), the eager step as the GPU sees it
(CUDA events around the same N calls: the larger of the host's and the GPU's time), the step in a CUDA graph of 16
calls of the one layer (the GPU alone; at small shapes its K/V may stay in L2), and the host functions that take the
most time (cProfile over the N calls, by own time).

    python benchmarks/exp_host_overhead.py --shape llama8b --size 32768 --batch 1 --variants dense,ema,topk

(The thirty-seventh session saw ~176 µs a dense step eager at Llama 32K B = 1 against ~41 µs in a graph.)
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

from bench_decode import SHAPES, per_call_us, sparsity_fill


def top_functions(profile: cProfile.Profile, calls: int, n: int = 12) -> list[tuple[str, float, float]]:
    """``[(function, own µs a call, cumulative µs a call)]`` of the ``n`` functions with the most own time in
    ``profile`` (taken over ``calls`` calls of the step), most first; the name is ``file:line(function)`` with the
    file's last two path parts."""
    stats = pstats.Stats(profile)
    rows = []
    for (path, line, name), (_, _, own, cum, _) in stats.stats.items():
        short = "/".join(path.replace("\\", "/").split("/")[-2:])
        rows.append((f"{short}:{line}({name})", 1e6 * own / calls, 1e6 * cum / calls))
    return sorted(rows, key=lambda r: -r[1])[:n]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="llama8b", choices=sorted(SHAPES))
    ap.add_argument("--size", type=int, default=32768)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--share", type=float, default=0.05, help="the drawn profile's ideal share (bench_decode)")
    ap.add_argument("--variants", default="dense,ema,topk", help="dense, ema, default (quant3, stop auto), topk")
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--top", type=int, default=12, help="host functions listed a variant")
    args = ap.parse_args()

    import cupy

    import psa_fast

    shape = SHAPES[args.shape]
    stream = cupy.cuda.Stream(non_blocking=True)
    print(f"# {shape.name}, T = {args.size}, B = {args.batch}, {args.calls} eager calls a variant")
    print("| variant | host µs a call | eager step µs (events) | graph µs a call | host ÷ graph |")
    print("|---|---|---|---|---|")
    details = []
    for variant in args.variants.split(","):
        metadata = "quant3" if variant == "default" else "cuboid_mean"
        cache = psa_fast.PagedKVCache(num_layers=1, batch=args.batch, num_kv_heads=shape.hkv, head_dim=shape.d,
                                      max_tokens=args.size, block_size=shape.s, metadata=metadata)
        q = sparsity_fill(shape, args.share, recent_blocks=2)(cache, 0)
        if variant in ("dense", "topk"):
            plan = psa_fast.plan(cache, num_q_heads=shape.hq, mode=variant, scale=shape.scale)
        elif variant in ("ema", "default"):
            plan = psa_fast.plan(cache, num_q_heads=shape.hq, threshold=0.95, scale=shape.scale,
                                 stop="ema" if variant == "ema" else "auto")
        else:
            raise SystemExit(f"--variants: expected dense, ema, default or topk, got {variant!r}")
        with stream:
            for _ in range(5):  # compiles, warms up
                plan.run(q, 0)
            stream.synchronize()
            t0 = time.perf_counter()
            for _ in range(args.calls):
                plan.run(q, 0)
            host = (time.perf_counter() - t0) / args.calls * 1e6
            stream.synchronize()
            start, end = cupy.cuda.Event(), cupy.cuda.Event()
            start.record(stream)
            for _ in range(args.calls):
                plan.run(q, 0)
            end.record(stream)
            end.synchronize()
            eager = cupy.cuda.get_elapsed_time(start, end) * 1e3 / args.calls
            profile = cProfile.Profile()
            profile.enable()
            for _ in range(args.calls):
                plan.run(q, 0)
            profile.disable()
            stream.synchronize()
        graph = per_call_us(lambda layer: plan.run(q, layer), 1, stream, 20)
        print(f"| {variant} | {host:.1f} | {eager:.1f} | {graph:.1f} | {host / graph:.1f} |", flush=True)
        details.append((variant, top_functions(profile, args.calls, args.top)))
    for variant, rows in details:
        print(f"\n{variant}: host functions by own time (µs a call; cProfile adds its own overhead)")
        print("| function | own | cumulative |")
        print("|---|---|---|")
        for name, own, cum in rows:
            print(f"| `{name}` | {own:.1f} | {cum:.1f} |")


if __name__ == "__main__":
    main()
