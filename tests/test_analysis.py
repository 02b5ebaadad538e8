"""The vectorised budget sweeps agree with the reference functions they stand in for."""

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

import psa_ref
from psa_ref import analysis
from psa_ref.testing.strategies import problems
from psa_ref.testing import assert_close, budget64, exact_fraction


@given(problems(max_forced=0), st.data())
def test_prefix_attention_equals_topk_at_every_k(p, data):
    b = psa_ref.KVBlocks.from_dense(p.keys, p.values, block_size=p.block_size, metadata=p.metadata)
    scale = 1 / np.sqrt(p.q.shape[1])
    g = p.q.shape[0] // p.keys.shape[0]
    q, keys, values = (a.astype(np.float64) for a in (p.q, p.keys, p.values))
    scores = psa_ref.estimate(q, b, scale)
    kv = data.draw(st.integers(0, p.keys.shape[0] - 1))
    heads = slice(kv * g, (kv + 1) * g)
    mass, weighted = analysis.block_sums(q[heads], keys[kv], values[kv], p.block_size, scale)
    order = psa_ref.rank(scores[heads].max(axis=0))
    outs, frac = analysis.prefix_attention(mass, weighted, order)
    k = data.draw(st.integers(1, b.num_blocks))
    ref = psa_ref.topk_attention(q, b, k, exact_mass=True)
    assert_close("prefix vs top-k", outs[k - 1], ref.output[heads], rtol=budget64(keys.shape[1] * q.shape[1]))
    assert_close("prefix mass", frac[k - 1], ref.mass_exact[heads], rtol=1e-12, atol=1e-12)


@given(st.integers(0, 10**6), st.integers(1, 30), st.floats(0.05, 1.0))
def test_blocks_for_mass_is_the_fewest(seed, n, tau):
    rng = np.random.default_rng(seed)
    mass = rng.exponential(size=(n, 3)) ** 3
    need = analysis.blocks_for_mass(mass, tau)
    for h in range(3):
        heaviest = np.sort(mass[:, h])[::-1]
        share = np.cumsum(heaviest) / heaviest.sum()
        assert share[need[h] - 1] >= tau - 1e-12
        assert need[h] == 1 or share[need[h] - 2] < tau


def test_relative_error():
    ref = np.array([[3.0, 4.0]])
    assert analysis.relative_error(np.array([[3.0, 4.0]]), ref)[0] == 0
    assert abs(analysis.relative_error(np.array([[0.0, 4.0]]), ref)[0] - 0.6) < 1e-15


def test_exact_fraction_helper_matches_result():
    rng = np.random.default_rng(5)
    k, v = rng.standard_normal((2, 33, 5))
    q = rng.standard_normal(5) * 2
    res = psa_ref.attention(q, psa_ref.KVBlocks.from_dense(k, v, block_size=4), 0.8, exact_mass=True)
    assert abs(exact_fraction(q, k, 4, 1 / np.sqrt(5), res.blocks_used) - res.mass_exact) < 1e-12
