"""How long a head of the order would one request's loop need (CPU, psa_ref): for a design that orders the top M
blocks first and the rest beside the loop (benchmarks/NOTES.md, thirty-seventh session), how often the loop stops
within M when M is a multiple of the blocks the estimates predict for tau (``predicted_first_chunk``), and what share
of the blocks such a head is. Over a captured layer's decode queries (bench_decode's ``--kv`` files; a shipped trace
by default), with the rule's metadata and a few steps.

    python benchmarks/exp_order_head.py --kv .gl/gemma3_xml_l17_32k.npz --steps 128,320
"""

from __future__ import annotations

import argparse

import numpy as np


def head_rows(trace, *, metadata: str, stop: str, steps: list[int], multiples: list[float], threshold: float = 0.95,
              sink_blocks: int = 1, recent_blocks: int = 2, layer: int = 0) -> list[dict]:
    """One row per (step, multiple): the mean share of blocks the loop reads (and its 90th percentile), the predicted
    prefix's share (forced blocks included), the head's share M / n, and the share of queries whose loop stays
    within M. The first KV head's group of each query (shared GQA)."""
    import psa_ref
    from psa_ref.progressive import predicted_first_chunk
    from psa_ref.scoring import estimate, forced_blocks, group_rank_key, processing_order

    k = trace.k[layer].astype(np.float32)
    v = trace.v[layer].astype(np.float32)
    blocks = psa_ref.KVBlocks.from_dense(k, v, block_size=16, metadata=metadata)
    n, lengths = blocks.num_blocks, blocks.block_lengths
    forced = forced_blocks(n, sink_blocks, recent_blocks)
    hq_per_kv = trace.q.shape[2] // k.shape[0]
    rows = []
    for step in steps:
        used, pred = [], []
        for i in range(trace.q.shape[1]):
            q = trace.q[layer, i].astype(np.float32)
            res = psa_ref.attention(q, blocks, threshold, scale=trace.scale, stop=stop, step=step,
                                    sink_blocks=sink_blocks, recent_blocks=recent_blocks)
            used.append(len(res.blocks_used[0]))
            scores = estimate(q, blocks, trace.scale)[:hq_per_kv]
            order = processing_order(group_rank_key(scores, lengths), forced)
            pred.append(predicted_first_chunk(scores, order, len(forced), lengths, threshold))
        used_a, pred_a = np.array(used), np.array(pred)
        for m in multiples:
            head = np.minimum(n, len(forced) + np.ceil(m * pred_a))
            rows.append(dict(metadata=metadata, stop=stop, step=step, multiple=m, read=used_a.mean() / n,
                             read_p90=np.percentile(used_a, 90) / n, predicted=(len(forced) + pred_a).mean() / n,
                             head=head.mean() / n, within=float(np.mean(used_a <= head)), queries=len(used)))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kv", default=None, help="a trace .npz (default: the shipped one)")
    ap.add_argument("--steps", default="128,320")
    ap.add_argument("--multiples", default="1.5,2,3")
    ap.add_argument("--rules", default="cuboid_mean:ema,quant3:sketch_avg", help="metadata:stop, comma-separated")
    args = ap.parse_args()
    from psa_ref.trace import load_trace

    trace = load_trace(args.kv)
    print("| metadata | rule | step | M = forced + x predicted | loop reads (p90) | predicted | head M "
          "| loop within M |")
    print("|---|---|---|---|---|---|---|---|")
    for rule in args.rules.split(","):
        metadata, stop = rule.split(":")
        for r in head_rows(trace, metadata=metadata, stop=stop, steps=[int(s) for s in args.steps.split(",")],
                           multiples=[float(m) for m in args.multiples.split(",")]):
            print(f"| {r['metadata']} | {r['stop']} | {r['step']} | x{r['multiple']:g} | {r['read']:.1%} "
                  f"({r['read_p90']:.1%}) | {r['predicted']:.1%} | {r['head']:.1%} | {r['within']:.0%} of "
                  f"{r['queries']} |", flush=True)


if __name__ == "__main__":
    main()
