"""Run a benchmark script with one kernel file of the package replaced by another version of it (e.g. the file as
an earlier commit had it), to A/B a kernel rewrite that has no preprocessor switch in one device call.

    git show HEAD~3:psa_fast/kernels/decode.cu > .gl/decode_old.cu
    python benchmarks/exp_kernel_source.py decode ../.gl/decode_old.cu -- bench_decode.py --profile real ...

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
    name, path, script = argv[0], Path(argv[1]), argv[3:]
    if not path.is_file():
        raise SystemExit(f"no such kernel source: {path}")
    if not script:
        raise SystemExit("give the script to run after --")

    from psa_fast import _kernels

    package = Path(str(_kernels.resources.files("psa_fast")))
    root = Path(tempfile.mkdtemp(prefix="psa_src_"))
    shutil.copytree(package / "kernels", root / "kernels")
    shutil.copy(path, root / "kernels" / f"{name}.cu")
    _kernels.resources = types.SimpleNamespace(files=lambda _pkg: root)  # _kernels._source reads from here
    print(f"# kernels/{name}.cu replaced by {path}", flush=True)
    run_script(script)


if __name__ == "__main__":
    main(sys.argv[1:])
