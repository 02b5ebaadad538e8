// Offload: the blocks that iteration `j` of the progressive loop will attend, as host-store ids,
// for the GPU pool to make resident before the iteration's decode launch (psa_fast.offload).
//
// Chunk boundaries as in decode.cu: the forced blocks form the first chunk, then `step` blocks at
// a time. A group that has already stopped (istate's reason >= 0) and positions past the end of
// its order get -1, which the pool skips.
//
//   order       [B, Gn, Nmax] int: processing order of each selection group
//   istate      [B * Gn, 4] int: the offload decode's loop state (reason at index 2)
//   seq_lens    [B] int
//   store_table [B, Hkv, Nmax] int: host-store id of each block
//   ids         [B, Gn, C] int out, C >= the largest chunk
//   head        positions of `order` that hold blocks (top-k: k; PSA: Nmax)
#include "common.cuh"

extern "C" __global__ void psa_iteration_ids(const int* __restrict__ order, const int* __restrict__ istate,
                                             const int* __restrict__ seq_lens, const int* __restrict__ store_table,
                                             int* __restrict__ ids, int Hq, int Hkv, int Nmax, int C,
                                             const int* __restrict__ iteration, int forced, int step, int head) {
    const int j = *iteration;
    const int g = blockIdx.x, b = blockIdx.y, Gn = gridDim.x;
    const long gi = (long)b * Gn + g;
    const int n = (seq_lens[b] + PSA_S - 1) / PSA_S;
    const int first = min(n, forced);
    int lo, hi;
    if (first > 0) {
        lo = j == 0 ? 0 : first + (j - 1) * step;
        hi = j == 0 ? first : lo + step;
    } else {
        lo = j * step;
        hi = lo + step;
    }
    hi = min(hi, min(n, head));  // top-k's order holds only its head (psa_order_head): nothing past it
    const bool running = istate[gi * 4 + 2] < 0;
    const int kv = g * PSA_G / (Hq / Hkv);
    for (int i = threadIdx.x; i < C; i += blockDim.x) {
        const int p = lo + i;
        ids[gi * C + i] = running && p < hi ? store_table[((long)b * Hkv + kv) * Nmax + order[gi * Nmax + p]] : -1;
    }
}
