"""Static SASS size of a kernel build, on a machine with nvcc but no disassembler (cuobjdump, nvdisasm): compile the
kernel's source (its local headers inlined, as psa_fast._kernels does for NVRTC) to an sm_90 cubin with the build's
defines and read the size of each kernel's ``.text.<name>`` section from the ELF file. Hopper's instructions are 16
bytes each, so the size / 16 is the kernel's instruction count: a proxy for what a change to unrolled per-block code
saves, checked on the CPU before a device call (the dynamic count needs ncu on the GPU).

    python benchmarks/sass_size.py decode -D D=128 S=16 G=4 CLUSTER=8 WARPS=8 STAGES=3 QPARTS=2 PAIR=1 STREAM_WINDOW=1
    python benchmarks/sass_size.py decode --llama-loop          # the same, Llama-3.1-8B's ema loop at one request
    python benchmarks/sass_size.py decode --llama-loop -D MY_SWITCH=1   # a define added to the preset

Prints each kernel's instructions, registers and spill bytes (ptxas -v), and the md5 of its code: a switch compiled
out must leave the default build's digests unchanged (byte-identical code), which is checked here before any device
time is spent on it. ``--builds`` does that for the decode kernel's builds that the library makes (``BUILDS``: the
loop on clusters and on the grid, split, speculative, resumed, offload, bfloat16, first chunk from the previous call;
Llama-3.1-8B's, SmolLM2's and Gemma 3's head dims), each with the given defines added:

    python benchmarks/sass_size.py decode --builds                      # one row per build and kernel
    python benchmarks/sass_size.py decode --builds -D MY_SWITCH=0       # the same, the switch explicitly off

``--loops`` disassembles the build (``nvdisasm``: on the PATH, or from ``pip install nvidia-cuda-nvdisasm``) and
prints each kernel's loops (its backward branches): their instructions, their local-memory (spill) loads and stores,
and the source line that closes them, so a spill can be placed inside or outside a hot loop before a device call:

    python benchmarks/sass_size.py decode --loops -D D=256 S=16 G=4 WARPS=4 STAGES=2 QPARTS=2 PAIR=1 GRID=64
"""

from __future__ import annotations

import argparse
import hashlib
import re
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

PRESETS = {
    # the ema loop's build at Llama-3.1-8B's shape for one request (clusters of 8, 8 warps, 3 stages, paired,
    # windowed stream), and the dense split build of the same shape
    "llama_loop": dict(D=128, S=16, G=4, CLUSTER=8, WARPS=8, STAGES=3, QPARTS=2, PAIR=1, STREAM_WINDOW=1),
    "llama_split": dict(D=128, S=16, G=4, CLUSTER=1, WARPS=8, STAGES=3, QPARTS=2, PAIR=1, STREAM_WINDOW=1, SPLIT=1),
}

# Builds of decode.cu as psa_fast._kernels.decode makes them (warps and stages from decode_config: Gemma 3's D 256
# takes 4 warps of 2 stages, dense at D 64 4 warps; the windowed stream at D <= 128, _kernels.DECODE_STREAM_WINDOW).
_LLAMA = dict(D=128, S=16, G=4, WARPS=8, STAGES=3, QPARTS=2, PAIR=1, STREAM_WINDOW=1)
_SMOL = dict(D=64, S=16, G=3, WARPS=8, STAGES=3, QPARTS=2, PAIR=1, STREAM_WINDOW=1)
_GEMMA = dict(D=256, S=16, G=4, WARPS=4, STAGES=2, QPARTS=2, PAIR=1, STREAM_WINDOW=0)
# The builds on clusters exchange by push (PUSH=1: _kernels.DECODE_PUSH, where push_fits).
BUILDS = {
    "llama_loop": dict(_LLAMA, CLUSTER=8, PUSH=1),
    "llama_split": dict(_LLAMA, CLUSTER=1, SPLIT=1),
    "llama_grid": dict(_LLAMA, CLUSTER=1, GRID=16),
    "llama_spec": dict(_LLAMA, CLUSTER=1, SPEC=1),
    "llama_resume": dict(_LLAMA, CLUSTER=2, RESUME=1, PUSH=1),
    "llama_offload": dict(_LLAMA, CLUSTER=1, OFFLOAD=1),
    "llama_bf16": dict(_LLAMA, CLUSTER=8, BF16=1, QPARTS=3, PUSH=1),
    "llama_first_prev": dict(_LLAMA, CLUSTER=8, FIRST_PREV=1, PUSH=1),
    "smollm2_loop": dict(_SMOL, CLUSTER=8, PUSH=1),
    "smollm2_split": dict(_SMOL, CLUSTER=1, SPLIT=1, WARPS=4),
    "gemma3_loop": dict(_GEMMA, CLUSTER=8, PUSH=1),
    "gemma3_grid": dict(_GEMMA, CLUSTER=1, GRID=16),
    "gemma3_split": dict(_GEMMA, CLUSTER=1, SPLIT=1),
}


