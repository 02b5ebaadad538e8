"""psa_order_runs (psa_fast/kernels/order_runs.cu) emulated on the CPU: the warps' flip bitonic network over runs
of 256 score words and the placement by binary search, checked against the one-CTA sort's order (64-bit keys:
the word, then the lower block index) and, on finite scores, against psa_ref's processing order. A way to try a
change to the kernel's network or its tie rule before a device call (the GPU tests check the kernel itself).

    python benchmarks/emu_order_runs.py [--cases 20] [--seed 0] [--run 256]

``--run`` sets the run's length (a power of two from 32; the kernel's is 256, its words 8 a lane): a version with
shorter runs (more of them a group, each sorted in fewer stages) can be checked here before it is written in CUDA.
"""

from __future__ import annotations

import argparse

import numpy as np

RUN, GROUP_MAX = 256, 2048  # words a run (the kernel's PSA_RUN), blocks a group at most (RUNS_MAX_BLOCKS)


def orderable(x: np.ndarray) -> np.ndarray:
    """common.cuh's orderable(): float32 -> uint32 whose unsigned order is the floats' (NaNs placed by their bits)."""
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return np.where(u & 0x80000000, (~u) & 0xFFFFFFFF, u | 0x80000000)


def words_of(scores: np.ndarray, n: int, sink: int, recent: int) -> np.ndarray:
    """A group's GROUP_MAX words: orderable(score), 0xFFFFFFFF for sink and recent blocks, 0 from block n on."""
    w = np.zeros(GROUP_MAX, np.uint64)
    i = np.arange(min(n, GROUP_MAX))
    forced = (i < sink) | (i >= n - recent)
    w[i] = np.where(forced, 0xFFFFFFFF, orderable(scores[i]))
    return w


def warp_sort_desc(run: np.ndarray) -> np.ndarray:
    """The kernel's warp_sort_desc on one run (element e = 8 lane + r at 256): the flip network, larger word to
    lower e. The network does not depend on how elements map to lanes, only on e."""
    k = run.copy()
    e = np.arange(run.size)
    kk = 2
    while kk <= run.size:
        j = kk >> 1
        while j > 0:
            dist = kk - 1 if j == kk >> 1 else j
            p = e ^ dist
            lower = e < p
            other = k[p]
            k = np.where(lower, np.maximum(k, other), np.minimum(k, other))
            j >>= 1
        kk <<= 1
    return k


def count_above(run: np.ndarray, thr: int) -> int:
    """How many words of a descending run are above thr: binary lifting over its first len - 1 positions, then one
    probe."""
    c, half = 0, run.size // 2
    while half:
        c = c + half if run[c + half - 1] > thr else c
        half >>= 1
    return c + int(run[c] > thr)


def order_runs(scores: np.ndarray, n: int, nmax: int, sink: int, recent: int, run: int = RUN) -> np.ndarray:
    """The order psa_order_runs writes for one group ([nmax] int: block indices, -1 past n), with runs of ``run``
    words (the kernel's: 256)."""
    if run < 32 or run & (run - 1) or GROUP_MAX % run:
        raise ValueError(f"run must be a power of two from 32 to {GROUP_MAX}, got {run}")
    words = words_of(scores, n, sink, recent)
    runs = [warp_sort_desc(words[w * run:(w + 1) * run]) for w in range(GROUP_MAX // run)]
    nruns = -(-n // run)
    out = np.full(nmax, -7, np.int64)
    for mine in range(-(-nmax // run)):
        for t in range(run):
            i = mine * run + t
            if i >= n:  # past the group's runs, or padding of the last one: position i is one past n
                if i < nmax:
                    out[i] = -1
                continue
            w = int(words[i])
            rank = 0
            for r in range(len(runs)):
                rank += run if r < mine and w == 0 else count_above(runs[r], w - 1 if r < mine else w)
            above = count_above(runs[mine], w)
            start = run if w == 0 else count_above(runs[mine], w - 1)
            if start - above > 1:  # ties within the run: the lower indices first
                rank += int((words[mine * run:i] == w).sum())
            out[rank] = i
    assert nruns * run >= n
    return out


def sort_order(scores: np.ndarray, n: int, sink: int, recent: int) -> list[int]:
    """The one-CTA sort's order (sort.cuh's keys: the word, then 0xFFFFFFFF - block, descending)."""
    w = words_of(scores, n, sink, recent)
    return sorted(range(n), key=lambda i: (-int(w[i]), i))


def main() -> None:
    from psa_ref.scoring import forced_blocks, processing_order

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=20, help="random groups to check")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--run", type=int, default=RUN, help="words a run (the kernel's: 256)")
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    special = np.array([np.inf, -np.inf, np.nan, -np.nan, 0.0, -0.0, 1.0, -1.0, 3e38, -3e38, 1e-45], np.float32)
    for case in range(args.cases):
        nmax = int(rng.choice([45, 200, 300, 1000, 2048]))
        n = int(rng.integers(0, nmax + 1))
        sink, recent = (int(x) for x in rng.choice([(0, 0), (1, 2), (3, 40), (70, 70)]))
        kind = ("ties", "special", "equal", "distinct")[case % 4]
        scores = {"ties": lambda: (rng.integers(-50, 50, nmax) / 4).astype(np.float32),
                  "special": lambda: rng.choice(special, nmax),
                  "equal": lambda: np.full(nmax, 2.5, np.float32),
                  "distinct": lambda: rng.standard_normal(nmax).astype(np.float32)}[kind]()
        got = order_runs(scores, n, nmax, sink, recent, args.run)
        assert got[:n].tolist() == sort_order(scores, n, sink, recent), (case, nmax, n, kind)
        assert (got[n:] == -1).all(), (case, nmax, n, kind)
        if kind != "special" and n:
            assert got[:n].tolist() == list(processing_order(scores[:n].astype(np.float64),
                                                             forced_blocks(n, sink, recent))), (case, nmax, n, kind)
        print(f"case {case}: {kind}, {n} of {nmax} blocks, sink {sink}, recent {recent}, runs of {args.run}: the "
              "sort's order")


if __name__ == "__main__":
    main()
