"""The predicted first chunk on bench_decode's per-head profile, batch by batch (CPU, psa_ref).

At a batch the busiest selection group sets the step's time (issue 14's per-head target: B = 8 was 2-4% slower
than top-k at equal error, benchmarks/NOTES.md s33). ``first_chunk="predicted"`` sizes each group's first ranked
chunk from its own estimates, so a heavy group takes one long chunk where a fixed step makes it iterate. This fills
Llama-3.1-8B-shaped KV (Hq 32, Hkv 8, D 128, blocks of 16) as ``bench_decode.py --profile per-head`` does
(``psa_fast.synthetic.fill_skewed`` on the CPU), runs psa_ref on every request at each step alone and after a
predicted chunk, and prints per schedule: the decisions (mean, and the busiest group's over the batch), the blocks
read (mean, largest) and the output error against dense.

    python benchmarks/exp_predicted_profile.py --tokens 32768 --batch 8 --gqa per_head --steps 32,80
    python benchmarks/exp_predicted_profile.py --tokens 32768 --batch 8 --gqa shared --steps 160 --rule cuboid_mean:ema

``--residual`` prints instead what the prediction leaves (the predicted chunk, then steps of one block; as
``exp_first_chunk.py --residual`` on a captured trace): the share of the blocks each group still needs past it.

About 5 s a request at 32K on two cores. ``--steps auto`` takes the GPU plan's steps (``_kernels.pick_step`` with
the H200's SM and cluster counts): the plain loop's and the one after a predicted chunk.
"""

from __future__ import annotations

import argparse

import numpy as np

HQ, HKV, D, S = 32, 8, 128, 16  # Llama-3.1-8B's attention shape, blocks of 16


H200_SMS = 132
H200_COPY_GBS = 4300.0  # the H200's copy ceiling, as pick_step took it before it asked the card


def h200_active_clusters(cluster: int) -> int:
    """Clusters of ``cluster`` CTAs the H200 holds at once, as measured there (16: 7; 8: 16)."""
    return {16: 7, 8: 16}.get(cluster, H200_SMS // cluster)


def plan_steps(batch: int, gqa: str, nmax: int) -> list[int]:
    """The GPU plan's ``step="auto"`` on the H200 for this shape: plain, and after a predicted chunk (sketch rules).
    The plan's GPU queries are answered with the H200's values for the call, then restored."""
    from psa_fast import _kernels

    saved = _kernels.num_sms, _kernels.max_active_clusters
    _kernels.num_sms, _kernels.max_active_clusters = (lambda: H200_SMS), h200_active_clusters
    try:
        groups = HQ if gqa == "per_head" else HKV
        cluster = _kernels.pick_cluster(batch * groups)
        shape = dict(cluster=cluster, warps=8, block_bytes=2 * S * D * 2, pairs=True)
        return [_kernels.pick_step(batch, groups, nmax, **shape, predicted=p, ceiling_gbs=H200_COPY_GBS)
                for p in (False, True)]
    finally:
        _kernels.num_sms, _kernels.max_active_clusters = saved


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--gqa", choices=("shared", "per_head"), default="per_head")
    ap.add_argument("--steps", default="auto", help="comma-separated, or 'auto' (the GPU plan's two steps)")
    ap.add_argument("--rule", default="quant3:sketch_avg", help="metadata:stop")
    ap.add_argument("--tau", type=float, default=0.95)
    ap.add_argument("--residual", action="store_true", help="the blocks needed past the predicted first chunk")
    args = ap.parse_args(argv)

    import psa_ref
    from psa_ref import sweep
    from psa_fast.synthetic import HostCache, fill_skewed, trace_block_profiles

    metadata, stop = args.rule.split(":")
    cache = HostCache(batch=args.batch, num_kv_heads=HKV, head_dim=D, max_tokens=args.tokens, block_size=S)
    q = fill_skewed(cache, 0, HQ, trace_block_profiles(block_size=S), seed=0, xp=np)
    steps = (plan_steps(args.batch, args.gqa, cache.nmax) if args.steps == "auto"
             else [int(x) for x in args.steps.split(",")])
    if args.residual:
        steps = [1]
    rows: dict[tuple, dict] = {}
    for r in range(args.batch):
        keys = cache.keys[0, r].astype(np.float64)
        values = np.random.default_rng(r).standard_normal(keys.shape)
        qr = q[r].astype(np.float64)
        blocks = psa_ref.KVBlocks.from_dense(keys, values, block_size=S, metadata=metadata, kv_layout="HND")
        dense = psa_ref.dense_attention(qr, keys, values)
        for step in steps:
            for first in (("predicted",) if args.residual else (None, "predicted")):
                res = sweep.attention(qr, blocks, args.tau, stop=stop, gqa=args.gqa, step=step, first_chunk=first)
                d = rows.setdefault((step, first), {"it": [], "read": [], "err": []})
                d["it"] += list(np.atleast_1d(res.iterations))
                d["read"] += [u.size / blocks.num_blocks for u in res.blocks_used]
                d["err"] += list(np.linalg.norm(res.output - dense, axis=1) / np.linalg.norm(dense, axis=1))
    print(f"per-head profile, Llama-3.1-8B shape, {args.tokens} tokens, B = {args.batch}, {stop} on {metadata}, "
          f"gqa {args.gqa}, tau {args.tau}")
    if args.residual:  # no forced blocks: each decision past the predicted chunk adds one block
        from exp_first_chunk import residual_table

        print("\n".join(residual_table((np.asarray(rows[1, "predicted"]["it"]) - 1) / cache.nmax)))
        return
    print("| step | first chunk | decisions mean | busiest group's | read mean | largest read | error mean |")
    print("|---|---|---|---|---|---|---|")
    for (step, first), d in rows.items():
        print(f"| {step} | {first or '-'} | {np.mean(d['it']):.2f} | {max(d['it'])} | {np.mean(d['read']):.1%} | "
              f"{max(d['read']):.1%} | {np.mean(d['err']):.4f} |")


if __name__ == "__main__":
    main()
