"""Stage 1: split a KV cache into blocks and build per-block metadata.

Dimension letters (used in every docstring): ``Hkv`` KV heads, ``T`` tokens, ``S`` block
size, ``N = ceil(T / S)`` blocks, ``D`` head dimension. Block ``j`` holds tokens
``j*S .. min((j+1)*S, T) - 1``; only the last block may be partial.

Metadata kinds (the estimate each one gives is in ``psa_ref.scoring``):

* ``"cuboid_mean"`` (ArkVale, the default): per channel, the centre ``c = (max + min) / 2``
  of the block's keys and the radius ``r = mean_t |k_t - c|``.
* ``"minmax"`` (Quest): per channel, ``lo = min_t k_t`` and ``hi = max_t k_t``.
* ``"mean"``: the mean key of the block.
* ``"quant3"``: ``lo``/``hi`` per channel plus every key of the block quantised to 3 bits
  per channel on the block's own ``[lo, hi]`` grid: ``codes [S, D]`` uint8,
  ``c_ti = clip(floor((k_ti - lo_i) / (hi_i - lo_i) * 8), 0, 7)``, and ``c_ti = 0`` where
  ``hi_i == lo_i`` (then every key of the block has ``k_ti = lo_i`` and the reconstruction is
  exact). Keys are reconstructed at bin centres, ``k^_ti = lo_i + (c_ti + 0.5) / 8 * (hi_i - lo_i)``
  ([`dequantize`][psa_ref.blocks.dequantize]), so ``|k_ti - k^_ti| <= (hi_i - lo_i) / 16``. Rows of a partial last
  block past its end hold code 0 and are never read. Costs ``2 D`` + ``3 S D / 8`` values per block:
  640 B in float16 at ``D = 64, S = 16`` (``cuboid_mean``: 256 B; the block's keys and values: 4096 B).

Whatever the kind, ``lo``/``hi`` are always kept: ``stop="certified"`` needs the
min/max upper bound beside any ranking metadata.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import ArrayLike

from . import _validate

METADATA_KINDS = ("cuboid_mean", "minmax", "mean", "quant3")
QUANT_LEVELS = 8  # 3 bits per channel and token (metadata "quant3")
KV_LAYOUTS = ("HND", "NHD")  # [Hkv, T, D] (ours, the default) or [T, Hkv, D] (vLLM's and FlashInfer's default)


class KVLayoutWarning(UserWarning):
    """Keys whose shape suggests the other ``kv_layout`` (see ``to_hnd``)."""


def to_hnd(keys, values, kv_layout: str | None, *, stacklevel: int = 3):
    """Check ``kv_layout`` and return ``keys, values`` in the HND layout ``[Hkv, T, D]``.

    Shared by ``psa_ref.KVBlocks.from_dense`` and ``psa_fast.KVBlocks.from_dense``: it needs only
    ``ndim``, ``shape`` and ``transpose``, so NumPy and CuPy arrays both work. NHD arrays come
    back as transposed views (not contiguous); ``[T, D]`` arrays (one head) come back unchanged,
    whatever the layout.

    What the shapes can tell: nothing for certain, since ``[a, b, D]`` is a valid cache in both
    layouts. Read as HND, an NHD cache has ``Hkv' = T`` heads of ``T' = Hkv`` tokens, more heads
    than tokens whenever the cache holds more tokens than heads. So when ``kv_layout`` is left out
    (None) and 3-D keys have ``shape[0] > shape[1]``, this warns (``KVLayoutWarning``),
    naming ``kv_layout``. That catches every NHD cache with ``T > Hkv`` (the issue's
    ``T = 16, Hkv = 8``: ``[16, 8, D]``) and never fires on an HND cache with ``T >= Hkv``.
    It cannot catch an NHD cache with ``T <= Hkv`` (e.g. 4 tokens of 8 heads): that shape is also
    an ordinary HND cache. An explicit ``kv_layout`` is trusted and never warns.

    Args:
        keys: ``[T, D]``, or ``[Hkv, T, D]`` (HND) / ``[T, Hkv, D]`` (NHD).
        values: the shape of ``keys``.
        kv_layout: ``"HND"``, ``"NHD"`` or None (HND, with the check above).
        stacklevel: passed to ``warnings.warn`` (3 points at the caller of ``from_dense``).

    Raises:
        ValueError: ``kv_layout`` not None, ``"HND"`` or ``"NHD"``.
    """
    if kv_layout is not None:
        _validate.choice(kv_layout, "kv_layout", KV_LAYOUTS)
    if keys.ndim != 3:
        return keys, values
    if kv_layout == "NHD":
        return keys.transpose(1, 0, 2), values.transpose(1, 0, 2)
    a, b, d = keys.shape
    if kv_layout is None and a > b:
        warnings.warn(
            f"keys of shape {tuple(keys.shape)} are read as [Hkv, T, D] (kv_layout='HND', the default): "
            f"{a} KV heads of {b} tokens, more heads than tokens. If they are [T, Hkv, D] ({a} tokens of {b} "
            "heads, the NHD layout of vLLM and FlashInfer), pass kv_layout='NHD'; pass kv_layout='HND' to "
            "confirm the layout and silence this warning.",
            KVLayoutWarning, stacklevel=stacklevel,
        )
    return keys, values


def quantize(keys: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """3-bit codes of ``keys [..., n, D]`` on the per-channel grid ``lo, hi [..., D]``: ``[..., n, D]`` uint8.

    ``c = clip(floor((k - lo) / (hi - lo) * 8), 0, 7)``; 0 on channels where ``hi == lo``.
    """
    span = (hi - lo)[..., None, :]
    flat = span == 0
    with np.errstate(divide="ignore", invalid="ignore"):
        code = np.floor((keys - lo[..., None, :]) / np.where(flat, 1.0, span) * QUANT_LEVELS)
    return np.clip(np.where(flat, 0.0, code), 0, QUANT_LEVELS - 1).astype(np.uint8)


def dequantize(codes: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Keys reconstructed at bin centres: ``lo + (codes + 0.5) / 8 * (hi - lo)``, float64.

    ``codes`` is ``[..., n, D]``; ``lo``, ``hi`` are ``[..., D]``.
    """
    return lo[..., None, :] + (codes + 0.5) / QUANT_LEVELS * (hi - lo)[..., None, :]


