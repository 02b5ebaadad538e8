"""Shared pytest configuration: hypothesis profiles.

The "ci" profile (the default) runs every property on at least 200 examples, as the
project requires; "dev" is quicker for local iteration (HYPOTHESIS_PROFILE=dev).
"""

import os

import pytest
from hypothesis import HealthCheck, settings

from psa_fast._compat import gpu_available

# Without a GPU, Numba kernels run in its CUDA simulator; the variable must be set before the
# first `numba.cuda` import, which is why it lives here.
if not gpu_available():
    os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

settings.register_profile(
    "ci", max_examples=200, deadline=None, derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile("dev", max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture
def sweep_rank_calls(monkeypatch):
    """A list that receives the ``rank`` of every call the transformers integration makes to
    ``psa_ref.sweep.attention`` during the test (a spy around the real function)."""
    from psa_ref.tools import hf

    seen = []
    real = hf._sweep.attention

    def spy(*args, **kwargs):
        seen.append(kwargs.get("rank"))
        return real(*args, **kwargs)

    monkeypatch.setattr(hf._sweep, "attention", spy)
    return seen


@pytest.fixture
def lift_grid_thresholds(monkeypatch):
    """A function that sets pick_grid's thresholds to 0 for the test, so that _kernels.LOOP_GRID alone decides
    whether a plan takes the grid build: any cache, head dim and cluster."""

    def lift():
        from psa_fast import _kernels

        for name in ("GRID_MIN_GROUP_MIB", "GRID_MIN_BLOCKS_IDLE", "GRID_MIN_HEAD_DIM", "GRID_MIN_CTAS",
                     "GRID_MIN_GAIN"):
            monkeypatch.setattr(_kernels, name, 0)

    return lift


@pytest.fixture
def kernel_switch(monkeypatch):
    """Kernel builds with extra defines, as ``benchmarks/exp_kernel_defines.py`` makes them: ``kernel_switch(file,
    NAME=value, ...)`` adds ``-DPSA_NAME=value`` to every later build of ``psa_fast/kernels/<file>.cu`` (where the
    library does not set the define itself) and returns the list that receives the options of each build asked for so;
    ``kernel_switch(None)`` restores the library's builds. (The A/B tests of switches that must keep every bit.)"""
    from psa_fast import _kernels

    real = _kernels.kernel

    def switch(file, **defines):
        reached = []
        if file is None:
            monkeypatch.setattr(_kernels, "kernel", real)
            return reached

        def with_defines(name, **options):
            if name == file:
                reached.append(options)
                options = {**defines, **options}
            return real(name, **options)

        monkeypatch.setattr(_kernels, "kernel", with_defines)
        return reached

    return switch
