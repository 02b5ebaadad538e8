// Stage 2b on the GPU for short orders: every block's position in the processing order by counting
// the blocks that precede it, the count spread over many CTAs.
//
// The order is the one order.cu and order_slice.cu + order_merge.cu sort (forced blocks first, then
// scores descending, ties by the lower block index), so block i's position is the number of blocks j
// with s_j > s_i, or s_j = s_i and j < i. That is n^2 comparisons a group: at n = 2048 about 0.1 ms on
// one SM, but ~2 µs over the GPU, where the sort of one CTA is issue-bound on its SM (1024 keys: ~9 µs)
// and the slices' merge is a second launch. So this kernel takes short orders (n^2 summed over the
// groups small enough: _kernels.order), the sorts the rest.
//
// A CTA owns 32 blocks i0 .. i0 + 31 of one group, one a lane, and loads the group's score words into
// shared memory (orderable() of the score, 0xFFFFFFFF for sink and recent blocks, 0 past n). Its warps
// take the group's blocks in tiles of 32 (warp w: tiles w, w + W, ...). Only the 32-bit words are
// compared, the tie by index being decided by the tile: a tile below the owned one counts s_j >= s_i,
// a tile above counts s_j > s_i, and the owned tile decides per lane. Padding words (0) are only in
// tiles at or above the owned one, where 0 > s_i never holds. The warps' counts add up in shared
// memory, and lane l writes block i0 + l at its position; CTAs owning positions n .. Nmax - 1 write -1.
//
//   scores   [B, Gn, Nmax] float (psa_estimate);  seq_lens [B] int
//   order    [B, Gn, Nmax] int out: block indices in processing order; -1 past the group's n blocks
// Launch: grid (ceil(Nmax / 32), Gn, B), PSA_WARPS * 32 threads, ceil(Nmax / 32) * 128 bytes of
// dynamic shared memory.
#include "common.cuh"

#ifndef PSA_RANK_CARRY
#define PSA_RANK_CARRY 1  // count by the carry of a subtraction (2 instructions a pair, not 3); 0: by compares
#endif

// How many of a tile's 32 words come before the owned block's word `w`: a >= w (a tile below the owned
// one), a > w (a tile above). By carry: the carry of a - w is a >= w, that of w - a is a <= w.
template <bool BELOW>
__device__ __forceinline__ int count_tile(const unsigned int* __restrict__ tile, unsigned int w) {
    const uint4* v = reinterpret_cast<const uint4*>(tile);
    int c[2] = {0, 0};
#pragma unroll
    for (int q = 0; q < 8; ++q) {
        const uint4 a = v[q];  // the same address for the whole warp: a broadcast
#if PSA_RANK_CARRY
        if (BELOW)
            asm("{\n\t.reg .u32 t;\n\t"
                "sub.cc.u32 t, %1, %5;\n\taddc.u32 %0, %0, 0;\n\t"
                "sub.cc.u32 t, %2, %5;\n\taddc.u32 %0, %0, 0;\n\t"
                "sub.cc.u32 t, %3, %5;\n\taddc.u32 %0, %0, 0;\n\t"
                "sub.cc.u32 t, %4, %5;\n\taddc.u32 %0, %0, 0;\n\t}"
                : "+r"(c[q & 1]) : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "r"(w));
        else
            asm("{\n\t.reg .u32 t;\n\t"
                "sub.cc.u32 t, %5, %1;\n\taddc.u32 %0, %0, 0;\n\t"
                "sub.cc.u32 t, %5, %2;\n\taddc.u32 %0, %0, 0;\n\t"
                "sub.cc.u32 t, %5, %3;\n\taddc.u32 %0, %0, 0;\n\t"
                "sub.cc.u32 t, %5, %4;\n\taddc.u32 %0, %0, 0;\n\t}"
                : "+r"(c[q & 1]) : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "r"(w));
#else
        c[q & 1] += BELOW ? (a.x >= w) + (a.y >= w) + (a.z >= w) + (a.w >= w)
                          : (a.x <= w) + (a.y <= w) + (a.z <= w) + (a.w <= w);
#endif
    }
    return BELOW ? c[0] + c[1] : 32 - c[0] - c[1];
}

extern "C" __global__ void __launch_bounds__(PSA_WARPS * 32)
psa_order_rank(const float* __restrict__ scores, const int* __restrict__ seq_lens, int* __restrict__ order, int Nmax,
               int sink_blocks, int recent_blocks) {
    extern __shared__ __align__(16) unsigned int words[];  // the group's tiles * 32 score words
    __shared__ int part[PSA_WARPS][32];
    const int b = blockIdx.z, g = blockIdx.y, Gn = gridDim.y, own = blockIdx.x;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int n = (seq_lens[b] + PSA_S - 1) / PSA_S;
    const int i = own * 32 + lane;
    int* orow = order + ((long)b * Gn + g) * Nmax;
    if (own * 32 >= n) {  // positions past the group's blocks only
        if (warp == 0 && i < Nmax) orow[i] = -1;
        return;
    }
    const float* srow = scores + ((long)b * Gn + g) * Nmax;
    const int tiles = (n + 31) >> 5;
    for (int j = threadIdx.x; j < tiles * 32; j += PSA_WARPS * 32) {
        unsigned int w = 0u;
        if (j < n) w = (j < sink_blocks || j >= n - recent_blocks) ? 0xFFFFFFFFu : orderable(srow[j]);
        words[j] = w;
    }
    __syncthreads();

    const unsigned int w = words[i];
    int c = 0;
    for (int t = warp; t < tiles; t += PSA_WARPS) {
        const unsigned int* tile = words + t * 32;
        if (t < own) {
            c += count_tile<true>(tile, w);
        } else if (t > own) {
            c += count_tile<false>(tile, w);
        } else {
#pragma unroll
            for (int j = 0; j < 32; ++j) c += j < lane ? (tile[j] >= w) : (tile[j] > w);
        }
    }
    part[warp][lane] = c;
    __syncthreads();
    if (warp == 0) {
        int pos = 0;
#pragma unroll
        for (int v = 0; v < PSA_WARPS; ++v) pos += part[v][lane];
        if (i < n) orow[pos] = i;
        else if (i < Nmax) orow[i] = -1;
    }
}
