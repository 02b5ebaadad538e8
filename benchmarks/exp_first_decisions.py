"""How many decisions one request's groups need, by how the first chunk is sized (CPU, psa_ref), on bench_decode's
drawn profiles: which first chunk ends most groups at their first decision? The split-first-chunk design
(benchmarks/NOTES.md, sixtieth session) reads the first chunk the way top-k reads its blocks (every SM, no barrier)
and resumes the loop only for the groups that do not stop there, so its cost follows the share of groups that stop
at once.

For each request (a layer of bench_decode's fill, K drawn on the CPU with ``fill_skewed(..., xp=numpy)``): the plain
loop at ``--step``, the loop with ``first_chunk="predicted"`` or ``"estimated_stop"`` then ``--step``, and each
group's own first chunk of ``--margins`` x where ema holds on the estimated masses, all ``stop="ema"`` on
``cuboid_mean`` with no forced blocks, as bench_decode's rows; per group the decisions (iterations), the blocks
attended and the predicted chunk. Prints, per profile, the mean and the share of groups stopping at the first
decision, the blocks attended against the plain loop's, and how many more blocks than its request's mean the busiest
group attends (a request's step waits for it).

    python benchmarks/exp_first_decisions.py --profile sparsity --share 0.05 --tokens 32768 --step 384
    python benchmarks/exp_first_decisions.py --profile per-head --tokens 32768 --step 384

``--fluid`` adds a model of one request's streaming (sixty-eighth session, H100): each group's blocks attended (K
and V) on its CTAs, every CTA at most ``--cta-gbs`` (the loop's rate a CTA, s68f) and HBM's ``--ceiling-gbs`` shared
evenly by the CTAs still streaming (s68h: the loop reaches 83% of the copy ceiling on 64 CTAs). It prints the µs until
the last group is done with a cluster of 8 CTAs a group, the grid build's ``SMs // groups`` a group, and the SMs
shared out by the groups' blocks.
"""

from __future__ import annotations

import argparse

import numpy as np


def profile_fill(profile: str, share: float, recent_blocks: int, shape):
    """``fill(cache, layer) -> q`` on the CPU for bench_decode's ``sparsity`` or ``per-head`` profile."""
    from bench_decode import sparsity_fill
    from psa_fast.synthetic import fill_skewed, trace_block_profiles

    if profile == "sparsity":
        return sparsity_fill(shape, share, recent_blocks, xp=np)
    offsets = trace_block_profiles(block_size=shape.s)
    return lambda cache, layer: fill_skewed(cache, layer, shape.hq, offsets, seed=layer, xp=np)


class _KeysAndValues:
    """``HostCache`` that keeps the values too (``--errors``)."""

    def __init__(self, base):
        self.base, self.values = base, {}
        for name in ("num_layers", "batch", "num_kv_heads", "head_dim", "block_size", "nmax", "capacity", "keys"):
            setattr(self, name, getattr(base, name))

    def prefill(self, layer, request, keys, values):
        self.base.prefill(layer, request, keys, values)
        self.values[layer, request] = values


def group_order(scores: np.ndarray, blocks) -> np.ndarray:
    """A shared group's processing order from its heads' estimates ``scores [G, N]`` (no forced blocks)."""
    from psa_ref.scoring import group_rank_key, processing_order

    return processing_order(group_rank_key(scores, blocks.block_lengths), np.zeros(0, np.int64))


def margin_runs(q, keys, values, blocks, *, step: int, tau: float, scale: float, margin: float) -> list:
    """Each group's own first chunk, ``margin`` x the blocks after which ema, run on the estimated masses, holds (the
    reference's estimated stop at another margin), attended by psa_ref on that group (KV head) alone: per group
    ``(first chunk, AttentionResult)``. ``q [Hq, D]``, ``keys`` / ``values [Hkv, T, D]``, ``blocks`` theirs."""
    import psa_ref
    from psa_ref.progressive import estimated_stop_first_chunk
    from psa_ref.scoring import estimate

    g = q.shape[0] // keys.shape[0]
    scores = estimate(q, blocks, scale)
    runs = []
    for kv in range(keys.shape[0]):
        s = scores[kv * g:(kv + 1) * g]
        f = estimated_stop_first_chunk(s, group_order(s, blocks), 0, blocks.block_lengths, tau, "ema", margin=margin)
        one = psa_ref.KVBlocks.from_dense(keys[kv:kv + 1], values[kv:kv + 1], block_size=16, metadata="cuboid_mean",
                                          kv_layout="HND")
        runs.append((f, psa_ref.attention(q[kv * g:(kv + 1) * g], one, tau, scale=scale, stop="ema", step=step,
                                          first_chunk=f)))
    return runs


