"""psa_fast's Numba metadata kernels against psa_ref (on the GPU, or under Numba's CUDA simulator in CI)."""

import functools

import numpy as np
import pytest

pytest.importorskip("numba")

import psa_ref  # noqa: E402
from psa_fast import metadata  # noqa: E402
from psa_fast._compat import gpu_available  # noqa: E402
from psa_ref.testing import assert_close  # noqa: E402

if gpu_available():
    import cupy as xp

    to_host = xp.asnumpy
else:
    xp = np
    to_host = np.asarray

FP16_REL = 2.0**-11  # one float16 rounding


@pytest.fixture(autouse=True)
def interleaved_threads():
    """Under the CUDA simulator a CTA's threads are Python threads that run ~5 ms each before the interpreter lets
    another run, so one thread usually finishes a phase before the next starts and a missing barrier goes unseen. A
    switch interval of 1 µs interleaves them: with the append's barrier before the split code pass removed, 3-5 of
    the 58 split tests fail in every run (none at the default interval); with the barrier after the codes are
    cleared removed, 26-29 of 46 quant3 tests (8 at the default)."""
    if gpu_available():
        yield
        return
    import sys

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(interval)


def exp_append():
    """benchmarks/exp_append.py (its loader of other versions of psa_fast/metadata.py)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    try:
        import exp_append as module
    finally:
        sys.path.pop(0)
    return module


@functools.lru_cache(maxsize=None)
def _with_constants(tile: int, split: int):
    return exp_append().with_constants(metadata, KEY_TILE=tile, APPEND_SPLIT=split)


@pytest.fixture(params=[(1, 1), (4, 1), (16, 1), (16, 4), (4, 3)],
                ids=["tile1", "tile4", "tile16", "tile16-split4", "tile4-split3"])
def md(request):
    """psa_fast.metadata reading each thread's keys ``KEY_TILE`` (1, 4, 16) at a time, and with quant3's codes of a
    channel spread over ``APPEND_SPLIT`` (1, 3, 4) threads in the append (the package's module for its settings, a
    copy for the others): every setting gives the reference's metadata, on blocks shorter and longer than a tile and
    than the split. The split acts on quant3 alone, so a test of another kind gets the copy without it, whose kernels
    are the same and already compiled (each copy compiles its own: a kernel for each kind, key type and block size)."""
    tile, split = request.param
    kind = request.node.callspec.params.get("kind") if hasattr(request.node, "callspec") else None
    return _with_constants(tile, 1 if kind not in (None, "quant3") else split)


def pool_from_dense(keys, s):
    """[Hkv, T, D] -> pool [Hkv*N, S, D] (zero padded), block_table [1, Hkv, N]."""
    hkv, t, d = keys.shape
    n = -(-t // s)
    pool = np.zeros((hkv * n, s, d), np.float16)
    pool.reshape(hkv, n * s, d)[:, :t] = keys
    return pool, np.arange(hkv * n, dtype=np.int32).reshape(1, hkv, n)


def unpack_codes(codes, d):
    """[1, Hkv, N, S, Dp/8] uint32 nibble words -> [Hkv, N, S, d] uint8 codes."""
    shifts = 4 * np.arange(metadata.NIBBLES, dtype=np.uint32)
    nib = (codes[0][..., None] >> shifts) & 15  # [Hkv, N, S, Dp/8, 8]
    return nib.reshape(nib.shape[:3] + (-1,))[..., :d].astype(np.uint8)


def codes_buffer(hkv, n, s, d):
    """quant3 code words, poisoned with all bits set (every nibble 15, never a valid 3-bit code)."""
    return np.full((1, hkv, n, s, -(-d // 8)), 0xFFFFFFFF, np.uint32)


def check_meta(meta, lohi, keys, s, kind, codes=None):
    ref = psa_ref.KVBlocks.from_dense(keys.astype(np.float64), keys.astype(np.float64), block_size=s, metadata=kind)
    assert_close("lo", lohi[0, :, :, 0], ref.meta["lo"], rtol=0)  # exact: min of float16 values
    assert_close("hi", lohi[0, :, :, 1], ref.meta["hi"], rtol=0)
    if kind == "quant3":  # bit-identical: the same float64 formula on the same float16 keys
        np.testing.assert_array_equal(unpack_codes(codes, keys.shape[2]), ref.meta["codes"])
    if kind == "cuboid_mean":
        assert_close("centre", meta[0, :, :, 0], ref.meta["center"], rtol=FP16_REL)
        assert_close("radius", meta[0, :, :, 1], ref.meta["radius"], rtol=2 * FP16_REL)
    elif kind == "mean":
        assert_close("mean", meta[0, :, :, 0], ref.meta["mean"], rtol=2 * FP16_REL)


@pytest.mark.parametrize("kind", psa_ref.METADATA_KINDS)
@pytest.mark.parametrize("t, s, d", [(1, 4, 8), (11, 4, 8), (16, 16, 8), (37, 16, 16), (9, 3, 8)])
def test_build_metadata_matches_reference(kind, t, s, d, md):
    rng = np.random.default_rng(t * 100 + s)
    keys = rng.standard_normal((2, t, d)).astype(np.float16)
    if t > 1:  # a flat channel (hi == lo: code 0) and a key on a grid point
        keys[:, :, 1] = keys[:, :1, 1]
        keys[:, 1, 2] = (keys[:, 0, 2].astype(np.float32) + keys[:, 2 % t, 2]) / 2
    pool, table = pool_from_dense(keys, s)
    n = table.shape[2]
    meta = np.full((1, 2, n, 2, d), np.nan, np.float16)
    lohi = np.full_like(meta, np.nan)
    meta_d, lohi_d = xp.asarray(meta), xp.asarray(lohi)
    codes_d = xp.asarray(codes_buffer(2, n, s, d)) if kind == "quant3" else None
    md.build_metadata(xp.asarray(pool), xp.asarray(table), xp.asarray(np.array([t], np.int32)), meta_d,
                            lohi_d, kind=kind, block_size=s, codes=codes_d)
    check_meta(to_host(meta_d), to_host(lohi_d), keys, s, kind, None if codes_d is None else to_host(codes_d))


@pytest.mark.parametrize("kind", ["cuboid_mean", "mean", "quant3"])
def test_append_token_by_token_equals_building_once(kind, md):
    rng = np.random.default_rng(7)
    hkv, t, s, d = 2, 13, 4, 8
    keys = rng.standard_normal((hkv, t, d)).astype(np.float16)
    values = rng.standard_normal((hkv, t, d)).astype(np.float16)
    n = -(-t // s)
    k_pool = xp.zeros((hkv * n, s, d), np.float16)
    v_pool = xp.zeros_like(k_pool)
    table = xp.asarray(np.arange(hkv * n, dtype=np.int32).reshape(1, hkv, n))
    lens = xp.zeros(1, np.int32)
    meta = xp.zeros((1, hkv, n, 2, d), np.float16)
    lohi = xp.zeros_like(meta)
    codes = xp.asarray(codes_buffer(hkv, n, s, d)) if kind == "quant3" else None
    for i in range(t):
        md.append_token(k_pool, v_pool, table, lens, xp.asarray(np.ascontiguousarray(keys[None, :, i])),
                              xp.asarray(np.ascontiguousarray(values[None, :, i])),
                              meta, lohi, kind=kind, block_size=s, codes=codes)
        lens += 1
    pool, _ = pool_from_dense(keys, s)
    np.testing.assert_array_equal(to_host(k_pool), pool)  # every token landed in its slot and row
    vpool, _ = pool_from_dense(values, s)
    np.testing.assert_array_equal(to_host(v_pool), vpool)
    check_meta(to_host(meta), to_host(lohi), keys, s, kind, None if codes is None else to_host(codes))
    if codes is not None:  # rows past the last token of the partial block are cleared, not left poisoned
        assert not to_host(codes)[0, :, -1, t % s :].any()


@pytest.mark.parametrize("s, t", [(40, 95), (64, 70)])
def test_quant3_codes_of_long_blocks(s, t, md):
    """Blocks of 40 and 64 rows (a partial last block whose tokens end inside it) build and append the reference's
    quant3 codes, the rows past a block's last token cleared."""
    rng = np.random.default_rng(s + t)
    hkv, d = 1, 24
    keys = rng.standard_normal((hkv, t, d)).astype(np.float16)
    pool, table = pool_from_dense(keys, s)
    n = table.shape[2]
    meta = xp.asarray(np.zeros((1, hkv, n, 2, d), np.float16))
    lohi = xp.zeros_like(meta)
    codes = xp.asarray(codes_buffer(hkv, n, s, d))
    md.build_metadata(xp.asarray(pool), xp.asarray(table), xp.asarray(np.array([t], np.int32)), meta, lohi,
                            kind="quant3", block_size=s, codes=codes)
    check_meta(to_host(meta), to_host(lohi), keys, s, "quant3", to_host(codes))
    assert not to_host(codes)[0, :, -1, t % s :].any()
    # one more token appended into the last block's next row
    k_pool = xp.asarray(pool)
    new = rng.standard_normal((1, hkv, d)).astype(np.float16)
    md.append_token(k_pool, xp.zeros_like(k_pool), xp.asarray(table), xp.asarray(np.array([t], np.int32)),
                          xp.asarray(new), xp.asarray(new), meta, lohi, kind="quant3", block_size=s, codes=codes)
    keys2 = np.concatenate([keys, new[0][:, None]], axis=1)
    check_meta(to_host(meta), to_host(lohi), keys2, s, "quant3", to_host(codes))


