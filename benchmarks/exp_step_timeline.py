"""Where a PSA step's time goes between its kernels: one request's step (estimate and order fused,
``psa_estimate_order``, then the loop, ``psa_decode``) replayed in a CUDA graph as ``bench_decode.py`` times it, with
both kernels' clock builds (``_kernels.EO_CLOCK``, ``_kernels.LOOP_CLOCK``), which read the GPU's global timer at
each CTA's start and end (the loop: each group's rank-0 CTA). Per batch size, the last call's timeline in µs from the
first ``psa_estimate_order`` CTA's start, beside the step's period (median µs a call, ``PER_GRAPH`` calls a graph):

    python benchmarks/exp_step_timeline.py --shape llama8b --size 32768 --batches 1 --share 0.05
    python benchmarks/exp_step_timeline.py --only estimate     # the fused kernel alone, call after call
    python benchmarks/exp_step_timeline.py --only attend       # the loop alone (the order of the warm-up calls)

``--only`` replays one stage alone (``DecodePlan.estimate`` or ``.attend``, on the plan's scaled query), so the
period left outside its CTAs is that kernel's boundary with itself: beside an empty launch of the same shape
(``exp_launch_shape.py``, ~0.9 µs on the H100) it says which kernel's entry or exit holds the time between kernels.

The profiler gives psa_estimate_order 10.5 µs and psa_decode 19.0 at Llama 5% 32K B = 1 (H100, s74), while the
fused kernel's clock ends 8.3 µs after its first CTA starts and the loop clock (s69) is ~4 µs under the profiler's
decode: this says whether the rest lies between the kernels (one launch's gap that fusing them would save) or
inside them, before their CTAs' first clock read and after their last.
"""

from __future__ import annotations

import argparse

import numpy as np


def timeline_rows(eo_clocks: np.ndarray, loop_clocks: np.ndarray, step_us: float) -> list[str]:
    """Rows ``event | µs from the first psa_estimate_order CTA's start`` of one call from ``eo_clocks [..., 10]``
    (global timer ns at a CTA's start and end in words 0 and 1, 1 in word 7 where it placed blocks) and
    ``loop_clocks [..., 18]`` (global timer ns at a group's start and end in words 16 and 17, 1 in word 9 where it
    ran the loop), then the gap between the kernels, and what is left of the step's period ``step_us`` outside both
    (the graph's other nodes, the launches' starts and ends)."""
    eo = np.asarray(eo_clocks, dtype=np.float64).reshape(-1, 10)
    eo = eo[eo[:, 7] == 1]
    lp = np.asarray(loop_clocks, dtype=np.float64)
    if lp.shape[-1] != 18:
        raise ValueError(f"loop_clocks: 18 words a group (the global timer in 16, 17), got {lp.shape[-1]}")
    lp = lp.reshape(-1, 18)
    lp = lp[lp[:, 9] > 0]
    if eo.shape[0] == 0 or lp.shape[0] == 0:
        raise ValueError("no CTA placed blocks or no group ran the loop: nothing to time")
    t0 = eo[:, 0].min()
    us = lambda ns: (ns - t0) / 1e3  # noqa: E731
    marks = [("psa_estimate_order: first CTA start", us(t0)),
             ("psa_estimate_order: last CTA start", us(eo[:, 0].max())),
             ("psa_estimate_order: last CTA end", us(eo[:, 1].max())),
             ("psa_decode: first group start", us(lp[:, 16].min())),
             ("psa_decode: last group start", us(lp[:, 16].max())),
             ("psa_decode: first group end", us(lp[:, 17].min())),
             ("psa_decode: last group end", us(lp[:, 17].max()))]
    rows = [f"| {name} | {v:.2f} |" for name, v in marks]
    span = us(lp[:, 17].max())
    rows.append(f"| gap: psa_estimate_order's last end to psa_decode's first start | "
                f"{us(lp[:, 16].min()) - us(eo[:, 1].max()):.2f} |")
    rows.append(f"| step (graph, µs a call) | {step_us:.2f} |")
    rows.append(f"| step outside the two kernels' first start .. last end | {step_us - span:.2f} |")
    return rows


