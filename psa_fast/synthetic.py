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


def trace_block_offsets(layers=(12, 18, 24, 29), block_size: int = 16, trace=None) -> np.ndarray:
    """Log-mass of every block relative to the heaviest block of its (layer, position, query head),
    pooled over ``layers`` of the shipped trace: a 1-D array of values ``<= 0``."""
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
                out.append(np.log(mass / mass.max(axis=0)).ravel())
    return np.concatenate(out)


def fill_skewed(cache, layer: int, num_q_heads: int, offsets: np.ndarray, seed: int = 0, within_block: float = 0.5):
    """Fill one layer of a :class:`~psa_fast.PagedKVCache` to capacity and return matching queries.

    Per KV head, the group's queries share a direction ``u``; each block's keys are
    ``offset_j * u + within_block * noise``, so the block's logits sit about ``offset_j`` below the
    heaviest block's (logit scale ``1/sqrt(D)``, ``|q . u| = sqrt(D)``).

    Returns:
        ``q``: ``[B, Hq, D]`` float16 CuPy array.
    """
    import cupy

    rs = cupy.random.RandomState(seed)
    b, hkv, d, s = cache.batch, cache.num_kv_heads, cache.head_dim, cache.block_size
    n, t = cache.nmax, cache.capacity
    g = num_q_heads // hkv
    offsets_d = cupy.asarray(offsets, dtype=cupy.float32)
    q = cupy.empty((b, num_q_heads, d), cupy.float16)
    for r in range(b):
        u = rs.standard_normal((hkv, d), dtype=cupy.float32)
        u /= cupy.linalg.norm(u, axis=1, keepdims=True)
        q[r] = (np.sqrt(d) * cupy.repeat(u, g, axis=0) + 0.5 * rs.standard_normal((num_q_heads, d),
                                                                                 dtype=cupy.float32)).astype(cupy.float16)
        pick = offsets_d[rs.randint(0, offsets_d.size, size=(hkv, n))]  # [Hkv, N]
        boost = cupy.repeat(pick, s, axis=1)[:, :t]  # per token
        keys = boost[:, :, None] * u[:, None, :] + within_block * rs.standard_normal((hkv, t, d), dtype=cupy.float32)
        values = rs.standard_normal((hkv, t, d), dtype=cupy.float32)
        cache.prefill(layer, r, keys.astype(cupy.float16), values.astype(cupy.float16))
        del keys, values, boost
    return q