def errors_and_topk(q, keys, values, *, step: int, tau: float, scale: float, margins=()) -> dict:
    """``--errors``: each schedule's mean relative output error against dense attention, and top-k's ``k`` (on the
    same estimates, bench_decode's ``equal_error_k``) at that error, for the plain loop, ``"estimated_stop"`` and
    each of ``margins`` (each group's own first chunk, attended by psa_ref on that group alone, as in
    ``group_decisions``; the outputs put together)."""
    import psa_ref
    from bench_decode import equal_error_k

    blocks = psa_ref.KVBlocks.from_dense(keys, values, block_size=16, metadata="cuboid_mean", kv_layout="HND")
    dense = psa_ref.dense_attention(q, keys, values, scale=scale, kv_layout="HND")

    def rel(out):
        return float(np.linalg.norm(out - dense) / np.linalg.norm(dense))

    def topk_err(k):
        return rel(psa_ref.topk_attention(q, blocks, k, scale=scale).output)

    def record(name, output, used):
        err = rel(output)
        out[f"{name}_err"] = np.array([err])
        out[f"{name}_topk_k"] = np.array([equal_error_k(topk_err, err, max(1, int(round(used))), blocks.num_blocks)])

    out = {}
    for name, first in (("plain", None), ("est", "estimated_stop")):
        res = psa_ref.attention(q, blocks, tau, scale=scale, stop="ema", step=step, first_chunk=first)
        record(name, res.output, float(np.mean(res.num_used)))
    for m in margins:
        runs = margin_runs(q, keys, values, blocks, step=step, tau=tau, scale=scale, margin=m)
        record(f"ema{m:g}", np.concatenate([r.output for _, r in runs]),
               float(np.mean([np.mean(r.num_used) for _, r in runs])))
    return out


def group_decisions(q, keys, *, step: int, tau: float, scale: float, margins=()) -> dict:
    """psa_ref's plain loop and its predicted first chunk on one request: per group (KV head) the iterations and the
    blocks attended of each, and the predicted first chunk's size; for each of ``margins`` the same with each group's
    first chunk ``margin`` x the blocks after which ema, run on the estimated masses, holds (``emaM_*``).
    ``q [Hq, D]``, ``keys [Hkv, T, D]``."""
    import psa_ref
    from psa_ref.progressive import predicted_first_chunk
    from psa_ref.scoring import estimate

    values = np.zeros_like(keys)  # the stop decisions read the keys only
    blocks = psa_ref.KVBlocks.from_dense(keys, values, block_size=16, metadata="cuboid_mean", kv_layout="HND")
    common = dict(scale=scale, stop="ema", step=step)
    plain = psa_ref.attention(q, blocks, tau, **common)
    pred = psa_ref.attention(q, blocks, tau, first_chunk="predicted", **common)
    est = psa_ref.attention(q, blocks, tau, first_chunk="estimated_stop", **common)  # the reference's, margin 1.25
    g = q.shape[0] // keys.shape[0]
    scores = estimate(q, blocks, scale)  # [Hq, N]
    heads = [scores[kv * g:(kv + 1) * g] for kv in range(keys.shape[0])]  # per group (KV head) its heads' estimates
    first = [predicted_first_chunk(s, group_order(s, blocks), 0, blocks.block_lengths, tau) for s in heads]
    out = dict(plain_it=np.asarray(plain.iterations), plain_used=np.asarray(plain.num_used),
               pred_it=np.asarray(pred.iterations), pred_used=np.asarray(pred.num_used), first=np.asarray(first),
               est_it=np.asarray(est.iterations), est_used=np.asarray(est.num_used), n=blocks.num_blocks)
    for m in margins:
        runs = margin_runs(q, keys, values, blocks, step=step, tau=tau, scale=scale, margin=m)
        out[f"ema{m:g}_it"] = np.asarray([int(np.asarray(r.iterations).ravel()[0]) for _, r in runs])
        out[f"ema{m:g}_used"] = np.asarray([int(np.asarray(r.num_used).ravel()[0]) for _, r in runs])
        out[f"ema{m:g}_first"] = np.asarray([f for f, _ in runs])
    return out


