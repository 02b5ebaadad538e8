"""Stop-rule research: score candidate PSA stop rules on captured real attention.

The evidence behind ``stop="ema"`` (docs/accuracy.md). Each candidate rule is an
estimate of the mass of the blocks not yet seen, ``rest``; the loop stops at the first
boundary where ``AS_acc / (AS_acc + rest) >= tau``. For every decode step of every trace,
layer and query head the script computes the true per-block masses once (one global
maximum per head, :func:`psa_ref.analysis.block_sums`), walks them in estimate order, and
evaluates every rule at every prefix at once (cumulative sums), so hundreds of rules x
thresholds cost little more than one. The winner is then confirmed through
:func:`psa_ref.attention` itself (``--confirm``).

Reported per rule, threshold and setting (sink/recent blocks forced or not, per-head or
shared GQA selection):

* blocks attended (per selection group), and the ratio to the *ideal* adaptive budget
  (each query head's own heaviest blocks, known only to an oracle);
* the true attended mass: mean and 1st percentile over query heads;
* the output error ``||o - o_dense|| / ||o_dense||``: mean and 99th percentile;
* top-k on the same order at the same mean budget (interpolated between the two nearest
  ``k``), and the smallest ``k`` with the same mean error.

Traces come from ``examples/capture_trace.py`` (keep them out of the repository). The
evidence of docs/accuracy.md was made with::

    python examples/offline_texts.py /tmp/traces/texts
    L=0,3,6,9,12,15,18,21,24,27,29
    cap() { python examples/capture_trace.py --layers $L --positions 32 "$@"; }
    cap --offset 16384 --tokens 6144 --out /tmp/traces/pydoc_16k_6k.npz
    cap --text /tmp/traces/texts/gpl3.txt --offset 0 --tokens 6144 --out /tmp/traces/gpl3_6k.npz
    cap --text /tmp/traces/texts/stdlib_docstrings.txt --offset 4000 --tokens 6144 --out /tmp/traces/stdlib_6k.npz
    cap --text /tmp/traces/texts/gnutls_news.txt --offset 10000 --tokens 4096 --out /tmp/traces/gnutls_4k.npz
    cap --offset 70000 --tokens 4096 --out /tmp/traces/pydoc_70k_4k.npz
    cap --text /tmp/traces/texts/dbus_news.txt --offset 5000 --tokens 2048 --out /tmp/traces/dbus_2k.npz
    cap --offset 100000 --tokens 8192 --out /tmp/traces/pydoc_100k_8k.npz
    python examples/stop_rule_research.py /tmp/traces/*.npz --positions 16 \
        --settings 1/1/per_head,0/0/per_head,1/1/shared --detail ema,remaining,oracle_stop,window_mean16 \
        --confirm 10 --out /tmp/research.json          # about 4 minutes on 2 cores

Without trace arguments it runs on the trace shipped with the package (small, seconds).

Hidden heavy blocks (issue 4, goal 3). The setting string takes a fourth, research-only
metadata field (``1/1/per_head/quant2``): per-token key sketches (``quant{b}``, ``sparq{r}``),
outlier keys (``outlier{r}``) and a ball bound (``ball``), documented at
:func:`token_sketch`. The rules ``{base}&next{lam}`` add a share condition to a mass rule
(see :func:`rules`). The comparison of those orders and rules was made with::

    python examples/stop_rule_research.py /tmp/traces/*.npz --positions 16 \
        --settings 1/1/per_head,1/1/per_head/quant2,1/1/per_head/quant3,1/1/per_head/quant1,\
1/1/per_head/sparq8,1/1/per_head/outlier1,1/1/per_head/outlier2,1/1/per_head/ball \
        --detail "oracle_stop,ema,frontier16_b1&next0.001,frontier16_b1&next0.0007,est_raw&next0.001" \
        --out /tmp/research_sketch.json         # about 9 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from psa_ref import analysis
from psa_ref.trace import load_trace

TAUS = (0.9, 0.95, 0.99)


# --- one decode step, in estimate order ---------------------------------------------------------


def block_meta(keys: np.ndarray, block_size: int) -> dict[str, np.ndarray]:
    """Vectorised ``cuboid_mean`` + ``minmax`` + ``mean`` metadata of one head: each ``[N, D]``.

    The same formulas as :func:`psa_ref.blocks.block_metadata`; the script checks it against
    :class:`psa_ref.KVBlocks` on its first case.
    """
    t, d = keys.shape
    n = -(-t // block_size)
    pad = np.full((n * block_size, d), np.nan)
    pad[:t] = keys
    kb = pad.reshape(n, block_size, d)
    lo, hi = np.nanmin(kb, axis=1), np.nanmax(kb, axis=1)
    center = (lo + hi) / 2
    return {"lo": lo, "hi": hi, "center": center, "radius": np.nanmean(np.abs(kb - center[:, None]), axis=1),
            "mean": np.nanmean(kb, axis=1), "var": np.nanvar(kb, axis=1)}


def _logsumexp(x: np.ndarray, axis: int) -> np.ndarray:
    m = np.max(x, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    with np.errstate(divide="ignore"):
        return np.squeeze(m, axis) + np.log(np.exp(x - m).sum(axis))


# Research-only ranking metadata aimed at *hidden heavy blocks* (docs/accuracy.md: a block
# ranked 44th-106th by cuboid_mean holds 11-90% of a head's mass through one token whose logit
# is 10-25 nats above its block's median). Each returns per-token *approximate* logits
# ``[N, S, G]`` (``-inf`` on the padding of a partial last block); the block estimate is then
# their max or their log-mean-exp (the log of the block's mean token mass, so that
# ``n_j exp(s_j)`` is its predicted mass). Bytes per block below are for fp16 metadata,
# head dim 64, S = 16 (a block's K+V is 4096 B; ``cuboid_mean`` is 256 B).
#
# * ``quant{b}`` / ``quant{b}max``: every key quantised to ``b`` bits per channel on the block's
#   own per-channel ``[lo, hi]`` grid (the ``minmax`` metadata), reconstructed at bin centres:
#   ``256 + 128 b`` B per block (2 bits: 512 B, an eighth of the block's K). Also gives a
#   certified per-token bound: ``|k - k_hat| <= (hi - lo) / 2^(b+1)`` per channel.
# * ``sparq{r}``: SparQ-style, query-dependent: the ``r`` channels with the largest ``|q_i|``
#   read exactly from every key, the block mean for the others: ``128 + 32 r`` B read per block.
# * ``outlier{r}``: ``max(cuboid_mean, exact logits of the r keys farthest (L2) from the block
#   mean)``: ``256 + 128 r`` B per block.
# * ``ball``: ``q.mu + |q| max_t |k_t - mu|`` (a true upper bound): 130 B per block.


def token_sketch(keys: np.ndarray, q: np.ndarray, scale: float, block_size: int, kind: str):
    """Approximate logits ``[N, S, G]`` of every token from research metadata ``kind``
    (``quant{b}`` or ``sparq{r}``), and for ``quant`` the per-block slack ``[N, G]`` that makes
    ``approx + slack`` a certified upper bound on every logit of the block (else ``None``)."""
    t, d = keys.shape
    n = -(-t // block_size)
    pad = np.full((n * block_size, d), np.nan)
    pad[:t] = keys
    kb = pad.reshape(n, block_size, d)
    valid = ~np.isnan(kb[..., 0])
    kz = np.where(valid[..., None], kb, 0.0)
    if kind.startswith("quant"):
        levels = 2 ** int(kind[5:])
        lo, hi = np.nanmin(kb, axis=1), np.nanmax(kb, axis=1)
        span = hi - lo
        code = np.clip(np.floor((kz - lo[:, None]) / np.maximum(span, 1e-30)[:, None] * levels), 0, levels - 1)
        k_hat = lo[:, None] + (code + 0.5) / levels * span[:, None]
        approx = scale * np.einsum("nsd,gd->nsg", k_hat, q)
        slack = scale * (span / (2 * levels)) @ np.abs(q).T
    elif kind.startswith("sparq"):
        r = int(kind[5:])
        mu = np.nanmean(kb, axis=1)
        approx = np.empty((n, block_size, q.shape[0]))
        for h in range(q.shape[0]):
            ch = np.argsort(-np.abs(q[h]))[:r]
            rest = mu @ q[h] - mu[:, ch] @ q[h, ch]
            approx[:, :, h] = scale * (rest[:, None] + kz[:, :, ch] @ q[h, ch])
        slack = None
    else:
        raise ValueError(kind)
    return np.where(valid[..., None], approx, -np.inf), slack


@dataclass
class Case:
    """The query heads of one KV head at one decode step, blocks in processing order.

    Masses are relative to one global maximum logit per head (the rules are ratios, so any
    common reference gives the same fractions). ``[N, G]`` arrays are in processing order
    (column ``h`` in head ``h``'s own order for per-head selection).
    """

    mass: np.ndarray  # [N, G] block masses, exp(l - gmax) summed over the block
    length: np.ndarray  # [N, G] tokens per block
    est: np.ndarray  # [N, G] log-domain cuboid_mean estimate minus gmax
    ub: np.ndarray  # [N, G] min/max bound minus gmax
    out: np.ndarray  # [N, G, D] attention output after each prefix
    true: np.ndarray  # [N, G] true attended mass fraction after each prefix
    forced: int  # blocks in the first (forced) iteration
    ideal: dict  # tau -> ([G] ideal blocks, [G] ideal error)
    sample_rest: np.ndarray  # [N, G] sampled-token estimate of the unseen mass (see rule "sample")
    bmax: np.ndarray = None  # [N, G] the block's true max logit minus gmax (known once attended)
    ball: np.ndarray = None  # [N, G] ball bound q.mu + |q| max|k - mu|, minus gmax (gate rules)
    qub: np.ndarray = None  # [N, G] log of a certified bound on the block's mass (quant metadata only)


def make_case(q, keys, values, scale, block_size, *, sink, recent, shared, metadata="cuboid_mean",
              rng=None, sample_tokens=64):
    """Build a :class:`Case` for query heads ``q [G, D]`` over one KV head ``keys/values [T, D]``."""
    g = q.shape[0]
    mass, weighted = analysis.block_sums(q, keys, values, block_size, scale)  # [N, G], [N, G, D]
    n = mass.shape[0]
    logits = scale * keys @ q.T
    gmax = logits.max(axis=0)
    dense = weighted.sum(0) / mass.sum(0)[:, None]
    meta = block_meta(keys, block_size)
    ub = scale * np.maximum(q[:, None, :] * meta["hi"], q[:, None, :] * meta["lo"]).sum(-1).T  # [N, G]
    starts = np.arange(0, keys.shape[0], block_size)
    bmax = np.maximum.reduceat(logits, starts, axis=0)  # [N, G] true block max logit
    rmax = np.maximum.reduceat(np.linalg.norm(keys - np.repeat(meta["mean"], block_size, 0)[: keys.shape[0]], axis=1),
                               starts)
    ball = scale * (meta["mean"] @ q.T + rmax[:, None] * np.linalg.norm(q, axis=1)[None])
    qub = None
    if metadata == "cuboid_mean":
        est = scale * (meta["center"] @ q.T + meta["radius"] @ np.abs(q).T)
    elif metadata == "minmax":
        est = ub
    elif metadata == "mean":
        est = scale * meta["mean"] @ q.T
    elif metadata == "gaussian":
        # log of the mean token mass if the block's keys were Gaussian with diagonal covariance
        est = scale * meta["mean"] @ q.T + 0.5 * scale**2 * meta["var"] @ (q**2).T
    elif metadata.startswith(("quant", "sparq")):
        kind = metadata[:-3] if metadata.endswith("max") else metadata
        approx, slack = token_sketch(keys, q, scale, block_size, kind)  # [N, S, G]
        if slack is not None:
            qub = _logsumexp(approx, 1) + slack  # certified: log sum_t exp(approx_t + slack) >= log mass
        cnt = np.maximum(np.isfinite(approx).sum(1), 1)
        est = approx.max(axis=1) if metadata.endswith("max") else _logsumexp(approx, 1) - np.log(cnt)
    elif metadata.startswith("outlier"):
        r = int(metadata[7:])
        kb = np.full((n * block_size, keys.shape[1]), np.nan)
        kb[: keys.shape[0]] = keys
        kb = kb.reshape(n, block_size, -1)
        dist = np.nan_to_num(np.linalg.norm(kb - meta["mean"][:, None], axis=-1), nan=-1.0)  # [N, S]
        far = np.argsort(-dist, axis=1)[:, :r]  # the r keys farthest from the block mean
        tok = np.minimum(far + np.arange(n)[:, None] * block_size, keys.shape[0] - 1)
        est = np.maximum(scale * (meta["center"] @ q.T + meta["radius"] @ np.abs(q).T), logits[tok].max(axis=1))
    elif metadata == "ball":
        est = ball
    else:
        raise ValueError(metadata)
    lengths = np.full(n, block_size)
    lengths[-1] = keys.shape[0] - (n - 1) * block_size

    forced = list(range(min(sink, n))) + [j for j in range(max(n - recent, 0), n) if j >= sink]
    def order_of(score):
        ranked = np.argsort(-score, kind="stable")
        return np.concatenate([forced, ranked[~np.isin(ranked, forced)]]).astype(np.int64)
    if shared:
        order = np.repeat(order_of(est.max(axis=1))[:, None], g, axis=1)
    else:
        order = np.stack([order_of(est[:, h]) for h in range(g)], axis=1)
    heads = np.arange(g)
    outs, true = analysis.prefix_attention(mass, weighted, order)

    ideal = {}
    sorted_order = np.argsort(-mass, axis=0, kind="stable")
    ideal_outs, _ = analysis.prefix_attention(mass, weighted, sorted_order)
    for t in TAUS:
        k = analysis.blocks_for_mass(mass, t)
        ideal[t] = (k, analysis.relative_error(ideal_outs[k - 1, heads], dense))

    # "sample": exact logits of a fixed random sample of tokens; the unseen mass is the
    # sampled unseen tokens' mass scaled up to all unseen tokens.
    rng = rng or np.random.default_rng(0)
    pick = rng.choice(keys.shape[0], size=min(sample_tokens, keys.shape[0]), replace=False)
    w_pick = np.exp(logits[pick] - gmax)  # [k, G]
    blk_pick = pick // block_size
    sample_rest = np.empty((n, g))
    unseen_tokens = keys.shape[0] - np.cumsum(lengths[order], axis=0)  # [N, G]
    for h in range(g):
        pos = np.empty(n, dtype=np.int64)
        pos[order[:, h]] = np.arange(n)  # the prefix (0-based) after which each block is seen
        seen_at = pos[blk_pick]  # [k]
        cnt = pick.size - np.cumsum(np.bincount(seen_at, minlength=n))  # sampled tokens still unseen
        s = w_pick[:, h].sum() - np.cumsum(np.bincount(seen_at, weights=w_pick[:, h], minlength=n))
        sample_rest[:, h] = np.where(cnt > 0, np.maximum(s, 0) * unseen_tokens[:, h] / np.maximum(cnt, 1), 0.0)
    return Case(mass=mass[order, heads], length=lengths[order].astype(np.float64), est=est[order, heads] - gmax,
                ub=ub[order, heads] - gmax, out=analysis.relative_error(outs, dense), true=true,
                forced=len(forced), ideal=ideal, sample_rest=sample_rest, bmax=bmax[order, heads] - gmax,
                ball=ball[order, heads] - gmax, qub=None if qub is None else qub[order, heads] - gmax)


# --- candidate rules: each returns the unseen-mass estimate ``rest`` after every prefix ------------


def suffix_sum(x: np.ndarray) -> np.ndarray:
    """``[N, G]``: sum of ``x[i+1:]`` for every prefix ``i`` (0-based), without cancellation."""
    s = np.cumsum(x[::-1], axis=0)[::-1]
    return np.concatenate([s[1:], np.zeros_like(s[:1])], axis=0)


def window_sum(x: np.ndarray, w: int) -> np.ndarray:
    """Sum of the last ``w`` entries of every prefix (fewer at the start)."""
    c = np.cumsum(x, axis=0)
    return c - np.concatenate([np.zeros((w,) + x.shape[1:]), c[:-w]], axis=0)[: x.shape[0]]


def ema(x: np.ndarray, alpha: float) -> np.ndarray:
    """Exponential moving average along axis 0, ``e_i = (1 - alpha) e_(i-1) + alpha x_i``, ``e_0 = x_0``
    (vectorised as a weighted cumulative sum; fine in float64 for the N <= 512 blocks here)."""
    i = np.arange(x.shape[0])[:, None]
    decay = (1 - alpha) ** -i.astype(float)
    w = np.cumsum(alpha * x * decay, axis=0) / decay
    return w + (1 - alpha) ** (i + 1) * x[:1]  # the first entry counts with weight (1 - alpha)^i as the start value


def rules(c: Case) -> dict[str, np.ndarray]:
    """Every candidate rule's ``rest`` for this case: name -> ``[N, G]``.

    The families (``n`` blocks unseen, ``m`` block masses in processing order):

    * ``remaining``, ``seed``, ``certified``: the rules of psa_ref (the paper's listing);
    * ``remaining_ranked``: ``n * min m`` over ranked blocks only;
    * ``window_mean{w}``: ``n *`` the mean mass of the last ``w`` ranked blocks;
    * ``ema_mass{k}``: ``n *`` an exponential moving average (weight ``1/k``) of ranked masses;
    * ``ema_all{k}``: the same over every block in processing order, forced ones included
      (``ema`` = ``ema_all8`` is what psa_ref implements as ``stop="ema"``);
    * ``calib_all_b{beta}``, ``frontier{w}_b{beta}``, ``ema{k}_b{beta}``: metadata-predicted
      unseen mass ``sum_unseen n_j exp(beta * s_j)`` (``s_j`` the block's estimate) times the
      ratio of true to predicted mass on ranked blocks seen: all of them, the last ``w``, or
      a moving average (weight ``1/k``);
    * ``sample64``: exact logits of 64 random tokens, scaled up to the unseen tokens;
    * ``est_raw``: ``sum_unseen n_j exp(s_j - M)`` uncalibrated (in the right units only for
      the research-only ``gaussian`` metadata);
    * ``max(a,b)``: the larger of two estimates;
    * ``est_raw_x{gamma}``: ``gamma * est_raw`` (with sketch metadata ``est_raw`` is the
      sketch's own prediction of the unseen mass);
    * ``certified_q`` (``quant{b}`` metadata only): ``sum_unseen sum_t exp(approx_t + slack_j)``,
      a certified bound from the quantised keys;
    * ``gate{g}(base)``: ``base``, but no stop while any unseen block's ball bound
      ``q.mu + |q| max|k - mu|`` is within ``g`` nats of the largest logit seen (spike-aware gate);
    * ``{base}&next{lam}``: ``base``, and the next block's predicted mass ``n_j exp(s_j)`` must be
      below ``lam`` of ``AS_acc + rest`` (a share condition, meaningful for sketch metadata).

    Statistics named "ranked" leave the forced sink/recent blocks out: those are chosen by
    position, not estimate (the newest block is often near empty, which makes ``AS_min``
    tiny). Before the first ranked block such rules cannot stop (``rest = inf``).
    """
    n = c.mass.shape[0]
    left = (n - np.arange(1, n + 1))[:, None].astype(np.float64)  # blocks unseen after each prefix
    cmin = np.minimum.accumulate(c.mass, axis=0)
    r = {
        "remaining": left * cmin,
        "seed": cmin,
        "certified": suffix_sum(c.length * np.exp(c.ub)),
    }
    ranked = (np.arange(n) >= c.forced)[:, None] & np.ones_like(c.mass, dtype=bool)
    none_yet = np.cumsum(ranked, axis=0) == 0  # prefixes that hold no ranked block
    m_r = np.where(ranked, c.mass, 0.0)
    cnt = np.maximum(np.cumsum(ranked, axis=0), 1)

    def guard(rest):
        return np.where(none_yet & (left > 0), np.inf, rest)

    r["remaining_ranked"] = guard(left * np.minimum.accumulate(np.where(ranked, c.mass, np.inf), axis=0))
    for w in (4, 8, 16, 32, 64):
        r[f"window_mean{w}"] = guard(left * window_sum(m_r, w) / np.minimum(cnt, w))
    for a in (0.5, 0.25, 0.125, 0.0625, 0.03125):
        em = ema(m_r[c.forced:], a) if c.forced < n else m_r[:0]
        r[f"ema_mass{1 / a:g}"] = guard(left * np.concatenate([np.zeros((c.forced,) + m_r.shape[1:]), em], axis=0))
        r[f"ema_all{1 / a:g}"] = left * ema(c.mass, a)  # every block in processing order, forced ones too
    r["ema"] = r["ema_all8"]  # the rule psa_ref implements: stop="ema", EMA_WEIGHT = 1/8
    # Unseen blocks predicted from metadata, p_j = n_j exp(beta * s_j), scaled by kappa, the
    # ratio of true to predicted mass on ranked blocks seen: all of them, the last w, or an EMA.
    for beta in (1.0, 0.75, 0.5, 0.25):
        s_ref = c.est.max(axis=0)  # any reference works: kappa cancels it; this one avoids overflow
        pred = c.length * np.exp(beta * (c.est - s_ref))
        p_r = np.where(ranked, pred, 0.0)
        unseen = suffix_sum(pred)
        with np.errstate(invalid="ignore", divide="ignore"):
            r[f"calib_all_b{beta:g}"] = guard(np.cumsum(m_r, 0) / np.cumsum(p_r, 0) * unseen)
            for w in (8, 16, 32, 64):
                r[f"frontier{w}_b{beta:g}"] = guard(window_sum(m_r, w) / window_sum(p_r, w) * unseen)
            for a in (0.125, 0.0625):
                # the EMA runs over ranked blocks only: forced rows contribute nothing
                em = ema(m_r[c.forced:], a) if c.forced < n else m_r[:0]
                ep = ema(p_r[c.forced:], a) if c.forced < n else p_r[:0]
                k = np.concatenate([np.full((c.forced,) + m_r.shape[1:], np.nan), em / ep], axis=0)
                r[f"ema{1 / a:g}_b{beta:g}"] = guard(np.nan_to_num(k, nan=np.inf) * unseen)
    r["sample64"] = c.sample_rest
    r["est_raw"] = suffix_sum(c.length * np.exp(c.est))  # uncalibrated: right units for "gaussian" only
    # With per-token sketch metadata (quant{b}, sparq{r}: est = log mean token mass of the
    # sketch) est_raw is the sketch's own prediction of the unseen mass; scaled variants trade
    # safety for budget.
    for gamma in (0.25, 0.5, 2.0, 4.0):
        r[f"est_raw_x{gamma:g}"] = gamma * r["est_raw"]
    if c.qub is not None:
        # certified from quantised keys: every unseen token's logit is at most approx + slack
        r["certified_q"] = suffix_sum(np.exp(c.qub))
    # Gates (spike-aware): the rule may stop only once every unseen block's ball bound
    # q.mu + |q| max|k - mu| is at least ``g`` nats below the largest logit seen so far.
    unseen_max = np.concatenate([np.maximum.accumulate(c.ball[::-1], axis=0)[::-1][1:],
                                 np.full((1, c.ball.shape[1]), -np.inf)], axis=0)
    seen_max = np.maximum.accumulate(c.bmax, axis=0)
    for gap in (0, 4, 8):
        shut = unseen_max > seen_max - gap
        for base in ("remaining_ranked", "ema_all4", "est_raw"):
            r[f"gate{gap}({base})"] = np.where(shut, np.inf, r[base])
    # Share condition ("&next{lam}", for per-token sketch metadata): besides the mass test,
    # the next block's predicted mass n_j exp(s_j) must be below lam of the estimated total
    # (acc + rest). At one budget, mean output error is lowest when every head stops where
    # its next block is worth the same share, not at the same cumulative mass: concentrated
    # heads read on (their tail blocks are cheap and still matter), flat heads stop nearer tau.
    acc = np.cumsum(c.mass, axis=0)
    nxt = np.concatenate([c.length[1:] * np.exp(c.est[1:]), np.zeros_like(c.est[:1])], axis=0)
    for base in ("est_raw", "frontier16_b1", "ema8_b1"):
        for lam in (0.0015, 0.001, 0.0007):
            with np.errstate(invalid="ignore", divide="ignore"):
                r[f"{base}&next{lam:g}"] = np.where(nxt / (acc + r[base]) < lam, r[base], np.inf)
    for a, b in (("remaining_ranked", "frontier16_b1"), ("remaining_ranked", "ema16_b1"),
                 ("window_mean16", "frontier16_b1"), ("remaining_ranked", "frontier16_b0.5"),
                 ("remaining_ranked", "frontier32_b0.25"), ("remaining_ranked", "frontier64_b0.25"),
                 ("remaining_ranked", "frontier64_b0.5"), ("window_mean8", "frontier32_b0.5")):
        r[f"max({a},{b})"] = np.maximum(r[a], r[b])
    return r


def stops(c: Case, rest: np.ndarray, tau: float, shared: bool) -> np.ndarray:
    """``[G]`` prefix lengths at which the rule stops (first boundary where it holds)."""
    acc = np.cumsum(c.mass, axis=0)
    with np.errstate(invalid="ignore"):
        holds = acc / (acc + rest) >= tau
    holds[: max(c.forced, 1) - 1] = False  # the first boundary is after the forced chunk
    holds[-1] = True  # no block left
    if shared:
        first = int(np.argmax(holds.all(axis=1)))
        return np.full(c.mass.shape[1], first + 1)
    return np.argmax(holds, axis=0) + 1


# --- driver --------------------------------------------------------------------------------------


@dataclass
class Setting:
    sink: int
    recent: int
    shared: bool
    metadata: str = "cuboid_mean"

    @property
    def name(self) -> str:
        return (f"sink{self.sink}/recent{self.recent}/{'shared' if self.shared else 'per_head'}"
                + ("" if self.metadata == "cuboid_mean" else f"/{self.metadata}"))


# The research rule that psa_ref implements for each metadata kind it has: stop="ema" on the
# per-block kinds, stop="sketch" (= frontier16_b1&next0.001) on quant3.
CONFIRMED = {"cuboid_mean": ("ema", "ema"), "minmax": ("ema", "ema"), "mean": ("ema", "ema"),
             "quant3": ("sketch", "frontier16_b1&next0.001")}


def confirm(q, keys, values, scale, block_size, st: "Setting", c: Case, rest: np.ndarray, tau: float) -> None:
    """Check one prefix-evaluated stop against :func:`psa_ref.attention` itself (the rule of :data:`CONFIRMED`)."""
    import psa_ref

    blocks = psa_ref.KVBlocks.from_dense(keys[None], values[None], block_size=block_size, metadata=st.metadata)
    res = psa_ref.attention(q, blocks, tau, stop=CONFIRMED[st.metadata][0], scale=scale,
                            gqa="shared" if st.shared else "per_head",
                            sink_blocks=st.sink, recent_blocks=st.recent, exact_mass=True)
    mine = stops(c, rest, tau, st.shared)
    theirs = res.num_used if not st.shared else np.full(q.shape[0], res.num_used[0])
    assert np.array_equal(mine, theirs), f"prefix evaluation {mine} != psa_ref.attention {theirs}"
    heads = np.arange(q.shape[0])
    assert np.allclose(c.true[mine - 1, heads], res.mass_exact, rtol=1e-9, atol=1e-12)


def collect(trace_paths, settings, taus=TAUS, block_size=16, max_positions=None, progress=True, confirm_every=0):
    """Run every case; return per-(setting, rule, tau) lists of per-head records.

    With ``confirm_every = n > 0`` every n-th case also runs ``stop="ema"`` (``stop="sketch"``
    for ``quant3`` settings) through :func:`psa_ref.attention` and checks that it stops where
    the prefix evaluation says.
    """
    confirmed = 0
    from tqdm.auto import tqdm

    rec = {}
    topk = {}  # setting -> list of [N] per-head error curves (prefix of the order)
    ideal = {}
    rng = np.random.default_rng(0)
    checked = False
    for path in trace_paths:
        trace = load_trace(path)
        label = Path(path).stem if path else "shipped"
        n_layers, n_pos, hq, _ = trace.q.shape
        hkv = trace.k.shape[1]
        g = hq // hkv
        positions = range(n_pos) if max_positions is None else np.linspace(0, n_pos - 1, max_positions).astype(int)
        cases = [(li, pi) for li in range(n_layers) for pi in positions]
        for ci, (li, pi) in enumerate(tqdm(cases, desc=label, disable=not progress)):
            q, k, v = (a.astype(np.float64) for a in trace.case(li, pi))
            layer = int(trace.layers[li])
            if not checked:
                from psa_ref import KVBlocks, estimate

                b = KVBlocks.from_dense(k, v, block_size=block_size)
                mine = block_meta(k[0], block_size)
                assert np.allclose(mine["radius"], b.meta["radius"][0]) and np.allclose(mine["lo"], b.meta["lo"][0])
                est_ref = estimate(q, b, trace.scale)[:g].T
                est_mine = trace.scale * (mine["center"] @ q[:g].T + mine["radius"] @ np.abs(q[:g]).T)
                assert np.allclose(est_ref, est_mine)
                checked = True
            for kv in range(hkv):
                heads = slice(kv * g, (kv + 1) * g)
                for st in settings:
                    c = make_case(q[heads], k[kv], v[kv], trace.scale, block_size, sink=st.sink, recent=st.recent,
                                  shared=st.shared, metadata=st.metadata, rng=rng)
                    key = st.name
                    topk.setdefault(key, []).extend(zip(c.out.T.astype(np.float32), [label] * g, [layer] * g))
                    if st is settings[0]:  # the ideal budget does not depend on the setting
                        for t in taus:
                            ideal.setdefault(t, []).extend(
                                zip(c.ideal[t][0], c.ideal[t][1], [label] * g, [layer] * g))
                    all_rest = rules(c)
                    if confirm_every and ci % confirm_every == 0 and st.metadata in CONFIRMED:
                        for t in taus:
                            confirm(q[heads], k[kv], v[kv], trace.scale, block_size, st, c,
                                    all_rest[CONFIRMED[st.metadata][1]], t)
                        confirmed += 1
                    # oracle stop on this order: the first boundary whose true mass reaches tau
                    for t in taus:
                        for name, rest in list(all_rest.items()) + [("oracle_stop", None)]:
                            if rest is None:
                                holds = c.true >= t - 1e-12
                                holds[: max(c.forced, 1) - 1] = False
                                holds[-1] = True
                                s = (np.full(g, int(np.argmax(holds.all(1))) + 1) if st.shared
                                     else np.argmax(holds, axis=0) + 1)
                            else:
                                s = stops(c, rest, t, st.shared)
                            hh = np.arange(g)
                            rec.setdefault((key, name, t), []).extend(
                                zip(s, c.true[s - 1, hh], c.out[s - 1, hh], [label] * g, [layer] * g,
                                    [c.mass.shape[0]] * g))
    if confirm_every:
        print(f"confirmed stop='ema' (stop='sketch' on quant3) through psa_ref.attention on {confirmed} "
              f"(case, setting) pairs x {len(taus)} taus")
    return rec, topk, ideal


def topk_curve(curves, n_max):
    return np.mean([np.concatenate([c, np.full(n_max - c.size, c[-1])]) for c in curves], axis=0)


def summarise(rec, topk, ideal, taus=TAUS, select=None):
    """Rows of the research table; ``select(label, layer)`` filters the cases."""
    rows = []
    for (setting, rule, t), items in rec.items():
        items = [x for x in items if select is None or select(x[3], x[4])]
        if not items:
            continue
        used = np.array([x[0] for x in items], dtype=float)
        true = np.array([x[1] for x in items])
        err = np.array([x[2] for x in items])
        ideal_items = [x for x in ideal[t] if select is None or select(x[2], x[3])]
        ideal_blocks = float(np.mean([x[0] for x in ideal_items]))
        curves = [c for c, label, layer in topk[setting] if select is None or select(label, layer)]
        n_max = max(c.size for c in curves)
        curve = topk_curve(curves, n_max)
        b = used.mean()
        lo = int(np.floor(b))
        frac = b - lo
        e_lo = curve[max(lo, 1) - 1]
        e_hi = curve[min(lo + 1, n_max) - 1]
        topk_same = (1 - frac) * e_lo + frac * e_hi
        ok = curve <= err.mean() + 1e-15
        k_same_err = int(np.argmax(ok)) + 1 if ok.any() else n_max
        rows.append(dict(setting=setting, rule=rule, tau=t, blocks=b, ideal=ideal_blocks, ratio=b / ideal_blocks,
                         mass_mean=float(true.mean()), mass_p1=float(np.percentile(true, 1)),
                         err_mean=float(err.mean()), err_p99=float(np.percentile(err, 99)),
                         topk_err_same_budget=float(topk_same), topk_k_same_err=k_same_err,
                         beats_topk=bool(err.mean() < topk_same), n=len(items)))
    return rows


def format_rows(rows, rules_=None, settings_=None, taus=None):
    lines = ["| setting | rule | τ | blocks | ideal | ×ideal | mass mean | mass p1 | err mean | err p99 "
             "| top-k err same budget | top-k k same err |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if (rules_ and r["rule"] not in rules_) or (settings_ and r["setting"] not in settings_) or (
                taus and r["tau"] not in taus):
            continue
        lines.append(f"| {r['setting']} | {r['rule']} | {r['tau']:g} | {r['blocks']:.1f} | {r['ideal']:.1f} | "
                     f"{r['ratio']:.2f} | {r['mass_mean']:.3f} | {r['mass_p1']:.3f} | {r['err_mean']:.4f} | "
                     f"{r['err_p99']:.4f} | {r['topk_err_same_budget']:.4f} | {r['topk_k_same_err']} |")
    return "\n".join(lines)


def meets_goal(r) -> bool:
    """The issue's bar at tau 0.95: worst-1% mass >= 0.90, <= 1.3x the ideal budget, beats top-k."""
    return r["mass_p1"] >= 0.90 and r["ratio"] <= 1.3 and r["beats_topk"]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("traces", nargs="*", help="trace .npz files (default: the shipped trace)")
    parser.add_argument("--out", default=None, help="write every row as JSON here")
    parser.add_argument("--positions", type=int, default=None, help="use this many positions per layer (spread)")
    parser.add_argument("--settings", default="0/0/per_head,1/1/per_head,1/1/shared",
                        help="comma list of sink/recent/(per_head|shared)[/metadata]")
    parser.add_argument("--detail", default=None, help="comma list of rules to break down per trace and per layer")
    parser.add_argument("--confirm", type=int, default=0, metavar="N",
                        help="every N-th case, check stop='ema' (stop='sketch' on quant3) against psa_ref.attention")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    settings = []
    for s in args.settings.split(","):
        parts = s.split("/")
        settings.append(Setting(int(parts[0]), int(parts[1]), parts[2] == "shared",
                                parts[3] if len(parts) > 3 else "cuboid_mean"))
    start = time.perf_counter()
    paths = args.traces or [None]
    rec, topk, ideal = collect(paths, settings, max_positions=args.positions, progress=not args.quiet,
                               confirm_every=args.confirm)
    rows = summarise(rec, topk, ideal)
    rows.sort(key=lambda r: (r["setting"], r["tau"], r["rule"]))
    print(format_rows(rows))
    print()
    print("rules meeting the bar at tau 0.95 (p1 mass >= 0.90, <= 1.3x ideal, beats top-k):")
    for r in rows:
        if r["tau"] == 0.95 and meets_goal(r):
            print(f"  {r['setting']:<24} {r['rule']:<34} blocks {r['blocks']:.1f} ({r['ratio']:.2f}x) "
                  f"p1 {r['mass_p1']:.3f} err {r['err_mean']:.4f} vs top-k {r['topk_err_same_budget']:.4f}")
    if args.detail:
        chosen = args.detail.split(",")
        labels = sorted({x[3] for x in next(iter(rec.values()))})
        layers = sorted({x[4] for x in next(iter(rec.values()))})
        for what, values, sel in (("trace", labels, lambda v: lambda lab, lay: lab == v),
                                  ("layer", layers, lambda v: lambda lab, lay: lay == v)):
            print(f"\nper {what}, tau 0.95:")
            detail = []
            for v in values:
                for r in summarise({k: x for k, x in rec.items() if k[1] in chosen and k[2] == 0.95}, topk, ideal,
                                   select=sel(v)):
                    r["setting"] = f"{r['setting']} {what} {v}"
                    detail.append(r)
            print(format_rows(detail))
            rows.extend(detail)
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1, default=float))
    print(f"{time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
