"""psa_estimated_stop's algorithm in NumPy (kernels/estimated_stop.cu), against psa_ref: each thread folds its run
of the order (the mass sum, the moving average as an affine map E -> a E + b, the running minimum), the folds are
composed in thread order into each thread's exclusive prefix, and each thread rewalks its run testing every
position as the loop tests a boundary; a position survives where every head holds; the first survivor past the
forced blocks, times the margin, is the first chunk. Checks random groups against
``psa_ref.progressive.estimated_stop_first_chunk`` and prints the mismatches (0 expected, float64 here).

    python benchmarks/emu_estimated_stop.py --cases 300 --threads 64

(The windowed walk of v4 / v5 had its emulation here, ``--windows``, until the kernel was removed after the sixty-
fifth session: it is in git at commit 3239828.)
"""

from __future__ import annotations

import argparse

import numpy as np


def emulate(x: np.ndarray, n: int, forced: int, tau: float, stop: str, margin: float, threads: int) -> int:
    """The kernel's first_len for one group: ``x [G, N]`` the heads' estimated log masses in processing order."""
    from psa_ref.progressive import EMA_WEIGHT

    keep, w = 1.0 - EMA_WEIGHT, EMA_WEIGHT
    run = -(-n // threads)
    top = x[:, :n].max(axis=1)  # the kernel's common reference: the CTA's largest x of the head
    holds_all = np.ones(n, bool)

    def push(st, i, m):
        a_i, b_i = (0.0, m) if i == 0 else (keep, w * m)
        return (st[0] + m, st[1] * a_i, st[2] * a_i + b_i, min(st[3], m))

    for h in range(x.shape[0]):
        m = np.exp(x[h, :n] - top[h])
        prefix = (0.0, 1.0, 0.0, np.inf)  # the identity
        for t in range(threads):
            fold = (0.0, 1.0, 0.0, np.inf)
            st = prefix
            for i in range(t * run, min(n, (t + 1) * run)):
                fold = push(fold, i, m[i])
                st = push(st, i, m[i])
                rest = st[2] if stop == "ema" else st[3]
                if not st[0] / (st[0] + (n - 1 - i) * rest) >= tau:
                    holds_all[i] = False
            prefix = (prefix[0] + fold[0], prefix[1] * fold[1], prefix[2] * fold[1] + fold[2], min(prefix[3], fold[3]))
    best = next(i for i in range(forced, n) if holds_all[i])
    return min(n - forced, max(1, int(np.ceil(margin * (best + 1 - forced) - 1e-6))))


def compare(cases: int, threads: int, seed: int) -> int:
    """Random groups (1-4 heads, 2-199 blocks, 0-2 forced, tau 0.5-0.99, both rules) against psa_ref: how many
    first chunks differ."""
    from psa_ref.progressive import ESTIMATED_STOP_MARGIN, estimated_stop_first_chunk

    rng = np.random.default_rng(seed)
    bad = 0
    for _ in range(cases):
        g, n = int(rng.integers(1, 5)), int(rng.integers(2, 200))
        forced = min(int(rng.integers(0, 3)), n - 1)
        x = rng.standard_normal((g, n)) * rng.choice([0.5, 2.0, 5.0])
        tau, stop = float(rng.uniform(0.5, 0.99)), str(rng.choice(["ema", "remaining"]))
        want = estimated_stop_first_chunk(x, np.arange(n), forced, np.ones(n), tau, stop)
        bad += emulate(x, n, forced, tau, stop, ESTIMATED_STOP_MARGIN, threads) != want
    return bad


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=int, default=300)
    ap.add_argument("--threads", type=int, default=64, help="threads of the emulated CTA (the kernel's: 512)")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    bad = compare(args.cases, args.threads, args.seed)
    print(f"{bad} of {args.cases} groups differ from psa_ref")


if __name__ == "__main__":
    main()
