// Stage 1 on the GPU for metadata = "quant3": each block's sketch estimate, the log of its mean
// token mass under the logits of its dequantised keys (psa_ref.scoring.sketch_estimate):
//
//   s_j = log((1 / n_j) sum_{t in j} exp(q . k^_t)),   k^_ti = lo_i + (c_ti + 1/2) / 8 (hi_i - lo_i)
//
// so q . k^_t = C + sum_i w_i (c_ti + 1/2) with w_i = q_i (hi_i - lo_i) / 8 and C = sum_i q_i lo_i.
//
// History (benchmarks/NOTES.md). Version 1 gave each lane one token and read the weights from shared memory
// once per code (227 µs at 32K, B = 8). Version 2 put W C^T on the tensor cores (mma.sync m16n8k16, the
// heads as A's rows, split f16 hi + lo, the codes as B). Version 3 kept the query and a double buffer of
// codes (cp.async) in shared memory instead of registers (255 -> 77 registers at D 256). Version 4, below,
// transposes the product: the codes are A (16 tokens x 16 channels a k-step), the weights B (145 -> 108 µs at
// 32K, B = 32, real Gemma K/V). Version 5 puts the 1/2 on the codes and sums C once a block (108 -> 105 µs: the
// kernel is bound by shared-memory reads, three 16-byte reads and two 8-byte reads a lane a k-step). Version 6
// (groups of <= 4 heads, S 16, D 64/128/256, below) has the lane owning 8 channels store the weights as B
// fragments once a block and reads the codes by ldmatrix (105 -> 69.5 µs); version 5 serves the other shapes.
//
// Codes as float16: the channel order inside a k-step is permuted (A and B alike, so the sum is unchanged) so
// that one shift and one LOP3 turn a code word into an MMA register: nibbles q and q + 4 of a word sit at bits
// 0 and 16 after `>> 4q`, and OR-ing 0x6400 makes each the half 1024 + c; subtracting 1024 is exact. Lane quad
// q therefore needs channels q mod 4 only; the warp stages what it needs of the block's lo/hi in shared memory
// transposed to that order, and the codes' rows are padded so that a k-step's 8 token rows fall in distinct
// banks.
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
#define PSA_WPR (PSA_D / 8)               // code words per token row
#define PSA_QM (PSA_D / 4)                // channels per lane quad (those = quad mod 4)
static_assert(PSA_D % 16 == 0, "the quant3 estimate needs the head dimension padded to a multiple of 16");
static_assert(PSA_G <= 8, "the quant3 estimate takes at most 8 query heads per group (the MMA's first 8 rows)");

// Codes of channels (8 W + q, 8 W + q + 4) of one token as an f16x2 MMA register, each code c as c + 1/2 (the
// dequantisation's 1/2 rides on the code: 1024 + c - 1023.5 is exact in float16).
__device__ __forceinline__ unsigned int code_pair(unsigned int word, int quad) {
    unsigned int x;
    const unsigned int s = word >> (4 * quad);
    asm("lop3.b32 %0, %1, %2, %3, 0xea;" : "=r"(x) : "r"(s), "r"(0x000F000Fu), "r"(0x64006400u));  // (s & m) | c
    const __half2 h = __hsub2(*reinterpret_cast<const __half2*>(&x), __floats2half2_rn(1023.5f, 1023.5f));
    return *reinterpret_cast<const unsigned int*>(&h);
}

#define PSA_CW (PSA_WPR % 4 == 0 ? 4 : 2)          // words per cp.async copy (16 or 8 bytes)
#define PSA_SROW (((PSA_WPR + 3) / 4) * 4 + 4)   // words per token row in shared memory (padded)

__device__ __forceinline__ void cp_async_words(void* smem, const void* gmem) {
    const unsigned int s = static_cast<unsigned int>(__cvta_generic_to_shared(smem));
    if constexpr (PSA_CW == 4) asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem) : "memory");
    else asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(s), "l"(gmem) : "memory");
}

