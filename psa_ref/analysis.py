"""Vectorised what-if curves for analysis: attention over every prefix of a block order.

``psa_ref.topk_attention(k=n)`` attends the first ``n`` blocks of the estimate order; the
functions here give the result for all ``n`` at once (one cumulative sum instead of
``N`` calls), which the demo and the simulator use to sweep budgets. Tests check them
against the reference functions.
"""

from __future__ import annotations

import numpy as np


def block_sums(q: np.ndarray, keys: np.ndarray, values: np.ndarray, block_size: int, scale: float):
    """Per-block softmax numerators under one global maximum per head.

    Args:
        q: ``[G, D]`` float64.
        keys: ``[T, D]`` float64.
        values: ``[T, D]`` float64.

    Returns:
        ``(mass [N, G], weighted [N, G, D])`` with ``mass[j, h] = sum_{t in j} exp(l_ht - max_t l_ht)``
            and ``weighted[j, h] = sum_{t in j} exp(...) v_t``.
    """
    logits = scale * (keys @ q.T)  # [T, G]
    w = np.exp(logits - logits.max(axis=0))
    starts = np.arange(0, keys.shape[0], block_size)
    mass = np.add.reduceat(w, starts, axis=0)
    weighted = np.add.reduceat(w[:, :, None] * values[:, None, :], starts, axis=0)
    return mass, weighted


def prefix_attention(mass: np.ndarray, weighted: np.ndarray, order: np.ndarray):
    """Attention over the first ``n`` blocks of ``order`` for every ``n = 1..len(order)``.

    Args:
        mass, weighted: from ``block_sums``.
        order: ``[n]`` block indices, or ``[n, G]`` for one order per head.

    Returns:
        ``(outputs [n, G, D], mass_fraction [n, G])``: outputs and true attended mass
            fraction after each prefix.
    """
    order = np.asarray(order)
    if order.ndim == 1:
        m, wv = mass[order], weighted[order]
    else:
        heads = np.arange(mass.shape[1])
        m, wv = mass[order, heads], weighted[order, heads]
    cm, cw = np.cumsum(m, axis=0), np.cumsum(wv, axis=0)
    return cw / cm[..., None], cm / mass.sum(axis=0)


def relative_error(output: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """``||output - reference|| / ||reference||`` over the last axis."""
    return np.linalg.norm(output - reference, axis=-1) / np.maximum(np.linalg.norm(reference, axis=-1), 1e-300)


def blocks_for_mass(mass: np.ndarray, fraction: float) -> np.ndarray:
    """``[G]``: the fewest blocks that hold ``fraction`` of each head's mass (ideal order:
    heaviest first). ``mass`` is ``[N, G]``."""
    sorted_mass = -np.sort(-mass, axis=0)
    share = np.cumsum(sorted_mass, axis=0) / mass.sum(axis=0)
    return (share < fraction - 1e-12).sum(axis=0) + 1