def alone_rows(clocks: np.ndarray, words: int, step_us: float) -> list[str]:
    """Rows ``event | µs`` for one kernel replayed alone: its CTAs' span on the global timer from ``clocks`` (``words``
    10: ``eo_clocks``, start / end in words 0 / 1, flag in 7; 18: ``loop_clocks``, start / end in 16 / 17, flag in
    9), the period a call (``step_us``) and what is left of it outside the span."""
    start, end, flag = {10: (0, 1, 7), 18: (16, 17, 9)}[words]
    c = np.asarray(clocks, dtype=np.float64).reshape(-1, words)
    c = c[c[:, flag] > 0]
    if c.shape[0] == 0:
        raise ValueError("no CTA or group wrote its marks: nothing to time")
    span = (c[:, end].max() - c[:, start].min()) / 1e3
    return [f"| CTAs' span (first start .. last end) | {span:.2f} |", f"| period (graph, µs a call) | {step_us:.2f} |",
            f"| outside the span (the kernel's boundary with itself) | {step_us - span:.2f} |"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="llama8b")
    ap.add_argument("--size", type=int, default=32768)
    ap.add_argument("--batches", default="1")
    ap.add_argument("--share", type=float, default=0.05, help="drawn sparsity profile")
    ap.add_argument("--only", choices=("estimate", "attend"), default=None,
                    help="replay one stage alone: the fused estimate-order kernel or the loop")
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()

    import cupy
    from bench_decode import PER_GRAPH, SHAPES, data_fill, per_call_us, rotating_layers

    import psa_fast
    from psa_fast import _kernels

    shape = SHAPES[args.shape]
    fill = data_fill(shape, per_head=False, share=args.share)
    stream = cupy.cuda.Stream(non_blocking=True)
    try:
        for b in (int(x) for x in args.batches.split(",")):
            with stream:
                layers = rotating_layers(shape, args.size, b)
                cache = psa_fast.PagedKVCache(num_layers=layers, batch=b, num_kv_heads=shape.hkv, head_dim=shape.d,
                                              max_tokens=args.size, block_size=shape.s)
                qs = [fill(cache, layer) for layer in range(layers)]
                rows = {}
                for clocks in (0, 1):  # the production builds, then the clock builds (a plan of their own)
                    _kernels.EO_CLOCK = _kernels.LOOP_CLOCK = clocks
                    p = psa_fast.plan(cache, num_q_heads=shape.hq, threshold=0.95, scale=shape.scale)
                    if not p._estimate_order:
                        break
                    for layer in range(layers):  # compiles; the clock builds' arrays allocated before the capture
                        p.run(qs[layer], layer)
                    stage = {None: lambda layer: p.run(qs[layer], layer), "estimate": p.estimate,
                             "attend": p.attend}[args.only]
                    for layer in range(layers):  # (the stage's own builds: the plan's scaled query)
                        stage(layer)
                    rows[clocks] = per_call_us(stage, layers, stream, args.reps)
                if not rows:
                    print(f"\nT={args.size} B={b}: this plan does not fuse the estimate and the order")
                    continue
                stream.synchronize()
                print(f"\nT={args.size} B={b} {shape.name} {args.share:.0%}, {layers} layers in turn, {PER_GRAPH} "
                      f"calls a graph; step {rows[0]:.2f} µs a call with the production builds, {rows[1]:.2f} with "
                      "the clocks")
                print(f"| event (the graph's last call{'' if args.only is None else ', ' + args.only + ' alone'}) "
                      "| µs |\n|---|---|")
                if p._fused_step:  # (FUSED_STEP: one kernel, the loop's clock from before its estimate and order)
                    print("\n".join(alone_rows(cupy.asnumpy(_kernels.loop_clocks), 18, rows[1])))
                elif args.only is None:
                    print("\n".join(timeline_rows(cupy.asnumpy(_kernels.eo_clocks),
                                                  cupy.asnumpy(_kernels.loop_clocks), rows[1])))
                else:
                    clocks = _kernels.eo_clocks if args.only == "estimate" else _kernels.loop_clocks
                    print("\n".join(alone_rows(cupy.asnumpy(clocks), 10 if args.only == "estimate" else 18,
                                               rows[1])))
    finally:
        _kernels.EO_CLOCK = _kernels.LOOP_CLOCK = 0


if __name__ == "__main__":
    main()
