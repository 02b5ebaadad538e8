"""psa_fast.pool.GPUSlotPool, the device twin of psa_ref's pools (on the GPU, or under Numba's CUDA simulator).

* With ``pin_window=1`` it is psa_ref's UnifiedPool / PerLayerPool: random accesses and releases on both give
  the same hits, slots, evictions (in order), loads, stats and eviction order after every step.
* With ``pin_window=2`` it matches a plain model in which the blocks of the previous access of a partition are
  pinned too, and never evicts them; an access that finds no victim sets the error flag and changes no
  resident block's slot.
"""

from collections import OrderedDict, deque

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

pytest.importorskip("numba")

from psa_fast import pool as fast_pool  # noqa: E402
from psa_fast._compat import gpu_available  # noqa: E402
from psa_fast.pool import GPUSlotPool, PoolAccess  # noqa: E402
from psa_ref.kvcache.pool import PerLayerPool, UnifiedPool  # noqa: E402
from psa_ref.kvcache.store import BlockKey, HostStore  # noqa: E402

if gpu_available() and not fast_pool._simulating():
    import cupy as xp

    to_host = xp.asnumpy
    KERNELS = st.sampled_from(["numba", "cuda", "parallel"])  # the readable kernel, its CUDA C twin, the fast one
    SEQUENTIAL = "cuda"
else:
    xp = np
    KERNELS = st.just("numba")
    SEQUENTIAL = "numba"

    def to_host(a):
        return np.array(a)  # a copy: the pool reuses its output arrays

ON_GPU = not fast_pool._simulating() and gpu_available()


L, HKV, NMAX, S, D = 2, 2, 3, 2, 2  # layers, KV heads, most blocks per (request, layer), block size, head dim
R = 3  # requests
NUM_IDS = R * L * HKV * NMAX
ALL_KEYS = [BlockKey(r, layer, kv, b) for r in range(R) for layer in range(L) for kv in range(HKV) for b in range(NMAX)]


def block_id(key: BlockKey) -> int:
    """The fixed enumeration of the store's blocks that the test uses as store ids."""
    return ((key.request * L + key.layer) * HKV + key.kv_head) * NMAX + key.block


def request_ids(request: int) -> np.ndarray:
    return np.arange(request * L * HKV * NMAX, (request + 1) * L * HKV * NMAX, dtype=np.int32)


def ids_array(ids) -> "xp.ndarray":
    return xp.asarray(np.asarray(ids, dtype=np.int32))


def read_access(acc: PoolAccess) -> dict:
    nl, ne = int(to_host(acc.num_loads)[0]), int(to_host(acc.num_evicted)[0])
    return {"slots": to_host(acc.slots), "hit": to_host(acc.hit), "load_src": to_host(acc.load_src)[:nl],
            "load_dst": to_host(acc.load_dst)[:nl], "evicted": to_host(acc.evicted)[:ne]}


# --- pin_window=1: the twin of psa_ref ---------------------------------------------------------------

CONFIGS = st.sampled_from([("unified", "lru"), ("unified", "fifo"), ("per_layer", "lru"), ("per_layer", "fifo")])
TRIPLE = st.tuples(st.integers(0, R - 1), st.integers(0, HKV - 1), st.integers(0, NMAX - 1))
ACCESS = st.tuples(st.just("access"), st.integers(0, L - 1), st.lists(st.none() | TRIPLE, max_size=8))
RELEASE = st.tuples(st.just("release"), st.integers(0, R - 1), st.just(None))


@given(config=CONFIGS, per=st.integers(1, 4), tokens=st.lists(st.integers(1, NMAX * S), min_size=R * L,
                                                              max_size=R * L),
       steps=st.lists(ACCESS | RELEASE, min_size=10, max_size=60), kernel=KERNELS)
