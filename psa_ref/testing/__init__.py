"""Helpers for testing any PSA backend against this reference: error budgets, an
independent oracle of the stop rules, and input generators.

Nothing here is used by the reference itself; the oracle is written from log-domain
block masses with a global maximum, a different route from the running-maximum loop of
``psa_ref.progressive``, so one bug cannot hide in both.

Error budgets (see ``docs/testing.md``):

* float64 against float64: both sides sum at most ``T`` products in a different order,
  so they differ by a few ``T * eps64`` relative to the largest value: [`budget64`][psa_ref.testing.budget64].
* a low-precision kernel against the float64 reference: at most twice the error of a
  naive implementation in that precision, measured on the same inputs
  (flash-attention's rule): pass ``naive_err`` to [`assert_close`][psa_ref.testing.assert_close].
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from ..scoring import kv_head_of

EPS64 = float(np.finfo(np.float64).eps)


def budget64(num_terms: int) -> float:
    """Relative error budget for two float64 evaluations of the same sums of ``num_terms``
    terms in different orders: ``16 * num_terms * eps64`` (a safety factor of 16 over the
    classic ``n * eps`` worst-case bound for naive summation)."""
    return 16.0 * max(num_terms, 1) * EPS64


def assert_close(name: str, actual, ref, *, rtol: float | None = None, atol: float = 0.0,
                 naive_err: float | None = None) -> None:
    """Check ``|actual - ref| <= atol + rtol * max|ref|`` elementwise and say why when not.

    Give either ``rtol`` or ``naive_err`` (the max abs error of a naive low-precision
    implementation against ``ref``; then the tolerance is ``2 * naive_err``). NaN or Inf
    in ``actual`` always fails. The failure message names the quantity, the largest
    error, where it is and the tolerance used.
    """
    actual = np.asarray(actual, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if actual.shape != ref.shape:
        raise AssertionError(f"{name}: shape {actual.shape} != reference shape {ref.shape}")
    if not np.isfinite(actual).all():
        raise AssertionError(f"{name}: {np.count_nonzero(~np.isfinite(actual))} non-finite value(s)")
    if naive_err is not None:
        tol = 2.0 * naive_err + atol
        how = f"2 x naive error {naive_err:.3g}"
    else:
        if rtol is None:
            raise TypeError("assert_close needs rtol or naive_err")
        scale = float(np.abs(ref).max()) if ref.size else 0.0
        tol = atol + rtol * scale
        how = f"atol {atol:.3g} + rtol {rtol:.3g} x max|ref| {scale:.3g}"
    err = np.abs(actual - ref)
    if err.size and err.max() > tol:
        at = np.unravel_index(int(err.argmax()), err.shape)
        raise AssertionError(
            f"{name}: max abs error {err.max():.3e} at index {at} (actual {actual[at]!r}, reference {ref[at]!r}) "
            f"exceeds tolerance {tol:.3e} ({how})"
        )


def to_bfloat16(x: ArrayLike) -> np.ndarray:
    """``x`` rounded to the nearest bfloat16 (ties to even), as float32: the values a bfloat16 model's
    K, V or q hold, to give the float64 reference the same numbers a bfloat16 kernel reads."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return u.astype(np.uint32).view(np.float32)


def bfloat16_bits(x: ArrayLike) -> np.ndarray:
    """The bfloat16 bits of ``to_bfloat16(x)`` as int16 (how CuPy, which has no bfloat16, holds them)."""
    return (to_bfloat16(x).view(np.uint32) >> 16).astype(np.uint16).view(np.int16)


# --- independent oracle -------------------------------------------------------------------


