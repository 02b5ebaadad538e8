"""PTX of psa_fast.metadata's Numba kernels on a machine without a GPU: what a change to the append does to its loads,
checked before a device call (as ``sass_size.py`` does for the CUDA C kernels).

Numba needs NVVM (the CUDA toolkit's ``libnvvm.so``, found through ``CUDA_HOME``) and NVRTC (``libnvrtc.so.13``: ``pip
install --target /tmp/nvrtc nvidia-cuda-nvrtc``, then put its ``nvidia/cu13/lib`` on ``LD_LIBRARY_PATH``); the
compute capability it would read from the device is given here (sm_90).

    CUDA_HOME=/usr/local/cuda-13.0 LD_LIBRARY_PATH=/tmp/nvrtc/nvidia/cu13/lib \\
        python benchmarks/numba_ptx.py --key-tile 16 --out /tmp/append16.ptx
    python benchmarks/numba_ptx.py --module .gl/metadata_s48.py --out /tmp/append48.ptx   # another version

Prints the PTX's line count, its global loads and atomics; ``--sass`` also assembles it for sm_90 with ptxas (from the
CUDA toolkit on PATH) and adds the kernel's static instructions (its code section's bytes / 16, as ``sass_size.py``
reads them), registers and spill bytes: quant3's append at KEY_TILE 16 was 9,472 instructions before the fiftieth
session gave each kind its own kernel, 3,640 after. That the kernel compiles for sm_90 at all is the first check:
the CUDA simulator runs the Python, not Numba's typing and lowering for the GPU.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import types as pytypes

import numpy as np


def append_ptx(module_path: str, key_tile: int | None = None, kind: str = "quant3") -> str:
    """The append kernel's PTX (float16 pool, int64 scalars) for metadata ``kind`` from the metadata module at
    ``module_path``, with ``KEY_TILE`` set to ``key_tile`` when given. Versions before the fiftieth session compiled
    one kernel for every kind (the kind a run-time argument): theirs is that kernel, whatever ``kind``."""
    np.row_stack = getattr(np, "row_stack", np.vstack)  # (numba-cuda 0.30 with numpy 2.5; see psa_fast._compat)
    import numba.cuda.dispatcher as dispatcher
    from numba import cuda, types

    # device functions ask the current device for its compute capability: there is none here
    dispatcher.get_current_device = lambda: pytypes.SimpleNamespace(compute_capability=(9, 0))
    spec = importlib.util.spec_from_file_location("psa_fast._metadata_ptx", module_path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if key_tile is not None:
        module.KEY_TILE = key_tile

    def arr(dtype, ndim):
        return types.Array(dtype, ndim, "C")

    f16, i32 = types.float16, types.int32
    signature = (arr(f16, 3), arr(f16, 3), arr(i32, 3), arr(i32, 1), arr(f16, 3), arr(f16, 3), arr(f16, 5),
                 arr(f16, 5), arr(types.uint32, 5))
    if hasattr(module._append_kernel, "py_func"):  # one kernel, the kind, block size and key type its arguments
        kernel, signature = module._append_kernel, signature + (types.int64,) * 3
    else:  # a kernel for each kind, key type (float16 here) and block size (16 here)
        kernel = module._append_kernel(module.KIND_CODES[kind], 0, 16)
    ptx, _ = cuda.compile_ptx(kernel.py_func, signature, cc=(9, 0))
    return ptx


def summary(ptx: str) -> dict:
    """Counts of a kernel's PTX: lines, global loads, atomics. (Whether loads in guarded branches are in flight
    together is ptxas's if-conversion: the SASS on the device says, ``exp_append.py --dump``.)"""
    return {"lines": len(ptx.splitlines()), "ld.global": ptx.count("ld.global"), "atom": ptx.count("atom.")}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--module", default=None, help="a version of psa_fast/metadata.py (default: the package's)")
    ap.add_argument("--key-tile", type=int, default=None, help="KEY_TILE for the module (default: its own)")
    ap.add_argument("--kind", default="quant3", help="metadata kind (psa_fast.metadata.KIND_CODES)")
    ap.add_argument("--out", default=None, help="write the PTX here")
    ap.add_argument("--sass", action="store_true", help="also assemble it (ptxas, sm_90): instructions, registers")
    args = ap.parse_args(argv)
    if args.module is None:
        from pathlib import Path

        args.module = str(Path(__file__).resolve().parents[1] / "psa_fast" / "metadata.py")
    ptx = append_ptx(args.module, args.key_tile, args.kind)
    if args.out:
        with open(args.out, "w") as f:
            f.write(ptx)
    counts = summary(ptx)
    if args.sass:
        counts.update(sass_counts(ptx))
    print(json.dumps(counts))


def sass_counts(ptx: str) -> dict:
    """``{"instructions", "registers", "spill bytes"}`` of the PTX's one kernel, assembled for sm_90 by ptxas (read as
    ``sass_size.py`` reads nvcc's cubins)."""
    import subprocess
    import tempfile
    from pathlib import Path

    from sass_size import ptxas_usage, text_sections

    with tempfile.TemporaryDirectory() as tmp:
        src, out = Path(tmp) / "k.ptx", Path(tmp) / "k.cubin"
        src.write_text(ptx)
        done = subprocess.run(["ptxas", "-arch=sm_90", "-v", "-o", str(out), str(src)], capture_output=True, text=True)
        if done.returncode:
            raise SystemExit(f"ptxas failed:\n{done.stderr[-4000:]}")
        sizes = text_sections(out.read_bytes())
    (registers, spill), = ptxas_usage(done.stderr).values()
    return {"instructions": sum(sizes.values()) // 16, "registers": registers, "spill bytes": spill}


if __name__ == "__main__":
    main()
