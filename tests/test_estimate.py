"""Stage 2: estimates, bounds and ordering."""

import numpy as np
from hypothesis import given

import psa_ref
from psa_ref.scoring import forced_blocks, kv_head_of, processing_order
from psa_ref.testing.strategies import problems
from psa_ref.testing import assert_close, brute_force_bound, brute_force_estimate, budget64


@given(problems(metadata=psa_ref.METADATA_KINDS))
def test_estimates_match_formulas_on_raw_keys(p):
    b = psa_ref.KVBlocks.from_dense(p.keys, p.values, block_size=p.block_size, metadata=p.metadata)
    scale = 0.7
    est = psa_ref.estimate(p.q, b, scale)
    bound = psa_ref.upper_bound(p.q, b, scale)
    kv = kv_head_of(p.q.shape[0], p.keys.shape[0])
    for h in range(p.q.shape[0]):
        keys = p.keys[kv[h]]
        ref = brute_force_estimate(p.q[h], keys, p.block_size, scale, p.metadata)
        d = p.q.shape[1]
        tol = budget64(2 * d) * (np.abs(p.q[h]).sum() * np.abs(keys).max() * scale + 1)
        assert_close("estimate", est[h], ref, rtol=0, atol=tol)
        assert_close("bound", bound[h], brute_force_bound(p.q[h], keys, p.block_size, scale), rtol=0, atol=tol)
        # the min/max bound holds for every token of its block
        logits = scale * keys.astype(np.float64) @ p.q[h].astype(np.float64)
        for j in range(b.num_blocks):
            assert logits[b.block_slice(j)].max() <= bound[h, j] + tol


def test_rank_descending_ties_to_lower_index():
    assert list(psa_ref.rank(np.array([1.0, 3.0, 3.0, -2.0, 1.0]))) == [1, 2, 0, 4, 3]


def test_forced_blocks_first_then_ranked():
    assert list(forced_blocks(6, 1, 2)) == [0, 4, 5]
    assert list(forced_blocks(2, 2, 2)) == [0, 1]  # overlapping sink and recent: each once
    assert list(processing_order(np.array([0.0, 5, 1, 4, 2, 3]), np.array([0, 5]))) == [0, 5, 1, 3, 4, 2]
