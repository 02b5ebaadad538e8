// Stage 2b on the GPU for short orders: every block's position in the processing order by counting
// the blocks that precede it, the count spread over many CTAs.
//
// The order is the one order.cu and order_slice.cu + order_merge.cu sort (forced blocks first, then
// scores descending, ties by the lower block index), so block i's position is the number of blocks j
// with s_j > s_i, or s_j = s_i and j < i. That is n^2 comparisons a group, spread over the GPU: 4.6 µs
// for one group of 2048 blocks on the H200, where the sort of one CTA is issue-bound on its SM (19.4 µs)
// and the slices + merge take 12.6. The count grows with B x Gn x n^2, so this kernel takes one request and
// small batches (_kernels.order_method, a cost model of the measured times), the sorts the rest.
//
// A CTA owns 32 blocks i0 .. i0 + 31 of one group, one a lane (PSA_RANK_OWN tiles of 32, as many a lane,
// compare each word read with that many owned words), and loads the group's score words into
// shared memory (orderable() of the score, 0xFFFFFFFF for sink and recent blocks, 0 past n). Its warps
// take the group's blocks in tiles of 32 (warp w: tiles w, w + W, ...). Only the 32-bit words are
// compared, the tie by index being decided by the tile: a tile below the owned one counts s_j >= s_i,
// a tile above counts s_j > s_i, and the owned tile decides per lane. Padding words (0) are only in
// tiles at or above the owned one, where 0 > s_i never holds. The warps' counts add up in shared
// memory, and lane l writes block i0 + l at its position; CTAs owning positions n .. Nmax - 1 write -1.
//
//   scores   [B, Gn, Nmax] float (psa_estimate);  seq_lens [B] int
//   order    [B, Gn, Nmax] int out: block indices in processing order; -1 past the group's n blocks
// Launch: grid (ceil(Nmax / (32 PSA_RANK_OWN)), Gn, B), PSA_WARPS * 32 threads, ceil(Nmax / 32) * 128 bytes
// of dynamic shared memory. PSA_L2_FIRST (common.cuh): the blocks placed among the decode's first ones have their K
// and V asked into L2 by the lane that writes them (their slots loaded before the count).
#include "common.cuh"

#ifndef PSA_RANK_CARRY
#define PSA_RANK_CARRY 1  // count by the carry of a subtraction (2 instructions a pair, not 3); 0: by compares
#endif
#ifndef PSA_RANK_OWN
#define PSA_RANK_OWN 1  // blocks a lane owns (a CTA 32 x as many): each word read is compared with this many
#endif
#define PSA_RO PSA_RANK_OWN

// c += how many of a's 4 words come before the owned word w when BELOW (a >= w), or how many do not when
// above (a <= w: the caller takes it from 32). The carry of a - w is a >= w, that of w - a is a <= w.
template <bool BELOW>
__device__ __forceinline__ void count4(int& c, const uint4 a, unsigned int w) {
#if PSA_RANK_CARRY
    if (BELOW)
        asm("{\n\t.reg .u32 t;\n\t"
            "sub.cc.u32 t, %1, %5;\n\taddc.u32 %0, %0, 0;\n\t"
            "sub.cc.u32 t, %2, %5;\n\taddc.u32 %0, %0, 0;\n\t"
            "sub.cc.u32 t, %3, %5;\n\taddc.u32 %0, %0, 0;\n\t"
            "sub.cc.u32 t, %4, %5;\n\taddc.u32 %0, %0, 0;\n\t}"
            : "+r"(c) : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "r"(w));
    else
        asm("{\n\t.reg .u32 t;\n\t"
            "sub.cc.u32 t, %5, %1;\n\taddc.u32 %0, %0, 0;\n\t"
            "sub.cc.u32 t, %5, %2;\n\taddc.u32 %0, %0, 0;\n\t"
            "sub.cc.u32 t, %5, %3;\n\taddc.u32 %0, %0, 0;\n\t"
            "sub.cc.u32 t, %5, %4;\n\taddc.u32 %0, %0, 0;\n\t}"
            : "+r"(c) : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "r"(w));
#else
    c += BELOW ? (a.x >= w) + (a.y >= w) + (a.z >= w) + (a.w >= w)
               : (a.x <= w) + (a.y <= w) + (a.z <= w) + (a.w <= w);
#endif
}

// c[r] += how many of a tile's 32 words come before owned word w[r], the tile wholly below the owned blocks
// (a >= w: a lower index wins the tie) or wholly above (a > w).
template <bool BELOW>
__device__ __forceinline__ void count_tile(const unsigned int* __restrict__ tile, const unsigned int (&w)[PSA_RO],
                                           int (&c)[PSA_RO]) {
    const uint4* v = reinterpret_cast<const uint4*>(tile);
    int k[PSA_RO][2] = {};
#pragma unroll
    for (int q = 0; q < 8; ++q) {
        const uint4 a = v[q];  // the same address for the whole warp: a broadcast
#pragma unroll
        for (int r = 0; r < PSA_RO; ++r) count4<BELOW>(k[r][q & 1], a, w[r]);
    }
#pragma unroll
    for (int r = 0; r < PSA_RO; ++r) c[r] += BELOW ? k[r][0] + k[r][1] : 32 - k[r][0] - k[r][1];
}