def _reference_codes(x, lo, hi):
    """psa_ref's quant3 codes of values ``x`` on the grid ``[lo, hi]`` (float64 arrays of equal length)."""
    return psa_ref.blocks.quantize(x[:, None, None], lo[:, None], hi[:, None]).astype(int)[:, 0, 0]


def _codes_by_multiply(x, lo, hi):
    """quant3's codes as ``floor((x - lo) * (8 / span))``, the multiply of ``_code``'s fast path with no margin."""
    return np.clip(np.floor((x - lo) * (psa_ref.blocks.QUANT_LEVELS / (hi - lo))), 0, psa_ref.blocks.QUANT_LEVELS - 1)


def test_quant3_code_is_the_references_on_every_float16_value_and_near_grid_lines():
    """``metadata._code`` (a multiply, the reference's division only within ``CODE_MARGIN`` of a grid line) gives
    psa_ref.blocks.quantize's code of every finite float16 value in [lo, hi] for grids whose lines are float16 values,
    that are not, span the whole float16 range or a few subnormals, and of float32 values one ulp around the grid lines
    of random grids. The multiply alone is wrong on some of those float32 values (so this test can fail), and both of
    ``_code``'s paths are taken."""
    code = metadata._code.py_func
    levels = psa_ref.blocks.QUANT_LEVELS
    halves = np.arange(65536, dtype=np.uint16).view(np.float16)
    halves = np.unique(halves[np.isfinite(halves)].astype(np.float64))
    xs, los, his = [], [], []
    for lo, hi in [(0, 8), (-3, 5), (-1.7, 2.3), (0.3, 0.7), (-65504, 65504), (-1e-3, 7e-4), (6e-8, 3e-7), (1.5, 1.5)]:
        lo, hi = float(np.float16(lo)), float(np.float16(hi))
        x = halves[(halves >= lo) & (halves <= hi)]
        xs.append(x), los.append(np.full(len(x), lo)), his.append(np.full(len(x), hi))
    rng = np.random.default_rng(5)
    lo = rng.standard_normal(20000).astype(np.float32)
    hi = (lo + np.abs(rng.standard_normal(20000))).astype(np.float32)
    line = (lo + (hi.astype(np.float64) - lo) * rng.integers(1, levels, 20000) / levels).astype(np.float32)
    for step in (-np.inf, 0, np.inf):
        x = np.nextafter(line, np.float32(step)) if step else line
        keep = (x >= lo) & (x <= hi)
        xs.append(x[keep].astype(np.float64)), los.append(lo[keep].astype(np.float64))
        his.append(hi[keep].astype(np.float64))
    x, lo, hi = np.concatenate(xs), np.concatenate(los), np.concatenate(his)
    span = hi - lo
    scale = np.where(span != 0, levels / np.where(span != 0, span, 1), 0)
    got = np.array([code(np.float32(a), np.float32(b), s, f) for a, b, s, f in zip(x, lo, span, scale)])
    want = _reference_codes(x, lo, hi)
    assert np.array_equal(got, want), np.nonzero(got != want)[0][:5]
    sloped = span != 0
    assert (_codes_by_multiply(x[sloped], lo[sloped], hi[sloped]) != want[sloped]).sum() > 0
    y = (x - lo) * scale
    near = ~((metadata.CODE_MARGIN < y - np.floor(y)) & (y - np.floor(y) < 1 - metadata.CODE_MARGIN))
    assert 0 < near[sloped].sum() < 0.5 * sloped.sum()