def _logsumexp(x: np.ndarray, axis=None) -> np.ndarray:
    m = np.max(x, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    with np.errstate(divide="ignore"):
        return np.squeeze(m + np.log(np.exp(x - m).sum(axis=axis, keepdims=True)), axis=axis)


def block_logits(q_head: np.ndarray, keys: np.ndarray, block_size: int, scale: float) -> list[np.ndarray]:
    """The logits of one query head, block by block (a list of ``[n_j]`` arrays)."""
    logits = scale * (np.asarray(keys, np.float64) @ np.asarray(q_head, np.float64))
    return [logits[i : i + block_size] for i in range(0, logits.size, block_size)]


def log_block_mass(q_head, keys, block_size: int, scale: float) -> np.ndarray:
    """``[N]``: ``log sum_{t in j} exp(l_t)`` of each block, exactly (no running max)."""
    return np.array([_logsumexp(lg) for lg in block_logits(q_head, keys, block_size, scale)])


def brute_force_bound(q_head, keys, block_size: int, scale: float) -> np.ndarray:
    """``[N]`` min/max logit bound of each block, from the raw keys (not from KVBlocks)."""
    q_head = np.asarray(q_head, np.float64)
    out = []
    for i in range(0, keys.shape[0], block_size):
        kb = np.asarray(keys[i : i + block_size], np.float64)
        out.append(scale * np.maximum(q_head * kb.max(0), q_head * kb.min(0)).sum())
    return np.array(out)


def oracle_sketch(log_mass: np.ndarray, chunks: list[np.ndarray], log_sketch: np.ndarray, num_forced: int,
                  next_block: int | None = None, window: int | None = None,
                  share: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``stop="sketch"`` after each chunk, for one query head: ``(fractions, next_margin)``.

    ``log_sketch`` is ``[N]``: ``log p_j`` of each block in absolute units (``s_j + log n_j``
    with ``s_j`` the block's estimate); the first ``num_forced`` blocks of the order (the first
    chunk) are forced and stay out of the calibration window; ``next_block`` is the block the
    loop would process after the last chunk (None when every block is in ``chunks``). Every
    block not in the prefix counts as unseen. Everything is recomputed from the
    prefix of blocks attended, in absolute log units with no running maximum:
    ``log rest = lse_W(log m) - lse_W(log p) + lse_unseen(log p)`` and the share test
    ``log p_next < log(share) + logaddexp(log AS_acc, log rest)``, returned as its margin in
    nats (``> 0`` where the next block is small enough; ``inf`` when no block is left).
    """
    if window is None or share is None:
        from ..progressive import SKETCH_NEXT_SHARE, SKETCH_WINDOW  # the constants only

        window = SKETCH_WINDOW if window is None else window
        share = SKETCH_NEXT_SHARE if share is None else share
    order = np.concatenate(chunks)
    fractions, small = [], []
    done = 0
    for chunk in chunks:
        done += len(chunk)
        prefix = order[:done]
        unseen = np.setdiff1d(np.arange(log_mass.size), prefix)
        nxt = order[done] if done < order.size else next_block
        ranked = prefix[num_forced:]
        w = ranked[-window:]
        log_acc = _logsumexp(log_mass[prefix])
        if unseen.size == 0:
            log_rest = -np.inf
        elif w.size == 0:
            log_rest = np.inf
        else:
            log_rest = _logsumexp(log_mass[w]) - _logsumexp(log_sketch[w]) + _logsumexp(log_sketch[unseen])
        with np.errstate(over="ignore", invalid="ignore"):
            fractions.append(1.0 / (1.0 + np.exp(log_rest - log_acc)))
        with np.errstate(invalid="ignore"):
            margin = np.log(share) + np.logaddexp(log_acc, log_rest) - log_sketch[nxt] if nxt is not None else np.inf
        small.append(margin)
    return np.array(fractions), np.array(small)


def oracle_fractions(stop: str, log_mass: np.ndarray, chunks: list[np.ndarray], log_bound: np.ndarray | None = None,
                     lengths: np.ndarray | None = None, ema_weight: float | None = None,
                     num_forced: int = 0) -> np.ndarray:
    """The stop rule's estimated attended fraction after each chunk, for one query head.

    Args:
        stop: "ema", "remaining", "seed", "certified" or "sketch".
        log_mass: ``[N]`` log block masses (``log_block_mass``).
        chunks: the processing order split into iterations.
        log_bound: ``[N]`` min/max logit bounds (``certified``), or the block estimates
            ``s_j`` (``sketch``).
        lengths: ``[N]`` tokens per block (``certified``, ``sketch``).
        ema_weight: ``w`` of ``stop="ema"`` (default: the reference's ``EMA_WEIGHT``). The
            average is recomputed here from scratch in the log domain, one block at a time.
        num_forced: forced blocks at the head of the order (``sketch`` only).

    Returns:
        ``[len(chunks)]`` fractions in [0, 1], computed in the log domain. ``sketch`` also
            needs its share test to stop: see [`oracle_sketch`][psa_ref.testing.oracle_sketch].
    """
    if stop == "sketch":
        return oracle_sketch(log_mass, chunks, log_bound + np.log(lengths), num_forced)[0]
    if ema_weight is None:
        from ..progressive import EMA_WEIGHT as ema_weight  # the constant only; the formula is re-derived below
    n = log_mass.size
    seen = np.zeros(n, dtype=bool)
    log_ema = None  # log of AS_ema, in absolute (not running-max) units
    out = []
    for chunk in chunks:
        seen[chunk] = True
        log_acc = _logsumexp(log_mass[seen])
        n_left = int((~seen).sum())
        if stop == "ema":
            for j in chunk:  # AS_ema <- (1 - w) AS_ema + w m_j, in processing order
                log_ema = log_mass[j] if log_ema is None else np.logaddexp(np.log1p(-ema_weight) + log_ema,
                                                                         np.log(ema_weight) + log_mass[j])
            log_rest = np.log(n_left) + log_ema if n_left else -np.inf
        elif stop == "remaining":
            log_rest = np.log(n_left) + log_mass[seen].min() if n_left else -np.inf
        elif stop == "seed":
            log_rest = log_mass[seen].min()
        elif stop == "certified":
            log_rest = _logsumexp(np.log(lengths[~seen]) + log_bound[~seen]) if (~seen).any() else -np.inf
        else:
            raise ValueError(f"the oracle does not know stop={stop!r}")
        with np.errstate(over="ignore", invalid="ignore"):
            out.append(1.0 / (1.0 + np.exp(log_rest - log_acc)))
    return np.array(out)


def exact_fraction(q_head, keys, block_size: int, scale: float, used) -> float:
    """The true share of one query head's softmax mass that lies in blocks ``used``."""
    lm = log_block_mass(q_head, keys, block_size, scale)
    used = np.asarray(used, dtype=np.int64)
    if used.size == 0:
        return 0.0
    return float(np.exp(_logsumexp(lm[used]) - _logsumexp(lm)))


def dense_over_blocks(q_head, keys, values, block_size: int, used, scale: float) -> np.ndarray:
    """Softmax attention of one head restricted to the tokens of blocks ``used`` (float64)."""
    idx = np.concatenate([np.arange(j * block_size, min((j + 1) * block_size, keys.shape[0])) for j in used])
    logits = scale * (np.asarray(keys, np.float64)[idx] @ np.asarray(q_head, np.float64))
    w = np.exp(logits - logits.max())
    return (w @ np.asarray(values, np.float64)[idx]) / w.sum()


def used_by_head(result, num_q_heads: int, num_kv_heads: int, gqa: str) -> list[np.ndarray]:
    """The blocks each query head attended, from an [`AttentionResult`][psa_ref.AttentionResult]."""
    if isinstance(result.blocks_used, np.ndarray):
        return [result.blocks_used]
    if gqa == "per_head":
        return list(result.blocks_used)
    kv = kv_head_of(num_q_heads, num_kv_heads)
    return [result.blocks_used[kv[h]] for h in range(num_q_heads)]


# --- inputs -----------------------------------------------------------------------------------


def random_problem(rng: np.random.Generator, *, num_q_heads: int, num_kv_heads: int, num_tokens: int,
                   head_dim: int, logit_scale: float = 1.0, sink_strength: float = 0.0, ties: bool = False,
                   dtype=np.float64):
    """Random ``(q [Hq, D], keys [Hkv, T, D], values [Hkv, T, D])`` with a tunable skew.

    ``logit_scale`` multiplies q (logits spread roughly ``logit_scale * sqrt(D)``);
    ``sink_strength`` pulls token 0's key towards every query (an attention sink);
    ``ties`` repeats the first half of the keys in the second half (equal estimates).
    """
    q = rng.standard_normal((num_q_heads, head_dim)) * logit_scale
    keys = rng.standard_normal((num_kv_heads, num_tokens, head_dim))
    values = rng.standard_normal((num_kv_heads, num_tokens, head_dim))
    if sink_strength:
        g = num_q_heads // num_kv_heads
        for kv in range(num_kv_heads):
            keys[kv, 0] += sink_strength * q[kv * g : (kv + 1) * g].mean(0) / max(logit_scale, 1e-12)
    if ties and num_tokens >= 2:
        half = num_tokens // 2
        keys[:, half : 2 * half] = keys[:, :half]
    return q.astype(dtype), keys.astype(dtype), values.astype(dtype)


def skewed_like_trace(rng: np.random.Generator, *, num_q_heads: int, num_kv_heads: int, num_tokens: int,
                      head_dim: int, block_size: int, hot_fraction: float = 0.05, dtype=np.float16):
    """Synthetic decode inputs whose attention is skewed like real attention: a sink at
    token 0, a recent window, and a few "hot" blocks that hold most of the mass.

    Used by tests and benchmarks at sizes the shipped trace does not cover. Returns
    ``(q [Hq, D], keys [Hkv, T, D], values [Hkv, T, D])``.
    """
    q, keys, values = random_problem(rng, num_q_heads=num_q_heads, num_kv_heads=num_kv_heads, num_tokens=num_tokens,
                                     head_dim=head_dim, logit_scale=1.0, dtype=np.float64)
    g = num_q_heads // num_kv_heads
    n_blocks = -(-num_tokens // block_size)
    n_hot = max(1, int(round(hot_fraction * n_blocks)))
    for kv in range(num_kv_heads):
        direction = q[kv * g : (kv + 1) * g].mean(0)
        direction /= np.linalg.norm(direction) + 1e-12
        hot = rng.choice(n_blocks, size=n_hot, replace=False)
        boost = np.zeros(num_tokens)
        for j in hot:
            boost[j * block_size : (j + 1) * block_size] = rng.uniform(2.0, 4.0)
        boost[0] = 6.0  # attention sink
        boost[-block_size:] = np.maximum(boost[-block_size:], 2.5)  # recent window
        keys[kv] += boost[:, None] * direction[None, :] * np.sqrt(head_dim)
    return q.astype(dtype), keys.astype(dtype), values.astype(dtype)


def brute_force_estimate(q_head, keys, block_size: int, scale: float, metadata: str) -> np.ndarray:
    """``[N]`` criticality estimates of one query head, from the raw keys of each block."""
    q_head = np.asarray(q_head, np.float64)
    out = []
    for i in range(0, keys.shape[0], block_size):
        kb = np.asarray(keys[i : i + block_size], np.float64)
        hi, lo = kb.max(0), kb.min(0)
        if metadata == "minmax":
            out.append(scale * np.maximum(q_head * hi, q_head * lo).sum())
        elif metadata == "cuboid_mean":
            c = (hi + lo) / 2
            out.append(scale * (q_head @ c + np.abs(q_head) @ np.abs(kb - c).mean(0)))
        elif metadata == "mean":
            out.append(scale * (q_head @ kb.mean(0)))
        elif metadata == "quant3":
            out.append(_logsumexp(scale * (brute_force_dequantized(kb) @ q_head)) - np.log(kb.shape[0]))
        else:
            raise ValueError(f"unknown metadata {metadata!r}")
    return np.array(out)


def brute_force_dequantized(kb: np.ndarray) -> np.ndarray:
    """``quant3`` keys of one block ``kb [n, D]``, quantised and reconstructed element by element
    (the formula of ``psa_ref.blocks``, written out with scalars)."""
    out = np.empty(kb.shape)
    lo, hi = kb.min(0), kb.max(0)
    for t in range(kb.shape[0]):
        for i in range(kb.shape[1]):
            span = hi[i] - lo[i]
            code = 0 if span == 0 else min(max(int(np.floor((kb[t, i] - lo[i]) / span * 8)), 0), 7)
            out[t, i] = lo[i] + (code + 0.5) / 8 * span
    return out
