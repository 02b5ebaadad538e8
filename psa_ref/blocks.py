"""Stage 1: split a KV cache into blocks and build per-block metadata.

Dimension letters (used in every docstring): ``Hkv`` KV heads, ``T`` tokens, ``S`` block
size, ``N = ceil(T / S)`` blocks, ``D`` head dimension. Block ``j`` holds tokens
``j*S .. min((j+1)*S, T) - 1``; only the last block may be partial.

Metadata kinds (the estimate each one gives is in :mod:`psa_ref.scoring`):

* ``"cuboid_mean"`` (ArkVale, the default): per channel, the centre ``c = (max + min) / 2``
  of the block's keys and the radius ``r = mean_t |k_t - c|``.
* ``"minmax"`` (Quest): per channel, ``lo = min_t k_t`` and ``hi = max_t k_t``.
* ``"mean"``: the mean key of the block.

Whatever the kind, ``lo``/``hi`` are always kept: ``stop="certified"`` needs the
min/max upper bound beside any ranking metadata.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from numpy.typing import ArrayLike

from . import _validate

METADATA_KINDS = ("cuboid_mean", "minmax", "mean")


def block_metadata(keys: np.ndarray, kind: str) -> dict[str, np.ndarray]:
    """Metadata of one block of one head.

    Args:
        keys: ``[n, D]`` float64, the ``1 <= n <= S`` keys of the block.
        kind: one of :data:`METADATA_KINDS`.

    Returns:
        ``{"lo", "hi"}`` always, plus ``{"center", "radius"}`` for ``cuboid_mean`` or
        ``{"mean"}`` for ``mean``; each ``[D]`` float64.
    """
    lo, hi = keys.min(axis=0), keys.max(axis=0)
    meta = {"lo": lo, "hi": hi}
    if kind == "cuboid_mean":
        center = (hi + lo) / 2.0
        meta["center"] = center
        meta["radius"] = np.abs(keys - center).mean(axis=0)
    elif kind == "mean":
        meta["mean"] = keys.mean(axis=0)
    return meta


@dataclass(frozen=True, eq=False)
class KVBlocks:
    """A KV cache split into blocks of ``block_size`` tokens, with per-block metadata.

    Build one with :meth:`from_dense`. All arrays are float64 copies of the input.

    Attributes:
        keys: ``[Hkv, T, D]`` float64.
        values: ``[Hkv, T, D]`` float64.
        block_size: ``S``.
        metadata: the ranking metadata kind, one of :data:`METADATA_KINDS`.
        meta: name -> ``[Hkv, N, D]`` float64 arrays; always ``lo`` and ``hi``, plus the
            arrays of :func:`block_metadata` for ``metadata``.
        single_head: True when built from ``[T, D]`` keys (then ``Hkv == 1``).
    """

    keys: np.ndarray
    values: np.ndarray
    block_size: int
    metadata: str
    meta: dict[str, np.ndarray] = field(repr=False)
    single_head: bool

    @classmethod
    def from_dense(cls, keys: ArrayLike, values: ArrayLike, *, block_size: int = 16, metadata: str = "cuboid_mean") -> "KVBlocks":
        """Split dense keys and values into blocks and compute their metadata.

        Args:
            keys: ``[T, D]`` (one head) or ``[Hkv, T, D]``, float16/32/64, finite.
            values: same shape as ``keys``.
            block_size: ``S >= 1`` tokens per block; the last block holds ``T - (N-1)*S``.
            metadata: ``"cuboid_mean"`` (default), ``"minmax"`` or ``"mean"``.

        Raises:
            TypeError: non-float dtypes or a non-integer ``block_size``.
            ValueError: NaN/Inf, mismatched shapes, empty KV, ``block_size < 1``,
                unknown ``metadata``.
        """
        block_size = _validate.integer(block_size, "block_size", minimum=1)
        metadata = _validate.choice(metadata, "metadata", METADATA_KINDS)
        k = _validate.float_array(keys, "keys")
        v = _validate.float_array(values, "values")
        _validate.kv_shapes(k.shape, v.shape)
        single_head = k.ndim == 2
        if single_head:
            k, v = k[None], v[None]
        hkv, t, d = k.shape

        n = -(-t // block_size)
        per_block = [
            [block_metadata(k[h, j * block_size : (j + 1) * block_size], metadata) for j in range(n)]
            for h in range(hkv)
        ]
        meta = {name: np.array([[m[name] for m in row] for row in per_block]) for name in per_block[0][0]}
        return cls(keys=k, values=v, block_size=block_size, metadata=metadata, meta=meta, single_head=single_head)

    @property
    def num_heads(self) -> int:
        """``Hkv``, the number of KV heads."""
        return self.keys.shape[0]

    @property
    def num_tokens(self) -> int:
        """``T``."""
        return self.keys.shape[1]

    @property
    def head_dim(self) -> int:
        """``D``."""
        return self.keys.shape[2]

    @property
    def num_blocks(self) -> int:
        """``N = ceil(T / S)``."""
        return -(-self.num_tokens // self.block_size)

    def block_slice(self, j: int) -> slice:
        """Token positions of block ``j``."""
        return slice(j * self.block_size, min((j + 1) * self.block_size, self.num_tokens))

    @property
    def block_lengths(self) -> np.ndarray:
        """``[N]`` int64: tokens in each block (``S`` except maybe the last)."""
        n = np.full(self.num_blocks, self.block_size, dtype=np.int64)
        n[-1] = self.num_tokens - (self.num_blocks - 1) * self.block_size
        return n

    def token_indices(self, block_ids) -> np.ndarray:
        """Positions of every token in ``block_ids``, block by block, in the given order."""
        block_ids = np.asarray(block_ids, dtype=np.int64).reshape(-1)
        if block_ids.size == 0:
            return np.zeros(0, dtype=np.int64)
        return np.concatenate([np.arange(self.num_tokens)[self.block_slice(int(j))] for j in block_ids])
