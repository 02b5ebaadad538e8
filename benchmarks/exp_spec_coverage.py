"""How often the speculative schedule falls short on real attention, per layer (CPU, the reference).

``DecodePlan(speculate=m)`` attends at once the forced blocks, ``m`` times the ranked blocks the estimates predict
for tau (``predicted_first_chunk``) and ``step`` more; a group whose loop needs more resumes chunk by chunk (the
``psa_decode_resume`` launch, a cluster barrier a chunk). For captured queries of a trace this prints, per layer
and margin: the share of blocks the loop attends and the share speculated, how many queries fall short, and by how
many chunks. Each query runs against the whole captured cache (the last 32 queries of a 32K trace see up to 31 later
tokens: the statistics, not any single decision, are the point).

    python benchmarks/exp_spec_coverage.py /tmp/psa_long/gemma3_xml_32k.npz --margins 1.0,1.1,1.25,1.5 --extras 1,2,4
"""

from __future__ import annotations

import argparse
import math
import sys

import numpy as np


def coverage(trace, layer: int, queries, *, threshold: float, step: int, schedules, sink: int, recent: int):
    """Per query: (blocks the loop attends per group, {(margin, extra): blocks speculated per group}, blocks) for
    one layer of ``trace``; ``schedules`` are (margin, extra blocks) pairs."""
    import psa_ref
    from psa_ref.progressive import predicted_first_chunk
    from psa_ref.scoring import estimate, forced_blocks, group_rank_key, processing_order

    keys, values = trace.k[layer].astype(np.float32), trace.v[layer].astype(np.float32)
    blocks = psa_ref.KVBlocks.from_dense(keys, values, block_size=16, metadata="quant3")
    n = blocks.num_blocks
    g = trace.q.shape[2] // keys.shape[0]
    forced = forced_blocks(n, sink, recent)
    rows = []
    for j in queries:
        q = trace.q[layer, j].astype(np.float64)
        res = psa_ref.attention(q, blocks, threshold, scale=trace.scale, step=step, sink_blocks=sink,
                                recent_blocks=recent)
        scores = estimate(q, blocks, trace.scale)
        spec = {}
        used = []
        for grp in range(keys.shape[0]):
            s = scores[grp * g : (grp + 1) * g]
            order = processing_order(group_rank_key(s, blocks.block_lengths), forced)
            ahead = predicted_first_chunk(s, order, forced.size, blocks.block_lengths, threshold)
            for m, extra in schedules:
                spec.setdefault((m, extra), []).append(min(n, forced.size + math.ceil(m * ahead) + extra))
            used.append(len(res.blocks_used[grp]))
        rows.append((used, spec, n))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", help="a captured trace (.npz, psa_ref.trace)")
    ap.add_argument("--margins", default="1.0,1.5,2.0")
    ap.add_argument("--extras", default="1", help="chunks speculated past the margin (the GPU's: 1)")
    ap.add_argument("--threshold", type=float, default=0.95)
    ap.add_argument("--step", type=int, default=16, help="blocks a chunk (the model's default)")
    ap.add_argument("--last", type=int, default=32, help="the trace's last queries used")
    ap.add_argument("--sink", type=int, default=1)
    ap.add_argument("--recent", type=int, default=1)
    args = ap.parse_args()
    from tqdm import tqdm

    from psa_ref.trace import load_trace

    trace = load_trace(args.trace)
    schedules = [(float(m), int(e) * args.step) for m in args.margins.split(",") for e in args.extras.split(",")]
    queries = range(max(0, trace.q.shape[1] - args.last), trace.q.shape[1])
    layers = list(getattr(trace, "layers", range(trace.q.shape[0])))
    print(f"# {args.trace}: tau {args.threshold}, step {args.step}, {len(queries)} queries a layer, "
          f"sink {args.sink} + recent {args.recent}")
    print("| layer | attended % | margin | extra chunks | speculated % | queries short | chunks resumed (mean / max) |")
    print("|---|---|---|---|---|---|---|")
    for li in tqdm(range(len(layers)), desc="layers", file=sys.stderr):
        rows = coverage(trace, li, queries, threshold=args.threshold, step=args.step, schedules=schedules,
                        sink=args.sink, recent=args.recent)
        attended = np.mean([np.mean(u) / n for u, _, n in rows])
        for m, extra in schedules:
            spec = np.array([s[(m, extra)] for _, s, _ in rows])
            used = np.array([u for u, _, _ in rows])
            short = used > spec
            resumed = np.where(short, np.ceil((used - spec) / args.step), 0)
            print(f"| {layers[li]} | {100 * attended:.1f} | {m:g} | {extra // args.step} | "
                  f"{100 * np.mean(spec / rows[0][2]):.1f} | "
                  f"{short.any(axis=1).sum()} of {len(rows)} | {resumed.max(axis=1).mean():.1f} / "
                  f"{int(resumed.max())} |", flush=True)


if __name__ == "__main__":
    main()
