"""The previous call's stop as this call's first chunk: what it would do on a real layer's decode steps (CPU, psa_ref).

A step sized for the busiest group's need takes one or two iterations where the plan's step takes four (the real Gemma
3 layer 17 at B = 8: 78.8 -> 69.8 µs with a step sized for all of its heads' ~60% of the blocks, NOTES.md, s35i),
but the plan cannot see the need, and predicting it from the estimates costs a pass that has never paid for itself.
A layer's need changes little from one decode step to the next, though, and the decode kernel already knows where
each group stopped. So: each call's first ranked chunk = some function of the blocks the same layer's group attended
at its previous call, then chunks of ``step``. ``psa_ref.attention(first_chunk=n)`` already runs that schedule for
one call; this script runs a captured layer's decode steps in order (the trace's queries, each at its own position,
its keys and values up to it) under each policy and prints the verifier decisions and blocks read per step, the true
mass attended and the error against dense attention.

    python benchmarks/exp_previous_stop.py --kv .gl/gemma3_xml_l17_32k.npz --steps 320,768 [--stop ema]

Policies (``prev``: the ranked blocks the group attended at the previous step; the first step has none and runs
the plain schedule): ``step`` (the plan's schedule, no first chunk), ``previous`` (first chunk = prev),
``previous - step`` (prev - step, ``psa_ref.progressive.previous_first_chunk``, as ``DecodePlan(first_chunk=
"previous")``: if nothing changed, the rule decides one step early, then where it stopped before),
``3/4 previous`` (a quarter less, rounded down to a multiple of ``--unit`` blocks).
"""

from __future__ import annotations

import argparse
import json

import numpy as np

POLICIES = ("step", "previous", "previous - step", "3/4 previous")


def first_chunk(policy: str, prev: int | None, step: int, unit: int) -> int | None:
    """The first ranked chunk for ``policy`` given the previous step's ranked blocks (None before the first step)."""
    if policy == "step" or prev is None:
        return None
    if policy == "previous":
        n = prev
    elif policy == "previous - step":  # DecodePlan(first_chunk="previous")
        from psa_ref.progressive import previous_first_chunk

        return previous_first_chunk(prev, 0, step)
    elif policy == "3/4 previous":
        n = (3 * prev // 4) // unit * unit
    else:
        raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
    return n if n >= 1 else None


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kv", required=True, help="a captured layer (.npz, benchmarks/slice_trace.py), one KV head")
    ap.add_argument("--tau", type=float, default=0.95)
    ap.add_argument("--stop", default="ema")
    ap.add_argument("--steps", default="320,768", help="the plan's steps (blocks an iteration), comma-separated")
    ap.add_argument("--unit", type=int, default=32, help="blocks a first chunk is rounded to (3/4 previous)")
    ap.add_argument("--queries", type=int, default=0, help="the last N decode steps of the trace only (0: all)")
    ap.add_argument("--out", default=None, help="write every step's row as JSON lines here")
    args = ap.parse_args(argv)

    import psa_ref
    from tqdm import tqdm

    z = np.load(args.kv)
    q_all, k_all, v_all, positions = z["q"], z["k"], z["v"], np.asarray(z["positions"])
    scale = float(z["scale"])
    if q_all.shape[0] != 1 or k_all.shape[1] != 1:
        raise SystemExit(f"expected one layer and one KV head, got q {q_all.shape}, k {k_all.shape}")
    order = np.argsort(positions, kind="stable")[-args.queries:] if args.queries else np.argsort(positions)
    steps = [int(s) for s in args.steps.split(",")]
    rows = []
    cases = [(s, p) for s in steps for p in POLICIES]
    prev = {c: None for c in cases}
    for t in tqdm(order, desc="decode steps", unit="step"):
        p = int(positions[t])
        k, v = k_all[0, :, : p + 1].astype(np.float64), v_all[0, :, : p + 1].astype(np.float64)
        q = q_all[0, t].astype(np.float64)
        blocks = psa_ref.KVBlocks.from_dense(k, v, block_size=16, kv_layout="HND")
        dense = psa_ref.dense_attention(q, k, v, scale=scale)
        for step, policy in cases:
            fc = first_chunk(policy, prev[(step, policy)], step, args.unit)
            res = psa_ref.attention(q, blocks, args.tau, stop=args.stop, scale=scale, step=step, first_chunk=fc,
                                    exact_mass=True)
            used = len(res.blocks_used[0])
            prev[(step, policy)] = used
            err = np.linalg.norm(res.output - dense, axis=1) / np.linalg.norm(dense, axis=1)
            rows.append(dict(position=p, step=step, policy=policy, first_chunk=fc or 0,
                             iterations=int(np.max(res.iterations)), blocks=used, num_blocks=blocks.num_blocks,
                             mass=float(np.min(res.mass_exact)), err=float(np.mean(err))))
    if args.out:
        with open(args.out, "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    print(f"# {args.kv}: {len(order)} decode steps (positions {positions[order[0]]}..{positions[order[-1]]}), "
          f"tau {args.tau}, stop {args.stop}; the first step of each policy runs the plain schedule")
    print("| step | policy | iterations (mean / max) | blocks read (mean / max) | true mass (min) | error (mean) |")
    print("|---|---|---|---|---|---|")
    for step, policy in cases:
        r = [x for x in rows if x["step"] == step and x["policy"] == policy]
        it = np.array([x["iterations"] for x in r])
        share = np.array([x["blocks"] / x["num_blocks"] for x in r])
        print(f"| {step} | {policy} | {it.mean():.2f} / {it.max()} | {share.mean():.1%} / {share.max():.1%} | "
              f"{min(x['mass'] for x in r):.3f} | {np.mean([x['err'] for x in r]):.4f} |")


if __name__ == "__main__":
    main()
