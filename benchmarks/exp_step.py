"""How many blocks an iteration should take (issue 14, item 4): PSA's loop (and its speculative schedule) at
several ``step`` values on drawn block masses (bench_decode's ``--profile sparsity``), against dense. A larger
step means fewer iterations (each a cluster barrier and a decision) but more blocks past the stop: for one
request the GPU is mostly idle, so reading more may cost less than iterating. Median µs a call (16 calls in one
CUDA graph, several layers in turn), blocks read, iterations, relative error against psa_fast dense.

    python benchmarks/exp_step.py --share 0.05 --shape llama8b --sizes 32768:1,131072:1,131072:8 --steps 64,128,256

``--kv`` replays captured decode steps instead (bench_decode's ``--profile real``; ``--spread``: a different step in
each request, as a model's batch), and ``--stop auto`` runs the default rule on ``quant3`` metadata:

    python benchmarks/exp_step.py --kv .gl/gemma3_xml_l17_32k.npz --spread --stop auto --shape gemma3 \
        --sizes 32768:32,32768:8 --steps 144,256,384,auto --modes loop,first
"""

import argparse
import itertools


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--share", type=float, default=0.05)
    ap.add_argument("--shape", default="llama8b")
    ap.add_argument("--sizes", default="32768:1,131072:1,131072:8", help="T:B, comma-separated")
    ap.add_argument("--steps", default="64,128,256,512,auto", help="blocks an iteration, or auto (the plan's pick)")
    ap.add_argument("--modes", default="loop,s1.0,s2.0",
                    help="loop (stop='ema', chunk by chunk), first (the loop after a first chunk predicted from the "
                         "estimates: first_chunk='predicted') and sM (speculate=M), comma-separated")
    ap.add_argument("--clusters", default="auto",
                    help="CTAs a group (DecodePlan(cluster=...)), comma-separated; auto: the plan's pick")
    ap.add_argument("--warps", default="auto",
                    help="warps a CTA (DecodePlan(warps=...)), comma-separated; auto: the plan's pick")
    ap.add_argument("--stages", default="auto",
                    help="cp.async stages a warp (DecodePlan(stages=...)), comma-separated; auto: the plan's pick "
                         "(decode_config fits warps x stages into shared memory, so the column shows what ran)")
    ap.add_argument("--kv", default=None, help="captured trace .npz files, comma-separated (bench_decode --kv): "
                                             "real K/V and queries instead of --share's drawn ones")
    ap.add_argument("--spread", action="store_true", help="with --kv: a different captured step in each request")
    ap.add_argument("--stop", default="ema", choices=("ema", "auto"),
                    help="ema on cuboid_mean (default), or auto: the default rule (sketch_avg on quant3)")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    if args.spread and args.kv is None:
        ap.error("--spread replays captured decode steps: it needs --kv")

    import cupy
    import numpy as np

    import psa_fast
    from psa_fast import _kernels
    from bench_decode import SHAPES, per_call_us, real_fill, rel_err, sparsity_fill
    from psa_ref.trace import load_trace

    shape = SHAPES[args.shape]
    stream = cupy.cuda.Stream(non_blocking=True)
    metadata = "quant3" if args.stop == "auto" else "cuboid_mean"
    if args.kv:
        fill = real_fill(shape, [load_trace(path) for path in args.kv.split(",")], spread=args.spread)
        data = f"captured K/V {args.kv}" + (" (a different step a request)" if args.spread else "")
    else:
        fill = sparsity_fill(shape, args.share, recent_blocks=2)
        data = f"ideal share {args.share}"
    print(f"# {args.shape}, {data}, stop {args.stop!r} ({metadata}), threshold 0.95")
    print("| T | B | mode | cluster | warps | stages | step | µs | vs dense | blocks read | iterations (mean / max) | "
          "rel. error |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for size in args.sizes.split(","):
        t, b = (int(x) for x in size.split(":"))
        with stream:
            cache = psa_fast.PagedKVCache(num_layers=args.layers, batch=b, num_kv_heads=shape.hkv,
                                          head_dim=shape.d, max_tokens=t, block_size=shape.s, metadata=metadata)
            qs = [fill(cache, layer) for layer in range(args.layers)]
            n = cache.nmax

            def timed(p):
                outs = [cupy.array(p.run(qs[layer], layer).out) for layer in range(args.layers)]
                reads = [cupy.asnumpy(p.run(qs[layer], layer).num_read) for layer in range(args.layers)]
                us = per_call_us(lambda layer: p.run(qs[layer], layer), args.layers, stream, args.reps)
                return us, outs, reads

            dense = psa_fast.plan(cache, num_q_heads=shape.hq, mode="dense", scale=shape.scale)
            us_dense, refs, _ = timed(dense)
            print(f"| {t} | {b} | dense | - | - | - | - | {us_dense:.1f} | 1.00x | 100% | - | 0 |", flush=True)
            steps = [x if x == "auto" else int(x) for x in args.steps.split(",")]
            for mode, cluster, warps, stages, step in itertools.product(args.modes.split(","),
                                                                        args.clusters.split(","),
                                                                        args.warps.split(","),
                                                                        args.stages.split(","), steps):
                spec = None if mode in ("loop", "first") else float(mode[1:])
                try:
                    p = psa_fast.plan(cache, num_q_heads=shape.hq, mode="psa", threshold=0.95, stop=args.stop,
                                      step=step, speculate=spec, scale=shape.scale,
                                      cluster=None if cluster == "auto" or spec else int(cluster),
                                      warps=None if warps == "auto" else int(warps),
                                      stages=None if stages == "auto" else int(stages),
                                      first_chunk="predicted" if mode == "first" else None)
                    us, outs, reads = timed(p)
                except Exception as exc:  # e.g. a cluster size the GPU cannot launch
                    print(f"| {t} | {b} | {mode} | {cluster} | {warps} | {stages} | {step} | failed: "
                          f"{type(exc).__name__}: "
                          f"{str(exc).splitlines()[0][:120] if str(exc) else ''} |", flush=True)
                    continue
                read = np.concatenate([r.ravel() for r in reads]).astype(np.float64)
                # blocks read over the step: the plain loop's iterations (after a predicted first chunk the
                # iterations are not a function of the blocks read: exp_verify_clock.py counts them)
                iters = np.ceil(read / p.step)
                shown_iters = "-" if mode == "first" else f"{iters.mean():.1f} / {iters.max():.0f}"
                err = float(np.mean([rel_err(o, r) for o, r in zip(outs, refs)]))
                shown = f"{p.step} (auto)" if step == "auto" else p.step
                ran = _kernels.decode_config(d=cache.dp, s=shape.s, g=shape.hq // shape.hkv, version=3, warps=p.warps,
                                             stages=p.stages)
                # (the grid build: CTAs a group)
                ctas = f"grid {p.grid_ctas}" if getattr(p, "grid_ctas", 0) else p.cluster
                print(f"| {t} | {b} | {mode} | {ctas} | {ran[1]} | {ran[2]} | {shown} | {us:.1f} | "
                      f"{us_dense / us:.2f}x | "
                      f"{100 * read.mean() / n:.1f}% | {shown_iters} | {err:.4f} |",
                      flush=True)
            cache = qs = None  # (freed before the next size)
            cupy.get_default_memory_pool().free_all_blocks()


if __name__ == "__main__":
    main()
