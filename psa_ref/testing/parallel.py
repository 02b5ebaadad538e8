"""Error budget of a row-parallel output projection (head-parallel decode on several ranks).

One rank computes ``y_j = sum_i o_i W_ij`` over all ``n = Hq * D`` rows of ``W_o`` at once; ``W`` ranks
each sum their ``n / W`` rows and an all-reduce adds the ``W`` partials. Both evaluate the same ``n``
products, only summed in a different order, and each differs from the exact sum by at most
``gamma_n * sum_i |o_i W_ij|`` (``gamma_n = n eps / (1 - n eps)``, the classic bound for recursive
summation, Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., eq. 3.5 / 4.4; blocked and
pairwise sums do better). So the two lie within ``2 gamma_n`` of each other; we allow
``16 n eps`` (as [`budget64`][psa_ref.testing.budget64] does), times the largest ``sum_i |o_i W_ij|``.
When the attention outputs ``o`` themselves may differ between the two runs by ``attention_rtol`` of
``max|o|``, that difference passes through ``W_o`` and adds ``attention_rtol * max|o| * max_j sum_i |W_ij|``.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

EPS64 = float(np.finfo(np.float64).eps)
EPS32 = float(np.finfo(np.float32).eps)


def row_parallel_atol(attention: ArrayLike, w_o: ArrayLike, *, eps: float = EPS64,
                      attention_rtol: float = 0.0) -> float:
    """Absolute tolerance between two evaluations of ``y = concat_h(o_h) @ W_o`` that sum in different orders.

    Args:
        attention: ``[..., Hq, D]`` (or ``[..., Hq * D]``): the attention outputs ``o`` (either side's).
        w_o: ``[Hq * D, d_model]``.
        eps: the unit roundoff of the precision the sums run in (float64 by default; ``EPS32`` for a
            float32 GEMM and reduction).
        attention_rtol: how far the two sides' ``o`` may differ, relative to ``max|o|`` (0 when they are
            the same numbers).

    Returns:
        ``16 n eps max_j sum_i |o_i W_ij| + attention_rtol max|o| max_j sum_i |W_ij|``, ``n = Hq * D``,
            the maximum taken over every request and output column.
    """
    w = np.abs(np.asarray(w_o, dtype=np.float64))
    n = w.shape[0]
    o = np.abs(np.asarray(attention, dtype=np.float64)).reshape(-1, n)
    reorder = 16.0 * n * eps * float((o @ w).max())
    propagated = attention_rtol * float(o.max()) * float(w.sum(axis=0).max())
    return reorder + propagated
