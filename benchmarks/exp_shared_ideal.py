"""How few blocks a shared selection could read on captured attention: for each captured decode query of each trace
(one layer's K/V and the query heads of its one KV group, as `slice_trace.py` writes them), the share of the blocks
that holds ``tau`` of the true attention mass

* for a query head alone (the ideal per-head budget: the heaviest blocks first, `psa_ref.analysis.blocks_for_mass`),
* for the group's busiest head (a selection shared by the group reads at least that),
* as the union of the heads' ideal sets,
* as the shortest prefix of one order that gives every head ``tau``: blocks by their largest share of any head's
  mass (an oracle of the true masses for ``gqa="shared"``; ``PSAConfig(rank="share")`` ranks by estimated shares);
* with ``--metadata``: as the shortest prefix of the group's processing order from that metadata's estimates (the
  sink and recent blocks first, then ``rank="estimate"`` and ``rank="share"``, as `psa_ref.attention` orders a
  shared group) that gives every head ``tau``: the stop of an oracle on PSA's own order, so what a stop rule reads
  beyond it is the rule's cost, and what it reads beyond the max-share prefix the ranking's.

Means over the queries, in percent of the blocks before each query.

    python benchmarks/exp_shared_ideal.py .gl/gemma3_xml_l5_32k.npz .gl/gemma3_xml_l11_32k.npz \
        .gl/gemma3_xml_l17_32k.npz
"""

from __future__ import annotations

import argparse

import numpy as np

from psa_ref import METADATA_KINDS, KVBlocks
from psa_ref.analysis import block_sums, blocks_for_mass
from psa_ref.scoring import RANKS, estimate, forced_blocks, group_rank_key, processing_order, rank


def prefix_holding(mass: np.ndarray, order: np.ndarray, tau: float) -> int:
    """The fewest leading blocks of ``order`` that hold ``tau`` of every head's mass (``mass [N, G]``)."""
    share = np.cumsum(mass[order] / mass.sum(axis=0), axis=0)
    return int((share.min(axis=1) < tau - 1e-12).sum()) + 1


def shared_budgets(mass: np.ndarray, tau: float) -> tuple[float, float, float, float]:
    """``(a head's mean, the busiest head's, the heads' ideal sets' union, the max-share order's prefix)`` budgets in
    blocks for ``mass [N, G]`` (one query's block masses per head, as `block_sums` gives them)."""
    per = blocks_for_mass(mass, tau)
    union = set()
    for h in range(mass.shape[1]):
        union.update(rank(mass[:, h])[: per[h]].tolist())
    max_share = (mass / mass.sum(axis=0)).max(axis=1)
    return float(per.mean()), float(per.max()), float(len(union)), float(prefix_holding(mass, rank(max_share), tau))


def estimate_orders(q: np.ndarray, keys: np.ndarray, values: np.ndarray, scale: float, block_size: int,
                    metadata: str, sink: int, recent: int) -> dict[str, np.ndarray]:
    """``rank -> [N]``: the shared group's processing order from ``metadata``'s estimates (``q [G, D]``, one KV
    head's ``keys`` / ``values [T, D]``), forced blocks first, for every rank of `psa_ref.scoring.RANKS`."""
    blocks = KVBlocks.from_dense(keys[None], values[None], block_size=block_size, metadata=metadata)
    scores = estimate(q, blocks, scale)
    forced = forced_blocks(blocks.num_blocks, sink, recent)
    return {r: processing_order(group_rank_key(scores, blocks.block_lengths, r), forced) for r in RANKS}


def one_kv_head(path: str):
    """A one-layer, one-KV-head trace (``slice_trace.py``'s ``.npz``): ``(npz, keys [T, D], values [T, D], scale)``,
    K and V as float64."""
    z = np.load(path)
    if z["k"].shape[:2] != (1, 1):
        raise SystemExit(f"{path}: expected one layer and one KV head (k [1, 1, T, D]), got {z['k'].shape}")
    return z, z["k"][0, 0].astype(np.float64), z["v"][0, 0].astype(np.float64), float(z["scale"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("traces", nargs="+", help="one-layer traces (.npz: q [1, P, G, D], k / v [1, 1, T, D], positions)")
    ap.add_argument("--tau", type=float, default=0.95)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--metadata", default=None, choices=METADATA_KINDS,
                    help="also the oracle stop on the shared order from this metadata's estimates (e.g. quant3)")
    ap.add_argument("--forced", default="1/1", help="with --metadata: sink/recent blocks first (default 1/1)")
    args = ap.parse_args()
    if not 0 < args.tau <= 1:
        ap.error(f"--tau must be in (0, 1], got {args.tau}")
    try:
        sink, recent = (int(x) for x in args.forced.split("/"))
    except ValueError:
        ap.error(f"--forced is SINK/RECENT block counts, got {args.forced!r}")
    extra = [f"{args.metadata} order ({r}), oracle stop" for r in RANKS] if args.metadata else []
    print(f"# blocks holding τ {args.tau} of the true mass, blocks of {args.block_size} tokens, % of the blocks")
    print("| trace | queries | a head | the group's busiest head | union of the heads' sets | "
          "one shared order (max share) |" + "".join(f" {e} |" for e in extra))
    print("|---|---|---|---|---|---|" + "---|" * len(extra))
    for path in args.traces:
        z, k, v, scale = one_kv_head(path)
        rows = []
        for i, pos in enumerate(z["positions"]):
            t = int(pos) + 1
            q = z["q"][0, i].astype(np.float64)
            mass, _ = block_sums(q, k[:t], v[:t], args.block_size, scale)
            row = list(shared_budgets(mass, args.tau))
            if args.metadata:
                orders = estimate_orders(q, k[:t], v[:t], scale, args.block_size, args.metadata, sink, recent)
                row += [prefix_holding(mass, orders[r], args.tau) for r in RANKS]
            rows.append(np.array(row, dtype=np.float64) / mass.shape[0])
        m = 100 * np.mean(rows, axis=0)
        print(f"| {path} | {len(rows)} | " + " | ".join(f"{x:.1f}%" for x in m) + " |", flush=True)


if __name__ == "__main__":
    main()
