"""Where one attention decode step's GPU time goes, kernel by kernel: torch.profiler (CUPTI also sees CuPy's
launches) over repeated steps of one layer of captured K/V (bench_decode's ``--profile real`` data), of drawn
block masses (``--share``: bench_decode's ``--profile sparsity`` data) or of heads that differ as the shipped trace's
(``--per-head``: bench_decode's ``--profile per-head`` data, issue 14's per-head rows), for PSA variants and dense.
Prints, per variant, each kernel's launches per step, µs per launch and share of the step.

    python benchmarks/profile_decode_step.py --kv gemma3_xml_l17_32k.npz --shape gemma3 --size 32768 --batches 32,1
    python benchmarks/profile_decode_step.py --share 0.05 --shape llama8b --size 32768 --batches 1 --variants dense
    python benchmarks/profile_decode_step.py --per-head --shape llama8b --size 32768 --batches 1 --variants ema,topk

Variants (``--variants``, comma-separated): ``dense``; ``topk`` (``k = --topk`` blocks a group); ``NAME`` or
``NAME:sM`` with NAME ``default`` (the library's default rule on ``metadata="quant3"``), ``share`` (the same with
``rank="share"``) or ``ema`` (on ``cuboid_mean``), ``sM`` ``DecodePlan(speculate=M)`` and ``sfirst``
``DecodePlan(speculate="first_chunk")`` (with a ``+first`` or ``+stop`` variant, at the loop's step); ``default+first``,
``share+first`` and ``ema+first``: those with ``first_chunk="predicted"`` (the first ranked chunk from the estimates);
``ema+stop``: ``ema`` with ``first_chunk="estimated_stop"``.
Steps as in bench_decode: the loop's the plan's ``step="auto"``, speculating ``_kernels.spec_step`` (``max(16,
blocks / 256)``). The steps rotate over ``--layers`` layers of the same data (default: bench_decode's
``rotating_layers``, enough that K/V and metadata come from HBM, as in a decoder's step and the bench's rows; one
layer leaves a small shape's K/V in L2 between steps: its kernels then read faster than the bench's graph).
"""

from __future__ import annotations

import argparse
import collections
import json
import os

from bench_decode import SHAPES, data_fill, rotating_layers, run_file, run_tags, scatter_slots

VARIANT_RULES = ("default", "share", "ema", "default+first", "share+first", "ema+first", "ema+stop")
# the variants on metadata="quant3"; the others on "cuboid_mean"
QUANT3_VARIANTS = ("default", "share", "default+first", "share+first")


def parse_variants(text: str) -> list[tuple[str, float | str | None]]:
    """``"dense,default:s1.0,ema+stop:sfirst"`` -> ``[("dense", None), ("default", 1.0), ("ema+stop",
    "first_chunk")]``."""
    out = []
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        name, _, spec = item.partition(":")
        if name in ("dense", "topk") and not spec:
            out.append((name, None))
            continue
        if name not in VARIANT_RULES:
            raise ValueError(f"--variants: {name!r} is not dense, topk or one of {', '.join(VARIANT_RULES)}")
        if spec == "sfirst":
            if not name.endswith(("+first", "+stop")):
                raise ValueError(f"--variants: {item!r}: sfirst speculates the first ranked chunk, which only the "
                                 "+first and +stop variants have")
            out.append((name, "first_chunk"))
            continue
        if spec and not (spec.startswith("s") and spec[1:].replace(".", "", 1).isdigit()):
            raise ValueError(f"--variants: {item!r}: speculation is written sM (a margin, e.g. default:s1.0) or "
                             "sfirst")
        out.append((name, float(spec[1:]) if spec else None))
    if not out:
        raise ValueError("--variants names no variant")
    return out