def block_metadata(keys: np.ndarray, kind: str, *, block_size: int | None = None) -> dict[str, np.ndarray]:
    """Metadata of one block of one head.

    Args:
        keys: ``[n, D]`` float64, the ``1 <= n <= S`` keys of the block.
        kind: one of ``METADATA_KINDS``.
        block_size: ``S`` (default ``n``): the rows of ``quant3``'s ``codes``; rows past
            ``n`` hold 0.

    Returns:
        ``{"lo", "hi"}`` always, plus ``{"center", "radius"}`` for ``cuboid_mean``,
            ``{"mean"}`` for ``mean``, each ``[D]`` float64; or ``{"codes"}`` ``[S, D]`` uint8
            for ``quant3``.
    """
    lo, hi = keys.min(axis=0), keys.max(axis=0)
    meta = {"lo": lo, "hi": hi}
    if kind == "cuboid_mean":
        center = (hi + lo) / 2.0
        meta["center"] = center
        meta["radius"] = np.abs(keys - center).mean(axis=0)
    elif kind == "mean":
        meta["mean"] = keys.mean(axis=0)
    elif kind == "quant3":
        codes = np.zeros((max(block_size or 0, keys.shape[0]), keys.shape[1]), dtype=np.uint8)
        codes[: keys.shape[0]] = quantize(keys, lo, hi)
        meta["codes"] = codes
    return meta


