"""Would a queue of chunk pieces let the decode follow the blocks (CPU model; issue 14, item 5)?

For each request of a captured layer (one KV head: one group a request), psa_ref's loop with the share rank and the
predicted first chunk gives the chunks a group attends: the forced blocks with the predicted first chunk, then
``--step`` blocks at a time until the stop. A batch of ``--batch`` consecutive queries (as ``bench_decode --spread``
replays them) is then scheduled on ``--ctas`` CTAs two ways, in one fluid model of the GPU's bandwidth:

* ``grid`` (today's grid build): group ``g`` owns its share of the CTAs for the whole launch; a chunk is split among
  them; when they are all done the group decides (``--decide`` µs: barrier, decision, hand-back) and the next chunk
  starts; a CTA whose group has stopped idles.
* ``queue``: every CTA takes pieces of ``--piece`` blocks of any group's current chunk (the group with the most blocks
  still to read first), each claim costing ``--claim`` µs; a group's next chunk enters the queue ``--decide-queue`` µs
  after its last piece is done (the last CTA's hand-over and decision), so other groups' pieces fill the wait.

Every CTA streams its blocks (``Gpu.block_bytes``, 16 KiB: Gemma 3's K and V of a block) at ``min(cap, ceiling /
streaming CTAs)``, ``cap`` being ``--cta-cap`` times its even share of the copy ceiling: the GPU is at its ceiling
while enough CTAs stream (s46's loop clock saw 2.4-3.0 TB/s with every group streaming) and a lone CTA cannot take it
all. Both schedules pay ``Gpu.start`` before and ``Gpu.finish`` after (2.5 µs each). Calibrate ``--ceiling``,
``--cta-cap`` and ``--decide`` so that ``grid`` meets a measured decode kernel first (Gemma 3 layer 5, share rank +
predicted chunk, B = 8, step 128: 71.6 µs on the H100, s47a), then read ``queue`` as the prediction for the same
shape.

    python benchmarks/exp_queue_model.py --kv .gl/gemma3_xml_l5_32k.npz --batch 8 --step 128

Prints, per batch, the slowest group's iterations and reads and both schedules' kernel times, then their means.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Gpu:
    """The model's GPU: CTAs, the copy ceiling (bytes/µs), a CTA's most (bytes/µs), a block's bytes, fixed costs."""
    ctas: int = 132
    ceiling: float = 3.0e6  # bytes a µs (3.0 TB/s, the H100's measured copy ceiling)
    cta_cap: float = 1.5  # a CTA's most, in multiples of ceiling / ctas
    block_bytes: int = 16384  # Gemma 3's K and V of 16 tokens at head dim 256, float16
    start: float = 2.5
    finish: float = 2.5
    dt: float = 0.02


def group_chunks(trace, *, step: int, threshold: float = 0.95, rank: str = "share", sink_blocks: int = 1,
                 recent_blocks: int = 2, layer: int = 0) -> list[list[int]]:
    """Per query of ``trace`` (one KV head), the blocks of each chunk psa_ref's loop attends with the predicted first
    chunk: ``[forced + first, step, ..., last]`` (the last chunk the rest of what it attended)."""
    import psa_ref
    from psa_ref import progressive

    k, v = trace.k[layer].astype(np.float32), trace.v[layer].astype(np.float32)
    if k.shape[0] != 1:
        raise ValueError(f"one KV head a layer expected (one selection group a query), got {k.shape[0]}")
    blocks = psa_ref.KVBlocks.from_dense(k, v, block_size=16, metadata="quant3")
    original = progressive.first_chunk_size
    chunks = []
    try:
        for i in range(trace.q.shape[1]):
            seen = []

            def recorded(*args, **kwargs):
                seen.append(original(*args, **kwargs))
                return seen[-1]

            progressive.first_chunk_size = recorded
            res = psa_ref.attention(trace.q[layer, i].astype(np.float32), blocks, threshold, scale=trace.scale,
                                    step=step, sink_blocks=sink_blocks, recent_blocks=recent_blocks,
                                    first_chunk="predicted", rank=rank)
            used = len(res.blocks_used[0])
            first = min(used, min(sink_blocks + recent_blocks, blocks.num_blocks) + (seen[0] if seen else 0))
            sizes = [first]
            while sum(sizes) < used:
                sizes.append(min(step, used - sum(sizes)))
            chunks.append(sizes)
    finally:
        progressive.first_chunk_size = original
    return chunks


