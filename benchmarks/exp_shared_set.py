"""How few blocks any shared stop rule could read: the smallest set of a KV head's blocks that holds tau of every
query head's exact attention mass, on captured queries (CPU, exact logits; no estimate, no order error).

Per captured query and layer: each head's ideal budget (its heaviest blocks up to tau), their largest ("max head",
a lower bound on any shared set), the union of the heads' ideal sets, and a greedy shared set (blocks by their
largest share of any head's mass, up to tau for every head: an upper bound on the smallest shared set). Shares of
the blocks, averaged over queries. Compare with what a rule reads and with top-k of equal agreement
(docs/long_context_eval.md).

    python benchmarks/exp_shared_set.py /tmp/psa_long/gemma3_xml_32k.npz --last 32
"""

from __future__ import annotations

import argparse

import numpy as np


def shared_sets(q: np.ndarray, keys: np.ndarray, scale: float, *, block_size: int, tau: float) -> dict[str, int]:
    """Block counts for one query ``q [G, D]`` over one KV head's ``keys [T, D]``: ``blocks``, ``mean_head`` (the
    heads' ideal budgets, mean), ``max_head``, ``union``, ``greedy``."""
    from psa_ref.analysis import blocks_for_mass

    logits = (keys.astype(np.float64) @ q.astype(np.float64).T) * scale  # [T, G]
    w = np.exp(logits - logits.max(axis=0))
    mass = np.add.reduceat(w, np.arange(0, keys.shape[0], block_size), axis=0)  # [N, G], as analysis.block_sums
    mass /= mass.sum(axis=0)  # each head's share per block
    ideal = blocks_for_mass(mass, tau)  # [G]: each head's heaviest blocks up to tau
    union = set().union(*(set(np.argsort(-mass[:, h], kind="stable")[:k].tolist()) for h, k in enumerate(ideal)))
    order = np.argsort(-mass.max(axis=1), kind="stable")
    held = np.cumsum(mass[order], axis=0)  # [N, G] along the greedy order
    greedy = int(np.max(np.argmax(held >= tau - 1e-12, axis=0))) + 1
    return {"blocks": mass.shape[0], "mean_head": float(np.mean(ideal)), "max_head": int(ideal.max()),
            "union": len(union), "greedy": greedy}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", help="a captured trace (.npz, psa_ref.trace)")
    ap.add_argument("--last", type=int, default=32, help="the trace's last queries used")
    ap.add_argument("--threshold", type=float, default=0.95)
    ap.add_argument("--block-size", type=int, default=16)
    args = ap.parse_args()
    from tqdm import tqdm

    from psa_ref.trace import load_trace

    tr = load_trace(args.trace)
    hq, hkv = tr.q.shape[2], tr.k.shape[1]
    g = hq // hkv
    layers = list(getattr(tr, "layers", range(tr.q.shape[0])))
    print(f"# {args.trace}: tau {args.threshold}, blocks of {args.block_size}, last {args.last} queries, "
          f"{hkv} KV head(s) of {g} query heads")
    print("| layer | blocks | per-head ideal (mean) | largest head's ideal | union of the heads' ideal sets "
          "| greedy shared set |")
    print("|---|---|---|---|---|---|")
    total = {"blocks": 0, "max_head": 0, "union": 0, "greedy": 0}
    for li in tqdm(range(len(layers)), desc="layers"):
        rows = []
        for j in range(max(0, tr.q.shape[1] - args.last), tr.q.shape[1]):
            p = int(tr.positions[j])
            for kv in range(hkv):
                rows.append(shared_sets(tr.q[li, j, kv * g : (kv + 1) * g], tr.k[li, kv, : p + 1], tr.scale,
                                        block_size=args.block_size, tau=args.threshold))
        n = sum(r["blocks"] for r in rows)
        share = {key: sum(r[key] for r in rows) / n for key in ("mean_head", "max_head", "union", "greedy")}
        for key in total:
            total[key] += sum(r[key] for r in rows)
        print(f"| {layers[li]} | {n / len(rows):.0f} | {share['mean_head']:.1%} | {share['max_head']:.1%} | "
              f"{share['union']:.1%} | {share['greedy']:.1%} |", flush=True)
    n = total["blocks"]
    print(f"| all | | | {total['max_head'] / n:.1%} | {total['union'] / n:.1%} | {total['greedy'] / n:.1%} |")


if __name__ == "__main__":
    main()
