"""How well each block summary ranks bench_decode's sparsity profiles (CPU, psa_ref): the share of blocks PSA must
read is bounded below by the order it reads them in, whatever the schedule. Issue 14 asks for 5x SDPA at 128K with
~4% of the blocks read; on cuboid_mean the plain loop reads 12.5% of the 2% profile and even step 128 reads 6.6%
(benchmarks/NOTES.md, seventy-second session). Is that the schedule, the stop rule, or the estimates' order?

For each request (a layer of bench_decode's fill, drawn on the CPU) and each ``--metadata``, per group (KV head,
shared GQA): the group's processing order by its heads' estimates (``psa_ref.scoring``), then

* ``order``: the fewest blocks of that order after which every head of the group holds ``tau`` of its true mass
  (the exact block masses, from the keys): what an oracle stop rule would read along that order;
* each rule of ``--stops`` meant for that metadata: what ``psa_ref.attention(stop=..., step=--step)`` reads (the
  stop rule on top of the order), and the least share of its true mass a head of the group attends then;
* ``true``: the same oracle prefix along the order of the group's true masses (each head's normalised mass, the
  group's maximum): what a perfect summary would allow.

Prints the mean share of blocks over groups and requests, and the busiest group's (a request's step waits for it).

    python benchmarks/exp_metadata_rank.py --share 0.02 --tokens 32768
    python benchmarks/exp_metadata_rank.py --share 0.05 --metadata cuboid_mean,minmax --step 16
"""

from __future__ import annotations

import argparse
import warnings

import numpy as np


