"""Decode-step benchmark on the GPU: torch SDPA dense vs psa_fast dense, top-k and PSA, each against its floor.

The data and the kernels are measured apart. The data (``--profile``) sets how many bytes a method must
read; the kernels set how close a step gets to that:

* ``pooled`` (the run of record) / ``per-head``: keys whose block masses follow the shipped SmolLM2
  trace (every head from its pooled distribution, or each KV head from one (layer, position, head));
* ``sparsity``: the family of ``psa_fast.synthetic.sparsity_profiles``: each KV head's ideal τ 0.95
  budget lies around a chosen share of the blocks (``--shares``, default 2, 5, 10, 20, 30%; heads
  differ up to 2× either way, mean on target), with a sink block holding 25% of the mass and a heavy
  recent window, as real models show;
* ``long-context``: ``psa_fast.synthetic.long_context_profiles``: each KV head one head of Gemma 3 270M's
  global layers measured at the nearest captured length (2K-32K: its budget, sink, recent window and tail),
  grown to 128K by the power law fitted on 2K-32K (docs/performance.md, "Synthetic long-context profiles").

Shapes (``--shape``): ``llama8b`` (Llama-3.1-8B attention: 32 query / 8 KV heads, D 128), ``gemma3``
(Gemma 3 270M's global layers: 4 / 1, D 256, scale 0.0625), ``smollm2`` (SmolLM2-135M: 9 / 3, D 64);
blocks of 16 tokens, float16.

Each row: median device µs per call, 16 calls (several layers' caches in turn, so the L2 stays cold)
captured in one CUDA graph and timed with CUDA events; the **floor** = bytes the method must move (``floor_bytes``: the
K and V of the blocks it read, per KV head; for estimating methods every block's metadata, the scores and the order; the
query and the output) divided by the copy ceiling measured in this run; **step ÷ floor**; GB/s on those bytes;
speedup over SDPA in the same run; the share of blocks read; mean relative output error vs psa_fast
dense. Top-k runs at each PSA row's budget and at the ``k`` whose error is that row's (``equal_error_k``: a grid of
multiples of the budget, then a bisection on the error). Each (size, batch, share) first prints the ideal τ 0.95
share measured on the filled cache (true
logits of every layer on the GPU, per query head). Rows go to ``bench_decode*.jsonl`` (one file per
profile and shape), a table to ``.md`` and to stdout last.

    python benchmarks/bench_decode.py                 # every size, Llama shapes, the trace pooled
    python benchmarks/bench_decode.py --quick         # 8K and 32K, B = 1 and 8
    python benchmarks/bench_decode.py --profile per-head   # heads as different as the trace's
    python benchmarks/bench_decode.py --profile sparsity --shape gemma3 --sizes 32768 --batches 1,8,32
    python benchmarks/bench_decode.py --profile sparsity --sizes 32768:1,131072:1,131072:8 --shares 0.02,0.2
    python benchmarks/bench_decode.py --profile long-context --shape gemma3 --sizes 32768,131072 --batches 1,8
    python benchmarks/bench_decode.py --profile real --kv gemma3_l17_32k.npz --shape gemma3 --sizes 32768

``--profile real`` replays captured decode steps (``real_fill``; several traces: requests of different texts):
one global layer of Gemma 3 at 32K is 25 MiB, cut from a capture by ``benchmarks/slice_trace.py``, small
enough to carry to the device in one call. Every request replays the same step (the query at ``T - 1``) unless
``--spread`` gives request r the r-th latest captured step: a batch of different queries, as a model's, whose
slowest request sets a PSA step's time (copies of one step stop together and flatter the batch rows).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from dataclasses import dataclass

import numpy as np
from psa_ref.progressive import ESTIMATED_STOP_MARGIN as ESTIMATED_STOP_MARGIN_OWN  # the library's, before any run

L2_BYTES = 60 * 2**20
PER_GRAPH = 16  # calls captured in one CUDA graph per timing (see graph_us)
CEILING_GBS = 4229.0  # HBM copy, DESIGN.md; main() replaces it with the ceiling measured in the run
VERSIONS: list[int] = []
TAU_IDEAL = 0.95


@dataclass(frozen=True)
class Shape:
    """Attention shape of one layer: ``hq`` query heads, ``hkv`` KV heads, head dim ``d``, blocks of ``s``
    tokens, logit scale ``scale`` (None: ``1/sqrt(d)``)."""

    name: str
    hq: int
    hkv: int
    d: int
    s: int = 16
    scale: float | None = None
    about: str = ""

    @property
    def g(self) -> int:
        """Query heads per KV head."""
        return self.hq // self.hkv

    @property
    def logit_scale(self) -> float:
        return self.scale if self.scale is not None else 1.0 / math.sqrt(self.d)


SHAPES = {
    "llama8b": Shape("llama8b", 32, 8, 128, about="Llama-3.1-8B attention"),
    "gemma3": Shape("gemma3", 4, 1, 256, scale=0.0625, about="Gemma 3 270M global layer"),
    "smollm2": Shape("smollm2", 9, 3, 64, about="SmolLM2-135M"),
}
PROFILES = ("pooled", "per-head", "sparsity", "long-context", "real")
DEFAULT_SHARES = "0.02,0.05,0.1,0.2,0.3"
SKIPPABLE = ("tau0.9", "remaining", "predicted", "estimated", "sfirst", "sketch", "topk", "stages", "speculate",
             "rank")
# The step after a predicted first chunk in the default rule's extra rows: on the real Gemma 3 layer 17 psa_ref's
# sketch_avg with first_chunk="predicted" takes 2.8 iterations at steps 128-192 against 3.8 at 320 alone, reading
# 36-38% of the blocks against 43% (benchmarks/exp_step_growth.py --firsts, thirty-ninth session).
FIRST_STEP = 128
SPECULATE = 2.0  # the margin of the speculative rows (DecodePlan(speculate=...))
# metadata bytes per (request, KV head, block) that the estimate reads
META_BYTES = {
    "cuboid_mean": lambda sh: 2 * sh.d * 2,  # centre + radius, float16
    "quant3": lambda sh: 2 * sh.d * 2 + sh.s * sh.d // 2,  # lo/hi float16 + 4-bit codes
}


# --- the floor: bytes a step must move, over the copy ceiling (pure functions, tested on the CPU) -------

def floor_bytes(shape: Shape, *, t: int, b: int, blocks_read: float | None = None, metadata: str | None = None,
                groups: int | None = None, per_head_passes: int = 0) -> int:
    """Bytes one decode step of ``b`` requests of ``t`` tokens must move, whatever the kernels.

    * K and V of the blocks read: ``b * Hkv * blocks_read * 2 * S * D * 2`` (float16; a block shared by
      a group's query heads counts once);
    * the query in (float16) and the output out (float32): ``b * Hq * D * 6``;
    * estimating methods (``metadata`` given): every block's metadata (``META_BYTES``), the scores written
      and read and the order written (12 bytes per block and selection group, ``groups`` per request:
      ``Hkv`` shared, ``Hq`` per head), the attended part of the order read (4 bytes per block read), and
      ``per_head_passes`` 4-byte passes over ``[B, Hq, N]`` (sketch: each head's estimates and log masses).

    Args:
        blocks_read: mean blocks read per (request, KV head), ``0 <= blocks_read <= N``; None: every block.
        metadata: ``"cuboid_mean"``, ``"quant3"`` or None (no estimate: dense).
    """
    n = -(-t // shape.s)
    read = n if blocks_read is None else float(blocks_read)
    if not 0 <= read <= n:
        raise ValueError(f"blocks_read must lie in [0, N={n}], got {blocks_read}")
    total = b * shape.hkv * read * 2 * shape.s * shape.d * 2 + b * shape.hq * shape.d * (2 + 4)
    if metadata is not None:
        if metadata not in META_BYTES:
            raise ValueError(f"metadata must be one of {sorted(META_BYTES)} or None, got {metadata!r}")
        gn = shape.hkv if groups is None else groups
        total += b * shape.hkv * n * META_BYTES[metadata](shape)
        total += b * gn * (12 * n + 4 * read)
        total += b * shape.hq * n * 4 * per_head_passes
    return int(round(total))


def floor_us(nbytes: float, ceiling_gbs: float) -> float:
    """µs to move ``nbytes`` at ``ceiling_gbs`` (GB/s: 1 GB/s is 1e3 bytes per µs)."""
    if ceiling_gbs <= 0:
        raise ValueError(f"ceiling_gbs must be > 0, got {ceiling_gbs}")
    return nbytes / (ceiling_gbs * 1e3)


def blocks_read_per_kv_head(order: np.ndarray, num_used: np.ndarray, num_kv_heads: int) -> float:
    """Mean distinct blocks read per (request, KV head): the union over each KV head's selection groups
    of the first ``num_used`` entries of ``order`` (``[B, Gn, N]``, ``num_used [B, Gn]``, NumPy; one
    group per KV head when shared, one per query head when ``gqa="per_head"``)."""
    b, gn, n = order.shape
    if gn % num_kv_heads:
        raise ValueError(f"{gn} selection groups do not split over {num_kv_heads} KV heads")
    taken = np.arange(n)[None, None, :] < num_used[:, :, None]
    bi, gi, pi = np.nonzero(taken)
    mask = np.zeros((b, gn, n), bool)
    mask[bi, gi, order[bi, gi, pi]] = True
    return float(mask.reshape(b, num_kv_heads, gn // num_kv_heads, n).any(axis=2).sum(axis=-1).mean())


# --- arguments --------------------------------------------------------------------------------------

def _tokens(x: str) -> int:
    x = x.strip()
    return int(x[:-1]) * 1024 if x[-1:] in ("k", "K") else int(x)


def parse_ints(text: str, what: str) -> list[int]:
    """``"8,32"`` or ``"32K,128K"`` -> ``[8, 32]`` / ``[32768, 131072]``: comma-separated positive integers (K =
    1024); ValueError naming ``what`` (the flag) otherwise."""
    try:
        out = [_tokens(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{what} must be comma-separated positive integers (K = 1024), got {text!r}") from None
    if not out or any(v < 1 for v in out):
        raise ValueError(f"{what} must be comma-separated positive integers (K = 1024), got {text!r}")
    return out


def parse_sizes(sizes: str, batches: str) -> list[tuple[int, int]]:
    """``"32768:1,128K:8"`` -> ``[(32768, 1), (131072, 8)]``; an entry without ``:B`` takes every batch of
    ``batches`` (``"1,8,32"``)."""
    try:
        bs = [int(x) for x in batches.split(",") if x.strip()]
        out = []
        for item in (x for x in sizes.split(",") if x.strip()):
            t, _, b = item.partition(":")
            out += [(_tokens(t), int(b))] if b else [(_tokens(t), bb) for bb in bs]
    except ValueError:
        raise ValueError(f"sizes must look like 32768:1,131072 and batches like 1,8,32; got {sizes!r}, "
                         f"{batches!r}") from None
    if not out or any(t < 1 or b < 1 for t, b in out):
        raise ValueError(f"sizes and batches must be positive and not empty; got {sizes!r}, {batches!r}")
    return out


def parse_shares(shares: str) -> list[float]:
    """``"0.02,0.1"`` -> ``[0.02, 0.1]``, each in (0, 1)."""
    try:
        out = [float(x) for x in shares.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"shares must be numbers in (0, 1) like 0.02,0.1; got {shares!r}") from None
    if not out or not all(0 < s < 1 for s in out):
        raise ValueError(f"shares must be numbers in (0, 1) like 0.02,0.1; got {shares!r}")
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="8K and 32K, B = 1 and 8 (unless --sizes)")
    p.add_argument("--reps", type=int, default=60)
    p.add_argument("--versions", default="", help="also time these other decode kernels, e.g. 2 (CUDA cores)")
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    p.add_argument("--profile", choices=PROFILES, default="pooled",
                   help="block masses: the trace pooled (the run of record), per head from the trace, the "
                        "sparsity family (--shares), or heads of the long Gemma 3 captures (long-context)")
    p.add_argument("--shape", choices=tuple(SHAPES), default="llama8b")
    p.add_argument("--sizes", default=None, help="tokens[:batch],... e.g. 32768:1,131072:1,131072:8 or 32K,128K "
                                                 "(default 8K,32K,128K; --quick 8K,32K)")
    p.add_argument("--batches", default=None, help="batches for sizes given without one (default 1,8,32; "
                                                   "--quick 1,8)")
    p.add_argument("--shares", default=DEFAULT_SHARES, help="ideal τ 0.95 budgets of --profile sparsity")
    p.add_argument("--recent-blocks", type=int, default=2, help="heavy recent blocks of --profile sparsity")
    p.add_argument("--per-head", action="store_true", help="also PSA τ=0.95 with gqa='per_head'")
    p.add_argument("--speculate", type=float, default=SPECULATE, help="the speculative rows' margin")
    p.add_argument("--extra-chunks", type=int, default=None,
                   help="the speculative rows' chunks past the margin (DecodePlan(speculate_extra=N x step); "
                        "default one step)")
    p.add_argument("--skip", default="", help=f"rows to leave out, of {','.join(SKIPPABLE)}")
    p.add_argument("--estimated-stop-margin", type=float, default=None,
                   help="the estimated-stop rows' margin: psa_ref.progressive.ESTIMATED_STOP_MARGIN for the run "
                        "(default its own, 1.25); the rows' names then end in ' xM'")
    p.add_argument("--kv", default=None, help="--profile real: captured trace .npz files, comma-separated (a layer "
                                             "cut from a 32K capture by benchmarks/slice_trace.py fits one call)")
    p.add_argument("--spread", action="store_true",
                   help="--profile real: request r replays the trace's r-th latest captured decode step, not every "
                        "request the step at T - 1 (a batch of different queries, as a model's; the requests a few "
                        "tokens apart, and SDPA, which reads the whole pool, then attends their unused tails: its "
                        "time stands, its error column does not)")
    return p


def first_chunk_label(first: str) -> str:
    """A first-chunk row's mode as its name shows it: ``"estimated_stop xM"`` where the run set another margin than
    psa_ref's own (``--estimated-stop-margin``), else the mode."""
    from psa_ref import progressive

    margin = progressive.ESTIMATED_STOP_MARGIN
    return f"{first} x{margin:g}" if first == "estimated_stop" and margin != ESTIMATED_STOP_MARGIN_OWN else first


def parse_args(argv=None) -> argparse.Namespace:
    """Parsed arguments with ``shape`` a ``Shape``, ``sizes`` ``[(T, B)]``, ``shares`` floats (sparsity),
    ``skip`` a set and ``versions`` ints. Bad values exit through the parser's error."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        batches = args.batches or ("1,8" if args.quick else "1,8,32")
        args.sizes = parse_sizes(args.sizes or ("8192,32768" if args.quick else "8192,32768,131072"), batches)
        args.shares = parse_shares(args.shares) if args.profile == "sparsity" else [None]
        args.versions = [int(v) for v in args.versions.split(",") if v.strip()]
    except ValueError as exc:
        parser.error(str(exc))
    args.skip = {x.strip() for x in args.skip.split(",") if x.strip()}
    if args.skip - set(SKIPPABLE):
        parser.error(f"--skip takes {','.join(SKIPPABLE)}; got {','.join(sorted(args.skip - set(SKIPPABLE)))}")
    if args.reps < 1:
        parser.error(f"--reps must be >= 1, got {args.reps}")
    if args.speculate <= 0:
        parser.error(f"--speculate must be > 0, got {args.speculate}")
    if args.estimated_stop_margin is not None and not args.estimated_stop_margin > 0:
        parser.error(f"--estimated-stop-margin must be > 0, got {args.estimated_stop_margin}")
    if args.extra_chunks is not None and args.extra_chunks < 0:
        parser.error(f"--extra-chunks must be >= 0, got {args.extra_chunks}")
    if args.recent_blocks < 0:
        parser.error(f"--recent-blocks must be >= 0, got {args.recent_blocks}")
    if (args.profile == "real") != (args.kv is not None):
        parser.error("--profile real takes its K/V from --kv PATH (a captured trace), and --kv needs --profile real")
    if args.spread and args.profile != "real":
        parser.error("--spread replays captured decode steps: it needs --profile real")
    args.shape = SHAPES[args.shape]
    return args


def out_stem(profile: str, shape: Shape, *, spread: bool = False) -> str:
    """File stem of a run's rows: ``bench_decode`` (trace pooled, Llama, the run of record),
    ``bench_decode_per_head`` (Llama), else ``bench_decode_<profile>_<shape>`` (``_spread`` after it with
    ``--spread``)."""
    if shape.name == "llama8b" and profile in ("pooled", "per-head"):
        return "bench_decode" + ("" if profile == "pooled" else "_per_head")
    return f"bench_decode_{profile.replace('-', '_')}_{shape.name}" + ("_spread" if spread else "")


def format_row(r: dict) -> str:
    """One printed line of a JSONL record."""
    head = f"  {r['T']:>6} {r['B']:>3}" + (f" {100 * r['share']:4.1f}%" if r.get("share") is not None else "")
    if "breakdown_us" in r:
        return (f"{head} {r.get('of', 'PSA τ=0.95')} stages alone (µs): "
                + ", ".join(f"{k} {v:.1f}" for k, v in r["breakdown_us"].items()))
    if "skipped" in r:
        return f"{head} {r['skipped']:<38} skipped: {r['reason']}"
    if "ideal" in r and "method" not in r:
        return (f"{head} ideal τ={TAU_IDEAL} share measured on the cache: mean {100 * r['ideal']:.1f}% of blocks, "
                f"p90 {100 * r['ideal_p90']:.1f}% (profiles: {100 * r['ideal_profile']:.1f}%)"
                if r.get("ideal_profile") is not None else
                f"{head} ideal τ={TAU_IDEAL} share measured on the cache: mean {100 * r['ideal']:.1f}% of blocks, "
                f"p90 {100 * r['ideal_p90']:.1f}%")
    return (f"{head} {r['method']:<38} {r['us']:9.1f} us  floor {r['floor_us']:7.1f} us  x{r['step_floor']:5.2f} "
            f"floor  {r['gbs']:6.0f} GB/s  x{r['speedup']:.2f} SDPA  read {100 * r['frac']:5.1f}%  "
            f"err {r['err']:.4f} {r['note']}")


def table(rows: list[dict], ceiling_gbs: float) -> str:
    """The markdown table printed last."""
    lines = ["| shape | share | T | B | method | median µs | floor µs | step ÷ floor | GB/s "
             f"| % of {ceiling_gbs:.0f} "
             "| vs SDPA | blocks read | ideal τ 0.95 | rel. error |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        share = "—" if r.get("share") is None else f"{100 * r['share']:g}%"
        lines.append(f"| {r['shape']} | {share} | {r['T'] // 1024}K | {r['B']} | {r['method']} | {r['us']:.1f} | "
                     f"{r['floor_us']:.1f} | {r['step_floor']:.2f} | {r['gbs']:.0f} | {100 * r['pct']:.0f}% | "
                     f"{r['speedup']:.2f}× | {100 * r['frac']:.1f}% | {100 * r['ideal']:.1f}% | {r['err']:.4f} |")
    return "\n".join(lines)


def report(rows: list[dict], ceiling_gbs: float) -> str:
    """The table printed last, then, where the run has top-k at a PSA row's error, each such PSA row beside it
    (``plot_topk_line.ratio_table``: issue 14's line, PSA faster than top-k at equal error, is a ratio below 1)."""
    from plot_topk_line import ratio_table

    text = table(rows, ceiling_gbs)
    versus = ratio_table(rows)
    if versus.count("\n") > 1:  # more than its two header lines
        text += "\n\nEach PSA row against top-k at that row's error (least ratio of a size and batch in bold):\n\n"
        text += versus
    return text


# --- timing -----------------------------------------------------------------------------------------

def median_us(fn_launch, stream, reps: int, rotate: int) -> float:
    import cupy

    starts = [cupy.cuda.Event() for _ in range(reps)]
    ends = [cupy.cuda.Event() for _ in range(reps)]
    for i in range(reps):
        starts[i].record(stream)
        fn_launch(i % rotate)
        ends[i].record(stream)
    ends[-1].synchronize()
    return float(np.median([cupy.cuda.get_elapsed_time(a, b) * 1e3 for a, b in zip(starts, ends)]))


def capture(run, stream):
    """A CUDA graph of ``run()`` on ``stream`` (CuPy stream capture). If ``run`` raises, the capture is
    ended (and dropped) so that the stream stays usable for the next rows."""
    stream.begin_capture()
    try:
        run()
    except BaseException:
        try:
            stream.end_capture()
        except Exception:
            pass
        raise
    return stream.end_capture()


def kv_layer_bytes(shape: Shape, t: int, b: int) -> int:
    """Bytes of one layer's float16 K and V for ``b`` requests of ``t`` tokens of ``shape`` (whole blocks)."""
    return b * shape.hkv * -(-t // shape.s) * shape.s * shape.d * 2 * 2


def meta_layer_bytes(shape: Shape, t: int, b: int) -> int:
    """Bytes of one layer's ``cuboid_mean`` metadata (two float16 vectors a block and KV head) for ``b`` requests
    of ``t`` tokens of ``shape``."""
    return b * shape.hkv * -(-t // shape.s) * 2 * shape.d * 2


def rotating_layers(shape: Shape, t: int, b: int) -> int:
    """Layers of ``b`` requests of ``t`` tokens of ``shape`` to rotate over, so that a timed call reads from HBM,
    not L2: at least 4x L2 in all of K/V and of the estimate's metadata, at least 2 and at most ``PER_GRAPH`` (the
    calls one graph takes in turn). A decoder's other layers (and its weights) leave none of a layer's metadata in
    L2 by its next step; rotating over K/V alone, one request at 32K took two layers whose metadata stayed in L2,
    and PSA's step measured 5-12% faster than over 32 layers (benchmarks/NOTES.md, twenty-fifth session)."""
    kv = -(-4 * L2_BYTES // kv_layer_bytes(shape, t, b))
    meta = -(-4 * L2_BYTES // meta_layer_bytes(shape, t, b))
    return min(PER_GRAPH, max(2, kv, meta))


def random_cache(shape: Shape, t: int, b: int, layers: int, rng, *, summaries: bool = False):
    """A ``psa_fast.PagedKVCache`` of ``layers`` layers of ``b`` requests of ``t`` tokens of ``shape``, every request
    full, its K/V (and with ``summaries`` its block summaries) drawn standard normal from the CuPy generator ``rng``,
    a layer at a time (a float32 draw of a whole long-cache pool may not fit): for kernels that read whatever the
    blocks hold (dense; an order written by hand)."""
    import cupy

    import psa_fast

    cache = psa_fast.PagedKVCache(num_layers=layers, batch=b, num_kv_heads=shape.hkv, head_dim=shape.d, max_tokens=t,
                                  block_size=shape.s)
    for pool in (cache.k_pool, cache.v_pool) + ((cache.meta,) if summaries else ()):
        per_layer = pool.reshape(layers, -1)
        for layer in range(layers):
            per_layer[layer] = rng.standard_normal(per_layer.shape[1], dtype=cupy.float32).astype(pool.dtype)
    cache.seq_lens[...] = t
    cache.host_lens[...] = t
    return cache


def per_call_us(fn, layers: int, stream, reps: int) -> float:
    """Median device µs per call of ``fn(layer)``: PER_GRAPH calls, the layers in turn, captured in one CUDA graph
    (as a decoder captures a step of all its layers). A graph of one call would also time the host's launch
    latency (~3.5 µs, more than some stages take)."""
    def calls():
        for i in range(PER_GRAPH):
            fn(i % layers)
    gr = capture(calls, stream)
    gr.launch(stream)
    return median_us(lambda i: gr.launch(stream), stream, reps, 1) / PER_GRAPH


def run_file(path: str):
    """``path`` opened for a run's output: a fresh file, or appended to where the run is a later one of an
    ``exp_kernels_attr.py`` process (``PSA_KERNELS_ATTR_RUN`` > 0), so that every value's rows are kept."""
    return open(path, "a" if int(os.environ.get("PSA_KERNELS_ATTR_RUN", "0")) > 0 else "w")


def run_tags() -> dict:
    """The ``exp_kernels_attr.py`` values this run was made with, ``{"kernels_attr": "NAME = value; ..."}``, if any."""
    attr = os.environ.get("PSA_KERNELS_ATTR")
    return {"kernels_attr": attr} if attr else {}


def copy_ceiling_gbs(stream) -> float:
    import cupy

    with stream:
        a = cupy.empty(2**31, cupy.uint8)
        b = cupy.empty_like(a)
        b[...] = a
        t = median_us(lambda i: cupy.copyto(b, a), stream, 10, 1)
    return 2 * a.nbytes / t / 1e3


_READ_SOURCE = r"""
extern "C" __global__ void psa_bench_read(const uint4* __restrict__ x, long long n, unsigned int* out) {
    unsigned int acc = 0u;
    const long long stride = (long long)gridDim.x * blockDim.x;
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + 3 * stride < n; i += 4 * stride) {  // four 16-byte loads in flight a thread
        const uint4 a = __ldcs(x + i), b = __ldcs(x + i + stride);
        const uint4 c = __ldcs(x + i + 2 * stride), d = __ldcs(x + i + 3 * stride);
        acc ^= a.x ^ b.y ^ c.z ^ d.w ^ a.w ^ b.z ^ c.y ^ d.x;
    }
    for (; i < n; i += stride) acc ^= __ldcs(x + i).x;
    if (acc == 0x9e3779b9u) out[0] = acc;  // keeps the loads; (almost) never writes
}
"""


def read_ceiling_gbs(stream) -> float:
    """HBM read-only bandwidth: 2 GiB streamed once by every SM, no writes (a decode step only reads its KV, so
    SDPA can beat the copy ceiling, whose half of the traffic is writes). Median of 10, CUDA events."""
    import cupy

    from psa_fast import _kernels

    fn = cupy.RawKernel(_READ_SOURCE, "psa_bench_read")
    with stream:
        a = cupy.zeros(2**31, cupy.uint8)
        out = cupy.zeros(1, cupy.uint32)
        n = np.int64(a.nbytes // 16)
        blocks = 8 * _kernels.num_sms()
        t = median_us(lambda i: fn((blocks,), (256,), (a, n, out)), stream, 10, 1)
    return a.nbytes / t / 1e3


def rel_err(out, ref) -> float:
    import cupy

    o, r = out.astype(cupy.float64), ref.astype(cupy.float64)
    return float((cupy.linalg.norm(o - r, axis=-1) / cupy.linalg.norm(r, axis=-1)).mean())


TOPK_FACTORS = (1.25, 1.5, 2, 3, 4, 6, 8, 12, 16)  # the grid of multiples of PSA's budget that brackets top-k's k


def equal_error_k(err_of, target: float, k_budget: int, n: int, factors=TOPK_FACTORS) -> int:
    """Top-k's ``k`` at an error of at most ``target`` (PSA's): the grid ``k_budget x factors`` brackets it (or
    ``[1, k_budget]`` where ``k_budget`` already meets it), then a bisection between a ``k`` above the target and
    one at or below it returns a ``k`` whose error is at most ``target`` and whose ``k - 1`` (or the bracket's lower
    end) is above it: the smallest such ``k`` wherever the error falls with ``k``. ``n`` (every block) if none on the
    grid meets it. ``err_of(k)`` is top-k's mean relative error at ``k``; each ``k`` is asked once. (Until the sixtieth
    session the first grid point that met the target was taken: up to 25% more blocks than top-k needs.)"""
    seen = {}

    def err(k):
        if k not in seen:
            seen[k] = err_of(k)
        return seen[k]

    if err(k_budget) <= target:
        lo, hi = 0, k_budget  # lo: a k known to miss the target (0: none)
    else:
        lo, hi = k_budget, None
        for factor in factors:
            k = min(n, int(round(k_budget * factor)))
            if err(k) <= target or k == n:
                hi = k
                break
            lo = k
        if hi is None:
            return n
        if err(hi) > target:  # every block and still above: nothing to bisect
            return hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if err(mid) <= target:
            hi = mid
        else:
            lo = mid
    return hi


def measured_ideal_share(cache, qs, scale: float, tau: float = TAU_IDEAL) -> tuple[float, float]:
    """``(mean, p90)`` over every layer, request and query head of the ideal ``tau`` budget as a share of
    the blocks, from the true logits ``scale * K q`` of the filled cache (on the GPU, one (layer, request,
    KV head) at a time: ``T x D`` float32 keys)."""
    import cupy

    from psa_fast.synthetic import ideal_share_of_logits

    L, b, hkv, n, s, d = cache.num_layers, cache.batch, cache.num_kv_heads, cache.nmax, cache.block_size, cache.head_dim
    kviews = cache.k_pool.reshape(L, b, hkv, n * s, cache.dp)
    shares = []
    for layer, q in enumerate(qs):
        g = q.shape[1] // hkv
        for r in range(b):
            t = int(cache.host_lens[layer, r])
            for kv in range(hkv):
                k = kviews[layer, r, kv, :t, :d].astype(cupy.float32)  # [T, D]
                logits = scale * (q[r, kv * g : (kv + 1) * g].astype(cupy.float32) @ k.T)  # [g, T]
                shares.append(ideal_share_of_logits(logits, s, tau))
                del k, logits
    shares = cupy.asnumpy(cupy.concatenate(shares))
    return float(shares.mean()), float(np.percentile(shares, 90))


# --- one (size, batch, data) ------------------------------------------------------------------------

def bench_size(shape: Shape, t: int, b: int, fill, reps: int, stream, log, *, ceiling_gbs: float,
               skip=frozenset(), per_head: bool = False, tags: dict | None = None,
               speculate: tuple[float, int | None] = (SPECULATE, None)) -> list[dict]:
    """Every row for ``b`` requests of ``t`` tokens of ``shape``; the speculative rows with ``speculate = (margin,
    chunks past it)`` (``DecodePlan(speculate=margin, speculate_extra=chunks x step)``; None: one step).

    ``fill(cache, layer) -> q`` writes one layer of a ``PagedKVCache`` (to capacity) and returns its
    queries ``[B, Hq, D]`` float16: the data. It is called for every layer of the cache, and again for a
    second cache with ``metadata="quant3"`` (the sketch row), so it must give the same K/V for the same
    layer (``fill_skewed`` seeds by layer; a replay of captured K/V would copy them in)."""
    import cupy
    import torch

    rows = _rows(shape, t, b, fill, reps, stream, log, ceiling_gbs=ceiling_gbs, skip=skip, per_head=per_head,
                 tags=tags, speculate=speculate)
    cupy.get_default_memory_pool().free_all_blocks()  # every cache and plan of the size is gone with _rows' frame
    torch.cuda.empty_cache()
    return rows


def _rows(shape: Shape, t: int, b: int, fill, reps: int, stream, log, *, ceiling_gbs: float, skip, per_head: bool,
          tags: dict | None, speculate: tuple[float, int | None] = (SPECULATE, None)) -> list[dict]:
    import cupy
    import torch

    import psa_fast
    from psa_fast import _kernels

    n = -(-t // shape.s)
    layers = rotating_layers(shape, t, b)
    tags = dict(tags or {}, shape=shape.name)
    hq, hkv, s = shape.hq, shape.hkv, shape.s
    rows = []

    def attempt(name, fn):
        """``fn()``, or None with the reason logged when this shape or size cannot run it."""
        try:
            return fn()
        except Exception as exc:  # e.g. NotImplementedError for a shape, a compile error, out of memory
            msg = str(exc).strip().splitlines()
            log(dict(T=t, B=b, **tags, skipped=name, reason=f"{type(exc).__name__}: {msg[0] if msg else ''}"[:300]))
            return None

    with stream:
        cache = psa_fast.PagedKVCache(num_layers=layers, batch=b, num_kv_heads=hkv, head_dim=shape.d, max_tokens=t,
                                      block_size=s)
        if cache.dp != shape.d:
            raise NotImplementedError(f"head dim {shape.d} is padded to {cache.dp}: SDPA's view of the pool needs D "
                                      "of 16, 32, 64, 128 or 256")
        qs = [fill(cache, layer) for layer in range(layers)]
        assert cache.nmax == n
        ideal, ideal_p90 = measured_ideal_share(cache, qs, shape.logit_scale)
        log(dict(T=t, B=b, **tags, ideal=ideal, ideal_p90=ideal_p90))

        def graph_us(fn):
            return per_call_us(fn, layers, stream, reps)

        def timed(plan_obj):
            """(median µs, outputs per layer, mean blocks read per (request, KV head))."""
            outs, reads = [], []
            for layer in range(layers):  # warm-up (compiles) and results
                dec = plan_obj.run(qs[layer], layer)
                outs.append(cupy.array(dec.out))
                used = None if dec.order is None else cupy.asnumpy(dec.num_read)  # speculated blocks too
                reads.append(n if used is None else blocks_read_per_kv_head(cupy.asnumpy(dec.order), used, hkv))
            return graph_us(lambda layer: plan_obj.run(qs[layer], layer)), outs, float(np.mean(reads))

        def stage_times(p, total):
            """Each stage before the attention alone; the attention is the rest of the step (replayed
            alone, it would attend with whichever layer's order was computed last)."""
            parts = {name: graph_us(fn) for name, fn in (
                ("query", lambda layer: p.load_query(qs[layer], layer)), ("estimate", p.estimate), ("order", p.order))}
            parts["attend (rest of the step)"] = total - sum(parts.values())
            return parts

        # torch SDPA on the same memory: the resident pool is [L, B, Hkv, T, D] when T = Nmax * S
        tstream = torch.cuda.ExternalStream(stream.ptr)
        kviews = cache.k_pool.reshape(layers, b, hkv, n * s, shape.d)
        vviews = cache.v_pool.reshape(layers, b, hkv, n * s, shape.d)
        tk = [torch.from_dlpack(kviews[layer]) for layer in range(layers)]
        tv = [torch.from_dlpack(vviews[layer]) for layer in range(layers)]
        tq = [torch.from_dlpack(q).unsqueeze(2) for q in qs]

        def sdpa(layer):
            return torch.nn.functional.scaled_dot_product_attention(tq[layer], tk[layer], tv[layer], enable_gqa=True,
                                                                    scale=shape.logit_scale)

        with torch.cuda.stream(tstream):
            sdpa_outs = [cupy.from_dlpack(sdpa(layer).squeeze(2).float().contiguous()) for layer in range(layers)]
            tgraph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(tgraph, stream=tstream):
                for i in range(PER_GRAPH):
                    sdpa(i % layers)
            tgraph.replay()
            us_sdpa = median_us(lambda i: tgraph.replay(), stream, reps, 1) / PER_GRAPH

        kv_floor = floor_bytes(shape, t=t, b=b)  # SDPA and dense read the whole KV

        def row(method, us, nbytes, err, read=None, launches=0, extra=""):
            fl = floor_us(nbytes, ceiling_gbs)
            r = dict(T=t, B=b, **tags, method=method, us=us, floor_bytes=nbytes, floor_us=fl, step_floor=us / fl,
                     gbs=nbytes / us / 1e3, pct=nbytes / us / 1e3 / ceiling_gbs, speedup=us_sdpa / us, err=err,
                     frac=(read / n if read is not None else 1.0), ideal=ideal, launches=launches, note=extra)
            rows.append(r)
            log(r)

        dense_plan = attempt("psa_fast dense", lambda: psa_fast.plan(cache, num_q_heads=hq, mode="dense",
                                                                      scale=shape.scale))
        dense = attempt("psa_fast dense", lambda: timed(dense_plan)) if dense_plan is not None else None
        refs = dense[1] if dense is not None else sdpa_outs  # errors against psa_fast dense, else SDPA

        def mean_err(outs):
            return float(np.mean([rel_err(o, r) for o, r in zip(outs, refs)]))

        row("torch SDPA", us_sdpa, kv_floor, mean_err(sdpa_outs), launches=1)
        if dense is not None:
            split = getattr(dense_plan, "splits", None)
            row("psa_fast dense", dense[0], kv_floor, mean_err(dense[1]), launches=3,
                extra=f"cluster {dense_plan.cluster}" + (f", splits {split}" if split else ""))
        for v in VERSIONS:
            got = attempt(f"psa_fast dense (decode v{v})", lambda v=v: timed(
                psa_fast.plan(cache, num_q_heads=hq, mode="dense", version=v, scale=shape.scale)))
            if got is not None:
                row(f"psa_fast dense (decode v{v})", got[0], kv_floor, mean_err(got[1]), launches=3)

        # the loop's rows: the plan's step="auto" (_kernels.pick_step); until 2026-12-02 the runs of record took
        # max(8 x cluster, blocks / 64): 64 / 128 / 128 at Llama's 32K B = 1, 128K B = 1 and 8 (benchmarks/NOTES.md)
        step = "auto"
        spec_step = _kernels.spec_step(n)  # speculate: one CTA a chunk of a few blocks a warp
        margin, extra_chunks = speculate
        spec_extra = None if extra_chunks is None else extra_chunks * spec_step
        spec_name = f"speculate {margin}" + ("" if extra_chunks is None else f" +{extra_chunks} chunks")

        def psa_floor(read, groups=hkv, metadata="cuboid_mean", passes=0):
            return floor_bytes(shape, t=t, b=b, blocks_read=read, metadata=metadata, groups=groups,
                               per_head_passes=passes)

        def topk_ladder(kv, targets, metadata="cuboid_mean"):
            """Top-k on ``kv`` at each target's budget, then at the ``k`` whose error is the target's
            (``equal_error_k``: a grid of multiples of the budget, then a bisection on the error alone): rows
            "top-k k=K (NAME budget)" and "top-k k=K (error ≤ NAME)", with "(quant3)" after "top-k" on a quant3
            cache. ``targets``: (name, error, blocks read) triples; each k is timed once, and only those two."""
            tag = "" if metadata == "cuboid_mean" else f" ({metadata})"
            timed_k, err_k = {}, {}

            def topk_plan(k):
                return psa_fast.plan(kv, num_q_heads=hq, mode="topk", k=k, scale=shape.scale)

            def topk(k):
                if k not in timed_k:
                    us, outs, _ = timed(topk_plan(k))
                    timed_k[k] = (us, mean_err(outs))
                return timed_k[k]

            def topk_err(k):  # the error alone: every layer's step once, no graph
                if k in timed_k:
                    return timed_k[k][1]
                if k not in err_k:
                    p = topk_plan(k)
                    err_k[k] = mean_err([cupy.array(p.run(qs[layer], layer).out) for layer in range(layers)])
                return err_k[k]

            for target, err_t, read_t in targets:
                k_budget = max(1, int(round(read_t)))
                us, err = topk(k_budget)
                row(f"top-k{tag} k={k_budget} ({target} budget)", us, psa_floor(k_budget, metadata=metadata), err,
                    k_budget, 5)
                k = equal_error_k(topk_err, err_t, k_budget, n)
                us_k, err_at_k = topk(k)
                row(f"top-k{tag} k={k} (error ≤ {target})", us_k, psa_floor(k, metadata=metadata), err_at_k, k, 5)

        psa = {}
        main_targets = []  # (name, error, blocks read) of the τ 0.95 rows on this cache that top-k is matched against

        def first_chunk_row(label, tau, passes, groups=hkv, **options):
            """A PSA row with a first chunk (``options`` for the plan), top-k matched against it as well."""
            got = attempt(label, lambda: timed(psa_fast.plan(cache, num_q_heads=hq, mode="psa", threshold=tau,
                                                             step=step, scale=shape.scale, **options)))
            if got is not None:
                us_f, outs_f, read_f = got
                row(label, us_f, psa_floor(read_f, groups=groups, passes=passes), mean_err(outs_f), read_f, 7)
                main_targets.append((label, mean_err(outs_f), read_f))
        for tau in (0.9, 0.95):
            if tau == 0.9 and "tau0.9" in skip:
                continue
            name = f"PSA τ={tau}"

            def run_psa(tau=tau):
                p = psa_fast.plan(cache, num_q_heads=hq, mode="psa", threshold=tau, step=step, scale=shape.scale)
                return p, timed(p)

            got = attempt(name, run_psa)
            if got is None:
                continue
            p, (us, outs, read) = got
            psa[tau] = (mean_err(outs), read)
            row(name, us, psa_floor(read), psa[tau][0], read, 5, f"stop {p.stop}, step {p.step}, cluster {p.cluster}")
            if tau != 0.95:
                continue
            main_targets.append((name,) + psa[tau])
            if "stages" not in skip:  # where the time goes: each stage alone
                parts = attempt(f"{name} stages", lambda p=p, us=us: stage_times(p, us))
                if parts is not None:
                    log(dict(T=t, B=b, **tags, breakdown_us=parts))
            if "remaining" not in skip:
                for v in [3] + VERSIONS:  # the paper's rule, and the other kernels (which implement it)
                    vname = f"PSA τ={tau} remaining" + (f" (decode v{v})" if v != 3 else "")
                    gotv = attempt(vname, lambda v=v: timed(psa_fast.plan(
                        cache, num_q_heads=hq, mode="psa", threshold=tau, step=step, stop="remaining", version=v,
                        scale=shape.scale)))
                    if gotv is not None:
                        usv, outsv, readv = gotv
                        row(vname, usv, psa_floor(readv), mean_err(outsv), readv, 5)
            # the first ranked chunk sized from the estimates (first_chunk): "predicted" by their mass share (the
            # per-head estimates written, read back by the suffix sums, which write their own: 3 passes),
            # "estimated_stop" where the rule holds on the estimated masses (read back by psa_estimated_stop: 2)
            for first, token, passes in (("predicted", "predicted", 3), ("estimated_stop", "estimated", 2)):
                if token in skip:
                    continue
                fname = f"{name} first chunk {first_chunk_label(first)}"
                first_chunk_row(fname, tau, passes, first_chunk=first)
                if first == "estimated_stop" and "sfirst" not in skip:  # the same chunk speculated in pieces
                    first_chunk_row(f"{fname}, speculated", tau, passes, first_chunk=first, speculate="first_chunk")
            if "speculate" not in skip:  # every predicted chunk at once, verified after (DecodePlan(speculate=...))
                sname = f"{name} {spec_name}"
                gots = attempt(sname, lambda: timed(psa_fast.plan(
                    cache, num_q_heads=hq, mode="psa", threshold=tau, step=spec_step, speculate=margin,
                    speculate_extra=spec_extra, scale=shape.scale)))
                if gots is not None:
                    uss, outss, reads = gots
                    row(sname, uss, psa_floor(reads, passes=3), mean_err(outss), reads, 8, f"step {spec_step}")
            if per_head:  # each query head its own order and stop; a KV block read once per KV head at best
                pname = f"{name} per_head"

                def run_per_head():
                    ph = psa_fast.plan(cache, num_q_heads=hq, mode="psa", threshold=tau, step=step,
                                       gqa="per_head", scale=shape.scale)
                    return ph, timed(ph)

                goth = attempt(pname, run_per_head)
                if goth is not None:
                    ph, (ush, outsh, readh) = goth
                    row(pname, ush, psa_floor(readh, groups=hq), mean_err(outsh), readh, 5,
                        f"stop {ph.stop}, step {ph.step}, cluster {ph.cluster}")
                    main_targets.append((pname, mean_err(outsh), readh))
                if "predicted" not in skip:  # each head's first chunk from its estimates: the busiest of many
                    # per-head groups decides less often (psa_ref, NOTES' fortieth session)
                    first_chunk_row(f"{pname} first chunk predicted", tau, 3, groups=hq, gqa="per_head",
                                    first_chunk="predicted")

        if "sketch" not in skip:
            # the default rule on metadata="quant3" (stop="auto" = "sketch_avg"): the same KV (same fill, same layers)
            # in a second cache with 3-bit codes, selection shared and per head
            def run_sketch():
                q3 = psa_fast.PagedKVCache(num_layers=layers, batch=b, num_kv_heads=hkv, head_dim=shape.d,
                                           max_tokens=t, block_size=s, metadata="quant3")
                for layer in range(layers):
                    fill(q3, layer)
                variants = [(gqa, spec, "estimate", None) for spec in (None, margin) for gqa in ("shared", "per_head")
                            if spec is None or "speculate" not in skip]
                if "rank" not in skip and hq > hkv:  # shared groups ranked by share (DecodePlan(rank="share"))
                    variants += [("shared", spec, "share", None) for spec in (None, margin)
                                 if spec is None or "speculate" not in skip]
                if "predicted" not in skip:  # the first ranked chunk from the estimates whose suffix sums this rule
                    # computes anyway (one more small launch): at the plan's step (pick_step's residual rule), at
                    # FIRST_STEP, and at the step the plan takes without it ("plain": on the per-head profiles
                    # psa_ref cuts the busiest group's iterations most there, NOTES' fortieth session)
                    variants += [("shared", None, "estimate", first) for first in ("plan", FIRST_STEP, "plain")]
                    variants += [("per_head", None, "estimate", first) for first in ("plan", "plain")]
                    if "rank" not in skip and hq > hkv:  # ... and with the share rank
                        variants += [("shared", None, "share", first) for first in ("plan", "plain")]
                plain_step = {}  # gqa -> the plan's step without a predicted chunk (the variants' first rows)
                targets = []  # (name, error, blocks read) of the rows top-k is matched against below
                for gqa, spec, rank, first in variants:
                    first_step = plain_step.get(gqa) if first == "plain" else first
                    name = ("PSA τ=0.95 sketch_avg (quant3)" + (" per_head" if gqa == "per_head" else "")
                            + (" rank share" if rank == "share" else "") + (f" {spec_name}" if spec else "")
                            + ("" if first is None else " first chunk predicted"
                               + {"plan": "", "plain": f" plain step {first_step}"}.get(first, f" step {first}")))
                    p3 = psa_fast.plan(q3, num_q_heads=hq, mode="psa", threshold=0.95,
                                       step=spec_step if spec else step if first in (None, "plan") else first_step,
                                       gqa=gqa, scale=shape.scale, speculate=spec, rank=rank,
                                       speculate_extra=spec_extra if spec else None,
                                       first_chunk=None if first is None else "predicted")
                    if first is None and spec is None and rank == "estimate":
                        plain_step[gqa] = p3.step
                    us3, outs3, read3 = timed(p3)
                    err3 = mean_err(outs3)
                    row(name, us3, psa_floor(read3, metadata="quant3", passes=3, groups=hq if gqa == "per_head"
                                             else hkv), err3, read3, 5,
                        f"stop {p3.stop}, metadata quant3, gqa {gqa}, step {p3.step}, cluster {p3.cluster}")
                    if spec is None and rank == "estimate":
                        targets.append((name, err3, read3))
                    if "stages" not in skip:
                        parts = attempt(name + " stages", lambda: stage_times(p3, us3))
                        if parts is not None:
                            log(dict(T=t, B=b, **tags, breakdown_us=parts, of=name))
                if "topk" not in skip:  # top-k on the same quant3 cache (its estimates rank the blocks) at each
                    # plain or predicted row's error: "PSA faster than top-k at equal error" for the default rule
                    topk_ladder(q3, targets, metadata="quant3")

            attempt("PSA τ=0.95 sketch_avg (quant3)", run_sketch)
            cupy.get_default_memory_pool().free_all_blocks()  # the quant3 cache is gone with run_sketch's frame

        if "topk" not in skip and main_targets:  # top-k at the error of each τ 0.95 row on this cache
            attempt("top-k", lambda: topk_ladder(cache, main_targets))
    return rows


# --- the data -----------------------------------------------------------------------------------------

def trace_fill(shape: Shape, offsets):
    """``fill(cache, layer)`` from the trace's block log-masses (pooled 1-D or per-head 2-D)."""
    from psa_fast.synthetic import fill_skewed

    return lambda cache, layer: fill_skewed(cache, layer, shape.hq, offsets, seed=layer)


def sparsity_fill(shape: Shape, share: float, recent_blocks: int, *, xp=None):
    """``fill(cache, layer)`` from ``sparsity_profiles``: one profile per (layer, request, KV head), each used
    once, so the mean ideal budget of the filled cache is the target's (up to whole blocks and the
    within-block spread). The profiles are drawn on the first call (NumPy, ~1 s per 100 heads at 8K blocks)
    and reused for the same cache dimensions (the sketch row's second cache). ``fill.profile_share`` is their
    mean ideal share. ``xp=numpy`` fills on the CPU (tests, with a stand-in cache)."""
    from psa_fast.synthetic import fill_skewed, ideal_share, sparsity_profiles

    made = {}

    def fill(cache, layer):
        key = (cache.num_layers, cache.batch, cache.num_kv_heads, cache.nmax)
        heads = cache.batch * cache.num_kv_heads
        if key not in made:
            made[key] = sparsity_profiles(cache.nmax, share, num_profiles=cache.num_layers * heads,
                                          recent_blocks=recent_blocks, seed=int(round(share * 1e4)))
            fill.profile_share = float(ideal_share(made[key]).mean())
        rows = made[key][layer * heads : (layer + 1) * heads]
        return fill_skewed(cache, layer, shape.hq, rows, seed=layer, positional=True, xp=xp)

    fill.profile_share = None
    return fill


def long_context_fill(shape: Shape, *, xp=None):
    """``fill(cache, layer)`` from ``long_context_profiles``: one profile per (layer, request, KV head), drawn on
    the first call for the cache's dimensions, as ``sparsity_fill`` does."""
    from psa_fast.synthetic import fill_skewed, long_context_profiles

    made = {}

    def fill(cache, layer):
        key = (cache.num_layers, cache.batch, cache.num_kv_heads, cache.nmax)
        heads = cache.batch * cache.num_kv_heads
        if key not in made:
            made[key] = long_context_profiles(cache.nmax, num_profiles=cache.num_layers * heads, seed=0)
        return fill_skewed(cache, layer, shape.hq, made[key][layer * heads : (layer + 1) * heads], seed=layer,
                           positional=True, xp=xp)

    return fill


def real_fill(shape: Shape, traces, *, xp=None, spread: bool = False):
    """``fill(cache, layer)`` from captured traces (``psa_ref.trace.Trace``): real keys, values and queries.

    Every request replays a captured decode step exactly: the query at position ``capacity - 1`` and the keys
    and values ``0..capacity - 1`` before it (so SDPA's view of the pool is that step's whole cache), request
    ``r`` from trace ``r mod len(traces)`` (several captures: requests of different texts), cache layer ``l``
    from that trace's layer ``l mod L``. ``spread``: request ``r`` replays instead its trace's
    ``(r // len(traces))``-th latest captured step below ``capacity`` (position ``p``, keys and values ``0..p``),
    so a batch holds different decode steps, as a model's batch does, rather than copies of one (a ragged batch a
    few tokens short of ``capacity``). ``xp=numpy`` fills a stand-in cache (tests).

    Raises:
        ValueError: a trace whose heads, head dim or logit scale are not ``shape``'s, or that has no query at
            position ``capacity - 1`` (benchmark sizes must be a captured position + 1, e.g. 32768).
    """
    if xp is None:
        import cupy as xp
    for tr in traces:
        _, _, hq, d = tr.q.shape
        hkv = tr.k.shape[1]
        if (hq, hkv, d) != (shape.hq, shape.hkv, shape.d) or not math.isclose(tr.scale, shape.logit_scale):
            raise ValueError(f"a trace has Hq {hq}, Hkv {hkv}, D {d}, scale {tr.scale:g}; --shape {shape.name} "
                             f"needs Hq {shape.hq}, Hkv {shape.hkv}, D {shape.d}, scale {shape.logit_scale:g}")

    def fill(cache, layer):
        t = cache.capacity
        q = xp.empty((cache.batch, shape.hq, shape.d), xp.float16)
        for r in range(cache.batch):
            tr = traces[r % len(traces)]
            positions = np.asarray(tr.positions)
            hit = np.flatnonzero(positions == t - 1)
            if hit.size == 0 or t > tr.k.shape[2]:
                raise ValueError(f"a trace has no query at position {t - 1} (its queries are at "
                                 f"{tr.positions.min()}..{tr.positions.max()}): use a size that is a captured "
                                 "position + 1, e.g. 32768")
            j = int(hit[0])
            if spread:  # the (r // len(traces))-th latest captured step at or below t - 1, cycling
                below = np.flatnonzero(positions <= t - 1)
                below = below[np.argsort(-positions[below], kind="stable")]
                j = int(below[(r // len(traces)) % below.size])
            li, p = layer % tr.q.shape[0], int(positions[j])
            cache.prefill(layer, r, xp.asarray(tr.k[li, :, : p + 1], dtype=xp.float16),
                          xp.asarray(tr.v[li, :, : p + 1], dtype=xp.float16))
            q[r] = xp.asarray(tr.q[li, j], dtype=xp.float16)
        return q

    return fill


def data_fill(shape: Shape, *, kv: str | None = None, spread: bool = False, per_head: bool = False,
              share: float | None = None):
    """The ``fill(cache, layer)`` a profiling script's data options name: captured traces (``kv``, comma-separated
    .npz paths; ``spread`` as ``real_fill``'s), the per-head profile (``per_head``: ``trace_fill`` of the shipped
    trace's block profiles) or drawn masses whose ideal τ 0.95 budget is about ``share`` (two recent blocks forced).
    Exactly one of them; a ValueError otherwise."""
    if (kv is not None) + per_head + (share is not None) != 1:
        raise ValueError("give one of kv (captured traces), per_head or share")
    if kv is not None:
        from psa_ref.trace import load_trace

        return real_fill(shape, [load_trace(path) for path in kv.split(",")], spread=spread)
    if per_head:
        from psa_fast.synthetic import trace_block_profiles

        return trace_fill(shape, trace_block_profiles(block_size=shape.s))
    return sparsity_fill(shape, share, recent_blocks=2)


def scatter_slots(cache, *, seed: int = 0, xp=None) -> None:
    """Move every block of ``cache`` to a random slot of its pool, data preserved: ``block_table`` is remapped,
    ``k_pool`` and ``v_pool`` permuted alike, the metadata (indexed by block, not slot) untouched. A fresh
    cache's table is the identity, so each request's blocks lie in order in memory and a kernel that walks them
    in order streams; a server's pool after many requests is scattered. ``xp=numpy`` for a stand-in cache.

    Needs a second pool's worth of free memory for a moment (one pool is copied at a time)."""
    if xp is None:
        import cupy as xp
    n = cache.k_pool.shape[0]
    perm = xp.asarray(np.random.default_rng(seed).permutation(n).astype(np.int32))
    for pool in (cache.k_pool, cache.v_pool):
        moved = xp.empty_like(pool)
        moved[perm] = pool
        pool[...] = moved
        del moved
    cache.block_table[...] = perm[cache.block_table]


def main(argv=None) -> None:
    args = parse_args(argv)

    import cupy

    from psa_fast.synthetic import trace_block_offsets, trace_block_profiles

    global CEILING_GBS, VERSIONS
    VERSIONS = args.versions
    if args.estimated_stop_margin is not None:  # read by psa_ref and by each plan made after this
        from psa_ref import progressive

        progressive.ESTIMATED_STOP_MARGIN = args.estimated_stop_margin
    shape = args.shape
    stream = cupy.cuda.Stream(non_blocking=True)
    measured = copy_ceiling_gbs(stream)
    print(f"device {cupy.cuda.runtime.getDeviceProperties(0)['name'].decode()}, copy ceiling measured "
          f"{measured:.0f} GB/s (DESIGN.md: {CEILING_GBS:.0f}); shape {shape.name} ({shape.about}: Hq {shape.hq}, "
          f"Hkv {shape.hkv}, D {shape.d}, S {shape.s}, scale {shape.logit_scale:g}), profile {args.profile}",
          flush=True)
    CEILING_GBS = measured
    base = None  # the trace's fill; the sparsity family makes one per share
    if args.profile == "pooled":
        base = trace_fill(shape, trace_block_offsets(block_size=shape.s))
    elif args.profile == "per-head":
        base = trace_fill(shape, trace_block_profiles(block_size=shape.s))
    elif args.profile == "long-context":
        base = long_context_fill(shape)
    elif args.profile == "real":
        from psa_ref.trace import load_trace

        base = real_fill(shape, [load_trace(path) for path in args.kv.split(",")], spread=args.spread)
    rows = []
    start = time.time()
    stem = out_stem(args.profile, shape, spread=args.spread)
    os.makedirs(args.out, exist_ok=True)
    run = run_tags()  # (the exp_kernels_attr.py values of this run, on every row)
    with run_file(os.path.join(args.out, f"{stem}.jsonl")) as f:
        def log(r):
            f.write(json.dumps({**run, **r}) + "\n")
            f.flush()
            print(format_row(r), flush=True)

        for t, b in args.sizes:
            for share in args.shares:
                fill = base if share is None else sparsity_fill(shape, share, args.recent_blocks)
                tags = dict(profile=args.profile, share=share)

                def log_tagged(r, fill=fill):
                    if share is not None and "ideal" in r and "method" not in r:
                        r["ideal_profile"] = fill.profile_share
                    log(r)

                rows += bench_size(shape, t, b, fill, args.reps, stream, log_tagged, ceiling_gbs=measured,
                                   skip=args.skip, per_head=args.per_head, tags=tags,
                                   speculate=(args.speculate, args.extra_chunks))
    print(f"\n{len(rows)} rows in {time.time() - start:.0f} s\n")
    text = report(rows, measured)
    with run_file(os.path.join(args.out, f"{stem}.md")) as f:
        f.write((f"<!-- {run['kernels_attr']} -->\n" if run else "") + text + "\n")
    print(text)


if __name__ == "__main__":
    main()
