"""Head-parallel PSA decode on several GPUs: each rank attends its own KV heads, and the output
projection is row-parallel with one all-reduce (NCCL through ``torch.distributed``).

The GPU twin of [`psa_ref.tools.tensor_parallel`][psa_ref.tools.tensor_parallel], which defines the
decomposition and its error budget. With ``W`` ranks, rank ``r`` holds KV heads
``[r * Hkv / W, (r + 1) * Hkv / W)`` of every layer in its own cache (a
[`PagedKVCache`][psa_fast.PagedKVCache], or an [`OffloadKVCache`][psa_fast.offload.OffloadKVCache]
with its own GPU pool and host store), with their metadata; its [`DecodePlan`][psa_fast.DecodePlan]
(or [`OffloadDecoder`][psa_fast.offload.OffloadDecoder]) runs estimate, order, the loop and the
verifier on those heads, with no traffic between ranks; its ``Hq / W`` heads' outputs
``[B, Hq / W * D]`` multiply its rows of ``W_o`` and one all-reduce sums the ``[B, d_model]``
partials::

    torch.distributed.init_process_group("nccl")            # under torchrun; one GPU per rank
    torch.cuda.set_device(local_rank); cupy.cuda.Device(local_rank).use()
    cache = psa_fast.distributed.shard_cache(num_kv_heads=8, num_layers=32, batch=8, head_dim=128,
                                             max_tokens=131072)        # this rank's 8 / W KV heads
    dec = psa_fast.distributed.HeadParallelDecoder(cache, num_q_heads=32, threshold=0.95, step=64)
    cache.prefill(layer, request, keys[dec.shard.kv_heads.start:dec.shard.kv_heads.stop], ...)
    y = dec.step(q_local, w_o_local, layer)                 # [B, d_model], the same on every rank

Everything runs on torch's current stream (CuPy launches on it through ``cupy.cuda.ExternalStream``;
the NCCL all-reduce is ordered after them by ``torch.distributed``), with no host synchronisation,
so a resident step can be captured in a CUDA graph. ``import psa_fast.distributed`` works without a
GPU (and without torch); building a decoder there raises ``RuntimeError``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from psa_ref import _validate
from psa_ref.tools.tensor_parallel import (HeadShard, RankBudgets, blocks_read_per_kv_head, require_process_group,
                                           shard_heads)

from ._compat import array_kind, require_gpu

if TYPE_CHECKING:  # annotations only: importing this module needs no torch
    import torch

__all__ = ["HeadParallelDecoder", "HeadShard", "RankBudgets", "shard_cache", "shard_heads"]

WO_DTYPES = ("float16", "bfloat16", "float32")


def shard_cache(*, num_kv_heads: int, group: Any = None, num_slots: int | None = None, pool: str = "unified",
                policy: str = "lru", **cache_args: Any) -> Any:
    """This rank's KV cache: ``Hkv / W`` KV heads of every layer.

    Args:
        num_kv_heads: ``Hkv`` of the model (all ranks together), a multiple of ``W``.
        group: the ``torch.distributed`` process group (default: the world).
        num_slots: None: a resident [`PagedKVCache`][psa_fast.PagedKVCache]; else an
            [`OffloadKVCache`][psa_fast.offload.OffloadKVCache] with this many GPU slots (this rank's own
            pool and host store), ``pool`` and ``policy`` as there.
        pool: ``"unified"`` or ``"per_layer"`` (offload only).
        policy: ``"lru"`` or ``"fifo"`` (offload only).
        **cache_args: ``num_layers``, ``batch``, ``head_dim``, ``max_tokens``, ``block_size``,
            ``metadata``, as for [`PagedKVCache`][psa_fast.PagedKVCache].

    Raises:
        RuntimeError: no GPU, or ``torch.distributed`` not initialised.
        ValueError: ``Hkv`` is not a multiple of ``W``.
    """
    require_gpu()
    dist = require_process_group(group)
    w = dist.get_world_size(group)
    hkv = _validate.integer(num_kv_heads, "num_kv_heads", minimum=1)
    shard_heads(num_q_heads=hkv, num_kv_heads=hkv, world_size=w)  # the Hkv % W check and its message
    if num_slots is None:
        from .cache import PagedKVCache

        return PagedKVCache(num_kv_heads=hkv // w, **cache_args)
    from .offload import OffloadKVCache

    return OffloadKVCache(num_slots=num_slots, pool=pool, policy=policy, num_kv_heads=hkv // w, **cache_args)


class HeadParallelDecoder:
    """One rank's decode plan over its KV heads, its rows of ``W_o`` and the all-reduce.

    Args:
        cache: this rank's cache (see [`shard_cache`][psa_fast.distributed.shard_cache]): a
            [`PagedKVCache`][psa_fast.PagedKVCache] (a [`DecodePlan`][psa_fast.DecodePlan] runs it) or an
            [`OffloadKVCache`][psa_fast.offload.OffloadKVCache] (an
            [`OffloadDecoder`][psa_fast.offload.OffloadDecoder] runs it), ``Hkv / W`` KV heads.
        num_q_heads: ``Hq`` of the model (all ranks together); this rank attends ``Hq / W`` of them.
        group: the ``torch.distributed`` process group (default: the world), NCCL.
        **options: the plan's options (``mode``, ``threshold``, ``stop``, ``step``, ``k``, ``gqa``,
            ``scale``, ...; with offload also ``lookahead``, ``graphs``, ...), the same on every rank.

    Attributes:
        shard: the heads this rank owns, in the model's numbering
            ([`HeadShard`][psa_ref.tools.tensor_parallel.HeadShard]).
        plan: this rank's plan (``Hq / W`` query heads).
        last: the plan's [`DecodeOutput`][psa_fast.DecodeOutput] of the last step (views of its buffers).

    Raises:
        RuntimeError: no GPU, or ``torch.distributed`` not initialised.
        TypeError: ``cache`` is not a ``PagedKVCache``.
        ValueError: ``Hq`` does not split over the ranks' KV heads, the ranks' caches differ (KV heads,
            batch, head dimension, layers, block size), or CuPy's and torch's current devices differ.
    """

    def __init__(self, cache: Any, *, num_q_heads: int, group: Any = None, **options: Any):
        require_gpu()
        dist = require_process_group(group)
        import cupy
        import torch

        from .api import DecodePlan
        from .cache import PagedKVCache
        from .offload import OffloadDecoder, OffloadKVCache

        if not isinstance(cache, PagedKVCache):
            raise TypeError(f"cache must be a psa_fast.PagedKVCache or psa_fast.offload.OffloadKVCache of this rank's "
                            f"KV heads (see shard_cache), got {type(cache).__name__}")
        if cupy.cuda.Device().id != torch.cuda.current_device():
            raise ValueError(f"CuPy's current GPU ({cupy.cuda.Device().id}) is not torch's "
                             f"({torch.cuda.current_device()}): call torch.cuda.set_device(i) and "
                             "cupy.cuda.Device(i).use() with this rank's GPU")
        self._dist, self.group = dist, group
        self.rank, self.world_size = dist.get_rank(group), dist.get_world_size(group)
        hq = _validate.integer(num_q_heads, "num_q_heads", minimum=1)
        self.shard: HeadShard = shard_heads(num_q_heads=hq, num_kv_heads=cache.num_kv_heads * self.world_size,
                                            world_size=self.world_size)[self.rank]
        self.num_q_heads = hq
        self.cache = cache
        kind = OffloadDecoder if isinstance(cache, OffloadKVCache) else DecodePlan
        self.plan = kind(cache, num_q_heads=len(self.shard.q_heads), **options)
        self.last = None
        self._last_layer = None
        # once, outside any step: every rank must hold an equal shard of the same model and batch, or the
        # all-reduce would add tensors of different meaning (or sizes, and hang)
        mine = dict(kv_heads=cache.num_kv_heads, batch=cache.batch, head_dim=cache.head_dim,
                    layers=cache.num_layers, block_size=cache.block_size, q_heads=hq, mode=self.plan.mode)
        every: list = [None] * self.world_size
        dist.all_gather_object(every, mine, group=group)
        for key in mine:
            values = [e[key] for e in every]
            if any(v != values[0] for v in values):
                raise ValueError(f"the ranks' decoders disagree on {key}: "
                                 + ", ".join(f"rank {r}: {v}" for r, v in enumerate(values)))

    # --- inputs ---

    def _local_q(self, q):
        """``q`` as this rank's heads ``[B, Hq / W, D]``, contiguous (a slice of all ``Hq`` heads is copied)."""
        c = self.cache
        shape = tuple(q.shape)
        if len(shape) != 3 or shape[0] != c.batch or shape[2] != c.head_dim:
            raise ValueError(f"q must have shape [B={c.batch}, Hq / W={len(self.shard.q_heads)}, D={c.head_dim}] "
                             f"(this rank's heads) or [B, Hq={self.num_q_heads}, D], got {shape}")
        if shape[1] == len(self.shard.q_heads):
            return q
        if shape[1] != self.num_q_heads:
            raise ValueError(f"q has {shape[1]} heads: expected this rank's {len(self.shard.q_heads)} or all "
                             f"{self.num_q_heads}")
        part = q[:, self.shard.q_heads.start : self.shard.q_heads.stop]
        if array_kind(q) == "cupy":
            import cupy

            return cupy.ascontiguousarray(part)
        return part.contiguous() if hasattr(part, "contiguous") else part

    def _local_wo(self, w_o):
        """``w_o`` as this rank's rows ``[Hq / W * D, d_model]`` (a view when all ``Hq * D`` rows are given)."""
        import torch

        if not isinstance(w_o, torch.Tensor):
            raise TypeError(f"w_o must be a CUDA torch tensor, got {type(w_o).__name__}")
        if not w_o.is_cuda or w_o.device.index != torch.cuda.current_device():
            raise TypeError(f"w_o must be on this rank's GPU (cuda:{torch.cuda.current_device()}), got {w_o.device}")
        if str(w_o.dtype).replace("torch.", "") not in WO_DTYPES:
            raise TypeError(f"w_o must have dtype {', '.join(WO_DTYPES)}, got {w_o.dtype}")
        d, local = self.cache.head_dim, len(self.shard.q_heads)
        if w_o.dim() == 2 and w_o.shape[0] == local * d:
            return w_o
        if w_o.dim() == 2 and w_o.shape[0] == self.num_q_heads * d:
            return w_o[self.shard.wo_rows(d)]
        raise ValueError(f"w_o must have shape [Hq / W * D = {local * d}, d_model] (this rank's rows of W_o) or "
                         f"[Hq * D = {self.num_q_heads * d}, d_model], got {tuple(w_o.shape)}")

    # --- the step ---

    def partial(self, q: Any, w_o: Any, layer: int = 0) -> "torch.Tensor":
        """This rank's term of the output, before the all-reduce: ``concat(o_h) @ W_o[rows]``.

        Args:
            q: ``[B, Hq / W, D]`` (this rank's heads) or ``[B, Hq, D]`` (this rank takes its own, a copy),
                float16/float32, a CUDA torch tensor or CuPy array.
            w_o: ``[Hq / W * D, d_model]`` (this rank's rows) or ``[Hq * D, d_model]`` (a view of its rows is
                taken), float16/bfloat16/float32 CUDA torch tensor.
            layer: the layer of the cache.

        Returns:
            ``[B, d_model]`` torch tensor of ``w_o``'s dtype (the attention outputs, float32, are cast to it
                first, as an engine's projection does), on torch's current stream.
        """
        import cupy
        import torch

        w = self._local_wo(w_o)
        ql = self._local_q(q)
        ptr = torch.cuda.current_stream().cuda_stream
        with cupy.cuda.Stream.null if ptr == 0 else cupy.cuda.ExternalStream(ptr):
            dec = self.plan.run(ql, layer)
            out = torch.from_dlpack(dec.out)  # [B, Hq/W, D] float32 view of the plan's buffer
        self.last, self._last_layer = dec, layer
        # reads Hq/W * D * d_model elements of W_o once per step: 1/W of the projection's bytes per rank
        return out.reshape(out.shape[0], -1).to(w.dtype) @ w

    def step(self, q: Any, w_o: Any, layer: int = 0) -> "torch.Tensor":
        """One head-parallel decode step of one layer: [`partial`][psa_fast.distributed.HeadParallelDecoder.partial],
        then the all-reduce (sum) over the group.

        Returns:
            ``[B, d_model]`` torch tensor, ``w_o``'s dtype: the layer's attention output after ``W_o``, the
                same on every rank.
        """
        y = self.partial(q, w_o, layer)
        self._dist.all_reduce(y, op=self._dist.ReduceOp.SUM, group=self.group)
        return y

    def budgets(self) -> RankBudgets:
        """Blocks read per KV head on every rank in the last step (copies to the host, synchronises and
        all-gathers: call it outside timed loops).

        Returns:
            [`RankBudgets`][psa_ref.tools.tensor_parallel.RankBudgets] with ``blocks_read [W, B, Hkv / W]``.
        """
        import cupy
        import torch

        if self.last is None:
            raise RuntimeError("budgets() reports the last step: run step() or partial() first")
        c, layer = self.cache, self._last_layer
        torch.cuda.current_stream().synchronize()
        num_blocks = -(-c.host_lens[layer].astype(np.int64) // c.block_size)  # [B]
        if self.plan.mode == "dense":
            reads = np.repeat(num_blocks[:, None], c.num_kv_heads, axis=1)
        else:
            reads = blocks_read_per_kv_head(cupy.asnumpy(self.last.num_used), c.num_kv_heads)  # [B, Hkv/W]
        mine = torch.as_tensor(reads, dtype=torch.int64, device=f"cuda:{torch.cuda.current_device()}")
        every = [torch.empty_like(mine) for _ in range(self.world_size)]
        self._dist.all_gather(every, mine, group=self.group)
        return RankBudgets(np.stack([e.cpu().numpy() for e in every]), num_blocks)
