"""Stage 1: block split and metadata."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import psa_ref
from psa_ref.blocks import dequantize
from psa_ref.testing import assert_close, brute_force_dequantized, budget64


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


# --- quant3: 3-bit per-token keys on the block's own [lo, hi] grid ------------------------------


@given(t=st.integers(1, 40), s=st.integers(1, 9), d=st.integers(1, 6), h=st.integers(1, 2), seed=st.integers(0, 999),
       flat=st.booleans())
def test_quant3_matches_brute_force(t, s, d, h, seed, flat):
    rng = np.random.default_rng(seed)
    k, v = rng.standard_normal((2, h, t, d))
    if flat:  # a channel constant over the cache: hi == lo in every block
        k[..., 0] = 0.25
    b = psa_ref.KVBlocks.from_dense(k, v, block_size=s, metadata="quant3")
    n = -(-t // s)
    assert b.meta["codes"].shape == (h, n, s, d) and b.meta["codes"].dtype == np.uint8
    assert set(b.meta) == {"lo", "hi", "codes"}
    for kv in range(h):
        for j in range(n):
            kb = k[kv, j * s : (j + 1) * s]
            rows = kb.shape[0]
            lo, hi = kb.min(0), kb.max(0)
            for tt in range(rows):
                for i in range(d):
                    span = hi[i] - lo[i]
                    code = 0 if span == 0 else min(max(int(np.floor((kb[tt, i] - lo[i]) / span * 8)), 0), 7)
                    assert b.meta["codes"][kv, j, tt, i] == code
            assert not b.meta["codes"][kv, j, rows:].any(), "rows past a partial block's end must hold 0"
            k_hat = dequantize(b.meta["codes"][kv, j, :rows], b.meta["lo"][kv, j], b.meta["hi"][kv, j])
            assert_close("quant3 reconstruction", k_hat, brute_force_dequantized(kb), rtol=budget64(1))
            # bin centres: every key within half a bin of its reconstruction; exact on flat channels
            assert np.all(np.abs(k_hat - kb) <= (hi - lo) / 16 * (1 + 1e-12) + 1e-300)


def test_quant3_codes_by_hand():
    keys = np.array([[0.0, 5.0], [1.0, 5.0], [0.5, 5.0], [0.124, 5.0], [0.999, 5.0]])  # channel 1 is flat
    b = psa_ref.KVBlocks.from_dense(keys, keys, block_size=8, metadata="quant3")
    assert b.meta["codes"][0, 0, :5, 0].tolist() == [0, 7, 4, 0, 7]  # floor(8 x), and x = 1 clipped to 7
    assert b.meta["codes"][0, 0, :, 1].tolist() == [0] * 8
    k_hat = dequantize(b.meta["codes"][0, 0, :5], b.meta["lo"][0, 0], b.meta["hi"][0, 0])
    assert k_hat[:, 0].tolist() == [0.0625, 0.9375, 0.5625, 0.0625, 0.9375] and k_hat[:, 1].tolist() == [5.0] * 5
