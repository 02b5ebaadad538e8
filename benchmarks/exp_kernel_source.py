"""Run a benchmark script with one kernel file of the package replaced by another version of it (e.g. the file as
an earlier commit had it), to A/B a kernel rewrite that has no preprocessor switch in one device call.

    git show HEAD~3:psa_fast/kernels/decode.cu > .gl/decode_old.cu
    python benchmarks/exp_kernel_source.py decode ../.gl/decode_old.cu -- bench_decode.py --profile real ...

Several files that go together: comma-separated names and paths (``order_slice,order_merge a.cu,b.cu``).

Every build in the process reads the replacement (its ``#include``s from the package's headers); CuPy caches
builds by their source, so both sides compile once.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import types
from pathlib import Path

from exp_kernel_defines import run_script


def main(argv: list[str]) -> None:
    if "--" not in argv or argv.index("--") != 2:
        raise SystemExit(__doc__)
    names, paths, script = argv[0].split(","), [Path(p) for p in argv[1].split(",")], argv[3:]
    if len(names) != len(paths):
        raise SystemExit(f"as many kernel files as names: {argv[0]!r} against {argv[1]!r}")
    for path in paths:
        if not path.is_file():
            raise SystemExit(f"no such kernel source: {path}")
    if not script:
        raise SystemExit("give the script to run after --")

    from psa_fast import _kernels

    package = Path(str(_kernels.resources.files("psa_fast")))
    root = Path(tempfile.mkdtemp(prefix="psa_src_"))
    shutil.copytree(package / "kernels", root / "kernels")
    for name, path in zip(names, paths):
        shutil.copy(path, root / "kernels" / f"{name}.cu")
        print(f"# kernels/{name}.cu replaced by {path}", flush=True)
    _kernels.resources = types.SimpleNamespace(files=lambda _pkg: root)  # _kernels._source reads from here
    run_script(script)


if __name__ == "__main__":
    main(sys.argv[1:])
