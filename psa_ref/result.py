"""The result type shared by [`psa_ref.attention`][psa_ref.attention] and
[`psa_ref.topk_attention`][psa_ref.topk_attention]."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class AttentionResult:
    """What a sparse attention call returns.

    Single head (``q [D]``): ``blocks_used`` is one int64 array and the per-head fields
    are scalars. Several heads (``q [Hq, D]``): ``blocks_used``, ``iterations`` and
    ``stop_reason`` have one entry per selection group -- per KV head with
    ``gqa="shared"``, per query head with ``gqa="per_head"`` -- and the mass fields one
    entry per query head.

    Attributes:
        output: float64, the shape of ``q``: softmax attention over the blocks used.
        blocks_used: indices of the blocks attended, in the order processed.
        iterations: chunks processed (top-k: 1).
        stop_reason: ``"threshold"`` (the stop rule held), ``"exhausted"`` (no block
            left) or ``"budget"`` (top-k).
        mass_estimate: the attended mass fraction as the stop rule estimated it when the
            loop ended (``nan`` for top-k, which estimates nothing).
        mass_exact: the true attended mass fraction, when asked for with
            ``exact_mass=True``; else None.
        num_blocks: ``N``, the number of blocks in the cache.
    """

    output: np.ndarray
    blocks_used: np.ndarray | list[np.ndarray]
    iterations: int | np.ndarray
    stop_reason: str | list[str]
    mass_estimate: float | np.ndarray
    mass_exact: float | np.ndarray | None
    num_blocks: int

    @property
    def num_used(self) -> int | np.ndarray:
        """Number of blocks attended: an int (single head) or one per group."""
        if isinstance(self.blocks_used, np.ndarray):
            return int(self.blocks_used.size)
        return np.array([b.size for b in self.blocks_used])
