"""Would chunks that grow help the groups that need many iterations (CPU, psa_ref)? The loop's chunks are ``step``
blocks each after the forced ones, and at a batch the slowest group sets the step's time: on the real Gemma 3 layer the
heads need ~60% of their blocks, so a step sized for a typical group (``STEP_SHARE``) takes several iterations, each a
barrier of the group (benchmarks/NOTES.md, s35i: STEP_SHARE 1.0 took the layer's B = 8 from 78.8 to 69.8 µs but cost
Llama's 5% profile 6%). Chunks that grow by ``growth`` each iteration keep the first chunk (light groups unchanged)
and give heavy groups fewer iterations for some blocks read past the stop. Over a captured layer's decode queries
(bench_decode's ``--kv`` files), per schedule: the iterations and blocks of each query's group, and batches of B
consecutive queries (as bench_decode ``--spread`` replays them) by their slowest group and their total reads.

    python benchmarks/exp_step_growth.py --kv .gl/gemma3_xml_l17_32k.npz --steps 320,576 --growths 1,1.5,2

``--firsts none,predicted`` adds psa_ref's ``first_chunk="predicted"`` (the first ranked chunk sized by the
estimates, then fixed steps; growth 1 only) beside each step.
"""

from __future__ import annotations

import argparse

import numpy as np


def growing_chunks(order: np.ndarray, num_forced: int, step: int, growth: float) -> list[np.ndarray]:
    """The forced blocks, then ranked chunks of ``step``, ``step * growth``, ``step * growth**2``, ... blocks (each
    rounded up; the last one what is left): ``psa_ref.progressive.split_chunks`` when ``growth`` is 1."""
    if growth < 1:
        raise ValueError(f"growth must be >= 1, got {growth}")
    chunks = [order[:num_forced]] if num_forced else []
    i, size = num_forced, float(step)
    while i < order.size:
        n = int(np.ceil(size))
        chunks.append(order[i:i + n])
        i += n
        size *= growth
    return chunks


def schedule_rows(trace, *, metadata: str, stop: str, steps: list[int], growths: list[float], batch: int,
                  threshold: float = 0.95, sink_blocks: int = 1, recent_blocks: int = 2, layer: int = 0,
                  firsts: tuple = (None,)) -> list[dict]:
    """Per (step, growth, first chunk): each query's group (the first KV head's; shared GQA) through ``psa_ref``'s loop
    with those chunks: mean iterations and blocks read, and over batches of ``batch`` consecutive queries the mean of
    the batch's largest iterations and largest group read, and its mean read (all reads as shares of the blocks).
    ``firsts``: None (chunks of ``step`` after the forced ones) and/or ``"predicted"`` (``first_chunk="predicted"``,
    with growth 1 only)."""
    import psa_ref
    from psa_ref import progressive

    k = trace.k[layer].astype(np.float32)
    v = trace.v[layer].astype(np.float32)
    blocks = psa_ref.KVBlocks.from_dense(k, v, block_size=16, metadata=metadata)
    n = blocks.num_blocks
    rows = []
    for step, growth, first in ((s, g, f) for s in steps for g in growths for f in firsts if f is None or g == 1):
        def group_fn(q, keys, values, blocks_, chunks, bound, thr, stop_, scale, num_forced, growth=growth,
                     step=step):
            order = np.concatenate(chunks)
            return progressive.progressive_loop(q, keys, values, blocks_, growing_chunks(order, num_forced, step,
                                                                                        growth),
                                                bound, thr, stop_, scale, num_forced)

        its, used = [], []
        for i in range(trace.q.shape[1]):
            q = trace.q[layer, i].astype(np.float32)
            fn = progressive.progressive_loop if first else group_fn  # (predicted: run_groups splits the chunks)
            res = progressive.run_groups(fn, q, blocks, threshold, scale=trace.scale, stop=stop, step=step,
                                         gqa="shared", sink_blocks=sink_blocks, recent_blocks=recent_blocks,
                                         exact_mass=False, first_chunk=first)
            its.append(int(res.iterations[0]))
            used.append(len(res.blocks_used[0]))
        its_a, used_a = np.array(its), np.array(used) / n
        nb = len(its) // batch
        bi, bu = its_a[:nb * batch].reshape(nb, batch), used_a[:nb * batch].reshape(nb, batch)
        rows.append(dict(metadata=metadata, stop=stop, step=step, growth=growth, first=first or "-",
                         iterations=its_a.mean(), read=used_a.mean(), batch_iterations=bi.max(1).mean(),
                         batch_read_max=bu.max(1).mean(), batch_read=bu.mean(), queries=len(its), batches=nb))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kv", default=None, help="a trace .npz (default: the shipped one)")
    ap.add_argument("--steps", default="320,576")
    ap.add_argument("--growths", default="1,1.5,2")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--firsts", default="none", help="first ranked chunk: none and/or predicted, comma-separated")
    ap.add_argument("--rules", default="cuboid_mean:ema,quant3:sketch_avg", help="metadata:stop, comma-separated")
    args = ap.parse_args()
    if args.batch < 1:
        ap.error(f"--batch must be >= 1, got {args.batch}")
    from psa_ref.trace import load_trace

    trace = load_trace(args.kv)
    firsts = tuple(None if f == "none" else f for f in args.firsts.split(","))
    if any(f not in (None, "predicted") for f in firsts):
        ap.error(f"--firsts takes none and predicted, got {args.firsts!r}")
    print(f"| metadata | rule | step | growth | first chunk | iterations | read | B = {args.batch}: slowest group's "
          "iterations | largest read | mean read |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for rule in args.rules.split(","):
        metadata, stop = rule.split(":")
        for r in schedule_rows(trace, metadata=metadata, stop=stop, steps=[int(s) for s in args.steps.split(",")],
                               growths=[float(g) for g in args.growths.split(",")], batch=args.batch, firsts=firsts):
            print(f"| {r['metadata']} | {r['stop']} | {r['step']} | {r['growth']:g} | {r['first']} | "
                  f"{r['iterations']:.2f} | {r['read']:.1%} | {r['batch_iterations']:.2f} | "
                  f"{r['batch_read_max']:.1%} | "
                  f"{r['batch_read']:.1%} |", flush=True)


if __name__ == "__main__":
    main()
