"""A first chunk sized by the ema rule run on the estimates (CPU, psa_ref): does it let one request's loop stop at its
first decision? For each captured decode step of a trace (bench_decode's ``--kv`` files: one layer of Gemma 3 at 32K),
``stop="ema"`` on ``cuboid_mean``: the plain step, a larger step, ``first_chunk="predicted"`` (the estimated mass share
reaches tau) and a first chunk of ``margin`` x the position where the ema rule, run on the estimated masses ``n_j
exp(s_j)`` instead of the true ones, first holds for every head. Prints the decisions past the forced chunk (mean,
max, share of steps with one), the blocks read and the mean relative error against dense.

    python benchmarks/exp_ema_first.py --kv .gl/gemma3_xml_l17_32k.npz --step 768
"""

from __future__ import annotations

import argparse

import numpy as np


def ema_on_estimates(scores: np.ndarray, order: np.ndarray, num_forced: int, lengths: np.ndarray,
                     threshold: float) -> int:
    """Ranked blocks after which the ema rule, run on the estimated masses ``n_j exp(s_j)`` block by block, holds for
    every head of the group: psa_ref's ``first_chunk="estimated_stop"`` at a margin of 1
    (``psa_ref.progressive.estimated_stop_first_chunk``, which grew out of this script). ``scores [G, N]``."""
    from psa_ref.progressive import estimated_stop_first_chunk

    return estimated_stop_first_chunk(scores, order, num_forced, lengths, threshold, "ema", margin=1.0)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kv", required=True, help="a trace .npz (bench_decode --kv)")
    ap.add_argument("--step", type=int, default=768, help="the plan's step (after any first chunk)")
    ap.add_argument("--large-step", type=int, default=1536)
    ap.add_argument("--margins", default="1.0,1.2,1.35,1.5")
    ap.add_argument("--tau", type=float, default=0.95)
    ap.add_argument("--sink", type=int, default=1)
    ap.add_argument("--recent", type=int, default=2)
    args = ap.parse_args(argv)

    import psa_ref
    from psa_ref import sweep
    from psa_ref.scoring import estimate, forced_blocks, processing_order
    from psa_ref.trace import load_trace

    trace = load_trace(args.kv)
    margins = [float(x) for x in args.margins.split(",")]
    rows: dict[str, list] = {}
    for li in range(len(trace.layers)):
        for pi in range(trace.q.shape[1]):
            q, k, v = (a.astype(np.float64) for a in trace.case(li, pi))
            b = psa_ref.KVBlocks.from_dense(k, v, block_size=16, metadata="cuboid_mean", kv_layout="HND")
            if k.shape[0] != 1:
                raise SystemExit("exp_ema_first.py takes traces of one KV head (a first chunk is one number a call)")
            dense = psa_ref.dense_attention(q, k, v, scale=trace.scale)
            s = estimate(q, b, trace.scale)
            forced = forced_blocks(b.num_blocks, args.sink, args.recent)
            order = processing_order(s.max(axis=0), forced)
            sim = ema_on_estimates(s, order, forced.size, b.block_lengths, args.tau)
            runs = {f"step {args.step}": dict(step=args.step), f"step {args.large_step}": dict(step=args.large_step),
                    "predicted (mass share)": dict(step=args.step, first_chunk="predicted")}
            runs.update({f"ema on the estimates x {m}": dict(step=args.step, first_chunk=max(1, int(np.ceil(sim * m))))
                         for m in margins})
            for name, opts in runs.items():
                res = sweep.attention(q, b, args.tau, stop="ema", scale=trace.scale, sink_blocks=args.sink,
                                      recent_blocks=args.recent, **opts)
                err = np.linalg.norm(res.output - dense, axis=1) / np.linalg.norm(dense, axis=1)
                decisions = int(np.atleast_1d(res.iterations)[0]) - (forced.size > 0)
                rows.setdefault(name, []).append((decisions, res.blocks_used[0].size / b.num_blocks, err.mean()))
    print(f"{args.kv}: ema on cuboid_mean, tau {args.tau}, sink {args.sink}, recent {args.recent}, "
          f"{len(next(iter(rows.values())))} decode steps")
    print("| schedule | decisions past the forced chunk (mean / max) | stopped at the first | blocks read | error |")
    print("|---|---|---|---|---|")
    for name, r in rows.items():
        a = np.asarray(r)
        print(f"| {name} | {a[:, 0].mean():.2f} / {a[:, 0].max():.0f} | {np.mean(a[:, 0] == 1):.0%} | "
              f"{a[:, 1].mean():.1%} | {a[:, 2].mean():.4f} |")


if __name__ == "__main__":
    main()
