// Stage 2b on the GPU, for long caches: the second half of the two-kernel sort. Every key of every
// sorted slice (psa_order_slice) finds its global rank -- its position in its own slice plus, for
// each other slice, how many keys there are larger (a binary search; keys are unique but for the
// zero padding) -- and writes its block index there. One thread per key, many CTAs per group.
//
//   sorted   [B, Gn, P * SL] u64: P slices of SL keys, each sorted descending
//   order    [B, Gn, Nmax] int out: block indices in processing order; -1 past the group's N_b blocks
#include "common.cuh"

typedef unsigned long long u64;

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
    orow[rank] = (int)(0xFFFFFFFFu - (unsigned int)(key & 0xFFFFFFFFull));
}
