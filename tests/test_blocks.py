"""Stage 1: block split and metadata."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import psa_ref
from psa_ref.testing import assert_close, budget64


@given(t=st.integers(1, 40), s=st.integers(1, 9), d=st.integers(1, 6), h=st.integers(1, 3), seed=st.integers(0, 999))
def test_metadata_matches_raw_keys(t, s, d, h, seed):
    rng = np.random.default_rng(seed)
    k, v = rng.standard_normal((2, h, t, d))
    b = psa_ref.KVBlocks.from_dense(k, v, block_size=s, metadata="cuboid_mean")
    n = -(-t // s)
    assert b.num_blocks == n and b.block_lengths.sum() == t
    assert b.meta["lo"].shape == (h, n, d)
    for j in range(n):
        kb = k[:, j * s : (j + 1) * s]
        assert b.block_lengths[j] == kb.shape[1]  # only the last block may be partial
        assert_close("lo", b.meta["lo"][:, j], kb.min(1), rtol=0)
        assert_close("hi", b.meta["hi"][:, j], kb.max(1), rtol=0)
        c = (kb.max(1) + kb.min(1)) / 2
        assert_close("center", b.meta["center"][:, j], c, rtol=budget64(1))
        assert_close("radius", b.meta["radius"][:, j], np.abs(kb - c[:, None]).mean(1), rtol=budget64(s))


def test_mean_metadata_and_minmax_keeps_only_bounds():
    rng = np.random.default_rng(0)
    k, v = rng.standard_normal((2, 10, 3))
    mean = psa_ref.KVBlocks.from_dense(k, v, block_size=4, metadata="mean")
    assert_close("mean", mean.meta["mean"][0, 2], k[8:].mean(0), rtol=budget64(4))
    mm = psa_ref.KVBlocks.from_dense(k, v, block_size=4, metadata="minmax")
    assert set(mm.meta) == {"lo", "hi"}
    assert set(mean.meta) == {"lo", "hi", "mean"}


def test_single_head_and_inputs_copied_to_float64():
    k = np.arange(12, dtype=np.float16).reshape(6, 2)
    b = psa_ref.KVBlocks.from_dense(k, k.copy(), block_size=4)
    assert b.single_head and b.num_heads == 1 and b.keys.dtype == np.float64
    k[0, 0] = 100  # the blocks own a copy
    assert b.keys[0, 0, 0] == 0
    assert list(b.token_indices([1, 0])) == [4, 5, 0, 1, 2, 3]


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_float_dtypes_accepted(dtype):
    k = np.ones((3, 2), dtype=dtype)
    assert psa_ref.KVBlocks.from_dense(k, k, block_size=2).num_blocks == 2
