"""KV cache manager on the GPU: the slot pool's policy, decided on the device.

The device twin of [`psa_ref.kvcache.pool.UnifiedPool`][psa_ref.kvcache.pool.UnifiedPool] /
[`psa_ref.kvcache.pool.PerLayerPool`][psa_ref.kvcache.pool.PerLayerPool]. The slots themselves (one ``[slots, S, Dp]``
tensor per K and V) belong to the caller; a [`GPUSlotPool`][psa_fast.pool.GPUSlotPool] owns only the *policy state*, on
the device, and decides for each access which
blocks hit, which slot every block gets and which blocks are evicted, with no host round trip:
[`GPUSlotPool.access`][psa_fast.pool.GPUSlotPool.access] launches one kernel and never synchronises, so the loader can
enqueue the copies (``load_src -> load_dst``) right behind it on the same stream.

Blocks are named by an int32 *store id*, ``0 <= id < num_store_blocks``; the caller maps
``(request, layer, kv_head, block)`` to ids. The kernel is the reference's ``SlotPool.access`` loop
run by one thread, line for line (LRU order, victim choice and the free-stack order are
sequential by nature). Cost on an H200, measured: ~0.85 us of dependent global loads per id (25 us for 32
ids, 0.2 ms for 256, 3.5 ms for 4096), plus ~170-260 us of Numba dispatch on the host per launch (24
arguments); ``kernel="cuda"`` (the default on a GPU) launches the same loop, translated to CUDA C,
through CuPy instead.

Device state (``P`` partitions of ``per = num_slots / P`` slots; partition ``p`` owns slots
``[p * per, (p + 1) * per)``):

==================  ============================  ========================================
``slot_of``         ``[num_store_blocks]`` int32  slot of a resident block, -1 otherwise
``block_of``        ``[num_slots]`` int32         store id held by a slot, -1 if free
``next``, ``prev``  ``[num_slots + P]`` int32     a circular doubly linked list per partition, in policy
                                                  order; node ``num_slots + p`` is partition ``p``'s
                                                  sentinel, ``next[sentinel]`` the next victim
``free``            ``[num_slots]`` int32         a stack per partition, ``free[p * per : p * per + free_top[p]]``;
                                                  a pop takes the top, as the reference's ``list.pop()``
``free_top``        ``[P]`` int32
``pin``             ``[num_slots]`` int64         the partition epoch in which the slot's block was last named
``epoch``           ``[P]`` int64                 accesses made to each partition
``load_seq``        ``[num_slots]`` int64         when the slot was last loaded (orders
[`release`][psa_fast.pool.GPUSlotPool.release]) ``counters``        ``[4]`` int64                 hits, misses,
evictions, blocks loaded ``error``           ``[1]`` int32                 0, or an error code set by a kernel (see
[`check`][psa_fast.pool.GPUSlotPool.check]) ==================  ============================
========================================
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from psa_ref import _validate

from ._compat import as_cupy, patch_numpy_for_numba, require_gpu

patch_numpy_for_numba()

from numba import cuda  # noqa: E402

from .metadata import _no_sync, _simulating, _stream  # noqa: E402

POLICIES = ("lru", "fifo")
KERNELS = ("numba", "cuda", "parallel")
_ID_THREADS = 256  # kernel="parallel": threads per CTA of the grid launches (PSA_ID_T in pool_parallel.cu)
WIDE_CTAS_PER_SM = 4  # kernel="parallel": grid of its per-id and log launches, per SM
_LOG_TILE = _ID_THREADS * 8  # log entries per tile of a compaction (PSA_TILE)
LOG_PER_SLOT = 4  # kernel="parallel": log entries per slot of a partition (>= 1 + ids per access / slots)

# error codes written to GPUSlotPool.error by the kernels
NO_VICTIM = 1  # every block of the partition is pinned
BAD_ID = 2  # an id outside -1 .. num_store_blocks - 1
WRONG_PARTITION = 3  # a resident block accessed through another partition
ERRORS = {
    NO_VICTIM: "an access found no victim: every resident block of its partition was pinned (named by this "
               "access, or by the previous one with pin_window=2); access fewer distinct blocks at a time",
    BAD_ID: "an id outside -1 .. num_store_blocks - 1 was passed",
    WRONG_PARTITION: "a resident block was accessed through another partition than the one that loaded it",
}
_NO_ORDER = np.iinfo(np.int64).max  # release: sort key of an id that is not resident


@dataclass(frozen=True)
class PoolAccess:
    """What one [`GPUSlotPool.access`][psa_fast.pool.GPUSlotPool.access] of ``n`` ids decided, as device arrays.

    Attributes:
        slots: ``[n]`` int32, the slot of each id after the access (-1 for a skipped id).
        hit: ``[n]`` int8, 1 hit, 0 miss (loaded), -1 skipped (id -1, or after an error).
        load_src: ``[n]`` int32, store ids to copy from the host store, in access order;
            only the first ``num_loads[0]`` entries are valid.
        load_dst: ``[n]`` int32, the slot each of them goes to.
        num_loads: ``[1]`` int32.
        evicted: ``[n]`` int32, store ids evicted, in eviction order; the first ``num_evicted[0]`` are valid.
        num_evicted: ``[1]`` int32.
    """

    slots: Any
    hit: Any
    load_src: Any
    load_dst: Any
    num_loads: Any
    evicted: Any
    num_evicted: Any

    @staticmethod
    def empty(n: int, xp=None) -> "PoolAccess":
        """Allocate the outputs of an access of ``n`` ids (``xp``: cupy by default on a GPU, numpy under
        the simulator)."""
        xp = _xp() if xp is None else xp
        return PoolAccess(slots=xp.empty(n, np.int32), hit=xp.empty(n, np.int8), load_src=xp.empty(n, np.int32),
                          load_dst=xp.empty(n, np.int32), num_loads=xp.zeros(1, np.int32),
                          evicted=xp.empty(n, np.int32), num_evicted=xp.zeros(1, np.int32))


# --- kernels: the reference's loops, one thread ---------------------------------------------------


@cuda.jit(device=True)
def _unlink(nxt, prv, node):
    nxt[prv[node]] = nxt[node]
    prv[nxt[node]] = prv[node]


@cuda.jit(device=True)
def _append(nxt, prv, node, sentinel):
    """Put ``node`` at the tail of the list (last to be evicted)."""
    tail = prv[sentinel]
    nxt[tail] = node
    prv[node] = tail
    nxt[node] = sentinel
    prv[sentinel] = node


@cuda.jit
def _access_kernel(ids, p, per, lru, pin_window, slot_of, block_of, nxt, prv, free, free_top, pin, epoch,
                   load_seq, seq, counters, error, slots, hit, load_src, load_dst, num_loads, evicted, num_evicted):
    # One thread, like psa_ref.kvcache.pool.SlotPool.access. The cost is latency: ~1 us per id of dependent global
    # loads, so counters live in registers and are written back once.
    if cuda.grid(1) != 0:
        return
    sentinel = block_of.shape[0] + p
    e = epoch[p] + 1
    epoch[p] = e
    oldest_pinned = e - pin_window + 1  # pin >= this: named by this access or the last pin_window - 1
    for i in range(ids.shape[0]):  # the reference pins every block the access names before the loop
        b = ids[i]
        if 0 <= b < slot_of.shape[0]:
            s = slot_of[b]
            if s >= 0 and s // per == p:
                pin[s] = e
    num_free = free_top[p]
    next_seq = seq[0]
    hits = 0
    loads = 0
    evictions = 0
    failed = False
    for i in range(ids.shape[0]):
        b = ids[i]
        slots[i] = -1
        hit[i] = -1
        if failed or b == -1:
            continue
        if b < -1 or b >= slot_of.shape[0]:
            error[0] = BAD_ID
            failed = True
            continue
        s = slot_of[b]
        if s >= 0:
            if s // per != p:
                error[0] = WRONG_PARTITION
                failed = True
                continue
            hit[i] = 1
            hits += 1
            if lru:  # a hit moves to the back of the eviction order
                _unlink(nxt, prv, s)
                _append(nxt, prv, s, sentinel)
        else:
            if num_free > 0:  # the reference's free.pop()
                num_free -= 1
                s = free[p * per + num_free]
            else:
                s = nxt[sentinel]  # first in policy order that is not pinned
                while s != sentinel and pin[s] >= oldest_pinned:
                    s = nxt[s]
                if s == sentinel:  # nothing changed for this id: the state stays consistent
                    error[0] = NO_VICTIM
                    failed = True
                    continue
                _unlink(nxt, prv, s)
                victim = block_of[s]
                slot_of[victim] = -1
                evicted[evictions] = victim
                evictions += 1
            slot_of[b] = s
            block_of[s] = b
            _append(nxt, prv, s, sentinel)
            load_seq[s] = next_seq
            next_seq += 1
            load_src[loads] = b
            load_dst[loads] = s
            loads += 1
            hit[i] = 0
        pin[s] = e  # a block loaded now is pinned for the rest of the access
        slots[i] = s
    free_top[p] = num_free
    seq[0] = next_seq
    counters[0] += hits
    counters[1] += loads  # every miss is loaded
    counters[2] += evictions
    counters[3] += loads
    num_loads[0] = loads
    num_evicted[0] = evictions


@cuda.jit
def _release_kernel(ids, order, per, slot_of, block_of, nxt, prv, free, free_top, error):
    # frees in `order` (by load time, as the reference's dict of resident blocks); not evictions
    if cuda.grid(1) != 0:
        return
    for k in range(order.shape[0]):
        b = ids[order[k]]
        if b == -1:
            continue
        if b < -1 or b >= slot_of.shape[0]:
            error[0] = BAD_ID
            continue
        s = slot_of[b]
        if s < 0:
            continue
        p = s // per
        _unlink(nxt, prv, s)
        slot_of[b] = -1
        block_of[s] = -1
        free[p * per + free_top[p]] = s
        free_top[p] += 1


# --- the pool ---------------------------------------------------------------------------------------


class GPUSlotPool:
    """Policy state of ``num_slots`` slots caching ``num_store_blocks`` blocks, on the device.

    Args:
        num_slots: ``>= 1`` slots (one block of one KV head each).
        num_store_blocks: ``>= 1``, the range of store ids.
        num_partitions: 1 for a unified pool, ``L`` for a per-layer pool (``num_slots`` must be a
            multiple of it; partition ``p`` owns slots ``[p * per, (p + 1) * per)``).
        policy: ``"lru"`` (default) or ``"fifo"``.
        pin_window: 1 (the reference): an access never evicts a block it names; 2: nor a
            block named by the previous access of the same partition (a pipelined decoder may still
            be reading those slots). Then two consecutive accesses of a partition must fit in its
            slots together, or the second one fails (see [`check`][psa_fast.pool.GPUSlotPool.check]).
        kernel: how [`access`][psa_fast.pool.GPUSlotPool.access] decides: ``"numba"`` (the readable kernel, the one CI
            runs under the simulator), ``"cuda"`` (``kernels/pool_access.cu``, its line-for-line CUDA C
            translation, launched by CuPy in ~10 µs instead of Numba's ~200 µs of dispatch), or
            ``"parallel"`` (``kernels/pool_parallel.cu``: the same decisions for every valid access,
            the per-id work on the whole GPU and what is sequential by nature (misses in order,
            victims) on one CTA of 1024 threads, with the policy order kept as stamps and a log of them
            instead of a linked list; an access with a bad id or too few victims changes nothing
            there, where the sequential kernels keep the ids before the failure). Default:
            ``"parallel"`` on a GPU, ``"numba"`` under the simulator.

    Device arrays are CuPy arrays on a GPU and NumPy arrays under Numba's CUDA simulator
    (``NUMBA_ENABLE_CUDASIM=1``); kernels run on CuPy's current stream.
    """

    def __init__(self, num_slots: int, *, num_store_blocks: int, num_partitions: int = 1, policy: str = "lru",
                 pin_window: int = 1, kernel: str | None = None):
        self.num_slots = _validate.integer(num_slots, "num_slots", minimum=1)
        self.num_store_blocks = _validate.integer(num_store_blocks, "num_store_blocks", minimum=1)
        self.num_partitions = _validate.integer(num_partitions, "num_partitions", minimum=1)
        self.policy = _validate.choice(policy, "policy", POLICIES)
        self.pin_window = _validate.integer(pin_window, "pin_window", minimum=1)
        if self.num_slots % self.num_partitions:
            raise ValueError(f"num_slots ({num_slots}) must be a multiple of num_partitions ({num_partitions}) so "
                             "that every partition gets the same share")
        if self.num_store_blocks >= 2**31:
            raise ValueError(f"num_store_blocks must be < 2**31 (int32 ids), got {num_store_blocks}")
        if not _simulating():
            require_gpu()
        self.kernel = _validate.choice(kernel or ("numba" if _simulating() else "parallel"), "kernel", KERNELS)
        if self.kernel != "numba" and _simulating():
            raise ValueError(f"kernel={self.kernel!r} needs a GPU; under Numba's simulator use kernel='numba'")
        _no_sync()
        xp = _xp()
        if self.kernel == "parallel":
            self.log_capacity = LOG_PER_SLOT * self.capacity_per_partition
        for name, array in self._fresh_state(xp).items():
            setattr(self, name, array)
        # Numba views made once: Numba converts a CuPy argument at every launch (~15 us per array on an H200)
        arrays = (self.slot_of, self.block_of, self.next, self.prev, self.free, self.free_top, self.pin, self.epoch,
                  self.load_seq, self.seq, self.counters, self.error)
        self._state = None if self.kernel != "numba" else tuple(_kernel_view(a) for a in arrays)
        self._outputs: dict[int, tuple[PoolAccess, tuple]] = {}  # n -> outputs and their Numba views

    def _fresh_state(self, xp) -> dict:
        """The device state of an empty pool: every slot free, nothing resident, counters at zero."""
        n, pp, per = self.num_slots, self.num_partitions, self.capacity_per_partition
        st = {}
        st["slot_of"] = xp.full(self.num_store_blocks, -1, np.int32)
        st["block_of"] = xp.full(n, -1, np.int32)
        sentinels = np.arange(n, n + pp, dtype=np.int32)  # every list empty: sentinel <-> itself
        st["next"] = xp.asarray(np.concatenate([np.full(n, -1, np.int32), sentinels]))
        st["prev"] = xp.asarray(np.concatenate([np.full(n, -1, np.int32), sentinels]))
        # the reference's free list of partition p is [top slot, ..., lowest slot]: pop() gives the lowest
        st["free"] = xp.asarray(np.arange(n, dtype=np.int32).reshape(pp, per)[:, ::-1].ravel())
        st["free_top"] = xp.full(pp, per, np.int32)
        st["pin"] = xp.full(n, -(2**62), np.int64)
        st["epoch"] = xp.zeros(pp, np.int64)
        st["load_seq"] = xp.zeros(n, np.int64)
        st["seq"] = xp.zeros(1, np.int64)
        st["counters"] = xp.zeros(4, np.int64)
        st["error"] = xp.zeros(1, np.int32)
        if self.kernel == "parallel":  # the policy order as stamps, and a log of them per partition
            st["stamp"] = xp.zeros(n, np.int64)
            st["clock"] = xp.ones(1, np.int64)
            # two buffers per partition: a compaction copies the live entries into the other one
            st["log_slot"] = xp.full(pp * 2 * self.log_capacity, -1, np.int32)
            st["log_stamp"] = xp.zeros(pp * 2 * self.log_capacity, np.int64)
            st["log_head"] = xp.zeros(pp, np.int64)
            st["log_tail"] = xp.zeros(pp, np.int64)
            st["log_base"] = xp.zeros(pp, np.int32)  # the current buffer of each partition
            st["log_count"] = xp.zeros(-(-self.log_capacity // _LOG_TILE) + 1, np.int32)  # live entries per tile
            st["claim"] = xp.full(self.num_store_blocks, np.iinfo(np.int32).max, np.int32)
            # one access from launch to launch: first bad id, ids named, any miss; failure, log tail, clock
            st["ctl"] = xp.asarray(np.array([np.iinfo(np.int64).max] + [0] * 7, np.int64))
        return st

    def clear(self) -> None:
        """Empty the pool in place (its arrays stay where they are, so CUDA graphs that captured them
        stay valid): afterwards it behaves as a new pool, counters included. Enqueued on the current
        stream; the caller must not clear while an access may still run on another stream."""
        for name, array in self._fresh_state(_xp()).items():
            getattr(self, name)[...] = array

    @property
    def capacity_per_partition(self) -> int:
        """Slots one partition holds: ``num_slots / num_partitions``."""
        return self.num_slots // self.num_partitions

    # --- the operation of the attention loop ----------------------------------------------------

    def access(self, ids: Any, partition: int = 0, *, out: PoolAccess | None = None) -> PoolAccess:
        """Make the blocks ``ids`` resident in ``partition``: hits, slots, loads and evictions, on the device.

        Args:
            ids: ``[n]`` int32 device array of store ids; ``-1`` entries are skipped (no effect, slot -1,
                not a hit, not loaded). A block named twice counts twice (the second a hit).
            partition: ``0 <= partition < num_partitions`` (the layer for a per-layer pool, 0 for unified).
            out: a [`PoolAccess`][psa_fast.pool.PoolAccess] of ``n`` entries to write into; by default one kept per
                ``n`` and reused by the next access of the same length (read or copy it before then).

        Returns:
            [`PoolAccess`][psa_fast.pool.PoolAccess]. Nothing is synchronised: results are ready in stream order.

        Raises:
            ValueError: ``n > capacity_per_partition`` (checked on the host, on ``n`` since the number of
                distinct ids is on the device); nothing changes then. If the kernel still finds no
                victim (duplicates do not count, but blocks pinned by the previous access do, with
                ``pin_window=2``), it sets ``error``, skips the remaining ids and leaves a consistent
                state; [`check`][psa_fast.pool.GPUSlotPool.check] raises it.
        """
        ids = _device_ids(ids)
        p = self._partition(partition)
        n = ids.shape[0]
        cap = self.capacity_per_partition
        if n > cap:
            raise ValueError(f"ids: an access of {n} blocks cannot fit in the {cap} slots that partition {p} may "
                             "use; access fewer blocks at a time")
        numba = self.kernel == "numba"  # only the Numba kernel takes views of the outputs
        if out is None:
            if n not in self._outputs:
                new = PoolAccess.empty(n)
                self._outputs[n] = new, _output_views(new) if numba else None
            out, out_views = self._outputs[n]
        else:
            _check_out(out, n)
            out_views = _output_views(out) if numba else None
        lru = int(self.policy == "lru")
        if self.kernel == "parallel":  # probe (grid), decide (one CTA), finish (grid)
            from . import _kernels

            def entry(name):
                return _kernels.kernel("pool_parallel", d=16, s=1, g=1, entry=name)

            wide = (WIDE_CTAS_PER_SM * _kernels.num_sms(),)  # the probe and the compaction may walk the whole log
            n32, p32, cap32 = np.int32(n), np.int32(p), np.int32(cap)
            c32 = np.int32(self.log_capacity)
            log = (self.log_slot, self.log_stamp, self.log_head, self.log_tail, self.log_base)
            entry("pool_probe")(wide, (_ID_THREADS,), (ids, n32, p32, cap32, np.int32(self.num_store_blocks), c32,
                                                       self.slot_of, self.block_of, self.pin, self.epoch, self.claim,
                                                       out.hit, self.ctl, self.stamp, *log, self.log_count))
            entry("pool_compact")(wide, (_ID_THREADS,), (n32, p32, c32, self.block_of, self.stamp, *log,
                                                         self.log_count))
            entry("pool_parallel")((1,), (1024,), (
                ids, n32, p32, cap32, np.int32(lru), np.int32(self.pin_window), np.int32(self.num_store_blocks), c32,
                self.slot_of, self.block_of, self.free, self.free_top, self.pin, self.epoch, self.load_seq, self.seq,
                self.counters, self.error, self.stamp, self.clock, *log, self.log_count, self.claim, self.ctl,
                out.hit, out.load_src, out.load_dst, out.num_loads, out.evicted, out.num_evicted))
            grid = (max(1, min(-(-n // _ID_THREADS), WIDE_CTAS_PER_SM * _kernels.num_sms())),)
            entry("pool_finish")(grid, (_ID_THREADS,), (ids, n32, p32, np.int32(lru), c32, self.slot_of, self.stamp,
                                                        self.log_slot, self.log_stamp, self.log_base, self.ctl,
                                                        out.slots, out.hit))
            return out
        if self.kernel == "cuda":
            from . import _kernels

            fn = _kernels.kernel("pool_access", d=16, s=1, g=1)
            fn((1,), (1,), (ids, np.int32(n), np.int32(p), np.int32(cap), np.int32(lru), np.int32(self.pin_window),
                            np.int32(self.num_slots), np.int32(self.num_store_blocks), self.slot_of, self.block_of,
                            self.next, self.prev, self.free, self.free_top, self.pin, self.epoch, self.load_seq,
                            self.seq, self.counters, self.error, out.slots, out.hit, out.load_src, out.load_dst,
                            out.num_loads, out.evicted, out.num_evicted))
            return out
        _access_kernel[1, 1, _stream()](_kernel_view(ids), p, cap, lru, self.pin_window, *self._state, *out_views)
        return out

    def release(self, ids: Any) -> None:
        """Free the slots of the resident blocks among ``ids`` (a finished request); not evictions.

        Slots go back to their partition's free stack in the order the blocks were (last) loaded, as
        psa_ref's ``SlotPool.release`` does, so later loads take the same slots as there. The caller
        must not release blocks that a pending access may still read.

        Args:
            ids: ``[n]`` int32 device array of store ids (any partitions; non-resident and -1 ignored).
        """
        ids = _device_ids(ids)
        xp = _xp()
        valid = (ids >= 0) & (ids < self.num_store_blocks)
        slot = xp.where(valid, self.slot_of[xp.clip(ids, 0, self.num_store_blocks - 1)], -1)
        key = xp.where(slot >= 0, self.load_seq[xp.maximum(slot, 0)], _NO_ORDER)
        order = xp.argsort(key).astype(np.int32)  # load times of resident blocks are distinct
        if self.kernel == "parallel":  # no linked list to unlink from: its log entries die with the block
            from . import _kernels

            fn = _kernels.kernel("pool_parallel", d=16, s=1, g=1, entry="pool_release")
            fn((1,), (1,), (ids, order, np.int32(ids.shape[0]), np.int32(self.capacity_per_partition),
                            np.int32(self.num_store_blocks), self.slot_of, self.block_of, self.free, self.free_top,
                            self.error))
            return
        _release_kernel[1, 1, _stream()](ids, order, self.capacity_per_partition, self.slot_of, self.block_of,
                                         self.next, self.prev, self.free, self.free_top, self.error)

    # --- inspection (these synchronise) -----------------------------------------------------------

    def check(self) -> None:
        """Raise ``RuntimeError`` if a kernel reported an error since the last check (then clear it)."""
        code = int(_host(self.error)[0])
        if code:
            self.error[...] = 0
            raise RuntimeError(f"GPUSlotPool: {ERRORS.get(code, f'error code {code}')}")

    def stats(self) -> dict[str, int]:
        """Counters since the pool was built: ``hits``, ``misses``, ``evictions``, ``loads``."""
        c = _host(self.counters)
        return {"hits": int(c[0]), "misses": int(c[1]), "evictions": int(c[2]), "loads": int(c[3])}

    def resident(self) -> np.ndarray:
        """``[num_store_blocks]`` int32 host copy of ``slot_of`` (-1 where not resident)."""
        return _host(self.slot_of)

    def eviction_order(self, partition: int = 0) -> list[int]:
        """Store ids resident in ``partition``, next victim first."""
        p = self._partition(partition)
        if self.kernel == "parallel":  # resident slots of the partition by stamp
            per = self.capacity_per_partition
            block_of, stamp = _host(self.block_of)[p * per : (p + 1) * per], _host(self.stamp)[p * per : (p + 1) * per]
            live = np.flatnonzero(block_of >= 0)
            return [int(block_of[i]) for i in live[np.argsort(stamp[live], kind="stable")]]
        nxt, block_of = _host(self.next), _host(self.block_of)
        sentinel = self.num_slots + p
        order, node = [], int(nxt[sentinel])
        while node != sentinel:
            order.append(int(block_of[node]))
            node = int(nxt[node])
        return order

    def _partition(self, partition) -> int:
        if isinstance(partition, (bool, np.bool_)) or not isinstance(partition, (int, np.integer)):
            raise TypeError(f"partition must be an integer, got {type(partition).__name__} {partition!r}")
        if not 0 <= partition < self.num_partitions:
            raise ValueError(f"partition must lie in 0 .. {self.num_partitions - 1}, got {partition}")
        return int(partition)


# --- helpers -----------------------------------------------------------------------------------------


def _xp():
    """The array module of device arrays: NumPy under the simulator, CuPy on a GPU."""
    if _simulating():
        return np
    import cupy

    return cupy


def _output_views(out: PoolAccess) -> tuple:
    """The Numba views of an access's outputs, in field order."""
    return tuple(_kernel_view(getattr(out, f.name)) for f in fields(PoolAccess))


def _kernel_view(a):
    """What the kernels are passed: a NumPy array as is (simulator), a CuPy array as a Numba view (no copy)."""
    return a if isinstance(a, np.ndarray) else cuda.as_cuda_array(a)


def _host(a) -> np.ndarray:
    """A host copy (synchronises on a GPU)."""
    if isinstance(a, np.ndarray):
        return a.copy()
    import cupy

    return cupy.asnumpy(a)


def _device_ids(ids):
    """Check ``ids``: a 1-D int32 device array (a NumPy array under the simulator)."""
    if _simulating():
        if not isinstance(ids, np.ndarray):
            raise TypeError(f"ids must be an int32 array (NumPy under the CUDA simulator), got {type(ids).__name__}")
        if ids.dtype != np.int32:
            raise TypeError(f"ids must have dtype int32, got {ids.dtype}")
        if not ids.flags.c_contiguous:
            raise ValueError(f"ids must be C-contiguous; got strides {ids.strides}")
    else:
        ids = as_cupy(ids, "ids", dtypes=("int32",))
    if ids.ndim != 1:
        raise ValueError(f"ids must have shape [n], got {ids.ndim} dimensions {tuple(ids.shape)}")
    return ids


_OUT_DTYPES = {"slots": np.int32, "hit": np.int8, "load_src": np.int32, "load_dst": np.int32,
               "num_loads": np.int32, "evicted": np.int32, "num_evicted": np.int32}


def _check_out(out, n: int) -> None:
    if not isinstance(out, PoolAccess):
        raise TypeError(f"out must be a PoolAccess (PoolAccess.empty(n)), got {type(out).__name__}")
    for f in fields(PoolAccess):
        a = getattr(out, f.name)
        shape = (1,) if f.name.startswith("num_") else (n,)
        if tuple(a.shape) != shape or a.dtype != _OUT_DTYPES[f.name]:
            raise ValueError(f"out.{f.name} must have shape {list(shape)} and dtype "
                             f"{np.dtype(_OUT_DTYPES[f.name])}, got {list(a.shape)} {a.dtype}")