#ifndef PSA_RANK_BATCH
#define PSA_RANK_BATCH 8  // a thread's scores loaded this many at a time before their words are stored (below)
#endif
static_assert(PSA_RANK_BATCH > 0, "PSA_RANK_BATCH: scores loaded at a time");

extern "C" __global__ void __launch_bounds__(PSA_WARPS * 32)
psa_order_rank(const float* __restrict__ scores, const int* __restrict__ seq_lens, int* __restrict__ order, int Nmax,
               int sink_blocks, int recent_blocks PSA_L2_FIRST_PARAMS) {
    extern __shared__ __align__(16) unsigned int words[];  // the group's tiles * 32 score words
    __shared__ int part[PSA_WARPS][PSA_RO][32];
    const int b = blockIdx.z, g = blockIdx.y, Gn = gridDim.y;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int n = (seq_lens[b] + PSA_S - 1) / PSA_S;
    const int t0 = blockIdx.x * PSA_RO;  // the owned tiles t0 .. t0 + PSA_RO - 1; lane's block of tile t0 + r: i[r]
    int* orow = order + ((long)b * Gn + g) * Nmax;
    if (t0 * 32 >= n) {  // positions past the group's blocks only
        if (warp == 0)
#pragma unroll
            for (int r = 0; r < PSA_RO; ++r)
                if ((t0 + r) * 32 + lane < Nmax) orow[(t0 + r) * 32 + lane] = -1;
        return;
    }
    const float* srow = scores + ((long)b * Gn + g) * Nmax;
    const int tiles = (n + 31) >> 5;
    // A thread's scores requested PSA_RANK_BATCH at a time before any of their words is stored: a loop storing each
    // word right after its load had each store wait for its own load before the next load was issued (the loads sit
    // in branches between stores), up to 8 round trips a thread at 2,048 blocks (4.7 -> 3.6 µs at Gemma 3's 32K, one
    // request, H100; benchmarks/NOTES.md, s38i).
    constexpr int RB = PSA_RANK_BATCH, STRIDE = PSA_WARPS * 32;
    for (int j0 = threadIdx.x; j0 < tiles * 32; j0 += RB * STRIDE) {
        float x[RB];
#pragma unroll
        for (int u = 0; u < RB; ++u) x[u] = j0 + u * STRIDE < n ? __ldg(srow + j0 + u * STRIDE) : 0.f;
#pragma unroll
        for (int u = 0; u < RB; ++u) {
            const int j = j0 + u * STRIDE;
            if (j < tiles * 32) {
                unsigned int w = 0u;
                if (j < n) w = (j < sink_blocks || j >= n - recent_blocks) ? 0xFFFFFFFFu : orderable(x[u]);
                words[j] = w;
            }
        }
    }
    __syncthreads();

#if PSA_L2_FIRST
    int slot[PSA_RO];  // (warp 0, which writes the owned blocks: their slots, waited for only at the end)
#pragma unroll
    for (int r = 0; r < PSA_RO; ++r) {
        const int i = (t0 + r) * 32 + lane;
        slot[r] = warp == 0 && i < n ? __ldg(block_table + ((long)b * Gn + g) * Nmax + i) : 0;
    }
#endif
    unsigned int w[PSA_RO];
    int c[PSA_RO];
#pragma unroll
    for (int r = 0; r < PSA_RO; ++r) {
        const int i = (t0 + r) * 32 + lane;
        w[r] = i < n ? words[i] : 0u;
        c[r] = 0;
    }
    for (int t = warp; t < tiles; t += PSA_WARPS) {
        const unsigned int* tile = words + t * 32;
        if (t < t0) {
            count_tile<true>(tile, w, c);
        } else if (t >= t0 + PSA_RO) {
            count_tile<false>(tile, w, c);
        } else {  // an owned tile: the tie goes to the lower block index, word by word
#pragma unroll 4
            for (int j = 0; j < 32; ++j) {
                const unsigned int a = tile[j];
                const int blk = t * 32 + j;
#pragma unroll
                for (int r = 0; r < PSA_RO; ++r) c[r] += blk < (t0 + r) * 32 + lane ? (a >= w[r]) : (a > w[r]);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < PSA_RO; ++r) part[warp][r][lane] = c[r];
    __syncthreads();
    if (warp == 0) {
#pragma unroll
        for (int r = 0; r < PSA_RO; ++r) {
            const int i = (t0 + r) * 32 + lane;
            int pos = 0;
#pragma unroll
            for (int v = 0; v < PSA_WARPS; ++v) pos += part[v][r][lane];
            if (i < n) orow[pos] = i;
            else if (i < Nmax) orow[i] = -1;
#if PSA_L2_FIRST
            if (i < n && pos < l2_first) l2_ask_block(k_pool, v_pool, slot[r], tile_bytes);
#endif
        }
    }
}
