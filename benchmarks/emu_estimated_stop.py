"""psa_estimated_stop's algorithm in NumPy (kernels/estimated_stop.cu), against psa_ref: each thread folds its run
of the order (the mass sum, the moving average as an affine map E -> a E + b, the running minimum), the folds are
composed in thread order into each thread's exclusive prefix, and each thread rewalks its run testing every
position as the loop tests a boundary; a position survives where every head holds; the first survivor past the
forced blocks, times the margin, is the first chunk. Checks random groups against
``psa_ref.progressive.estimated_stop_first_chunk`` and prints the mismatches (0 expected, float64 here).

    python benchmarks/emu_estimated_stop.py --cases 300 --threads 64
    python benchmarks/emu_estimated_stop.py --cases 300 --threads 8 --cluster 8

``--cluster`` emulates v6 (the order in slices over a cluster of CTAs, each slice relative to its own maximum,
rescaled when composed). Its first form, every slice relative to the group's maximum (one more cluster barrier in the
kernel, measured slower in the sixty-sixth session), had its emulation here as ``--cluster`` without
``--one-exchange`` until then.

(The windowed walk of v4 / v5 had its emulation here, ``--windows``, until the kernel was removed after the sixty-
fifth session: it is in git at commit 3239828.)
"""

from __future__ import annotations

import argparse

import numpy as np

IDENTITY = (0.0, 1.0, 0.0, np.inf)  # a prefix's state: mass sum, the moving average's map (a, b), lightest mass


def _push(st, i, m, keep, w):
    """The state after the block at position ``i`` of mass ``m`` (kernel: es_push)."""
    a_i, b_i = (0.0, m) if i == 0 else (keep, w * m)
    return (st[0] + m, st[1] * a_i, st[2] * a_i + b_i, min(st[3], m))


def _then(lo, hi):
    """``lo`` then ``hi`` (kernel: es_then)."""
    return (lo[0] + hi[0], lo[1] * hi[1], lo[2] * hi[1] + hi[2], min(lo[3], hi[3]))


def _scaled(st, c):
    """The masses of ``st`` times ``c`` (kernel: es_scaled)."""
    return (st[0] * c, st[1], st[2] * c, st[3] * c if st[3] < np.inf else np.inf)


def _holds(st, n_left, stop, tau) -> bool:
    """The loop's test at a boundary after the state's last position, as a division (the kernel's es_holds multiplies
    it out; in float64 the two agree, the division's 0 / 0 being false as the product's s > 0 is)."""
    rest = st[2] if stop == "ema" else st[3]
    return st[0] / (st[0] + n_left * rest) >= tau


def _first_len(holds_all, n, forced, margin) -> int:
    """The first position past the forced blocks where every head holds, as first_len (times the margin)."""
    best = next(i for i in range(forced, n) if holds_all[i])
    return min(n - forced, max(1, int(np.ceil(margin * (best + 1 - forced) - 1e-6))))


