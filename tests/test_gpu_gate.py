"""psa_fast without a GPU: ``import psa_fast`` works, and every entry point raises the promised ``RuntimeError``
(not an ``ImportError`` from deep inside) whether CuPy is missing or imports but sees no device. Runs on the CPU."""

import inspect
import subprocess
import sys
import types

import numpy as np
import pytest

import psa_fast
from psa_fast import _compat

KV = np.zeros((2, 8, 4), np.float16)
ENTRY_POINTS = {  # every public callable that computes; each must be gated before it touches CuPy
    "attention": lambda: psa_fast.attention(np.zeros((2, 4)), None, 0.95),
    "topk_attention": lambda: psa_fast.topk_attention(np.zeros((2, 4)), None, k=2),
    "dense_attention": lambda: psa_fast.dense_attention(np.zeros((2, 4)), KV, KV),
    "plan": lambda: psa_fast.plan(None, num_q_heads=2),
    "DecodePlan": lambda: psa_fast.DecodePlan(None, num_q_heads=2),
    "KVBlocks.from_dense": lambda: psa_fast.KVBlocks.from_dense(KV, KV),
    "PagedKVCache": lambda: psa_fast.PagedKVCache(num_layers=1, batch=1, num_kv_heads=1, head_dim=4, max_tokens=8),
}


@pytest.fixture
def no_gpu(monkeypatch, request):
    """Replace CuPy by ``request.param``: None (not installed) or a module that imports but sees no device."""
    _compat.gpu_available.cache_clear()
    monkeypatch.setitem(sys.modules, "cupy", request.param)
    yield
    _compat.gpu_available.cache_clear()  # the next test asks the real CuPy again


def _cupy_without_device():
    fake = types.ModuleType("cupy")
    fake.cuda = types.SimpleNamespace(is_available=lambda: False)
    return fake


@pytest.mark.parametrize("no_gpu, why", [(None, "CuPy cannot be imported"),
                                         (_cupy_without_device(), "sees no CUDA device")],
                         indirect=["no_gpu"], ids=["cupy-missing", "cupy-without-device"])
@pytest.mark.parametrize("name", ENTRY_POINTS)
def test_entry_points_raise_runtime_error_without_gpu(no_gpu, why, name):
    assert not psa_fast.gpu_available()
    with pytest.raises(RuntimeError, match="needs an NVIDIA GPU and CuPy") as err:
        ENTRY_POINTS[name]()
    assert why in str(err.value) and "psa_ref" in str(err.value)
    # the install hint names the extra from a clone: PyPI's "psa" is another project
    assert "pip install -e '.[gpu]'" in str(err.value) and "'psa[gpu]'" not in str(err.value)


@pytest.mark.skipif(psa_fast.gpu_available(), reason="checks the machine's own no-GPU case")
@pytest.mark.parametrize("name", ENTRY_POINTS)
def test_entry_points_raise_runtime_error_on_this_machine(name):
    with pytest.raises(RuntimeError, match="needs an NVIDIA GPU"):
        ENTRY_POINTS[name]()


def test_import_without_cupy_in_a_fresh_interpreter():
    """A user without CuPy: the import works, the call says why it cannot run."""
    code = ("import sys; sys.modules['cupy'] = None\n"
            "import numpy as np, psa_fast\n"
            "assert not psa_fast.gpu_available()\n"
            "try:\n"
            "    psa_fast.attention(np.zeros(4), None)\n"
            "except RuntimeError as e:\n"
            "    print('RuntimeError:', e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("RuntimeError: psa_fast needs an NVIDIA GPU"), out.stdout


def test_gate_passes_through_where_the_gpu_is_available(monkeypatch):
    """The gate adds nothing else: with a device, the wrapped function runs (here a stand-in)."""
    monkeypatch.setattr(_compat, "gpu_available", lambda: True)
    assert _compat.requires_gpu(lambda x, *, y: x + y)(1, y=2) == 3
    # functools.wraps: the signature the docs and help() show is the function's own
    assert list(inspect.signature(psa_fast.attention).parameters)[:3] == ["q", "blocks", "threshold"]


@pytest.mark.parametrize("name", ["attention", "topk_attention", "dense_attention", "KVBlocks.from_dense"])
def test_gpu_twins_take_every_argument_of_the_reference(name):
    """psa_fast's twins take psa_ref's arguments (docs/gpu.md promises it), under the same names and defaults; they
    may add their own (``speculate``, ``dtype``)."""
    import psa_ref

    def signature(module):
        obj = module
        for part in name.split("."):
            obj = getattr(obj, part)
        return inspect.signature(obj).parameters

    ref, fast = signature(psa_ref), signature(psa_fast)
    assert set(ref) <= set(fast), f"psa_fast.{name} lacks {sorted(set(ref) - set(fast))}"
    assert {p: fast[p].default for p in ref} == {p: ref[p].default for p in ref}


def test_decode_output_counts_speculated_blocks_as_read():
    """``DecodeOutput.num_read``: the attended blocks, or with speculation the larger of attended and speculated
    (blocks read before the verifier stopped are read all the same). Works on NumPy arrays too."""
    from psa_fast.api import DecodeOutput

    used, spec = np.array([[3, 9]], np.int32), np.array([[5, 4]], np.int32)
    loop = DecodeOutput(None, None, used, None, None, None)
    assert loop.num_read is used
    speculated = DecodeOutput(None, None, used, None, None, None, num_speculated=spec)
    np.testing.assert_array_equal(speculated.num_read, [[5, 9]])
