"""Synthetic decode inputs on the GPU whose attention is skewed like the shipped real trace.

Benchmarks need KV caches far longer than the 2K-token trace. Each synthetic block gets a
logit offset drawn from the trace's empirical distribution of block log-masses (relative to the
heaviest block of the same query head), so the share of blocks that holds, say, 95% of the
attention mass is about what the trace shows, at any length.

``sparsity_profiles`` (NumPy only) builds the other kind of input: a family of per-head block-mass
profiles whose ideal budget (the fewest blocks that hold 95% of the mass) is a chosen share of the
blocks, with heads that differ, a sink block and a recent window, as real models show;
``ideal_share`` and ``ideal_share_of_logits`` measure that budget from offsets or from logits.

``long_context_profiles`` (NumPy only) draws profiles from real long-context attention: per head, the
budget, the sink's and the recent window's shares and the tail of a head of Gemma 3 270M measured at
2K-32K (``psa_fast/data/long_context_profiles.json``, written by ``examples/fit_long_budget.py``), grown
to 128K by a power law fitted on 2K-32K (``long_context_fit``, ``long_context_budget``).
"""

from __future__ import annotations

import functools
import json
import numbers
from importlib import resources

import numpy as np

from psa_ref import _validate, analysis
from psa_ref.trace import load_trace


def _trace_log_masses(layers, block_size: int, trace) -> list[np.ndarray]:
    """Per (layer, position, KV head) of ``layers``: ``[N, g]`` block log-masses of the group's query
    heads, relative to each head's heaviest block."""
    trace = trace or load_trace()
    hq, hkv = trace.q.shape[2], trace.k.shape[1]
    g = hq // hkv
    out = []
    for li, layer in enumerate(trace.layers):
        if int(layer) not in layers:
            continue
        for pi in range(trace.q.shape[1]):
            q, k, v = (a.astype(np.float64) for a in trace.case(li, pi))
            for kv in range(hkv):
                mass, _ = analysis.block_sums(q[kv * g : (kv + 1) * g], k[kv], v[kv], block_size, trace.scale)
                out.append(np.log(mass / mass.max(axis=0)))
    return out


def trace_block_offsets(layers=(12, 18, 24, 29), block_size: int = 16, trace=None) -> np.ndarray:
    """Log-mass of every block relative to the heaviest block of its (layer, position, query head),
    pooled over ``layers`` of the shipped trace: a 1-D array of values ``<= 0``."""
    return np.concatenate([m.ravel() for m in _trace_log_masses(layers, block_size, trace)])


def trace_block_profiles(layers=(12, 18, 24, 29), block_size: int = 16, trace=None) -> np.ndarray:
    """The same log-masses kept apart per source: ``[sources, N]``, one row per (layer, position,
    query head) of ``layers``; rows of positions a block shorter than the longest are padded with
    draws from themselves. Given to ``fill_skewed``, each KV head of each request draws its
    blocks from one row, so heads differ in how concentrated their attention is, as they do in the
    trace (with the pooled ``trace_block_offsets`` every head has the same distribution)."""
    rows = [m.T for m in _trace_log_masses(layers, block_size, trace)]
    n = max(r.shape[1] for r in rows)
    rng = np.random.default_rng(0)
    return np.concatenate([np.concatenate([r, r[:, rng.integers(0, r.shape[1], n - r.shape[1])]], axis=1)
                           for r in rows])


