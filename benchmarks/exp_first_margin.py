"""Would a margin on the predicted first chunk end more groups at the first decision (CPU, psa_ref)?

``first_chunk="predicted"`` sizes the first ranked chunk from the estimates (the fewest blocks whose estimated mass
reaches tau); the verifier then decides, and where it does not stop the loop reads a further ``step`` blocks and
decides again. On the GPU every such decision is a barrier of the group (~5 µs of the largest group at Gemma 3's
32K, B = 8, benchmarks/NOTES.md, s46), and the slowest group of a batch sets the step's time. This runs psa_ref over
a captured layer's decode queries with the predicted chunk times each margin (rounded up, at most the ranked blocks
there are; the GPU's switch for it, measured without a gain in s48, is on branch wip/first-in-suffix) and prints per
margin: the mean iterations (the forced blocks' chunk counts as one), the mean blocks read, over batches of
``--batch`` consecutive queries (as bench_decode ``--spread`` replays them) the slowest group's iterations and the
largest group's reads, and the mean relative error of the output against dense attention.

    python benchmarks/exp_first_margin.py --kv .gl/gemma3_xml_l5_32k.npz --step 128 --margins 1,1.05,1.1,1.2
    python benchmarks/exp_first_margin.py --kv .gl/gemma3_xml_l5_32k.npz --step 128 --margins 1 --predict-at 0.96,0.97

``--predict-at`` adds the other way to a margin: the chunk predicted to hold a higher tau of the estimated mass.

One selection group a query (a trace of one KV head, shared selection); the margin is not an option of
``psa_ref.attention``: this script wraps ``psa_ref.progressive.first_chunk_size`` for its runs.
"""

from __future__ import annotations

import argparse
import math

import numpy as np


def margin_rows(trace, *, margins, step: int, batch: int, rank: str = "share", threshold: float = 0.95,
                sink_blocks: int = 1, recent_blocks: int = 2, layer: int = 0, predict_at=()) -> list[dict]:
    """One dict per margin, then one per ``predict_at`` tau (margin 1, the chunk predicted to hold that tau of the
    estimated mass while the verifier stops at ``threshold``): ``margin``, ``predict_at``, ``iterations``, ``read``
    (means over the trace's queries), ``batch_iterations`` (the mean over batches of the slowest group's iterations),
    ``batch_read_max`` (of the largest group's reads), ``error`` (mean relative error against dense)."""
    import psa_ref
    from psa_ref import progressive

    k, v = trace.k[layer].astype(np.float32), trace.v[layer].astype(np.float32)
    if k.shape[0] != 1:
        raise ValueError(f"one KV head a layer expected (one selection group a query), got {k.shape[0]}")
    blocks = psa_ref.KVBlocks.from_dense(k, v, block_size=16, metadata="quant3")
    n = blocks.num_blocks
    queries = [trace.q[layer, i].astype(np.float32) for i in range(trace.q.shape[1])]
    dense = [psa_ref.dense_attention(q, k, v, scale=trace.scale) for q in queries]
    original = progressive.first_chunk_size
    rows = []
    try:
        for margin, tau in [(m, threshold) for m in margins] + [(1.0, t) for t in predict_at]:
            def sized(first_chunk, scores, order, num_forced, lengths, thr, stop, m=margin, tau=tau):
                r = original(first_chunk, scores, order, num_forced, lengths, tau, stop)
                return min(order.size - num_forced, math.ceil(m * r)) if r else 0

            progressive.first_chunk_size = sized
            its, used, errs = [], [], []
            for q, want in zip(queries, dense):
                res = psa_ref.attention(q, blocks, threshold, scale=trace.scale, step=step, sink_blocks=sink_blocks,
                                        recent_blocks=recent_blocks, first_chunk="predicted", rank=rank)
                its.append(int(res.iterations[0]))
                used.append(len(res.blocks_used[0]) / n)
                errs.append(float(np.linalg.norm(res.output - want) / np.linalg.norm(want)))
            its_a, used_a = np.array(its), np.array(used)
            nb = len(its) // batch
            rows.append(dict(margin=margin, predict_at=tau, iterations=its_a.mean(), read=used_a.mean(),
                             batch_iterations=its_a[:nb * batch].reshape(nb, batch).max(1).mean(),
                             batch_read_max=used_a[:nb * batch].reshape(nb, batch).max(1).mean(),
                             error=float(np.mean(errs)), queries=len(its), batches=nb))
    finally:
        progressive.first_chunk_size = original
    return rows


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kv", required=True, help="a captured layer (.npz, bench_decode's --kv files)")
    ap.add_argument("--step", type=int, default=128, help="blocks a chunk after the predicted one")
    ap.add_argument("--margins", default="1,1.05,1.1,1.2,1.3", help="comma-separated, each >= 1")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--rank", default="share", choices=("share", "estimate"))
    ap.add_argument("--predict-at", default="", help="taus to predict the first chunk for instead (margin 1), each "
                                                       "in (0.95, 1): comma-separated")
    args = ap.parse_args(argv)
    margins = [float(m) for m in args.margins.split(",")]
    if any(m < 1 for m in margins):
        ap.error(f"--margins are each >= 1, got {args.margins!r}")
    predict_at = [float(t) for t in args.predict_at.split(",") if t]
    if any(not 0.95 < t < 1 for t in predict_at):
        ap.error(f"--predict-at taus lie in (0.95, 1), got {args.predict_at!r}")
    if args.batch < 1 or args.step < 1:
        ap.error("--batch and --step are >= 1")
    from psa_ref.trace import load_trace

    trace = load_trace(args.kv)
    print(f"| margin | predicted for tau | iterations | read | B = {args.batch}: slowest group's iterations | "
          "largest read | error |")
    print("|---|---|---|---|---|---|---|")
    for r in margin_rows(trace, margins=margins, step=args.step, batch=args.batch, rank=args.rank,
                         predict_at=predict_at):
        print(f"| {r['margin']:g} | {r['predict_at']:g} | {r['iterations']:.2f} | {r['read']:.1%} | "
              f"{r['batch_iterations']:.2f} | {r['batch_read_max']:.1%} | {r['error']:.4f} |", flush=True)


if __name__ == "__main__":
    main()