def kernel_table(events, steps: int) -> list[dict]:
    """Per kernel name: launches per step, mean µs per launch and µs per step, heaviest first, from the
    profiler's CUDA events (each with ``name`` and ``device_time`` in µs)."""
    acc = collections.defaultdict(lambda: [0, 0.0])
    for e in events:
        acc[e.name][0] += 1
        acc[e.name][1] += e.device_time
    rows = [dict(kernel=k, per_step=n / steps, us_per_launch=t / n, us_per_step=t / steps) for k, (n, t) in acc.items()]
    total = sum(r["us_per_step"] for r in rows) or 1.0
    for r in rows:
        r["share"] = r["us_per_step"] / total
    return sorted(rows, key=lambda r: -r["us_per_step"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kv", default=None, help="captured trace .npz files, comma-separated (bench_decode --kv)")
    ap.add_argument("--spread", action="store_true",
                    help="with --kv: each request replays another captured step (bench_decode.real_fill(spread=True)) "
                         "instead of copies of the last one")
    ap.add_argument("--scatter", action="store_true",
                    help="move every block to a random slot after the fill (bench_decode.scatter_slots): a "
                         "server's scattered pool instead of a fresh cache's blocks in order")
    ap.add_argument("--share", type=float, default=None,
                    help="instead of --kv: drawn block masses whose ideal τ 0.95 budget is about this share")
    ap.add_argument("--per-head", action="store_true",
                    help="instead of --kv: block masses whose heads differ as the shipped trace's (bench_decode "
                         "--profile per-head)")
    ap.add_argument("--shape", default="gemma3", choices=sorted(SHAPES))
    ap.add_argument("--size", type=int, default=32768, help="tokens (with --kv: a captured position + 1)")
    ap.add_argument("--batches", default="32,1")
    ap.add_argument("--variants", default="dense,default:s1.0,default:s2.0,default,ema:s2.0")
    ap.add_argument("--topk", type=int, default=333, help="blocks a group of the topk variant")
    ap.add_argument("--extra-chunks", type=int, default=None,
                    help="speculative variants: DecodePlan(speculate_extra=N x step) (default: one step)")
    ap.add_argument("--steps", type=int, default=20, help="profiled steps per variant (after 3 warm-up steps)")
    ap.add_argument("--layers", type=int, default=None,
                    help="layers the steps rotate over (default: bench_decode.rotating_layers; 1: the same layer "
                         "every step, as before 2026-12-04)")
    ap.add_argument("--warps", type=int, default=None, help="PSA variants: DecodePlan(warps=...) (default: the plan's)")
    ap.add_argument("--stages", type=int, default=None,
                    help="PSA variants: DecodePlan(stages=...), the prefetch ring's depth a warp (default: the plan's)")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--no-profiler", action="store_true",
                    help="time the steps only, without torch.profiler (under ncu, which also needs CUPTI)")
    args = ap.parse_args()
    variants = parse_variants(args.variants)
    if (args.kv is not None) + (args.share is not None) + args.per_head != 1:
        ap.error("give the data: one of --kv TRACES, --share S or --per-head")
    if args.layers is not None and args.layers < 1:
        ap.error(f"--layers must be >= 1, got {args.layers}")
    if args.warps is not None and args.warps < 1:
        ap.error(f"--warps must be >= 1, got {args.warps}")
    if args.stages is not None and args.stages < 2:
        ap.error(f"--stages must be >= 2 (a prefetch ring), got {args.stages}")

    import cupy
    import torch

    import psa_fast
    from psa_fast import _kernels

    shape = SHAPES[args.shape]
    fill = data_fill(shape, kv=args.kv, spread=args.spread, per_head=args.per_head, share=args.share)
    path = os.path.join(args.out, f"profile_decode_step_{shape.name}.jsonl")
    tags = run_tags()  # (the exp_kernels_attr.py values of this run, on every row)
    with run_file(path) as log:
        for b in (int(x) for x in args.batches.split(",")):
            layers = args.layers or rotating_layers(shape, args.size, b)
            caches, qs = {}, {}
            for metadata in sorted({"quant3" if v in QUANT3_VARIANTS else "cuboid_mean" for v, _ in variants}):
                caches[metadata] = psa_fast.PagedKVCache(num_layers=layers, batch=b, num_kv_heads=shape.hkv,
                                                         head_dim=shape.d, max_tokens=args.size, block_size=shape.s,
                                                         metadata=metadata)
                qs[metadata] = [fill(caches[metadata], layer) for layer in range(layers)]
                if args.scatter:
                    scatter_slots(caches[metadata])
            n = caches[next(iter(caches))].nmax
            step = "auto"  # the loop: the plan's pick (until 2026-12-02: max(8 x cluster, blocks / 64))
            spec_step = _kernels.spec_step(n)  # speculating: chunks of a few blocks a warp, one CTA each
            for name, spec in variants:
                margin = isinstance(spec, float)  # (speculate="first_chunk" runs at the loop's step)
                metadata = "quant3" if name in QUANT3_VARIANTS else "cuboid_mean"
                cache, q = caches[metadata], qs[metadata]
                if name == "dense":
                    p = psa_fast.plan(cache, num_q_heads=shape.hq, mode="dense", scale=shape.scale)
                elif name == "topk":
                    p = psa_fast.plan(cache, num_q_heads=shape.hq, mode="topk", k=args.topk, scale=shape.scale)
                else:
                    p = psa_fast.plan(cache, num_q_heads=shape.hq, mode="psa", threshold=0.95, scale=shape.scale,
                                      stop="ema" if name.startswith("ema") else "auto",
                                      rank="share" if name.startswith("share") else "estimate",
                                      first_chunk=("predicted" if name.endswith("+first") else
                                                   "estimated_stop" if name.endswith("+stop") else None),
                                      step=spec_step if margin else step, speculate=spec,
                                      speculate_extra=(None if not margin or args.extra_chunks is None
                                                       else args.extra_chunks * spec_step),
                                      warps=args.warps, stages=args.stages)

                def run(i, p=p, q=q):  # step i: layer i % layers
                    return p.run(q[i % layers], i % layers)

                for i in range(3):  # compiles, warms up
                    dec = run(i)
                read = f"attends {100 * float(dec.num_used.mean()) / n:.1f}% of the blocks"
                if dec.num_speculated is not None:
                    read += f", reads {100 * float(dec.num_read.mean()) / n:.1f}%"
                cupy.cuda.Device().synchronize()
                start, end = cupy.cuda.Event(), cupy.cuda.Event()
                start.record()
                for i in range(args.steps):
                    run(i)
                end.record()
                end.synchronize()
                wall_us = cupy.cuda.get_elapsed_time(start, end) * 1e3 / args.steps
                if args.no_profiler:
                    print(f"T={args.size} B={b} {name} {spec}: {wall_us:.1f} µs a step back to back; {read}",
                          flush=True)
                    continue
                with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                    for i in range(args.steps):
                        run(i)
                    cupy.cuda.Device().synchronize()
                events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
                rows = kernel_table(events, args.steps)
                label = (name + (f" k={args.topk}" if name == "topk" else "") + (f" speculate {spec}" if spec else "")
                         + (f" +{args.extra_chunks} chunks" if margin and args.extra_chunks is not None else "")
                         + (" scattered" if args.scatter else "")
                         + (f" {args.warps or 'plan'} warps x {args.stages or 'plan'} stages"
                            if name not in ("dense", "topk") and (args.warps or args.stages) else "")
                         + (" spread" if args.spread else ""))
                gpu_us = sum(r["us_per_step"] for r in rows)
                print(f"\nT={args.size} B={b} {label}: {wall_us:.1f} µs a step back to back (CUDA events), "
                      f"{gpu_us:.1f} µs of kernels; step {p.step}; {layers} layers in turn; {read}", flush=True)
                for r in rows:
                    print(f"  {r['kernel'][:48]:<48} {r['per_step']:5.1f}/step {r['us_per_launch']:8.1f} µs "
                          f"{r['us_per_step']:8.1f} µs/step {100 * r['share']:5.1f}%", flush=True)
                    log.write(json.dumps(dict(**tags, T=args.size, B=b, variant=label, wall_us=wall_us, layers=layers,
                                              **r)) + "\n")
                log.flush()
            del caches, qs
            cupy.get_default_memory_pool().free_all_blocks()


if __name__ == "__main__":
    main()
