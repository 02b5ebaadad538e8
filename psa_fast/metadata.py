"""Stage 1 on the GPU: block metadata, in Numba CUDA.

These kernels are written in Numba because they are plain per-channel loops that read like
the reference (``psa_ref.blocks.block_metadata``); they run once per block at prefill and once
per appended token, far from the hot path, and they run under Numba's CUDA simulator in CI
(``NUMBA_ENABLE_CUDASIM=1``). The hot kernels (scoring, ordering, attention) are CUDA C.

Layouts (``Dp`` is the padded head dimension, see ``psa_fast.cache.padded_dim``; padded channels are zero):

* ``k_pool``, ``v_pool``: ``[slots, S, Dp]`` float16, or int16 holding bfloat16 bits (``bf16``)
* ``block_table``: ``[B, Hkv, Nmax]`` int32, the slot of each block
* ``seq_lens``: ``[B]`` int32
* ``meta``: ``[B, Hkv, Nmax, 2, Dp]`` float16: (centre, radius) for ``cuboid_mean``, (mean, 0) for ``mean``
* ``lohi``: ``[B, Hkv, Nmax, 2, Dp]`` float16: (lo, hi), kept for every metadata kind
* ``codes``: ``[B, Hkv, Nmax, S, Dp / 8]`` uint32 (``quant3`` only): each key's 3-bit codes
  ([`psa_ref.blocks.quantize`][psa_ref.blocks.quantize]), one 4-bit nibble per channel: bits ``4k .. 4k + 3`` of word
  ``w`` of row ``t`` hold channel ``8w + k`` of token ``t``; rows past the block's last token are 0
"""

from __future__ import annotations

from ._compat import patch_numpy_for_numba

patch_numpy_for_numba()

import functools  # noqa: E402
import math  # noqa: E402

import numpy as np  # noqa: E402
from numba import cuda, float32, float64, int32, uint32, uint64  # noqa: E402

from psa_ref import _validate  # noqa: E402
from psa_ref.blocks import QUANT_LEVELS  # noqa: E402

KIND_CODES = {"cuboid_mean": 0, "minmax": 1, "mean": 2, "quant3": 3}
NIBBLES = 8  # quant3 codes per uint32 word


@cuda.jit(device=True)
def _bf16_to_f32(u):
    """The float32 value of bfloat16 bits ``u`` (0 <= u < 65536), exactly, by arithmetic (no bit casts,
    so the same code runs on the GPU and in the CUDA simulator)."""
    e = (u >> 7) & 0xFF
    m = u & 0x7F
    if e == 0:
        v = float32(m) * float32(2.0 ** -133)  # subnormal: m / 128 * 2^-126
    elif e == 0xFF:
        v = float32(math.inf) if m == 0 else float32(math.nan)
    else:
        v = float32(math.ldexp(float32(128 + m), int(e) - 134))
    return -v if u >> 15 else v


# Subscripts as unsigned integers: Numba wraps a signed index that may be negative (a compare and a select for each
# dimension, on 64-bit values). That index arithmetic, with the kind and block size then run-time arguments, was most
# of the append's ~2,000 instructions a warp (s49a). Every index here is >= 0.
@cuda.jit(device=True)
def _at3(i, j, k):
    return uint64(i), uint64(j), uint64(k)


@cuda.jit(device=True)
def _at5(i, j, k, m, n):
    return uint64(i), uint64(j), uint64(k), uint64(m), uint64(n)


@cuda.jit(device=True)
def _key(k_pool, slot, t, d, bf16):
    """Channel ``d`` of token ``t`` of block ``slot`` as float32 (exact for float16 and bfloat16)."""
    x = k_pool[_at3(slot, t, d)]
    if bf16:
        return _bf16_to_f32(int32(x) & 0xFFFF)
    return float32(x)


