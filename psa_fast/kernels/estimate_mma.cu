// Stage 1 on the GPU for metadata = "cuboid_mean" and "mean", on the tensor cores: the estimate of every block
// for every query head of a group of at most 4 (psa_estimate, estimate.cu, keeps minmax, the certified bounds
// and larger groups). For cuboid_mean the estimate is q . c + |q| . r (centre c, radius r), for mean q . m:
// one dot product of each block's metadata row (2 D halves, or D) with a fixed vector per head, so 16 blocks'
// rows are the A operand of mma.sync m16n8k16 (float16, exact) and the heads' vectors the B operand, each split
// into float16 hi and lo parts (about 22 bits): columns 0..G-1 the heads' hi parts, 4..4+G-1 their lo parts.
// One MMA covers 16 blocks x 16 channels for every head and both parts; the products are exact and accumulate in
// float32, and each head's hi and lo sums meet at the end.
//
// Memory (version 2): no shared memory. A dot product does not care in which order its terms meet, so the k
// slots of two MMAs are matched to the 8 consecutive channels a lane reads in one 16-byte load: for a chunk of
// 32 channels, lane (r, quad) loads channels 8 quad .. 8 quad + 7 of rows r and r + 8, whose four 32-bit words
// are the A registers of the chunk's two MMAs, and its B registers carry the same 8 channels of the heads'
// vectors. A row's 64 bytes of a chunk are two whole sectors. Version 1 staged 16 rows a warp by cp.async in
// shared memory (128 KiB a CTA at D 256): one CTA of 4 warps an SM, 6% occupancy, 30% of HBM (benchmarks/NOTES.md).
//
// Version 3: a tile's first chunks are loaded before the query's fragments are built (the query is another load
// away) and the next tile's while this one's scores are written, so no warp waits for two round trips in a row.
// Llama-3.1-8B's shape (H200): 6.2 -> 3.7 us at 32K B = 1, 91.9 -> 66.3 us at 128K B = 8 (4.0 TB/s on 268 MB);
// the compiler then keeps a chunk group's 16 loads in flight (130 registers at D 128, 70 before). A chunk group of up
// to 16 chunks (PSA_EST_KG; 8 until the thirty-fourth session) takes cuboid_mean's whole tile at D 256 at once too:
// 255 registers there, Gemma 3's 32K B = 32 estimate 23.2 -> 21.4 us.
//
//   q       [B, Hq, PSA_D]            float, already multiplied by the logit scale (PSA_QRAW 0); or the caller's
//                                     query (PSA_QRAW 1 float16, 2 bfloat16 bits, 3 float32) of head dim PSA_D,
//                                     multiplied here by q_scale, the same float32 product psa_scale_query writes
//                                     (so the plan can scale its copies for the decode on a parallel graph branch)
//   meta    [B, Hkv, Nmax, 2, PSA_D]  half: (centre, radius) for cuboid_mean, (mean, -) for mean
//   scores  [B, Hq/PSA_G, Nmax]       float out: max over the group's heads; -inf past the last block
//   bounds  [B, Hq, Nmax]             float out (PSA_BOUNDS 2): each head's own estimate
//   PSA_KIND 0 cuboid_mean, 2 mean; PSA_EST_WARP_BLOCKS a multiple of 16
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

extern "C" __global__ void __launch_bounds__(PSA_WARPS * 32)
psa_estimate_mma(const q_in_t* __restrict__ q, const __half* __restrict__ meta, const __half* __restrict__ lohi,
                 const int* __restrict__ seq_lens, float* __restrict__ scores, float* __restrict__ bounds,
                 int Hq, int Hkv, int Nmax
#if PSA_QRAW
                 , float q_scale
#endif
) {
#if !PSA_QRAW
    const float q_scale = 1.f;  // unused: the plan's query is scaled
#endif
    const int b = blockIdx.z, g = blockIdx.y;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int r = lane >> 2, quad = lane & 3;
    const int jw = (blockIdx.x * PSA_WARPS + warp) * PSA_EST_WARP_BLOCKS;
    if (jw >= Nmax) return;
    const int jend = min(jw + PSA_EST_WARP_BLOCKS, Nmax);
    const int h0 = g * PSA_G;
    const int kv = h0 / (Hq / Hkv);
    const int n_blocks = (seq_lens[b] + PSA_S - 1) / PSA_S;

    // load(j0, c0): chunks c0 .. c0 + PSA_KG - 1 of the tile at j0 (zero past Nmax; past the sequence's blocks
    // their scores become -inf)
    const uint4* rows = reinterpret_cast<const uint4*>(meta + ((long)b * Hkv + kv) * Nmax * 2 * PSA_D);
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
                    if (PSA_BOUNDS == 2 && j < jend) bounds[((long)b * Hq + h0 + h) * Nmax + j] = est;
                }
            }
#pragma unroll
        for (int u = 0; u < 2; ++u) {
            best[u] = fmaxf(best[u], __shfl_xor_sync(0xffffffffu, best[u], 1));
            const int j = j0 + r + 8 * u;
            if (quad == 0 && j < jend) scores[((long)b * (Hq / PSA_G) + g) * Nmax + j] = best[u];
        }
    }
}