def test_bad_kind_or_block_size_is_refused_by_name():
    """The kernels' compile-time constants are checked before anything launches: an unknown kind is a ValueError
    naming ``kind``, a block size that is not a positive integer names ``block_size``."""
    keys = np.zeros((1, 16, 8), np.float16)
    pool, table = pool_from_dense(keys, 16)
    lens = xp.asarray(np.array([15], np.int32))
    meta = xp.zeros((1, 1, 1, 2, 8), np.float16)
    new = xp.asarray(keys[:, :1])
    args = (xp.asarray(pool), xp.asarray(pool), xp.asarray(table), lens, new, new, meta, xp.zeros_like(meta))
    with pytest.raises(ValueError, match="kind"):
        metadata.append_token(*args, kind="quant4", block_size=16)
    with pytest.raises(ValueError, match="kind"):
        metadata.build_metadata(args[0], args[2], lens, meta, args[7], kind="cuboid", block_size=16)
    for bad, error in ((0, ValueError), (16.0, TypeError), (True, TypeError)):
        with pytest.raises(error, match="block_size"):
            metadata.append_token(*args, kind="cuboid_mean", block_size=bad)
        with pytest.raises(error, match="block_size"):
            metadata.write_token(*args[:6], block_size=bad)
    assert not to_host(meta).any() and to_host(lens)[0] == 15  # nothing ran


