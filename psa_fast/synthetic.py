"""Synthetic decode inputs on the GPU whose attention is skewed like the shipped real trace.

Benchmarks need KV caches far longer than the 2K-token trace. Each synthetic block gets a
logit offset drawn from the trace's empirical distribution of block log-masses (relative to the
heaviest block of the same query head), so the share of blocks that holds, say, 95% of the
attention mass is about what the trace shows, at any length.
"""

from __future__ import annotations

import numpy as np

from psa_ref import analysis
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
    draws from themselves. Given to :func:`fill_skewed`, each KV head of each request draws its
    blocks from one row, so heads differ in how concentrated their attention is, as they do in the
    trace (with the pooled :func:`trace_block_offsets` every head has the same distribution)."""
    rows = [m.T for m in _trace_log_masses(layers, block_size, trace)]
    n = max(r.shape[1] for r in rows)
    rng = np.random.default_rng(0)
    return np.concatenate([np.concatenate([r, r[:, rng.integers(0, r.shape[1], n - r.shape[1])]], axis=1)
                           for r in rows])


def fill_skewed(cache, layer: int, num_q_heads: int, offsets: np.ndarray, seed: int = 0, within_block: float = 0.5):
    """Fill one layer of a :class:`~psa_fast.PagedKVCache` to capacity and return matching queries.

    Per KV head, the group's queries share a direction ``u``; each block's keys are
    ``offset_j * u + within_block * noise``, so the block's logits sit about ``offset_j`` below the
    heaviest block's (logit scale ``1/sqrt(D)``, ``|q . u| = sqrt(D)``). ``offset_j`` is drawn from
    ``offsets``: a 1-D array (:func:`trace_block_offsets`, the same distribution for every head) or
    ``[sources, N]`` (:func:`trace_block_profiles`: each KV head of each request draws from one row).

    Returns:
        ``q``: ``[B, Hq, D]`` float16 CuPy array.
    """
    import cupy

    rs = cupy.random.RandomState(seed)
    b, hkv, d, s = cache.batch, cache.num_kv_heads, cache.head_dim, cache.block_size
    n, t = cache.nmax, cache.capacity
    g = num_q_heads // hkv
    offsets_d = cupy.asarray(offsets, dtype=cupy.float32)
    if offsets_d.ndim not in (1, 2):
        raise ValueError(f"offsets must be 1-D (pooled) or 2-D [sources, N] (per head), got shape {offsets_d.shape}")
    q = cupy.empty((b, num_q_heads, d), cupy.float16)
    for r in range(b):
        u = rs.standard_normal((hkv, d), dtype=cupy.float32)
        u /= cupy.linalg.norm(u, axis=1, keepdims=True)
        q[r] = (np.sqrt(d) * cupy.repeat(u, g, axis=0) + 0.5 * rs.standard_normal((num_q_heads, d),
                                                                                 dtype=cupy.float32)).astype(cupy.float16)
        if offsets_d.ndim == 1:
            pick = offsets_d[rs.randint(0, offsets_d.size, size=(hkv, n))]  # [Hkv, N]
        else:  # one source row per KV head
            rows = rs.randint(0, offsets_d.shape[0], size=(hkv, 1))
            pick = offsets_d[rows, rs.randint(0, offsets_d.shape[1], size=(hkv, n))]
        boost = cupy.repeat(pick, s, axis=1)[:, :t]  # per token
        keys = boost[:, :, None] * u[:, None, :] + within_block * rs.standard_normal((hkv, t, d), dtype=cupy.float32)
        values = rs.standard_normal((hkv, t, d), dtype=cupy.float32)
        cache.prefill(layer, r, keys.astype(cupy.float16), values.astype(cupy.float16))
        del keys, values, boost
    return q