def test_twin_of_reference_pools(config, per, tokens, steps, kernel):
    kind, policy = config
    store = HostStore(num_layers=L, num_kv_heads=HKV, head_dim=D, block_size=S, dtype=np.float32)
    for r in range(R):
        for layer in range(L):
            t = tokens[r * L + layer]
            store.extend(r, layer, np.zeros((HKV, t, D)), np.zeros((HKV, t, D)))
    if kind == "unified":
        ref, parts = UnifiedPool(per * L, policy, store=store), 1
    else:
        ref, parts = PerLayerPool(per * L, L, policy, store=store), L
    gpu = GPUSlotPool(per * L, num_store_blocks=NUM_IDS, num_partitions=parts, policy=policy, pin_window=1,
                      kernel=kernel)
    assert gpu.capacity_per_partition == ref.capacity_per_layer

    for op, arg, named in steps:
        if op == "release":
            ref.release(arg)
            gpu.release(ids_array(request_ids(arg)))
        else:
            layer = arg
            named = named[: ref.capacity_per_layer]  # the length bounds the access (-1 entries included)
            keys = [None if t is None else BlockKey(t[0], layer, t[1], t[2] % store.num_blocks(t[0], layer))
                    for t in named]
            expected = ref.access(layer, [k[:1] + k[2:] for k in keys if k is not None])
            got = read_access(gpu.access(ids_array([-1 if k is None else block_id(k) for k in keys]),
                                         layer if parts > 1 else 0))
            named_at = [i for i, k in enumerate(keys) if k is not None]
            skipped = [i for i, k in enumerate(keys) if k is None]
            assert (got["hit"][skipped] == -1).all() and (got["slots"][skipped] == -1).all()
            np.testing.assert_array_equal(got["hit"][named_at], expected.hit.astype(np.int8))
            np.testing.assert_array_equal(got["slots"][named_at], expected.slots)
            np.testing.assert_array_equal(got["evicted"], [block_id(k) for k in expected.evicted])
            misses = [i for i, h in zip(named_at, expected.hit) if not h]
            np.testing.assert_array_equal(got["load_src"], [block_id(keys[i]) for i in misses])
            np.testing.assert_array_equal(got["load_dst"], got["slots"][misses])
        stats = gpu.stats()
        assert (stats["hits"], stats["misses"], stats["evictions"]) == (ref.stats.hits, ref.stats.misses,
                                                                        ref.stats.evictions)
        assert stats["loads"] == ref.stats.misses
        for p in range(parts):
            assert gpu.eviction_order(p) == [block_id(k) for k in ref.eviction_order(p)]
        resident = gpu.resident()
        expected_resident = np.full(NUM_IDS, -1)
        for key in ALL_KEYS:
            slot = ref.slot_of(key)
            expected_resident[block_id(key)] = -1 if slot is None else slot
        np.testing.assert_array_equal(resident, expected_resident)
    gpu.check()


def test_over_long_access_raises_like_the_reference_and_changes_nothing():
    store = HostStore(num_layers=1, num_kv_heads=1, head_dim=D, block_size=S, dtype=np.float32)
    store.extend(0, 0, np.zeros((1, 5 * S, D)), np.zeros((1, 5 * S, D)))
    ref = UnifiedPool(4, store=store)
    with pytest.raises(ValueError, match="cannot fit"):
        ref.access(0, [(0, 0, b) for b in range(5)])
    gpu = GPUSlotPool(4, num_store_blocks=5)
    gpu.access(ids_array([3, 1]))
    before = (gpu.resident(), gpu.stats(), to_host(gpu.epoch), gpu.eviction_order())
    with pytest.raises(ValueError, match="ids: an access of 5 blocks cannot fit in the 4 slots"):
        gpu.access(ids_array([0, 0, 0, 0, 0]))  # the bound is n, not the distinct count (on the device)
    after = (gpu.resident(), gpu.stats(), to_host(gpu.epoch), gpu.eviction_order())
    np.testing.assert_array_equal(after[0], before[0])
    assert after[1:2] == before[1:2] and after[3] == before[3]
    np.testing.assert_array_equal(after[2], before[2])


def test_release_returns_slots_in_load_order():
    # a hit does not change the release order (the reference's dict keeps first-load order)
    gpu = GPUSlotPool(4, num_store_blocks=8)
    gpu.access(ids_array([5, 6, 7]))  # slots 0, 1, 2
    gpu.access(ids_array([5]))  # a hit
    gpu.release(ids_array([7, 5, -1, 3]))  # frees slot 0 (loaded first) then slot 2
    acc = read_access(gpu.access(ids_array([0, 1, 2])))
    np.testing.assert_array_equal(acc["slots"], [2, 0, 3])  # last freed, first reused; then the never-used slot
    assert gpu.stats()["evictions"] == 0


def test_outputs_are_reused_and_out_is_honoured():
    gpu = GPUSlotPool(4, num_store_blocks=8)
    a = gpu.access(ids_array([1, 2]))
    assert gpu.access(ids_array([3, 4])) is a  # one set of outputs per length: no allocation in steady state
    out = PoolAccess.empty(3, xp)
    out.slots[...] = 99  # poison: every entry must be written
    out.hit[...] = 99
    assert gpu.access(ids_array([1, -1, 5]), out=out) is out
    np.testing.assert_array_equal(to_host(out.hit), [1, -1, 0])
    np.testing.assert_array_equal(to_host(out.slots), [0, -1, 1])  # LRU order 2, 3, 4, 1: 5 takes 2's slot
    np.testing.assert_array_equal(read_access(out)["evicted"], [2])
    with pytest.raises(ValueError, match="out.slots must have shape"):
        gpu.access(ids_array([1, 2]), out=out)


