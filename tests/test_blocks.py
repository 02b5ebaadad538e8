"""Stage 1: block split and metadata."""

import warnings

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
    b = psa_ref.KVBlocks.from_dense(k, v, block_size=s, metadata="cuboid_mean", kv_layout="HND")
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


@given(t=st.integers(1, 60), s=st.integers(1, 9), data=st.data())
def test_token_indices_are_the_blocks_slices_in_order(t, s, data):
    k = np.zeros((t, 2))
    b = psa_ref.KVBlocks.from_dense(k, k, block_size=s)
    ids = data.draw(st.lists(st.integers(0, b.num_blocks - 1), max_size=12))
    want = [i for j in ids for i in range(j * s, min((j + 1) * s, t))]  # block_slice, block by block
    assert b.token_indices(ids).tolist() == want and b.token_indices(ids).dtype == np.int64
    for bad in ([b.num_blocks], [-1], [0, b.num_blocks + 3]):
        with pytest.raises(ValueError, match=r"block ids must lie in \[0, "):
            b.token_indices(bad)


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
    b = psa_ref.KVBlocks.from_dense(k, v, block_size=s, metadata="quant3", kv_layout="HND")
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


# --- kv_layout: HND [Hkv, T, D] (the default) or NHD [T, Hkv, D] ---------------------------------------------


@given(t=st.integers(1, 40), s=st.integers(1, 9), d=st.integers(1, 6), h=st.integers(1, 4),
       metadata=st.sampled_from(psa_ref.METADATA_KINDS), seed=st.integers(0, 999))
def test_nhd_equals_hnd_on_transposed_data(t, s, d, h, metadata, seed):
    rng = np.random.default_rng(seed)
    k, v = rng.standard_normal((2, h, t, d))  # HND
    hnd = psa_ref.KVBlocks.from_dense(k, v, block_size=s, metadata=metadata, kv_layout="HND")
    nhd = psa_ref.KVBlocks.from_dense(k.transpose(1, 0, 2), v.transpose(1, 0, 2), block_size=s, metadata=metadata,
                                      kv_layout="NHD")
    assert nhd.keys.shape == (h, t, d) and nhd.keys.flags.c_contiguous
    np.testing.assert_array_equal(nhd.keys, hnd.keys)
    np.testing.assert_array_equal(nhd.values, hnd.values)
    assert nhd.meta.keys() == hnd.meta.keys()
    for name in hnd.meta:
        np.testing.assert_array_equal(nhd.meta[name], hnd.meta[name], err_msg=name)
    q = rng.standard_normal((2 * h, d))
    a, b = psa_ref.attention(q, hnd, 0.9), psa_ref.attention(q, nhd, 0.9)
    np.testing.assert_array_equal(a.output, b.output)


@pytest.mark.parametrize("bad", ["nhd", "THD", "", 0, ("NHD",)])
def test_bad_kv_layout_is_a_value_error_naming_it(bad):
    k = np.zeros((2, 5, 3))
    with pytest.raises(ValueError, match="kv_layout"):
        psa_ref.KVBlocks.from_dense(k, k, kv_layout=bad)


def test_single_head_keys_ignore_kv_layout():
    k = np.arange(12.0).reshape(6, 2)
    for layout in (None, "HND", "NHD"):
        b = psa_ref.KVBlocks.from_dense(k, k, block_size=4, kv_layout=layout)
        assert b.single_head and b.keys.shape == (1, 6, 2)