def fluid_stream_us(group_bytes, ctas, cta_gbs: float, ceiling_gbs: float) -> float:
    """µs until every group has streamed its ``group_bytes``, group g on ``ctas[g]`` CTAs, each CTA at
    ``min(cta_gbs, ceiling_gbs / CTAs still streaming)`` GB/s: HBM shared evenly, a CTA capped at its own rate. A group
    with bytes needs at least one CTA (a ValueError otherwise)."""
    left = np.asarray(group_bytes, dtype=np.float64).copy()
    c = np.asarray(ctas, dtype=np.float64)
    if left.shape != c.shape or (left < 0).any() or ((left > 0) & (c < 1)).any():
        raise ValueError("group_bytes and ctas: one entry a group, bytes >= 0, a CTA or more where bytes > 0")
    t = 0.0
    active = left > 0
    while active.any():
        per_cta = min(cta_gbs, ceiling_gbs / c[active].sum()) * 1e3  # bytes a µs
        rate = np.where(active, per_cta * c, 0.0)
        g = int(np.argmin(np.where(active, left / np.maximum(rate, 1e-30), np.inf)))  # the next group done
        dt = left[g] / rate[g]
        left = np.where(active, left - rate * dt, 0.0)
        left[g] = 0.0
        active = left > 1e-9 * max(1.0, float(np.asarray(group_bytes).max()))
        t += dt
    return t


