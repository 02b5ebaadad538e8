"""Run a benchmark script once per value of a ``psa_fast._kernels`` module constant, to A/B a launch rule
(a threshold, a thread count) in one device call without a switch in the library.

    python benchmarks/exp_kernels_attr.py SLICE=1024,16384 -- profile_decode_step.py --kv l17.npz --batches 1
    python benchmarks/exp_kernels_attr.py LOOP_GRID=0,8 GRID_MIN_CTAS=0 -- exp_step.py --sizes 32768:1

Each value prints a ``# _kernels.NAME = value`` line before the script's own output; the constant is restored
afterwards. The script sees the run's values in ``PSA_KERNELS_ATTR`` (``"NAME = value; ..."``) and its index in
``PSA_KERNELS_ATTR_RUN`` (0, 1, ...): bench_decode.py and profile_decode_step.py then append the later runs' rows
to the first run's files, each row tagged ``kernels_attr``, where each run used to overwrite the one before. Values
take the constant's type: integers for an integer constant, numbers for a float one (``STEP_SHARE=0.25,0.5``).
Several assignments run the script once per combination of their values (the last name's values varying fastest),
each combination on one line (``# _kernels.A = 0; _kernels.B = 1``).
"""

from __future__ import annotations

import itertools
import os
import runpy
import sys


def parse_assignment(text: str) -> tuple[str, list[int] | list[float]]:
    """``"SLICE=1024,16384"`` -> ``("SLICE", [1024, 16384])``, ``"STEP_SHARE=0.25,0.5"`` -> ``("STEP_SHARE", [0.25,
    0.5])``; the name must be an existing integer (or flag) or float constant, the values of its type."""
    from psa_fast import _kernels

    name, sep, values = text.partition("=")
    current = getattr(_kernels, name, None)
    kind = int if type(current) is bool else type(current)  # a flag takes 0 / 1
    if not sep or not name.isupper() or kind not in (int, float):
        raise SystemExit(f"expected NAME=v1,v2 with NAME an integer or float constant of psa_fast._kernels, "
                         f"got {text!r}")
    try:
        return name, [kind(v) for v in values.split(",")]
    except ValueError:
        raise SystemExit(f"{name}: values are {'integers' if kind is int else 'numbers'}, got {values!r}") from None


def main(argv: list[str]) -> None:
    if "--" not in argv or argv.index("--") < 1 or argv.index("--") == len(argv) - 1:
        raise SystemExit("usage: exp_kernels_attr.py NAME=v1,v2 [NAME2=...] -- SCRIPT [ARGS...]")
    from psa_fast import _kernels

    split = argv.index("--")
    assignments = [parse_assignment(text) for text in argv[:split]]
    names = [name for name, _ in assignments]
    if len(set(names)) != len(names):
        raise SystemExit(f"each constant may be assigned once, got {', '.join(names)}")
    script, *rest = argv[split + 1:]
    originals = {name: getattr(_kernels, name) for name in names}
    try:
        for run, values in enumerate(itertools.product(*(values for _, values in assignments))):
            for name, value in zip(names, values):
                setattr(_kernels, name, value)
            os.environ["PSA_KERNELS_ATTR"] = "; ".join(f"{name} = {value}" for name, value in zip(names, values))
            os.environ["PSA_KERNELS_ATTR_RUN"] = str(run)
            print("# " + "; ".join(f"_kernels.{name} = {value}" for name, value in zip(names, values)), flush=True)
            sys.argv = [script, *rest]
            runpy.run_path(script, run_name="__main__")
    finally:
        for name, value in originals.items():
            setattr(_kernels, name, value)
        os.environ.pop("PSA_KERNELS_ATTR", None)
        os.environ.pop("PSA_KERNELS_ATTR_RUN", None)


if __name__ == "__main__":
    main(sys.argv[1:])