// Block j's estimates out (both versions): head 2 quad + e's, est[e] on every lane of a column pair, to ests
// [B, Hq, Nmax] from the row-0 lanes (PSA_BOUNDS 2), and the group's max over its heads (the order's key) to
// scores from lane 0.
__device__ __forceinline__ void store_block_estimates(const float (&est)[2], float* __restrict__ ests,
                                                      float* __restrict__ scores, int b, int g, int Hq, int h0,
                                                      int Nmax, int j, int r, int quad, int lane) {
    float best = -PSA_INF;
#pragma unroll
    for (int e = 0; e < 2; ++e) {
        const int h = 2 * quad + e;
        if (PSA_BOUNDS == 2 && r == 0 && h < PSA_G) ests[((long)b * Hq + h0 + h) * Nmax + j] = est[e];
        if (h < PSA_G) best = fmaxf(best, est[e]);
    }
    best = fmaxf(best, __shfl_xor_sync(0xffffffffu, best, 1));
    best = fmaxf(best, __shfl_xor_sync(0xffffffffu, best, 2));
    if (lane == 0) scores[((long)b * (Hq / PSA_G) + g) * Nmax + j] = best;
}

// Version 6 (below) where it applies, version 5 for the other shapes (more heads a group, certified bounds,
// other block sizes or head dims).
#define PSA_EST_V6 (PSA_G <= 4 && PSA_BOUNDS != 1 && PSA_S == 16 && PSA_D % 64 == 0 && PSA_D <= 256)
#if !PSA_EST_V6
// Version 4 (the product transposed): the block's codes are the MMA's A operand (its 16 tokens as the rows,
// one k-step's 16 channels as the columns) and the weights its B operand (8 columns). With G <= 4 query heads
// (PSA_EST_PACK) columns 0..G-1 hold the heads' float16 hi parts of w and columns 4..4+G-1 their lo parts, so
// one MMA a k-step gives both products for 16 tokens (version 3: four, for 8 tokens each, with 8 - G padding
// rows); with more heads columns are heads and the hi and lo parts run as two MMA chains, as in version 3.
// Per block each lane first stages (hi - lo) / 8 and lo of D / 32 channels as float32 (version 3 converted
// and subtracted them in every k-step of every head) and sums its part of C (version 5; version 4 summed C's
// terms in every k-step), so a k-step costs a lane two 16-byte reads (w's factors), four multiplies for w, its
// float16 split, two 8-byte reads of codes and their unpacking, and one MMA.
#define PSA_EST_PACK (PSA_G <= 4)
#define PSA_MT ((PSA_S + 15) / 16)         // token tiles (m = 16) of a block
#define PSA_CG (PSA_D / 8)                 // groups of 8 channels (one 16-byte vector of lo, one of hi)
#define PSA_CGL ((PSA_CG + 31) / 32)       // groups per lane

