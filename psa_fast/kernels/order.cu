// Stage 2b on the GPU: the processing order of every selection group.
//
// One CTA per group sorts all the group's keys (sort.cuh) and writes the order; long caches use
// psa_order_slice + psa_order_merge instead, which spread a group over many CTAs. (The suffix sums
// that certified and sketch need along the order are psa_order_suffix, suffix.cu.)
//
//   scores       [B, Gn, Nmax] float (from psa_estimate)
//   order        [B, Gn, Nmax] int out: block indices in processing order (first N_b valid)
#include "sort.cuh"

extern "C" __global__ void __launch_bounds__(PSA_SORT_THREADS)
psa_order(const float* __restrict__ scores, const int* __restrict__ seq_lens, int* __restrict__ order, int Nmax,
          int sink_blocks, int recent_blocks) {
    extern __shared__ u64 keys[];  // PSA_SN keys: exchange buffer of the long stages
    const int b = blockIdx.y, g = blockIdx.x, Gn = gridDim.x;
    const int len = seq_lens[b];
    const int n = (len + PSA_S - 1) / PSA_S;
    const float* srow = scores + ((long)b * Gn + g) * Nmax;
    const int tid = threadIdx.x;

    u64 k[PSA_KPT];
    load_keys(k, srow, n, Nmax, 0, sink_blocks, recent_blocks);

    block_sort_desc(k, keys);

    int* orow = order + ((long)b * Gn + g) * Nmax;
#pragma unroll
    for (int r = 0; r < PSA_KPT; ++r) {
        const int i = tid * PSA_KPT + r;
        if (i < Nmax) orow[i] = i < n ? (int)(0xFFFFFFFFu - (unsigned int)(k[r] & 0xFFFFFFFFull)) : -1;
    }
}
