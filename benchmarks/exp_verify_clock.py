"""Where ``psa_spec_verify``'s time goes, phase by phase: its ``PSA_VERIFY_CLOCK`` build (``_kernels.VERIFY_CLOCK``)
has thread 0 of every CTA (one per group) read the SM clock between phases. One real layer replayed as
``profile_decode_step.py`` does, the default rule speculating ``--speculate``; per batch size the mean and the
largest group's µs of: the whole kernel, its start (up to the first decision window), the windows' gathering of
the chunks' statistics, their prefix scans, their decisions, and the output pass.

    python benchmarks/exp_verify_clock.py --kv ../.gl/gemma3_xml_l17_32k.npz --shape gemma3 --batches 1,8,32 --spread

The fifteenth session's v2 (one gathering round) changed nothing; this says which phase holds the 17 µs.

``--loop`` times the loop instead (``_kernels.LOOP_CLOCK``, the ``PSA_LOOP_CLOCK`` builds): the resumed loop after the
verifier, or with ``--speculate 0`` the plain loop; per group that ran, its start, the chunks' attention, the
barriers after them and the decisions (summed over its iterations), the finish, and the iterations;
``--first-chunk predicted`` with the plain loop starts each group with the chunk its estimates predict.

``--speculate first_chunk --first-chunk estimated_stop`` times the verify of the first chunks speculated in pieces
(``DecodePlan(speculate="first_chunk")``); ``--per-head`` draws bench_decode's per-head profile; ``--warps`` and
``--stages`` set the plan's launch shape (the loop's pair at 4 and 8 warps, sixty-eighth session):

    python benchmarks/exp_verify_clock.py --per-head --shape llama8b --batches 1 --stop ema --speculate 0 \
        --first-chunk estimated_stop --step auto --loop --warps 4 --stages 6

By default one layer is replayed, so a step after the first reads much of its K/V from L2 (the clocks then run
below the profiler's µs, which rotate over layers). ``--layers 0`` rotates over ``bench_decode.rotating_layers``
layers as profile_decode_step.py does, so that the step whose clocks are read takes its K/V from HBM
(``--layers N``: N layers).
"""

from __future__ import annotations

import argparse

import numpy as np

PHASES = ("kernel", "start", "gather", "scan", "decide", "output")


def phase_table(clocks: np.ndarray, khz: float) -> list[str]:
    """Rows ``phase | mean µs | max µs`` from ``clocks [..., 8]`` (cycles of the phases, then the windows and the
    chunks per group) at an SM clock of ``khz`` kHz; a last row gives the mean windows and chunks."""
    c = np.asarray(clocks, dtype=np.float64).reshape(-1, 8)
    if c.shape[0] == 0:
        raise ValueError("clocks: no group")
    us = c[:, : len(PHASES)] / (khz * 1e-3)
    rows = [f"| {name} | {us[:, i].mean():.2f} | {us[:, i].max():.2f} |" for i, name in enumerate(PHASES)]
    rows.append(f"| windows / chunks | {c[:, 6].mean():.1f} | {c[:, 7].mean():.1f} |")
    return rows


LOOP_PHASES = ("kernel", "start", "attend", "barrier", "decide: stats", "decide: sketch sums", "decide: rest",
               "finish")
START_MARKS = ("start: to the query loaded", "start: to the first copies issued")  # from the kernel's start
FINISH_MARKS = ("finish: to the prefetches drained", "finish: to the warps combined", "finish: to the end's barrier",
                "finish: to the outputs written")  # from the finish's start
# The grid build's finish since the thirty-second session: no warps' combine, no end barrier (decode.cu)
GRID_FINISH_MARKS = ("finish: to the prefetches drained", "finish: to the combine's start",
                     "finish: to the outputs written", "finish: to the end")


