"""What one decode step's metadata append costs on the GPU (``psa_fast.metadata.append_token``, the Numba kernel that
writes each request's new key and value and recomputes its block's metadata), per call, from a CUDA graph of appends.

In Gemma 3 270M's compiled 32K step at B = 8 (H100, forty-seventh session) the append was 9.1 µs of GPU time a global
layer, for PSA and for the paged dense step alike. Each row times the package's module (``--key-tiles 1,16``: copies of
it with those ``KEY_TILE`` values instead, the keys a thread loads at once; ``--splits 1,4`` likewise for
``APPEND_SPLIT``, the threads a channel in quant3's code pass); ``--old PATH`` adds another version of
``psa_fast/metadata.py`` (e.g. ``git show HEAD~1:psa_fast/metadata.py > .gl/metadata_old.py``), each loaded
as a module of the package, in the same process.

    python benchmarks/exp_append.py --batches 1,8,32 --dims 256,128 --kinds quant3,cuboid_mean,none
    python benchmarks/exp_append.py --batches 8 --dims 256 --kinds quant3 --old .gl/metadata_old.py
    python benchmarks/exp_append.py --batches 1,8,32 --dims 256,128 --key-tiles 1,16
    python benchmarks/exp_append.py --batches 1,8,32 --dims 256,128,64 --kinds quant3 --splits 1,4,1
    python benchmarks/exp_append.py --batches 8 --dims 256 --kinds quant3 --dump /tmp/append   # + its PTX and SASS

Prints a table: µs per append (median of ``--reps`` graph replays of ``--calls`` appends each, CUDA events).
"""

from __future__ import annotations

import argparse
import importlib.util

import numpy as np


def load_version(path: str):
    """``psa_fast/metadata.py`` as it is at ``path``, imported as ``psa_fast._metadata_timed`` (its relative imports
    resolve in the package)."""
    spec = importlib.util.spec_from_file_location("psa_fast._metadata_timed", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def with_constants(metadata, **values: int):
    """``metadata`` itself when its constants already have these ``values`` (e.g. ``KEY_TILE=4``,
    ``APPEND_SPLIT=4``), else a copy of it with them (set before its kernels compile)."""
    if all(getattr(metadata, name) == value for name, value in values.items()):
        return metadata
    module = load_version(metadata.__file__)
    for name, value in values.items():
        getattr(module, name)  # an unknown name raises here, not silently
        setattr(module, name, value)
    return module


def time_append(module, *, kind: str, batch: int, d: int, s: int = 16, hkv: int = 1, tokens: int = 32768,
                calls: int = 16, reps: int = 20) -> float:
    """µs of GPU time per ``module.append_token`` call at ``batch`` requests of ``tokens`` tokens (each request's new
    token at a different row of its last block), from a CUDA graph of ``calls`` appends replayed ``reps`` times."""
    import cupy

    rng = np.random.default_rng(d + batch)
    nmax = -(-(tokens + 1) // s)
    slots = batch * hkv * nmax
    k_pool = cupy.asarray(rng.standard_normal((slots, s, d)).astype(np.float16))
    v_pool = cupy.zeros_like(k_pool)
    table = cupy.asarray(np.arange(slots, dtype=np.int32).reshape(batch, hkv, nmax))
    lens = cupy.asarray((tokens - 1 - np.arange(batch) * 5 % s).astype(np.int32))
    meta = cupy.zeros((batch, hkv, nmax, 2, d), cupy.float16)
    lohi = cupy.zeros_like(meta)
    codes = cupy.zeros((batch, hkv, nmax, s, d // 8), cupy.uint32) if kind == "quant3" else None
    k_new = cupy.asarray(rng.standard_normal((batch, hkv, d)).astype(np.float16))

    def append():
        if kind == "none":  # a cache without metadata (PagedKVCache(metadata=None)): the token written, nothing else
            module.write_token(k_pool, v_pool, table, lens, k_new, k_new, block_size=s)
        else:
            module.append_token(k_pool, v_pool, table, lens, k_new, k_new, meta, lohi, kind=kind, block_size=s,
                                codes=codes)

    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        append()  # compiles
        stream.synchronize()
        stream.begin_capture()
        for _ in range(calls):
            append()
        graph = stream.end_capture()
        graph.launch(stream)
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        times = []
        for _ in range(reps):
            start.record(stream)
            graph.launch(stream)
            end.record(stream)
            end.synchronize()
            times.append(cupy.cuda.get_elapsed_time(start, end) * 1e3 / calls)
    return float(np.median(times))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--dims", default="256,128,64", help="padded head dimensions")
    ap.add_argument("--kinds", default="quant3,cuboid_mean", help="metadata kinds; none: the write alone")
    ap.add_argument("--old", default=None, help="another version of psa_fast/metadata.py, timed beside it")
    ap.add_argument("--calls", type=int, default=16)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--key-tiles", default=None, help="KEY_TILE values, each timed as a copy of the package's module")
    ap.add_argument("--splits", default=None, help="APPEND_SPLIT values (threads a channel in quant3's code pass), "
                    "each timed as a copy of the package's module")
    ap.add_argument("--dump", default=None, help="a folder for the package's append kernel's PTX and SASS, as compiled")
    args = ap.parse_args(argv)
    from psa_fast import metadata

    versions = [("this", metadata)]
    if args.key_tiles:
        versions = [(f"KEY_TILE={tile}", with_constants(metadata, KEY_TILE=int(tile)))
                    for tile in args.key_tiles.split(",")]
    if args.splits:
        versions = [(f"APPEND_SPLIT={n}", with_constants(metadata, APPEND_SPLIT=int(n)))
                    for n in args.splits.split(",")]
    versions += [("old", load_version(args.old))] if args.old else []
    print("| kind | B | D | " + " | ".join(f"{name} µs" for name, _ in versions) + " |")
    print("|---|---|---|" + "---|" * len(versions))
    for kind in args.kinds.split(","):
        for d in (int(x) for x in args.dims.split(",")):
            for b in (int(x) for x in args.batches.split(",")):
                us = [time_append(m, kind=kind, batch=b, d=d, calls=args.calls, reps=args.reps) for _, m in versions]
                print(f"| {kind} | {b} | {d} | " + " | ".join(f"{u:.2f}" for u in us) + " |", flush=True)
    if args.dump:
        dump_code(append_dispatcher(versions[0][1], args.kinds.split(",")[0]), args.dump)


def append_dispatcher(module, kind: str, block_size: int = 16):
    """``module``'s append kernel for ``kind`` with a float16 pool (the one ``time_append`` compiled; for ``none`` the
    write alone), or, in versions before the fiftieth session, its one kernel of every kind."""
    if kind == "none":
        write = module._write_kernel
        return write if hasattr(write, "inspect_asm") else write(block_size)
    if hasattr(module._append_kernel, "inspect_asm"):
        return module._append_kernel
    return module._append_kernel(module.KIND_CODES[kind], 0, block_size)


def dump_code(dispatcher, folder: str) -> None:
    """Write each compiled signature's PTX (and SASS, where nvdisasm is found) of a Numba kernel to ``folder``."""
    from pathlib import Path

    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    for i, ptx in enumerate(dispatcher.inspect_asm().values()):
        (out / f"append_{i}.ptx").write_text(ptx)
    try:
        sass = dispatcher.inspect_sass()
    except (OSError, RuntimeError) as e:  # (no nvdisasm on the machine)
        print(f"no SASS: {e}")
        return
    for i, text in enumerate(sass.values()):
        (out / f"append_{i}.sass").write_text(text)


if __name__ == "__main__":
    main()
