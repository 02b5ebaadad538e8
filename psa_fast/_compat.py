"""Where psa_fast meets its environment: GPU detection, array interchange, version shims.

Everything that depends on which packages are installed lives here, so the rest of
``psa_fast`` can assume CuPy and a GPU.
"""

from __future__ import annotations

import functools
import importlib

import numpy as np

# psa is not on PyPI (the name there is another project's): the GPU extra installs from a clone.
INSTALL_GPU = "from a clone of the repository: pip install -e '.[gpu]'"


def patch_numpy_for_numba() -> None:
    """numba-cuda 0.30 calls ``np.row_stack``, which NumPy 2.5 removed; alias it to ``np.vstack``.

    Called once before the first Numba kernel is compiled (see ``psa_fast.metadata``).
    """
    if not hasattr(np, "row_stack"):
        np.row_stack = np.vstack


@functools.lru_cache(maxsize=1)
def gpu_available() -> bool:
    """True when CuPy is installed and sees a CUDA device. ``import cupy`` alone succeeds on CPU-only
    machines, so this asks the runtime."""
    try:
        import cupy

        return bool(cupy.cuda.is_available())
    except Exception:
        return False


def require_gpu() -> None:
    """Raise a clear ``RuntimeError`` where there is no GPU: CuPy missing, or no CUDA device."""
    if not gpu_available():
        try:
            importlib.import_module("cupy")  # only whether it imports: the error says why not
            why = "CuPy is installed but sees no CUDA device (cupy.cuda.is_available() is False)"
        except Exception as exc:  # ImportError, or a broken install
            why = f"CuPy cannot be imported ({type(exc).__name__}: {exc})"
        raise RuntimeError(
            f"psa_fast needs an NVIDIA GPU and CuPy ({INSTALL_GPU}); {why}. "
            "psa_ref computes the same results on the CPU."
        )


def requires_gpu(fn):
    """The gate of psa_fast's public entry points: ``fn`` raises ``require_gpu``'s ``RuntimeError``
    before it touches CuPy where there is no GPU, instead of an ``ImportError`` from deep inside."""

    @functools.wraps(fn)
    def gated(*args, **kwargs):
        require_gpu()
        return fn(*args, **kwargs)

    return gated


def array_kind(x) -> str:
    """``"cupy"``, ``"torch"`` or a description of what ``x`` is."""
    mod = type(x).__module__
    if mod.startswith("cupy"):
        return "cupy"
    if mod.startswith("torch") and type(x).__name__ in ("Tensor", "Parameter"):
        return "torch"
    return f"{mod}.{type(x).__name__}"


def as_cupy(x, name: str, *, dtypes: tuple[str, ...]):
    """View a CuPy array or CUDA torch tensor as a CuPy array (DLPack, no copy).

    Raises ``TypeError`` for host arrays, other array types and dtypes outside ``dtypes``;
    ``ValueError`` for non-contiguous arrays or arrays on another device.
    """
    import cupy

    kind = array_kind(x)
    if kind == "torch":
        if not x.is_cuda:
            raise TypeError(f"{name} must be on the GPU, got a torch tensor on {x.device}")
        if not x.is_contiguous():
            raise ValueError(f"{name} must be contiguous (call .contiguous()); got strides {tuple(x.stride())}")
        if str(x.dtype).replace("torch.", "") not in dtypes:
            raise TypeError(f"{name} must have dtype {' or '.join(dtypes)}, got {x.dtype}")
        a = cupy.from_dlpack(x)
    elif kind == "cupy":
        a = x
        if not a.flags.c_contiguous:
            raise ValueError(f"{name} must be C-contiguous (cupy.ascontiguousarray); got strides {a.strides}")
        if str(a.dtype) not in dtypes:
            raise TypeError(f"{name} must have dtype {' or '.join(dtypes)}, got {a.dtype}")
    elif isinstance(x, np.ndarray):
        raise TypeError(f"{name} is a NumPy array on the host; psa_fast takes CuPy arrays or CUDA torch tensors "
                        "(use psa_ref for host arrays, or cupy.asarray to move it)")
    else:
        raise TypeError(f"{name} must be a CuPy array or a CUDA torch tensor, got {kind}")
    if a.device.id != cupy.cuda.Device().id:
        raise ValueError(f"{name} is on GPU {a.device.id} but the current device is GPU {cupy.cuda.Device().id}")
    return a


KV_DTYPES = ("float16", "bfloat16")  # what the KV pools hold; metadata is float16 for both
BF16_BITS = "int16"  # CuPy has no bfloat16: bfloat16 KV lives in CuPy as int16 arrays of the same bits


def is_torch_bf16(x) -> bool:
    """True for a torch bfloat16 tensor (CuPy arrays never are: see ``BF16_BITS``)."""
    return array_kind(x) == "torch" and str(x.dtype) == "torch.bfloat16"


def as_cupy_kv(x, name: str, kv_dtype: str):
    """``as_cupy`` for KV data of ``kv_dtype``: a float16 array, or for ``"bfloat16"`` a CUDA torch
    bfloat16 tensor (viewed as its bits, no copy) or a CuPy ``int16`` array of bfloat16 bits.

    Raises ``TypeError`` naming ``name`` when the dtype does not match the cache's."""
    if kv_dtype == "float16":
        return as_cupy(x, name, dtypes=("float16",))
    if is_torch_bf16(x):
        import torch

        if not x.is_contiguous():
            raise ValueError(f"{name} must be contiguous (call .contiguous()); got strides {tuple(x.stride())}")
        return as_cupy(x.view(torch.int16), name, dtypes=(BF16_BITS,))
    try:
        return as_cupy(x, name, dtypes=(BF16_BITS,))
    except TypeError as exc:
        raise TypeError(f"{name} must be bfloat16 for a bfloat16 cache (a torch.bfloat16 CUDA tensor, or a CuPy "
                        f"int16 array of bfloat16 bits); {exc}") from None


def kv_to_float32(a, kv_dtype: str):
    """KV data as float32 CuPy (exact for both KV dtypes): float16 widened, bfloat16 bits shifted."""
    import cupy

    if kv_dtype == "float16":
        return a.astype(cupy.float32)
    return (a.view(cupy.uint16).astype(cupy.uint32) << 16).view(cupy.float32)


def float32_to_bf16_bits(a):
    """float32 CuPy -> bfloat16 bits (int16), round to nearest even (finite inputs)."""
    import cupy

    u = cupy.ascontiguousarray(a, dtype=cupy.float32).view(cupy.uint32)
    rounded = (u + cupy.uint32(0x7FFF) + ((u >> 16) & cupy.uint32(1))) >> 16
    return rounded.astype(cupy.uint16).view(cupy.int16)


def like(a, kind: str):
    """Return CuPy array ``a`` as the kind of array the caller passed (torch via DLPack, no copy)."""
    if kind == "torch":
        import torch

        return torch.from_dlpack(a)
    return a
