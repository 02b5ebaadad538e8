"""Fixed-budget top-k baseline: I6 and I2."""

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

import psa_ref
from psa_ref.scoring import kv_head_of
from psa_ref.testing.strategies import problems
from psa_ref.testing import assert_close, brute_force_estimate, budget64, dense_over_blocks, used_by_head


@given(problems(max_forced=0, metadata=psa_ref.METADATA_KINDS), st.integers(1, 12))
def test_I6_topk_attends_the_k_highest_estimates(p, k):
    b = psa_ref.KVBlocks.from_dense(p.keys, p.values, block_size=p.block_size, metadata=p.metadata)
    res = psa_ref.topk_attention(p.q, b, k, gqa=p.gqa)
    scale = 1 / np.sqrt(p.q.shape[1])
    g = p.q.shape[0] // p.keys.shape[0]
    groups = ([[h] for h in range(p.q.shape[0])] if p.gqa == "per_head"
              else [list(range(kv * g, (kv + 1) * g)) for kv in range(p.keys.shape[0])])
    for heads, used in zip(groups, res.blocks_used):
        kv = heads[0] // g
        score = np.max([brute_force_estimate(p.q[h], p.keys[kv], p.block_size, scale, p.metadata) for h in heads],
                       axis=0)
        n = min(k, b.num_blocks)
        assert used.size == n and len(set(used.tolist())) == n
        # tie-invariant: the chosen estimates sum to the sum of the n largest (Quest's test_topk)
        assert abs(score[used].sum() - np.sort(score)[::-1][:n].sum()) <= 1e-9 * (1 + np.abs(score).sum())
    kvh = kv_head_of(p.q.shape[0], p.keys.shape[0])
    for h, u in enumerate(used_by_head(res, p.q.shape[0], p.keys.shape[0], p.gqa)):
        ref = dense_over_blocks(p.q[h], p.keys[kvh[h]], p.values[kvh[h]], p.block_size, u, scale)
        assert_close("top-k output", res.output[h], ref, rtol=budget64(p.keys.shape[1] * p.q.shape[1]))


@given(problems())
def test_I2_topk_with_k_at_least_n_is_dense(p):
    b = psa_ref.KVBlocks.from_dense(p.keys, p.values, block_size=p.block_size, metadata=p.metadata)
    res = psa_ref.topk_attention(p.q, b, b.num_blocks + 3, gqa=p.gqa, sink_blocks=p.sink_blocks,
                                 recent_blocks=p.recent_blocks)
    assert_close("top-k k>=N vs dense", res.output, psa_ref.dense_attention(p.q, p.keys, p.values),
                 rtol=budget64(p.keys.shape[1] * p.q.shape[1]))


def test_topk_forced_blocks_count_towards_k():
    rng = np.random.default_rng(0)
    k, v = rng.standard_normal((2, 40, 4))
    b = psa_ref.KVBlocks.from_dense(k, v, block_size=4)
    res = psa_ref.topk_attention(rng.standard_normal(4), b, 4, sink_blocks=1, recent_blocks=1)
    assert res.blocks_used[:2].tolist() == [0, 9] and res.blocks_used.size == 4
    assert res.stop_reason == "budget" and np.isnan(res.mass_estimate)
