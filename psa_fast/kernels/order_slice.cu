// Stage 2b on the GPU, for long caches: the first half of a two-kernel sort. Every CTA sorts one
// slice of PSA_NPAD blocks of a group, exactly like psa_order sorts a whole group, and writes the
// sorted 64-bit keys; psa_order_merge then places every key at its global rank. With one CTA per
// group, psa_order left 124 of 132 SMs idle at B = 1 and took 80 µs at 8192 blocks.
//
// Keys as in psa_order (order.cu); the sort is sort.cuh's.
//
//   scores   [B, Gn, Nmax] float (from psa_estimate)
//   sorted   [B, Gn, P * PSA_SN] u64 out: slice p holds blocks p * PSA_SN .., sorted descending
#include "sort.cuh"

extern "C" __global__ void __launch_bounds__(PSA_SORT_THREADS)
psa_order_slice(const float* __restrict__ scores, const int* __restrict__ seq_lens, u64* __restrict__ sorted,
                int Nmax, int sink_blocks, int recent_blocks) {
    extern __shared__ u64 keys[];  // PSA_SN keys: exchange buffer of the long stages; reused by the scan
    const int b = blockIdx.z, g = blockIdx.y, Gn = gridDim.y, slice = blockIdx.x, P = gridDim.x;
    const int len = seq_lens[b];
    const int n = (len + PSA_S - 1) / PSA_S;
    const float* srow = scores + ((long)b * Gn + g) * Nmax;
    const int tid = threadIdx.x;

    u64 k[PSA_KPT];
    load_keys(k, srow, n, Nmax, slice * PSA_SN, sink_blocks, recent_blocks);

    block_sort_desc(k, keys);

    u64* out = sorted + (((long)b * Gn + g) * P + slice) * PSA_SN;
#pragma unroll
    for (int r = 0; r < PSA_KPT; ++r) out[tid * PSA_KPT + r] = k[r];
}
