// NEXT (not in the package; benchmarks/device_pending.sh s33a swaps it in with order_merge.cu beside it): the
// package's psa_order_slice writing each sorted slice's keys as two word arrays, the high words (the score's
// orderable bits, 0xFFFFFFFF for forced blocks) first and the low words (0xFFFFFFFF - block index) after them, so
// that psa_order_merge copies only the high words into shared memory (half the bytes; the thirty-first session's
// design, benchmarks/NOTES.md).
//
//   scores   [B, Gn, Nmax] float (from psa_estimate)
//   sorted   [B, Gn, P * PSA_SN] u64 out, read as [B, Gn, 2, P * PSA_SN] u32: the group's high words (slice p at
//            p * PSA_SN .., sorted descending by the whole key), then its low words in the same places
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
    load_keys(k, srow, n, slice * PSA_SN, sink_blocks, recent_blocks);

    block_sort_desc(k, keys);

    const int total = P * PSA_SN;
    unsigned int* hi = reinterpret_cast<unsigned int*>(sorted + ((long)b * Gn + g) * total) + slice * PSA_SN;
    unsigned int* lo = hi + total;
#pragma unroll
    for (int r = 0; r < PSA_KPT; ++r) {
        hi[tid * PSA_KPT + r] = (unsigned int)(k[r] >> 32);
        lo[tid * PSA_KPT + r] = (unsigned int)(k[r] & 0xFFFFFFFFull);
    }
}
