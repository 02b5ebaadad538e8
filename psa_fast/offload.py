"""Host offload, first piece: the authoritative KV store in mapped pinned host memory, and the
gather kernel that loads an iteration's missing blocks into GPU pool slots in one launch.

The pool policy, the loader thread and the pipelined decode loop build on these (the offload
issue); ``benchmarks/bench_offload.py`` measures the gather against the bulk and per-block copies.
"""

from __future__ import annotations

import ctypes

import numpy as np

from psa_ref import _validate

from . import _kernels
from ._compat import require_gpu

CUDA_HOST_ALLOC_MAPPED = 2  # cudaHostAllocMapped: the GPU may read the pages directly (UVA)
GATHER_THREADS = 128


class HostKVStore:
    """Every KV block in mapped pinned host memory: ``k``, ``v`` are ``[num_blocks, S, Dp]`` float16
    NumPy views of it, and kernels read the same bytes through their unified virtual address.

    Args:
        num_blocks: blocks the store holds (one block = one KV head's ``S`` tokens).
        block_size: ``S``.
        head_dim: ``Dp``, the padded head dimension of the GPU pool (a multiple of 8).
    """

    def __init__(self, num_blocks: int, *, block_size: int = 16, head_dim: int = 128):
        require_gpu()
        import cupy

        self.num_blocks = _validate.integer(num_blocks, "num_blocks", minimum=1)
        self.block_size = _validate.integer(block_size, "block_size", minimum=1)
        self.head_dim = _validate.integer(head_dim, "head_dim", minimum=8)
        if self.head_dim % 8:
            raise ValueError(f"head_dim must be a multiple of 8 (16-byte rows), got {self.head_dim}")
        shape = (self.num_blocks, self.block_size, self.head_dim)
        nbytes = int(np.prod(shape)) * 2
        self._ptrs = [cupy.cuda.runtime.hostAlloc(nbytes, CUDA_HOST_ALLOC_MAPPED) for _ in range(2)]
        self.k, self.v = (np.ctypeslib.as_array(ctypes.cast(p, ctypes.POINTER(ctypes.c_uint16)), shape=shape)
                          .view(np.float16) for p in self._ptrs)

    @property
    def device_pointers(self) -> tuple[int, int]:
        """Addresses of ``k`` and ``v`` that kernels may read: with unified virtual addressing (every
        64-bit CUDA platform) a mapped pinned allocation has the same address on host and device."""
        return self._ptrs[0], self._ptrs[1]

    def close(self) -> None:
        """Free the pinned memory (the NumPy views must not be used afterwards)."""
        import cupy

        for p in self._ptrs:
            cupy.cuda.runtime.freeHost(p)
        self._ptrs = []

    def __del__(self):
        if getattr(self, "_ptrs", None):
            try:
                self.close()
            except Exception:
                pass

    def gather(self, src, dst, k_pool, v_pool) -> None:
        """Copy blocks ``src`` (``[n]`` int64 on the GPU) of the store into slots ``dst`` (``[n]`` int32)
        of ``k_pool``/``v_pool`` (``[slots, S, Dp]`` float16), one launch, on the current stream."""
        import cupy

        if k_pool.shape[1:] != (self.block_size, self.head_dim) or v_pool.shape != k_pool.shape:
            raise ValueError(f"pools must be [slots, {self.block_size}, {self.head_dim}], got {k_pool.shape}, "
                             f"{v_pool.shape}")
        if src.dtype != cupy.int64 or dst.dtype != cupy.int32 or src.shape != dst.shape or src.ndim != 1:
            raise TypeError("src must be int64 and dst int32, both [n] on the GPU")
        n = int(src.shape[0])
        if n == 0:
            return
        hk, hv = self.device_pointers
        fn = _kernels.kernel("gather", d=self.head_dim, s=self.block_size, g=1, gather_threads=GATHER_THREADS)
        fn((n,), (GATHER_THREADS,), (np.uint64(hk), np.uint64(hv), src, dst, np.int32(n), k_pool, v_pool))
