"""Input checks shared by every public function of ``psa_ref``.

Each check raises ``TypeError`` (wrong kind of value) or ``ValueError`` (right kind,
bad value) with a message that names the argument and says what was expected.
"""

from __future__ import annotations

import numbers

import numpy as np

FLOAT_DTYPES = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))


def float_array(x, name: str) -> np.ndarray:
    """Return ``x`` as a float64 NumPy array after checking dtype and finiteness.

    Accepts float16/32/64 arrays (or anything ``np.asarray`` turns into one, such as
    a CPU torch tensor). Integer, boolean, complex and other dtypes raise
    ``TypeError``; NaN or Inf anywhere raises ``ValueError``.
    """
    try:
        a = np.asarray(x)
    except Exception as exc:  # e.g. a CUDA tensor, which NumPy cannot read
        raise TypeError(
            f"{name} must be a NumPy array (or array-like on the CPU) of float16/32/64, "
            f"got {type(x).__name__}: {exc}"
        ) from None
    if a.dtype not in FLOAT_DTYPES:
        kind = {"i": "integer", "u": "unsigned integer", "b": "boolean", "c": "complex"}.get(
            a.dtype.kind, "non-float"
        )
        raise TypeError(f"{name} must have dtype float16, float32 or float64, got {kind} dtype {a.dtype}")
    if not np.isfinite(a).all():
        bad = int(np.size(a) - np.count_nonzero(np.isfinite(a)))
        raise ValueError(f"{name} contains {bad} NaN or Inf value(s); every element must be finite")
    return a.astype(np.float64, copy=True)


def integer(x, name: str, *, minimum: int) -> int:
    """Check that ``x`` is an integer (not a bool) and at least ``minimum``."""
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, numbers.Integral):
        raise TypeError(f"{name} must be an integer, got {type(x).__name__} {x!r}")
    if x < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {x}")
    return int(x)


def flag(x, name: str) -> bool:
    """Check that ``x`` is a bool (NumPy's included): a truthy string such as ``"no"`` is not one."""
    if not isinstance(x, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, got {type(x).__name__} {x!r}")
    return bool(x)


def integer_or_auto(x, name: str, *, minimum: int) -> int | str:
    """``x`` as ``integer`` checks it, or the string ``"auto"`` (a value the caller picks later)."""
    if isinstance(x, str):
        if x != "auto":
            what = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
            raise ValueError(f"{name} must be {what} or 'auto', got {x!r}")
        return x
    return integer(x, name, minimum=minimum)


def threshold(x, name: str = "threshold") -> float:
    """Check that ``x`` is a real number in the half-open interval (0, 1]."""
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, numbers.Real):
        raise TypeError(f"{name} must be a real number in (0, 1], got {type(x).__name__} {x!r}")
    x = float(x)
    if not (0.0 < x <= 1.0):  # also rejects NaN
        raise ValueError(f"{name} must lie in (0, 1], got {x}")
    return x


def scale(x, head_dim: int) -> float:
    """Return the logit scale: ``1/sqrt(head_dim)`` when ``x`` is None, else a finite ``x > 0``."""
    if x is None:
        return 1.0 / float(np.sqrt(head_dim))
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, numbers.Real):
        raise TypeError(f"scale must be a positive real number or None, got {type(x).__name__} {x!r}")
    x = float(x)
    if not (np.isfinite(x) and x > 0.0):
        raise ValueError(f"scale must be finite and > 0, got {x}")
    return x


def choice(x, name: str, options: tuple[str, ...]) -> str:
    """Check that ``x`` is one of the strings in ``options``."""
    if not isinstance(x, str) or x not in options:
        raise ValueError(f"{name} must be one of {', '.join(repr(o) for o in options)}; got {x!r}")
    return x


def kv_shapes(keys_shape: tuple, values_shape: tuple) -> None:
    """Check that keys are ``[T, D]`` or ``[Hkv, T, D]``, non-empty, and values have their shape."""
    if len(keys_shape) not in (2, 3):
        raise ValueError(f"keys must have shape [T, D] or [Hkv, T, D], got {len(keys_shape)} dimensions "
                         f"{tuple(keys_shape)}")
    if tuple(values_shape) != tuple(keys_shape):
        raise ValueError(f"values must have the same shape as keys {tuple(keys_shape)}, got {tuple(values_shape)}")
    if 0 in keys_shape:
        raise ValueError(f"keys must be non-empty in every dimension, got shape {tuple(keys_shape)}")


def query(q, head_dim: int, num_kv_heads: int, single_head: bool) -> np.ndarray:
    """Check a query against the KV layout and return it as float64 ``[Hq, D]``.

    ``q`` is ``[D]`` for single-head blocks or ``[Hq, D]`` with ``Hq % Hkv == 0``.
    """
    q = float_array(q, "q")
    if q.ndim == 1:
        if not single_head:
            raise ValueError(
                f"q has shape {q.shape} (one head) but the KV blocks have {num_kv_heads} heads; "
                "pass q as [Hq, D] for several heads"
            )
        q = q[None, :]
    elif q.ndim != 2:
        raise ValueError(f"q must have shape [D] or [Hq, D], got {q.ndim} dimensions {q.shape}")
    hq, d = q.shape
    if d != head_dim:
        raise ValueError(f"q has head dimension {d} but keys have {head_dim}")
    if hq == 0:
        raise ValueError("q has 0 heads; expected at least one")
    if hq % num_kv_heads != 0:
        raise ValueError(
            f"the number of query heads ({hq}) must be a multiple of the number of KV heads ({num_kv_heads})"
        )
    return q
