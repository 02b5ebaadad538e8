// NEXT (not in the package; benchmarks/device_pending.sh s33a swaps it in with order_slice.cu beside it): the
// package's psa_order_merge over keys kept as two word arrays (this folder's order_slice.cu): each CTA copies only
// the group's high words into shared memory (P * SL * 4 bytes, half the package's copy), and a probe reads a low
// word from global memory only where the high words tie (forced blocks, equal scores). The ranks and so the order
// are the package's: the comparison is the whole key's.
//
//   sorted   [B, Gn, P * SL] u64 read as [B, Gn, 2, P * SL] u32 (high words, then low words)
//   order    [B, Gn, Nmax] int out: block indices in processing order; -1 past the group's N_b blocks
//   dynamic shared memory: P * SL high words (the host may give more)
#include "common.cuh"

typedef unsigned long long u64;

extern "C" __global__ void __launch_bounds__(256)
psa_order_merge(const u64* __restrict__ sorted, const int* __restrict__ seq_lens, int* __restrict__ order, int Nmax,
                int P, int SL) {
    extern __shared__ __align__(16) unsigned int sh[];
    const int b = blockIdx.z, g = blockIdx.y, Gn = gridDim.y;
    const int e = blockIdx.x * blockDim.x + threadIdx.x;
    const int n = (seq_lens[b] + PSA_S - 1) / PSA_S;
    const int total = P * SL;  // a multiple of 4: SL is a power of two >= 4
    int* orow = order + ((long)b * Gn + g) * Nmax;
    if (e >= n && e < Nmax) orow[e] = -1;
    const unsigned int* hi = reinterpret_cast<const unsigned int*>(sorted + ((long)b * Gn + g) * total);
    const unsigned int* lo = hi + total;
#pragma unroll 8
    for (int i = threadIdx.x; i < total / 4; i += blockDim.x)
        reinterpret_cast<uint4*>(sh)[i] = __ldcg(reinterpret_cast<const uint4*>(hi) + i);
    __syncthreads();
    if (e >= total) return;
    const unsigned int hk = sh[e], lk = __ldcg(lo + e);
    if (hk == 0u && lk == 0u) return;  // padding
    const int mine = e / SL;
    int rank = e - mine * SL;
    // Position j's key above (hk, lk)? Its high word decides unless the two tie; then its low word (from L2).
    auto above = [&](int j) {
        const unsigned int h = sh[j];
        return h > hk || (h == hk && __ldcg(lo + j) > lk);
    };
    for (int p0 = 0; p0 < P; p0 += 8) {
        int s[8], count[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            s[i] = min(p0 + i, P - 1) * SL - 1;  // position s[i] + c holds the slice's key c - 1
            count[i] = 0;
        }
        for (int half = SL >> 1; half > 0; half >>= 1) {
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                const int at = count[i] + half;
                count[i] = above(s[i] + at) ? at : count[i];
            }
        }
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            count[i] += above(s[i] + count[i] + 1);
            if (p0 + i < P && p0 + i != mine) rank += count[i];
        }
    }
    orow[rank] = (int)(0xFFFFFFFFu - lk);
}
