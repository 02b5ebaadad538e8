"""KV cache manager: the host store (incremental metadata, views) and the pools (hits, eviction, consistency)."""

import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import psa_ref
from psa_ref.testing.kvcache import assert_pool_consistent, random_tokens
from psa_ref.kvcache.pool import PerLayerPool, UnifiedPool
from psa_ref.kvcache.store import BlockKey, HostStore
from psa_ref.testing import assert_close, budget64
from psa_ref.testing.strategies import PORTABLE_METADATA  # the host store keeps no quant3 codes


def make_store(**kw):
    args = dict(num_layers=2, num_kv_heads=2, head_dim=3, block_size=4, dtype=np.float32) | kw
    return HostStore(**args)


# --- host store ---------------------------------------------------------------------------------


@given(t=st.integers(1, 45), s=st.integers(1, 9), d=st.integers(1, 6), hkv=st.integers(1, 3),
       metadata=st.sampled_from(PORTABLE_METADATA), dtype=st.sampled_from(["float16", "float32", "float64"]),
       cuts=st.lists(st.integers(1, 45), max_size=6), seed=st.integers(0, 2**32 - 1))
def test_incremental_metadata_equals_from_dense(t, s, d, hkv, metadata, dtype, cuts, seed):
    """Tokens arriving in random bulk extends and single appends, interleaved over two layers,
    give the metadata that from_dense computes on the same tokens at once."""
    rng = np.random.default_rng(seed)
    keys, values = random_tokens(rng, hkv, t, d, dtype)
    store = make_store(num_kv_heads=hkv, head_dim=d, block_size=s, metadata=metadata, dtype=dtype)
    bounds = sorted({0, t, *(c for c in cuts if c < t)})
    for a, b in zip(bounds, bounds[1:]):
        for layer in (1, 0):  # layer 1 gets the same tokens reversed in head order, to tell the layers apart
            k, v = (keys, values) if layer == 0 else (keys[::-1], values[::-1])
            if b - a == 1:
                store.append("r", layer, k[:, a], v[:, a])
            else:
                store.extend("r", layer, k[:, a:b], v[:, a:b])
    for layer in (0, 1):
        k, v = (keys, values) if layer == 0 else (keys[::-1], values[::-1])
        ref = psa_ref.KVBlocks.from_dense(k, v, block_size=s, metadata=metadata)
        got = store.kv_blocks("r", layer)
        assert got.num_blocks == ref.num_blocks == store.num_blocks("r", layer)
        assert set(got.meta) == set(ref.meta)
        for name in ref.meta:
            rtol = 0.0 if name in ("lo", "hi", "center") else budget64(s)
            assert_close(f"layer {layer} {name}", got.meta[name], ref.meta[name], rtol=rtol)
        assert np.array_equal(got.keys, ref.keys) and np.array_equal(got.values, ref.values)
        for j in range(ref.num_blocks):  # block content, read back in the store's dtype
            kj, vj = store.read(BlockKey("r", layer, hkv - 1, j))
            assert kj.dtype == np.dtype(dtype) and np.array_equal(kj, k[hkv - 1, ref.block_slice(j)])
            assert np.array_equal(vj, v[hkv - 1, ref.block_slice(j)])


def test_append_updates_only_the_last_block():
    """Metadata is folded in, not rebuilt: poison an older block and append; the poison stays."""
    rng = np.random.default_rng(1)
    store = make_store()
    k, v = random_tokens(rng, 2, 10, 3)
    store.extend(0, 0, k, v)  # blocks 0, 1 full; block 2 holds 2 tokens
    meta = store.block_meta(0, 0)
    meta["lo"][:, 0] = -123.0
    meta["radius"][:, 1] = 456.0
    before = {n: a[:, 2].copy() for n, a in meta.items()}
    store.append(0, 0, *(a[:, 0] for a in random_tokens(rng, 2, 1, 3)))
    after = store.block_meta(0, 0)
    assert np.all(after["lo"][:, 0] == -123.0) and np.all(after["radius"][:, 1] == 456.0)
    assert not np.array_equal(after["center"][:, 2], before["center"])  # the last block did change


