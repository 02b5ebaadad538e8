"""The conformance checker accepts the reference's own results and rejects broken ones."""

import dataclasses

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import psa_ref
from psa_ref.testing.conformance import check_result
from psa_ref.testing.strategies import problems, thresholds


@given(problems(dtypes=("float16",)), thresholds, st.sampled_from(psa_ref.STOP_RULES), st.integers(1, 4))
def test_reference_results_conform(p, tau, stop, step):
    b = psa_ref.KVBlocks.from_dense(p.keys, p.values, block_size=p.block_size, metadata=p.metadata)
    opts = dict(gqa=p.gqa, sink_blocks=p.sink_blocks, recent_blocks=p.recent_blocks)
    res = psa_ref.attention(p.q, b, tau, stop=stop, step=step, **opts)
    c = check_result(res, p.q, p.keys, p.values, threshold=tau, stop=stop, step=step, block_size=p.block_size,
                     metadata=p.metadata, **opts)
    assert c.same_blocks and c.same_stop and c.max_output_err <= c.output_tol


def make(seed=0):
    rng = np.random.default_rng(seed)
    q, k, v = psa_ref.testing.random_problem(rng, num_q_heads=4, num_kv_heads=2, num_tokens=90, head_dim=8,
                                             logit_scale=2.0, dtype=np.float16)
    b = psa_ref.KVBlocks.from_dense(k, v, block_size=8)
    return q, k, v, psa_ref.attention(q, b, 0.9, step=2)


def test_rejects_wrong_output():
    q, k, v, res = make()
    bad = dataclasses.replace(res, output=res.output + 1e-3)
    with pytest.raises(AssertionError, match="I1"):
        check_result(bad, q, k, v, threshold=0.9, step=2, block_size=8)


def test_rejects_stopping_late():
    q, k, v, res = make()
    n = -(-90 // 8)
    order = psa_ref.rank(psa_ref.estimate(q.astype(np.float64), psa_ref.KVBlocks.from_dense(k, v, block_size=8),
                                          1 / np.sqrt(8))[:2].max(0))
    u0 = res.blocks_used[0]
    if u0.size + 2 > n:
        pytest.skip("this draw stops too late to add a chunk")
    late = order[: u0.size + 2]
    bad = dataclasses.replace(res, blocks_used=[late, res.blocks_used[1]],
                              iterations=np.array([res.iterations[0] + 1, res.iterations[1]]))
    with pytest.raises(AssertionError, match="I5|I1"):
        check_result(bad, q, k, v, threshold=0.9, step=2, block_size=8)


def test_rejects_out_of_order_blocks():
    q, k, v, res = make()
    u0 = res.blocks_used[0]
    swapped = np.concatenate([u0[1:2], u0[:1], u0[2:]]) if u0.size > 1 else u0
    scores = psa_ref.estimate(q.astype(np.float64), psa_ref.KVBlocks.from_dense(k, v, block_size=8), 1 / np.sqrt(8))
    if u0.size < 2 or scores[:2].max(0)[u0[0]] - scores[:2].max(0)[u0[1]] < 1e-2:
        pytest.skip("first two blocks nearly tie")
    with pytest.raises(AssertionError, match="I4"):
        check_result(dataclasses.replace(res, blocks_used=[swapped, res.blocks_used[1]]), q, k, v, threshold=0.9,
                     step=2, block_size=8)


@pytest.mark.parametrize("kwargs, args, error, match", [
    (dict(method="PSA"), None, ValueError, "method must be one of 'psa', 'topk'"),
    (dict(method="topK"), None, ValueError, "method must be one of"),
    ({}, "keys 4-D", ValueError, r"keys must have shape \[T, D\] or \[Hkv, T, D\]"),
    ({}, "values short", ValueError, "values must have the same shape as keys"),
    ({}, "q one head", ValueError, r"needs keys of \[T, D\]"),
    ({}, "q heads", ValueError, r"query heads \(3\) must be a multiple"),
    (dict(kv_layout="nhd"), None, ValueError, "kv_layout"),
])
def test_bad_calls_are_errors_before_any_comparison(kwargs, args, error, match):
    """A mistyped method or inputs that do not fit together say so: the reference is never run on a misread call
    (a typo used to take top-k's path and report different blocks)."""
    q, k, v, res = make()
    if args == "keys 4-D":
        k, v = k[None], v[None]
    elif args == "values short":
        v = v[:, :-1]
    elif args == "q one head":
        q = q[0]
    elif args == "q heads":
        q = q[:3]
    with pytest.raises(error, match=match):
        check_result(res, q, k, v, threshold=0.9, step=2, block_size=8, **kwargs)


def test_nhd_inputs_conform_with_their_layout():
    q, k, v, res = make()
    nhd = dict(keys=k.transpose(1, 0, 2), values=v.transpose(1, 0, 2))
    check_result(res, q, threshold=0.9, step=2, block_size=8, kv_layout="NHD", **nhd)
    with pytest.warns(psa_ref.KVLayoutWarning, match="kv_layout='NHD'"), pytest.raises(ValueError):
        check_result(res, q, threshold=0.9, step=2, block_size=8, **nhd)  # read as HND: 90 KV heads of 2 tokens
