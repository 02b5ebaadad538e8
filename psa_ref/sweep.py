"""Algorithm 1 evaluated from all logits at once: the vectorised twin of [`psa_ref.attention`][psa_ref.attention].

[`psa_ref.attention`][psa_ref.attention] walks the blocks one chunk at a time, as a GPU kernel does, and
reads only the blocks it attends. That loop is the reference, but in Python it costs about
100 us per iteration, which is too slow for accuracy studies that decode hundreds of tokens
through a 30-layer model. [`attention`][psa_ref.sweep.attention] here returns the *same result* (same
``blocks_used``, same output, same stop) computed differently: every logit and every block
mass under one maximum per head, every stop-rule estimate at every chunk boundary at once
(the rule's formula is ``psa_ref.progressive.estimated_fraction`` itself, applied to
arrays of boundaries), then exact softmax attention over the blocks before the first
boundary where the rule holds.

It reads the whole KV cache, so it says nothing about speed; ``tests/test_stop_rules.py``
checks it against the loop. ``psa_ref.tools.hf`` uses it as ``backend="sweep"``.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from .blocks import KVBlocks
from .progressive import (DEFAULT_STOP, EMA_WEIGHT, SKETCH_RULES, SKETCH_WINDOW, estimated_fraction, run_groups,
                          sketch_next_small, sketch_rest, sketch_share)
from .result import AttentionResult

_EMA_SEGMENT = 256  # blocks per closed-form segment: (1 - w)^-256 stays far from float64 overflow


def ema_prefix(mass: np.ndarray, weight: float = EMA_WEIGHT) -> np.ndarray:
    """``AS_ema`` after each block of ``mass [n, G]`` (in processing order): ``[n, G]``.

    The recurrence ``e_0 = m_0``, ``e_i = (1 - w) e_(i-1) + w m_i`` of
    ``psa_ref.progressive.update_ema``, in closed form per segment of blocks:
    ``e_(s+k) = (1-w)^(k+1) e_(s-1) + sum_(j<=k) w (1-w)^(k-j) m_(s+j)``.
    """
    out = np.empty_like(mass)
    carry = mass[:1]  # a fictitious e_(-1) = m_0 gives e_0 = m_0
    for s in range(0, mass.shape[0], _EMA_SEGMENT):
        seg = mass[s : s + _EMA_SEGMENT]
        k = np.arange(seg.shape[0])[:, None]
        decay = (1.0 - weight) ** k  # (1-w)^k
        out[s : s + seg.shape[0]] = decay * (1.0 - weight) * carry + decay * np.cumsum(weight * seg / decay, axis=0)
        carry = out[s + seg.shape[0] - 1 : s + seg.shape[0]]
    return out


def sketch_prefix(mass: np.ndarray, log_sketch: np.ndarray, num_forced: int, top: np.ndarray):
    """``stop="sketch"`` after each block of the processing order: ``(rest [n, G], next_mass [n, G])``.

    ``mass [n, G]`` holds the true block masses in processing order, relative to ``top``;
    ``log_sketch [n, G]`` their ``log p_j + M`` (``s_j + log n_j``), the first ``num_forced``
    of them forced. The calibration window is a sliding sum over the last ``SKETCH_WINDOW``
    positions in which forced rows count as empty, i.e. the last ranked blocks; unseen
    sketch sums are a reverse log-sum-exp accumulation (no cancellation).
    """
    n, g = mass.shape
    ranked = (np.arange(n) >= num_forced)[:, None]
    pad = SKETCH_WINDOW - 1
    m_r = np.concatenate([np.zeros((pad, g)), np.where(ranked, mass, 0.0)])
    lp_r = np.concatenate([np.full((pad, g), -np.inf), np.where(ranked, log_sketch, -np.inf)])
    win = np.lib.stride_tricks.sliding_window_view
    window_mass = win(m_r, SKETCH_WINDOW, axis=0).sum(axis=-1)  # [n, G]
    lw = win(lp_r, SKETCH_WINDOW, axis=0)  # [n, G, W]
    top_w = lw.max(axis=-1, keepdims=True)
    top_w = np.where(np.isfinite(top_w), top_w, 0.0)
    with np.errstate(divide="ignore"):
        log_window = top_w[..., 0] + np.log(np.exp(lw - top_w).sum(axis=-1))
    suffix = np.logaddexp.accumulate(log_sketch[::-1], axis=0)[::-1]  # log sum of p over positions >= i
    log_unseen = np.concatenate([suffix[1:], np.full((1, g), -np.inf)])
    with np.errstate(over="ignore"):
        next_mass = np.concatenate([np.exp(log_sketch[1:] - top), np.zeros((1, g))])
    return sketch_rest(window_mass, log_window, log_unseen), next_mass


def group_sweep(q, keys, values, blocks: KVBlocks, chunks, bound, threshold: float, stop: str, scale: float,
                num_forced: int = 0):
    """One selection group (query heads ``q [G, D]`` over one KV head): the loop's result.

    Arguments and return value ``(output [G, D], blocks_used [n], iterations, stop_reason,
    fraction [G])`` are those of ``psa_ref.progressive.progressive_loop``.
    """
    lengths = blocks.block_lengths
    logits = scale * (keys @ q.T)  # [T, G]; reads every key, which the loop does not
    top = logits.max(axis=0)
    w = np.exp(logits - top)
    starts = np.arange(0, keys.shape[0], blocks.block_size)
    order = np.concatenate(chunks)
    mass = np.add.reduceat(w, starts, axis=0)[order]  # [N, G] in processing order, one max per head
    ends = np.cumsum([c.size for c in chunks]) - 1  # last block index (in order) of each boundary
    n_left = (order.size - 1 - ends)[:, None]
    as_acc = np.cumsum(mass, axis=0)[ends]
    as_min = np.minimum.accumulate(mass, axis=0)[ends]
    as_ema = ema_prefix(mass)[ends] if stop == "ema" else None
    unseen = None
    if stop == "certified":
        with np.errstate(over="ignore"):  # a bound far above the maximum makes the fraction 0, as in the loop
            in_order = (lengths[order] * np.exp(bound[:, order] - top[:, None])).T  # [N, G]
        suffix = np.cumsum(in_order[::-1], axis=0)[::-1]
        unseen = np.concatenate([suffix[1:], np.zeros_like(suffix[:1])])[ends]
    next_small = True
    if stop in SKETCH_RULES:
        rest, next_mass = sketch_prefix(mass, (bound + np.log(lengths))[:, order].T, num_forced, top)
        unseen = rest[ends]
        next_small = sketch_next_small(as_acc, unseen, next_mass[ends], sketch_share(stop, blocks.num_blocks))
    with np.errstate(invalid="ignore"):
        fraction = estimated_fraction(stop, as_acc, as_min, n_left, unseen, as_ema)  # [boundaries, G]

    holds = (np.all((fraction >= threshold) & next_small, axis=1) if threshold < 1.0
             else np.zeros(len(chunks), dtype=bool))
    holds[-1] = True  # no block left
    b = int(np.argmax(holds))
    used = order[: ends[b] + 1].astype(np.int64)
    tokens = (used[:, None] * blocks.block_size + np.arange(blocks.block_size)).ravel()
    tokens = tokens[tokens < keys.shape[0]]  # the last block may be partial
    lg = logits[tokens]
    wt = np.exp(lg - lg.max(axis=0))
    out = (wt.T @ values[tokens]) / wt.sum(axis=0)[:, None]
    reason = "exhausted" if n_left[b, 0] == 0 else "threshold"
    return out, used, b + 1, reason, fraction[b]


def attention(
    q: ArrayLike,
    blocks: KVBlocks,
    threshold: float = 0.95,
    *,
    scale: float | None = None,
    stop: str = DEFAULT_STOP,
    step: int = 1,
    gqa: str = "shared",
    sink_blocks: int = 0,
    recent_blocks: int = 0,
    exact_mass: bool = False,
    first_chunk: int | str | None = None,
    rank: str = "estimate",
) -> AttentionResult:
    """The result of [`psa_ref.attention`][psa_ref.attention] with the same arguments, computed from all logits.

    Shapes, options and the result are those of [`psa_ref.attention`][psa_ref.attention]. Where a stop-rule
    ratio lies within rounding (about 1e-12) of ``threshold`` the two may stop one boundary
    apart; elsewhere they agree exactly.
    """
    return run_groups(group_sweep, q, blocks, threshold, scale=scale, stop=stop, step=step, gqa=gqa,
                      sink_blocks=sink_blocks, recent_blocks=recent_blocks, exact_mass=exact_mass,
                      first_chunk=first_chunk, rank=rank)
