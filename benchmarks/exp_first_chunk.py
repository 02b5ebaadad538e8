"""What a predicted first chunk does to Algorithm 1 on the shipped real-attention trace (CPU, psa_ref).

For every (layer, position) of the trace (SmolLM2-135M, 2048 tokens, 9 query / 3 KV heads, blocks of
16) and each schedule, per KV-head group: iterations (verifier decisions), blocks read, the true mass
attended (mean and worst 1%) and the output error against dense; the ideal budget (each head's
heaviest true blocks until tau) for scale.

    python benchmarks/exp_first_chunk.py [--tau 0.95] [--stop ema]
    python benchmarks/exp_first_chunk.py --kv .gl/gemma3_xml_l17_32k.npz --metadata quant3 --stop sketch_avg \
        --steps 128,320 --recent 2

``--kv`` takes any captured trace (bench_decode's ``--kv`` files: one layer of Gemma 3 at 32K), ``--metadata`` the
blocks' metadata, ``--steps`` the steps, each alone and after a predicted first chunk.

``--residual`` instead measures what the prediction leaves: the predicted chunk, then steps of one block, so each
decision past the first chunk adds one block; it prints the distribution over groups of the blocks still needed, the
need that ``psa_fast._kernels.pick_step`` sizes the step for after a predicted first chunk (``PREDICTED_SHARE``):

    python benchmarks/exp_first_chunk.py --kv .gl/gemma3_xml_l17_32k.npz --metadata quant3 --stop sketch_avg \
        --recent 2 --residual
"""

from __future__ import annotations

import argparse

import numpy as np


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tau", type=float, default=0.95)
    ap.add_argument("--stop", default="ema")
    ap.add_argument("--sink", type=int, default=1)
    ap.add_argument("--recent", type=int, default=1)
    ap.add_argument("--kv", default=None, help="a trace .npz (default: the shipped SmolLM2 trace)")
    ap.add_argument("--metadata", default="cuboid_mean")
    ap.add_argument("--steps", default="1,8", help="comma-separated")
    ap.add_argument("--residual", action="store_true", help="the blocks needed past the predicted first chunk")
    args = ap.parse_args(argv)
    if args.residual:
        residual(args)
        return

    import psa_ref
    from psa_ref import analysis, sweep
    from psa_ref.trace import load_trace

    trace = load_trace(args.kv)
    steps = [int(x) for x in args.steps.split(",")]
    schedules = {**{f"step {s}": dict(step=s) for s in steps},
                 **{f"predicted, then {s}": dict(step=s, first_chunk="predicted") for s in steps}}
    rows = {name: {"it": [], "blocks": [], "mass": [], "err": []} for name in schedules}
    ideal = []
    for li in range(len(trace.layers)):
        for pi in range(trace.q.shape[1]):
            q, k, v = (a.astype(np.float64) for a in trace.case(li, pi))
            b = psa_ref.KVBlocks.from_dense(k, v, block_size=16, metadata=args.metadata, kv_layout="HND")
            dense = psa_ref.dense_attention(q, k, v, scale=trace.scale)
            g = q.shape[0] // k.shape[0]
            for kv in range(k.shape[0]):
                mass, _ = analysis.block_sums(q[kv * g : (kv + 1) * g], k[kv], v[kv], 16, trace.scale)
                ideal.append(analysis.blocks_for_mass(mass, args.tau).mean() / b.num_blocks)
            for name, opts in schedules.items():
                res = sweep.attention(q, b, args.tau, stop=args.stop, scale=trace.scale, sink_blocks=args.sink,
                                      recent_blocks=args.recent, exact_mass=True, **opts)
                r = rows[name]
                r["it"] += list(np.atleast_1d(res.iterations))
                r["blocks"] += [u.size / b.num_blocks for u in res.blocks_used]
                r["mass"] += list(res.mass_exact)
                r["err"] += list(np.linalg.norm(res.output - dense, axis=1) / np.linalg.norm(dense, axis=1))
    print(f"trace: {len(trace.layers)} layers x {trace.q.shape[1]} positions, tau {args.tau}, stop {args.stop} on "
          f"{args.metadata}, "
          f"sink {args.sink}, recent {args.recent}; ideal budget {np.mean(ideal):.1%} of blocks (per head, mean)")
    print("| schedule | iterations (mean) | blocks read | true mass mean | true mass p1 | error mean |")
    print("|---|---|---|---|---|---|")
    for name, r in rows.items():
        print(f"| {name} | {np.mean(r['it']):.1f} | {np.mean(r['blocks']):.1%} | {np.mean(r['mass']):.3f} | "
              f"{np.percentile(r['mass'], 1):.3f} | {np.mean(r['err']):.4f} |")


def residual_shares(trace, cases, *, metadata: str, stop: str, tau: float, sink: int, recent: int) -> np.ndarray:
    """For each (layer, position) of ``cases`` and each selection group (shared GQA): the blocks the group attends
    past its predicted first chunk, as a share of its blocks. With steps of one block after the prediction each
    decision past the forced blocks and the predicted chunk adds one block."""
    import psa_ref
    from psa_ref import sweep

    shares = []
    for li, pi in cases:
        q, k, v = (a.astype(np.float64) for a in trace.case(li, pi))
        b = psa_ref.KVBlocks.from_dense(k, v, block_size=16, metadata=metadata, kv_layout="HND")
        res = sweep.attention(q, b, tau, stop=stop, scale=trace.scale, sink_blocks=sink, recent_blocks=recent,
                              step=1, first_chunk="predicted")
        forced = min(b.num_blocks, sink + recent) > 0  # the forced blocks are one decision
        shares += list((np.atleast_1d(res.iterations) - forced - 1) / b.num_blocks)
    return np.asarray(shares)


def residual_table(shares) -> list[str]:
    """The markdown rows of a residual distribution (``residual_shares``, or any shares of the blocks needed past a
    predicted chunk): its mean, percentiles, largest and share of groups needing none, ``PREDICTED_SHARE`` beside."""
    from psa_fast._kernels import PREDICTED_SHARE

    shares = np.asarray(shares, dtype=np.float64)
    p = np.percentile(shares, [50, 90, 99])
    return ["| groups | past the prediction: mean | p50 | p90 | p99 | max | none needed | PREDICTED_SHARE |",
            "|---|---|---|---|---|---|---|---|",
            f"| {shares.size} | {shares.mean():.2%} | {p[0]:.2%} | {p[1]:.2%} | {p[2]:.2%} | {shares.max():.2%} | "
            f"{np.mean(shares == 0):.0%} | {PREDICTED_SHARE:.2%} |"]


def residual(args) -> None:
    """Percentiles of ``residual_shares`` over the whole trace, and ``PREDICTED_SHARE`` beside them."""
    from psa_ref.trace import load_trace

    trace = load_trace(args.kv)
    cases = [(li, pi) for li in range(len(trace.layers)) for pi in range(trace.q.shape[1])]
    shares = residual_shares(trace, cases, metadata=args.metadata, stop=args.stop, tau=args.tau, sink=args.sink,
                             recent=args.recent)
    blocks = -(-trace.case(*cases[-1])[1].shape[-2] // 16)  # the last case's keys: the trace's longest prefix
    print(f"trace: {len(trace.layers)} layers x {trace.q.shape[1]} positions, tau {args.tau}, stop {args.stop} on "
          f"{args.metadata}, sink {args.sink}, recent {args.recent}; up to {blocks} blocks a group "
          f"(p90 = {np.percentile(shares, 90) * blocks:.0f} blocks there)")
    print("\n".join(residual_table(shares)))


if __name__ == "__main__":
    main()
