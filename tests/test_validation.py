"""Every bad input raises a clear error that names the argument."""

import numpy as np
import pytest

import psa_ref

rng = np.random.default_rng(0)
K = rng.standard_normal((2, 20, 4))
V = rng.standard_normal((2, 20, 4))
Q = rng.standard_normal((4, 4))
B = psa_ref.KVBlocks.from_dense(K, V, block_size=4)


def with_value(a, index, value):
    a = a.copy()
    a[index] = value
    return a


@pytest.mark.parametrize("bad, exc, words", [
    (dict(keys=with_value(K, (0, 3, 1), np.nan)), ValueError, "keys contains 1 NaN or Inf"),
    (dict(values=with_value(V, (1, 0, 0), np.inf)), ValueError, "values contains 1 NaN or Inf"),
    (dict(values=V[:, :19]), ValueError, "values must have the same shape"),
    (dict(keys=K[0, 0]), ValueError, "keys must have shape"),
    (dict(keys=K[:, :0], values=V[:, :0]), ValueError, "non-empty"),
    (dict(keys=K.astype(np.int64)), TypeError, "keys must have dtype float16, float32 or float64, got integer"),
    (dict(values=V.astype(np.complex128)), TypeError,
     "values must have dtype float16, float32 or float64, got complex"),
    (dict(keys=K > 0), TypeError, "got boolean"),
    (dict(block_size=0), ValueError, "block_size must be >= 1"),
    (dict(block_size=2.0), TypeError, "block_size must be an integer"),
    (dict(block_size=True), TypeError, "block_size must be an integer"),
    (dict(metadata="quest"), ValueError, "metadata must be one of"),
])
def test_from_dense_rejects(bad, exc, words):
    args = dict(keys=K, values=V, block_size=4, metadata="cuboid_mean") | bad
    with pytest.raises(exc, match=words):
        psa_ref.KVBlocks.from_dense(args.pop("keys"), args.pop("values"), **args)


CALLS = {
    "attention": lambda q, b, **kw: psa_ref.attention(q, b, **kw),
    "topk": lambda q, b, **kw: psa_ref.topk_attention(q, b, **kw),
}


@pytest.mark.parametrize("fn", CALLS)
@pytest.mark.parametrize("q, kw, exc, words", [
    (with_value(Q, (2, 1), np.nan), {}, ValueError, "q contains 1 NaN or Inf"),
    (Q[:, :3], {}, ValueError, "q has head dimension 3 but keys have 4"),
    (Q[:3], {}, ValueError, r"number of query heads \(3\) must be a multiple of the number of KV heads \(2\)"),
    (Q[0], {}, ValueError, "one head"),
    (Q[None], {}, ValueError, r"q must have shape \[D\] or \[Hq, D\]"),
    (Q.astype(np.int32), {}, TypeError, "q must have dtype"),
    (Q, {"scale": 0.0}, ValueError, "scale must be finite and > 0"),
    (Q, {"scale": float("nan")}, ValueError, "scale must be finite and > 0"),
    (Q, {"scale": "1"}, TypeError, "scale must be a positive real"),
    (Q, {"gqa": "grouped"}, ValueError, "gqa must be one of"),
    (Q, {"sink_blocks": -1}, ValueError, "sink_blocks must be >= 0"),
    (Q, {"recent_blocks": 1.5}, TypeError, "recent_blocks must be an integer"),
    (Q, {"exact_mass": "no"}, TypeError, "exact_mass must be True or False"),  # a truthy string
    (Q, {"exact_mass": 1}, TypeError, "exact_mass must be True or False"),
])
def test_sparse_attention_rejects(fn, q, kw, exc, words):
    with pytest.raises(exc, match=words):
        CALLS[fn](q, B, **kw)


@pytest.mark.parametrize("kw, exc, words", [
    ({"threshold": 0.0}, ValueError, r"threshold must lie in \(0, 1\]"),
    ({"threshold": 1.01}, ValueError, r"threshold must lie in \(0, 1\]"),
    ({"threshold": float("nan")}, ValueError, r"threshold must lie in \(0, 1\]"),
    ({"threshold": -0.5}, ValueError, "threshold must lie"),
    ({"threshold": "0.9"}, TypeError, "threshold must be a real number"),
    ({"stop": "oracle"}, ValueError, "stop must be one of"),
    ({"step": 0}, ValueError, "step must be >= 1"),
])
def test_attention_options_rejected(kw, exc, words):
    with pytest.raises(exc, match=words):
        psa_ref.attention(Q, B, **kw)


@pytest.mark.parametrize("kw, exc, words", [
    ({"k": 0}, ValueError, "k must be >= 1"),
    ({"k": 2.5}, TypeError, "k must be an integer"),
    ({"k": 1, "sink_blocks": 1, "recent_blocks": 1}, ValueError, r"k \(1\) must be at least the number of sink"),
])
def test_topk_options_rejected(kw, exc, words):
    with pytest.raises(exc, match=words):
        psa_ref.topk_attention(Q, B, **kw)


def test_blocks_must_be_kvblocks():
    with pytest.raises(TypeError, match="blocks must be a psa_ref.KVBlocks"):
        psa_ref.attention(Q, (K, V))


def test_options_are_keyword_only():
    with pytest.raises(TypeError):
        psa_ref.attention(Q, B, 0.9, None)  # scale cannot be positional


@pytest.mark.parametrize("kw, exc, words", [
    ({"q": Q[:, :2]}, ValueError, "head dimension"),
    ({"keys": K.astype(np.uint8)}, TypeError, "unsigned integer"),
    ({"values": V[:1]}, ValueError, "same shape"),
    ({"scale": -1.0}, ValueError, "scale"),
])
def test_dense_rejects(kw, exc, words):
    args = dict(q=Q, keys=K, values=V) | kw
    scale = args.pop("scale", None)
    with pytest.raises(exc, match=words):
        psa_ref.dense_attention(args["q"], args["keys"], args["values"], scale=scale)
