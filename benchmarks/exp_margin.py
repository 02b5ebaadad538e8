"""How far past the estimates' prediction the stop rule reads, on real attention (CPU, the shipped traces): the
margin ``DecodePlan(speculate=m)`` needs (issue 14).

    python benchmarks/exp_margin.py [--trace gemma3_8k] [--stop auto] [--step 16] [--every 4] [--rank share]

For every query of the trace and every selection group (shared per KV head, 1 sink + 1 recent block, as
``PSAConfig``'s defaults; ``quant3`` metadata, so ``stop="auto"`` is ``sketch_avg``), the reference's
``psa_ref.attention`` gives the ranked blocks attended ``A``, and ``predicted_first_chunk`` the ranked blocks the
estimates predict for tau ``P``. A speculation of margin ``m`` covers the group when the speculated positions
(forced + ``ceil(m P)`` + one step, as ``psa_spec_len``) reach the end of the chunk where the rule stops; it prints
the quantiles of ``A / P`` and, per margin, the share of groups covered and the blocks read over those attended.
"""

from __future__ import annotations

import argparse

import numpy as np

from psa_ref.scoring import RANKS


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", default="gemma3_8k")
    ap.add_argument("--stop", default="auto")
    ap.add_argument("--metadata", default="quant3")
    ap.add_argument("--step", type=int, default=16)
    ap.add_argument("--tau", type=float, default=0.95)
    ap.add_argument("--every", type=int, default=4, help="every k-th query position of the trace")
    ap.add_argument("--margins", default="0.75,1,1.25,1.5,2,3")
    ap.add_argument("--rank", default="estimate", choices=RANKS, help="psa_ref.attention's rank")
    args = ap.parse_args(argv)

    import psa_ref
    from psa_ref.progressive import predicted_first_chunk
    from psa_ref.scoring import forced_blocks, group_rank_key, processing_order
    from psa_ref.trace import load_trace
    from tqdm import tqdm

    tr = load_trace(args.trace)
    margins = [float(m) for m in args.margins.split(",")]
    rows = []  # (n, forced, A, P)
    jobs = [(li, pi) for li in range(len(tr.layers)) for pi in range(0, len(tr.positions), args.every)]
    for li, pi in tqdm(jobs, desc=f"{args.trace} queries"):
        t = int(tr.positions[pi]) + 1
        k = tr.k[li, :, :t].astype(np.float64)
        v = tr.v[li, :, :t].astype(np.float64)
        q = tr.q[li, pi].astype(np.float64)
        blocks = psa_ref.KVBlocks.from_dense(k, v, block_size=16, metadata=args.metadata, kv_layout="HND")
        n = blocks.num_blocks
        forced = forced_blocks(n, 1, 1)
        res = psa_ref.attention(q, blocks, args.tau, scale=tr.scale, stop=args.stop, step=args.step, gqa="shared",
                                sink_blocks=1, recent_blocks=1, rank=args.rank)
        est = psa_ref.estimate(q, blocks, tr.scale)
        g = q.shape[0] // k.shape[0]
        used = res.blocks_used if isinstance(res.blocks_used, list) else [res.blocks_used]
        for gi, u in enumerate(used):
            heads = est[gi * g : (gi + 1) * g]
            order = processing_order(group_rank_key(heads, blocks.block_lengths, args.rank), forced)
            p = predicted_first_chunk(heads, order, forced.size, blocks.block_lengths, args.tau)
            rows.append((n, forced.size, len(u) - forced.size, p))
    r = np.array(rows, dtype=np.float64)
    n, f, a, p = r.T
    ratio = a / np.maximum(p, 1)
    print(f"\n{args.trace}, stop={args.stop}, metadata={args.metadata}, rank={args.rank}, tau {args.tau}, "
          f"step {args.step}: "
          f"{len(r)} groups; attended {np.mean((a + f) / n):.1%} of the blocks, predicted {np.mean((p + f) / n):.1%}")
    qs = np.quantile(ratio, [0.1, 0.5, 0.9, 0.99])
    print("A / P quantiles 10/50/90/99%: " + " / ".join(f"{x:.2f}" for x in qs))
    print("\n| margin | groups covered | blocks read ÷ attended |\n|---|---|---|")
    for m in margins:
        covered, read = coverage(n, f, a, p, m, args.step)
        print(f"| {m:g} | {covered:.1%} | {read:.2f} |")


def coverage(n, f, a, p, margin: float, step: int) -> tuple[float, float]:
    """For groups of ``n`` blocks, ``f`` forced, ``a`` ranked attended and ``p`` ranked predicted (arrays): the
    share of groups whose stop chunk a speculation of ``margin`` covers (speculated positions ``f + ceil(m p) +
    step``, as ``psa_spec_len``, reaching the end of the chunk where the rule stopped), and the blocks read (whole
    speculated chunks, or the attended ones where the loop resumed) over the blocks attended."""
    n, f, a, p = (np.asarray(x, dtype=np.float64) for x in (n, f, a, p))
    spec = np.minimum(n, f + np.ceil(margin * p) + step)
    stop_end = np.minimum(n, f + np.ceil(a / step) * step)  # the end of the chunk where the rule stopped
    spec_end = np.minimum(n, f + np.ceil((spec - f) / step) * step)  # speculated chunks are read whole
    read = np.maximum(spec_end, f + a)
    return float(np.mean(spec >= stop_end)), float(np.mean(read) / np.mean(f + a))

if __name__ == "__main__":
    main()