def test_issue_example_nhd_passed_without_kv_layout_warns():
    """T = 16 tokens of Hkv = 8 heads in vLLM's [T, Hkv, D] layout, Hq = 32: the shapes also fit
    [Hkv=16, T=8, D] and 32 % 16 == 0, so attention alone cannot object. from_dense warns (more heads
    than tokens), naming kv_layout; with kv_layout="NHD" the output equals dense attention."""
    rng = np.random.default_rng(17)
    t, hkv, hq, d = 16, 8, 32, 64
    keys, values = rng.standard_normal((2, t, hkv, d))  # NHD
    q = rng.standard_normal((hq, d))
    with pytest.warns(psa_ref.blocks.KVLayoutWarning, match="kv_layout='NHD'") as record:
        wrong = psa_ref.KVBlocks.from_dense(keys, values, block_size=4)
    assert record[0].filename == __file__  # the warning points at the caller's line
    assert wrong.num_heads == 16  # read as HND, as documented: the warning is the only signal
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an explicit layout never warns
        right = psa_ref.KVBlocks.from_dense(keys, values, block_size=4, kv_layout="NHD")
        psa_ref.KVBlocks.from_dense(keys, values, block_size=4, kv_layout="HND")
    dense = psa_ref.dense_attention(q, keys.transpose(1, 0, 2), values.transpose(1, 0, 2))
    assert_close("NHD output", psa_ref.attention(q, right, 1.0).output, dense, rtol=budget64(t))
    assert np.abs(psa_ref.attention(q, wrong, 1.0).output - dense).max() > 0.1  # what the warning prevents
    # dense_attention takes the same kv_layout, and warns the same way without it
    np.testing.assert_array_equal(psa_ref.dense_attention(q, keys, values, kv_layout="NHD"), dense)
    with pytest.warns(psa_ref.blocks.KVLayoutWarning, match="kv_layout='NHD'") as record:
        misread = psa_ref.dense_attention(q, keys, values)
    assert record[0].filename == __file__ and np.abs(misread - dense).max() > 0.1


@pytest.mark.parametrize("shape, warns", [
    ((16, 8, 4), True),     # NHD, T=16 > Hkv=8: caught
    ((2048, 3, 4), True),   # NHD, a real cache: caught
    ((8, 16, 4), False),    # HND with T >= Hkv: never warns
    ((8, 8, 4), False),     # T == Hkv: both readings fit, no warning
    ((4, 8, 4), False),     # NHD with T=4 < Hkv=8 is indistinguishable from HND [4, 8, D]: not caught
    ((16, 4), False),       # one head: no layout
])
def test_what_the_layout_check_can_and_cannot_tell(shape, warns):
    k = np.ones(shape)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        psa_ref.KVBlocks.from_dense(k, k)
    assert any(issubclass(w.category, psa_ref.blocks.KVLayoutWarning) for w in record) == warns


def test_to_hnd_is_shape_only_and_returns_views():
    """The helper psa_fast shares: needs only ndim/shape/transpose (CuPy arrays have them too)."""
    k = np.arange(24.0).reshape(4, 3, 2)
    hk, hv = psa_ref.blocks.to_hnd(k, k + 1, "NHD")
    assert hk.shape == (3, 4, 2) and np.shares_memory(hk, k)
    np.testing.assert_array_equal(hk, k.transpose(1, 0, 2))
    np.testing.assert_array_equal(hv, k.transpose(1, 0, 2) + 1)
    assert psa_ref.blocks.to_hnd(k, k, "HND")[0] is k


# --- repr ---------------------------------------------------------------------------------------------------


def test_repr_is_short_and_names_the_shapes():
    rng = np.random.default_rng(0)
    keys, values = rng.standard_normal((2, 8, 1000, 128))
    r = repr(psa_ref.KVBlocks.from_dense(keys, values, block_size=16, metadata="quant3"))
    assert len(r) < 160, r
    assert r == ("psa_ref.KVBlocks(Hkv=8, T=1000, D=128, block_size=16, num_blocks=63, metadata='quant3', "
                 "dtype=float64)")
    assert "array" not in r and "[" not in r
    single = repr(psa_ref.KVBlocks.from_dense(keys[0, :5], values[0, :5], block_size=2))
    assert single == "psa_ref.KVBlocks(T=5, D=128, block_size=2, num_blocks=3, metadata='cuboid_mean', dtype=float64)"


def test_psa_fast_repr_reads_only_the_cache_s_settings():
    """psa_fast's twin, on a stand-in cache (runs without a GPU): no device array is touched."""
    from types import SimpleNamespace

    import psa_fast

    cache = SimpleNamespace(num_kv_heads=8, head_dim=128, block_size=16, metadata="quant3",
                            host_lens=np.array([[1000]]), k_pool=None, v_pool=None, dtype="bfloat16")
    r = repr(psa_fast.KVBlocks(cache, single_head=False))
    assert r == ("psa_fast.KVBlocks(Hkv=8, T=1000, D=128, block_size=16, num_blocks=63, metadata='quant3', "
                 "dtype=bfloat16)")
    assert repr(psa_fast.KVBlocks(cache, single_head=True)).startswith("psa_fast.KVBlocks(T=1000, D=128,")
