"""What HBM gives a gather of scattered pieces, the decode loop's access pattern: each selected block's K and V are
4 KiB pieces at Llama-3.1-8B's shape (16 tokens x 128 channels x 2 bytes), at slots spread over the pool.

A plain kernel (no MMA, no verifier) reads a random list of pieces with 16-byte streaming loads, each warp `--at-once`
pieces at a time, and the table prints GB/s on the bytes read against the read and copy ceilings measured in the same
run, by piece size (4, 8 and 64 KiB), by the pieces' order (random, sorted by address, consecutive) and by who reads
(the loop's 64 SMs of one 8-warp CTA, or every SM at 8 or 32 warps). Medians of CUDA events; the L2 is flushed (a
256 MiB write) before each repeat, so that no piece is read from it.

    python benchmarks/exp_gather_bw.py [--mb 50] [--pool-gb 4] [--reps 15]

Twenty-eighth session: the loop's attend phase moves ~3.1 TB/s at 128K, B = 1 (the loop clock, 50 MB an iteration),
and neither twice the SMs (the grid build) nor a cheaper order changed it. This says whether that is what scattered
4 KiB pieces give, or what the loop's warps leave in flight.
"""

from __future__ import annotations

import argparse

import numpy as np

_SOURCE = r"""
extern "C" __global__ void psa_gather(const uint4* __restrict__ pool, const long long* __restrict__ pieces,
                                      int n_pieces, unsigned int* __restrict__ out) {
    // PIECE_U4 16-byte words a piece; a warp takes AT_ONCE pieces at a time, all their loads issued before any is used
    const int lane = threadIdx.x & 31;
    const int warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, nwarps = (gridDim.x * blockDim.x) >> 5;
    unsigned int acc = 0u;
    // (a piece above 4 KiB is read 4 KiB a round: eight loads a lane a piece in flight)
    constexpr int PER = PIECE_U4 / 32 < 8 ? PIECE_U4 / 32 : 8, ROUNDS = PIECE_U4 / 32 / PER;
    for (int p0 = warp * AT_ONCE; p0 < n_pieces; p0 += nwarps * AT_ONCE) {
        const uint4* base[AT_ONCE];
#pragma unroll
        for (int a = 0; a < AT_ONCE; ++a) base[a] = pool + pieces[min(p0 + a, n_pieces - 1)] * PIECE_U4 + lane;
        for (int r = 0; r < ROUNDS; ++r) {
            uint4 v[AT_ONCE][PER];
#pragma unroll
            for (int a = 0; a < AT_ONCE; ++a)
#pragma unroll
                for (int i = 0; i < PER; ++i) v[a][i] = __ldcs(base[a] + 32 * (r * PER + i));
#pragma unroll
            for (int a = 0; a < AT_ONCE; ++a)
#pragma unroll
                for (int i = 0; i < PER; ++i) acc ^= v[a][i].x ^ v[a][i].y ^ v[a][i].z ^ v[a][i].w;
        }
    }
    if (acc == 0x9e3779b9u) out[0] = acc;  // keeps the loads; (almost) never writes
}
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=50.0, help="MB gathered a launch (one Llama 128K iteration: ~50)")
    ap.add_argument("--pool-gb", type=float, default=4.0, help="the pool the pieces are drawn from, GB")
    ap.add_argument("--reps", type=int, default=15)
    args = ap.parse_args()
    if args.mb <= 0 or args.pool_gb * 1e3 < 2 * args.mb:
        raise SystemExit("--mb must be > 0 and at most half the pool")

    import cupy

    from bench_decode import copy_ceiling_gbs, read_ceiling_gbs

    stream = cupy.cuda.Stream(non_blocking=True)
    copy_gbs, read_gbs = copy_ceiling_gbs(stream), read_ceiling_gbs(stream)
    print(f"# copy ceiling {copy_gbs:.0f} GB/s, read ceiling {read_gbs:.0f} GB/s; {args.mb:.0f} MB a launch from a "
          f"{args.pool_gb:.0f} GB pool")
    print("| piece | order | CTAs x warps | pieces a warp at once | µs | GB/s | ÷ read ceiling | ÷ copy ceiling |")
    print("|---|---|---|---|---|---|---|---|")
    rng = np.random.default_rng(0)
    sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
    with stream:
        pool = cupy.empty(int(args.pool_gb * 1e9) // 16 * 16, cupy.uint8)
        flush = cupy.empty(256 * 2**20, cupy.uint8)
        out = cupy.zeros(1, cupy.uint32)
        for piece_kib in (4, 8, 64):
            piece = piece_kib * 1024
            slots = pool.nbytes // piece
            n = int(args.mb * 1e6) // piece
            chosen = rng.choice(slots, size=n, replace=False)
            for order, ids in (("random", chosen), ("sorted", np.sort(chosen)), ("consecutive", np.arange(n))):
                dev_ids = cupy.asarray(ids.astype(np.int64))
                for ctas, warps in ((64, 8), (sms, 8), (4 * sms, 8)):
                    for at_once in (1, 2):
                        fn = cupy.RawKernel(_SOURCE, "psa_gather", options=(
                            f"-DPIECE_U4={piece // 16}", f"-DAT_ONCE={at_once}"))
                        times = []
                        for r in range(args.reps + 2):
                            flush.fill(r)
                            a, b = cupy.cuda.Event(), cupy.cuda.Event()
                            a.record(stream)
                            fn((ctas,), (32 * warps,), (pool, dev_ids, np.int32(n), out))
                            b.record(stream)
                            b.synchronize()
                            if r >= 2:
                                times.append(cupy.cuda.get_elapsed_time(a, b) * 1e3)
                        us = float(np.median(times))
                        gbs = n * piece / us / 1e3
                        print(f"| {piece_kib} KiB | {order} | {ctas} x {warps} | {at_once} | {us:.1f} | {gbs:.0f} | "
                              f"{gbs / read_gbs:.2f} | {gbs / copy_gbs:.2f} |", flush=True)


if __name__ == "__main__":
    main()
