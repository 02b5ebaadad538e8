"""Cut a captured trace down to what one benchmark needs (e.g. one layer of a 32K capture, 25 MiB, small
enough to carry to the GPU machine with the working tree), in the same ``.npz`` format.

    python benchmarks/slice_trace.py /tmp/psa_long/gemma3_xml_32k.npz gemma3_l17_32k.npz --layers 17 --last 32
"""

from __future__ import annotations

import argparse

import numpy as np

from psa_ref.trace import load_trace, save_trace


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", help="a trace .npz (examples/capture_trace.py) or a shipped trace's name")
    ap.add_argument("out")
    ap.add_argument("--layers", default=None, help="model layers to keep, e.g. 17 or 5,17 (default: all)")
    ap.add_argument("--last", type=int, default=None, help="keep the last N query positions (default: all)")
    args = ap.parse_args(argv)
    tr = load_trace(args.trace)
    layers = None
    if args.layers:
        want = [int(x) for x in args.layers.split(",")]
        missing = sorted(set(want) - set(tr.layers.tolist()))
        if missing:
            ap.error(f"--layers {missing} are not in the trace (it has {tr.layers.tolist()})")
        layers = [tr.layers.tolist().index(x) for x in want]
    positions = None
    if args.last is not None:
        if not 1 <= args.last <= tr.positions.size:
            ap.error(f"--last must be in [1, {tr.positions.size}], got {args.last}")
        positions = np.arange(tr.positions.size - args.last, tr.positions.size)
    sub = tr.select(layers=layers, positions=positions)
    size = save_trace(sub, args.out)
    print(f"wrote {args.out}: layers {sub.layers.tolist()}, {sub.positions.size} queries "
          f"({sub.positions[0]}..{sub.positions[-1]}), {sub.k.shape[2]} tokens, {size / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
