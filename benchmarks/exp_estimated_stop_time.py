"""Where psa_estimated_stop's time goes: the kernel alone, at several block counts, batches and CTA sizes.

v2 took 8.5 µs for one Llama request at 32K (2,048 blocks, 8 groups of 4 heads) and 23.6 at 128K in the step,
against 3-4 and 5-6 predicted (benchmarks/NOTES.md, sixty-first session). This times the kernel by itself, in a CUDA
graph of ``--launches`` launches (so the host's launch cost is out; what is left a launch is the kernel and the
graph's gap), on random estimates and a random order, for each blocks x batch x CTA size, beside the same graph of
launches that leave at once (tau 1: each CTA writes 0 and returns), which is the floor of launching it at all. A
time that does not grow with the blocks is the kernel's fixed part (its loads' latency, scans and barriers); the
growth with each position of a thread's run (blocks / threads) is its work a position. The sixty-second session ran
it on v3 (its planes in shared memory, branch ``wip/estimated-stop-v3``) on an H200: 4.8-5.4 µs above the floor at
64 and 512 blocks, 8.4-8.9 at 2,048, 26.5-29.5 at 8,192, staged or not, one request or eight: the work of ~1.4 µs a
position runs on one SM a group (results_h200_s62.md).

    python benchmarks/exp_estimated_stop_time.py --blocks 64,512,2048,8192 --batches 1,8 --threads 256,512,1024

``--sorted`` draws the group's heads alike (a shared part plus a little of their own) and sorts the order by their
mean, as the plan's processing order is, so the stop lies early as on real estimates (random estimates in a random
order put it near the end). ``--cluster 1,8`` times v2 (1) beside v6 (a cluster of that many CTAs a group, each a
slice of the order; its CTAs take ``--cluster-threads``). A windowed walk that left at the stop (v4, v5) was timed
with this script in the sixty-fourth and sixty-fifth sessions (results_h100_s65.md) and removed: ~3 µs a window,
slower than v2 at 2,048 blocks. The sixty-sixth session timed v6 with three cluster barriers against v6.1's two, and
the rewalk with and without the fold's masses kept in registers (results_h100_s66.md); the winners are the kernel now
and those switches are gone.
"""

from __future__ import annotations

import argparse

import numpy as np

from bench_decode import capture, median_us, parse_ints


def parse_choices(text: str, name: str, allowed: tuple[int, ...]) -> list[int]:
    """``"0,1"`` -> ``[0, 1]`` for option ``name``, each value one of ``allowed``; ValueError naming the option
    otherwise."""
    items = [x.strip() for x in text.split(",") if x.strip()]
    if not items or any(x not in {str(a) for a in allowed} for x in items):
        raise ValueError(f"{name} takes comma-separated values of {list(allowed)}, got {text!r}")
    return [int(x) for x in items]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--blocks", default="64,512,2048,8192", help="blocks a request (n), comma-separated")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--threads", default="512", help="CTA sizes (PSA_ES_THREADS) of v2, comma-separated")
    ap.add_argument("--cluster", default="1", help="CTAs a group, comma-separated: 1 (v2) or 2, 4, 8 (v6)")
    ap.add_argument("--cluster-threads", default="256", help="CTA sizes of v6, comma-separated")
    ap.add_argument("--groups", type=int, default=8, help="KV heads a request (Llama-3.1-8B: 8)")
    ap.add_argument("--g", type=int, default=4, help="query heads a group")
    ap.add_argument("--sorted", action="store_true", help="heads alike, the order sorted by their mean estimate")
    ap.add_argument("--launches", type=int, default=50, help="launches in one graph")
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    blocks, batches = parse_ints(args.blocks, "--blocks"), parse_ints(args.batches, "--batches")
    threads_list = parse_ints(args.threads, "--threads")
    clusters = parse_choices(args.cluster, "--cluster", (1, 2, 4, 8))
    shapes = [(c, th) for th in threads_list for c in clusters if c == 1]
    shapes += [(c, th) for c in clusters if c > 1 for th in parse_ints(args.cluster_threads, "--cluster-threads")]

    import cupy

    from psa_fast import _kernels
    from psa_ref.progressive import EMA_WEIGHT

    s, g, gn = 16, args.g, args.groups
    stream = cupy.cuda.Stream(non_blocking=True)
    rng = np.random.default_rng(0)
    print(f"# psa_estimated_stop alone: {gn} groups of {g} heads a request, block size {s}, "
          f"{args.launches} launches a graph, median of {args.reps}"
          + (", heads alike and the order sorted by their mean" if args.sorted else ", random order"))
    print("| blocks | B | CTAs a group | threads | version | µs a launch | leaving at once | difference "
          "| first_len[0,0] |")
    print("|---|---|---|---|---|---|---|---|---|")
    for n in blocks:
        for b in batches:
            if args.sorted:
                x = (rng.standard_normal((b, gn, 1, n)) * 3 + rng.standard_normal((b, gn, g, n)) * 0.5)
                order_np = np.argsort(-x.mean(axis=2), axis=-1, kind="stable")
                x = x.reshape(b, gn * g, n)
            else:
                x = rng.standard_normal((b, gn * g, n)) * 3
                order_np = np.stack([np.stack([rng.permutation(n) for _ in range(gn)]) for _ in range(b)])
            vals = cupy.asarray(x.astype(np.float32))
            order = cupy.asarray(order_np.astype(np.int32))
            lens = cupy.full((b,), n * s, dtype=cupy.int32)
            out = cupy.zeros((b, gn), dtype=cupy.int32)
            for cl, threads in shapes:
                fn = _kernels.kernel("estimated_stop", d=16, s=s, g=g, cluster=cl, es_threads=threads)

                def launch(tau, fn=fn, threads=threads, cl=cl):
                    fn((gn * cl, b), (threads,), (vals, order, lens, out, np.int32(gn * g), np.int32(n), np.int32(1),
                                             np.float32(tau), np.float32(EMA_WEIGHT), np.int32(0), np.float32(1.25)))

                times = []
                for tau in (0.95, 1.0):
                    with stream:
                        launch(tau)
                        graph = capture(lambda: [launch(tau) for _ in range(args.launches)], stream)
                        graph.launch(stream)
                        stream.synchronize()
                        times.append(median_us(lambda _: graph.launch(stream), stream, args.reps, 1) / args.launches)
                with stream:
                    launch(0.95)
                    stream.synchronize()
                version = "v2" if cl == 1 else "v6"
                print(f"| {n} | {b} | {cl} | {threads} | {version} | {times[0]:.2f} | {times[1]:.2f} | "
                      f"{times[0] - times[1]:.2f} | {int(out[0, 0])} |", flush=True)


if __name__ == "__main__":
    main()
