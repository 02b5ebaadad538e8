"""Shared pytest configuration: hypothesis profiles.

The "ci" profile (the default) runs every property on at least 200 examples, as the
project requires; "dev" is quicker for local iteration (HYPOTHESIS_PROFILE=dev).
"""

import os

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