extern "C" __global__ void __launch_bounds__(PSA_WARPS * 32)
psa_estimate_quant3(const float* __restrict__ q, const unsigned int* __restrict__ codes,
                    const __half* __restrict__ lohi, const int* __restrict__ seq_lens,
                    float* __restrict__ scores, float* __restrict__ ests, int Hq, int Hkv, int Nmax) {
    // (hi - lo) / 8, lo and (certified) hi of the warp's block, by (channel mod 4, channel / 4)
    __shared__ __align__(16) float dsm[PSA_WARPS][PSA_BOUNDS == 1 ? 3 : 2][4][PSA_QM + 4];
    __shared__ __align__(16) float qsm[8][4][PSA_QM + 4];             // query by (head, channel mod 4, channel / 4)
    __shared__ __align__(16) unsigned int csm[PSA_WARPS][2][PSA_S * PSA_SROW];  // each warp's two blocks of codes
    const int b = blockIdx.z, g = blockIdx.y;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int r = lane >> 2, quad = lane & 3;  // fragment row (token; B's column: lane / 4) and column pair
    const int h0 = g * PSA_G;
    const int kv = h0 / (Hq / Hkv);
    const int len = seq_lens[b];
    const int n_blocks = (len + PSA_S - 1) / PSA_S;
    // This lane's column of B: its head and (packed) which part of w it carries; 1.f for the lo part.
    const int bh = PSA_EST_PACK ? (r & 3) : r;
    const float lo_part = PSA_EST_PACK && r >= 4 ? 1.f : 0.f;

    for (int i = threadIdx.x; i < 8 * PSA_D; i += blockDim.x) {
        const int h = i / PSA_D, c = i % PSA_D;
        qsm[h][c & 3][c >> 2] = h < PSA_G ? __ldg(q + ((long)b * Hq + h0 + h) * PSA_D + c) : 0.f;
    }
    __syncthreads();
    const int jw = (blockIdx.x * PSA_WARPS + warp) * PSA_EST_WARP_BLOCKS;
    if (jw >= Nmax) return;
    const int jend = min(jw + PSA_EST_WARP_BLOCKS, Nmax);

    const long blk0 = ((long)b * Hkv + kv) * Nmax;
    // One block ahead: its codes by cp.async into the warp's other buffer, its lo and hi vectors into registers.
    uint4 lo_next[PSA_CGL], hi_next[PSA_CGL];
    auto load = [&](int j) {
        if (j < jend && j < n_blocks) {
            const uint4* row = reinterpret_cast<const uint4*>(lohi + (blk0 + j) * 2 * PSA_D);
#pragma unroll
            for (int i = 0; i < PSA_CGL; ++i)
                if (lane + 32 * i < PSA_CG) {
                    lo_next[i] = __ldg(row + lane + 32 * i);
                    hi_next[i] = __ldg(row + PSA_CG + lane + 32 * i);
                }
            const unsigned int* src = codes + (blk0 + j) * PSA_S * PSA_WPR;
            unsigned int* dst = csm[warp][j & 1];
            for (int e = lane; e < PSA_S * (PSA_WPR / PSA_CW); e += 32) {
                const int t = e / (PSA_WPR / PSA_CW), c = e % (PSA_WPR / PSA_CW);
                cp_async_words(dst + t * PSA_SROW + c * PSA_CW, src + t * PSA_WPR + c * PSA_CW);
            }
        }
        asm volatile("cp.async.commit_group;" ::: "memory");  // one group per block, empty past the end
    };
    load(jw);
    for (int j = jw; j < jend; ++j) {
        float est[2] = {-PSA_INF, -PSA_INF}, bnd = -PSA_INF;
        if (j < n_blocks) {  // uniform across the warp
            const int ntok = min(PSA_S, len - j * PSA_S);
            // (hi - lo) / 8 and lo as float32, by (channel mod 4, channel / 4): lane quad q reads its channels in a row
            __syncwarp();
#pragma unroll
            for (int i = 0; i < PSA_CGL; ++i)
                if (lane + 32 * i < PSA_CG) {
                    const __half* lh = reinterpret_cast<const __half*>(&lo_next[i]);
                    const __half* hh = reinterpret_cast<const __half*>(&hi_next[i]);
                    const int c0 = 8 * (lane + 32 * i);
#pragma unroll
                    for (int e = 0; e < 8; ++e) {
                        const float lo = __half2float(lh[e]), hi = __half2float(hh[e]);
                        dsm[warp][0][(c0 + e) & 3][(c0 + e) >> 2] = (hi - lo) * 0.125f;
                        dsm[warp][1][(c0 + e) & 3][(c0 + e) >> 2] = lo;
                        if (PSA_BOUNDS == 1) dsm[warp][PSA_BOUNDS == 1 ? 2 : 0][(c0 + e) & 3][(c0 + e) >> 2] = hi;
                    }
                }
            load(j + 1);
            asm volatile("cp.async.wait_group 1;" ::: "memory");  // block j's codes have landed (this lane's) ...
            __syncwarp();                                          // ... and every lane's; the floats are staged
            const unsigned int* cb = csm[warp][j & 1];
            // the constant C and (certified) the min/max bound of head bh over this lane's channels
            float cst = 0.f, bsum = 0.f;
            // C = sum_i q_i lo_i once a block (the codes carry the 1/2), outside the k-steps: head bh over the
            // channels of residue quad, split between the lanes of its hi and lo columns when packed (lane ^ 16)
            {
                constexpr int n = PSA_EST_PACK ? PSA_QM / 2 : PSA_QM;
                const int i0 = PSA_EST_PACK ? (r >> 2) * n : 0;
                const float* qr = &qsm[bh][quad][i0];
                const float* lr = &dsm[warp][1][quad][i0];
                if constexpr (n % 4 == 0) {
#pragma unroll
                    for (int i = 0; i < n; i += 4) {
                        const float4 q4 = *reinterpret_cast<const float4*>(qr + i);
                        const float4 l4 = *reinterpret_cast<const float4*>(lr + i);
                        cst = fmaf(q4.x, l4.x, fmaf(q4.y, l4.y, fmaf(q4.z, l4.z, fmaf(q4.w, l4.w, cst))));
                    }
                } else {
#pragma unroll
                    for (int i = 0; i < n; ++i) cst = fmaf(qr[i], lr[i], cst);
                }
                if (PSA_EST_PACK) cst += __shfl_xor_sync(0xffffffffu, cst, 16);
            }
            float acc[PSA_MT][4], acc_lo[PSA_MT][4];
#pragma unroll
            for (int mt = 0; mt < PSA_MT; ++mt)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[mt][e] = acc_lo[mt][e] = 0.f;
#pragma unroll
            for (int ks = 0; ks < PSA_D / 16; ++ks) {
                const float4 d4 = *reinterpret_cast<const float4*>(&dsm[warp][0][quad][4 * ks]);
                float4 l4 = make_float4(0.f, 0.f, 0.f, 0.f);  // the certified bound's
                if (PSA_BOUNDS == 1) l4 = *reinterpret_cast<const float4*>(&dsm[warp][1][quad][4 * ks]);
                const float4 q4 = *reinterpret_cast<const float4*>(&qsm[bh][quad][4 * ks]);
                const float qv[4] = {q4.x, q4.y, q4.z, q4.w}, dv[4] = {d4.x, d4.y, d4.z, d4.w};
                const float lv[4] = {l4.x, l4.y, l4.z, l4.w};
                float4 h4 = make_float4(0.f, 0.f, 0.f, 0.f);
                if (PSA_BOUNDS == 1)
                    h4 = *reinterpret_cast<const float4*>(&dsm[warp][PSA_BOUNDS == 1 ? 2 : 0][quad][4 * ks]);
                const float hv[4] = {h4.x, h4.y, h4.z, h4.w};
                float wv[4];
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    wv[e] = qv[e] * dv[e];
                    if (PSA_BOUNDS == 1) bsum += fmaxf(qv[e] * hv[e], qv[e] * lv[e]);
                }
                // B: channels 16 ks + q, + 4 (b0) and 16 ks + 8 + q, + 12 (b1) of w's part for column r
                unsigned int b0, b1, b0l = 0, b1l = 0;
                if (PSA_EST_PACK) {  // hi = f16(w); the lo column's lanes take f16(w - hi)
                    b0 = pack_part(wv[0], wv[1], lo_part);
                    b1 = pack_part(wv[2], wv[3], lo_part);
                } else {
                    split2(wv[0], wv[1], b0, b0l);
                    split2(wv[2], wv[3], b1, b1l);
                }
#pragma unroll
                for (int mt = 0; mt < PSA_MT; ++mt) {
                    const int t0 = min(16 * mt + r, PSA_S - 1), t1 = min(16 * mt + r + 8, PSA_S - 1);
                    const uint2 w0 = *reinterpret_cast<const uint2*>(cb + t0 * PSA_SROW + 2 * ks);
                    const uint2 w1 = *reinterpret_cast<const uint2*>(cb + t1 * PSA_SROW + 2 * ks);
                    const unsigned int a[4] = {code_pair(w0.x, quad), code_pair(w1.x, quad), code_pair(w0.y, quad),
                                               code_pair(w1.y, quad)};
                    mma16(acc[mt], a, b0, b1);
                    if (!PSA_EST_PACK) mma16(acc_lo[mt], a, b0l, b1l);
                }
            }
            // head bh's constant (and bound) over the 4 lanes of its column, then to the lanes that hold its logits
            cst += __shfl_xor_sync(0xffffffffu, cst, 1);
            cst += __shfl_xor_sync(0xffffffffu, cst, 2);
            if (PSA_BOUNDS == 1) {
                bsum += __shfl_xor_sync(0xffffffffu, bsum, 1);
                bsum += __shfl_xor_sync(0xffffffffu, bsum, 2);
                bnd = bsum;  // for head bh (lanes 4 bh .. 4 bh + 3)
            }
            // logits of tokens 16 mt + r (+ 8 in elements 2, 3) for heads 2 quad + e: hi + lo, + C
            float mx[2] = {-PSA_INF, -PSA_INF};
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int h = PSA_EST_PACK ? (2 * quad + e) & 3 : 2 * quad + e;
                const float ch = __shfl_sync(0xffffffffu, cst, 4 * h);
#pragma unroll
                for (int mt = 0; mt < PSA_MT; ++mt)
#pragma unroll
                    for (int u = 0; u < 2; ++u) {
                        float x = acc[mt][2 * u + e];
                        // packed: the lo column 2 quad + e + 4 sits in lane ^ 2 (hi + lo in both, the same sum)
                        const float y = PSA_EST_PACK ? __shfl_xor_sync(0xffffffffu, x, 2) : acc_lo[mt][2 * u + e];
                        x = PSA_EST_PACK && quad >= 2 ? y + x : x + y;
                        x = 16 * mt + r + 8 * u < ntok ? x + ch : -PSA_INF;
                        acc[mt][2 * u + e] = x;
                        mx[e] = fmaxf(mx[e], x);
                    }
            }
            // log-sum-exp over the block's tokens (the 8 lanes of a column pair), minus log n_j
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                mx[e] = column_max(mx[e]);
                float s = 0.f;
#pragma unroll
                for (int mt = 0; mt < PSA_MT; ++mt)
#pragma unroll
                    for (int u = 0; u < 2; ++u) s += __expf(acc[mt][2 * u + e] - mx[e]);
                est[e] = mx[e] + __logf(column_sum(s)) - __logf((float)ntok);
            }
            __syncwarp();  // every lane is done with this block's buffers before the next load refills them
        } else {
            load(j + 1);  // keeps one commit group per block
        }
        // lanes 0..3 hold heads 2 quad, 2 quad + 1 (packed: lanes 2, 3 repeat heads 0..3, which G <= 4 leaves out)
        if (PSA_BOUNDS == 1 && lane % 4 == 0 && r < PSA_G && (!PSA_EST_PACK || r < 4))
            ests[((long)b * Hq + h0 + r) * Nmax + j] = bnd;
        store_block_estimates(est, ests, scores, b, g, Hq, h0, Nmax, j, r, quad, lane);
    }
}
#endif  // !PSA_EST_V6