def loop_table(clocks: np.ndarray, khz: float, grid: bool = False) -> list[str]:
    """Rows ``phase | mean µs | max µs`` over the groups that ran the loop (``clocks [..., 18]``, ``[..., 16]`` as
    builds before the seventy-fifth session wrote them (no global timer), or ``[..., 12]`` as before the thirty-first:
    cycles of the phases, iterations, 1 if the group ran, two marks within the start, counted from the kernel's start,
    and four within the finish, from its start) at ``khz`` kHz; then the iterations and the µs an iteration. The
    marks' rows follow the start's and the finish's where a build wrote them, named as the grid build's finish has them
    where ``grid``."""
    clocks = np.asarray(clocks, dtype=np.float64)
    if clocks.shape[-1] not in (12, 16, 18):
        raise ValueError(f"clocks: 12, 16 or 18 words a group, got {clocks.shape[-1]}")
    c = clocks.reshape(-1, clocks.shape[-1])
    c = c[c[:, 9] > 0]
    if c.shape[0] == 0:
        return ["| (no group ran the loop) | | |"]
    k = len(LOOP_PHASES)
    us = c[:, :k] / (khz * 1e-3)
    rows = [f"| {name} | {us[:, i].mean():.2f} | {us[:, i].max():.2f} |" for i, name in enumerate(LOOP_PHASES)]
    if c.shape[1] >= 16 and c[:, 12:16].any():  # within the finish (thirty-first session on)
        marks = c[:, 12:16] / (khz * 1e-3)
        rows += [f"| {name} | {marks[:, i].mean():.2f} | {marks[:, i].max():.2f} |"
                 for i, name in enumerate(GRID_FINISH_MARKS if grid else FINISH_MARKS)]
    if c[:, 10:12].any():  # within the start (builds since the twenty-fourth session): the marks' cycles from it
        marks = c[:, 10:12] / (khz * 1e-3)
        for i, name in enumerate(START_MARKS):
            rows.insert(2 + i, f"| {name} | {marks[:, i].mean():.2f} | {marks[:, i].max():.2f} |")
    iters = c[:, 8]
    per = us[:, 2:7].sum(axis=1) / np.maximum(iters, 1)
    rows.append(f"| iterations | {iters.mean():.1f} | {iters.max():.0f} |")
    rows.append(f"| µs an iteration | {per.mean():.2f} | {per.max():.2f} |")
    rows.append(f"| groups that ran | {c.shape[0]} | |")
    return rows


