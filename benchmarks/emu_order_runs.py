"""psa_order_runs (psa_fast/kernels/order_runs.cu) emulated on the CPU: the warps' flip bitonic network over runs
of 256 score words and the placement by binary search, checked against the one-CTA sort's order (64-bit keys:
the word, then the lower block index) and, on finite scores, against psa_ref's processing order. A way to try a
change to the kernel's network or its tie rule before a device call (the GPU tests check the kernel itself).

    python benchmarks/emu_order_runs.py [--cases 20] [--seed 0] [--run 256]

``--run`` sets the run's length (a power of two from 32; the kernel's is 256, its words 8 a lane): a version with
shorter runs (more of them a group, each sorted in fewer stages) can be checked here before it is written in CUDA.
``--swizzle`` keeps the sorted runs in ``RUN_SWIZZLE``'s layout (``run_lane_order``'s stores, ``run_slot``'s reads).
``--wavefronts`` prints the shared-memory wavefronts a search load of a warp's 32 placements costs in either layout
(the model behind ``RUN_SWIZZLE``, NOTES s74). (s74's ``--pieces``, each run sorted by every warp in pieces of 32
merged by rank, went with the kernel's ``ESTIMATE_ORDER_PIECES``: slower on the H100, removed in s75.)

    python benchmarks/emu_order_runs.py --swizzle
    python benchmarks/emu_order_runs.py --wavefronts
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


def run_slot(e, swizzle: bool = True):
    """runs.cuh's run_slot: where a sorted run's row holds word e (RUN_SWIZZLE: its low three bits XOR its 32-word
    row)."""
    return e ^ ((e >> 5) & 7) if swizzle else e


def swizzled_row(run: np.ndarray) -> np.ndarray:
    """The row a warp stores for a sorted run of 256 under RUN_SWIZZLE: each lane's 8 words (word r = 8 lane + r)
    permuted by run_lane_order's three conditional swaps, then stored in order at 8 lane .. 8 lane + 7."""
    row = np.empty_like(run)
    for lane in range(32):
        k = list(run[8 * lane: 8 * lane + 8])
        x = (lane >> 2) & 7
        for bit in (4, 2, 1):
            if x & bit:
                for j in range(8):
                    if not j & bit:
                        k[j], k[j | bit] = k[j | bit], k[j]
        row[8 * lane: 8 * lane + 8] = k
    return row


def search_wavefronts(swizzle: bool, runs: int = 8, trials: int = 20, seed: int = 0) -> float:
    """Mean shared-memory wavefronts of one search load in the placement: a warp's 32 consecutive blocks of a run,
    each binary-searching every run of the group for its own (random) word; a load costs the most distinct addresses
    that fall in one of the 32 banks (4-byte words; rows 288 words apart)."""
    rng = np.random.default_rng(seed)
    total = loads = 0
    for _ in range(trials):
        words = rng.random((runs, RUN))
        sorted_runs = -np.sort(-words, axis=1)
        mine = int(rng.integers(runs))
        for w0 in range(0, RUN, 32):
            w = words[mine, w0:w0 + 32]
            for r in range(runs):
                c, half = np.zeros(32, np.int64), RUN // 2
                while half:
                    at = c + half
                    addr = r * 288 + run_slot(at - 1, swizzle)
                    banks = addr % 32
                    total += max(len(set(addr[banks == bank])) for bank in set(banks))
                    loads += 1
                    c = np.where(sorted_runs[r, at - 1] > w, at, c)
                    half >>= 1
    return total / loads


def count_above(run: np.ndarray, thr: int, swizzle: bool = False) -> int:
    """How many words of a descending run are above thr: binary lifting over its first len - 1 positions, then one
    probe, reading the run as the kernel's count_above does (with ``swizzle``, a row in RUN_SWIZZLE's layout: word e
    at run_slot(e))."""
    c, half = 0, run.size // 2
    while half:
        c = c + half if run[run_slot(c + half - 1, swizzle)] > thr else c
        half >>= 1
    return c + int(run[run_slot(c, swizzle)] > thr)


def order_runs(scores: np.ndarray, n: int, nmax: int, sink: int, recent: int, run: int = RUN, *,
               swizzle: bool = False) -> np.ndarray:
    """The order psa_order_runs writes for one group ([nmax] int: block indices, -1 past n), with runs of ``run``
    words (the kernel's: 256); ``swizzle``: the sorted runs stored and searched in RUN_SWIZZLE's layout (for runs of
    256)."""
    if run < 32 or run & (run - 1) or GROUP_MAX % run:
        raise ValueError(f"run must be a power of two from 32 to {GROUP_MAX}, got {run}")
    if swizzle and run != RUN:
        raise ValueError(f"swizzle takes the kernel's runs of {RUN}, got run={run}")
    words = words_of(scores, n, sink, recent)
    runs = [warp_sort_desc(words[w * run:(w + 1) * run]) for w in range(GROUP_MAX // run)]
    rows = [swizzled_row(r) for r in runs] if swizzle else runs  # (the runs as shared memory holds them)

    def count(r: int, thr: int) -> int:
        return count_above(rows[r], thr, swizzle)

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
                rank += run if r < mine and w == 0 else count(r, w - 1 if r < mine else w)
            above = count(mine, w)
            start = run if w == 0 else count(mine, w - 1)
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
    ap.add_argument("--swizzle", action="store_true", help="the sorted runs in RUN_SWIZZLE's layout")
    ap.add_argument("--wavefronts", action="store_true",
                    help="print the search loads' shared-memory wavefronts in both layouts, then stop")
    args = ap.parse_args()
    if args.wavefronts:
        for swizzle in (False, True):
            print(f"{'swizzled' if swizzle else 'plain'} runs: {search_wavefronts(swizzle):.2f} wavefronts a search "
                  "load (a warp's 32 placements, 8 runs of random words)")
        return
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
        got = order_runs(scores, n, nmax, sink, recent, args.run, swizzle=args.swizzle)
        assert got[:n].tolist() == sort_order(scores, n, sink, recent), (case, nmax, n, kind)
        assert (got[n:] == -1).all(), (case, nmax, n, kind)
        if kind != "special" and n:
            assert got[:n].tolist() == list(processing_order(scores[:n].astype(np.float64),
                                                             forced_blocks(n, sink, recent))), (case, nmax, n, kind)
        print(f"case {case}: {kind}, {n} of {nmax} blocks, sink {sink}, recent {recent}, runs of {args.run}"
              f"{', swizzled' if args.swizzle else ''}: the sort's order")


if __name__ == "__main__":
    main()
