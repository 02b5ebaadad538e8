"""The sparsity family of block-mass profiles (psa_fast.synthetic), on the CPU.

``sparsity_profiles`` must give each head the ideal τ 0.95 budget it was asked for, heads that differ,
a sink and a recent window; ``fill_skewed`` (run with NumPy on a stand-in cache) must keep that budget
in the keys it writes, up to its within-block spread of token logits.
"""

import numpy as np
import pytest

from psa_fast import gpu_available
from psa_fast.synthetic import (OFFSET_FLOOR, HostCache, fill_skewed, ideal_share, ideal_share_of_logits,
                                sparsity_profiles)
from psa_ref import analysis

SHARES = (0.02, 0.05, 0.1, 0.2, 0.3)


def head_shares(cache, layer, q, scale=None):
    """``[B, Hkv]`` ideal τ 0.95 share per KV head of the filled layer (mean over its query heads), from
    the true logits."""
    g = q.shape[1] // cache.num_kv_heads
    scale = scale or 1 / np.sqrt(cache.head_dim)
    out = np.empty((cache.batch, cache.num_kv_heads))
    for r in range(cache.batch):
        k = cache.keys[layer, r].astype(np.float32)
        for kv in range(cache.num_kv_heads):
            logits = scale * (q[r, kv * g : (kv + 1) * g].astype(np.float32) @ k[kv].T)
            out[r, kv] = ideal_share_of_logits(logits, cache.block_size).mean()
    return out


@pytest.mark.parametrize("n", [512, 2048])
@pytest.mark.parametrize("share", SHARES)
def test_profiles_have_the_asked_ideal_share(share, n):
    """Mean over heads within 3% of the target (each head's budget is a whole number of blocks: at most
    half a block off its draw, 0.5/512 = 5% of the smallest budget here, averaging out over 64 heads);
    each head within its spread (2x either way, times the 1.25 that re-centring the mean can add)."""
    prof = sparsity_profiles(n, share, num_profiles=64, seed=7)
    shares = ideal_share(prof)
    assert prof.shape == (64, n)
    assert abs(shares.mean() / share - 1) < 0.03, (shares.mean(), share)
    assert (shares >= share / 2.5).all() and (shares <= share * 2.5).all(), (shares.min(), shares.max())


@pytest.mark.parametrize("share", SHARES)
def test_without_heads_differing_every_head_gets_exactly_the_target(share):
    n = 1000
    shares = ideal_share(sparsity_profiles(n, share, num_profiles=16, heads_differ=False, seed=1))
    assert np.all(shares * n == round(share * n)), shares * n


def test_heads_differ():
    shares = ideal_share(sparsity_profiles(2048, 0.1, num_profiles=64, seed=2))
    assert shares.max() / shares.min() >= 2.0  # log-uniform over 2x either way: ~4 between the extremes
    assert np.unique(shares).size > 16
    wider = ideal_share(sparsity_profiles(2048, 0.1, num_profiles=64, spread=4.0, seed=2))
    assert wider.max() / wider.min() > shares.max() / shares.min()


def test_offsets_are_log_masses_below_the_heaviest():
    prof = sparsity_profiles(512, 0.05, num_profiles=8, seed=3)
    assert np.all(prof <= 0) and np.all(prof.max(axis=1) == 0) and prof.min() >= OFFSET_FLOOR
    assert np.array_equal(prof, sparsity_profiles(512, 0.05, num_profiles=8, seed=3))
    assert not np.array_equal(prof, sparsity_profiles(512, 0.05, num_profiles=8, seed=4))


