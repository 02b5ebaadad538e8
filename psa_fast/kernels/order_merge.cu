// Stage 2b on the GPU, for long caches: the second half of the two-kernel sort. Every key of every
// sorted slice (psa_order_slice) finds its global rank -- its position in its own slice plus, for
// each other slice, how many keys there are larger (keys are unique but for the zero padding) -- and
// writes its block index there, one thread a key, many CTAs per group.
//
//   sorted   [B, Gn, P * SL] u64: P slices of SL keys (SL a power of two), each sorted descending
//   order    [B, Gn, Nmax] int out: block indices in processing order; -1 past the group's N_b blocks
//   dynamic shared memory: P * SL keys (the group's, <= 16,384: 128 KiB)
// PSA_L2_FIRST (common.cuh): the blocks placed among the decode's first ones have their K and V asked into L2 (each
// block's slot loaded before its searches).
//
// Each CTA first copies its group's keys into shared memory, all loads in flight at once, and then searches
// there. (Until the thirty-first session the searches read the keys through L1: a search's probes after the first
// few miss L1, so a key waited for ~20 dependent L2 round trips, ~12 µs for one group of 8,192 blocks at 16 slices;
// benchmarks/NOTES.md.)
#include "common.cuh"

typedef unsigned long long u64;

extern "C" __global__ void __launch_bounds__(256)
psa_order_merge(const u64* __restrict__ sorted, const int* __restrict__ seq_lens, int* __restrict__ order, int Nmax,
                int P, int SL PSA_L2_FIRST_PARAMS) {
    extern __shared__ __align__(16) u64 sk[];
    const int b = blockIdx.z, g = blockIdx.y, Gn = gridDim.y;
    const int e = blockIdx.x * blockDim.x + threadIdx.x;
    const int n = (seq_lens[b] + PSA_S - 1) / PSA_S;
    const int total = P * SL;  // even: SL is a power of two >= 2
    int* orow = order + ((long)b * Gn + g) * Nmax;
    if (e >= n && e < Nmax) orow[e] = -1;
    const uint4* src = reinterpret_cast<const uint4*>(sorted + ((long)b * Gn + g) * total);
#pragma unroll 8
    for (int i = threadIdx.x; i < total / 2; i += blockDim.x) reinterpret_cast<uint4*>(sk)[i] = __ldcg(src + i);
    __syncthreads();
    if (e >= total) return;
    const u64 key = sk[e];
    if (key == 0ull) return;  // padding
#define PSA_KEY_BLOCK(key) ((int)(0xFFFFFFFFu - (unsigned int)((key) & 0xFFFFFFFFull)))  // the key's block index
#if PSA_L2_FIRST
    const int slot = __ldg(block_table + ((long)b * Gn + g) * Nmax + PSA_KEY_BLOCK(key));
#endif
    const int mine = e / SL;
    int rank = e - mine * SL;
    // Each other slice's count of keys above `key` by binary lifting, eight slices at once (eight independent
    // shared-memory loads a round). The count is found among the first SL - 1 positions by halves SL / 2 .. 1, so no
    // probe reaches past its slice or needs a bound check; one last probe decides whether it is SL.
    for (int p0 = 0; p0 < P; p0 += 8) {
        int s[8], count[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            s[i] = min(p0 + i, P - 1) * SL - 1;  // sk[s[i] + c] = slice[c - 1] (past the last slice: not counted)
            count[i] = 0;
        }
        for (int half = SL >> 1; half > 0; half >>= 1) {
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                const int at = count[i] + half;
                count[i] = sk[s[i] + at] > key ? at : count[i];
            }
        }
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            count[i] += sk[s[i] + count[i] + 1] > key;
            if (p0 + i < P && p0 + i != mine) rank += count[i];
        }
    }
    orow[rank] = PSA_KEY_BLOCK(key);
#if PSA_L2_FIRST
    if (rank < l2_first) l2_ask_block(k_pool, v_pool, slot, tile_bytes);
#endif
}
