"""Check another implementation's sparse attention result against the reference semantics.

A GPU kernel cannot match a float64 reference bit for bit: its estimates come from float16
metadata and its masses from float32 arithmetic, so where two blocks' estimates nearly tie, or
a stop-rule ratio lies near the threshold, it may legitimately choose differently. This module
checks that a result is *a correct execution of the contract up to those rounding margins*,
and counts how often it agrees with the reference exactly:

* I1 -- the output is softmax attention over the blocks it reports, within twice the error of a
  naive float32 implementation of that same attention (the flash-attention budget);
* I4 -- forced blocks first, then non-increasing reference estimate (the call's ``rank`` key), up to
  ``est_tol``; nothing it skipped ranks above what it attended by more than ``est_tol``;
* I5 -- no earlier chunk boundary satisfies the stop rule by more than ``ratio_tol``, and the
  boundary it stopped at satisfies it within ``ratio_tol`` (PSA);
* I6 -- exactly ``min(k, N)`` blocks whose estimates sum to the top ``k`` within tolerance (top-k).

Use it on your own kernel: run it, build the numbers it reports (``blocks_used``, ``output``,
``iterations``, ``stop_reason``), and call [`check_result`][psa_ref.testing.conformance.check_result].
"""

from __future__ import annotations

from dataclasses import dataclass

from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from .. import _validate
from ..blocks import KVBlocks, to_hnd
from ..progressive import (DEFAULT_STOP, SKETCH_AVG_SHARE, SKETCH_NEXT_SHARE, attention, check_first_chunk,
                           first_chunk_size, resolve_stop, split_chunks)
from ..scoring import estimate, forced_blocks, group_rank_key, kv_head_of, processing_order
from . import brute_force_bound, log_block_mass, oracle_fractions, oracle_sketch
from ..topk import topk_attention

FP16_META_REL = 2.0**-10  # float16 rounding of centre/radius (2^-11) with a factor 2 of margin


@dataclass
class Conformance:
    """What [`check_result`][psa_ref.testing.conformance.check_result] found: the worst margins, and agreement with the
    reference."""

    max_output_err: float  # largest |output - float64 attention over the reported blocks|
    output_tol: float  # the tolerance it was held to
    same_blocks: bool  # blocks_used equal to the reference's, group by group, in order
    same_stop: bool  # same number of iterations in every group


def _naive_fp32(q_head, keys, values, idx, scale) -> np.ndarray:
    k = keys[idx].astype(np.float32)
    logits = np.float32(scale) * (k @ q_head.astype(np.float32))
    w = np.exp(logits - logits.max())
    return (w @ values[idx].astype(np.float32)) / w.sum()


