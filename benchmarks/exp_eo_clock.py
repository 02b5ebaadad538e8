"""Where ``psa_estimate_order``'s time goes, phase by phase: its ``PSA_EO_CLOCK`` build (``_kernels.EO_CLOCK``) has
thread 0 of every CTA read the global timer at its start and end and the SM clock between its phases (the run scored,
sorted, pushed to the cluster, every run received, its blocks placed). Data as ``profile_decode_step.py``'s (drawn
sparsity ``--share`` or ``--per-head``), layers rotated so that the step read takes its metadata from HBM; per batch
size the mean and the largest CTA's µs of each phase from the CTA's start, and the spread of the CTAs' starts and
ends over the launch (global timer):

    python benchmarks/exp_eo_clock.py --shape llama8b --size 32768 --batches 1 --share 0.05 --warps 8,16
    python benchmarks/exp_eo_clock.py --shape llama8b --size 32768 --batches 1 --per-head --warps 8,16

The seventy-third session measured the fused kernel at 10.5 µs (H100) where ~9.5 was predicted, the two launches it
replaces at 11.0 (psa_estimate_mma 5.4 alone): this says which phase holds the rest.
"""

from __future__ import annotations

import argparse

import numpy as np

EO_MARKS = ("scored", "sorted (warp 0)", "pushed (warp 0)", "every run received", "placed (thread 0)")
EARLY_MARKS = ("the request's length read", "warp 0's tiles scored")  # (words 8, 9: within "scored")


def eo_table(clocks: np.ndarray, khz: float) -> list[str]:
    """Rows ``mark | mean µs | largest µs`` from ``clocks [..., 10]`` (per CTA: global timer ns at start and end, SM
    cycles from the start to each of ``EO_MARKS``, 1 where the CTA placed blocks, cycles to each of ``EARLY_MARKS``)
    at an SM clock of ``khz`` kHz, over the CTAs that placed blocks, in time order; then the launch's spread by the
    global timer: the last CTA's start and the last CTA's end after the first start (µs)."""
    c = np.asarray(clocks, dtype=np.float64).reshape(-1, 10)
    c = c[c[:, 7] == 1]
    if c.shape[0] == 0:
        raise ValueError("clocks: no CTA placed blocks")
    us = np.concatenate([c[:, 8:10], c[:, 2:7]], axis=1) / (khz * 1e-3)
    rows = [f"| {name} | {us[:, i].mean():.2f} | {us[:, i].max():.2f} |"
            for i, name in enumerate(EARLY_MARKS + EO_MARKS)]
    first = c[:, 0].min()
    rows.append(f"| starts spread (global timer) | {(c[:, 0] - first).mean() / 1e3:.2f} | "
                f"{(c[:, 0] - first).max() / 1e3:.2f} |")
    rows.append(f"| ends after the first start (global timer) | {(c[:, 1] - first).mean() / 1e3:.2f} | "
                f"{(c[:, 1] - first).max() / 1e3:.2f} |")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="llama8b")
    ap.add_argument("--size", type=int, default=32768)
    ap.add_argument("--batches", default="1")
    ap.add_argument("--share", type=float, default=None, help="drawn sparsity profile (default 0.05)")
    ap.add_argument("--per-head", action="store_true", help="the per-head profile and gqa='per_head'")
    ap.add_argument("--warps", default="16", help="comma-separated ESTIMATE_ORDER values (8, 16)")
    ap.add_argument("--steps", type=int, default=10)
    args = ap.parse_args()
    warps = [int(x) for x in args.warps.split(",")]
    if any(w not in (8, 16) for w in warps):
        ap.error(f"--warps takes 8 or 16, got {args.warps!r}")
    if args.per_head and args.share is not None:
        ap.error("--per-head draws its own profile: give --share or --per-head, not both")
    share = None if args.per_head else (0.05 if args.share is None else args.share)

    import cupy
    from bench_decode import SHAPES, data_fill, rotating_layers

    import psa_fast
    from psa_fast import _kernels

    shape = SHAPES[args.shape]
    fill = data_fill(shape, per_head=args.per_head, share=share)
    khz = float(cupy.cuda.Device().attributes["ClockRate"])
    saved = _kernels.ESTIMATE_ORDER
    _kernels.EO_CLOCK = 1
    try:
        for b in (int(x) for x in args.batches.split(",")):
            layers = rotating_layers(shape, args.size, b)
            cache = psa_fast.PagedKVCache(num_layers=layers, batch=b, num_kv_heads=shape.hkv, head_dim=shape.d,
                                          max_tokens=args.size, block_size=shape.s)
            qs = [fill(cache, layer) for layer in range(layers)]
            for w in warps:
                _kernels.ESTIMATE_ORDER = w
                p = psa_fast.plan(cache, num_q_heads=shape.hq, threshold=0.95, scale=shape.scale,
                                  gqa="per_head" if args.per_head else "shared")
                if not p._estimate_order:
                    print(f"\nT={args.size} B={b}: this plan does not fuse the estimate and the order "
                          f"(_kernels.fuses_estimate_order)")
                    continue
                for i in range(max(args.steps, layers + 1)):
                    p.run(qs[i % layers], i % layers)
                cupy.cuda.Device().synchronize()
                print(f"\nT={args.size} B={b} {shape.name} {'per-head' if args.per_head else f'{share:.0%}'}, "
                      f"psa_estimate_order {w} warps, {layers} layers in turn, SM clock {khz / 1e3:.0f} MHz")
                print("| mark (from the CTA's start) | mean µs | largest µs |\n|---|---|---|")
                print("\n".join(eo_table(cupy.asnumpy(_kernels.eo_clocks), khz)))
    finally:
        _kernels.EO_CLOCK = 0
        _kernels.ESTIMATE_ORDER = saved


if __name__ == "__main__":
    main()