@dataclass(frozen=True, eq=False, repr=False)
class KVBlocks:
    """A KV cache split into blocks of ``block_size`` tokens, with per-block metadata.

    Build one with [`from_dense`][psa_ref.KVBlocks.from_dense]. All arrays are float64 copies of the input.

    Attributes:
        keys: ``[Hkv, T, D]`` float64.
        values: ``[Hkv, T, D]`` float64.
        block_size: ``S``.
        metadata: the ranking metadata kind, one of ``METADATA_KINDS``.
        meta: name -> ``[Hkv, N, D]`` float64 arrays; always ``lo`` and ``hi``, plus the
            arrays of [`block_metadata`][psa_ref.blocks.block_metadata] for ``metadata`` (``quant3``'s ``codes`` is
            ``[Hkv, N, S, D]`` uint8).
        single_head: True when built from ``[T, D]`` keys (then ``Hkv == 1``).
    """

    keys: np.ndarray
    values: np.ndarray
    block_size: int
    metadata: str
    meta: dict[str, np.ndarray] = field(repr=False)
    single_head: bool

    @classmethod
    def from_dense(cls, keys: ArrayLike, values: ArrayLike, *, block_size: int = 16, metadata: str = "cuboid_mean",
                   kv_layout: str | None = None) -> "KVBlocks":
        """Split dense keys and values into blocks and compute their metadata.

        Args:
            keys: ``[T, D]`` (one head), or several heads in ``kv_layout``: ``[Hkv, T, D]`` (HND,
                the default) or ``[T, Hkv, D]`` (NHD); float16/32/64, finite.
            values: same shape as ``keys``.
            block_size: ``S >= 1`` tokens per block; the last block holds ``T - (N-1)*S``.
            metadata: ``"cuboid_mean"`` (default), ``"minmax"``, ``"mean"`` or ``"quant3"``.
            kv_layout: ``"HND"`` (``[Hkv, T, D]``), ``"NHD"`` (``[T, Hkv, D]``, vLLM's and
                FlashInfer's default, transposed here) or None: HND, with a
                ``KVLayoutWarning`` when 3-D keys hold more heads than tokens, the mark of an
                NHD cache read as HND (see ``psa_ref.blocks.to_hnd`` for what the shapes can
                and cannot tell). Ignored for ``[T, D]`` keys. The blocks are HND either way.

        Raises:
            TypeError: non-float dtypes or a non-integer ``block_size``.
            ValueError: NaN/Inf, mismatched shapes, empty KV, ``block_size < 1``,
                unknown ``metadata`` or ``kv_layout``.
        """
        block_size = _validate.integer(block_size, "block_size", minimum=1)
        metadata = _validate.choice(metadata, "metadata", METADATA_KINDS)
        k = _validate.float_array(keys, "keys")
        v = _validate.float_array(values, "values")
        _validate.kv_shapes(k.shape, v.shape)
        k, v = (np.ascontiguousarray(a) for a in to_hnd(k, v, kv_layout))
        single_head = k.ndim == 2
        if single_head:
            k, v = k[None], v[None]
        hkv, t, d = k.shape

        n = -(-t // block_size)
        per_block = [
            [block_metadata(k[h, j * block_size : (j + 1) * block_size], metadata, block_size=block_size)
             for j in range(n)]
            for h in range(hkv)
        ]
        meta = {name: np.array([[m[name] for m in row] for row in per_block]) for name in per_block[0][0]}
        return cls(keys=k, values=v, block_size=block_size, metadata=metadata, meta=meta, single_head=single_head)

    def __repr__(self) -> str:
        """Shapes and settings only (the arrays would print thousands of characters)."""
        heads = "" if self.single_head else f"Hkv={self.num_heads}, "
        shape = f"{heads}T={self.num_tokens}, D={self.head_dim}"
        return (f"psa_ref.KVBlocks({shape}, block_size={self.block_size}, num_blocks={self.num_blocks}, "
                f"metadata={self.metadata!r}, dtype={self.keys.dtype})")

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
        """Positions of every token in ``block_ids`` (each in ``[0, N)``), block by block, in the given order.

        Raises:
            ValueError: a block id outside ``[0, N)``.
        """
        block_ids = np.asarray(block_ids, dtype=np.int64).reshape(-1)
        if block_ids.size and not (0 <= block_ids.min() and block_ids.max() < self.num_blocks):
            raise ValueError(f"block ids must lie in [0, {self.num_blocks}), "
                             f"got {block_ids.min()} .. {block_ids.max()}")
        tokens = (block_ids[:, None] * self.block_size + np.arange(self.block_size)).reshape(-1)
        return tokens[tokens < self.num_tokens]  # only the last block may be partial