def check_result(result: Any, q: ArrayLike, keys: ArrayLike, values: ArrayLike, *, method: str = "psa",
                 threshold: float = 0.95, stop: str = DEFAULT_STOP, step: int = 1, k: int = 8, gqa: str = "shared",
                 sink_blocks: int = 0, recent_blocks: int = 0, block_size: int = 16, metadata: str = "cuboid_mean",
                 scale: float | None = None, est_tol: float | None = None, ratio_tol: float = 1e-4,
                 first_chunk: int | str | list[int] | None = None, rank: str = "estimate",
                 kv_layout: str | None = None) -> Conformance:
    """Assert that ``result`` is a valid PSA / top-k execution on these inputs; return the margins.

    Args:
        result: an object with ``output`` (array-like with the shape of ``q``), ``blocks_used``,
            ``iterations`` and ``stop_reason`` laid out as [`psa_ref.AttentionResult`][psa_ref.AttentionResult].
        q: the query, ``[Hq, D]`` or ``[D]``, on the host.
        keys: ``[Hkv, T, D]`` (or ``[T, Hkv, D]`` with ``kv_layout="NHD"``) or ``[T, D]``, on the host.
        values: the shape of ``keys``.
        method: ``"psa"`` or ``"topk"``; the other keywords are the call's options.
        est_tol: how far the implementation's estimates may be from the reference's; default:
            float16 metadata rounding, ``2^-10 * scale * max_j sum_i |q_i| (|lo_ij| + |hi_ij|)``.
        ratio_tol: how far a stop-rule ratio may be from the reference's (float32 masses).
        first_chunk: the call's ``first_chunk`` (psa): the chunk boundaries are the reference's, the
            predicted size computed from the reference's estimates and order; or one size per group
            as the implementation chose it (a GPU predicts from float32 estimates, which may move a
            boundary that lies within rounding of ``threshold``: check those sizes apart).
        rank: the call's ``rank`` (psa; top-k always ranks by the estimate): I4 is checked on that ranking
            key ([`group_rank_key`][psa_ref.scoring.group_rank_key]).
        kv_layout: the layout of 3-D ``keys`` and ``values``, as
            [`KVBlocks.from_dense`][psa_ref.KVBlocks.from_dense] takes it (None: HND, warning where the
            shape looks like NHD).

    Raises:
        AssertionError: naming the invariant, the group and the numbers that broke it.
        ValueError, TypeError: inputs that are not a valid call (an unknown ``method``, shapes that do
            not fit together), before anything is compared.
    """
    _validate.choice(method, "method", ("psa", "topk"))
    k3 = _validate.float_array(keys, "keys")
    v3 = _validate.float_array(values, "values")
    _validate.kv_shapes(k3.shape, v3.shape)
    k3, v3 = to_hnd(k3, v3, kv_layout)
    single = np.ndim(q) == 1
    if single != (k3.ndim == 2):
        raise ValueError(f"q of shape {np.shape(q)} needs keys of {'[T, D]' if single else '[Hkv, T, D]'}, "
                         f"got keys of shape {tuple(np.shape(keys))}")
    k3, v3 = k3.reshape((-1,) + k3.shape[-2:]), v3.reshape((-1,) + v3.shape[-2:])
    q2 = _validate.query(np.atleast_2d(q) if single else q, k3.shape[2], k3.shape[0], False)
    hq, d = q2.shape
    hkv = k3.shape[0]
    g = hq // hkv
    scale = 1.0 / np.sqrt(d) if scale is None else float(scale)
    blocks = KVBlocks.from_dense(k3, v3, block_size=block_size, metadata=metadata, kv_layout="HND")
    n = blocks.num_blocks
    scores = estimate(q2, blocks, scale)
    if est_tol is None:
        mag = np.abs(blocks.meta["lo"]) + np.abs(blocks.meta["hi"])  # [Hkv, N, D]
        est_tol = FP16_META_REL * scale * max(float((np.abs(q2[h]) * mag[kv]).sum(-1).max())
                                               for h, kv in enumerate(kv_head_of(hq, hkv)))
    groups = [[h] for h in range(hq)] if gqa == "per_head" else [list(range(c * g, (c + 1) * g)) for c in range(hkv)]
    used = [np.asarray(result.blocks_used, np.int64)] if single else [np.asarray(u, np.int64)
                                                                       for u in result.blocks_used]
    iters = np.atleast_1d(result.iterations)
    reasons = [result.stop_reason] if single else list(result.stop_reason)
    out = np.atleast_2d(np.asarray(result.output, np.float64))
    assert len(used) == len(groups), f"blocks_used has {len(used)} groups, expected {len(groups)}"
    forced = forced_blocks(n, sink_blocks, recent_blocks)

    stop = resolve_stop(stop, metadata)
    per_group = first_chunk if isinstance(first_chunk, (list, tuple, np.ndarray)) else None
    first_chunk = None if per_group is not None else check_first_chunk(first_chunk, stop)
    ref = (attention(q2 if not single else q2[0], blocks, threshold, scale=scale, stop=stop, step=step, gqa=gqa,
                     sink_blocks=sink_blocks, recent_blocks=recent_blocks, first_chunk=first_chunk, rank=rank)
           if method == "psa" else
           topk_attention(q2 if not single else q2[0], blocks, k, scale=scale, gqa=gqa, sink_blocks=sink_blocks,
                          recent_blocks=recent_blocks))
    ref_used = [ref.blocks_used] if single else ref.blocks_used
    worst, worst_tol = 0.0, 0.0
    for gi, (heads, u) in enumerate(zip(groups, used)):
        kv = heads[0] // g
        assert u.size == len(set(u.tolist())) and (u.size == 0 or (u.min() >= 0 and u.max() < n)), \
            f"group {gi}: blocks_used {u.tolist()} has repeats or indices outside [0, {n})"
        # I1: output = attention over the reported blocks, within 2x a naive float32 attention's error
        idx = blocks.token_indices(u)
        for h in heads:
            logits = scale * (k3[kv, idx] @ q2[h])
            w = np.exp(logits - logits.max())
            exact = (w @ v3[kv, idx]) / w.sum()
            naive = np.abs(_naive_fp32(q2[h], k3[kv], v3[kv], idx, scale) - exact).max()
            tol = 2 * naive + 1e-6 * np.abs(v3[kv]).max()
            err = np.abs(out[h] - exact).max()
            assert np.isfinite(out[h]).all(), f"head {h}: non-finite output"
            assert err <= tol, f"I1 head {h}: output error {err:.3e} > tolerance {tol:.3e}"
            if err > worst:
                worst, worst_tol = err, tol
        # I4: order
        nf = forced.size if method == "psa" or u.size >= forced.size else u.size
        assert set(u[:nf].tolist()) == set(forced[:nf].tolist()), f"group {gi}: forced blocks not first: {u.tolist()}"
        s = group_rank_key(scores[heads], blocks.block_lengths, rank if method == "psa" else "estimate")
        # a share key is an estimate minus its head's log-sum-exp of estimates: both may be off by est_tol
        key_tol = est_tol * (2 if rank == "share" and method == "psa" and len(heads) > 1 else 1)
        ranked = u[nf:]
        if ranked.size > 1:
            rise = np.diff(s[ranked]).max()
            assert rise <= key_tol, f"I4 group {gi}: the rank key rises by {rise:.3e} > {key_tol:.3e} along the order"
        rest = np.setdiff1d(np.arange(n), u)
        if ranked.size and rest.size:
            gap = s[rest].max() - s[ranked].min()
            assert gap <= key_tol, f"I4 group {gi}: a skipped block's rank key exceeds an attended one's by {gap:.3e}"
        if method == "topk":  # I6
            want = min(k, n)
            assert u.size == want, f"I6 group {gi}: {u.size} blocks, expected {want}"
            continue
        # I5: stop
        first = (int(per_group[gi]) if per_group is not None else
                 first_chunk_size(first_chunk, scores[heads], processing_order(s, forced), forced.size,
                                  blocks.block_lengths, threshold, stop))
        chunks = split_chunks(u, forced.size, step, first)
        assert len(chunks) == iters[gi], f"group {gi}: {iters[gi]} iterations but blocks_used makes {len(chunks)}"
        if stop in ("sketch", "sketch_avg"):  # mass test and share test (margin in nats), from the reference's
            order = processing_order(s, forced)  # estimates and order; sketch_avg's lambda is c / N
            rest_order = [j for j in order if j not in set(u.tolist())]
            nxt = int(rest_order[0]) if rest_order else None
            share = SKETCH_AVG_SHARE / n if stop == "sketch_avg" else SKETCH_NEXT_SHARE
            frac, margin = np.array([oracle_sketch(log_block_mass(q2[h], k3[kv], block_size, scale), chunks,
                                                   scores[h] + np.log(blocks.block_lengths), forced.size, nxt,
                                                   share=share)
                                     for h in heads]).transpose(1, 0, 2)
        else:
            frac = np.array([oracle_fractions(stop, log_block_mass(q2[h], k3[kv], block_size, scale), chunks,
                                              brute_force_bound(q2[h], k3[kv], block_size, scale), blocks.block_lengths)
                             for h in heads])
            margin = np.full_like(frac, np.inf)
        if threshold < 1:
            early = np.flatnonzero(((frac[:, :-1] >= threshold + ratio_tol) & (margin[:, :-1] > ratio_tol)).all(axis=0))
            assert early.size == 0, f"I5 group {gi}: the rule already held at boundary {early[0]} ({frac[:, early[0]]})"
        if reasons[gi] == "threshold":
            assert ((frac[:, -1] >= threshold - ratio_tol) & (margin[:, -1] > -ratio_tol)).all(), \
                f"I5 group {gi}: stopped where the rule does not hold ({frac[:, -1]} < {threshold})"
        else:
            assert reasons[gi] == "exhausted" and u.size == n, f"group {gi}: reason {reasons[gi]!r} with {u.size}/{n}"
    same_blocks = all(np.array_equal(a, b) for a, b in zip(used, ref_used))
    same_stop = bool(np.array_equal(iters, np.atleast_1d(ref.iterations)))
    return Conformance(worst, worst_tol, same_blocks, same_stop)
