"""Host offload: the KV cache lives in host memory, the GPU caches blocks, and a decode step loads
what the progressive loop asks for while it computes (the paper's system half).

* [`HostKVStore`][psa_fast.offload.HostKVStore]: every KV block in mapped pinned host memory, authoritative; kernels
read
  and write it through its unified virtual address.
* [`OffloadKVCache`][psa_fast.offload.OffloadKVCache]: a [`PagedKVCache`][psa_fast.PagedKVCache] whose blocks live in a
  [`HostKVStore`][psa_fast.offload.HostKVStore], plus a GPU pool of ``num_slots`` slots managed by
  [`psa_fast.pool.GPUSlotPool`][psa_fast.pool.GPUSlotPool] (unified over layers, or split per layer). Metadata stays
  resident on the GPU. An append writes the token into the block it extends, kept on the GPU
  (with the metadata update), into its slot when the block is resident, and into the host store
  on a write-back stream of its own, which the caller's stream never waits for.
* [`OffloadDecoder`][psa_fast.offload.OffloadDecoder]: a [`DecodePlan`][psa_fast.DecodePlan] whose attention stage runs
one
  iteration of the progressive loop per launch. A loader thread, on its own CUDA stream, names
  the next iteration's blocks (``kernels/iteration_ids.cu``), makes them resident (pool
  access) and gathers the misses from host memory in one launch, while the current iteration
  is attended. The decode kernel keeps the loop state on the GPU and, when the last group of the
  batch stops, writes a token into mapped pinned memory; the loader polls it and stops issuing
  loads. Nothing calls ``synchronize()`` inside the loop.

``benchmarks/bench_offload.py`` measures the gather against the bulk and per-block copies and the
decode step against ``max(transfer, compute)``.
"""

from __future__ import annotations

import ctypes
import functools
import threading
import time
from typing import Any, Callable

import numpy as np

from psa_ref import _validate

from . import _kernels
from ._compat import KV_DTYPES, require_gpu
from .api import DecodeOutput, DecodePlan
from .cache import PagedKVCache

CUDA_HOST_ALLOC_MAPPED = 2  # cudaHostAllocMapped: the GPU may read the pages directly (UVA)
GATHER_THREADS = 128
GATHER_CTAS_PER_SM = 16  # 16 x 128 threads: an SM's share of 16-byte reads in flight


STOP_RULES = tuple(r for r in _kernels.STOP_RULES if r not in ("sketch", "sketch_avg"))  # offered with host offload