def fluid_lines(rows: list[dict], *, block_bytes: int, sms: int, cta_gbs: float, ceiling_gbs: float) -> str:
    """One line a schedule (the plain loop, the estimated stop): the mean over requests of ``fluid_stream_us`` with a
    cluster of 8 CTAs a group, the grid build's ``sms // groups`` a group, and ``sms`` shared out by blocks as
    ``speculate="first_chunk"`` shares its pieces (``_kernels.spec_ranked_pieces``: one a group, the other
    ``sms - groups`` by blocks, at most ``SPEC_PIECES_MAX`` a group)."""
    from psa_fast import _kernels

    lines = [f"  fluid model (a CTA <= {cta_gbs:g} GB/s, HBM {ceiling_gbs:g} GB/s shared, {sms} SMs): µs streaming"]
    for key, label in (("plain_used", "plain loop"), ("est_used", 'first_chunk="estimated_stop"')):
        got = {"clusters of 8": [], "grid": [], "shared out by blocks": []}
        for r in rows:
            used = np.asarray(r[key])
            groups = used.size
            got["clusters of 8"].append(fluid_stream_us(used * block_bytes, np.full(groups, 8), cta_gbs,
                                                        ceiling_gbs))
            got["grid"].append(fluid_stream_us(used * block_bytes, np.full(groups, max(1, sms // groups)), cta_gbs,
                                               ceiling_gbs))
            shared = _kernels.spec_ranked_pieces(used, max(0, sms - groups), _kernels.SPEC_PIECES_MAX)
            got["shared out by blocks"].append(fluid_stream_us(used * block_bytes, shared, cta_gbs, ceiling_gbs))
        lines.append(f"    {label:<28} " + ", ".join(f"{k} {np.mean(v):.1f}" for k, v in got.items()))
    return "\n".join(lines)


def summary(rows: list[dict]) -> str:
    """The groups pooled over requests: one line per schedule (first chunk, decisions, blocks attended)."""
    cat = {k: np.concatenate([r[k] for r in rows]) for k in rows[0] if k != "n"}
    n = rows[0]["n"]

    def line(label, it, used, first=None):
        head = f"  {label:<28}" + (f" first chunk {first.mean() / n:6.1%}," if first is not None else " " * 21)
        return (f"{head} decisions {it.mean():.2f} (one: {(it == 1).mean():4.0%}, max {it.max()}), attends "
                f"{used.mean() / n:.1%}")

    def busiest(key):  # a request's step waits for its busiest group: its blocks over the request's mean, averaged
        return np.mean([r[key].max() / max(r[key].mean(), 1e-9) for r in rows])

    lines = [f"groups {cat['plain_it'].size}:", line("plain loop", cat["plain_it"], cat["plain_used"]),
             line("predicted first chunk", cat["pred_it"], cat["pred_used"], cat["first"]),
             line('first_chunk="estimated_stop"', cat["est_it"], cat["est_used"])]
    lines += [line(f"ema on estimates x {k[3:-3]}", cat[k], cat[k[:-3] + "_used"], cat[k[:-3] + "_first"])
              for k in cat if k.startswith("ema") and k.endswith("_it")]
    lines.append(f"  busiest group's blocks over its request's mean: plain loop {busiest('plain_used'):.2f}, "
                 f"estimated_stop {busiest('est_used'):.2f}")
    named = [("plain", "plain loop"), ("est", 'first_chunk="estimated_stop"')]
    named += [(k[:-4], f"ema on estimates x {k[3:-4]}") for k in cat if k.startswith("ema") and k.endswith("_err")]
    for name, label in named:
        if f"{name}_err" in cat:
            used = cat[f"{name}_used"].mean()
            k = cat[f"{name}_topk_k"].mean()
            lines.append(f"  {label:<28} error {cat[f'{name}_err'].mean():.4f}; top-k at that error reads "
                         f"{k / n:.1%} ({k / used:.2f}x the blocks)")
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", choices=("sparsity", "per-head"), default="sparsity")
    ap.add_argument("--share", type=float, default=0.05, help="--profile sparsity: the ideal tau 0.95 share")
    ap.add_argument("--recent-blocks", type=int, default=2)
    ap.add_argument("--shape", default="llama8b")
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--requests", type=int, default=4, help="requests (bench_decode's layers), each drawn anew")
    ap.add_argument("--step", type=int, default=384, help="the loop's step (bench_decode's auto pick at 32K, B = 1)")
    ap.add_argument("--tau", type=float, default=0.95)
    ap.add_argument("--margins", default="1.0,1.25,1.5", help="margins on ema run on the estimates ('' for none)")
    ap.add_argument("--errors", action="store_true",
                    help="also each schedule's output error against dense, and top-k's k at that error")
    ap.add_argument("--fluid", action="store_true", help="also the fluid model of one request's streaming (above)")
    ap.add_argument("--sms", type=int, default=132, help="--fluid: the GPU's SMs (H100 SXM: 132)")
    ap.add_argument("--cta-gbs", type=float, default=48.0, help="--fluid: a loop CTA's rate, GB/s (H100, s68)")
    ap.add_argument("--ceiling-gbs", type=float, default=2500.0,
                    help="--fluid: HBM shared by the CTAs, GB/s (H100: the loop's 83%% of ~3,040, s68h)")
    args = ap.parse_args(argv)
    margins = [float(x) for x in args.margins.split(",") if x.strip()]
    if args.requests < 1 or args.step < 1 or args.tokens < 16:
        ap.error("--requests and --step must be >= 1, --tokens >= 16")
    if args.sms < 1 or not args.cta_gbs > 0 or not args.ceiling_gbs > 0:
        ap.error("--sms must be >= 1, --cta-gbs and --ceiling-gbs > 0")

    from bench_decode import SHAPES
    from psa_fast.synthetic import HostCache

    shape = SHAPES[args.shape]
    cache = HostCache(batch=1, num_kv_heads=shape.hkv, head_dim=shape.d, max_tokens=args.tokens,
                      block_size=shape.s, num_layers=args.requests)
    if args.errors:
        cache = _KeysAndValues(cache)
    fill = profile_fill(args.profile, args.share, args.recent_blocks, shape)
    rows = []
    for layer in range(args.requests):
        q = fill(cache, layer)[0].astype(np.float64)
        keys = cache.keys[layer, 0].astype(np.float64)
        rows.append(group_decisions(q, keys, step=args.step, tau=args.tau, scale=shape.logit_scale, margins=margins))
        if args.errors:
            rows[-1].update(errors_and_topk(q, keys, cache.values[layer, 0].astype(np.float64), step=args.step,
                                            tau=args.tau, scale=shape.logit_scale, margins=margins))
        print(f"request {layer}, {summary(rows[-1:])}", flush=True)
    label = f"{args.profile}" + (f" {args.share:g}" if args.profile == "sparsity" else "")
    print(f"# {label}, {args.shape}, T {args.tokens}, step {args.step}, tau {args.tau}, all requests' {summary(rows)}")
    if args.fluid:
        print(fluid_lines(rows, block_bytes=2 * shape.s * shape.d * 2, sms=args.sms, cta_gbs=args.cta_gbs,
                          ceiling_gbs=args.ceiling_gbs))


if __name__ == "__main__":
    main()