# --- pin_window=2: the previous access of a partition stays pinned ------------------------------------


class WindowModel:
    """What a pool with a pin window should do, written the obvious way: per partition an OrderedDict
    (block -> slot, next victim first), the reference's free stack, and the blocks named by the last
    ``window - 1`` accesses."""

    def __init__(self, num_slots, parts, lru, window):
        per = num_slots // parts
        self.free = [list(range((p + 1) * per - 1, p * per - 1, -1)) for p in range(parts)]
        self.order = [OrderedDict() for _ in range(parts)]
        self.history = [deque(maxlen=window - 1) for _ in range(parts)]
        self.lru = lru

    def access(self, p, ids):
        order, free = self.order[p], self.free[p]
        pinned = set().union(*self.history[p]) | {b for b in ids if b != -1}
        hit, slots, evicted, failed = [], [], [], False
        for b in ids:
            if failed or b == -1:
                hit.append(-1)
                slots.append(-1)
                continue
            if b in order:
                hit.append(1)
                if self.lru:
                    order.move_to_end(b)
            else:
                if free:
                    slot = free.pop()
                else:
                    victim = next((k for k in order if k not in pinned), None)
                    if victim is None:
                        failed = True
                        hit.append(-1)
                        slots.append(-1)
                        continue
                    slot = order.pop(victim)
                    evicted.append(victim)
                order[b] = slot
                hit.append(0)
            slots.append(order[b])
        # blocks pinned for the next access: every named block resident now (after a failure the kernel
        # has pinned the resident blocks named past it too)
        self.history[p].append({b for b in ids if b != -1 and b in order})
        return hit, slots, evicted, failed


@given(policy=st.sampled_from(["lru", "fifo"]), parts=st.sampled_from([1, 2]), per=st.integers(1, 4),
       steps=st.lists(st.tuples(st.integers(0, 1), st.lists(st.integers(-1, 9), max_size=4)), min_size=10,
                      max_size=60), kernel=KERNELS)
def test_pin_window_two_protects_the_previous_access(policy, parts, per, steps, kernel):
    num_ids = 10 * parts  # partition p names ids 10p .. 10p + 9
    gpu = GPUSlotPool(per * parts, num_store_blocks=num_ids, num_partitions=parts, policy=policy, pin_window=2,
                      kernel=kernel)
    model = WindowModel(per * parts, parts, policy == "lru", window=2)
    previous = [set() for _ in range(parts)]
    for p, named in steps:
        p %= parts
        ids = [b if b < 0 else 10 * p + b for b in named[:per]]
        resident_before = gpu.resident()
        got = read_access(gpu.access(ids_array(ids), p))
        hit, slots, evicted, failed = model.access(p, ids)
        if kernel == "parallel" and failed:  # it changes nothing, where the model kept the ids before the failure
            assert (got["hit"] == -1).all() and got["evicted"].size == 0 and got["load_src"].size == 0
            with pytest.raises(RuntimeError, match="no victim"):
                gpu.check()
            np.testing.assert_array_equal(gpu.resident(), resident_before)
            return  # the two states part here
        np.testing.assert_array_equal(got["hit"], hit)
        np.testing.assert_array_equal(got["slots"], slots)
        np.testing.assert_array_equal(got["evicted"], evicted)
        assert not previous[p] & set(got["evicted"].tolist())  # the property the pipelined decoder needs
        assert gpu.eviction_order(p) == list(model.order[p])
        if failed:
            with pytest.raises(RuntimeError, match="no victim"):
                gpu.check()
            kept = resident_before >= 0
            kept[got["evicted"]] = False
            np.testing.assert_array_equal(gpu.resident()[kept], resident_before[kept])
        gpu.check()  # cleared by the check above, or never set
        previous[p] = {b for b, h in zip(ids, got["hit"]) if h >= 0}