def text_sections(cubin: bytes, *, digest: bool = False) -> dict:
    """``{kernel name: bytes}`` of the ELF64 file's ``.text.<name>`` sections (``digest``: ``{name: md5 hex of the
    section's contents}``)."""
    if cubin[:4] != b"\x7fELF" or cubin[4] != 2:
        raise ValueError("cubin: expected an ELF64 file")
    shoff = struct.unpack_from("<Q", cubin, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)
    headers = [struct.unpack_from("<IIQQQQ", cubin, shoff + i * shentsize) for i in range(shnum)]
    names_off = headers[shstrndx][4]

    def name(offset: int) -> str:
        end = cubin.index(b"\0", names_off + offset)
        return cubin[names_off + offset:end].decode()

    texts = [h for h in headers if name(h[0]).startswith(".text.")]
    if digest:
        return {name(h[0])[len(".text."):]: hashlib.md5(cubin[h[4]:h[4] + h[5]]).hexdigest() for h in texts}
    return {name(h[0])[len(".text."):]: h[5] for h in texts}


def kernel_source(source_name: str) -> str:
    """``psa_fast/kernels/<source_name>.cu`` with its local headers inlined, as the library compiles it."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from psa_fast import _kernels

    return _kernels._source(f"{source_name}.cu")


def compile_cubin(source_name: str, defines: dict[str, str], *, lineinfo: bool = False) -> tuple[bytes, str]:
    """(cubin, ptxas's report) of ``psa_fast/kernels/<source_name>.cu`` with ``-DPSA_<k>=<v>`` for sm_90;
    ``lineinfo`` keeps the source lines of the inlined file (kernel_source) for the disassembler."""
    with tempfile.TemporaryDirectory() as tmp:
        src, out = Path(tmp) / f"{source_name}.cu", Path(tmp) / "k.cubin"
        src.write_text(kernel_source(source_name))
        cmd = ["nvcc", "-cubin", "-arch=sm_90", "-std=c++17", "-Xptxas", "-v", "-o", str(out), str(src)]
        cmd += ["-lineinfo"] if lineinfo else []
        cmd += [f"-DPSA_{k}={v}" for k, v in defines.items()]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"nvcc failed:\n{done.stderr[-4000:]}")
        return out.read_bytes(), done.stderr


def build(source_name: str, defines: dict[str, str]) -> tuple[dict[str, int], str, dict[str, str]]:
    """Compile ``psa_fast/kernels/<source_name>.cu`` with ``-DPSA_<k>=<v>``; returns (text sizes, ptxas's report,
    text digests)."""
    cubin, report = compile_cubin(source_name, defines)
    return text_sections(cubin), report, text_sections(cubin, digest=True)


def nvdisasm() -> str:
    """The path of ``nvdisasm``: on the PATH, else the one the ``nvidia-cuda-nvdisasm`` wheel installs."""
    found = shutil.which("nvdisasm")
    if found:
        return found
    try:
        import nvidia
    except ImportError:
        nvidia = None
    for root in getattr(nvidia, "__path__", []):
        for path in sorted(Path(root).glob("cu*/bin/nvdisasm")):
            return str(path)
    raise SystemExit("--loops needs nvdisasm: put the CUDA toolkit's on the PATH or pip install nvidia-cuda-nvdisasm")


def sass_loops(sass: str, source_file: str) -> dict[str, list[dict]]:
    """The loops of each kernel in ``nvdisasm -c -g`` text: one dict per backward branch (a branch to a label at or
    before it), ``start`` / ``end`` (its first instruction's and the branch's byte offsets), ``instructions`` and
    ``local`` (LDL / STL among them, spill traffic) in [start, end], and ``line``: the branch's line in the file named
    ``source_file`` (the compiled source's name; an inlined CUDA header's lines are skipped; None without them); sorted
    by start, outer loops before the inner ones they hold. A loop's range is its code's layout, not its body: a wait
    the compiler moved out of line (a spin on a barrier, placed after the kernel's hot path) spans all between."""
    kernels: dict[str, list] = {}
    name, line, pending = None, None, []
    for text in sass.splitlines():
        m = re.match(r"\.text\.(\w+):", text.strip())
        if m:
            name, line, pending = m.group(1), None, []
            kernels[name] = {"instructions": [], "labels": {}}
            continue
        if name is None:
            continue
        m = re.search(r'//## File "([^"]*)", line (\d+)', text)
        if m:  # the kernel's own lines only (a CUDA header's intrinsic keeps the line that called it)
            if Path(m.group(1)).name == source_file:
                line = int(m.group(2))
            continue
        m = re.match(r"\s*(\.L_x_\d+):", text)
        if m:
            pending.append(m.group(1))
            continue
        m = re.match(r"\s*/\*([0-9a-f]+)\*/\s+(.*?)\s*;", text)
        if m:
            at = int(m.group(1), 16)
            for label in pending:
                kernels[name]["labels"][label] = at
            pending = []
            kernels[name]["instructions"].append((at, m.group(2), line))
    result = {}
    for name, k in kernels.items():
        ins, loops = k["instructions"], []
        for at, op, line in ins:
            m = re.search(r"\bBRA\b.*?(\.L_x_\d+)", op)
            if m and k["labels"].get(m.group(1), at + 1) <= at:
                start = k["labels"][m.group(1)]
                inside = [o for a, o, _ in ins if start <= a <= at]
                local = sum(1 for o in inside if re.search(r"\b(LDL|STL)\b", o))
                loops.append(dict(start=start, end=at, instructions=len(inside), local=local, line=line))
        result[name] = sorted(loops, key=lambda lp: (lp["start"], -lp["end"]))
    return result


def ptxas_usage(report: str) -> dict[str, tuple[int, int]]:
    """``{kernel: (registers, spill store bytes)}`` from ptxas -v's report."""
    usage, current, spill = {}, None, 0
    for line in report.splitlines():
        m = re.search(r"Compiling entry function '(\w+)'|Function properties for (\w+)", line)
        if m:
            current = m.group(1) or m.group(2)
            continue
        m = re.search(r"(\d+) bytes spill stores", line)
        if m:
            spill = int(m.group(1))
        m = re.search(r"Used (\d+) registers", line)
        if m and current:
            usage[current] = (int(m.group(1)), spill)
            spill = 0
    return usage


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("source", help="kernel source under psa_fast/kernels, without .cu (e.g. decode)")
    ap.add_argument("-D", "--define", nargs="*", default=[], help="NAME=value, as -DPSA_NAME=value")
    ap.add_argument("--builds", action="store_true",
                    help="every build of BUILDS (decode.cu), with the -D defines added")
    ap.add_argument("--loops", action="store_true",
                    help="each kernel's loops and their spill loads / stores (nvdisasm)")
    for preset in PRESETS:
        ap.add_argument(f"--{preset.replace('_', '-')}", action="store_true", help=f"the preset {PRESETS[preset]}")
    args = ap.parse_args(argv)
    defines: dict[str, str] = {}
    for preset, values in PRESETS.items():
        if getattr(args, preset):
            defines.update({k: str(v) for k, v in values.items()})
    for text in args.define:
        name, sep, value = text.partition("=")
        if not sep or not name:
            raise SystemExit(f"-D: expected NAME=value, got {text!r}")
        defines[name] = value
    if args.builds:
        print(f"# {args.source}.cu, every build of BUILDS with " + (" ".join(f"{k}={v}" for k, v in defines.items())
                                                                  or "no define added"))
        print("| build | kernel | SASS instructions | registers | spill stores (bytes) | md5 of the code |")
        print("|---|---|---|---|---|---|")
        for label, values in BUILDS.items():
            sizes, report, digests = build(args.source, {**{k: str(v) for k, v in values.items()}, **defines})
            usage = ptxas_usage(report)
            for name, size in sorted(sizes.items()):
                regs, spill = usage.get(name, (None, None))
                print(f"| {label} | {name} | {size // 16} | {regs} | {spill} | {digests[name][:12]} |", flush=True)
        return
    if args.loops:
        cubin, report = compile_cubin(args.source, defines, lineinfo=True)
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "k.cubin"
            path.write_bytes(cubin)
            sass = subprocess.run([nvdisasm(), "-c", "-g", str(path)], capture_output=True, text=True,
                                  check=True).stdout
        source = kernel_source(args.source).splitlines()
        usage = ptxas_usage(report)
        print(f"# {args.source}.cu, " + " ".join(f"{k}={v}" for k, v in defines.items()))
        for name, loops in sass_loops(sass, f"{args.source}.cu").items():
            regs, spill = usage.get(name, (None, None))
            print(f"\n{name}: {regs} registers, {spill} bytes of spill stores")
            print("| loop (bytes) | instructions | local loads / stores | closed at line | source |")
            print("|---|---|---|---|---|")
            for lp in loops:
                text = source[lp["line"] - 1].strip()[:60] if lp["line"] and lp["line"] <= len(source) else ""
                print(f"| {lp['start']:#x}-{lp['end']:#x} | {lp['instructions']} | {lp['local']} | {lp['line']} | "
                      f"`{text}` |")
        return
    sizes, report, digests = build(args.source, defines)
    usage = ptxas_usage(report)
    print(f"# {args.source}.cu, " + " ".join(f"{k}={v}" for k, v in defines.items()))
    print("| kernel | SASS instructions | registers | spill stores (bytes) | md5 of the code |")
    print("|---|---|---|---|---|")
    for name, size in sorted(sizes.items()):
        regs, spill = usage.get(name, (None, None))
        print(f"| {name} | {size // 16} | {regs} | {spill} | {digests[name][:12]} |")


if __name__ == "__main__":
    main()
