"""KV cache manager, part 1: the host store, where every KV block lives.

The host store is the authoritative copy of the KV cache (host memory, pinned on GPU
runs). A GPU pool (``psa_ref.kvcache.pool``) caches some of its blocks; evicting a block from a
pool never loses data, because the host store still holds it.

A block is addressed by a [`BlockKey`][psa_ref.kvcache.store.BlockKey] ``(request, layer, kv_head, block)`` and holds
up to ``S`` tokens of K and V of one KV head: ``2 * S * D * itemsize`` bytes. Decoding
appends one token per layer at a time: the last block of each ``(request, layer)`` fills
up, then a new block starts. Block metadata (``lo``/``hi`` always, plus the ranking
metadata) is updated for the blocks a write touches, never rebuilt for the whole cache:

* ``lo``, ``hi``: running minimum and maximum, exactly those of
  [`psa_ref.KVBlocks.from_dense`][psa_ref.KVBlocks.from_dense];
* ``center = (hi + lo) / 2`` and ``radius = mean_t |k_t - center|`` (``cuboid_mean``): the
  radius depends on the centre, which moves as tokens arrive, so it is recomputed from
  the block's ``<= S`` tokens whenever the block changes;
* ``mean``: a running sum divided by the token count.

Metadata is computed in float64 from the stored tokens (so from the same values a
[`KVBlocks`][psa_ref.KVBlocks] built from them would see), and it stays resident: pools move
only KV content.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Hashable, NamedTuple

import numpy as np
from numpy.typing import ArrayLike

from .. import _validate
from ..blocks import METADATA_KINDS, KVBlocks

STORE_METADATA = ("cuboid_mean", "minmax", "mean")  # quant3's per-token codes are not kept here yet

STORE_DTYPES = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))


class BlockKey(NamedTuple):
    """The address of one KV block of one KV head: ``S`` tokens of K and V."""

    request: Hashable
    layer: int
    kv_head: int
    block: int


@dataclass
class _Sequence:
    """The KV cache of one (request, layer): ``[Hkv, capacity, D]`` buffers that double
    when full, and ``[Hkv, block capacity, D]`` metadata arrays, all filled up to
    ``num_tokens`` / ``num_blocks``."""

    keys: np.ndarray
    values: np.ndarray
    meta: dict[str, np.ndarray]
    key_sum: np.ndarray | None  # running sum of each block's keys (metadata "mean")
    num_tokens: int = 0


class HostStore:
    """Authoritative storage of every KV block, keyed by ``(request, layer, kv_head, block)``.

    Args:
        num_layers: ``L``, the layers of the model (``0 .. L-1``).
        num_kv_heads: ``Hkv``.
        head_dim: ``D``.
        block_size: ``S``, tokens per block.
        metadata: the ranking metadata kept per block, one of
            ``psa_ref.METADATA_KINDS``; ``lo``/``hi`` are always kept.
        dtype: float16 (default, as served), float32 or float64: the dtype of the stored
            K and V, and so of every pool slot. Tokens are cast to it on the way in.

    Requests are created by their first [`append`][psa_ref.kvcache.store.HostStore.append] or
    [`extend`][psa_ref.kvcache.store.HostStore.extend] and deleted by [`remove`][psa_ref.kvcache.store.HostStore.remove]
    (a finished request). Any hashable value names a request.
    """

    def __init__(self, *, num_layers: int, num_kv_heads: int, head_dim: int, block_size: int = 16,
                 metadata: str = "cuboid_mean", dtype: np.dtype | type = np.float16):
        self.num_layers = _validate.integer(num_layers, "num_layers", minimum=1)
        self.num_kv_heads = _validate.integer(num_kv_heads, "num_kv_heads", minimum=1)
        self.head_dim = _validate.integer(head_dim, "head_dim", minimum=1)
        self.block_size = _validate.integer(block_size, "block_size", minimum=1)
        self.metadata = _validate.choice(metadata, "metadata", METADATA_KINDS)
        if self.metadata not in STORE_METADATA:
            raise ValueError(f"metadata={self.metadata!r} is not kept by the host store (it stores per-block "
                             f"summaries, not per-token codes); use one of {', '.join(STORE_METADATA)}")
        try:
            self.dtype = np.dtype(dtype)
        except TypeError:
            raise TypeError(f"dtype must be float16, float32 or float64, got {dtype!r}") from None
        if self.dtype not in STORE_DTYPES:
            raise TypeError(f"dtype must be float16, float32 or float64, got {self.dtype}")
        self._seqs: dict[Hashable, list[_Sequence]] = {}
        self._pools = weakref.WeakSet()  # pools caching our blocks, told about writes and removals

    # --- sizes ------------------------------------------------------------------------------

    @property
    def bytes_per_token(self) -> int:
        """K and V of one token of one KV head: ``2 * D * itemsize``."""
        return 2 * self.head_dim * self.dtype.itemsize

    @property
    def bytes_per_block(self) -> int:
        """One full block of one KV head, the size of a pool slot: ``2 * S * D * itemsize``."""
        return self.block_size * self.bytes_per_token

    @property
    def requests(self) -> tuple:
        """The requests held, in the order they were created."""
        return tuple(self._seqs)

    def __contains__(self, request) -> bool:
        return request in self._seqs

    def num_tokens(self, request, layer: int) -> int:
        """``T`` of one (request, layer)."""
        return self._seq(request, layer).num_tokens

    def num_blocks(self, request, layer: int) -> int:
        """``N = ceil(T / S)`` of one (request, layer)."""
        return -(-self.num_tokens(request, layer) // self.block_size)

    def total_blocks(self) -> int:
        """Blocks held for every request, layer and KV head: the pool slots the whole cache would fill."""
        return self.num_kv_heads * sum(-(-s.num_tokens // self.block_size) for seqs in self._seqs.values()
                                       for s in seqs)

    def block_length(self, key: BlockKey) -> int:
        """Tokens in block ``key`` (``S``, except the last block of a (request, layer))."""
        seq = self._seq(key.request, key.layer)
        n = seq.num_tokens - key.block * self.block_size
        if not (0 <= key.kv_head < self.num_kv_heads) or key.block < 0 or n <= 0:
            raise ValueError(f"{tuple(key)} is not in the host store: request {key.request!r} layer {key.layer} has "
                             f"{self.num_kv_heads} KV heads and {self.num_blocks(key.request, key.layer)} blocks")
        return min(n, self.block_size)

    # --- writing ----------------------------------------------------------------------------

    def append(self, request: Hashable, layer: int, keys: ArrayLike, values: ArrayLike) -> None:
        """Append one decoded token to ``(request, layer)``.

        Args:
            request: any hashable; created on first use.
            layer: ``0 <= layer < L``.
            keys: ``[Hkv, D]`` float16/32/64, the new token's key for each KV head.
            values: ``[Hkv, D]``, likewise.
        """
        k = self._tokens(keys, "keys", 2)
        v = self._tokens(values, "values", 2)
        self.extend(request, layer, k[:, None], v[:, None])

    def extend(self, request: Hashable, layer: int, keys: ArrayLike, values: ArrayLike) -> None:
        """Append ``T' >= 1`` tokens to ``(request, layer)`` at once (prefill).

        Args:
            request: any hashable; created on first use.
            layer: ``0 <= layer < L``.
            keys: ``[Hkv, T', D]`` float16/32/64.
            values: ``[Hkv, T', D]``.

        Raises:
            TypeError: non-float tokens.
            ValueError: wrong shapes, no token, NaN/Inf (also after the cast to ``dtype``:
                float16 overflows above 65504), a layer out of range.
        """
        self._check_layer(layer)
        k = self._tokens(keys, "keys", 3)
        v = self._tokens(values, "values", 3)
        if v.shape != k.shape:
            raise ValueError(f"values must have the same shape as keys {k.shape}, got {v.shape}")
        if k.shape[1] == 0:
            raise ValueError("keys must hold at least one token, got shape " + str(k.shape))
        if request not in self._seqs:
            self._seqs[request] = [self._new_sequence() for _ in range(self.num_layers)]
        seq = self._seqs[request][layer]
        start, count = seq.num_tokens, k.shape[1]
        self._reserve(seq, start + count)
        seq.keys[:, start : start + count] = k
        seq.values[:, start : start + count] = v
        seq.num_tokens = start + count
        first, last = start // self.block_size, (start + count - 1) // self.block_size
        for j in range(first, last + 1):
            self._update_metadata(seq, j, max(start, j * self.block_size))
        for pool in list(self._pools):
            pool._written(request, layer, first, last)

    def remove(self, request) -> None:
        """Delete a finished request; every pool caching its blocks frees their slots."""
        if request not in self._seqs:
            raise ValueError(f"request {request!r} is not in the host store")
        del self._seqs[request]
        for pool in list(self._pools):
            pool._removed(request)

    # --- reading ----------------------------------------------------------------------------

    def read(self, key: BlockKey) -> tuple[np.ndarray, np.ndarray]:
        """The content of one block: ``(keys [n, D], values [n, D])`` in ``dtype``, ``n <= S``.

        Read-only views, valid until the next write to the same (request, layer).
        """
        n = self.block_length(key)
        seq = self._seqs[key.request][key.layer]
        span = slice(key.block * self.block_size, key.block * self.block_size + n)
        k, v = seq.keys[key.kv_head, span], seq.values[key.kv_head, span]
        k.flags.writeable = v.flags.writeable = False
        return k, v

    def block_meta(self, request, layer: int) -> dict[str, np.ndarray]:
        """The resident metadata of one (request, layer): name -> ``[Hkv, N, D]`` float64 (views)."""
        seq = self._seq(request, layer)
        n = self.num_blocks(request, layer)
        return {name: a[:, :n] for name, a in seq.meta.items()}

    def kv_blocks(self, request, layer: int) -> KVBlocks:
        """A [`KVBlocks`][psa_ref.KVBlocks] of one (request, layer), for [`psa_ref.attention`][psa_ref.attention].

        Keys and values ``[Hkv, T, D]`` are float64 copies of the stored tokens; the
        metadata is the store's incremental metadata (copied), not recomputed.
        """
        seq = self._seq(request, layer)
        t = seq.num_tokens
        if t == 0:
            raise ValueError(f"request {request!r} layer {layer} holds no token yet")
        return KVBlocks(keys=seq.keys[:, :t].astype(np.float64), values=seq.values[:, :t].astype(np.float64),
                        block_size=self.block_size, metadata=self.metadata,
                        meta={name: a.copy() for name, a in self.block_meta(request, layer).items()},
                        single_head=False)

    # --- internals --------------------------------------------------------------------------

    def _attach(self, pool) -> None:
        self._pools.add(pool)

    def _check_layer(self, layer) -> int:
        if isinstance(layer, (bool, np.bool_)) or not isinstance(layer, (int, np.integer)):
            raise TypeError(f"layer must be an integer, got {type(layer).__name__} {layer!r}")
        if not 0 <= layer < self.num_layers:
            raise ValueError(f"layer must lie in 0 .. {self.num_layers - 1}, got {layer}")
        return int(layer)

    def _seq(self, request, layer) -> _Sequence:
        layer = self._check_layer(layer)
        if request not in self._seqs:
            raise ValueError(f"request {request!r} is not in the host store")
        return self._seqs[request][layer]

    def _tokens(self, x, name: str, ndim: int) -> np.ndarray:
        """Check tokens of shape ``[Hkv, D]`` (ndim 2) or ``[Hkv, T', D]`` (3), cast to ``dtype``."""
        a = _validate.float_array(x, name)
        shape = "[Hkv, D]" if ndim == 2 else "[Hkv, T, D]"
        if a.ndim != ndim or a.shape[0] != self.num_kv_heads or a.shape[-1] != self.head_dim:
            raise ValueError(f"{name} must have shape {shape} = [{self.num_kv_heads}, "
                             f"{'T, ' if ndim == 3 else ''}{self.head_dim}], got {a.shape}")
        with np.errstate(over="ignore"):
            stored = a.astype(self.dtype)
        if not np.isfinite(stored).all():
            raise ValueError(f"{name} overflows the store dtype {self.dtype} (|x| > {np.finfo(self.dtype).max:g})")
        return stored

    def _new_sequence(self) -> _Sequence:
        hkv, d = self.num_kv_heads, self.head_dim
        names = ["lo", "hi"] + {"cuboid_mean": ["center", "radius"], "mean": ["mean"], "minmax": []}[self.metadata]
        return _Sequence(keys=np.zeros((hkv, 0, d), self.dtype), values=np.zeros((hkv, 0, d), self.dtype),
                         meta={name: np.zeros((hkv, 0, d)) for name in names},
                         key_sum=np.zeros((hkv, 0, d)) if self.metadata == "mean" else None)

    def _reserve(self, seq: _Sequence, num_tokens: int) -> None:
        """Grow the buffers (by doubling) to hold ``num_tokens``; amortised O(1) per token."""
        cap = seq.keys.shape[1]
        if num_tokens <= cap:
            return
        new_cap = max(num_tokens, 2 * cap, self.block_size)
        new_cap = -(-new_cap // self.block_size) * self.block_size
        nb_new = new_cap // self.block_size

        def grown(a: np.ndarray, size: int, fill: float) -> np.ndarray:
            out = np.full((a.shape[0], size, a.shape[2]), fill, dtype=a.dtype)
            out[:, : a.shape[1]] = a
            return out

        seq.keys, seq.values = grown(seq.keys, new_cap, 0.0), grown(seq.values, new_cap, 0.0)
        for name, a in seq.meta.items():
            seq.meta[name] = grown(a, nb_new, {"lo": np.inf, "hi": -np.inf}.get(name, 0.0))
        if seq.key_sum is not None:
            seq.key_sum = grown(seq.key_sum, nb_new, 0.0)

    def _update_metadata(self, seq: _Sequence, j: int, first_new: int) -> None:
        """Fold the tokens ``first_new ..`` of block ``j`` into its metadata (``[Hkv, D]`` per name)."""
        start, end = j * self.block_size, min((j + 1) * self.block_size, seq.num_tokens)
        new = seq.keys[:, first_new:end].astype(np.float64)  # [Hkv, n_new, D]
        meta = seq.meta
        meta["lo"][:, j] = np.minimum(meta["lo"][:, j], new.min(axis=1))
        meta["hi"][:, j] = np.maximum(meta["hi"][:, j], new.max(axis=1))
        if self.metadata == "cuboid_mean":
            center = (meta["hi"][:, j] + meta["lo"][:, j]) / 2.0
            meta["center"][:, j] = center
            # the centre moved, so the radius needs every token of the block (<= S of them)
            block = seq.keys[:, start:end].astype(np.float64)
            meta["radius"][:, j] = np.abs(block - center[:, None]).mean(axis=1)
        elif self.metadata == "mean":
            seq.key_sum[:, j] += new.sum(axis=1)
            meta["mean"][:, j] = seq.key_sum[:, j] / (end - start)