class HostKVStore:
    """Every KV block in mapped pinned host memory: ``k``, ``v`` are ``[num_blocks, S, Dp]`` NumPy views
    of it (float16, or int16 holding bfloat16 bits), and kernels read the same bytes through their
    unified virtual address.

    Args:
        num_blocks: blocks the store holds (one block = one KV head's ``S`` tokens).
        block_size: ``S``.
        head_dim: ``Dp``, the padded head dimension of the GPU pool (a multiple of 8).
        dtype: ``"float16"`` or ``"bfloat16"``.
    """

    def __init__(self, num_blocks: int, *, block_size: int = 16, head_dim: int = 128, dtype: str = "float16"):
        require_gpu()
        import cupy

        self.num_blocks = _validate.integer(num_blocks, "num_blocks", minimum=1)
        self.block_size = _validate.integer(block_size, "block_size", minimum=1)
        self.head_dim = _validate.integer(head_dim, "head_dim", minimum=8)
        if self.head_dim % 8:
            raise ValueError(f"head_dim must be a multiple of 8 (16-byte rows), got {self.head_dim}")
        self.dtype = _validate.choice(dtype, "dtype", KV_DTYPES)
        self._np_dtype = np.float16 if self.dtype == "float16" else np.int16
        shape = (self.num_blocks, self.block_size, self.head_dim)
        nbytes = int(np.prod(shape)) * 2
        self._ptrs = [cupy.cuda.runtime.hostAlloc(nbytes, CUDA_HOST_ALLOC_MAPPED) for _ in range(2)]
        self.k, self.v = (np.ctypeslib.as_array(ctypes.cast(p, ctypes.POINTER(ctypes.c_uint16)), shape=shape)
                          .view(self._np_dtype) for p in self._ptrs)

    def device_arrays(self):
        """``(k, v)`` as CuPy arrays over the same pinned bytes (``[num_blocks, S, Dp]``): GPU kernels
        read and write them over PCIe, no copy is made."""
        import cupy

        dev = cupy.cuda.Device().id
        nbytes = self.k.nbytes
        return tuple(cupy.ndarray(self.k.shape, self._np_dtype,
                                  memptr=cupy.cuda.MemoryPointer(cupy.cuda.UnownedMemory(p, nbytes, self, dev), 0))
                     for p in self._ptrs)

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
        of ``k_pool``/``v_pool`` (``[slots, S, Dp]``, the store's dtype), one launch, on the current stream."""
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
        fn((_gather_grid(n),), (GATHER_THREADS,), (np.uint64(hk), np.uint64(hv), src, dst, np.int32(n), k_pool,
                                                 v_pool))


class OffloadKVCache(PagedKVCache):
    """A [`PagedKVCache`][psa_fast.PagedKVCache] whose KV blocks live in host memory, cached on the GPU.

    The host store ([`HostKVStore`][psa_fast.offload.HostKVStore]) holds every block and is authoritative; ``k_pool``
    and ``v_pool`` are CuPy views of it (so prefill and append write there through UVA) and
    ``block_table`` maps ``(layer, request, kv_head, block)`` to its id in the store. The GPU
    slots are ``slot_k``/``slot_v`` (``[num_slots, S, Dp]``, the KV dtype), managed by ``pool``.

    Args:
        num_slots: GPU slots (one block of one KV head each). ``pool="per_layer"`` needs a
            multiple of ``num_layers``.
        pool: ``"unified"`` (one set of slots for all layers, the paper's) or ``"per_layer"``.
        policy: ``"lru"`` or ``"fifo"``.
        **cache_args: ``num_layers``, ``batch``, ``num_kv_heads``, ``head_dim``, ``max_tokens``,
            ``block_size``, ``metadata``, ``dtype``, as for [`PagedKVCache`][psa_fast.PagedKVCache].
    """

    def __init__(self, *, num_slots: int, pool: str = "unified", policy: str = "lru", **cache_args: Any):
        import cupy

        from .pool import GPUSlotPool

        self.num_slots = _validate.integer(num_slots, "num_slots", minimum=2)
        self.pool_kind = _validate.choice(pool, "pool", ("unified", "per_layer"))
        if "metadata" in cache_args and cache_args["metadata"] is None:
            raise ValueError("metadata=None (a dense-only cache) is not offered with host offload: the offload "
                             "decoder picks blocks by their metadata; use cuboid_mean, minmax or mean")
        if cache_args.get("metadata") == "quant3":
            raise NotImplementedError("metadata='quant3' is not offered with host offload: its per-token codes are "
                                      "not kept in the host store (psa_ref.kvcache.store has the same limit); use "
                                      "cuboid_mean, minmax or mean")
        super().__init__(**cache_args)
        parts = 1 if self.pool_kind == "unified" else self.num_layers
        self.pool = GPUSlotPool(self.num_slots, num_store_blocks=self.store.num_blocks, num_partitions=parts,
                                policy=policy, pin_window=2)
        self.policy = policy
        self.pool_generation = 0
        self.slot_k = cupy.zeros((self.num_slots, self.block_size, self.dp), dtype=self.pool_dtype)
        self.slot_v = cupy.zeros_like(self.slot_k)
        # The block each (layer, request, KV head) is appending to, on the GPU: appends write here and
        # update the metadata from here (no PCIe read), and the write-back stream copies the new row
        # into the host store without the caller's stream waiting for it.
        rows = self.batch * self.num_kv_heads
        self.tail_k = cupy.zeros((self.num_layers, rows, self.block_size, self.dp), dtype=self.pool_dtype)
        self.tail_v = cupy.zeros_like(self.tail_k)
        self._tail_table = cupy.ascontiguousarray(cupy.broadcast_to(
            cupy.arange(rows, dtype=cupy.int32).reshape(self.batch, self.num_kv_heads, 1),
            (self.batch, self.num_kv_heads, self.nmax)))
        self.writeback_stream = cupy.cuda.Stream(non_blocking=True)
        self._written = None       # event: the last append's rows are in the host store
        self._writeback_args = ()  # that write-back's index arrays, alive until it has run
        self._tail_rows = cupy.arange(rows, dtype=cupy.int64).reshape(self.batch, self.num_kv_heads) * self.block_size

    def _allocate_blocks(self, num_blocks: int):
        # not zeroed here (64 GiB would take seconds): prefill writes every block of a request, padding included
        self.store = HostKVStore(num_blocks, block_size=self.block_size, head_dim=self.dp, dtype=self.dtype)
        return self.store.device_arrays()

    def partition(self, layer: int) -> int:
        """The pool partition ``layer`` draws slots from."""
        return 0 if self.pool_kind == "unified" else layer

    def reset_pool(self) -> None:
        """Forget every resident block (after a loader fault: a slot may have been assigned and not
        filled). Nothing is lost: the host store holds every block."""
        from .pool import GPUSlotPool

        old = self.pool
        self.pool_generation += 1  # decoders' graphs bake the old pool's arrays in
        self.pool = GPUSlotPool(old.num_slots, num_store_blocks=self.store.num_blocks,
                                num_partitions=old.num_partitions, policy=self.policy, pin_window=2)

    def prefill(self, layer: int, request: int, keys: Any, values: Any) -> None:
        """As [`PagedKVCache.prefill`][psa_fast.PagedKVCache.prefill]; the blocks go to the host store (after any
        pending write-back, which it overwrites). A prefill of a request's layer invalidates its resident
        blocks (their content changed)."""
        import cupy

        self.wait_for_writeback(cupy.cuda.get_current_stream())
        super().prefill(layer, request, keys, values)
        self.pool.release(self.block_table[layer, request].ravel())
        t, s, hkv = int(self.host_lens[layer, request]), self.block_size, self.num_kv_heads
        if t % s:  # the partial last block continues on the GPU
            ids = self.block_table[layer, request, :, t // s].astype(cupy.int64)
            self.tail_k[layer, request * hkv : (request + 1) * hkv] = self.k_pool[ids]
            self.tail_v[layer, request * hkv : (request + 1) * hkv] = self.v_pool[ids]

    def _append_token(self, layer: int, k, v) -> None:
        """Token ``seq_lens[layer]`` goes into the tail block on the GPU (with its metadata), into its
        slot when the block is resident (write-through: no slot is ever stale), and into the host
        store on ``writeback_stream``, which the caller's stream does not wait for; the offload
        decoder's loads (and [`prefill`][psa_fast.offload.OffloadKVCache.prefill]) wait for it before they read the host
        store."""
        import cupy

        from . import metadata as _metadata

        caller = cupy.cuda.get_current_stream()
        self.wait_for_writeback(caller)  # the previous write-back read tail rows this one may reuse
        t = self.seq_lens[layer]                                     # [B], positions of the new tokens
        _metadata.append_token(self.tail_k[layer], self.tail_v[layer], self._tail_table, t, k, v, self.meta[layer],
                               self.lohi[layer], kind=self.metadata, block_size=self.block_size)
        s = self.block_size
        ids = cupy.take_along_axis(self.block_table[layer], (t // s)[:, None, None].astype(cupy.int64),
                                   axis=2)[..., 0]                   # [B, Hkv] store ids of the blocks
        row = (t % s)[:, None].astype(cupy.int64)
        tail = (self._tail_rows + row) * self.dp
        slots = self.pool.slot_of[ids]                               # -1 where not resident
        _copy_rows(tail, (slots.astype(cupy.int64) * s + row) * self.dp, slots >= 0, self.tail_k[layer],
                   self.tail_v[layer], self.slot_k, self.slot_v, self.dp)
        host = (ids.astype(cupy.int64) * s + row) * self.dp
        everywhere = cupy.ones(ids.shape, cupy.bool_)
        self.writeback_stream.wait_event(caller.record())
        with self.writeback_stream:
            _copy_rows(tail, host, everywhere, self.tail_k[layer], self.tail_v[layer], self.k_pool, self.v_pool,
                       self.dp)
            self._written = self.writeback_stream.record()
        self._writeback_args = (tail, host, everywhere)

    def wait_for_writeback(self, stream) -> None:
        """Make ``stream`` wait (on the GPU, the host does not block) until the last append's rows
        are in the host store: before anything on it reads or overwrites the store."""
        if self._written is not None:
            stream.wait_event(self._written)

    def synchronize_writeback(self) -> None:
        """Block the host until every appended token is in the host store (before reading
        ``store.k``/``store.v`` from the CPU)."""
        if self._written is not None:
            self._written.synchronize()


def _copy_rows(src, dst, mask, src_k, src_v, dst_k, dst_v, dp) -> None:
    """Copy the ``dp`` elements at offsets ``src[b, h]`` of ``src_k``/``src_v`` to offsets ``dst[b, h]``
    of ``dst_k``/``dst_v`` where ``mask``, on the current stream."""
    import cupy

    d = cupy.arange(dp, dtype=cupy.int64)
    for a, b in ((src_k, dst_k), (src_v, dst_v)):
        _row_copy_kernel()(src[..., None], dst[..., None], mask[..., None], d, a, b)


@functools.lru_cache(maxsize=1)
def _row_copy_kernel():
    import cupy

    return cupy.ElementwiseKernel("int64 src, int64 dst, bool mask, int64 d, raw T a", "raw T b",
                                  "if (mask) b[dst + d] = a[src + d];", "psa_row_copy")


def blocks_per_iteration(*, num_q_heads: int, num_kv_heads: int, step: int, gqa: str = "shared",
                         sink_blocks: int = 0, recent_blocks: int = 0) -> int:
    """Pool slots one request's iteration names at most: one block per selection group (a KV head for
    ``gqa="shared"``, a query head for ``"per_head"``) per position of the largest chunk (the forced
    sink/recent blocks, or ``step``). Pure arithmetic; no GPU needed."""
    for name, v in (("num_q_heads", num_q_heads), ("num_kv_heads", num_kv_heads), ("step", step)):
        _validate.integer(v, name, minimum=1)
    if num_q_heads % num_kv_heads:
        raise ValueError(f"num_q_heads ({num_q_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
    groups = num_kv_heads if _validate.choice(gqa, "gqa", ("shared", "per_head")) == "shared" else num_q_heads
    forced = _validate.integer(sink_blocks, "sink_blocks", minimum=0) + _validate.integer(
        recent_blocks, "recent_blocks", minimum=0)
    return groups * max(step, forced)


def batch_controller(capacity_per_partition: int, *, max_batch: int | None = None):
    """psa_ref's FCFS [`BatchController`][psa_ref.kvcache.batch.BatchController] sized for
    [`OffloadDecoder`][psa_fast.offload.OffloadDecoder]: the pipelined loop keeps two iterations in a partition (the one
    attended and the one loading), so a request is admitted when ``blocks_per_iteration`` fits in half of
    ``cache.pool.capacity_per_partition`` beside the requests already running."""
    from psa_ref.kvcache.batch import BatchController

    return BatchController(_validate.integer(capacity_per_partition, "capacity_per_partition", minimum=2) // 2,
                           max_batch=max_batch)


class LoaderError(RuntimeError):
    """The offload loader failed; the step's result is not valid. The pool was reset (no block is stale)."""


class OffloadDecoder(DecodePlan):
    """A decode plan over an [`OffloadKVCache`][psa_fast.offload.OffloadKVCache]: the progressive loop one iteration per
    launch, with a loader thread bringing the next iteration's blocks into the GPU pool meanwhile.

    Same arguments as [`DecodePlan`][psa_fast.DecodePlan] (``mode`` ``"psa"`` or ``"topk"``), plus:

    Args:
        lookahead: launches the loader may issue beyond the last one the GPU has finished: it
            hides the host's polling latency, at the price of up to ``lookahead`` launches of
            iterations after the loop has stopped (their blocks stay cached). 0: the loader issues
            launch ``n`` only once ``n - 1`` is done and the done flag is still clear.
        graphs: replay ``unroll`` pipelined iterations (each: attend j, load j + 1, seven launches on
            two streams) as one CUDA graph, captured at the second step of each layer, and likewise
            [`run`][psa_fast.offload.OffloadDecoder.run]'s estimate, order and state reset, and the first iteration's
            load; False issues the launches one by one (the host's Python then bounds the step: ~200 µs per
            iteration).
        unroll: iterations per graph launch. The done flag is read between launches, so up to
            ``unroll - 1`` iterations run after the stop; they return at once, but each still makes
            one pool access (their blocks were loaded speculatively anyway).
        loader_thread: run the loader loop on its own host thread (started per step, joined before
            [`attend`][psa_fast.offload.OffloadDecoder.attend] returns) instead of in the caller's thread. The GPU
            overlap is the same either way (it comes from the two streams); on the H200 host the thread's start and
            hand-off cost ~0.7 ms per layer and step, so it is off by default.
        timeout: seconds the caller waits for the loader thread, and the loader for any one launch
            to complete, before giving up (``TimeoutError``; inside the loader it surfaces as
            [`LoaderError`][psa_fast.offload.LoaderError], and the pool is reset).
        fault: test hook, ``fault(stage, iteration)`` called by the loader before each stage
            (``"ids"``, ``"access"``, ``"gather"``); an exception it raises surfaces in the caller
            as [`LoaderError`][psa_fast.offload.LoaderError].

    Raises:
        ValueError: the pool cannot hold two iterations of the batch (the one attended and the one
            loading); make ``step`` or the batch smaller, or the pool larger.
    """

    _whole_loop = False  # its loop runs an iteration a launch (the offload build), on clusters

    def __init__(self, cache: OffloadKVCache, *, lookahead: int = 1, graphs: bool = True, unroll: int = 4,
                 loader_thread: bool = False, timeout: float = 60.0,
                 fault: Callable[[str, int], None] | None = None, **options):
        import cupy

        if not isinstance(cache, OffloadKVCache):
            raise TypeError(f"cache must be a psa_fast.offload.OffloadKVCache, got {type(cache).__name__}")
        # the loader's pool holds two iterations, so the resident plan's step="auto" (sized for HBM) is not its default
        options.setdefault("step", 64)
        super().__init__(cache, **options)
        # run() scales the query on the caller's stream: its graphs replay the plan's buffers
        self._query_branch, self._raw_query, self._fused_step = None, False, False
        if self.mode == "dense":
            raise ValueError("mode='dense' is not offloaded: it reads every block, use a resident PagedKVCache")
        if self.version != 3:
            raise ValueError("the offload decoder runs decode version 3")
        if self.first_chunk is not None:
            raise NotImplementedError("first_chunk is not offered with host offload yet (its loader names each "
                                      "iteration's blocks from step alone); use a resident PagedKVCache")
        if self.mode == "psa" and self.stop not in STOP_RULES:
            raise NotImplementedError(f"stop={self.stop!r} is not offered with host offload (it is meant for "
                                      "metadata='quant3', which the host store does not keep); use a resident "
                                      "PagedKVCache")
        self.lookahead = _validate.integer(lookahead, "lookahead", minimum=0)
        self.timeout = float(timeout)
        self.fault = fault
        b, gn, nmax = cache.batch, self.gn, cache.nmax
        forced = self.sink_blocks + self.recent_blocks if self.mode == "psa" else 0
        self._step_blocks = self.step if self.mode == "psa" else self.k
        self._forced = forced
        self.chunk = max(forced, self._step_blocks)             # the largest iteration per group
        per_iteration = b * blocks_per_iteration(num_q_heads=self.hq, num_kv_heads=cache.num_kv_heads,
                                                 step=self._step_blocks, gqa=self.gqa, sink_blocks=forced)
        if 2 * per_iteration > cache.pool.capacity_per_partition:
            raise ValueError(f"num_slots: the pool gives each layer {cache.pool.capacity_per_partition} slots, but "
                             f"two iterations of this batch name up to {2 * per_iteration} blocks ({b} requests x "
                             f"{gn} groups x {self.chunk} blocks, the one attended and the one loading)")
        self.max_iterations = 1 + (1 if forced else 0) + -(-max(nmax - forced, 0) // self._step_blocks)
        if self.mode == "topk":
            self.max_iterations = 1
        i32 = cupy.int32
        self.istate = cupy.zeros((b * gn, 4), i32)
        self.vstate = cupy.zeros((b, self.hq, 7 + cache.dp), cupy.float32)
        self.groups_left = cupy.zeros(1, i32)
        self.ids = cupy.full((b, gn, self.chunk), -1, i32)
        # Two int32 in mapped pinned memory that the GPU writes and the host polls: the done flag (the
        # token of the last step whose loop stopped) and the number of loader launches completed.
        self._done_ptr = cupy.cuda.runtime.hostAlloc(8, CUDA_HOST_ALLOC_MAPPED)
        flags = np.ctypeslib.as_array(ctypes.cast(self._done_ptr, ctypes.POINTER(ctypes.c_int32)), (2,))
        flags[:] = 0
        self.done_host, self.progress_host = flags[0:1], flags[1:2]
        self.launches = cupy.zeros(1, i32)    # launches completed, copied to progress_host by each
        self._launched = 0                    # launches issued (the host's count of the same)
        self._token = 0
        self.token = cupy.zeros(1, i32)       # this step's token, written to done_host by the last group to stop
        self.iteration = cupy.zeros(1, i32)   # the next iteration to load
        self.stream = cupy.cuda.Stream(non_blocking=True)         # attention (a graph cannot capture the null stream)
        self.loader_stream = cupy.cuda.Stream(non_blocking=True)  # pool accesses and gathers
        self.graphs = bool(graphs)
        self.unroll = _validate.integer(unroll, "unroll", minimum=1)
        self.loader_thread = bool(loader_thread)
        self._graphs: dict = {}   # (layer, pool generation, first) -> captured first load / iterations
        self._warm: set = set()   # (layer, pool generation) that ran once eagerly
        self._prologues: dict = {}  # layer -> captured estimate, order and state reset
        self._prologue_warm: set = set()
        self.stats = {"steps": 0, "iterations": 0, "host_wait_s": 0.0}

    def __del__(self):
        ptr = getattr(self, "_done_ptr", None)
        if ptr:
            try:
                import cupy

                cupy.cuda.runtime.freeHost(ptr)
            except Exception:
                pass

    def _l2_first_blocks(self) -> int:
        """0: the block table here names blocks of the host store, not pool slots, so the order kernel asks nothing
        into L2 (``_kernels.ORDER_L2_FIRST_MIB``); the loader brings each iteration's blocks in."""
        return 0

    def _reset_state(self) -> None:
        """One launch: every group running from position 0, the verifier and output state empty,
        the token advanced to this step's (the device's count of steps, as ``self._token`` on the
        host), the iteration counter at 0."""
        groups, rows = self.istate.shape[0], self.vstate.shape[0] * self.vstate.shape[1]
        _reset_kernel()(np.int32(groups), np.int32(rows), np.int32(self.vstate.shape[-1]), self.istate, self.vstate,
                        self.groups_left, self.token, self.iteration, size=max(groups, rows))

    def _prologue(self, layer: int) -> None:
        """On ``self.stream``: estimate, order and the state reset of a step, replayed as one CUDA
        graph once the layer has run eagerly (their launches cost the host ~250 µs per layer)."""
        def stages():
            self.estimate(layer)
            self.order(layer)
            self._reset_state()

        if not self.graphs or layer not in self._prologue_warm:
            stages()
            self._prologue_warm.add(layer)
            return
        if layer not in self._prologues:
            self.stream.begin_capture()
            stages()
            self._prologues[layer] = self.stream.end_capture()
        self._prologues[layer].launch(self.stream)

    def _load(self, layer: int) -> None:
        """On the loader stream: name the blocks of iteration ``*self.iteration``, make them resident
        (pool access), gather the misses from host memory, and count the iteration."""
        c = self.cache
        ids_fn = _kernels.kernel("iteration_ids", d=16, s=c.block_size, g=self.g)
        head = self.k if self.mode == "topk" else c.nmax  # top-k's order holds only its first k positions
        ids_fn((self.gn, c.batch), (min(1024, max(32, self.chunk)),),
               (self.order_buf, self.istate, c.seq_lens[layer], c.block_table[layer], self.ids, np.int32(self.hq),
                np.int32(c.num_kv_heads), np.int32(c.nmax), np.int32(self.chunk), self.iteration,
                np.int32(self._forced), np.int32(self._step_blocks), np.int32(head)))
        acc = c.pool.access(self.ids.ravel(), c.partition(layer))
        hk, hv = c.store.device_pointers
        gather = _kernels.kernel("gather", d=c.dp, s=c.block_size, g=1, gather_threads=GATHER_THREADS, device_count=1)
        gather((_gather_grid(self.ids.size),), (GATHER_THREADS,),
               (np.uint64(hk), np.uint64(hv), acc.load_src, acc.load_dst, acc.num_loads, c.slot_k, c.slot_v))
        self.iteration += 1

    def _attend_one(self, layer: int) -> None:
        """On the current stream: one iteration of the loop over resident blocks (decode, PSA_OFFLOAD)."""
        c = self.cache
        stop, thr, step, forced = ((self.stop, self.threshold if self.threshold < 1 else 2.0, self.step,
                                    self._forced) if self.mode == "psa" else ("budget", 2.0, self.k, 0))
        _kernels.decode(self.q, c.slot_k, c.slot_v, c.block_table[layer], c.seq_lens[layer], self.order_buf,
                        self.log_suffix, self.out, self.num_used, self.iterations, self.reason, self.mass_estimate,
                        d=c.dp, hkv=c.num_kv_heads, stop=stop, threshold=thr, step=step, forced=forced,
                        cluster=self.cluster, warps=self.warps, version=3, stages=self.stages,
                        offload=(c.pool.slot_of, self.istate, self.vstate, self.groups_left, self._done_ptr,
                                 self.token), q_mma=self.q_mma, qk_scale=self.qk_scale, **self._shape())

    def _iteration(self, layer: int, attend: bool = True) -> None:
        """Issue one pipelined iteration from ``self.stream``: fork the loader stream, which loads the
        next iteration's blocks, attend the current one meanwhile (unless ``attend`` is False: the
        first load of a step), and join the loader back into ``self.stream``."""
        st, ld = self.stream, self.loader_stream
        ld.wait_event(st.record())
        with ld:
            self._load(layer)
        if attend:
            with st:
                self._attend_one(layer)
        st.wait_event(ld.record())

    def _captured(self, layer: int, first: bool):
        """A CUDA graph on ``self.stream``: iteration 0's load (``first``), or ``unroll`` pipelined
        iterations, each attending iteration j while the loader stream brings in j + 1 (its pool
        access may not evict j's blocks: they stay pinned). Captured once per layer and pool (the
        pool's state arrays are baked into it)."""
        key = (layer, self.cache.pool_generation, first)
        if key not in self._graphs:
            st = self.stream
            st.begin_capture()
            if first:
                self._iteration(layer, attend=False)
            else:
                for _ in range(self.unroll):
                    self._iteration(layer)
                self._mark()
            self._graphs = {k: g for k, g in self._graphs.items() if k[1] == key[1]}  # drop a reset pool's
            self._graphs[key] = st.end_capture()
        return self._graphs[key]

    def _mark(self) -> None:
        """On the current stream: count a completed launch into ``progress_host`` (mapped memory)."""
        _mark_kernel()((1,), (1,), (self.launches, np.uint64(self._done_ptr + 4)))

    def _wait_launch(self, n: int, token: int) -> None:
        """Poll mapped memory (no CUDA call) until launch ``n`` of the loop (counted from
        ``self._launched`` before the loop) has completed or this step's loop has stopped."""
        t0 = time.perf_counter()
        deadline = t0 + self.timeout
        while int(self.progress_host[0]) < n and self.done_host[0] != token:
            if time.perf_counter() > deadline:
                raise TimeoutError(f"the GPU did not finish an offload launch in {self.timeout} s")
        self.stats["host_wait_s"] += time.perf_counter() - t0

    def _loader(self, layer: int, token: int, failure: list) -> None:
        """The loader thread: load iteration 0, then launch the pipelined iterations (attend j, load
        j + 1; ``unroll`` per graph launch) until the decode kernel writes this step's token into the
        done flag. It runs at most ``lookahead`` launches ahead of the GPU: before launch n it polls
        mapped memory until launch n - 1 - lookahead has completed (each launch ends by counting
        itself there), then reads the flag. No CUDA synchronisation call is made."""
        st = self.stream
        first = self._launched
        try:
            with st:
                if self.fault:
                    for stage in ("ids", "access", "gather"):
                        self.fault(stage, 0)
                # the first step of a layer (and pool) runs eagerly: it compiles the kernels and
                # allocates the pool's outputs, which a capture may not do
                warm = self.graphs and (layer, self.cache.pool_generation) in self._warm
                if warm:  # iteration 0's blocks
                    self._captured(layer, first=True).launch(st)
                else:
                    self._iteration(layer, attend=False)
                graph = self._captured(layer, first=False) if warm else None
                per_launch = self.unroll if graph is not None else 1
                for n, j in enumerate(range(0, self.max_iterations, per_launch)):  # launch n: iterations j..
                    if n >= 1 + self.lookahead:
                        self._wait_launch(first + n - self.lookahead, token)
                        if self.done_host[0] == token:
                            break
                    if self.fault:
                        for k in range(j + 1, min(j + 1 + per_launch, self.max_iterations)):
                            for stage in ("ids", "access", "gather"):
                                self.fault(stage, k)
                    if graph is not None:
                        graph.launch(st)  # ends with _mark()
                    else:
                        self._iteration(layer)
                        self._mark()
                    self._launched += 1
                    self.stats["iterations"] += per_launch
            self._warm.add((layer, self.cache.pool_generation))
        except BaseException as e:  # surfaces in the caller
            failure.append(e)

    def run(self, q, layer: int = 0) -> DecodeOutput:
        """Attend ``q`` (``[B, Hq, D]``) to layer ``layer``, as [`DecodePlan.run`][psa_fast.DecodePlan.run], with
        offload.

        The query is scaled on the caller's stream; the estimate, the order and the loop then run on
        the decoder's streams (after the first step of a layer, the first three as one CUDA graph).
        Returns once the last iteration is launched; results are ready in the caller's stream order.

        Raises:
            LoaderError: as [`attend`][psa_fast.offload.OffloadDecoder.attend].
        """
        layer = self.load_query(q, layer)
        return self._attend(layer, prologue=True)

    def attend(self, layer: int) -> DecodeOutput:
        """Stage 3 with offload (after [`estimate`][psa_fast.DecodePlan.estimate] and
        [`order`][psa_fast.DecodePlan.order] on the caller's stream): the loader brings each iteration's blocks in and
        launches it.

        Returns once the last iteration is launched (results are ready in the current stream's order).

        Raises:
            LoaderError: the loader failed (an exception in it, e.g. an injected fault); the pool was
                reset, so no slot is stale, and the host store still holds every block.
        """
        return self._attend(layer, prologue=False)

    def _attend(self, layer: int, prologue: bool) -> DecodeOutput:
        import cupy

        c = self.cache
        compute = cupy.cuda.get_current_stream()
        self._token += 1
        self.stream.wait_event(compute.record())
        c.wait_for_writeback(self.stream)  # gathers read the host store: appended rows must be there
        with self.stream:
            if prologue:
                self._prologue(layer)
            else:
                self._reset_state()
        failure: list = []
        if self.loader_thread:
            thread = threading.Thread(target=self._loader, args=(layer, self._token, failure), daemon=True)
            thread.start()
            thread.join(timeout=self.timeout)
            if thread.is_alive():
                raise TimeoutError(f"the offload loader did not finish layer {layer} in {self.timeout} s")
        else:
            self._loader(layer, self._token, failure)
        if failure:
            self.loader_stream.synchronize()
            self.stream.synchronize()
            c.reset_pool()
            raise LoaderError(f"the offload loader failed in layer {layer}: {failure[0]!r}") from failure[0]
        # Every loader launch was joined back into self.stream, so this one wait also keeps later work
        # on the caller's stream (an append's write-through, the next step) behind the speculative
        # accesses and gathers.
        compute.wait_event(self.stream.record())
        self.stats["steps"] += 1
        return DecodeOutput(self.out[..., : c.head_dim], self.order_buf, self.num_used, self.iterations, self.reason,
                            self.mass_estimate)


def _gather_grid(n: int) -> int:
    """CTAs of a gather of up to ``n`` blocks: one per block, at most 16 per SM (each loops over blocks)."""
    return max(1, min(n, GATHER_CTAS_PER_SM * _kernels.num_sms()))


@functools.lru_cache(maxsize=1)
def _mark_kernel():
    import cupy

    return cupy.RawKernel(r"""
    extern "C" __global__ void psa_mark(int* launches, unsigned long long host) {
        const int c = launches[0] + 1;  // the launches before this one are complete (stream order)
        launches[0] = c;
        __threadfence_system();
        *reinterpret_cast<volatile int*>(host) = c;
    }""", "psa_mark")


@functools.lru_cache(maxsize=1)
def _reset_kernel():
    import cupy

    return cupy.ElementwiseKernel(
        "int32 groups, int32 rows, int32 width",
        "raw int32 istate, raw float32 vstate, raw int32 groups_left, raw int32 token, raw int32 iteration",
        """
        if (i < groups) {  // position 0, no iteration done, running
            istate[4 * i] = 0; istate[4 * i + 1] = 0; istate[4 * i + 2] = -1; istate[4 * i + 3] = 0;
        }
        if (i < rows) {  // one head: M, acc, min, ema, frac, output max, output mass, O[D]
            const float inf = __int_as_float(0x7f800000);
            float* v = &vstate[(long long)i * width];
            for (int k = 0; k < width; ++k) v[k] = 0.f;
            v[0] = -inf;
            v[2] = inf;
            v[5] = -inf;
        }
        if (i == 0) { groups_left[0] = groups; token[0] += 1; iteration[0] = 0; }
        """, "psa_offload_reset")