class HostCache:
    """The part of a [`PagedKVCache`][psa_fast.PagedKVCache] that ``fill_skewed`` uses, keeping what it writes in
    NumPy: ``fill_skewed(..., xp=numpy)`` on the CPU, for tests and psa_ref experiments. ``keys[layer, request]``
    is the request's ``[Hkv, capacity, D]`` float16 keys; the values are not kept.

    Raises:
        ValueError: ``prefill`` given keys or values of another shape or dtype.
    """

    def __init__(self, *, batch: int, num_kv_heads: int, head_dim: int, max_tokens: int, block_size: int = 16,
                 num_layers: int = 1):
        self.num_layers, self.batch, self.num_kv_heads, self.head_dim = num_layers, batch, num_kv_heads, head_dim
        self.block_size = block_size
        self.nmax = -(-max_tokens // block_size)
        self.capacity = self.nmax * block_size
        self.keys: dict[tuple[int, int], np.ndarray] = {}

    def prefill(self, layer, request, keys, values):
        want = (self.num_kv_heads, self.capacity, self.head_dim)
        if keys.shape != want or values.shape != want or keys.dtype != np.float16 or values.dtype != np.float16:
            raise ValueError(f"keys and values must be float16 of shape {want}, got {keys.dtype} {keys.shape} "
                             f"and {values.dtype} {values.shape}")
        self.keys[layer, request] = keys


def fill_skewed(cache, layer: int, num_q_heads: int, offsets: np.ndarray, seed: int = 0, within_block: float = 0.5,
                *, positional: bool = False, xp=None):
    """Fill one layer of a [`PagedKVCache`][psa_fast.PagedKVCache] to capacity and return matching queries.

    Per KV head, the group's queries share a direction ``u``; each block's keys are
    ``offset_j * u + within_block * noise``, so the block's logits sit about ``offset_j`` below the
    heaviest block's (logit scale ``1/sqrt(D)``, ``|q . u| = sqrt(D)``). ``offset_j`` is drawn from
    ``offsets``: a 1-D array (``trace_block_offsets``, the same distribution for every head) or
    ``[sources, N]`` (``trace_block_profiles``: each KV head of each request draws from one row).

    With ``positional=True``, ``offsets`` is ``[sources, Nmax]`` (``sparsity_profiles``) and each KV
    head takes one whole row in place, so block ``j`` gets ``offsets[row, j]`` (a sink at block 0 and a
    recent window at the end stay where they are); the KV heads of the call take consecutive rows from a
    random start, so they are all different when ``sources >= B * Hkv``.

    Token logits spread around their block's offset: a query head's logit of token ``t`` in block ``j``
    is ``offset_j * (1 + 0.5 z / sqrt(D)) + within_block * (u . n_t) + 0.5 * within_block * (e . n_t) /
    sqrt(D)`` (``z`` per head, ``n_t`` the key noise, ``e`` the query's), a token spread of standard
    deviation ``within_block * sqrt(1.25)`` (0.56 at 0.5): each block's mass varies by ~15% (16 tokens),
    which moves the ideal budget by a few percent (``tests/test_synthetic.py`` measures it on the CPU).

    ``xp`` is the array module (default CuPy); ``numpy`` runs the same construction on the CPU for tests,
    with any ``cache`` object that has ``batch``, ``num_kv_heads``, ``head_dim``, ``block_size``, ``nmax``,
    ``capacity`` and ``prefill(layer, request, keys, values)``, such as ``HostCache``.

    Returns:
        ``q``: ``[B, Hq, D]`` float16 (a CuPy array, or of ``xp``).
    """
    if xp is None:
        import cupy as xp

    rs = xp.random.RandomState(seed)

    def normal(shape):  # float32 draws (NumPy's RandomState has no dtype argument)
        return rs.standard_normal(shape).astype(np.float32) if xp is np else rs.standard_normal(shape, dtype=xp.float32)

    b, hkv, d, s = cache.batch, cache.num_kv_heads, cache.head_dim, cache.block_size
    n, t = cache.nmax, cache.capacity
    g = num_q_heads // hkv
    offsets_d = xp.asarray(offsets, dtype=xp.float32)
    if offsets_d.ndim not in (1, 2):
        raise ValueError(f"offsets must be 1-D (pooled) or 2-D [sources, N] (per head), got shape {offsets_d.shape}")
    if positional and (offsets_d.ndim != 2 or offsets_d.shape[1] != n):
        raise ValueError(f"offsets must be [sources, Nmax={n}] with positional=True, got shape {offsets_d.shape}")
    start = int(rs.randint(0, offsets_d.shape[0])) if positional else 0
    q = xp.empty((b, num_q_heads, d), xp.float16)
    for r in range(b):
        u = normal((hkv, d))
        u /= xp.linalg.norm(u, axis=1, keepdims=True)
        q[r] = (np.sqrt(d) * xp.repeat(u, g, axis=0) + 0.5 * normal((num_q_heads, d))).astype(xp.float16)
        if positional:  # consecutive rows, each in block order
            pick = offsets_d[(start + r * hkv + xp.arange(hkv)) % offsets_d.shape[0]]  # [Hkv, N]
        elif offsets_d.ndim == 1:
            pick = offsets_d[rs.randint(0, offsets_d.size, size=(hkv, n))]  # [Hkv, N]
        else:  # one source row per KV head
            rows = rs.randint(0, offsets_d.shape[0], size=(hkv, 1))
            pick = offsets_d[rows, rs.randint(0, offsets_d.shape[1], size=(hkv, n))]
        boost = xp.repeat(pick, s, axis=1)[:, :t]  # per token
        keys = boost[:, :, None] * u[:, None, :] + within_block * normal((hkv, t, d))
        values = normal((hkv, t, d))
        cache.prefill(layer, r, keys.astype(xp.float16), values.astype(xp.float16))
        del keys, values, boost
    return q


# --- a family of block-mass profiles by sparsity (NumPy only) ---------------------------------------

OFFSET_FLOOR = -30.0  # lightest block log-mass kept: exp(-30) ~ 1e-13 of the heaviest; float16 keys stay small
SINK_SHARE = 0.25  # mass of block 0 (the BOS token holds ~25% in Gemma 3's global layers, DESIGN.md)


def ideal_share(offsets, tau: float = 0.95, *, tokens=None):
    """The ideal ``tau`` budget of block log-mass offsets, as a share of the blocks.

    Block ``j``'s mass is ``exp(offsets[j]) * tokens[j]`` (``tokens``: ``[N]`` tokens per block, default
    equal); the budget is the fewest blocks, heaviest first, that hold ``tau`` of the mass
    (``psa_ref.analysis.blocks_for_mass``).

    Args:
        offsets: ``[N]`` or ``[sources, N]`` finite log-masses (any common shift).
        tau: mass fraction in (0, 1].

    Returns:
        A float for ``[N]``; ``[sources]`` float64 for ``[sources, N]``.
    """
    tau = _validate.threshold(tau, "tau")
    o = np.asarray(offsets, dtype=np.float64)
    if o.ndim not in (1, 2) or o.shape[-1] == 0:
        raise ValueError(f"offsets must be [N] or [sources, N] with N >= 1, got shape {o.shape}")
    if not np.isfinite(o).all():
        raise ValueError("offsets must be finite")
    mass = np.exp(o - o.max(axis=-1, keepdims=True))
    if tokens is not None:
        tok = np.asarray(tokens, dtype=np.float64)
        if tok.shape != (o.shape[-1],) or (tok <= 0).any():
            raise ValueError(f"tokens must be [N={o.shape[-1]}] positive counts, got shape {tok.shape}")
        mass = mass * tok
    share = analysis.blocks_for_mass(np.atleast_2d(mass).T, tau) / o.shape[-1]
    return float(share[0]) if o.ndim == 1 else share.astype(np.float64)


def ideal_share_of_logits(logits, block_size: int, tau: float = 0.95):
    """The ideal ``tau`` budget per head from token logits: the fewest blocks of ``block_size``
    consecutive tokens, heaviest first, that hold ``tau`` of ``softmax(logits)``, over the block count.

    Works on NumPy or CuPy arrays (the benchmark measures a filled cache on the GPU with it).

    Args:
        logits: ``[..., T]`` float, ``scale * q . k_t`` of one query head per leading index.

    Returns:
        ``[...]`` float64 shares, an array of the input's kind.
    """
    if isinstance(logits, np.ndarray):
        xp = np
    else:
        import cupy as xp
    block_size = _validate.integer(block_size, "block_size", minimum=1)
    tau = _validate.threshold(tau, "tau")
    lg = logits.astype(xp.float64)
    t = lg.shape[-1]
    n = -(-t // block_size)
    w = xp.exp(lg - lg.max(axis=-1, keepdims=True))
    if n * block_size != t:  # a partial last block
        w = xp.concatenate([w, xp.zeros(w.shape[:-1] + (n * block_size - t,), w.dtype)], axis=-1)
    mass = w.reshape(w.shape[:-1] + (n, block_size)).sum(axis=-1)
    ranked = -xp.sort(-mass, axis=-1)
    cum = xp.cumsum(ranked, axis=-1) / ranked.sum(axis=-1, keepdims=True)
    return ((cum < tau - 1e-12).sum(axis=-1) + 1) / n  # the rule of psa_ref.analysis.blocks_for_mass


def _top_share(beta, log_u, k, pinned):
    """``[P]`` share of the total mass in the ``k`` heaviest blocks, the ranked masses being
    ``exp(beta * log_u)`` (``log_u [P, M]`` descending, so the order never changes with ``beta``) and
    the ``R`` pinned blocks (a sink, a recent window) ``pinned [P, R]`` times their sum (``R = 0``: none).
    The top ``k`` of the union is, for some ``j``, the ``j`` heaviest pinned blocks and the top ``k - j``
    of the rest: the largest of those ``R + 1`` sums."""
    w = np.exp(beta[:, None] * (log_u - log_u[:, :1]))
    cum = np.concatenate([np.zeros((w.shape[0], 1)), np.cumsum(w, axis=1)], axis=1)  # [P, M + 1]
    rows, m = np.arange(w.shape[0]), w.shape[1]
    top = cum[rows, np.minimum(k, m)]
    c = -np.sort(-pinned, axis=1)  # heaviest first
    total = cum[:, -1] * (1.0 + c.sum(axis=1))
    held = np.zeros(w.shape[0])
    for j in range(c.shape[1]):
        held = held + c[:, j]
        top = np.maximum(top, np.where(k >= j + 1, held * cum[:, -1] + cum[rows, np.clip(k - j - 1, 0, m)], 0.0))
    return top / total


def _solve_beta(log_u, m, pinned, tau, iterations=64):
    """``[P]`` exponents ``beta >= 0`` whose ideal ``tau`` budget is ``m`` blocks: the geometric middle of
    the interval ``[beta_a, beta_b]`` where it is (``beta_a`` the smallest with ``m`` blocks holding
    ``tau``, ``beta_b`` the largest with ``m - 1`` blocks holding less), so that perturbing the masses
    a little moves the budget little."""
    def holds(beta, k):
        return _top_share(beta, log_u, k, pinned) >= tau - 1e-12

    p = log_u.shape[0]
    hi = np.ones(p)
    for _ in range(60):  # sharper until m blocks hold tau
        short = ~holds(hi, m)
        if not short.any():
            break
        hi = np.where(short, 2 * hi, hi)
    lo = np.zeros(p)
    for _ in range(iterations):
        mid = 0.5 * (lo + hi)
        ok = holds(mid, m)
        hi, lo = np.where(ok, mid, hi), np.where(ok, lo, mid)
    beta_a = np.where(holds(np.zeros(p), m), 0.0, hi)
    cap = np.maximum(16 * beta_a, 1.0)  # m - 1 blocks may never hold tau (m - 1 = 1 with a sink)
    lo, hi = beta_a.copy(), cap
    for _ in range(iterations):
        mid = 0.5 * (lo + hi)
        ok = holds(mid, m - 1)
        hi, lo = np.where(ok, mid, hi), np.where(ok, lo, mid)
    beta_b = lo
    return np.where(beta_a > 0, np.sqrt(beta_a * np.maximum(beta_b, beta_a)), 0.5 * beta_b)


def sparsity_profiles(n_blocks: int, ideal_share: float, *, num_profiles: int = 64, heads_differ: bool = True,
                      spread: float = 2.0, sink: bool = True, sink_share: float = SINK_SHARE, recent_blocks: int = 2,
                      tau: float = 0.95, seed: int = 0) -> np.ndarray:
    """Block log-mass offsets whose ideal ``tau`` budget is a chosen share of the blocks, for
    ``fill_skewed(..., positional=True)``: a family of caches from sparse to dense attention.

    Construction, per profile (row) ``p``:

    1. **Its budget.** ``share_p = ideal_share * r_p / mean(r)``, ``r_p`` log-uniform on
       ``[1/spread, spread]`` (``heads_differ``; else ``r_p = 1``), so heads differ up to ``spread``
       either way and their mean is the target; ``m_p = round(share_p * N)`` blocks, at least
       ``sink + recent_blocks + 1`` and at most what flat non-sink masses give.
    2. **Its shape.** Every non-sink block gets the mass ``U_j ** beta`` (``U_j`` uniform on (0, 1]):
       the log-mass falls about linearly with rank (block of rank ``r`` ~ ``-beta * r / N``), steeper
       for sparser heads, with a long light tail at low budgets (a power law, like ranked attention).
       The ``recent_blocks`` largest draws move to the last blocks (a recent window, heavy after the
       sink), the others stay at random positions. With ``sink``, block 0 holds ``sink_share`` of the
       total (the BOS token of real models).
    3. **Its exponent.** ``beta_p`` is found by bisection so that exactly ``m_p`` blocks hold ``tau``
       (``_solve_beta``: the middle of the interval of exponents that give ``m_p``).
    4. ``offsets = log(mass / max mass)``, clipped at ``OFFSET_FLOOR`` (-30: no mass that matters).

    The offsets give the budget exactly (``ideal_share(offsets, tau)`` is ``m_p / N``); a cache filled
    from them adds a within-block spread of token logits (``fill_skewed``) that moves each head's
    measured budget by a few percent; the benchmark measures it from the filled cache.

    Args:
        n_blocks: ``N``, blocks per head (the cache's ``Nmax``).
        ideal_share: the target budget as a share of the blocks, in (0, 1).
        num_profiles: rows to draw; ``fill_skewed`` gives each KV head one of them.
        heads_differ: draw each row's budget around the target (else every row has the target's).
        spread: how far a row's budget may lie from the target, as a factor (>= 1).
        sink: make block 0 a sink holding ``sink_share`` of the mass (in [0, tau)).
        recent_blocks: last blocks made heavy (>= 0).
        tau: the budget's mass fraction, in (0, 1).
        seed: NumPy random seed.

    Returns:
        ``[num_profiles, N]`` float64 offsets, ``<= 0``, 0 at each row's heaviest block.

    Raises:
        ValueError: an argument is out of range (the message names it).
    """
    n = _validate.integer(n_blocks, "n_blocks", minimum=2)
    num_profiles = _validate.integer(num_profiles, "num_profiles", minimum=1)
    recent = _validate.integer(recent_blocks, "recent_blocks", minimum=0)
    tau = _validate.threshold(tau, "tau")
    if tau >= 1.0:
        raise ValueError(f"tau must lie in (0, 1) (1 means every block), got {tau}")
    if isinstance(ideal_share, (bool, np.bool_)) or not isinstance(ideal_share, numbers.Real) or not (
            0.0 < ideal_share < 1.0):
        raise ValueError(f"ideal_share must be a real number in (0, 1), got {ideal_share!r}")
    if isinstance(spread, (bool, np.bool_)) or not isinstance(spread, numbers.Real) or not (
            1.0 <= spread < np.inf):
        raise ValueError(f"spread must be a finite real number >= 1, got {spread!r}")
    sink_c = 0.0
    if sink:
        if isinstance(sink_share, (bool, np.bool_)) or not isinstance(sink_share, numbers.Real) or not (
                0.0 < sink_share < tau):
            raise ValueError(f"sink_share must be a real number in (0, tau={tau}), got {sink_share!r}")
        sink_c = sink_share / (1.0 - sink_share)
    first = int(bool(sink))
    if first + recent >= n:
        raise ValueError(f"recent_blocks ({recent}) plus the sink ({first}) must leave a ranked block among "
                         f"n_blocks={n}")
    rng = np.random.default_rng(seed)
    r = np.exp(rng.uniform(-np.log(spread), np.log(spread), num_profiles)) if heads_differ else np.ones(num_profiles)
    shares = ideal_share * r / r.mean()
    log_u = -np.sort(-np.log1p(-rng.random((num_profiles, n - first))), axis=1)  # log U, U in (0, 1], descending
    flat = int(analysis.blocks_for_mass(np.append(np.ones(n - first), sink_c * (n - first))[:, None], tau)[0])
    m = np.clip(np.round(shares * n).astype(np.int64), first + recent + 1, max(flat, first + recent + 1))
    beta = _solve_beta(log_u, m, np.full((num_profiles, first), sink_c), tau)
    rest = beta[:, None] * (log_u - log_u[:, :1])  # [P, N - first] log-masses, descending
    out = np.empty((num_profiles, n))
    out[:, n - recent:] = rng.permuted(rest[:, :recent], axis=1)
    out[:, first : n - recent] = rng.permuted(rest[:, recent:], axis=1)
    if sink:
        out[:, 0] = np.log(sink_c * np.exp(rest).sum(axis=1))
    return np.maximum(out - out.max(axis=1, keepdims=True), OFFSET_FLOOR)


# --- profiles calibrated on the long Gemma 3 captures (NumPy only) ----------------------------------

LONG_CONTEXT_DATA = "long_context_profiles.json"  # in psa_fast/data/, written by examples/fit_long_budget.py
LONG_CONTEXT_BLOCK = 16  # the captures' block size: the profiles are blocks of 16 tokens
LONG_CONTEXT_MAX_BLOCKS = 8192  # 128K tokens: the documented reach of the fit (docs/performance.md)
LONG_CONTEXT_MIN_BLOCKS = 8  # a sink, two recent blocks and some ranked ones
LONG_CONTEXT_SHAPES = (1.0, 0.6, 0.35, 0.2, 0.1, 0.0)  # kappa of the ranked blocks' curves, exponential to Zipf
_TINY_SHARE = 1e-12  # floor of a pinned block's share (the file rounds shares to 3 significant digits)


@functools.lru_cache(maxsize=1)
def load_long_context_data() -> dict:
    """The statistics ``long_context_profiles`` draws from, as ``examples/fit_long_budget.py`` wrote them
    (``psa_fast/data/long_context_profiles.json``): ``fit`` (the power laws of the ideal budget against the
    context, pooled and per layer, with their residuals and points) and ``samples`` (per window end of the
    captures, one row per head-query: layer, blocks, τ 0.95 budget, block 0's share of the mass, the last and
    the previous block's shares, the τ 0.9 and 0.99 budgets). Cached: treat it as read-only."""
    with resources.files("psa_fast").joinpath("data", LONG_CONTEXT_DATA).open(encoding="utf-8") as f:
        return json.load(f)


def _long_context_layer(layer) -> str:
    """The key of ``layer``'s fit (``"pooled"`` for None); a layer the captures lack raises ValueError."""
    if layer is None:
        return "pooled"
    layers = sorted(int(k.split("_")[1]) for k in load_long_context_data()["fit"] if k.startswith("layer_"))
    if isinstance(layer, (bool, np.bool_)) or not isinstance(layer, numbers.Integral):
        raise TypeError(f"layer must be None or an integer of {layers}, got {type(layer).__name__} {layer!r}")
    if int(layer) not in layers:
        raise ValueError(f"layer must be None (pooled) or one of the captured layers {layers}, got {layer}")
    return f"layer_{int(layer)}"


def _long_context_blocks(n_blocks) -> int:
    n = _validate.integer(n_blocks, "n_blocks", minimum=LONG_CONTEXT_MIN_BLOCKS)
    if n > LONG_CONTEXT_MAX_BLOCKS:
        raise ValueError(f"n_blocks must be <= {LONG_CONTEXT_MAX_BLOCKS} (128K tokens in blocks of "
                         f"{LONG_CONTEXT_BLOCK}, the fit's documented reach), got {n}")
    return n


def long_context_fit(*, layer: int | None = None) -> dict:
    """The fitted growth of the mean ideal τ 0.95 budget with the context: ``n_ideal = a * N ** b`` blocks of
    16 tokens, ``N`` the context's blocks, fitted on the 16 window ends 2K, 4K, ..., 32K of the Gemma 3 270M
    captures (docs/performance.md, "Synthetic long-context profiles").

    Args:
        layer: None (the three global layers pooled) or one of them (5, 11, 17).

    Returns:
        A new dict: ``a``, ``b``, ``rms_log_residual``, ``max_log_residual``, ``max_relative_error``,
            ``points``, ``contexts`` (the first and last window end fitted, in tokens).
    """
    return dict(load_long_context_data()["fit"][_long_context_layer(layer)])


def long_context_budget(n_blocks: int, *, layer: int | None = None) -> float:
    """The fit's mean ideal τ 0.95 budget, in blocks, of a context of ``n_blocks`` blocks of 16 tokens:
    ``a * n_blocks ** b`` ([`long_context_fit`][psa_fast.synthetic.long_context_fit]); beyond 32K an
    extrapolation."""
    n = _long_context_blocks(n_blocks)
    fit = long_context_fit(layer=layer)
    return float(fit["a"] * n ** fit["b"])


def long_context_profiles(n_blocks: int, *, num_profiles: int = 64, layer: int | None = None,
                          seed: int = 0) -> np.ndarray:
    """Block log-mass offsets drawn from real long-context attention, for ``fill_skewed(..., positional=True)``.

    Calibrated on Gemma 3 270M's global layers at 2K-32K (``examples/fit_long_budget.py``; blocks of 16
    tokens, τ 0.95). Construction, per profile (row):

    1. **A measured head.** Take the window end of the captures nearest to ``16 * n_blocks`` tokens (in
       ``log``; 2K, 4K, ..., 32K) and draw one of its head-queries (pooled over the layers, or of ``layer``):
       its ideal budget ``n95`` of its ``n`` blocks, block 0's share of the mass (the sink), and the shares of
       its last two blocks (the recent window). Heads keep their measured spread and their correlations (a
       heavy sink goes with a small budget).
    2. **Its budget at this length.** ``m = round(n95 * (n_blocks / n) ** b)``, ``b`` the exponent of the
       fitted power law ([`long_context_fit`][psa_fast.synthetic.long_context_fit]): the measured budget at the
       captures' own lengths (``n_blocks = n``), grown as the fit says beyond 32K (the 32K heads scaled by
       ``(n_blocks / 2048) ** b``).
    3. **Its shape.** Block 0 and the last two blocks hold their measured shares of the total; every other
       block gets ``U_j ** beta`` (``U_j`` uniform on (0, 1], at a random position), ``beta`` found by
       bisection so that exactly ``m`` blocks hold 95% (as in
       [`sparsity_profiles`][psa_fast.synthetic.sparsity_profiles]); ``m`` is clipped to what the pinned shares
       allow (one ranked block holding all the rest, or flat).
    4. ``offsets = log(mass / max mass)``, clipped at ``OFFSET_FLOOR``.

    The sink's and the recent window's shares stay those of the nearest window end (at 128K, those measured at
    32K); the ratio of the τ 0.99 to the τ 0.95 budget comes out about right at 2K-8K and ~25% short at 32K
    (docs/performance.md gives the numbers).

    Args:
        n_blocks: ``N``, blocks of 16 tokens per head, ``8 <= N <= 8192`` (128K tokens).
        num_profiles: rows to draw.
        layer: None (the captured global layers pooled) or one of them (5, 11, 17).
        seed: NumPy random seed; the measured heads drawn do not depend on ``n_blocks`` within one window end's
            range (every ``n_blocks >= 1983``, 31.7K tokens, draws from 32K), so one seed at two such lengths
            gives the same heads.

    Returns:
        ``[num_profiles, N]`` float64 offsets, ``<= 0``, 0 at each row's heaviest block.

    Raises:
        TypeError: ``n_blocks``, ``num_profiles`` or ``layer`` is not an integer.
        ValueError: an argument is out of range (the message names it).
    """
    n = _long_context_blocks(n_blocks)
    num_profiles = _validate.integer(num_profiles, "num_profiles", minimum=1)
    key = _long_context_layer(layer)
    data = load_long_context_data()
    tau, b = float(data["tau"]), float(data["fit"][key]["b"])
    columns = data["samples"]["columns"]
    windows = sorted(int(c) for c in data["samples"]["by_context"])
    window = min(windows, key=lambda c: abs(np.log(c / (LONG_CONTEXT_BLOCK * n))))
    table = np.asarray(data["samples"]["by_context"][str(window)], dtype=np.float64)
    if layer is not None:
        table = table[table[:, columns.index("layer")] == int(layer)]
    rng = np.random.default_rng(seed)
    pick = table[rng.integers(0, len(table), num_profiles)]
    n95, n_measured = pick[:, columns.index("n95")], pick[:, columns.index("n_blocks")]
    shares = np.maximum(pick[:, [columns.index(c) for c in ("sink", "last", "prev")]], _TINY_SHARE)  # [P, 3]
    shares *= np.minimum(1.0, 0.999 / shares.sum(axis=1))[:, None]  # the ranked blocks keep some mass
    pinned = shares / (1.0 - shares.sum(axis=1))[:, None]  # as multiples of the ranked blocks' sum
    v = np.sort(1.0 - rng.random((num_profiles, n - 3)), axis=1)  # uniform on (0, 1], ascending
    # the budgets the pinned shares allow: ranked blocks flat (beta = 0) or all in one (beta -> infinity)
    flat, peaked = np.ones(n - 3), np.zeros(n - 3)
    peaked[0] = 1.0
    lo = analysis.blocks_for_mass(np.concatenate([pinned * 1.0, np.tile(peaked, (num_profiles, 1))], axis=1).T, tau)
    hi = analysis.blocks_for_mass(np.concatenate([pinned * (n - 3), np.tile(flat, (num_profiles, 1))], axis=1).T, tau)
    m = np.clip(np.round(n95 * (n / n_measured) ** b).astype(np.int64), lo, hi)
    want = np.log(pick[:, columns.index("n99")] / n95)  # the head's tail: its tau 0.99 over its tau 0.95 budget
    best, rest = np.full(num_profiles, np.inf), np.empty((num_profiles, n - 3))
    for kappa in LONG_CONTEXT_SHAPES:  # keep, per head, the shape whose 0.99 / 0.95 budgets are nearest its own
        base = -np.log(v) if kappa == 0 else (1.0 - v**kappa) / kappa  # [P, N - 3] descending, 0 at the top
        beta = _solve_beta(base, m, pinned, tau, iterations=40)  # 2^-40 of the bracket: far below a block's step
        cand = beta[:, None] * (base - base[:, :1])  # log-masses, 0 at the heaviest ranked block
        mass = np.concatenate([pinned, np.exp(cand) / np.exp(cand).sum(axis=1, keepdims=True)], axis=1)
        miss = np.abs(np.log(analysis.blocks_for_mass(mass.T, 0.99) / analysis.blocks_for_mass(mass.T, tau)) - want)
        better = miss < best
        best, rest[better] = np.where(better, miss, best), cand[better]
    rest_sum = np.exp(rest).sum(axis=1)
    out = np.empty((num_profiles, n))
    out[:, 1 : n - 2] = rng.permuted(rest, axis=1)
    out[:, [0, n - 1, n - 2]] = np.log(pinned * rest_sum[:, None])  # sink, last block, the one before
    return np.maximum(out - out.max(axis=1, keepdims=True), OFFSET_FLOOR)
