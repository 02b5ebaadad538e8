"""Dense (full) softmax attention: the ground truth every other stage is checked against."""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from . import _validate
from .blocks import to_hnd
from .scoring import kv_head_of


def softmax_attention(q: np.ndarray, keys: np.ndarray, values: np.ndarray, scale: float) -> np.ndarray:
    """Softmax attention of one query head over the given tokens, in float64.

    Args:
        q: ``[D]``.
        keys: ``[n, D]`` with ``n >= 1``.
        values: ``[n, D]``.

    Returns:
        ``[D]``: ``sum_t softmax(scale * q . k)_t v_t``, computed after subtracting the
            largest logit so that no ``exp`` overflows.
    """
    logits = scale * (keys @ q)
    w = np.exp(logits - logits.max())
    return (w @ values) / w.sum()


def dense_attention(q: ArrayLike, keys: ArrayLike, values: ArrayLike, *, scale: float | None = None,
                    kv_layout: str | None = None) -> np.ndarray:
    """Full attention of a decode query over a dense KV cache.

    Args:
        q: ``[D]`` with keys ``[T, D]``, or ``[Hq, D]`` with keys ``[Hkv, T, D]``
            (``Hq % Hkv == 0``; query head ``h`` reads KV head ``h // (Hq // Hkv)``).
        keys: float16/32/64, finite, ``T >= 1``; several heads in ``kv_layout``.
        values: the shape of ``keys``.
        scale: logit scale, default ``1/sqrt(D)``.
        kv_layout: ``"HND"`` (``[Hkv, T, D]``), ``"NHD"`` (``[T, Hkv, D]``) or None: HND, with a
            ``KVLayoutWarning`` where the shape looks like NHD, as
            [`KVBlocks.from_dense`][psa_ref.KVBlocks.from_dense].

    Returns:
        float64 array with the shape of ``q``.
    """
    k = _validate.float_array(keys, "keys")
    v = _validate.float_array(values, "values")
    _validate.kv_shapes(k.shape, v.shape)
    k, v = to_hnd(k, v, kv_layout)
    single = k.ndim == 2
    if single:
        k, v = k[None], v[None]
    qq = _validate.query(q, k.shape[2], k.shape[0], single)
    s = _validate.scale(scale, k.shape[2])
    kv = kv_head_of(qq.shape[0], k.shape[0])
    out = np.stack([softmax_attention(qq[h], k[kv[h]], v[kv[h]], s) for h in range(qq.shape[0])])
    return out[0] if np.ndim(q) == 1 else out