#if PSA_EST_V6
// Version 6 (groups of <= 4 heads, estimates or no per-head output, S 16, D a multiple of 64). Version 5 is bound
// by shared-memory wavefronts (~300 a block a warp: w's factors read again by every lane of every k-step, the
// codes' rows read by the 4 lanes of a row, lo/hi staged by scalar stores) rather than by its instructions. Here:
//  * Lane W < D / 8 owns channels 8 W .. 8 W + 7, the 16 bytes of lo and of hi it loads: with the heads' query
//    for those channels in registers (32 floats) it computes w for every head once a block, splits it into float16
//    hi | lo, and stores the MMA's B fragments; its share of C = sum q lo goes to every lane by shuffles.
//  * The codes reach the A registers by ldmatrix: one x4 gives each lane (row r, quad q) code word 8 m + q and
//    8 m + 4 + q of tokens r and r + 8, and one word feeds two MMAs (nibbles s, s + 4 | s + 1, s + 5 for s = 0,
//    then 2), so a lane's k slots (2 q, 2 q + 1 | 2 q + 8, 2 q + 9) hold channels (8 W + s, 8 W + s + 4 |
//    8 W + s + 1, 8 W + s + 5) of its word W; the B fragments carry the same channels.
// A k-step then costs a lane one 8-byte read of B (the 32 lanes' reads contiguous), a quarter of an ldmatrix,
// four code unpackings and the MMA: ~96 wavefronts a block instead of ~300.
#define PSA_FG (PSA_WPR / 4)        // groups of 4 code words (32 channels)
#define PSA_FSTRIDE (2 * 8 * 4 + 4)  // B fragments (uint2) a group: (s / 2, column, quad), padded by 32 bytes