def test_kv_blocks_view_runs_through_attention_like_from_dense():
    rng = np.random.default_rng(2)
    store = make_store(num_kv_heads=2, head_dim=8, block_size=5)
    k, v = random_tokens(rng, 2, 37, 8)
    store.extend("x", 1, k[:, :30], v[:, :30])
    for t in range(30, 37):
        store.append("x", 1, k[:, t], v[:, t])
    q = 2 * rng.standard_normal((6, 8))
    ref_blocks = psa_ref.KVBlocks.from_dense(k, v, block_size=5)
    for fn, kw in ((psa_ref.attention, dict(threshold=0.9)), (psa_ref.topk_attention, dict(k=3))):
        got, ref = fn(q, store.kv_blocks("x", 1), **kw), fn(q, ref_blocks, **kw)
        assert [b.tolist() for b in got.blocks_used] == [b.tolist() for b in ref.blocks_used]
        assert_close(fn.__name__, got.output, ref.output, rtol=budget64(37 * 8))


def test_sizes_and_removal():
    store = make_store(dtype=np.float16)
    assert store.bytes_per_block == 2 * 4 * 3 * 2 and store.bytes_per_token == 12
    rng = np.random.default_rng(3)
    store.extend("a", 0, *random_tokens(rng, 2, 9, 3))
    store.extend("b", 1, *random_tokens(rng, 2, 4, 3))
    assert store.requests == ("a", "b") and store.num_tokens("a", 1) == 0
    assert store.total_blocks() == 2 * (3 + 1)
    assert store.block_length(BlockKey("a", 0, 1, 2)) == 1
    store.remove("a")
    assert "a" not in store and store.total_blocks() == 2


@pytest.mark.parametrize("call, exc, words", [
    (lambda s: s.append(0, 2, np.zeros((2, 3)), np.zeros((2, 3))), ValueError, "layer must lie in 0 .. 1"),
    (lambda s: s.append(0, 0.0, np.zeros((2, 3)), np.zeros((2, 3))), TypeError, "layer must be an integer"),
    (lambda s: s.append(0, 0, np.zeros((3, 3)), np.zeros((3, 3))), ValueError, r"keys must have shape \[Hkv, D\]"),
    (lambda s: s.append(0, 0, np.zeros((2, 3), int), np.zeros((2, 3))), TypeError, "keys must have dtype"),
    (lambda s: s.append(0, 0, np.zeros((2, 3)), np.full((2, 3), np.nan)), ValueError, "values contains"),
    (lambda s: s.extend(0, 0, np.zeros((2, 0, 3)), np.zeros((2, 0, 3))), ValueError, "at least one token"),
    (lambda s: s.extend(0, 0, np.zeros((2, 4, 3)), np.zeros((2, 5, 3))), ValueError, "values must have the same"),
    (lambda s: s.remove("nobody"), ValueError, "request 'nobody' is not in the host store"),
    (lambda s: s.kv_blocks("nobody", 0), ValueError, "not in the host store"),
    (lambda s: s.read(BlockKey("a", 0, 0, 9)), ValueError, r"\('a', 0, 0, 9\) is not in the host store"),
    (lambda s: s.read(BlockKey("a", 0, 2, 0)), ValueError, "is not in the host store"),
    (lambda s: s.kv_blocks("a", 1), ValueError, "holds no token yet"),
])
def test_store_rejects(call, exc, words):
    store = make_store()
    store.extend("a", 0, np.ones((2, 5, 3)), np.ones((2, 5, 3)))
    with pytest.raises(exc, match=words):
        call(store)
    assert store.num_tokens("a", 0) == 5  # a rejected write changes nothing


def test_float16_store_refuses_overflow_instead_of_storing_inf():
    store = make_store(dtype=np.float16)
    with pytest.raises(ValueError, match="keys overflows the store dtype float16"):
        store.append(0, 0, np.full((2, 3), 1e6), np.zeros((2, 3)))
    assert 0 not in store


@pytest.mark.parametrize("kw, exc, words", [
    (dict(num_layers=0), ValueError, "num_layers must be >= 1"),
    (dict(num_kv_heads=1.5), TypeError, "num_kv_heads must be an integer"),
    (dict(block_size=0), ValueError, "block_size must be >= 1"),
    (dict(metadata="quest"), ValueError, "metadata must be one of"),
    (dict(metadata="quant3"), ValueError, "not kept by the host store"),
    (dict(dtype=np.int32), TypeError, "dtype must be float16, float32 or float64"),
    (dict(dtype="bogus"), TypeError, "dtype must be float16, float32 or float64"),
])
def test_store_constructor_rejects(kw, exc, words):
    with pytest.raises(exc, match=words):
        make_store(**kw)