# How far from an integer ``(x - lo) * (QUANT_LEVELS / span)`` must be for its floor to be the reference's
# ``floor((x - lo) / span * QUANT_LEVELS)`` (``_code``). Both are float64 with 0 <= x - lo <= span, so the product
# (two roundings, the factor's and its own) and the reference's value (one rounding, the quotient's; the scaling by 8
# is exact) each lie within 2 ulps of 8 (x - lo) / span <= 8, i.e. within 2^-49 of it, and within 2^-48 of each other:
# an integer closer than that to the product could sit between them. 2^-40 leaves a margin; values closer than it
# (x on an inner grid line) take the reference's division. lo and hi themselves (fraction exactly 0) have exact
# shortcuts: every channel's lo and hi sit at some token of the block, so without them some lane of a warp divided at
# almost every token and the warp ran both paths (H100, s50: 10.5 µs a quant3 append with the fallback alone, 7.2 with
# the shortcuts, 9.4 with the division alone; benchmarks/results_h100_s50.md).
CODE_MARGIN = 2.0 ** -40


@cuda.jit(device=True)
def _code(x, lo, span, scale):
    """quant3's 3-bit code of key value ``x`` on its block's grid ``lo + [0, span]`` (``span = hi - lo``,
    ``scale = QUANT_LEVELS / span``, both float64), bit-identical to
    [`psa_ref.blocks.quantize`][psa_ref.blocks.quantize]'s float64 formula; 0 for a flat channel. A multiply does
    what the reference's division does unless the value is within ``CODE_MARGIN`` of a grid line, where the division
    is done as the reference does it; ``x == lo`` is code 0 and ``x == hi`` code 7 exactly (``0 / span`` and ``span /
    span * 8 = 8``, clamped)."""
    if span == 0.0:
        return 0
    a = float64(x) - float64(lo)
    if a == 0.0:
        return 0
    if a == span:
        return QUANT_LEVELS - 1
    y = a * scale
    f = math.floor(y)
    if not (CODE_MARGIN < y - f < 1.0 - CODE_MARGIN):  # near a grid line (or not finite): the reference's division
        f = math.floor(a / span * QUANT_LEVELS)
    return min(max(int(f), 0), QUANT_LEVELS - 1)