def emulate(x: np.ndarray, n: int, forced: int, tau: float, stop: str, margin: float, threads: int) -> int:
    """The kernel's first_len for one group: ``x [G, N]`` the heads' estimated log masses in processing order."""
    from psa_ref.progressive import EMA_WEIGHT

    keep, w = 1.0 - EMA_WEIGHT, EMA_WEIGHT
    run = -(-n // threads)
    top = x[:, :n].max(axis=1)  # the kernel's common reference: the CTA's largest x of the head
    holds_all = np.ones(n, bool)
    for h in range(x.shape[0]):
        m = np.exp(x[h, :n] - top[h])
        prefix = IDENTITY
        for t in range(threads):
            fold = IDENTITY
            st = prefix
            for i in range(t * run, min(n, (t + 1) * run)):
                fold = _push(fold, i, m[i], keep, w)
                st = _push(st, i, m[i], keep, w)
                if not _holds(st, n - 1 - i, stop, tau):
                    holds_all[i] = False
            prefix = _then(prefix, fold)
    return _first_len(holds_all, n, forced, margin)


def emulate_cluster(x: np.ndarray, n: int, forced: int, tau: float, stop: str, margin: float, threads: int,
                    cluster: int) -> int:
    """v6's first_len for one group: the order in ``cluster`` slices of ``ceil(n / cluster)`` positions, each a CTA of
    ``threads`` threads running v2 on its slice relative to its own maximum; rank r scales the folds of ranks 0..r (and
    its threads' prefixes) by exp(their maximum - the largest of ranks 0..r) before composing them, then rewalks
    against that reference. Float64, as :func:`emulate`."""
    from psa_ref.progressive import EMA_WEIGHT

    keep, w = 1.0 - EMA_WEIGHT, EMA_WEIGHT
    per = -(-n // cluster)
    slices = [(min(n, r * per), min(n, r * per + per)) for r in range(cluster)]
    holds_all = np.ones(n, bool)
    for h in range(x.shape[0]):
        tops = [x[h, p0:p1].max() if p1 > p0 else -np.inf for p0, p1 in slices]
        ref = [t if t > -np.inf else 0.0 for t in tops]  # each slice's fold's
        runs = []  # per slice: (start, end, fold) of each thread's run, relative to the slice's reference
        for (p0, p1), r0 in zip(slices, ref):
            run = -(-(p1 - p0) // threads)
            rs = []
            for t in range(threads):
                i0, i1 = min(p1, p0 + t * run), min(p1, p0 + t * run + run)
                fold = IDENTITY
                for i in range(i0, i1):
                    fold = _push(fold, i, np.exp(x[h, i] - r0), keep, w)
                rs.append((i0, i1, fold))
            runs.append(rs)
        for r, (p0, p1) in enumerate(slices):
            big = max(tops[: r + 1])  # the rewalk's reference
            pre = IDENTITY
            for k in range(r):
                slice_fold = IDENTITY
                for _, _, fold in runs[k]:
                    slice_fold = _then(slice_fold, fold)
                slice_fold = _scaled(slice_fold, np.exp(tops[k] - big) if tops[k] > -np.inf else 0.0)
                pre = _then(pre, slice_fold)
            own = np.exp(tops[r] - big) if tops[r] > -np.inf else 0.0
            before = IDENTITY  # this slice's threads' exclusive prefix
            for i0, i1, fold in runs[r]:
                st = _then(pre, _scaled(before, own))
                for i in range(i0, i1):
                    st = _push(st, i, np.exp(x[h, i] - (big if big > -np.inf else 0.0)), keep, w)
                    if not _holds(st, n - 1 - i, stop, tau):
                        holds_all[i] = False
                before = _then(before, fold)
    return _first_len(holds_all, n, forced, margin)


def compare(cases: int, threads: int, seed: int, cluster: int = 1) -> int:
    """Random groups (1-4 heads, 2-199 blocks, 0-2 forced, tau 0.5-0.99, both rules) against psa_ref: how many
    first chunks differ (v2, or with ``cluster`` > 1 v6)."""
    from psa_ref.progressive import ESTIMATED_STOP_MARGIN, estimated_stop_first_chunk

    rng = np.random.default_rng(seed)
    bad = 0
    for _ in range(cases):
        g, n = int(rng.integers(1, 5)), int(rng.integers(2, 200))
        forced = min(int(rng.integers(0, 3)), n - 1)
        x = rng.standard_normal((g, n)) * rng.choice([0.5, 2.0, 5.0])
        tau, stop = float(rng.uniform(0.5, 0.99)), str(rng.choice(["ema", "remaining"]))
        want = estimated_stop_first_chunk(x, np.arange(n), forced, np.ones(n), tau, stop)
        if cluster > 1:
            got = emulate_cluster(x, n, forced, tau, stop, ESTIMATED_STOP_MARGIN, threads, cluster)
        else:
            got = emulate(x, n, forced, tau, stop, ESTIMATED_STOP_MARGIN, threads)
        bad += got != want
    return bad


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=int, default=300)
    ap.add_argument("--threads", type=int, default=64, help="threads of the emulated CTA (the kernel's: 512)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--cluster", type=int, default=1, help="CTAs a group: 1 emulates v2, more v6")
    args = ap.parse_args(argv)
    bad = compare(args.cases, args.threads, args.seed, args.cluster)
    print(f"{bad} of {args.cases} groups differ from psa_ref")


if __name__ == "__main__":
    main()
