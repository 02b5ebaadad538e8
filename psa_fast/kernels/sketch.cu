// Stage 1 on the GPU for metadata = "quant3": each block's sketch estimate, the log of its mean
// token mass under the logits of its dequantised keys (psa_ref.scoring.sketch_estimate):
//
//   s_j = log((1 / n_j) sum_{t in j} exp(q . k^_t)),   k^_ti = lo_i + (c_ti + 1/2) / 8 (hi_i - lo_i)
//
// so q . k^_t = C + sum_i w_i c_ti with w_i = q_i (hi_i - lo_i) / 8 and C = sum_i (q_i lo_i + w_i / 2).
//
// Version 2 (tensor cores). Version 1 gave each lane one token and read the weights from shared
// memory once per code: the shared-memory pipe limited it to ~400 cycles per block (227 µs at 32K,
// B = 8; benchmarks/NOTES.md). Here a warp scores one block at a time with mma.sync m16n8k16:
// W C^T with the group's <= 8 query heads as the rows of A = w (split into f16 hi + lo, ~22 bits,
// as in decode.cu) and the tokens as the columns of B = codes, which are small integers and exact in
// f16. The channel order inside a k-step is permuted (A and B alike, so the sum is unchanged) so
// that one shift and one LOP3 turn a code word into a B register: nibbles q and q + 4 of a word sit
// at bits 0 and 16 after `>> 4q`, and OR-ing 0x6400 makes each the half 1024 + c; subtracting 1024
// is exact. Lane quad q therefore needs channels q mod 4 only; the warp stages the block's lo/hi
// in shared memory transposed to that order.
//
//   q      [B, Hq, PSA_D]                float, already multiplied by the logit scale
//   codes  [B, Hkv, Nmax, S, PSA_D / 8]  uint32: nibble k of word w of row t is channel 8 w + k's code
//                                        (where psa_estimate takes meta: one launch path, psa_fast._kernels)
//   lohi   [B, Hkv, Nmax, 2, PSA_D]      half: per-channel (lo, hi) of the block's keys
//   scores [B, Hq/PSA_G, Nmax]           float out: max over the group's heads; -inf past the last block
//   ests   [B, Hq, Nmax]                 float out: per head, the min/max bound on the block's logits
//                                        (PSA_BOUNDS 1, stop = certified) or the estimate (2, stop = sketch)
#include "common.cuh"
#include "mma.cuh"
static_assert(!PSA_BF16, "the quant3 estimate multiplies float16 codes: it is built without PSA_BF16");

#ifndef PSA_EST_WARP_BLOCKS
#define PSA_EST_WARP_BLOCKS 16
#endif
#ifndef PSA_BOUNDS
#define PSA_BOUNDS 0
#endif
#define PSA_WPR (PSA_D / 8)               // code words per token row
#define PSA_QTILES ((PSA_S + 7) / 8)      // n = 8 token tiles per block
#define PSA_QM (PSA_D / 4)                // channels per lane quad (those = quad mod 4)
#define PSA_LHV ((PSA_D / 4 + 31) / 32)   // 16-byte lo/hi vectors per lane
static_assert(PSA_D % 16 == 0, "the quant3 estimate needs the head dimension padded to a multiple of 16");
static_assert(PSA_G <= 8, "the quant3 estimate takes at most 8 query heads per group (the MMA's first 8 rows)");

// Codes of channels (8 W + q, 8 W + q + 4) of one token as an f16x2 B register (exact small integers).
__device__ __forceinline__ unsigned int code_pair(unsigned int word, int quad) {
    unsigned int x;
    const unsigned int s = word >> (4 * quad);
    asm("lop3.b32 %0, %1, %2, %3, 0xea;" : "=r"(x) : "r"(s), "r"(0x000F000Fu), "r"(0x64006400u));  // (s & m) | c
    const __half2 h = __hsub2(*reinterpret_cast<const __half2*>(&x), __floats2half2_rn(1024.f, 1024.f));
    return *reinterpret_cast<const unsigned int*>(&h);
}

