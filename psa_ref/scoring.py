"""Stage 2 (scoring): criticality estimates from block metadata, and the processing order.

Query head ``h`` reads KV head ``h // G`` with ``G = Hq / Hkv`` (contiguous groups, as
``repeat_interleave`` on the KV heads gives). Every estimate includes the logit scale,
so it is comparable with the logits ``l_t = scale * q . k_t``:

* ``cuboid_mean``: ``scale * (q . c + |q| . r)``
* ``minmax``:      ``scale * sum_i max(q_i hi_i, q_i lo_i)`` -- an upper bound on every
  ``l_t`` of the block
* ``mean``:        ``scale * q . mean``
* ``quant3``:      ``log((1 / n_j) sum_{t in j} exp(scale * q . k^_t))``, the log of the
  block's mean token mass under the sketch logits ``l~_t = scale * q . k^_t`` of the
  dequantised keys ([`psa_ref.blocks.dequantize`][psa_ref.blocks.dequantize]); ``n_j exp(s_j - M)`` is then the
  block's *sketch mass*, the sketch's prediction of ``sum_t exp(l_t - M)`` (used by
  ``stop="sketch"``). Ranking by it ranks blocks by sketch mass per token.
"""

from __future__ import annotations

import numpy as np

from .blocks import KVBlocks, dequantize


def kv_head_of(num_q_heads: int, num_kv_heads: int) -> np.ndarray:
    """``[Hq]`` int: the KV head that each query head attends to."""
    return np.arange(num_q_heads) // (num_q_heads // num_kv_heads)


def upper_bound(q: np.ndarray, blocks: KVBlocks, scale: float) -> np.ndarray:
    """Min/max bound on the logits of every block: ``[Hq, N]`` float64.

    ``q`` is ``[Hq, D]`` float64. For every token ``t`` of block ``j``,
    ``scale * q_h . k_t <= bound[h, j]`` (each channel's product is at most the larger
    of its two products with the channel's extremes).
    """
    kv = kv_head_of(q.shape[0], blocks.num_heads)
    lo, hi = blocks.meta["lo"][kv], blocks.meta["hi"][kv]  # [Hq, N, D]
    return scale * np.maximum(q[:, None, :] * hi, q[:, None, :] * lo).sum(axis=-1)


def estimate(q: np.ndarray, blocks: KVBlocks, scale: float) -> np.ndarray:
    """Criticality estimate of every block for every query head: ``[Hq, N]`` float64.

    ``q`` is ``[Hq, D]`` float64; the formula is the one of ``blocks.metadata``.
    """
    kv = kv_head_of(q.shape[0], blocks.num_heads)
    if blocks.metadata == "minmax":
        return upper_bound(q, blocks, scale)
    if blocks.metadata == "cuboid_mean":
        center, radius = blocks.meta["center"][kv], blocks.meta["radius"][kv]
        return scale * (np.einsum("hd,hnd->hn", q, center) + np.einsum("hd,hnd->hn", np.abs(q), radius))
    if blocks.metadata == "mean":
        return scale * np.einsum("hd,hnd->hn", q, blocks.meta["mean"][kv])
    if blocks.metadata == "quant3":
        return sketch_estimate(q, blocks, scale)
    raise AssertionError(f"unknown metadata {blocks.metadata!r}")  # KVBlocks validated it


def sketch_estimate(q: np.ndarray, blocks: KVBlocks, scale: float) -> np.ndarray:
    """The ``quant3`` estimate, ``[Hq, N]`` float64: log mean token mass of each block's sketch logits.

    One KV head at a time: dequantising its codes reads ``3 S D / 8`` bytes per block, the
    sketch logits cost one ``[N S, D] x [D, G]`` product (as many multiply-adds as the exact
    logits, from 3-bit inputs).
    """
    hq, hkv = q.shape[0], blocks.num_heads
    g = hq // hkv
    n, s = blocks.num_blocks, blocks.block_size
    valid = np.arange(s)[None, :] < blocks.block_lengths[:, None]  # [N, S]: rows past a partial block's end
    out = np.empty((hq, n))
    for kv in range(hkv):
        k_hat = dequantize(blocks.meta["codes"][kv], blocks.meta["lo"][kv], blocks.meta["hi"][kv])  # [N, S, D]
        sketch = scale * np.einsum("nsd,gd->gns", k_hat, q[kv * g : (kv + 1) * g])  # [G, N, S]
        sketch = np.where(valid, sketch, -np.inf)
        top = sketch.max(axis=2, keepdims=True)  # finite: every block has a valid row
        lse = top[..., 0] + np.log(np.exp(sketch - top).sum(axis=2))
        out[kv * g : (kv + 1) * g] = lse - np.log(blocks.block_lengths)
    return out


def rank(scores: np.ndarray) -> np.ndarray:
    """Block indices by score, descending; ties broken by the lower block index.

    ``scores`` is ``[N]``; returns ``[N]`` int64.
    """
    return np.argsort(-scores, kind="stable").astype(np.int64)


def forced_blocks(num_blocks: int, sink_blocks: int, recent_blocks: int) -> np.ndarray:
    """The blocks attended before any ranked one: the first ``sink_blocks``, then the
    last ``recent_blocks`` (each once, in index order within each part)."""
    sinks = list(range(min(sink_blocks, num_blocks)))
    recent = [j for j in range(max(num_blocks - recent_blocks, 0), num_blocks) if j not in sinks]
    return np.array(sinks + recent, dtype=np.int64)


RANKS = ("estimate", "share")


def group_rank_key(scores: np.ndarray, lengths: np.ndarray, rank: str = "estimate") -> np.ndarray:
    """``[N]``: the key a selection group's blocks are ranked by (descending), from its query heads'
    estimates ``scores [G, N]`` and the blocks' token counts ``lengths [N]``.

    ``"estimate"`` (DESIGN.md's shared order): the largest estimate over the group's heads.
    ``"share"``: the largest estimate relative to its head's estimated total,
    ``max_h (s_hj - log sum_i n_i exp(s_hi))``: a block ranks by the biggest share of any one head's
    mass it is estimated to hold, so a head whose logits run lower still gets its heavy blocks early.
    With one head (``gqa="per_head"``) both give the same order.
    """
    if rank == "estimate" or scores.shape[0] == 1:
        return scores.max(axis=0)
    if rank != "share":
        raise ValueError(f"rank must be one of {RANKS}, got {rank!r}")
    total = np.logaddexp.reduce(scores + np.log(np.asarray(lengths, dtype=np.float64)), axis=1, keepdims=True)
    return (scores - total).max(axis=0)


def processing_order(scores: np.ndarray, forced: np.ndarray) -> np.ndarray:
    """The order of Algorithm 1: ``forced`` blocks first, then the rest by [`rank`][psa_ref.rank]."""
    ranked = rank(scores)
    return np.concatenate([forced, ranked[~np.isin(ranked, forced)]]).astype(np.int64)
