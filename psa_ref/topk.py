"""Fixed-budget baseline: attend to the ``k`` blocks with the highest estimates (Quest, ArkVale)."""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from . import _validate
from ._problem import assemble, prepare
from .blocks import KVBlocks
from .dense import softmax_attention
from .scoring import processing_order
from .result import AttentionResult


def topk_attention(
    q: ArrayLike,
    blocks: KVBlocks,
    k: int = 8,
    *,
    scale: float | None = None,
    gqa: str = "shared",
    sink_blocks: int = 0,
    recent_blocks: int = 0,
    exact_mass: bool = False,
) -> AttentionResult:
    """Attention over the ``min(k, N)`` blocks with the highest criticality estimates.

    Args:
        q: ``[D]`` or ``[Hq, D]``, as for [`psa_ref.attention`][psa_ref.attention].
        blocks: the KV cache, from [`KVBlocks.from_dense`][psa_ref.KVBlocks.from_dense].
        k: the block budget, ``k >= 1``. Sink and recent blocks count towards it, so
            ``k`` must be at least their number.
        scale: as for [`psa_ref.attention`][psa_ref.attention].
        gqa: as for [`psa_ref.attention`][psa_ref.attention].
        sink_blocks: as for [`psa_ref.attention`][psa_ref.attention].
        recent_blocks: as for [`psa_ref.attention`][psa_ref.attention].
        exact_mass: as for [`psa_ref.attention`][psa_ref.attention].

    Returns:
        [`AttentionResult`][psa_ref.AttentionResult] with ``stop_reason="budget"``, one iteration and
            ``mass_estimate`` NaN; ``blocks_used`` lists the forced blocks, then the rest by
            estimate (descending, ties to the lower index).
    """
    k = _validate.integer(k, "k", minimum=1)
    p = prepare(q, blocks, scale=scale, gqa=gqa, sink_blocks=sink_blocks, recent_blocks=recent_blocks,
                exact_mass=exact_mass)
    if k < p.forced.size:
        raise ValueError(f"k ({k}) must be at least the number of sink and recent blocks ({p.forced.size})")

    out = np.empty_like(p.q)
    used = []
    for grp in p.groups:
        chosen = processing_order(p.scores[grp.q_heads].max(axis=0), p.forced)[:k]
        tokens = blocks.token_indices(chosen)
        for h in grp.q_heads:
            out[h] = softmax_attention(p.q[h], blocks.keys[grp.kv_head, tokens], blocks.values[grp.kv_head, tokens],
                                       p.scale)
        used.append(chosen)
    n = len(p.groups)
    return assemble(p, out, used, [1] * n, ["budget"] * n, np.full(p.q.shape[0], np.nan), exact_mass)
