"""The ``psa`` command."""

from __future__ import annotations

import argparse
import sys


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="psa", description="Progressive Sparse Attention: reference, demo and tools.")
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="PSA vs top-k vs dense on the shipped real-attention trace (table + PNGs)")
    demo.add_argument("--out", default=".", help="folder for the PNGs and psa_demo.json (default: here)")
    demo.add_argument("--trace", default=None, help="a trace .npz from examples/capture_trace.py (default: shipped)")
    demo.add_argument("--no-plots", action="store_true", help="print the table only")
    demo.add_argument("--quiet", action="store_true", help="no progress bar")

    args = parser.parse_args(argv)
    if args.command == "demo":
        from . import demo as demo_module

        demo_module.main(out_dir=args.out, trace_path=args.trace, plots=not args.no_plots, progress=not args.quiet)
    return 0


if __name__ == "__main__":
    sys.exit(main())