def test_all_pinned_sets_the_error_flag_and_moves_nothing():
    gpu = GPUSlotPool(4, num_store_blocks=8, pin_window=2, kernel=SEQUENTIAL)
    gpu.access(ids_array([0, 1]))
    resident = gpu.resident()
    # 2 and 3 take the free slots; 4 finds 0, 1 pinned by the previous access and 2, 3 by this one
    got = read_access(gpu.access(ids_array([2, 3, 4, 0])))
    np.testing.assert_array_equal(got["hit"], [0, 0, -1, -1])  # skipped from the failure on
    np.testing.assert_array_equal(got["slots"], [2, 3, -1, -1])
    np.testing.assert_array_equal(got["load_src"], [2, 3])
    assert got["evicted"].size == 0
    after = gpu.resident()
    np.testing.assert_array_equal(after[[0, 1]], resident[[0, 1]])
    assert after[4] == -1
    with pytest.raises(RuntimeError, match="every resident block of its partition was pinned"):
        gpu.check()
    gpu.check()  # the flag was cleared
    assert gpu.eviction_order() == [0, 1, 2, 3]
    # the window moved on: 1 is evictable again; 0 is not, the failed access named it (and it is resident)
    got = read_access(gpu.access(ids_array([4])))
    np.testing.assert_array_equal(got["evicted"], [1])
    gpu.check()


def test_ids_the_pool_cannot_hold_set_the_error_flag():
    gpu = GPUSlotPool(8, num_store_blocks=8, num_partitions=2, kernel=SEQUENTIAL)
    got = read_access(gpu.access(ids_array([1, 8, 2]), 0))  # 8 is out of range: it and the rest are skipped
    np.testing.assert_array_equal(got["hit"], [0, -1, -1])
    with pytest.raises(RuntimeError, match="outside -1 .. num_store_blocks - 1"):
        gpu.check()
    gpu.access(ids_array([1]), 1)  # resident in partition 0
    with pytest.raises(RuntimeError, match="another partition"):
        gpu.check()
    assert gpu.eviction_order(0) == [1] and gpu.eviction_order(1) == []


@pytest.mark.skipif(not ON_GPU, reason="kernel='parallel' needs a GPU")
def test_parallel_kernel_changes_nothing_on_a_failed_access():
    gpu = GPUSlotPool(4, num_store_blocks=8, num_partitions=1, pin_window=2, kernel="parallel")
    gpu.access(ids_array([0, 1]))

    def state():
        return gpu.resident(), gpu.stats(), gpu.eviction_order()

    before = state()
    got = read_access(gpu.access(ids_array([2, 3, 4, 0])))  # 4 finds every block pinned
    assert (got["hit"] == -1).all() and got["load_src"].size == 0
    with pytest.raises(RuntimeError, match="every resident block of its partition was pinned"):
        gpu.check()
    after = state()
    np.testing.assert_array_equal(after[0], before[0])
    assert after[1:] == before[1:]
    gpu.access(ids_array([5, 8]))  # an id out of range
    with pytest.raises(RuntimeError, match="outside -1 .. num_store_blocks - 1"):
        gpu.check()
    np.testing.assert_array_equal(gpu.resident(), before[0])
    got = read_access(gpu.access(ids_array([4])))  # the window moved on; 0 was named by the failed access
    np.testing.assert_array_equal(got["evicted"], [])  # a free slot is left
    gpu.check()