def block_log_masses(q: np.ndarray, keys: np.ndarray, scale: float, block_size: int) -> np.ndarray:
    """Each query head's log mass of every block, ``log sum_t exp(scale q . k_t)`` over the block's tokens:
    ``q [Hq, D]``, ``keys [Hkv, T, D]`` (query head h reads KV head h // (Hq / Hkv)) -> ``[Hq, N]``, the last block
    possibly partial."""
    hq, hkv, t = q.shape[0], keys.shape[0], keys.shape[1]
    g = hq // hkv
    n = -(-t // block_size)
    out = np.empty((hq, n))
    for kv in range(hkv):
        logits = scale * q[kv * g:(kv + 1) * g] @ keys[kv].T  # [G, T]
        padded = np.full((g, n * block_size), -np.inf)
        padded[:, :t] = logits
        blocks = padded.reshape(g, n, block_size)
        top = blocks.max(axis=-1)
        out[kv * g:(kv + 1) * g] = top + np.log(np.exp(blocks - top[..., None]).sum(axis=-1))
    return out


def oracle_prefix(order: np.ndarray, log_mass: np.ndarray, tau: float) -> int:
    """The fewest leading blocks of ``order`` after which every head (rows of ``log_mass [G, N]``) has attended at
    least ``tau`` of its total mass."""
    w = np.exp(log_mass - log_mass.max(axis=1, keepdims=True))
    share = np.cumsum(w[:, order], axis=1) / w.sum(axis=1, keepdims=True)
    held = (share >= tau).all(axis=0)
    return int(np.argmax(held)) + 1


def true_order(log_mass: np.ndarray) -> np.ndarray:
    """The blocks by the group's largest normalised true mass, heaviest first (ties by lower index)."""
    norm = log_mass - np.logaddexp.reduce(log_mass, axis=1, keepdims=True)
    return np.argsort(-norm.max(axis=0), kind="stable")


def attended_mass(order: np.ndarray, used: int, log_mass: np.ndarray) -> float:
    """The least share of its true mass that a head of the group (rows of ``log_mass [G, N]``) attends in the first
    ``used`` blocks of ``order``."""
    w = np.exp(log_mass - log_mass.max(axis=1, keepdims=True))
    return float((w[:, order[:used]].sum(axis=1) / w.sum(axis=1)).min())


def request_shares(q, keys, *, scale: float, tau: float, step: int, metadata: list[str], stops: dict,
                   block_size: int) -> tuple[dict, dict]:
    """Per metadata: the ``order`` share of each group and, for each of ``stops[metadata]``, what that rule reads; and
    ``true`` (one per group). Returns ``(shares, least attended mass)`` keyed alike (``order`` and ``true`` hold
    ``tau`` by construction)."""
    import psa_ref
    from psa_ref.scoring import estimate, group_rank_key, processing_order

    hkv = keys.shape[0]
    g = q.shape[0] // hkv
    log_mass = block_log_masses(q, keys, scale, block_size)
    n = log_mass.shape[1]
    out = {"true": np.array([oracle_prefix(true_order(log_mass[kv * g:(kv + 1) * g]), log_mass[kv * g:(kv + 1) * g],
                                           tau) for kv in range(hkv)]) / n}
    mass = {}
    values = np.zeros_like(keys)  # (the stop decisions read the keys only)
    for kind in metadata:
        blocks = psa_ref.KVBlocks.from_dense(keys, values, block_size=block_size, metadata=kind, kv_layout="HND")
        est = estimate(q, blocks, scale)
        orders = [processing_order(group_rank_key(est[kv * g:(kv + 1) * g], blocks.block_lengths),
                                   np.zeros(0, np.int64)) for kv in range(hkv)]
        out[f"{kind} order"] = np.array([oracle_prefix(o, log_mass[kv * g:(kv + 1) * g], tau)
                                         for kv, o in enumerate(orders)]) / n
        for stop in stops[kind]:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", psa_ref.SketchMetadataWarning)
                run = psa_ref.attention(q, blocks, tau, scale=scale, stop=stop, step=step)
            used = np.asarray(run.num_used).ravel()
            out[f"{kind} {stop}"] = used / n
            mass[f"{kind} {stop}"] = np.array([attended_mass(o, int(u), log_mass[kv * g:(kv + 1) * g])
                                               for kv, (o, u) in enumerate(zip(orders, used))])
    return out, mass


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--share", type=float, default=0.02, help="the sparsity profile's ideal tau 0.95 share")
    ap.add_argument("--recent-blocks", type=int, default=2)
    ap.add_argument("--shape", default="llama8b")
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--requests", type=int, default=2, help="requests (bench_decode's layers), each drawn anew")
    ap.add_argument("--step", type=int, default=16, help="the ema rows' step")
    ap.add_argument("--tau", type=float, default=0.95)
    ap.add_argument("--metadata", default="cuboid_mean,mean,minmax,quant3")
    ap.add_argument("--stops", default="ema,remaining,certified,sketch_avg",
                    help="stop rules, each on the metadata it is meant for (certified: minmax; the sketch rules: "
                         "quant3; ema and remaining: every kind)")
    args = ap.parse_args(argv)
    import psa_ref

    metadata = [m.strip() for m in args.metadata.split(",") if m.strip()]
    unknown = sorted(set(metadata) - set(psa_ref.METADATA_KINDS))
    if unknown or not metadata:
        ap.error(f"--metadata: each of {', '.join(psa_ref.METADATA_KINDS)}, got {args.metadata!r}")
    rules = [r.strip() for r in args.stops.split(",") if r.strip()]
    if not rules or set(rules) - set(psa_ref.STOP_RULES):
        ap.error(f"--stops: each of {', '.join(psa_ref.STOP_RULES)}, got {args.stops!r}")
    meant = {"certified": ("minmax",), "sketch": ("quant3", "cuboid_mean"), "sketch_avg": ("quant3",)}
    stops = {kind: [r for r in rules if kind in meant.get(r, (kind,))] for kind in metadata}
    if args.requests < 1 or args.step < 1 or args.tokens < 16 or not 0 < args.tau < 1:
        ap.error("--requests and --step must be >= 1, --tokens >= 16, 0 < --tau < 1")

    from bench_decode import SHAPES, sparsity_fill
    from psa_fast.synthetic import HostCache

    shape = SHAPES[args.shape]
    cache = HostCache(batch=1, num_kv_heads=shape.hkv, head_dim=shape.d, max_tokens=args.tokens,
                      block_size=shape.s, num_layers=args.requests)
    fill = sparsity_fill(shape, args.share, args.recent_blocks, xp=np)
    rows: dict[str, list] = {}
    held: dict[str, list] = {}
    for layer in range(args.requests):
        q = fill(cache, layer)[0].astype(np.float64)
        keys = cache.keys[layer, 0].astype(np.float64)
        got, mass = request_shares(q, keys, scale=shape.logit_scale, tau=args.tau, step=args.step,
                                   metadata=metadata, stops=stops, block_size=shape.s)
        for name, shares in got.items():
            rows.setdefault(name, []).append(shares)
        for name, least in mass.items():
            held.setdefault(name, []).append(least)
        print(f"request {layer}: " + ", ".join(f"{k} {100 * v.mean():.1f}%" for k, v in got.items()), flush=True)
    print(f"\n# sparsity {args.share:g} (profile's ideal {100 * fill.profile_share:.1f}%), {args.shape}, "
          f"T {args.tokens}, tau {args.tau}, the rules at step {args.step}, {args.requests} requests\n")
    print("| blocks read by | mean over groups | busiest group | busiest ÷ mean | least true mass a head attends "
          "(mean / worst group) |\n|---|---|---|---|---|")
    for name, shares in rows.items():
        s = np.concatenate(shares)
        least = f"{np.concatenate(held[name]).mean():.3f} / {np.concatenate(held[name]).min():.3f}" \
            if name in held else f">= {args.tau:g} (by construction)"
        print(f"| {name} | {100 * s.mean():.1f}% | {100 * s.max():.1f}% | {s.max() / s.mean():.2f} | {least} |")


if __name__ == "__main__":
    main()
