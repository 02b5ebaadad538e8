"""The paged KV layout on the GPU, shared by the resident decode path and the offload system.

One pool of equal slots holds every KV block of every layer (a slot is one block of one KV head:
``S`` tokens of K and of V). A block table per layer maps ``(request, kv_head, block)`` to a slot.
Per-block metadata and min/max bounds stay resident next to it and are updated when a token is
appended (``psa_fast.metadata``).

Shapes (``L`` layers, ``B`` requests, ``Dp`` the head dimension padded by ``padded_dim``):

=================  ==================================  =========
``k_pool``         ``[slots, S, Dp]``                  float16, or int16 holding bfloat16 bits
``v_pool``         ``[slots, S, Dp]``                  likewise
``block_table``    ``[L, B, Hkv, Nmax]``               int32
``seq_lens``       ``[L, B]``                          int32
``meta``, ``lohi``  ``[L, B, Hkv, Nmax, 2, Dp]``        float16
``codes``          ``[L, B, Hkv, Nmax, S, Dp / 8]``    uint32, ``quant3`` only (None otherwise):
                                                       4 bits per key channel, see
                                                       ``psa_fast.metadata``
=================  ==================================  =========

The KV dtype (``dtype="float16"`` or ``"bfloat16"``) is the model's; CuPy has no bfloat16, so a
bfloat16 pool is an int16 array of the same bits (torch tensors are viewed, not converted). The
metadata is float16 for both: it is computed in float32 from the exact keys and rounded once, and
float16 keeps 3 more bits than bfloat16. Keys beyond float16's range (65504) are refused at prefill.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from psa_ref import _validate
from psa_ref.blocks import METADATA_KINDS

from ._compat import KV_DTYPES, as_cupy_kv, kv_to_float32, require_gpu


def padded_dim(d: int) -> int:
    """The head dimension the kernels use: ``d`` rounded up to 16, 32, 64, 128 or 256 (whole
    tensor-core steps, and 16-byte rows that divide into 32 lanes)."""
    for p in (16, 32, 64, 128, 256):
        if d <= p:
            return p
    raise ValueError(f"head_dim must be at most 256 for psa_fast, got {d}")


class PagedKVCache:
    """KV blocks of ``B`` requests and ``L`` layers in one GPU pool, with resident metadata.

    Args:
        num_layers: ``L``.
        batch: ``B``, the number of requests.
        num_kv_heads: ``Hkv``.
        head_dim: ``D`` (padded internally to ``Dp``).
        max_tokens: capacity per request; ``Nmax = ceil(max_tokens / S)`` blocks.
        block_size: ``S``.
        metadata: ranking metadata, one of ``psa_ref.METADATA_KINDS``, or None for a dense-only cache: no block
            summaries are built or kept up to date (``meta``, ``lohi``, ``codes`` are None), so an append only writes
            the token; only ``DecodePlan(mode="dense")`` runs on it.
        dtype: the KV dtype, ``"float16"`` or ``"bfloat16"`` (the model's).

    Every block gets its own slot (the resident layout); the offload system replaces
    ``block_table`` with a smaller pool and a loader.
    """

    def __init__(self, *, num_layers: int, batch: int, num_kv_heads: int, head_dim: int, max_tokens: int,
                 block_size: int = 16, metadata: str | None = "cuboid_mean", dtype: str = "float16"):
        require_gpu()
        import cupy

        self.num_layers = _validate.integer(num_layers, "num_layers", minimum=1)
        self.batch = _validate.integer(batch, "batch", minimum=1)
        self.num_kv_heads = _validate.integer(num_kv_heads, "num_kv_heads", minimum=1)
        self.head_dim = _validate.integer(head_dim, "head_dim", minimum=1)
        self.block_size = _validate.integer(block_size, "block_size", minimum=1)
        self.metadata = None if metadata is None else _validate.choice(metadata, "metadata", METADATA_KINDS)
        self.dtype = _validate.choice(str(dtype).replace("torch.", ""), "dtype", KV_DTYPES)
        max_tokens = _validate.integer(max_tokens, "max_tokens", minimum=1)
        self.dp = padded_dim(self.head_dim)
        self.nmax = -(-max_tokens // self.block_size)
        shape = (self.num_layers, self.batch, self.num_kv_heads, self.nmax)
        self.block_table = cupy.arange(int(np.prod(shape)), dtype=cupy.int32).reshape(shape)
        self.k_pool, self.v_pool = self._allocate_blocks(int(np.prod(shape)))
        self.seq_lens = cupy.zeros((self.num_layers, self.batch), dtype=cupy.int32)
        self.host_lens = np.zeros((self.num_layers, self.batch), dtype=np.int64)  # mirror: capacity checks
        summaries = self.metadata is not None
        self.meta = cupy.zeros(shape + (2, self.dp), dtype=cupy.float16) if summaries else None
        self.lohi = cupy.zeros_like(self.meta) if summaries else None
        self.codes = (cupy.zeros(shape + (self.block_size, self.dp // 8), dtype=cupy.uint32)
                      if self.metadata == "quant3" else None)

    def _allocate_blocks(self, num_blocks: int):
        """``(k, v)``, each ``[num_blocks, S, Dp]`` of ``pool_dtype``, zeroed: here on the GPU (every block has
        a slot); [`psa_fast.offload.OffloadKVCache`][psa_fast.offload.OffloadKVCache] puts them in mapped pinned
        host memory."""
        import cupy

        k = cupy.zeros((num_blocks, self.block_size, self.dp), dtype=self.pool_dtype)
        return k, cupy.zeros_like(k)

    @property
    def pool_dtype(self):
        """The CuPy dtype of the KV pools: float16, or int16 (bfloat16 bits)."""
        return np.float16 if self.dtype == "float16" else np.int16

    @property
    def capacity(self) -> int:
        """Tokens per request that fit: ``Nmax * S``."""
        return self.nmax * self.block_size

    def _dense_view(self, pool, layer: int, request: int):
        """``[Hkv, Nmax * S, Dp]`` view of one request's blocks (valid for the resident layout)."""
        return pool.reshape(self.num_layers, self.batch, self.num_kv_heads, self.nmax * self.block_size,
                            self.dp)[layer, request]

    def prefill(self, layer: int, request: int, keys: Any, values: Any) -> None:
        """Store a request's whole prompt for one layer and build its metadata.

        Args:
            keys: ``[Hkv, T, D]`` of the cache's dtype: a CUDA torch tensor, or a CuPy array (float16, or
                int16 bfloat16 bits).
            values: the same shape.

        Raises:
            ValueError: wrong shapes, too many tokens, or (bfloat16) keys beyond float16's range, which
                the float16 metadata could not hold.
        """
        layer = self._index(layer, "layer", self.num_layers)
        request = self._index(request, "request", self.batch)
        k = as_cupy_kv(keys, "keys", self.dtype)
        v = as_cupy_kv(values, "values", self.dtype)
        if k.ndim != 3 or k.shape[0] != self.num_kv_heads or k.shape[2] != self.head_dim:
            raise ValueError(f"keys must have shape [Hkv={self.num_kv_heads}, T, D={self.head_dim}], got {k.shape}")
        if v.shape != k.shape:
            raise ValueError(f"values must have the same shape as keys {k.shape}, got {v.shape}")
        from . import metadata as _metadata

        t = k.shape[1]
        if t > self.capacity:
            raise ValueError(f"{t} tokens do not fit: the cache holds {self.capacity} per request "
                             f"(max_tokens rounded up to blocks of {self.block_size})")
        if self.dtype == "bfloat16" and t:
            top = float(abs(kv_to_float32(k, self.dtype)).max())
            if not top <= 65504.0:
                raise ValueError(f"keys reach {top:g}, beyond float16's range (65504) that the block metadata uses")
        kd, vd = self._dense_view(self.k_pool, layer, request), self._dense_view(self.v_pool, layer, request)
        kd[...] = 0
        vd[...] = 0
        kd[:, :t, : self.head_dim] = k
        vd[:, :t, : self.head_dim] = v
        self.seq_lens[layer, request] = t
        self.host_lens[layer, request] = t
        if self.metadata is None:
            return
        _metadata.build_metadata(self.k_pool, self.block_table[layer, request : request + 1],
                                 self.seq_lens[layer, request : request + 1], self.meta[layer, request : request + 1],
                                 self.lohi[layer, request : request + 1], kind=self.metadata,
                                 block_size=self.block_size, codes=self._codes(layer, request))

    def append(self, layer: int, keys: Any, values: Any) -> None:
        """Append one decoded token to every request of one layer.

        Args:
            keys: ``[B, Hkv, D]`` of the cache's dtype (see ``prefill``).
            values: likewise.

        Raises:
            ValueError: a request is full (nothing is written then: no KV data is lost).
        """
        import cupy

        layer = self._index(layer, "layer", self.num_layers)
        k = as_cupy_kv(keys, "keys", self.dtype)
        v = as_cupy_kv(values, "values", self.dtype)
        want = (self.batch, self.num_kv_heads, self.head_dim)
        if k.shape != want or v.shape != want:
            raise ValueError(f"keys and values must have shape [B, Hkv, D] = {want}, got {k.shape} and {v.shape}")
        full = np.flatnonzero(self.host_lens[layer] >= self.capacity)
        if full.size:
            raise ValueError(f"requests {full.tolist()} are full ({self.capacity} tokens) in layer {layer}; "
                             "nothing was appended")
        if self.dp != self.head_dim:
            k = cupy.pad(k, ((0, 0), (0, 0), (0, self.dp - self.head_dim)))
            v = cupy.pad(v, ((0, 0), (0, 0), (0, self.dp - self.head_dim)))
        self._append_token(layer, k, v)
        lens = self.seq_lens[layer]
        cupy.add(lens, 1, out=lens)  # in place, no temporary: the step stays capturable in a CUDA graph
        self.host_lens[layer] += 1

    def _append_token(self, layer: int, k, v) -> None:
        """Write token ``seq_lens[layer]`` (``k``, ``v``: ``[B, Hkv, Dp]``, checked) and update its
        block's metadata (if the cache keeps any), on the current stream."""
        from . import metadata as _metadata

        if self.metadata is None:
            _metadata.write_token(self.k_pool, self.v_pool, self.block_table[layer], self.seq_lens[layer], k, v,
                                  block_size=self.block_size)
            return
        _metadata.append_token(self.k_pool, self.v_pool, self.block_table[layer], self.seq_lens[layer], k, v,
                               self.meta[layer], self.lohi[layer], kind=self.metadata, block_size=self.block_size,
                               codes=self._codes(layer))

    def _codes(self, layer: int, request: int | None = None):
        """quant3's codes of one layer (``[B, ...]``) or of one request in it (``[1, ...]``); None otherwise."""
        if self.codes is None:
            return None
        return self.codes[layer] if request is None else self.codes[layer, request : request + 1]

    @staticmethod
    def _index(i, name: str, n: int) -> int:
        i = _validate.integer(i, name, minimum=0)
        if i >= n:
            raise ValueError(f"{name} must be < {n}, got {i}")
        return i