@pytest.mark.skipif(not ON_GPU, reason="kernel='parallel' needs a GPU")
@pytest.mark.parametrize("policy", ["lru", "fifo"])
@pytest.mark.parametrize("pin_window", [1, 2])
def test_parallel_kernel_equals_sequential_on_large_accesses(policy, pin_window):
    """Long accesses (hundreds of ids, repeats, -1s) overflow the parallel kernel's log every few
    accesses, with the log spanning several compaction tiles: every decision still equals the
    sequential kernel's (itself the reference's twin, checked above)."""
    per, parts, num_ids = 1536, 2, 8000  # log of 4 x 1536 entries = 3 tiles of 2048
    rng = np.random.default_rng(7 + pin_window)
    pools = {k: GPUSlotPool(per * parts, num_store_blocks=num_ids, num_partitions=parts, policy=policy,
                            pin_window=pin_window, kernel=k) for k in ("cuda", "parallel")}
    hot = rng.permutation(num_ids // parts)[:900]  # each partition's ids repeat, so hits and misses mix
    par = pools["parallel"]
    compactions = 0  # of a log longer than one tile
    for step in range(64):
        p = int(rng.integers(parts))
        n = int(rng.integers(1, per // 2))
        cold = 0.3 if step < 8 else 0.02  # misses and evictions first, then mostly hits: the log fills up
        ids = np.where(rng.random(n) >= cold, rng.choice(hot, n), rng.integers(0, num_ids // parts, n))
        ids = (ids + p * (num_ids // parts)).astype(np.int32)
        ids[rng.random(n) < 0.1] = -1
        head, tail = int(to_host(par.log_head)[p]), int(to_host(par.log_tail)[p])
        got = {k: read_access(pool.access(ids_array(ids), p)) for k, pool in pools.items()}
        compactions += int(to_host(par.log_tail)[p]) < tail + n and tail - head > fast_pool._LOG_TILE
        for field in ("hit", "slots", "load_src", "load_dst", "evicted"):
            np.testing.assert_array_equal(got["parallel"][field], got["cuda"][field], err_msg=f"{field} at {step}")
        assert pools["parallel"].stats() == pools["cuda"].stats()
        for pool in pools.values():
            pool.check()
    for q in range(parts):
        assert pools["parallel"].eviction_order(q) == pools["cuda"].eviction_order(q)
    assert compactions >= 2  # the test exercised what it is about


@given(kernel=KERNELS, seed=st.integers(0, 2**16))
def test_clear_gives_a_new_pool_in_place(kernel, seed):
    rng = np.random.default_rng(seed)
    used = GPUSlotPool(6, num_store_blocks=20, num_partitions=2, pin_window=2, kernel=kernel)
    arrays = {name: id(getattr(used, name)) for name in ("slot_of", "block_of", "pin", "counters")}
    for _ in range(5):
        used.access(ids_array(rng.integers(-1, 10, 3)), 0)
        used.access(ids_array(rng.integers(10, 20, 3)), 1)
    used.clear()
    assert {name: id(getattr(used, name)) for name in arrays} == arrays  # the same arrays: graphs stay valid
    fresh = GPUSlotPool(6, num_store_blocks=20, num_partitions=2, pin_window=2, kernel=kernel)
    for _ in range(6):
        p = int(rng.integers(2))
        ids = ids_array(rng.integers(10 * p - 1, 10 * p + 10, 3))
        a, b = read_access(used.access(ids, p)), read_access(fresh.access(ids, p))
        for field in a:
            np.testing.assert_array_equal(a[field], b[field])
    assert used.stats() == fresh.stats() and used.eviction_order(0) == fresh.eviction_order(0)


def test_empty_access_only_advances_the_window():
    gpu = GPUSlotPool(2, num_store_blocks=4, pin_window=2)
    gpu.access(ids_array([0, 1]))
    gpu.access(ids_array([]))
    np.testing.assert_array_equal(read_access(gpu.access(ids_array([2])))["evicted"], [0])
    assert gpu.stats() == {"hits": 0, "misses": 3, "evictions": 1, "loads": 3}


# --- bad inputs -------------------------------------------------------------------------------------


def test_bad_inputs():
    gpu = GPUSlotPool(4, num_store_blocks=8, num_partitions=2)
    with pytest.raises(TypeError, match="ids must have dtype int32"):
        gpu.access(xp.asarray(np.array([1, 2], np.int64)))
    with pytest.raises(ValueError, match="ids must have shape \\[n\\]"):
        gpu.access(ids_array([[1, 2]]))
    with pytest.raises(TypeError, match="ids"):
        gpu.access([1, 2])
    with pytest.raises(ValueError, match="partition must lie in 0 .. 1"):
        gpu.access(ids_array([1]), 2)
    with pytest.raises(TypeError, match="partition must be an integer"):
        gpu.access(ids_array([1]), 1.0)
    with pytest.raises(TypeError, match="ids must have dtype int32"):
        gpu.release(xp.asarray(np.array([1], np.int64)))
    with pytest.raises(TypeError, match="out must be a PoolAccess"):
        gpu.access(ids_array([1]), out={})
    with pytest.raises(ValueError, match="policy must be one of 'lru', 'fifo'"):
        GPUSlotPool(4, num_store_blocks=8, policy="mru")
    with pytest.raises(ValueError, match="num_slots \\(5\\) must be a multiple of num_partitions \\(2\\)"):
        GPUSlotPool(5, num_store_blocks=8, num_partitions=2)
    with pytest.raises(ValueError, match="num_slots must be >= 1"):
        GPUSlotPool(0, num_store_blocks=8)
    with pytest.raises(TypeError, match="num_store_blocks must be an integer"):
        GPUSlotPool(4, num_store_blocks=8.0)
    with pytest.raises(ValueError, match="pin_window must be >= 1"):
        GPUSlotPool(4, num_store_blocks=8, pin_window=0)
    assert gpu.stats() == {"hits": 0, "misses": 0, "evictions": 0, "loads": 0}


def test_module_imports_without_a_gpu_or_the_simulator():
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    code = "import psa_fast.pool; print('ok')"
    assert subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          check=True).stdout.strip() == "ok"
