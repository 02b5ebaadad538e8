"""Dense attention: the ground truth."""

import numpy as np
from hypothesis import given

import psa_ref
from psa_ref.testing.strategies import problems
from psa_ref.testing import assert_close, budget64


@given(problems())
def test_dense_matches_explicit_softmax(p):
    out = psa_ref.dense_attention(p.q, p.keys, p.values)
    g = p.q.shape[0] // p.keys.shape[0]
    d = p.q.shape[1]
    for h in range(p.q.shape[0]):
        k, v = p.keys[h // g].astype(np.float64), p.values[h // g].astype(np.float64)
        logits = k @ p.q[h].astype(np.float64) / np.sqrt(d)
        w = np.exp(logits - logits.max())
        w /= w.sum()
        assert_close("dense output", out[h], w @ v, rtol=budget64(k.shape[0] * d))


def test_huge_logits_stay_finite():
    rng = np.random.default_rng(1)
    k, v = rng.standard_normal((2, 30, 4))
    q = rng.standard_normal(4)
    q *= 1e4 / np.abs(k @ q).max()  # logits up to +-1e4 at scale 1
    out = psa_ref.dense_attention(q, k, v, scale=1.0)
    assert np.isfinite(out).all()
    assert_close("peaked dense", out, v[np.argmax(k @ q)], rtol=1e-9)
