"""What a per-head selection would read if a KV head's blocks were read once for all its query heads, a chunk at a
time (CPU, psa_ref on captured attention; a design question of issue 14's `per_head` target).

Today `gqa="per_head"` on the GPU reads every query head's blocks apart (a KV head of 4 query heads reads up to 4x its
blocks), which is why it is 1.4-2.4x slower than shared selection on Gemma 3's global layers. A kernel that keeps the
heads' loops in step (iteration i of every head at once) could read, at iteration i, the union of the heads' i-th
chunks once and add each block only to the heads whose chunk holds it (a mask on P, as the shared kernel's data path
already computes every head's logits for a block). A block that another head reaches only at a later iteration is read
again then. For each captured decode query (one KV head and its query heads, as `slice_trace.py` writes them) this
prints, in percent of the KV head's blocks:

* shared selection (`rank`, the same stop rule and step): the blocks its one loop reads;
* per-head selection read apart: the sum over heads of each head's blocks (what the GPU reads today, L2 aside);
* per-head, chunk unions in step: the sum over iterations of the union of the heads' chunks;
* per-head, the union of the heads' final sets (the least any per-head kernel reads);

with each selection's mean relative output error against dense attention (every head's output), so that rows of
equal bytes can be compared by error.

    python benchmarks/exp_union_chunks.py .gl/gemma3_xml_l5_32k.npz .gl/gemma3_xml_l17_32k.npz --step 128 --queries 8
"""

from __future__ import annotations

import argparse

import numpy as np

from exp_shared_ideal import one_kv_head
from psa_ref import KVBlocks, attention
from psa_ref.dense import dense_attention
from psa_ref.scoring import RANKS


def chunks(used: np.ndarray, forced: int, step: int) -> list[np.ndarray]:
    """A head's blocks in the order processed, cut into its iterations: the forced blocks first (when there are
    any), then chunks of ``step``."""
    out = [used[:forced]] if forced else []
    return out + [used[i:i + step] for i in range(forced, len(used), step)]


def union_reads(per_head: list[list[np.ndarray]]) -> int:
    """Blocks read by a loop that keeps every head's iterations in step and reads the union of their current chunks
    once (a head that stopped adds nothing)."""
    return sum(len(set().union(*(c[i].tolist() for c in per_head if i < len(c))))
               for i in range(max(len(c) for c in per_head)))


def rel_error(out: np.ndarray, ref: np.ndarray) -> float:
    """Mean over heads of ``|out - ref| / |ref|``."""
    return float(np.mean(np.linalg.norm(out - ref, axis=-1) / np.linalg.norm(ref, axis=-1)))


def query_row(q, blocks: KVBlocks, ref, *, tau: float, scale: float, step: int, rank: str, sink: int,
              recent: int) -> dict[str, float]:
    """One query's reads (blocks) and errors for shared and per-head selection (``q [G, D]``, one KV head)."""
    kw = dict(scale=scale, step=step, sink_blocks=sink, recent_blocks=recent)
    shared = attention(q, blocks, tau, gqa="shared", rank=rank, **kw)
    per = attention(q, blocks, tau, gqa="per_head", **kw)
    forced = len(set(range(min(sink, blocks.num_blocks))) | set(range(blocks.num_blocks - recent, blocks.num_blocks)))
    cut = [chunks(np.asarray(u), forced, step) for u in per.blocks_used]
    for c, it in zip(cut, np.atleast_1d(per.iterations)):
        if len(c) != it:
            raise AssertionError(f"chunks {len(c)} against psa_ref's iterations {it}: the cut does not match")
    return {
        "shared": float(np.asarray(shared.blocks_used[0]).size),
        "apart": float(sum(np.asarray(u).size for u in per.blocks_used)),
        "in step": float(union_reads(cut)),
        "final union": float(len(set().union(*(np.asarray(u).tolist() for u in per.blocks_used)))),
        "heads": float(len(per.blocks_used)),
        "shared error": rel_error(shared.output, ref),
        "per-head error": rel_error(per.output, ref),
    }


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("traces", nargs="+", help="one-layer traces (.npz: q [1, P, G, D], k / v [1, 1, T, D], positions)")
    ap.add_argument("--tau", type=float, default=0.95)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--metadata", default="quant3")
    ap.add_argument("--step", type=int, default=128, help="blocks a chunk (the GPU plan takes 128-320 at 32K, B = 8)")
    ap.add_argument("--rank", default="share", choices=RANKS, help="the shared selection's rank")
    ap.add_argument("--forced", default="1/1", help="sink/recent blocks attended first (default 1/1)")
    ap.add_argument("--queries", type=int, default=8, help="the last this many captured queries of each trace")
    args = ap.parse_args(argv)
    try:
        sink, recent = (int(x) for x in args.forced.split("/"))
    except ValueError:
        ap.error(f"--forced is SINK/RECENT block counts, got {args.forced!r}")
    if args.step < 1 or args.queries < 1:
        ap.error("--step and --queries must be >= 1")
    print(f"# τ {args.tau}, {args.metadata}, step {args.step}, shared rank {args.rank!r}, forced {sink}/{recent}; "
          "% of the KV head's blocks read (mean over queries), mean relative output error")
    print("| trace | queries | shared | per-head apart | per-head, chunk unions in step | per-head, final union | "
          "shared error | per-head error |")
    print("|---|---|---|---|---|---|---|---|")
    for path in args.traces:
        z, k, v, scale = one_kv_head(path)
        rows = []
        positions = z["positions"]
        for i in range(len(positions) - min(args.queries, len(positions)), len(positions)):
            t = int(positions[i]) + 1
            q = z["q"][0, i].astype(np.float64)
            blocks = KVBlocks.from_dense(k[None, :t], v[None, :t], block_size=args.block_size, metadata=args.metadata,
                                         kv_layout="HND")
            ref = dense_attention(q, k[None, :t], v[None, :t], scale=scale, kv_layout="HND")
            r = query_row(q, blocks, ref, tau=args.tau, scale=scale, step=args.step, rank=args.rank, sink=sink,
                          recent=recent)
            n = blocks.num_blocks
            rows.append([100 * r["shared"] / n, 100 * r["apart"] / n, 100 * r["in step"] / n,
                         100 * r["final union"] / n, r["shared error"], r["per-head error"]])
        m = np.mean(rows, axis=0)
        print(f"| {path} | {len(rows)} | {m[0]:.1f}% | {m[1]:.1f}% | {m[2]:.1f}% | {m[3]:.1f}% | {m[4]:.4f} | "
              f"{m[5]:.4f} |", flush=True)


if __name__ == "__main__":
    main()
