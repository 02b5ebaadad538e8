// psa_estimate_mma's scoring of a warp's tiles (estimate_mma.cu's header comment describes the method), shared with
// psa_estimate_order (estimate_order.cu), which keeps the group scores in shared memory for its sort.
#pragma once
#include "common.cuh"
#include "mma.cuh"

#ifndef PSA_EST_WARP_BLOCKS
#define PSA_EST_WARP_BLOCKS 32
#endif
#define PSA_K (PSA_KIND == 0 ? 2 * PSA_D : PSA_D)  // the dot product's length
#define PSA_KC (PSA_K / 32)                         // chunks of 32 channels (two MMAs each)
#ifndef PSA_EST_KG
#define PSA_EST_KG 16  // _kernels.ESTIMATE_MMA_CHUNK_GROUP
#endif
#define PSA_KG (PSA_KC < PSA_EST_KG ? PSA_KC : PSA_EST_KG)  // chunks whose loads are issued together
static_assert(PSA_KIND == 0 || PSA_KIND == 2, "estimate_mma scores cuboid_mean and mean (minmax: estimate.cu)");
static_assert(PSA_BOUNDS != 1, "the certified bounds need lo/hi per channel: estimate.cu");
static_assert(PSA_G <= 4, "estimate_mma packs at most 4 heads' hi and lo parts into the MMA's 8 columns");
static_assert(PSA_EST_WARP_BLOCKS % 16 == 0, "a warp scores whole tiles of 16 blocks");
static_assert(PSA_K % 32 == 0 && PSA_KC % PSA_KG == 0, "estimate_mma reads rows in chunks of 32 channels");
static_assert(!PSA_BF16, "metadata is float16");

// Score blocks jw .. jend - 1 (whole tiles of 16 from jw; at most Nmax) of request b's KV head kv (its metadata rows
// in `meta`) for the PSA_G query heads from h0 (their rows of `q`): best_out(j, s) receives block j's group score (the
// maximum over the heads; -inf from n_blocks on) from one lane, head_out(h, j, est) each head's own estimate
// (PSA_BOUNDS 2 only).
template <class Best, class Head>
__device__ __forceinline__ void estimate_tiles(const q_in_t* q, const __half* meta, int b,
                                               int h0, int kv, int Hq, int Hkv, int Nmax, int n_blocks, int jw,
                                               int jend, float q_scale, int lane, Best best_out, Head head_out) {
    const int r = lane >> 2, quad = lane & 3;
    const uint4* rows = reinterpret_cast<const uint4*>(meta + ((long)b * Hkv + kv) * Nmax * 2 * PSA_D);
    // load(j0, c0): chunks c0 .. c0 + PSA_KG - 1 of the tile at j0 (zero past Nmax; past the sequence's blocks
    // their scores become -inf)
    uint4 ra[PSA_KG], rb[PSA_KG];  // rows j0 + r and j0 + r + 8
    auto load = [&](int j0, int c0) {
        const bool in0 = j0 + r < Nmax, in1 = j0 + r + 8 < Nmax;
        const uint4* row0 = rows + (long)(j0 + r) * (2 * PSA_D / 8) + quad;
        const uint4* row1 = row0 + 8 * (2 * PSA_D / 8);
#pragma unroll
        for (int i = 0; i < PSA_KG; ++i) {
            ra[i] = in0 ? __ldg(row0 + 4 * (c0 + i)) : make_uint4(0u, 0u, 0u, 0u);
            rb[i] = in1 ? __ldg(row1 + 4 * (c0 + i)) : make_uint4(0u, 0u, 0u, 0u);
        }
    };
    load(jw, 0);  // in flight while the query's fragments are built (the query is another load away)

    // B: column r carries head r & 3's vector (q, then |q| for the radius), its hi part (r < 4) or lo part;
    // for chunk c, lane quad holds channels k = 32 c + 8 quad + 0..7 in order: registers 0, 1 are the first
    // MMA's k slots (2 quad, + 1) and (2 quad + 8, + 9), registers 2, 3 the second MMA's.
    const int bh = r & 3;
    const float lo_part = r >= 4 ? 1.f : 0.f;
    const q_in_t* qh = q + ((long)b * Hq + h0 + bh) * PSA_D;
    unsigned int bq[PSA_KC][4];
#pragma unroll
    for (int c = 0; c < PSA_KC; ++c)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int k = 32 * c + 8 * quad + 2 * i;  // channels k, k + 1: both of q or both of |q| (PSA_D is even)
            const float2 x = bh < PSA_G ? query_pair(qh + (k < PSA_D ? k : k - PSA_D), q_scale) : make_float2(0.f, 0.f);
            bq[c][i] = k < PSA_D ? pack_part(x.x, x.y, lo_part) : pack_part(fabsf(x.x), fabsf(x.y), lo_part);
        }

    for (int j0 = jw; j0 < jend; j0 += 16) {
        float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int c0 = 0; c0 < PSA_KC; c0 += PSA_KG) {
            if (c0 > 0) load(j0, c0);  // chunk group 0 was loaded ahead
#pragma unroll
            for (int i = 0; i < PSA_KG; ++i) {
                const unsigned int a0[4] = {ra[i].x, rb[i].x, ra[i].y, rb[i].y};
                const unsigned int a1[4] = {ra[i].z, rb[i].z, ra[i].w, rb[i].w};
                mma16(acc, a0, bq[c0 + i][0], bq[c0 + i][1]);
                mma16(acc, a1, bq[c0 + i][2], bq[c0 + i][3]);
            }
        }
        if (j0 + 16 < jend) load(j0 + 16, 0);  // the next tile's first rows, in flight during this one's writes
        // acc: blocks j0 + r (elements 0, 1) and j0 + r + 8 (2, 3), columns 2 quad + e; the lo columns
        // 4..7 sit in lane ^ 2, so lanes with quad < 2 hold head 2 quad + e's hi + lo.
        float best[2] = {-PSA_INF, -PSA_INF};
#pragma unroll
        for (int u = 0; u < 2; ++u)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const float x = acc[2 * u + e], y = __shfl_xor_sync(0xffffffffu, x, 2);
                const int j = j0 + r + 8 * u, h = 2 * quad + e;
                const float est = j < n_blocks ? x + y : -PSA_INF;
                if (quad < 2 && h < PSA_G) {
                    best[u] = fmaxf(best[u], est);
                    if (PSA_BOUNDS == 2 && j < jend) head_out(h, j, est);
                }
            }
#pragma unroll
        for (int u = 0; u < 2; ++u) {
            best[u] = fmaxf(best[u], __shfl_xor_sync(0xffffffffu, best[u], 1));
            const int j = j0 + r + 8 * u;
            if (quad == 0 && j < jend) best_out(j, best[u]);
        }
    }
}