@cuda.jit(device=True)
def _or_code(codes, b, kv, j, t, d, x, lo, span, scale):
    """quant3: OR key ``x``'s code (token ``t``, channel ``d``) into its row's word; a 0 code leaves the word."""
    c = _code(x, lo, span, scale)
    if c:
        cuda.atomic.or_(codes, _at5(b, kv, j, t, d // NIBBLES), uint32(c << (4 * (d % NIBBLES))))


@cuda.jit(device=True)
def _clear_codes(codes, b, kv, j, d, q):
    """quant3: thread ``(d, 0)`` zeroes word ``d`` of each row of the block's codes, then the CTA waits (the codes are
    then OR-ed in by every thread)."""
    if q == 0 and d < codes.shape[4]:
        for t in range(codes.shape[3]):
            codes[_at5(b, kv, j, t, d)] = uint32(0)
    cuda.syncthreads()


@cuda.jit(device=True)
def _store_summary(meta, b, kv, j, d, centre, spread):
    """Channel ``d`` of the block's two metadata rows."""
    meta[_at5(b, kv, j, 0, d)] = centre
    meta[_at5(b, kv, j, 1, d)] = spread


# Keys a thread loads at once into registers: a tile of its channel's tokens, every load issued before the first use,
# then used in the same order as one at a time (so every value gives the same bits). 16 against 1 (s49a, H100, the
# append a call): cuboid_mean 4.5 -> 3.9 µs at every B and D; quant3 level (~10 µs: its float64 code pass and
# Numba's index arithmetic, ~2,000 instructions a warp on 8 CTAs, are its cost, not the loads). Read when the kernels
# compile; tests load copies of this module with other values (1, 4) to cover a block longer than a tile.
KEY_TILE = 16

# Threads a channel in the append's quant3 code pass (a CTA of Dp x rows, rows = APPEND_SPLIT or fewer so that the
# CTA has at most APPEND_THREADS): each computes the block's lo / hi itself, then codes the tokens t = q, q + rows,
# ... (thread row q). The append is latency-bound on one thread's chain (s49a); more rows cut a thread's codes and
# give each SM more warps. H100 (s50, quant3 a call, 1 row -> more): D 256 (2 rows) 7.3 -> 7.0 µs, D 128 (4) 6.8 ->
# 5.7, D 64 (4) 7.0 -> 5.0. Every value gives the same bits. 1,024 threads at 81 registers a thread (sm_90) do not
# launch, hence the cap.
APPEND_SPLIT = 4
APPEND_THREADS = 512


@cuda.jit(device=True)
def _load_tile(k_pool, slot, t0, ntok, d, bf16, xs):
    """``xs[r]`` = channel ``d`` of token ``t0 + r`` of block ``slot`` for the block's tokens in the tile."""
    for r in range(KEY_TILE):
        if t0 + r < ntok:
            xs[r] = _key(k_pool, slot, t0 + r, d, bf16)


@cuda.jit(device=True)
def _summarise(k_pool, slot, ntok, d, b, kv, j, meta, lohi, codes, kind, bf16, q, nq):
    """Metadata of channel ``d`` of one block from its ``ntok`` keys, read ``KEY_TILE`` at a time (a pass after the
    first reloads them when the block is longer than a tile). float32 arithmetic; quant3's codes in float64,
    bit-identical to the reference's formula (``_code``). Every thread of the CTA calls it (quant3 has a
    barrier). ``nq`` threads a channel (rows ``q`` = 0 .. nq - 1; more than one for quant3 only): row 0 stores lo /
    hi, and row ``q`` codes tokens ``q, q + nq, ...``."""
    xs = cuda.local.array(KEY_TILE, float32)
    _load_tile(k_pool, slot, 0, ntok, d, bf16, xs)
    lo = xs[0]
    hi = lo
    total = lo
    for t0 in range(0, ntok, KEY_TILE):
        if t0:
            _load_tile(k_pool, slot, t0, ntok, d, bf16, xs)
        for r in range(KEY_TILE):
            if 0 < t0 + r < ntok:
                lo = min(lo, xs[r])
                hi = max(hi, xs[r])
                total += xs[r]
    if q == 0:
        lohi[_at5(b, kv, j, 0, d)] = lo
        lohi[_at5(b, kv, j, 1, d)] = hi
    again = ntok > KEY_TILE  # the tile in registers is not the first one
    if kind == 0:  # cuboid_mean: centre and mean distance to it
        c = (lo + hi) * float32(0.5)
        dist = float32(0.0)
        for t0 in range(0, ntok, KEY_TILE):
            if again:
                _load_tile(k_pool, slot, t0, ntok, d, bf16, xs)
            for r in range(KEY_TILE):
                if t0 + r < ntok:
                    dist += abs(xs[r] - c)
        _store_summary(meta, b, kv, j, d, c, dist / ntok)
    elif kind == 2:  # mean key
        _store_summary(meta, b, kv, j, d, total / ntok, float32(0.0))
    elif kind == 3:  # 3-bit codes, OR-ed into words another thread cleared
        _clear_codes(codes, b, kv, j, d, q)
        span = float64(hi) - float64(lo)
        scale = QUANT_LEVELS / span if span != 0.0 else 0.0
        if nq > 1:  # this row's tokens, reloaded (from L1: the first pass read them)
            for t in range(q, ntok, nq):
                _or_code(codes, b, kv, j, t, d, _key(k_pool, slot, t, d, bf16), lo, span, scale)
            return
        for t0 in range(0, ntok, KEY_TILE):
            if again:
                _load_tile(k_pool, slot, t0, ntok, d, bf16, xs)
            for r in range(KEY_TILE):
                if t0 + r < ntok:
                    _or_code(codes, b, kv, j, t0 + r, d, xs[r], lo, span, scale)


@functools.lru_cache(maxsize=None)
def _build_kernel(kind: int, bf16: int):
    """The prefill kernel of one metadata kind (``KIND_CODES``) and key type (``bf16``: 1 for bfloat16 bits), compiled
    on first use with both as constants (see ``_append_kernel``; the block size stays an argument here: the prefill
    divides nothing by it, and runs once a request)."""

    @cuda.jit
    def build(k_pool, block_table, seq_lens, meta, lohi, codes, block_size):
        # grid (Nmax, Hkv, B), one thread per channel
        j, kv, b = cuda.blockIdx.x, cuda.blockIdx.y, cuda.blockIdx.z
        d = cuda.threadIdx.x
        length = seq_lens[uint64(b)]
        if d >= k_pool.shape[2] or j * block_size >= length:
            return
        ntok = min(block_size, length - j * block_size)
        _summarise(k_pool, block_table[_at3(b, kv, j)], ntok, d, b, kv, j, meta, lohi, codes, kind, bf16, 0, 1)

    return build


@cuda.jit(device=True)
def _position(block_table, seq_lens, block_size, kv, b):
    """Where request ``b``'s next token goes: ``(slot, row, block)``, row ``t % S`` of block ``t // S`` for ``t =
    seq_lens[b]``."""
    t = seq_lens[uint64(b)]
    j = t // block_size
    return block_table[_at3(b, kv, j)], t - j * block_size, j


@cuda.jit(device=True)
def _write(k_pool, v_pool, block_table, seq_lens, k_new, v_new, block_size, kv, b, d):
    """Channel ``d`` of request ``b``'s new key and value to its place (``_position``); returns that place."""
    slot, row, j = _position(block_table, seq_lens, block_size, kv, b)
    k_pool[_at3(slot, row, d)] = k_new[_at3(b, kv, d)]
    v_pool[_at3(slot, row, d)] = v_new[_at3(b, kv, d)]
    return slot, row, j


@functools.lru_cache(maxsize=None)
def _append_kernel(kind: int, bf16: int, block_size: int):
    """The append kernel of one metadata kind (``KIND_CODES``), key type (``bf16``: 1 for bfloat16 bits) and block
    size, compiled on first use with the three as constants, so that it holds that kind's code alone and divides by a
    constant: one kernel taking them at run time was 9,472 SASS instructions at sm_90 (~150 KB of code; ncu's top
    stall sample of the append at KEY_TILE 16 was "no instruction", s49a), quant3's alone is 3,640."""

    @cuda.jit
    def append(k_pool, v_pool, block_table, seq_lens, k_new, v_new, meta, lohi, codes):
        # grid (Hkv, B), a CTA of Dp x nq threads (quant3: nq = APPEND_SPLIT, fewer where the CTA would pass
        # APPEND_THREADS; the other kinds: 1). Token t = seq_lens[b] goes to row t % S of block t // S; then that
        # block's metadata is recomputed from its <= S tokens (the cache is never rescanned).
        kv, b = cuda.blockIdx.x, cuda.blockIdx.y
        d, q, nq = cuda.threadIdx.x, cuda.threadIdx.y, cuda.blockDim.y
        if d >= k_pool.shape[2]:
            return
        if nq == 1:  # each thread reads back only the channel it wrote: no barrier needed
            slot, row, j = _write(k_pool, v_pool, block_table, seq_lens, k_new, v_new, block_size, kv, b, d)
        else:  # row 0 writes the token, which every row of the channel then reads
            if q == 0:
                _write(k_pool, v_pool, block_table, seq_lens, k_new, v_new, block_size, kv, b, d)
            slot, row, j = _position(block_table, seq_lens, block_size, kv, b)
            cuda.syncthreads()
        _summarise(k_pool, slot, row + 1, d, b, kv, j, meta, lohi, codes, kind, bf16, q, nq)

    return append


@functools.lru_cache(maxsize=None)
def _write_kernel(block_size: int):
    """The token's write alone (no metadata: ``PagedKVCache(metadata=None)``) for one block size, a constant of its
    compile (see ``_append_kernel``)."""

    @cuda.jit
    def write(k_pool, v_pool, block_table, seq_lens, k_new, v_new):
        # grid (Hkv, B), one thread per channel
        kv, b = cuda.blockIdx.x, cuda.blockIdx.y
        d = cuda.threadIdx.x
        if d < k_pool.shape[2]:
            _write(k_pool, v_pool, block_table, seq_lens, k_new, v_new, block_size, kv, b, d)

    return write


_streams: dict = {}


def _stream():
    """Numba's view of CuPy's current stream, so both libraries' kernels run in order; made once per stream (every
    append of every layer launches on it)."""
    if _simulating():
        return 0
    import cupy

    ptr = cupy.cuda.get_current_stream().ptr
    if ptr not in _streams:
        _streams[ptr] = cuda.external_stream(ptr)
    return _streams[ptr]


def _simulating() -> bool:
    from numba.cuda.core import config

    return bool(config.ENABLE_CUDASIM)


def _no_sync():
    """CuPy arrays carry their stream; we launch on that same stream, so Numba need not synchronise."""
    from numba.cuda.core import config

    config.CUDA_ARRAY_INTERFACE_SYNC = False


def _codes_arg(codes, like):
    """``codes``, or a one-word stand-in for the kinds without codes (the kernels' types stay fixed),
    made once: appends call this for every token of every layer."""
    if codes is not None:
        return codes
    return _no_codes("numpy" if isinstance(like, np.ndarray) else "cupy")


@functools.lru_cache(maxsize=None)
def _no_codes(module: str):
    if module == "numpy":
        return np.zeros((1, 1, 1, 1, 1), np.uint32)
    import cupy

    return cupy.zeros((1, 1, 1, 1, 1), cupy.uint32)


def _constants(kind: str, k_pool, block_size) -> tuple[int, int, int]:
    """The three compile-time constants of a metadata kernel, ``(KIND_CODES[kind], bf16, block_size)``, checked."""
    return KIND_CODES[_validate.choice(kind, "kind", _KINDS)], _is_bf16(k_pool), _block_size(block_size)


_KINDS = tuple(KIND_CODES)


def _block_size(block_size) -> int:
    return _validate.integer(block_size, "block_size", minimum=1)


def _is_bf16(k_pool) -> int:
    """1 when the pool holds bfloat16 bits (int16), 0 for float16."""
    return int(k_pool.dtype == np.int16)


def build_metadata(k_pool, block_table, seq_lens, meta, lohi, *, kind: str, block_size: int, codes=None) -> None:
    """Compute ``meta``, ``lohi`` (and ``codes`` for ``quant3``) for every block of every request (prefill)."""
    _no_sync()
    b, hkv, nmax = block_table.shape
    code, bf16, block_size = _constants(kind, k_pool, block_size)
    build = _build_kernel(code, bf16)
    build[(nmax, hkv, b), k_pool.shape[2], _stream()](k_pool, block_table, seq_lens, meta, lohi,
                                                      _codes_arg(codes, meta), block_size)


def append_token(k_pool, v_pool, block_table, seq_lens, k_new, v_new, meta, lohi, *, kind: str,
                 block_size: int, codes=None) -> None:
    """Write one token per request (``k_new``, ``v_new``: ``[B, Hkv, Dp]``) at position ``seq_lens[b]``
    and update its block's metadata (all of its ``quant3`` codes: ``lo``/``hi`` may move). The caller
    then increments ``seq_lens``."""
    _no_sync()
    b, hkv, _ = block_table.shape
    constants = _constants(kind, k_pool, block_size)
    dp = k_pool.shape[2]
    nq = max(1, min(APPEND_SPLIT, APPEND_THREADS // dp, block_size)) if kind == "quant3" else 1
    append = _append_kernel(*constants)
    append[(hkv, b), (dp, nq), _stream()](k_pool, v_pool, block_table, seq_lens, k_new, v_new, meta, lohi,
                                          _codes_arg(codes, meta))


def write_token(k_pool, v_pool, block_table, seq_lens, k_new, v_new, *, block_size: int) -> None:
    """``append_token`` for a cache without metadata (``PagedKVCache(metadata=None)``, dense decoding only): the
    token's key and value (``[B, Hkv, Dp]``) at position ``seq_lens[b]``, nothing else. The caller then increments
    ``seq_lens``."""
    _no_sync()
    b, hkv, _ = block_table.shape
    write = _write_kernel(_block_size(block_size))
    write[(hkv, b), k_pool.shape[2], _stream()](k_pool, v_pool, block_table, seq_lens, k_new, v_new)