@pytest.mark.parametrize("kind", psa_ref.METADATA_KINDS)
def test_bfloat16_keys_build_and_append_like_float32(kind, md):
    """A bfloat16 pool (int16 bits) gives the metadata of the same values in float32 (the kernels decode
    the bits exactly; every value here is a normal float16 too, so lo/hi are exact)."""
    from psa_ref.testing import bfloat16_bits, to_bfloat16

    rng = np.random.default_rng(11)
    hkv, t, s, d = 2, 13, 4, 8
    x = rng.standard_normal((hkv, t, d)) * 4
    x[np.abs(x) < 1e-2] = 1e-2  # away from float16's subnormals
    x[0, 3, 5] = -0.0
    keys = to_bfloat16(x)
    n = -(-t // s)
    bits = np.zeros((hkv * n, s, d), np.int16)
    bits.reshape(hkv, n * s, d)[:, :t] = bfloat16_bits(keys)
    table = np.arange(hkv * n, dtype=np.int32).reshape(1, hkv, n)
    meta = xp.asarray(np.full((1, hkv, n, 2, d), np.nan, np.float16))
    lohi = xp.asarray(np.full((1, hkv, n, 2, d), np.nan, np.float16))
    codes = xp.asarray(codes_buffer(hkv, n, s, d)) if kind == "quant3" else None
    md.build_metadata(xp.asarray(bits), xp.asarray(table), xp.asarray(np.array([t], np.int32)), meta, lohi,
                            kind=kind, block_size=s, codes=codes)
    check_meta(to_host(meta), to_host(lohi), keys, s, kind, None if codes is None else to_host(codes))
    # the append path writes the bits through and summarises the same values
    k_pool, v_pool = xp.zeros((hkv * n, s, d), np.int16), xp.zeros((hkv * n, s, d), np.int16)
    lens = xp.zeros(1, np.int32)
    meta2, lohi2 = xp.zeros_like(meta), xp.zeros_like(lohi)
    codes2 = xp.asarray(codes_buffer(hkv, n, s, d)) if kind == "quant3" else None
    for i in range(t):
        tok = xp.asarray(np.ascontiguousarray(bfloat16_bits(keys[None, :, i])))
        md.append_token(k_pool, v_pool, xp.asarray(table), lens, tok, tok, meta2, lohi2, kind=kind,
                              block_size=s, codes=codes2)
        lens += 1
    np.testing.assert_array_equal(to_host(k_pool), bits)
    check_meta(to_host(meta2), to_host(lohi2), keys, s, kind, None if codes2 is None else to_host(codes2))


def test_write_token_writes_what_the_append_writes_and_nothing_else():
    """write_token (a cache without metadata) puts each request's token where append_token does, at its own length
    (a block's first row, a middle row, the last row), and leaves every other row of the pools as it was."""
    rng = np.random.default_rng(5)
    b, hkv, s, d, n = 3, 2, 4, 8, 3
    table = np.arange(b * hkv * n, dtype=np.int32).reshape(b, hkv, n)
    pool = rng.standard_normal((b * hkv * n, s, d)).astype(np.float16)
    lens = np.array([4, 6, 11], np.int32)
    k_new, v_new = (rng.standard_normal((b, hkv, d)).astype(np.float16) for _ in range(2))
    pools = []
    for write in (True, False):
        k_pool, v_pool = xp.array(pool), xp.array(pool[::-1])  # (copies: numpy.asarray would not copy)
        if write:
            metadata.write_token(k_pool, v_pool, xp.asarray(table), xp.asarray(lens), xp.asarray(k_new),
                                 xp.asarray(v_new), block_size=s)
        else:
            meta = xp.zeros((b, hkv, n, 2, d), np.float16)
            metadata.append_token(k_pool, v_pool, xp.asarray(table), xp.asarray(lens), xp.asarray(k_new),
                                  xp.asarray(v_new), meta, xp.zeros_like(meta), kind="cuboid_mean", block_size=s)
        pools.append((to_host(k_pool), to_host(v_pool)))
    for got, want in zip(pools[0], pools[1]):
        np.testing.assert_array_equal(got, want)
    k_pool, v_pool = pools[0]
    want_k, want_v = pool.copy(), pool[::-1].copy()
    for r, t in enumerate(lens):
        for kv in range(hkv):
            want_k[table[r, kv, t // s], t % s] = k_new[r, kv]
            want_v[table[r, kv, t // s], t % s] = v_new[r, kv]
    np.testing.assert_array_equal(k_pool, want_k)
    np.testing.assert_array_equal(v_pool, want_v)


def test_exp_append_loads_another_version_of_this_module():
    """benchmarks/exp_append.py times another version of psa_fast/metadata.py beside the package's: loaded from a
    path as a module of the package, it runs (here the package's own file, one append, the reference's codes)."""
    other = exp_append().load_version(metadata.__file__)
    assert other is not metadata and other.__name__ == "psa_fast._metadata_timed"
    rng = np.random.default_rng(3)
    s, d, t = 4, 8, 6
    keys = rng.standard_normal((1, t, d)).astype(np.float16)
    pool, table = pool_from_dense(keys, s)
    k_pool = xp.asarray(pool)
    k_pool[1, 1:] = 0  # the token at position 5 (block 1, row 1) comes from the append
    meta = xp.zeros((1, 1, 2, 2, d), np.float16)
    lohi = xp.zeros_like(meta)
    codes = xp.asarray(codes_buffer(1, 2, s, d))
    metadata.build_metadata(k_pool, xp.asarray(table), xp.asarray(np.array([t - 1], np.int32)), meta, lohi,
                            kind="quant3", block_size=s, codes=codes)
    other.append_token(k_pool, xp.zeros_like(k_pool), xp.asarray(table), xp.asarray(np.array([t - 1], np.int32)),
                       xp.asarray(keys[None, :, t - 1]), xp.asarray(keys[None, :, t - 1]), meta, lohi, kind="quant3",
                       block_size=s, codes=codes)
    check_meta(to_host(meta), to_host(lohi), keys, s, "quant3", to_host(codes))