extern "C" __global__ void __launch_bounds__(PSA_WARPS * 32)
psa_estimate_quant3(const float* __restrict__ q, const unsigned int* __restrict__ codes,
                    const __half* __restrict__ lohi, const int* __restrict__ seq_lens,
                    float* __restrict__ scores, float* __restrict__ ests, int Hq, int Hkv, int Nmax) {
    __shared__ __align__(16) unsigned int csm[PSA_WARPS][2][PSA_S * PSA_SROW];  // each warp's two blocks of codes
    __shared__ __align__(16) uint2 fsm[PSA_WARPS][PSA_FG * PSA_FSTRIDE];       // each warp's B fragments
    const int b = blockIdx.z, g = blockIdx.y;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int r = lane >> 2, quad = lane & 3;  // A's row (token) and B's column (r < 4: head r's hi, else lo)
    const int h0 = g * PSA_G;
    const int kv = h0 / (Hq / Hkv);
    const int len = seq_lens[b];
    const int n_blocks = (len + PSA_S - 1) / PSA_S;
    const int jw = (blockIdx.x * PSA_WARPS + warp) * PSA_EST_WARP_BLOCKS;
    if (jw >= Nmax) return;
    const int jend = min(jw + PSA_EST_WARP_BLOCKS, Nmax);

    // The writer lanes (one per code word of a token row) and their channels of each head's query.
    const bool writer = lane < PSA_WPR;
    float qw[4][8];
#pragma unroll
    for (int h = 0; h < 4; ++h) {
        float4 x0 = make_float4(0.f, 0.f, 0.f, 0.f), x1 = x0;
        if (writer && h < PSA_G) {
            const float4* row = reinterpret_cast<const float4*>(q + ((long)b * Hq + h0 + h) * PSA_D + 8 * lane);
            x0 = __ldg(row);
            x1 = __ldg(row + 1);
        }
        qw[h][0] = x0.x; qw[h][1] = x0.y; qw[h][2] = x0.z; qw[h][3] = x0.w;
        qw[h][4] = x1.x; qw[h][5] = x1.y; qw[h][6] = x1.z; qw[h][7] = x1.w;
    }

    const long blk0 = ((long)b * Hkv + kv) * Nmax;
    // One block ahead: its codes by cp.async into the warp's other buffer, the writers' lo and hi into registers.
    uint4 lo_next = make_uint4(0u, 0u, 0u, 0u), hi_next = lo_next;
    auto load = [&](int j) {
        if (j < jend && j < n_blocks) {
            const uint4* row = reinterpret_cast<const uint4*>(lohi + (blk0 + j) * 2 * PSA_D);
            if (writer) {
                lo_next = __ldg(row + lane);
                hi_next = __ldg(row + PSA_WPR + lane);
            }
            const unsigned int* src = codes + (blk0 + j) * PSA_S * PSA_WPR;
            unsigned int* dst = csm[warp][j & 1];
            for (int e = lane; e < PSA_S * (PSA_WPR / 4); e += 32) {
                const int t = e / (PSA_WPR / 4), c = e % (PSA_WPR / 4);
                cp_async_words(dst + t * PSA_SROW + c * 4, src + t * PSA_WPR + c * 4);
            }
        }
        asm volatile("cp.async.commit_group;" ::: "memory");  // one group per block, empty past the end
    };
    load(jw);
    uint2* frag = fsm[warp];
    for (int j = jw; j < jend; ++j) {
        float est[2] = {-PSA_INF, -PSA_INF};
        if (j < n_blocks) {  // uniform across the warp
            const int ntok = min(PSA_S, len - j * PSA_S);
            // The writer's (hi - lo) / 8 of its channels, and its share of each head's C = sum q lo.
            float dl[8], cs[4] = {0.f, 0.f, 0.f, 0.f};
            {
                const __half* lh = reinterpret_cast<const __half*>(&lo_next);
                const __half* hh = reinterpret_cast<const __half*>(&hi_next);
#pragma unroll
                for (int e = 0; e < 8; ++e) {
                    const float lo = __half2float(lh[e]);
                    dl[e] = (__half2float(hh[e]) - lo) * 0.125f;
#pragma unroll
                    for (int h = 0; h < 4; ++h) cs[h] = fmaf(qw[h][e], lo, cs[h]);
                }
            }
            load(j + 1);
            // B fragments of word W = lane: group W / 4, then (s / 2, column, W % 4); column h holds head h's hi
            // part of w = q (hi - lo) / 8, column 4 + h its lo part; (b0, b1) = channels (8 W + s, + 4),
            // (8 W + s + 1, + 5).
            if (writer) {
                uint2* f = frag + (lane >> 2) * PSA_FSTRIDE + (lane & 3);
#pragma unroll
                for (int si = 0; si < 2; ++si)
#pragma unroll
                    for (int h = 0; h < 4; ++h) {
                        const int s0 = 2 * si;
                        unsigned int b0h, b0l, b1h, b1l;
                        split2(qw[h][s0] * dl[s0], qw[h][s0 + 4] * dl[s0 + 4], b0h, b0l);  // w = q (hi - lo) / 8
                        split2(qw[h][s0 + 1] * dl[s0 + 1], qw[h][s0 + 5] * dl[s0 + 5], b1h, b1l);
                        f[(si * 8 + h) * 4] = make_uint2(b0h, b1h);
                        f[(si * 8 + 4 + h) * 4] = make_uint2(b0l, b1l);
                    }
            }
#pragma unroll
            for (int h = 0; h < 4; ++h)
#pragma unroll
                for (int o = 1; o < 32; o <<= 1) cs[h] += __shfl_xor_sync(0xffffffffu, cs[h], o);
            asm volatile("cp.async.wait_group 1;" ::: "memory");  // block j's codes have landed (this lane's) ...
            __syncwarp();                                          // ... and every lane's; the fragments are stored
            const unsigned int* cb = csm[warp][j & 1];
            float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
            for (int m = 0; m < PSA_D / 64; ++m) {
                // matrices (tokens 0-7 | 8-15) x (words 8 m .. 8 m + 3 | 8 m + 4 .. 8 m + 7): lane i gives the
                // address of row i & 7 of matrix i / 8
                const int mi = lane >> 3;
                const unsigned int addr = static_cast<unsigned int>(__cvta_generic_to_shared(
                    cb + ((lane & 7) + 8 * (mi & 1)) * PSA_SROW + 8 * m + 4 * (mi >> 1)));
                unsigned int cw[4];
                asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                             : "=r"(cw[0]), "=r"(cw[1]), "=r"(cw[2]), "=r"(cw[3]) : "r"(addr));
#pragma unroll
                for (int u = 0; u < 2; ++u)
#pragma unroll
                    for (int si = 0; si < 2; ++si) {
                        const int s0 = 2 * si;
                        const unsigned int a[4] = {code_pair(cw[2 * u], s0), code_pair(cw[2 * u + 1], s0),
                                                   code_pair(cw[2 * u], s0 + 1), code_pair(cw[2 * u + 1], s0 + 1)};
                        const uint2 bf = frag[(2 * m + u) * PSA_FSTRIDE + (si * 8 + r) * 4 + quad];
                        mma16(acc, a, bf.x, bf.y);
                    }
            }
            // logits of tokens r (elements 0, 1) and r + 8 (2, 3) for heads 2 quad + e: hi + lo (the lo column
            // 2 quad + e + 4 sits in lane ^ 2), + C; lanes with quad >= 2 repeat heads 0..3
            float mx[2] = {-PSA_INF, -PSA_INF};
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int h = (2 * quad + e) & 3;
                const float ch = h == 0 ? cs[0] : h == 1 ? cs[1] : h == 2 ? cs[2] : cs[3];
#pragma unroll
                for (int u = 0; u < 2; ++u) {
                    float x = acc[2 * u + e];
                    const float y = __shfl_xor_sync(0xffffffffu, x, 2);
                    x = quad >= 2 ? y + x : x + y;
                    x = r + 8 * u < ntok ? x + ch : -PSA_INF;
                    acc[2 * u + e] = x;
                    mx[e] = fmaxf(mx[e], x);
                }
            }
            // log-sum-exp over the block's tokens (the 8 lanes of a column pair), minus log n_j
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                mx[e] = column_max(mx[e]);
                const float sum = column_sum(__expf(acc[e] - mx[e]) + __expf(acc[2 + e] - mx[e]));
                est[e] = mx[e] + __logf(sum) - __logf((float)ntok);
            }
            __syncwarp();  // every lane is done with this block's buffers before the next block refills them
        } else {
            load(j + 1);  // keeps one commit group per block
        }
        store_block_estimates(est, ests, scores, b, g, Hq, h0, Nmax, j, r, quad, lane);
    }
}
#endif  // PSA_EST_V6