def parse_speculate(text: str, error) -> float | str | None:
    """``--speculate``: ``"first_chunk"``, a margin > 0, or 0 (None: the plain loop); ``error`` (the parser's) on
    anything else."""
    if text == "first_chunk":
        return text
    try:
        margin = float(text)
    except ValueError:
        margin = -1.0
    if not margin >= 0:
        error(f"--speculate must be a margin >= 0 (0: none) or first_chunk, got {text!r}")
    return margin or None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kv", default=None, help="captured trace .npz files, comma-separated (bench_decode --kv)")
    ap.add_argument("--share", type=float, default=None,
                    help="instead of --kv: drawn block masses whose ideal τ 0.95 budget is about this share")
    ap.add_argument("--stop", default="auto", choices=("auto", "ema"),
                    help="the rule: auto (sketch_avg on quant3) or ema (on cuboid_mean)")
    ap.add_argument("--per-head", action="store_true",
                    help="instead of --kv / --share: block masses whose heads differ as the shipped trace's "
                         "(bench_decode --profile per-head)")
    ap.add_argument("--step", default=None,
                    help="blocks an iteration, or auto (the plan's pick; default: _kernels.spec_step's chunks)")
    ap.add_argument("--spread", action="store_true", help="a batch of different decode steps (profile_decode_step)")
    ap.add_argument("--shape", default="gemma3")
    ap.add_argument("--size", type=int, default=32768)
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--speculate", default="1.0",
                    help="a margin (0: none, the plain loop) or first_chunk (DecodePlan(speculate='first_chunk'))")
    ap.add_argument("--steps", type=int, default=5, help="steps run before the clocks are read (the last counts)")
    ap.add_argument("--loop", action="store_true", help="time the loop (resumed, or plain with --speculate 0)")
    ap.add_argument("--first-chunk", default=None, choices=("predicted", "estimated_stop"),
                    help="the plan's first ranked chunk (DecodePlan(first_chunk=...)); --speculate first_chunk needs "
                         "one")
    ap.add_argument("--warps", type=int, default=None, help="DecodePlan(warps=...) (default: the plan's)")
    ap.add_argument("--stages", type=int, default=None, help="DecodePlan(stages=...) (default: the plan's)")
    ap.add_argument("--rank", default="estimate", choices=("estimate", "share"),
                    help="how shared groups rank their blocks (DecodePlan(rank=...))")
    ap.add_argument("--layers", type=int, default=1,
                    help="layers the steps rotate over (1: one layer, K/V partly in L2; 0: bench_decode."
                         "rotating_layers, K/V from HBM as in profile_decode_step.py)")
    ap.add_argument("--per-group", action="store_true",
                    help="with --loop: also each group's µs of the kernel and of its attention, and its blocks used")
    args = ap.parse_args()
    if (args.kv is not None) + (args.share is not None) + args.per_head != 1:
        ap.error("give the data: one of --kv TRACES, --share S or --per-head")
    speculate = parse_speculate(args.speculate, ap.error)
    if speculate == "first_chunk" and args.first_chunk is None:
        ap.error("--speculate first_chunk speculates the first ranked chunk: give --first-chunk too")
    if args.step is not None and args.step != "auto" and not (args.step.isdigit() and int(args.step) > 0):
        ap.error(f"--step must be a positive integer or auto, got {args.step!r}")
    if args.warps is not None and args.warps < 1:
        ap.error(f"--warps must be >= 1, got {args.warps}")
    if args.stages is not None and args.stages < 2:
        ap.error(f"--stages must be >= 2 (a prefetch ring), got {args.stages}")
    if args.layers < 0:
        ap.error(f"--layers must be >= 0 (0: bench_decode.rotating_layers), got {args.layers}")

    import cupy
    from bench_decode import SHAPES, data_fill, rotating_layers

    import psa_fast
    from psa_fast import _kernels

    shape = SHAPES[args.shape]
    fill = data_fill(shape, kv=args.kv, spread=args.spread, per_head=args.per_head, share=args.share)
    khz = float(cupy.cuda.Device().attributes["ClockRate"])
    if args.loop:
        _kernels.LOOP_CLOCK = 1
    else:
        _kernels.VERIFY_CLOCK = 1
    try:
        for b in (int(x) for x in args.batches.split(",")):
            layers = args.layers or rotating_layers(shape, args.size, b)
            cache = psa_fast.PagedKVCache(num_layers=layers, batch=b, num_kv_heads=shape.hkv, head_dim=shape.d,
                                          max_tokens=args.size, block_size=shape.s,
                                          metadata="quant3" if args.stop == "auto" else "cuboid_mean")
            qs = [fill(cache, layer) for layer in range(layers)]
            p = psa_fast.plan(cache, num_q_heads=shape.hq, mode="psa", threshold=0.95, scale=shape.scale,
                              stop=args.stop, speculate=speculate, first_chunk=args.first_chunk, rank=args.rank,
                              step=("auto" if args.step == "auto" else int(args.step) if args.step
                                    else _kernels.spec_step(cache.nmax)),
                              warps=args.warps, stages=args.stages)
            steps = max(args.steps, layers + 1)  # (every layer's step compiled and warm before the one read)
            for i in range(steps):
                p.run(qs[i % layers], i % layers)
            cupy.cuda.Device().synchronize()
            what = "the loop" if args.loop else "psa_spec_verify"
            print(f"\nT={args.size} B={b} {shape.name} {args.stop} rank {args.rank} step {p.step} speculate {speculate}"
                  f"{'' if args.first_chunk is None else ', first chunk ' + args.first_chunk}"
                  f"{' spread' if args.spread else ''}, {what}, cluster {p.cluster}, grid {p.grid_ctas}, "
                  f"{layers} layer{'s in turn' if layers > 1 else ''}, "
                  f"SM clock {khz / 1e3:.0f} MHz (its maximum)")
            print("| phase | mean µs | largest µs |\n|---|---|---|")
            if args.loop:
                print("\n".join(loop_table(cupy.asnumpy(_kernels.loop_clocks), khz, grid=p.grid_ctas > 0)))
                if args.per_group:
                    c = cupy.asnumpy(_kernels.loop_clocks)[..., :16].reshape(-1, 16) / (khz * 1e-3)
                    used = cupy.asnumpy(p.num_used).reshape(-1)
                    print("per group: kernel µs " + " ".join(f"{x:.1f}" for x in c[:, 0]))
                    print("per group: attend µs " + " ".join(f"{x:.1f}" for x in c[:, 2]))
                    print("per group: blocks used " + " ".join(str(int(x)) for x in used))
            else:
                print("\n".join(phase_table(cupy.asnumpy(_kernels.verify_clocks), khz)))
    finally:
        _kernels.VERIFY_CLOCK = _kernels.LOOP_CLOCK = 0


if __name__ == "__main__":
    main()
