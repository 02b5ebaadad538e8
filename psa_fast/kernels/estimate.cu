// Stage 2 on the GPU: the criticality estimate of every block for every selection group.
//
// Memory traffic is the metadata (2 x D halves per block: 512 bytes at D = 128, 1/16 of the KV
// bytes at S = 16); the queries stay in registers, loaded once per warp. Each warp walks
// PSA_EST_WARP_BLOCKS consecutive blocks of one group, PSA_EST_BLOCKS at a time with all their
// 16-byte metadata loads issued before any is used (version 1 gave each warp one block and reached
// 15% of the bandwidth; version 2, four blocks per warp, 46%: benchmarks/NOTES.md).
//
//   q       [B, Hq, PSA_D]            float, already multiplied by the logit scale
//   meta    [B, Hkv, Nmax, 2, PSA_D]  half: (centre, radius) for cuboid_mean, (mean, -) for mean
//   lohi    [B, Hkv, Nmax, 2, PSA_D]  half: per-channel (lo, hi) of the block's keys
//   scores  [B, Hq/PSA_G, Nmax]       float out: max over the group's heads; -inf past the last block
//   bounds  [B, Hq, Nmax]             float out (PSA_BOUNDS): min/max bound on the block's logits
//                                     (1, stop = certified) or each head's own estimate (2, stop = sketch)
//   PSA_KIND (compile time) 0 cuboid_mean, 1 minmax, 2 mean (quant3: sketch.cu)
#include "common.cuh"

#ifndef PSA_EST_BLOCKS
#define PSA_EST_BLOCKS 4
#endif
#ifndef PSA_EST_WARP_BLOCKS
#define PSA_EST_WARP_BLOCKS 32
#endif
// 8-channel vectors per metadata row pair (first D channels, then the second array's D)
#define PSA_VECS (2 * PSA_LPT)
#define PSA_VPL ((PSA_VECS + 31) / 32)  // vectors per lane

extern "C" __global__ void __launch_bounds__(PSA_WARPS * 32)
psa_estimate(const float* __restrict__ q, const __half* __restrict__ meta, const __half* __restrict__ lohi,
             const int* __restrict__ seq_lens, float* __restrict__ scores, float* __restrict__ bounds,
             int Hq, int Hkv, int Nmax) {
    constexpr int kind = PSA_KIND;
    constexpr bool want_bounds = PSA_BOUNDS != 0;
    const int b = blockIdx.z, g = blockIdx.y;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int jw = (blockIdx.x * PSA_WARPS + warp) * PSA_EST_WARP_BLOCKS;
    if (jw >= Nmax) return;
    const int h0 = g * PSA_G;                // first query head of the group
    const int kv = h0 / (Hq / Hkv);          // the KV head it reads
    const int n_blocks = (seq_lens[b] + PSA_S - 1) / PSA_S;
    constexpr bool need_lohi = kind == 1 || PSA_BOUNDS == 1;

    // This lane's query values: vector v = lane + 32 i covers channels 8 (v mod LPT) .. + 8 of the
    // first (v < LPT) or second metadata array.
    float qv[PSA_VPL][PSA_G][8];
#pragma unroll
    for (int i = 0; i < PSA_VPL; ++i) {
        const int v = lane + 32 * i;
        const int ch = 8 * (v % PSA_LPT);
#pragma unroll
        for (int h = 0; h < PSA_G; ++h)
#pragma unroll
            for (int k = 0; k < 8; ++k)
                qv[i][h][k] = v < PSA_VECS ? q[((long)b * Hq + h0 + h) * PSA_D + ch + k] : 0.f;
    }

    const long base = (((long)b * Hkv + kv) * Nmax) * 2 * PSA_D;
    for (int j0 = jw; j0 < min(jw + PSA_EST_WARP_BLOCKS, Nmax); j0 += PSA_EST_BLOCKS) {
        uint4 mv[PSA_EST_BLOCKS][PSA_VPL], lo4[PSA_EST_BLOCKS][PSA_VPL], hi4[PSA_EST_BLOCKS][PSA_VPL];
#pragma unroll
        for (int bb = 0; bb < PSA_EST_BLOCKS; ++bb) {  // all loads first
            const int j = j0 + bb;
#pragma unroll
            for (int i = 0; i < PSA_VPL; ++i) {
                const int v = lane + 32 * i;
                const bool second = v >= PSA_LPT;
                const int ch = 8 * (v % PSA_LPT);
                const long row = base + (long)j * 2 * PSA_D;
                const bool ok = j < n_blocks && v < PSA_VECS;
                mv[bb][i] = ok && kind != 1
                                ? __ldg(reinterpret_cast<const uint4*>(meta + row + (second ? PSA_D : 0) + ch))
                                : make_uint4(0, 0, 0, 0);
                const bool lh = ok && need_lohi && !second;
                lo4[bb][i] = lh ? __ldg(reinterpret_cast<const uint4*>(lohi + row + ch)) : make_uint4(0, 0, 0, 0);
                hi4[bb][i] = lh ? __ldg(reinterpret_cast<const uint4*>(lohi + row + PSA_D + ch))
                                : make_uint4(0, 0, 0, 0);
            }
        }
#pragma unroll
        for (int bb = 0; bb < PSA_EST_BLOCKS; ++bb) {
            const int j = j0 + bb;
            if (j >= Nmax) break;
            float est[PSA_G], bnd[PSA_G];
#pragma unroll
            for (int h = 0; h < PSA_G; ++h) est[h] = bnd[h] = 0.f;
#pragma unroll
            for (int i = 0; i < PSA_VPL; ++i) {
                const bool second = lane + 32 * i >= PSA_LPT;
                float m[8], lo[8], hi[8];
                unpack8(mv[bb][i], m);
                unpack8(lo4[bb][i], lo);
                unpack8(hi4[bb][i], hi);
#pragma unroll
                for (int h = 0; h < PSA_G; ++h)
#pragma unroll
                    for (int k = 0; k < 8; ++k) {
                        const float x = qv[i][h][k];
                        if (kind == 0) est[h] += second ? fabsf(x) * m[k] : x * m[k];  // q.c + |q|.r
                        else if (kind == 2 && !second) est[h] += x * m[k];            // q.mean
                        bnd[h] += fmaxf(x * hi[k], x * lo[k]);                         // zero where not loaded
                    }
            }
            float best = -PSA_INF;
#pragma unroll
            for (int h = 0; h < PSA_G; ++h) {
                const float bh = need_lohi ? warp_sum(bnd[h]) : 0.f;
                const float eh = kind == 1 ? bh : warp_sum(est[h]);
                best = fmaxf(best, eh);
                if (want_bounds && lane == 0)
                    bounds[((long)b * Hq + h0 + h) * Nmax + j] = j < n_blocks ? (PSA_BOUNDS == 1 ? bh : eh) : -PSA_INF;
            }
            if (lane == 0) scores[((long)b * (Hq / PSA_G) + g) * Nmax + j] = j < n_blocks ? best : -PSA_INF;
        }
    }
}
