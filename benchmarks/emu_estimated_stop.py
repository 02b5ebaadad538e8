"""psa_estimated_stop's algorithm in NumPy (kernels/estimated_stop.cu), against psa_ref: each thread folds its run
of the order (the mass sum, the moving average as an affine map E -> a E + b, the running minimum), the folds are
composed in thread order into each thread's exclusive prefix, and each thread rewalks its run testing every
position as the loop tests a boundary; a position survives where every head holds; the first survivor past the
forced blocks, times the margin, is the first chunk. Checks random groups against
``psa_ref.progressive.estimated_stop_first_chunk`` and prints the mismatches (0 expected, float64 here).

    python benchmarks/emu_estimated_stop.py --cases 300 --threads 64
    python benchmarks/emu_estimated_stop.py --cases 300 --threads 64 --windows

``--windows`` emulates v4 instead: the order in windows of one position a thread, each window's masses relative to
the running maximum of the windows so far (the carried state rescaled when it grows), the scan of a window composed
with the state carried from the windows before it, and the walk leaving after the first window where a position
holds (so the kernel reads no further than the stop's window and the next one).
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


def emulate_windows(x: np.ndarray, n: int, forced: int, tau: float, stop: str, margin: float, threads: int) -> tuple:
    """v4's first_len for one group, and the windows it read: ``x [G, N]`` as in :func:`emulate`. Float32 as the
    kernel computes (the order of the sums differs from psa_ref's, hence the test's tolerance on tau)."""
    from psa_ref.progressive import EMA_WEIGHT

    f32 = np.float32
    keep, w = f32(1.0 - EMA_WEIGHT), f32(EMA_WEIGHT)
    g = x.shape[0]
    carry = [(f32(0), f32(1), f32(0), f32(np.inf)) for _ in range(g)]  # each head's state after the windows so far
    ref = np.full(g, -np.inf, f32)  # the running maximum the carried state is relative to
    for win, start in enumerate(range(0, n, threads)):
        stop_at = min(n, start + threads)
        xs = x[:, start:stop_at].astype(f32)
        new_ref = np.maximum(ref, xs.max(axis=1))
        holds = np.ones(stop_at - start, bool)
        for h in range(g):
            scale = f32(np.exp(f32(ref[h] - new_ref[h]))) if np.isfinite(ref[h]) else f32(0)
            s_, a_, b_, mn_ = carry[h]
            st = (s_ * scale, a_, b_ * scale, mn_ * scale if np.isfinite(mn_) else mn_)
            for k, i in enumerate(range(start, stop_at)):
                m = f32(np.exp(f32(xs[h, k] - new_ref[h])))
                a_i, b_i = (f32(0), m) if i == 0 else (keep, w * m)
                st = (st[0] + m, st[1] * a_i, st[2] * a_i + b_i, min(st[3], m))
                rest = st[2] if stop == "ema" else st[3]
                holds[k] &= bool(st[0] / (st[0] + f32(n - 1 - i) * rest) >= tau)
            carry[h] = st
        ref = new_ref
        hit = [start + k for k in range(stop_at - start) if holds[k] and start + k >= forced]
        if hit:
            best = hit[0]
            return min(n - forced, max(1, int(np.ceil(margin * (best + 1 - forced) - 1e-6)))), win + 1
    raise AssertionError("the last position always holds")


def compare(cases: int, threads: int, seed: int, windows: bool) -> tuple[int, int, float]:
    """Random groups (1-4 heads, 2-199 blocks, 0-2 forced, tau 0.5-0.99, both rules) against psa_ref: how many
    first chunks differ, how many of those lie within the reference's at tau -+ 1e-4 (v4 only), and the share of
    the order's windows v4 read on average (nan for v2)."""
    from psa_ref.progressive import ESTIMATED_STOP_MARGIN, estimated_stop_first_chunk

    rng = np.random.default_rng(seed)
    bad = near = 0
    read_share = []
    for _ in range(cases):
        g, n = int(rng.integers(1, 5)), int(rng.integers(2, 200))
        forced = min(int(rng.integers(0, 3)), n - 1)
        x = rng.standard_normal((g, n)) * rng.choice([0.5, 2.0, 5.0])
        tau, stop = float(rng.uniform(0.5, 0.99)), str(rng.choice(["ema", "remaining"]))
        want = estimated_stop_first_chunk(x, np.arange(n), forced, np.ones(n), tau, stop)
        if windows:
            got, read = emulate_windows(x, n, forced, tau, stop, ESTIMATED_STOP_MARGIN, threads)
            read_share.append(read / -(-n // threads))
            if got != want:  # float32 sums: allowed where tau within 1e-4 gives it (the GPU test's tolerance)
                lo, hi = (estimated_stop_first_chunk(x, np.arange(n), forced, np.ones(n), tau + d, stop)
                          for d in (-1e-4, 1e-4))
                near += lo <= got <= hi
        else:
            got = emulate(x, n, forced, tau, stop, ESTIMATED_STOP_MARGIN, threads)
        bad += got != want
    return bad, near, float(np.mean(read_share)) if read_share else float("nan")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=int, default=300)
    ap.add_argument("--threads", type=int, default=64, help="threads of the emulated CTA (the kernel's: 512)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--windows", action="store_true", help="emulate v4 (windows, running maximum) instead of v2")
    args = ap.parse_args(argv)
    bad, near, read = compare(args.cases, args.threads, args.seed, args.windows)
    print(f"{bad} of {args.cases} groups differ from psa_ref" + (f" ({near} within tau +- 1e-4); windows read "
          f"{read:.2f} of the order's on average" if args.windows else ""))


if __name__ == "__main__":
    main()
