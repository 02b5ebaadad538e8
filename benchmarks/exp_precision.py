"""Probe: output error of the decode kernel against the conformance tolerance, over many drawn problems.

    python benchmarks/exp_precision.py [--cases 300]

For drawn problems (float16 K/V, D 128, one KV head, blocks of 5 or 16, step 1, tau 0.5/0.9/1, query scale
0.3/1/3) it prints the largest, median and 99th-percentile ratio of the output error to the tolerance of
invariant I1 (twice a naive float32 attention's error over the same blocks, plus 1e-6 max|v|) and how many
cases exceed it. benchmarks/NOTES.md has what it found (2026-11-30).
"""

import argparse

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", type=int, default=300)
    args = ap.parse_args()
    import cupy

    import psa_fast
    import psa_ref
    from psa_ref.testing.conformance import _naive_fp32

    rng = np.random.default_rng(0)
    ratios, scales = [], []
    for _ in range(args.cases):
        hq = int(rng.choice([1, 4, 8]))
        t = int(rng.integers(50, 400))
        s = int(rng.choice([5, 16]))
        qscale = float(rng.choice([0.3, 1.0, 3.0]))
        q = (rng.standard_normal((hq, 128)) * qscale).astype(np.float16)
        k = rng.standard_normal((1, t, 128)).astype(np.float16)
        v = rng.standard_normal((1, t, 128)).astype(np.float16)
        tau = float(rng.choice([0.5, 0.9, 1.0]))
        res = psa_fast.attention(cupy.asarray(q), psa_fast.KVBlocks.from_dense(cupy.asarray(k), cupy.asarray(v),
                                 block_size=s), tau, step=1)
        out = cupy.asnumpy(res.output).astype(np.float64)
        blocks = psa_ref.KVBlocks.from_dense(k, v, block_size=s)
        idx = blocks.token_indices(np.asarray(res.blocks_used[0]))
        k64, v64, sc = k[0].astype(np.float64), v[0].astype(np.float64), 1 / np.sqrt(128)
        worst = 0.0
        for h in range(hq):
            lg = sc * (k64[idx] @ q[h].astype(np.float64))
            w = np.exp(lg - lg.max())
            exact = (w @ v64[idx]) / w.sum()
            naive = np.abs(_naive_fp32(q[h].astype(np.float64), k64, v64, idx, sc) - exact).max()
            tol = 2 * naive + 1e-6 * np.abs(v64).max()
            worst = max(worst, np.abs(out[h] - exact).max() / tol)
        ratios.append(worst)
        scales.append(qscale)
    r, sc_all = np.array(ratios), np.array(scales)
    print(f"decode v3: error / tolerance max {r.max():.3f}, median {np.median(r):.3f}, "
          f"p99 {np.quantile(r, 0.99):.3f}, cases over 1: {(r > 1).sum()} of {r.size}", flush=True)
    for qs in np.unique(sc_all):
        rs = r[sc_all == qs]
        print(f"  query scale {qs}: max {rs.max():.3f}, median {np.median(rs):.3f}, over 1: {(rs > 1).sum()} of "
              f"{rs.size}", flush=True)


if __name__ == "__main__":
    main()