# --- pools --------------------------------------------------------------------------------------


def filled_store(num_layers=2, tokens=24, **kw):
    """Store with request "a" holding ``tokens`` tokens in every layer (blocks of 4: 6 per head)."""
    store = make_store(num_layers=num_layers, **kw)
    rng = np.random.default_rng(4)
    for layer in range(num_layers):
        store.extend("a", layer, *random_tokens(rng, 2, tokens, 3))
    return store


def resident_blocks(pool, layer):
    return [k.block for k in pool.eviction_order(layer)]


@pytest.mark.parametrize("policy, victim", [("lru", 1), ("fifo", 0)])
def test_lru_and_fifo_by_hand(policy, victim):
    """Slots 3; access blocks 0, 1, 2, then 0 again, then 3: LRU evicts 1 (least recently
    used), FIFO evicts 0 (loaded first, the hit did not renew it)."""
    pool = UnifiedPool(3, policy, store=filled_store())
    for j in (0, 1, 2):
        assert not pool.access(0, [("a", 0, j)]).hit[0]
    assert pool.access(0, [("a", 0, 0)]).hit[0]
    acc = pool.access(0, [("a", 0, 3)])
    assert [k.block for k in acc.evicted] == [victim] and acc.slots[0] == victim
    assert pool.stats.hits == 1 and pool.stats.misses == 4 and pool.stats.evictions == 1
    assert ("a", 0, 0, victim) not in pool and pool.slot_of(("a", 0, 0, 3)) == victim


def test_fifo_never_evicts_a_block_of_the_same_access():
    """FIFO's oldest block is a hit of the current access: the miss that follows must take the next one."""
    pool = UnifiedPool(3, "fifo", store=filled_store())
    pool.access(0, [("a", 0, 0), ("a", 0, 1), ("a", 0, 2)])
    acc = pool.access(0, [("a", 0, 0), ("a", 0, 3)])
    assert acc.hit.tolist() == [True, False] and [k.block for k in acc.evicted] == [1]
    assert resident_blocks(pool, 0) == [0, 2, 3]


def test_duplicates_and_result_fields():
    store = filled_store(tokens=22)  # block 5 holds 2 tokens
    pool = UnifiedPool(4, store=store)
    acc = pool.access(1, [("a", 1, 5), ("a", 0, 2), ("a", 1, 5)])
    assert acc.hit.tolist() == [False, False, True] and acc.slots[0] == acc.slots[2] != acc.slots[1]
    assert acc.tokens.tolist() == [2, 4, 2] and acc.keys[0] == BlockKey("a", 1, 1, 5)
    assert acc.bytes_loaded == pool.stats.bytes_loaded == (2 + 4) * store.bytes_per_token
    assert acc.loaded == [BlockKey("a", 1, 1, 5), BlockKey("a", 1, 0, 2)] and acc.hits == [BlockKey("a", 1, 1, 5)]
    assert pool.stats.accesses == 3 and pool.stats.hit_rate == 1 / 3
    assert_pool_consistent(pool)


def test_unified_shares_slots_per_layer_does_not():
    """A scan of layer 0 evicts layer 1's blocks from a unified pool, never from a per-layer one."""
    store = filled_store()
    uni, per = UnifiedPool(6, store=store), PerLayerPool(6, 2, store=store)
    for pool in (uni, per):
        pool.access(1, [("a", 0, 0), ("a", 1, 0)])
        for j in range(6):
            pool.access(0, [("a", 0, j)])
    assert ("a", 1, 0, 0) not in uni and ("a", 1, 1, 0) not in uni
    assert ("a", 1, 0, 0) in per and ("a", 1, 1, 0) in per
    assert per.capacity_per_layer == 3 and uni.capacity_per_layer == 6
    assert set(per.slot_of(("a", 1, h, 0)) for h in (0, 1)) <= {3, 4, 5}  # layer 1 owns slots 3..5
    assert per.stats.evictions == 3 and uni.stats.evictions == 2


