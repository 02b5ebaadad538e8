// Stage 2b on the GPU, for long caches: the second half of the two-kernel sort. Every key of every
// sorted slice (psa_order_slice) finds its global rank -- its position in its own slice plus, for
// each other slice, how many keys there are larger (keys are unique but for the zero padding) -- and
// writes its block index there. PSA_MERGE_LANES threads a key (default one), many CTAs per group.
//
//   sorted   [B, Gn, P * SL] u64: P slices of SL keys (SL a power of two), each sorted descending
//   order    [B, Gn, Nmax] int out: block indices in processing order; -1 past the group's N_b blocks
#include "common.cuh"

typedef unsigned long long u64;

#ifndef PSA_MERGE_LANES
#define PSA_MERGE_LANES 1  // _kernels.MERGE_LANES: threads a key (1, 2, 4 or 8), each searching its share of the slices
#endif
#define PSA_MERGE_WIDTH (8 / PSA_MERGE_LANES)  // slices a thread searches at once

extern "C" __global__ void __launch_bounds__(256)
psa_order_merge(const u64* __restrict__ sorted, const int* __restrict__ seq_lens, int* __restrict__ order, int Nmax,
                int P, int SL) {
    const int b = blockIdx.z, g = blockIdx.y, Gn = gridDim.y;
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    const int e = t / PSA_MERGE_LANES, sub = t % PSA_MERGE_LANES;  // a key's threads: consecutive lanes of one warp
    const int n = (seq_lens[b] + PSA_S - 1) / PSA_S;
    int* orow = order + ((long)b * Gn + g) * Nmax;
    if (sub == 0 && e >= n && e < Nmax) orow[e] = -1;
    if (e >= P * SL) return;
    const u64* keys = sorted + ((long)b * Gn + g) * P * SL;
    const u64 key = keys[e];
    if (key == 0ull) return;  // padding (all of the key's threads)
    const int mine = e / SL;
    int rank = sub == 0 ? e - mine * SL : 0;
    // Each other slice's count of keys above `key` by binary lifting, several slices at once, so that a key waits for
    // log2(SL) + 1 rounds of independent loads, not for P - 1 binary searches one after another (~70 dependent
    // loads at 8,192 blocks a group). The count is found among the first SL - 1 positions by halves SL / 2 .. 1,
    // so no probe reaches past its slice or needs a bound check; one last probe decides whether it is SL. The
    // kernel is bound by its instructions (their issue and latency), not by memory (ncu: benchmarks/NOTES.md):
    // with PSA_MERGE_LANES threads a key, each takes PSA_MERGE_WIDTH of every eight slices, and their counts are
    // summed across the key's lanes.
    for (int p0 = sub * PSA_MERGE_WIDTH; p0 < P; p0 += 8) {
        const u64* s[PSA_MERGE_WIDTH];
        int count[PSA_MERGE_WIDTH];
#pragma unroll
        for (int i = 0; i < PSA_MERGE_WIDTH; ++i) {
            s[i] = keys + (long)min(p0 + i, P - 1) * SL - 1;  // s[c] = slice[c - 1] (past the last slice: not counted)
            count[i] = 0;
        }
        for (int half = SL >> 1; half > 0; half >>= 1) {
#pragma unroll
            for (int i = 0; i < PSA_MERGE_WIDTH; ++i) {
                const int at = count[i] + half;
                count[i] = __ldg(s[i] + at) > key ? at : count[i];
            }
        }
#pragma unroll
        for (int i = 0; i < PSA_MERGE_WIDTH; ++i) {
            count[i] += __ldg(s[i] + count[i] + 1) > key;
            if (p0 + i < P && p0 + i != mine) rank += count[i];
        }
    }
#if PSA_MERGE_LANES > 1
    const int first = (threadIdx.x & 31) & ~(PSA_MERGE_LANES - 1);
    const unsigned lanes = ((1u << PSA_MERGE_LANES) - 1u) << first;
#pragma unroll
    for (int step = 1; step < PSA_MERGE_LANES; step <<= 1) rank += __shfl_xor_sync(lanes, rank, step);
    if (sub != 0) return;
#endif
    orow[rank] = (int)(0xFFFFFFFFu - (unsigned int)(key & 0xFFFFFFFFull));
}