@pytest.mark.parametrize("share", [0.02, 0.3])
def test_sink_holds_its_share_and_the_recent_window_is_in_the_budget(share):
    n, recent = 1024, 3
    prof = sparsity_profiles(n, share, num_profiles=32, recent_blocks=recent, sink_share=0.25, seed=5)
    mass = np.exp(prof)
    np.testing.assert_allclose(mass[:, 0] / mass.sum(axis=1), 0.25, rtol=1e-6)
    counts = np.round(ideal_share(prof) * n).astype(int)
    rank = np.argsort(np.argsort(-prof, axis=1, kind="stable"), axis=1)  # 0 = heaviest
    for p in range(prof.shape[0]):
        assert rank[p, 0] < counts[p]  # the sink is attended by the ideal budget
        assert np.all(rank[p, n - recent :] < counts[p]), (rank[p, n - recent :], counts[p])
    # without a sink or a recent window, block 0 and the last blocks are ordinary ones
    plain = np.exp(sparsity_profiles(n, share, num_profiles=32, sink=False, recent_blocks=0, seed=5))
    assert (plain[:, 0] / plain.sum(axis=1)).mean() < 0.05
    assert (plain[:, -1] / plain.sum(axis=1)).mean() < 0.05


@pytest.mark.parametrize("kwargs, name", [
    (dict(n_blocks=1), "n_blocks"),
    (dict(ideal_share=0.0), "ideal_share"),
    (dict(ideal_share=1.0), "ideal_share"),
    (dict(ideal_share=float("nan")), "ideal_share"),
    (dict(num_profiles=0), "num_profiles"),
    (dict(recent_blocks=-1), "recent_blocks"),
    (dict(recent_blocks=63), "recent_blocks"),
    (dict(spread=0.5), "spread"),
    (dict(sink_share=0.95), "sink_share"),
    (dict(sink_share=0.0), "sink_share"),
    (dict(tau=1.0), "tau"),
    (dict(tau=0.0), "tau"),
])
def test_bad_arguments_raise_naming_them(kwargs, name):
    args = dict(n_blocks=64, ideal_share=0.1) | kwargs
    with pytest.raises(ValueError, match=name):
        sparsity_profiles(args.pop("n_blocks"), args.pop("ideal_share"), **args)


def test_ideal_share_by_hand():
    offsets = np.log([4.0, 3.0, 2.0, 1.0])  # masses 4 3 2 1 of 10: cumulative 0.4 0.7 0.9 1.0
    assert ideal_share(offsets, 0.95) == 1.0
    assert ideal_share(offsets, 0.7) == 0.5
    assert ideal_share(offsets - 5.0, 0.7) == 0.5  # a common shift changes nothing
    assert ideal_share(offsets, 0.5, tokens=[1, 1, 1, 10]) == 0.25  # block 3: 10 of 19
    np.testing.assert_array_equal(ideal_share(np.stack([offsets, offsets[::-1]]), 0.7), [0.5, 0.5])
    with pytest.raises(ValueError, match="offsets"):
        ideal_share(np.zeros((2, 2, 2)))
    with pytest.raises(ValueError, match="tokens"):
        ideal_share(offsets, tokens=[1, 1])
    with pytest.raises(ValueError, match="tau"):
        ideal_share(offsets, 1.5)


@pytest.mark.parametrize("t", [16 * 40, 16 * 40 + 5])  # whole blocks, and a partial last block
def test_ideal_share_of_logits_matches_block_sums(t):
    rng = np.random.default_rng(0)
    q, keys = rng.standard_normal((3, 32)), 2 * rng.standard_normal((t, 32))
    mass, _ = analysis.block_sums(q, keys, np.zeros((t, 32)), 16, 0.3)
    want = analysis.blocks_for_mass(mass, 0.95) / mass.shape[0]
    got = ideal_share_of_logits(0.3 * (q @ keys.T), 16)
    np.testing.assert_array_equal(got, want)
    assert 0 < got.min() and got.max() < 1


