// Stage 2b on the GPU, for long caches: the second half of the two-kernel sort. Every key of every
// sorted slice (psa_order_slice) finds its global rank -- its position in its own slice plus, for
// each other slice, how many keys there are larger (a binary search; keys are unique but for the
// zero padding) -- and writes its block index there. One thread per key, many CTAs per group.
//
//   sorted   [B, Gn, P * SL] u64: P slices of SL keys, each sorted descending
//   order    [B, Gn, Nmax] int out: block indices in processing order; -1 past the group's N_b blocks
#include "common.cuh"

typedef unsigned long long u64;

#ifndef PSA_MERGE_LIFT
#define PSA_MERGE_LIFT 0  // _kernels.ORDER_MERGE_LIFT: 1 the other slices searched eight at a time, 2 the same in
                          // fewer instructions (below)
#endif

extern "C" __global__ void __launch_bounds__(256)
psa_order_merge(const u64* __restrict__ sorted, const int* __restrict__ seq_lens, int* __restrict__ order, int Nmax,
                int P, int SL) {
    const int b = blockIdx.z, g = blockIdx.y, Gn = gridDim.y;
    const int e = blockIdx.x * blockDim.x + threadIdx.x;
    const int n = (seq_lens[b] + PSA_S - 1) / PSA_S;
    int* orow = order + ((long)b * Gn + g) * Nmax;
    if (e >= n && e < Nmax) orow[e] = -1;
    if (e >= P * SL) return;
    const u64* keys = sorted + ((long)b * Gn + g) * P * SL;
    const u64 key = keys[e];
    if (key == 0ull) return;  // padding
    const int mine = e / SL;
    int rank = e - mine * SL;
#if PSA_MERGE_LIFT == 2
    // As PSA_MERGE_LIFT 1, in fewer instructions a probe (the kernel issues ~2,700 a warp and waits on them, not on
    // memory: ncu, benchmarks/NOTES.md): each slice's count found among its first SL - 1 positions by halves
    // SL / 2 .. 1, so that no probe reaches past the slice and none needs a bound check, then one last probe decides
    // whether it is SL; a probe's address one wide multiply-add from the slice's pointer.
    for (int p0 = 0; p0 < P; p0 += 8) {
        const u64* s[8];
        int count[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            s[i] = keys + (long)min(p0 + i, P - 1) * SL - 1;  // s[c] = slice[c - 1] (past the last slice: not counted)
            count[i] = 0;
        }
        for (int half = SL >> 1; half > 0; half >>= 1) {
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                const int at = count[i] + half;
                count[i] = __ldg(s[i] + at) > key ? at : count[i];
            }
        }
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            count[i] += __ldg(s[i] + count[i] + 1) > key;
            if (p0 + i < P && p0 + i != mine) rank += count[i];
        }
    }
#elif PSA_MERGE_LIFT
    // The count of each other slice's keys above `key` by binary lifting (SL a power of two: the largest count c
    // with s[c - 1] > key), eight slices at once, so that a key waits for log2(SL) + 1 rounds of eight independent
    // loads, not for P - 1 searches one after another (~70 dependent loads at 8,192 blocks a group).
    for (int p0 = 0; p0 < P; p0 += 8) {
        const u64* s[8];
        int count[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            s[i] = keys + (long)min(p0 + i, P - 1) * SL;  // (past the last slice: searched, not counted)
            count[i] = 0;
        }
        for (int half = SL; half > 0; half >>= 1) {
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                const int at = count[i] + half;
                if (at <= SL && __ldg(s[i] + at - 1) > key) count[i] = at;
            }
        }
#pragma unroll
        for (int i = 0; i < 8; ++i)
            if (p0 + i < P && p0 + i != mine) rank += count[i];
    }
#else
    for (int p = 0; p < P; ++p) {
        if (p == mine) continue;
        const u64* s = keys + (long)p * SL;
        int lo = 0, hi = SL;  // count of keys > key in a descending slice: first position with s[pos] < key
        while (lo < hi) {
            const int mid = (lo + hi) >> 1;
            if (__ldg(s + mid) > key) lo = mid + 1;
            else hi = mid;
        }
        rank += lo;
    }
#endif
    orow[rank] = (int)(0xFFFFFFFFu - (unsigned int)(key & 0xFFFFFFFFull));
}
