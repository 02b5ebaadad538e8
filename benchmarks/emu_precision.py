"""CPU emulation of decode v3's Q·K arithmetic on exp_precision.py's 300 problems (no GPU needed).

    python benchmarks/emu_precision.py

The tensor cores' float32 accumulation is modelled as an adder that aligns the accumulator and the k-step's 16
exact products to the largest of them, truncates each to `bits` bits below that, sums exactly and truncates the
result to 24 bits. For each variant the script prints the largest ratio of the output error to the I1 tolerance
(as exp_precision.py measures on the GPU) and how many problems exceed 1. benchmarks/NOTES.md, "Output precision
of decode v3", has the table and what it decided.
"""

import numpy as np

F16, F32 = np.float16, np.float32


def truncating_add(terms: np.ndarray, bits: int) -> np.ndarray:
    """Sum the last axis the way the modelled adder does."""
    m = np.abs(terms).max(axis=-1, keepdims=True)
    u = 2.0 ** (np.floor(np.log2(np.where(m > 0, m, 1))) - bits + 1)
    s = (np.trunc(terms / u) * u).sum(axis=-1)
    us = 2.0 ** (np.floor(np.log2(np.where(np.abs(s) > 0, np.abs(s), 1))) - 23)
    return np.trunc(s / us) * us


def logits(hi: np.ndarray, lo: np.ndarray, keys: np.ndarray, bits: int | None, fresh_every: int) -> np.ndarray:
    """Q·K over 8 k-steps of 16 channels, hi then lo products per step. bits None: exact accumulation.
    fresh_every 0: one chained accumulator; n: a fresh accumulator every n k-steps, added in float32."""
    if bits is None:
        return (keys @ (hi + lo)).astype(F32).astype(np.float64)
    acc = np.zeros(keys.shape[0])
    part = np.zeros(keys.shape[0])
    for ks in range(8):
        sl = slice(16 * ks, 16 * ks + 16)
        tgt = part if fresh_every else acc
        for half in (hi, lo):
            tgt = truncating_add(np.concatenate([tgt[:, None], keys[:, sl] * half[sl]], 1), bits)
        if not fresh_every:
            acc = tgt
        elif (ks + 1) % fresh_every == 0:
            acc = (acc.astype(F32) + tgt.astype(F32)).astype(np.float64)
            part = np.zeros(keys.shape[0])
        else:
            part = tgt
    return acc


VARIANTS = {  # name: (bits, fresh_every)
    "split only, exact accumulation": (None, 0),
    "chained, 24 bits": (24, 0),
    "chained, 25 bits": (25, 0),
    "fresh every k-step, 24 bits": (24, 1),
    "fresh every k-step, 25 bits": (25, 1),
    "fresh every 2 k-steps, 24 bits": (24, 2),
    "fresh every 2 k-steps, 25 bits": (25, 2),
}


def main() -> None:
    import psa_ref
    from psa_ref.testing.conformance import _naive_fp32

    rng = np.random.default_rng(0)  # the draws of exp_precision.py
    ratios = {name: [] for name in VARIANTS}
    for _ in range(300):
        hq, t, s = int(rng.choice([1, 4, 8])), int(rng.integers(50, 400)), int(rng.choice([5, 16]))
        qscale = float(rng.choice([0.3, 1.0, 3.0]))
        q = (rng.standard_normal((hq, 128)) * qscale).astype(F16)
        k = rng.standard_normal((1, t, 128)).astype(F16)
        v = rng.standard_normal((1, t, 128)).astype(F16)
        tau = float(rng.choice([0.5, 0.9, 1.0]))
        blocks = psa_ref.KVBlocks.from_dense(k, v, block_size=s)
        idx = blocks.token_indices(np.asarray(psa_ref.attention(q, blocks, tau, step=1).blocks_used[0]))
        k64, v64, sc = k[0].astype(np.float64)[idx], v[0].astype(np.float64), 1 / np.sqrt(128)
        for name, (bits, fresh) in VARIANTS.items():
            worst = 0.0
            for h in range(hq):
                lg = sc * (k64 @ q[h].astype(np.float64))
                w = np.exp(lg - lg.max())
                exact = (w @ v64[idx]) / w.sum()
                naive = np.abs(_naive_fp32(q[h].astype(np.float64), k[0].astype(np.float64), v64, idx, sc)
                               - exact).max()
                tol = 2 * naive + 1e-6 * np.abs(v64).max()
                q32 = q[h].astype(F32) * F32(sc)  # the query as decode v3 received it before the fix: scaled, split
                hi = q32.astype(F16)
                lo = (q32 - hi.astype(F32)).astype(F16)
                kl = logits(hi.astype(np.float64), lo.astype(np.float64), k64, bits, fresh)
                w = np.exp(kl - kl.max())
                worst = max(worst, np.abs((w @ v64[idx]) / w.sum() - exact).max() / tol)
            ratios[name].append(worst)
    for name, r in ratios.items():
        r = np.array(r)
        print(f"{name:<34} max {r.max():.3f}, over 1: {(r > 1).sum()} of {r.size}")


if __name__ == "__main__":
    main()