def test_append_writes_through_to_a_resident_block_and_costs_nothing():
    store = filled_store(tokens=21)  # block 5 holds 1 token
    pool = PerLayerPool(4, 2, store=store)
    pool.access(0, [("a", 0, 5), ("a", 1, 5)])
    loaded = pool.stats.bytes_loaded
    rng = np.random.default_rng(5)
    k, v = random_tokens(rng, 2, 4, 3)
    for t in range(3):  # block 5 fills up ...
        store.append("a", 0, k[:, t], v[:, t])
    store.append("a", 0, k[:, 3], v[:, 3])  # ... and block 6 starts
    assert pool.read(("a", 0, 1, 5))[0].shape == (4, 3) and np.array_equal(pool.read(("a", 0, 1, 5))[1][1:], v[1, :3])
    assert pool.stats.bytes_loaded == loaded and ("a", 0, 0, 6) not in pool
    assert_pool_consistent(pool)


def test_removing_a_request_frees_its_slots_and_keeps_the_others():
    store = filled_store()
    store.extend("b", 0, np.ones((2, 4, 3)), np.ones((2, 4, 3)))
    pool = UnifiedPool(5, store=store)
    pool.access(0, [("a", 0, 0), ("b", 0, 0), ("a", 1, 3), ("b", 1, 0)])
    store.remove("a")
    assert len(pool) == 2 and pool.stats.evictions == 0 and ("b", 0, 0, 0) in pool
    assert pool.release("b") == 2 and len(pool) == 0
    assert_pool_consistent(pool)
    with pytest.raises(KeyError, match="not resident"):
        pool.read(("b", 0, 0, 0))


def test_an_access_too_large_is_refused_and_changes_nothing():
    pool = PerLayerPool(6, 2, store=filled_store())
    pool.access(0, [("a", 0, 0)])
    before = (dict(vars(pool.stats)), pool.eviction_order(0))
    with pytest.raises(ValueError, match="an access of 4 distinct blocks cannot fit in the 3 slots that layer 0"):
        pool.access(0, [("a", 0, 1), ("a", 0, 2), ("a", 1, 1), ("a", 1, 2), ("a", 0, 1)])
    assert (dict(vars(pool.stats)), pool.eviction_order(0)) == before


@pytest.mark.parametrize("make, exc, words", [
    (lambda s: UnifiedPool(0, store=s), ValueError, "num_slots must be >= 1"),
    (lambda s: UnifiedPool(4.0, store=s), TypeError, "num_slots must be an integer"),
    (lambda s: UnifiedPool(4, "clock", store=s), ValueError, "policy must be one of 'lru', 'fifo'"),
    (lambda s: UnifiedPool(4, store=None), TypeError, "store must be a psa_ref.kvcache.store.HostStore"),
    (lambda s: PerLayerPool(5, 2, store=s), ValueError, r"num_slots \(5\) must be a multiple of num_layers \(2\)"),
    (lambda s: PerLayerPool(6, 3, store=s), ValueError, r"num_layers \(3\) must equal the store's num_layers \(2\)"),
    (lambda s: PerLayerPool(1, 2, store=s), ValueError, "must be a multiple of num_layers"),
])
def test_pool_constructor_rejects(make, exc, words):
    with pytest.raises(exc, match=words):
        make(filled_store())


@pytest.mark.parametrize("layer, blocks, exc, words", [
    (0, [("a", 0, 6)], ValueError, r"blocks: \('a', 0, 0, 6\) is not in the host store"),
    (0, [("a", 2, 0)], ValueError, "2 KV heads"),
    (0, [("a", 0, -1)], ValueError, "is not in the host store"),
    (0, [("zz", 0, 0)], ValueError, "blocks: request 'zz' is not in the host store"),
    (0, [("a", 0)], TypeError, r"blocks must hold \(request, kv_head, block\) triples"),
    (2, [("a", 0, 0)], ValueError, "layer must lie in 0 .. 1"),
])
def test_access_rejects(layer, blocks, exc, words):
    pool = UnifiedPool(4, store=filled_store())
    with pytest.raises(exc, match=words):
        pool.access(layer, blocks)
    assert pool.stats.accesses == 0 and len(pool) == 0


def test_kvcache_page_example_prints_what_the_page_shows(capsys):
    page = (Path(__file__).resolve().parents[1] / "docs" / "kvcache.md").read_text(encoding="utf-8")
    (code,) = re.findall(r"```python\n(.*?)```", page, flags=re.S)
    (shown,) = re.findall(r"```text\n(.*?)\n```", page, flags=re.S)
    exec(compile(code, "docs/kvcache.md", "exec"), {})
    assert capsys.readouterr().out.strip() == shown