@pytest.mark.parametrize("hq, hkv, d", [(4, 2, 64), (4, 1, 256)])
@pytest.mark.parametrize("share", SHARES)
def test_a_filled_cache_keeps_each_heads_budget(share, hq, hkv, d):
    """The keys ``fill_skewed`` writes (NumPy on the CPU, the same construction as on the GPU) give each
    KV head the ideal share of its profile within 15% (the within-block spread of token logits moves
    block masses by ~15%, and the budget by a few blocks), and on average within 5%."""
    b, t = 2, 8192
    cache = HostCache(batch=b, num_kv_heads=hkv, head_dim=d, max_tokens=t)
    prof = sparsity_profiles(cache.nmax, share, num_profiles=b * hkv, seed=11)
    q = fill_skewed(cache, 0, hq, prof, seed=3, positional=True, xp=np)
    assert q.shape == (b, hq, d) and q.dtype == np.float16
    got = np.sort(head_shares(cache, 0, q).ravel())  # every profile is used once: compare as sets
    want = np.sort(ideal_share(prof))
    assert np.all(np.abs(got / want - 1) < 0.15), (got, want)
    assert abs(got.mean() / want.mean() - 1) < 0.05, (got.mean(), want.mean())


def test_positional_fill_keeps_the_sink_and_the_recent_window_in_place():
    cache = HostCache(batch=1, num_kv_heads=2, head_dim=64, max_tokens=4096)
    prof = sparsity_profiles(cache.nmax, 0.05, num_profiles=2, recent_blocks=2, seed=0)
    q = fill_skewed(cache, 0, 4, prof, seed=0, positional=True, xp=np)
    k = cache.keys[0, 0].astype(np.float32)
    for kv in range(2):
        logits = (q[0, 2 * kv].astype(np.float32) @ k[kv].T) / 8.0
        mass = np.exp(logits - logits.max()).reshape(cache.nmax, 16).sum(axis=1)
        heaviest = set(np.argsort(-mass)[:8].tolist())
        assert {0, cache.nmax - 2, cache.nmax - 1} <= heaviest
        assert 0.15 < mass[0] / mass.sum() < 0.35  # the sink's 25%, each block's mass varying by ~15%


def test_fill_checks_positional_offsets_and_runs_pooled_on_the_cpu():
    cache = HostCache(batch=2, num_kv_heads=1, head_dim=32, max_tokens=100)
    with pytest.raises(ValueError, match="offsets"):
        fill_skewed(cache, 0, 2, np.zeros((3, cache.nmax + 1)), positional=True, xp=np)
    with pytest.raises(ValueError, match="offsets"):
        fill_skewed(cache, 0, 2, np.zeros(cache.nmax), positional=True, xp=np)
    q = fill_skewed(cache, 0, 2, -np.arange(10.0), seed=1, xp=np)  # 1-D: drawn per block, as on the GPU
    assert q.shape == (2, 2, 32) and np.isfinite(cache.keys[0, 1].astype(np.float32)).all()


@pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU (cupy.cuda.is_available())")
def test_gpu_fill_keeps_each_heads_budget():
    """The same check on the GPU path the benchmark uses: CuPy's draws, a real PagedKVCache, the budget
    measured from its pool with ``ideal_share_of_logits`` on CuPy arrays."""
    import cupy

    import psa_fast

    b, hkv, hq, d = 2, 2, 4, 64
    cache = psa_fast.PagedKVCache(num_layers=1, batch=b, num_kv_heads=hkv, head_dim=d, max_tokens=8192)
    prof = sparsity_profiles(cache.nmax, 0.05, num_profiles=b * hkv, seed=0)
    q = fill_skewed(cache, 0, hq, prof, seed=0, positional=True)
    k = cache.k_pool.reshape(1, b, hkv, cache.capacity, cache.dp)[0, ..., :d].astype(cupy.float32)
    g = hq // hkv
    got = np.sort([float(ideal_share_of_logits((q[r, kv * g : (kv + 1) * g].astype(cupy.float32) @ k[r, kv].T)
                                               / np.sqrt(d), 16).mean()) for r in range(b) for kv in range(hkv)])
    want = np.sort(ideal_share(prof))
    assert np.all(np.abs(got / want - 1) < 0.15), (got, want)