extern "C" __global__ void __launch_bounds__(PSA_WARPS * 32)
psa_estimate_quant3(const float* __restrict__ q, const unsigned int* __restrict__ codes,
                    const __half* __restrict__ lohi, const int* __restrict__ seq_lens,
                    float* __restrict__ scores, float* __restrict__ ests, int Hq, int Hkv, int Nmax) {
    __shared__ __align__(16) __half tsm[PSA_WARPS][2][4][PSA_QM + 4];  // lo, hi by (channel mod 4, channel / 4), padded
    const int b = blockIdx.z, g = blockIdx.y;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int hh = lane >> 2, quad = lane & 3;
    const int jw = (blockIdx.x * PSA_WARPS + warp) * PSA_EST_WARP_BLOCKS;
    if (jw >= Nmax) return;
    const int jend = min(jw + PSA_EST_WARP_BLOCKS, Nmax);
    const int h0 = g * PSA_G;
    const int kv = h0 / (Hq / Hkv);
    const int len = seq_lens[b];
    const int n_blocks = (len + PSA_S - 1) / PSA_S;

    // Query of head row hh (0 for rows >= G) at channels quad + 4 m.
    float qa[PSA_QM];
#pragma unroll
    for (int m = 0; m < PSA_QM; ++m)
        qa[m] = hh < PSA_G ? __ldg(q + ((long)b * Hq + h0 + hh) * PSA_D + quad + 4 * m) : 0.f;

    const long blk0 = ((long)b * Hkv + kv) * Nmax;
    // One block ahead: its lo/hi vectors and this lane's token rows (token 8 nt + hh of tile nt) are
    // loaded while the current block is scored (version 2 without it was latency-bound: one block's
    // loads in flight per warp).
    uint4 lh_next[PSA_LHV];
    unsigned int wd_next[PSA_QTILES][PSA_WPR];
    auto load = [&](int j) {
        if (j >= jend || j >= n_blocks) return;
        const uint4* row = reinterpret_cast<const uint4*>(lohi + (blk0 + j) * 2 * PSA_D);
#pragma unroll
        for (int i = 0; i < PSA_LHV; ++i)
            if (lane + 32 * i < PSA_D / 4) lh_next[i] = __ldg(row + lane + 32 * i);
#pragma unroll
        for (int nt = 0; nt < PSA_QTILES; ++nt) {
            const unsigned int* crow = codes + ((blk0 + j) * PSA_S + min(8 * nt + hh, PSA_S - 1)) * PSA_WPR;
            if constexpr (PSA_WPR % 4 == 0) {
#pragma unroll
                for (int i = 0; i < PSA_WPR / 4; ++i) {
                    const uint4 x = __ldg(reinterpret_cast<const uint4*>(crow) + i);
                    wd_next[nt][4 * i] = x.x; wd_next[nt][4 * i + 1] = x.y;
                    wd_next[nt][4 * i + 2] = x.z; wd_next[nt][4 * i + 3] = x.w;
                }
            } else {
#pragma unroll
                for (int i = 0; i < PSA_WPR; ++i) wd_next[nt][i] = __ldg(crow + i);
            }
        }
    };
    load(jw);
    for (int j = jw; j < jend; ++j) {
        float est = -PSA_INF, bnd = -PSA_INF;
        if (j < n_blocks) {  // uniform across the warp
            const int ntok = min(PSA_S, len - j * PSA_S);
            unsigned int wd[PSA_QTILES][PSA_WPR];
#pragma unroll
            for (int nt = 0; nt < PSA_QTILES; ++nt)
#pragma unroll
                for (int i = 0; i < PSA_WPR; ++i) wd[nt][i] = wd_next[nt][i];
            // lo/hi into shared memory, transposed so that lane quad q reads channels q mod 4 in a row
            __syncwarp();
#pragma unroll
            for (int i = 0; i < PSA_LHV; ++i) {
                const int v = lane + 32 * i;
                if (v < PSA_D / 4) {
                    const __half* xh = reinterpret_cast<const __half*>(&lh_next[i]);
                    const int which = (8 * v) / PSA_D, c0 = (8 * v) % PSA_D;
#pragma unroll
                    for (int e = 0; e < 8; ++e) tsm[warp][which][(c0 + e) & 3][(c0 + e) >> 2] = xh[e];
                }
            }
            __syncwarp();
            load(j + 1);
            // A = w (hi + lo halves) per k-step, the constant C and (certified) the min/max bound;
            // the hi and lo products accumulate apart (two independent MMA chains per tile)
            float cst = 0.f, bsum = 0.f;
            float sacc[PSA_QTILES][4], sacc_lo[PSA_QTILES][4];
#pragma unroll
            for (int nt = 0; nt < PSA_QTILES; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) sacc[nt][e] = sacc_lo[nt][e] = 0.f;
#pragma unroll
            for (int ks = 0; ks < PSA_D / 16; ++ks) {
                const uint2 lo4 = *reinterpret_cast<const uint2*>(&tsm[warp][0][quad][4 * ks]);
                const uint2 hi4 = *reinterpret_cast<const uint2*>(&tsm[warp][1][quad][4 * ks]);
                const __half* loh = reinterpret_cast<const __half*>(&lo4);
                const __half* hih = reinterpret_cast<const __half*>(&hi4);
                float wv[4];
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int m = 4 * ks + e;
                    const float lo = __half2float(loh[e]), hi = __half2float(hih[e]);
                    wv[e] = qa[m] * ((hi - lo) * 0.125f);
                    cst += qa[m] * lo + 0.5f * wv[e];
                    if (PSA_BOUNDS == 1) bsum += fmaxf(qa[m] * hi, qa[m] * lo);
                }
                unsigned int a0h, a0l, a2h, a2l;
                split2(wv[0], wv[1], a0h, a0l);  // channels 16 ks + q, + 4
                split2(wv[2], wv[3], a2h, a2l);  // channels 16 ks + 8 + q, + 12
#pragma unroll
                for (int nt = 0; nt < PSA_QTILES; ++nt) {
                    const unsigned int b0 = code_pair(wd[nt][2 * ks], quad), b1 = code_pair(wd[nt][2 * ks + 1], quad);
                    mma_rows8(sacc[nt], a0h, a2h, b0, b1);
                    mma_rows8(sacc_lo[nt], a0l, a2l, b0, b1);
                }
            }
#pragma unroll
            for (int nt = 0; nt < PSA_QTILES; ++nt)
#pragma unroll
                for (int e = 0; e < 2; ++e) sacc[nt][e] += sacc_lo[nt][e];
            cst += __shfl_xor_sync(0xffffffffu, cst, 1);
            cst += __shfl_xor_sync(0xffffffffu, cst, 2);
            if (PSA_BOUNDS == 1) {
                bsum += __shfl_xor_sync(0xffffffffu, bsum, 1);
                bsum += __shfl_xor_sync(0xffffffffu, bsum, 2);
                bnd = bsum;
            }
            // log-sum-exp over the block's tokens (2 per tile per lane, then the quad), minus log n_j
            float mx = -PSA_INF;
#pragma unroll
            for (int nt = 0; nt < PSA_QTILES; ++nt)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    sacc[nt][e] = 8 * nt + 2 * quad + e < ntok ? sacc[nt][e] + cst : -PSA_INF;
                    mx = fmaxf(mx, sacc[nt][e]);
                }
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            float s = 0.f;
#pragma unroll
            for (int nt = 0; nt < PSA_QTILES; ++nt)
#pragma unroll
                for (int e = 0; e < 2; ++e) s += __expf(sacc[nt][e] - mx);
            s += __shfl_xor_sync(0xffffffffu, s, 1);
            s += __shfl_xor_sync(0xffffffffu, s, 2);
            est = mx + __logf(s) - __logf((float)ntok);
        }
        if (PSA_BOUNDS && quad == 0 && hh < PSA_G)
            ests[((long)b * Hq + h0 + hh) * Nmax + j] = PSA_BOUNDS == 1 ? bnd : est;
        float best = hh < PSA_G ? est : -PSA_INF;
        best = fmaxf(best, __shfl_xor_sync(0xffffffffu, best, 4));
        best = fmaxf(best, __shfl_xor_sync(0xffffffffu, best, 8));
        best = fmaxf(best, __shfl_xor_sync(0xffffffffu, best, 16));
        if (lane == 0) scores[((long)b * (Hq / PSA_G) + g) * Nmax + j] = best;
    }
}
