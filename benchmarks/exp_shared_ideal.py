"""How few blocks a shared selection could read on captured attention: for each captured decode query of each trace
(one layer's K/V and the query heads of its one KV group, as `slice_trace.py` writes them), the share of the blocks
that holds ``tau`` of the true attention mass

* for a query head alone (the ideal per-head budget: the heaviest blocks first, `psa_ref.analysis.blocks_for_mass`),
* for the group's busiest head (a selection shared by the group reads at least that),
* as the union of the heads' ideal sets,
* as the shortest prefix of one order that gives every head ``tau``: blocks by their largest share of any head's
  mass (an oracle of the true masses for ``gqa="shared"``; ``PSAConfig(rank="share")`` ranks by estimated shares).

Means over the queries, in percent of the blocks before each query.

    python benchmarks/exp_shared_ideal.py .gl/gemma3_xml_l5_32k.npz .gl/gemma3_xml_l11_32k.npz \
        .gl/gemma3_xml_l17_32k.npz
"""

from __future__ import annotations

import argparse

import numpy as np

from psa_ref.analysis import block_sums, blocks_for_mass


def shared_budgets(mass: np.ndarray, tau: float) -> tuple[float, float, float, float]:
    """``(a head's mean, the busiest head's, the heads' ideal sets' union, the max-share order's prefix)`` budgets in
    blocks for ``mass [N, G]`` (one query's block masses per head, as `block_sums` gives them)."""
    per = blocks_for_mass(mass, tau)
    union = set()
    for h in range(mass.shape[1]):
        union.update(np.argsort(-mass[:, h], kind="stable")[: per[h]].tolist())
    share = mass / mass.sum(axis=0)
    order = np.argsort(-share.max(axis=1), kind="stable")
    prefix = int((np.cumsum(share[order], axis=0).min(axis=1) < tau - 1e-12).sum()) + 1
    return float(per.mean()), float(per.max()), float(len(union)), float(prefix)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("traces", nargs="+", help="one-layer traces (.npz: q [1, P, G, D], k / v [1, 1, T, D], positions)")
    ap.add_argument("--tau", type=float, default=0.95)
    ap.add_argument("--block-size", type=int, default=16)
    args = ap.parse_args()
    if not 0 < args.tau <= 1:
        ap.error(f"--tau must be in (0, 1], got {args.tau}")
    print(f"# blocks holding τ {args.tau} of the true mass, blocks of {args.block_size} tokens, % of the blocks")
    print("| trace | queries | a head | the group's busiest head | union of the heads' sets | "
          "one shared order (max share) |")
    print("|---|---|---|---|---|---|")
    for path in args.traces:
        z = np.load(path)
        if z["k"].shape[:2] != (1, 1):
            raise SystemExit(f"{path}: expected one layer and one KV head (k [1, 1, T, D]), got {z['k'].shape}")
        k, v, scale = z["k"][0, 0].astype(np.float64), z["v"][0, 0].astype(np.float64), float(z["scale"])
        rows = []
        for i, pos in enumerate(z["positions"]):
            t = int(pos) + 1
            mass, _ = block_sums(z["q"][0, i].astype(np.float64), k[:t], v[:t], args.block_size, scale)
            rows.append(np.array(shared_budgets(mass, args.tau)) / mass.shape[0])
        m = 100 * np.mean(rows, axis=0)
        print(f"| {path} | {len(rows)} | {m[0]:.1f}% | {m[1]:.1f}% | {m[2]:.1f}% | {m[3]:.1f}% |", flush=True)


if __name__ == "__main__":
    main()
