"""Run a benchmark script with extra ``-DPSA_<NAME>=value`` defines on every build of one kernel file, to
A/B a kernel change that sits behind a preprocessor switch in one device call.

    python benchmarks/exp_kernel_defines.py decode trans=0 -- exp_dense_tune.py --shape gemma3 --default-only

The defines are added where the library does not set them itself (``_kernels.kernel``'s keyword arguments);
CuPy caches each build apart, so both sides of an A/B compile once.
"""

from __future__ import annotations

import os
import runpy
import sys


def main(argv: list[str]) -> None:
    if "--" not in argv or argv.index("--") < 1:
        raise SystemExit(__doc__)
    cut = argv.index("--")
    name, pairs, script = argv[0], argv[1:cut], argv[cut + 1:]
    if not script:
        raise SystemExit("give the script to run after --")
    extra = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not value.lstrip("-").isdigit():
            raise SystemExit(f"defines are NAME=integer, got {pair!r}")
        extra[key.lower()] = int(value)

    from psa_fast import _kernels

    original = _kernels.kernel

    def kernel(file, **options):
        if file == name:
            options = {**extra, **options}
        return original(file, **options)

    _kernels.kernel = kernel
    print(f"# {name}.cu built with {extra}", flush=True)
    sys.argv = script
    sys.path.insert(0, os.path.dirname(os.path.abspath(script[0])))
    runpy.run_path(script[0], run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