def simulate(chunks: list[list[int]], gpu: Gpu, *, schedule: str, decide: float, piece: int = 8,
             claim: float = 0.2, policy: str = "heaviest") -> float:
    """µs of one launch that attends every group's ``chunks`` (blocks per chunk, in order) under ``schedule``
    (``"grid"`` or ``"queue"``; ``decide`` is the wait between a group's chunks in either). The queue serves
    ``policy``: ``"heaviest"`` (the group with the most blocks still to read) or ``"fifo"`` (the chunk released
    first)."""
    if schedule not in ("grid", "queue"):
        raise ValueError(f"schedule must be 'grid' or 'queue', got {schedule!r}")
    if policy not in ("heaviest", "fifo"):
        raise ValueError(f"policy must be 'heaviest' or 'fifo', got {policy!r}")
    groups = len(chunks)
    left = np.zeros(gpu.ctas)  # bytes of the CTA's current work
    wait = np.zeros(gpu.ctas)  # µs of claim still to pay before it streams
    owner = np.full(gpu.ctas, -1)  # its group (grid: for the launch; queue: of its current piece)
    current = [0] * groups  # the chunk each group is on
    outstanding = [0] * groups  # pieces of that chunk not yet done
    release = [0.0] * groups  # when that chunk may start (after the previous one's decision)
    done_at = [math.inf] * groups
    to_read = [sum(c) for c in chunks]  # blocks each group has still to attend (the queue's priority)
    pieces: list[list[int]] = [[] for _ in range(groups)]  # the queue: per group, its released chunk's pieces
    if schedule == "grid":
        share = np.array_split(np.arange(gpu.ctas), groups)
        for g, ctas in enumerate(share):
            owner[ctas] = g

    def open_chunk(g: int) -> None:
        blocks = chunks[g][current[g]]
        if schedule == "grid":
            ctas = np.flatnonzero(owner == g)
            parts = [len(p) for p in np.array_split(np.arange(blocks), len(ctas))]
            for cta, n in zip(ctas, parts):
                left[cta] = n * gpu.block_bytes
            outstanding[g] = sum(1 for n in parts if n)
        else:
            pieces[g] = [min(piece, blocks - s) for s in range(0, blocks, piece)]
            outstanding[g] = len(pieces[g])

    pending = set(range(groups))  # groups whose current chunk is not yet open
    t = 0.0
    cap = gpu.cta_cap * gpu.ceiling / gpu.ctas
    while any(d == math.inf for d in done_at):
        for g in sorted(pending):
            if release[g] <= t:
                pending.discard(g)
                open_chunk(g)
        if schedule == "queue":
            for cta in np.flatnonzero((left <= 0) & (wait <= 0)):
                ready = [g for g in range(groups) if pieces[g]]
                if not ready:
                    break
                g = (max(ready, key=lambda h: (to_read[h], -h)) if policy == "heaviest"
                     else min(ready, key=lambda h: (release[h], h)))
                left[cta] = pieces[g].pop() * gpu.block_bytes
                wait[cta] = claim
                owner[cta] = g
        streaming = (left > 0) & (wait <= 0)
        rate = min(cap, gpu.ceiling / max(1, int(streaming.sum())))
        wait[wait > 0] -= gpu.dt
        before = left.copy()
        left[streaming] -= rate * gpu.dt
        t += gpu.dt
        for cta in np.flatnonzero((before > 0) & (left <= 0)):
            g = int(owner[cta])
            outstanding[g] -= 1
            if outstanding[g] == 0:
                to_read[g] -= chunks[g][current[g]]
                current[g] += 1
                if current[g] == len(chunks[g]):
                    done_at[g] = t
                else:
                    release[g] = t + decide
                    pending.add(g)
    return gpu.start + max(done_at) + gpu.finish


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kv", required=True, help="a captured layer (.npz, bench_decode's --kv files)")
    ap.add_argument("--step", type=int, default=128)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--decide", type=float, default=5.0, help="µs between a group's chunks on the grid build")
    ap.add_argument("--decide-queue", type=float, default=3.0, help="µs between a group's chunks in the queue")
    ap.add_argument("--claim", type=float, default=0.2, help="µs a CTA pays to claim a piece (s22's exp_claim)")
    ap.add_argument("--piece", type=int, default=8, help="blocks a piece of the queue")
    ap.add_argument("--policy", default="heaviest", choices=("heaviest", "fifo"))
    ap.add_argument("--ctas", type=int, default=132)
    ap.add_argument("--ceiling", type=float, default=3.0, help="TB/s")
    ap.add_argument("--cta-cap", type=float, default=1.5)
    args = ap.parse_args(argv)
    from psa_ref.trace import load_trace

    gpu = Gpu(ctas=args.ctas, ceiling=args.ceiling * 1e6, cta_cap=args.cta_cap)
    chunks = group_chunks(load_trace(args.kv), step=args.step)
    print("| batch | slowest group's iterations | largest read (blocks) | mean read | grid µs | queue µs |")
    print("|---|---|---|---|---|---|")
    rows = []
    for b0 in range(0, len(chunks) - args.batch + 1, args.batch):
        batch = chunks[b0 : b0 + args.batch]
        grid = simulate(batch, gpu, schedule="grid", decide=args.decide)
        queue = simulate(batch, gpu, schedule="queue", decide=args.decide_queue, piece=args.piece, claim=args.claim,
                         policy=args.policy)
        rows.append((grid, queue))
        print(f"| {b0}-{b0 + args.batch - 1} | {max(len(c) for c in batch)} | {max(sum(c) for c in batch)} | "
              f"{np.mean([sum(c) for c in batch]):.0f} | {grid:.1f} | {queue:.1f} |", flush=True)
    grid, queue = np.mean(rows, axis=0)
    bytes_all = np.mean([sum(sum(c) for c in chunks[b0 : b0 + args.batch]) for b0 in
                         range(0, len(chunks) - args.batch + 1, args.batch)]) * gpu.block_bytes
    print(f"\nmean: grid {grid:.1f} µs, queue {queue:.1f} µs; the batch's blocks at the ceiling alone "
          f"{bytes_all / gpu.ceiling:.1f} µs")


if __name__ == "__main__":
    main()
