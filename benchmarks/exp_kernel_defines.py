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


def parse_defines(pairs: list[str]) -> dict[str, int]:
    """``["trans=0", "EST_V=4"]`` -> ``{"trans": 0, "est_v": 4}`` (names as ``_kernels.kernel`` takes them)."""
    extra = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not key or not sep or not value.lstrip("-").isdigit():
            raise SystemExit(f"defines are NAME=integer, got {pair!r}")
        extra[key.lower()] = int(value)
    return extra


def with_defines(original, name: str, extra: dict[str, int]):
    """``original`` (``_kernels.kernel``) with ``extra`` added to every build of ``kernels/<name>.cu`` where the
    caller does not set the same define itself; other files unchanged."""
    def kernel(file, **options):
        if file == name:
            options = {**extra, **options}
        return original(file, **options)

    return kernel


def main(argv: list[str]) -> None:
    if "--" not in argv or argv.index("--") < 1:
        raise SystemExit(__doc__)
    cut = argv.index("--")
    name, extra, script = argv[0], parse_defines(argv[1:cut]), argv[cut + 1:]
    if not script:
        raise SystemExit("give the script to run after --")

    from psa_fast import _kernels

    _kernels.kernel = with_defines(_kernels.kernel, name, extra)
    print(f"# {name}.cu built with {extra}", flush=True)
    run_script(script)


def run_script(script: list[str]) -> None:
    """Run ``script[0]`` as ``__main__`` with ``script[1:]`` as its arguments, its folder first on the path."""
    sys.argv = script
    sys.path.insert(0, os.path.dirname(os.path.abspath(script[0])))
    runpy.run_path(script[0], run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
