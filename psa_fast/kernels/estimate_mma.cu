// Stage 1 on the GPU for metadata = "cuboid_mean" and "mean", on the tensor cores: the estimate of every block
// for every query head of a group of at most 4 (psa_estimate, estimate.cu, keeps minmax, the certified bounds
// and larger groups). For cuboid_mean the estimate is q . c + |q| . r (centre c, radius r), for mean q . m:
// one dot product of each block's metadata row (2 D halves, or D) with a fixed vector per head, so 16 blocks'
// rows are the A operand of mma.sync m16n8k16 (float16, exact) and the heads' vectors the B operand, each split
// into float16 hi and lo parts (about 22 bits): columns 0..G-1 the heads' hi parts, 4..4+G-1 their lo parts.
// One MMA covers 16 blocks x 16 channels for every head and both parts; the products are exact and accumulate in
// float32 (chained over the k-steps, as the quant3 estimate's), and each head's hi and lo sums meet at the end.
// psa_estimate spent ~110 instructions a block a lane on CUDA-core FMAs, conversions and warp sums (46% of HBM
// at D 256); here a block costs a lane ~6 (its share of one ldmatrix and one MMA per k-step, and the copy).
//
// Memory: each warp brings its next tile of 16 blocks' rows into a shared-memory stage by cp.async while it
// multiplies the current one (two stages a warp); the 16-byte chunks of a row are XOR-swizzled by the row so
// that ldmatrix reads them without bank conflicts.
//
//   q       [B, Hq, PSA_D]            float, already multiplied by the logit scale
//   meta    [B, Hkv, Nmax, 2, PSA_D]  half: (centre, radius) for cuboid_mean, (mean, -) for mean
//   scores  [B, Hq/PSA_G, Nmax]       float out: max over the group's heads; -inf past the last block
//   bounds  [B, Hq, Nmax]             float out (PSA_BOUNDS 2): each head's own estimate
//   PSA_KIND 0 cuboid_mean, 2 mean; PSA_EST_WARP_BLOCKS a multiple of 16
//   dynamic shared memory: PSA_WARPS * 2 * 16 * PSA_K halves
#include "common.cuh"
#include "mma.cuh"

#ifndef PSA_KIND
#define PSA_KIND 0
#endif
#ifndef PSA_BOUNDS
#define PSA_BOUNDS 0
#endif
#ifndef PSA_EST_WARP_BLOCKS
#define PSA_EST_WARP_BLOCKS 32
#endif
#define PSA_K (PSA_KIND == 0 ? 2 * PSA_D : PSA_D)  // the dot product's length
#define PSA_KS (PSA_K / 16)                         // k-steps
#define PSA_KC (PSA_K / 8)                          // 16-byte chunks of a row
#define PSA_KSWZ (PSA_KC < 8 ? PSA_KC - 1 : 7)      // XOR mask of the chunk swizzle
#define PSA_TILE_HALVES (16 * PSA_K)
static_assert(PSA_KIND == 0 || PSA_KIND == 2, "estimate_mma scores cuboid_mean and mean (minmax: estimate.cu)");
static_assert(PSA_BOUNDS != 1, "the certified bounds need lo/hi per channel: estimate.cu");
static_assert(PSA_G <= 4, "estimate_mma packs at most 4 heads' hi and lo parts into the MMA's 8 columns");
static_assert(PSA_EST_WARP_BLOCKS % 16 == 0, "a warp scores whole tiles of 16 blocks");
static_assert(!PSA_BF16, "metadata is float16");

extern "C" __global__ void __launch_bounds__(PSA_WARPS * 32)
psa_estimate_mma(const float* __restrict__ q, const __half* __restrict__ meta, const __half* __restrict__ lohi,
                 const int* __restrict__ seq_lens, float* __restrict__ scores, float* __restrict__ bounds,
                 int Hq, int Hkv, int Nmax) {
    extern __shared__ __align__(16) unsigned char dyn_smem[];
    const int b = blockIdx.z, g = blockIdx.y;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int r = lane >> 2, quad = lane & 3;
    const int jw = (blockIdx.x * PSA_WARPS + warp) * PSA_EST_WARP_BLOCKS;
    if (jw >= Nmax) return;
    const int jend = min(jw + PSA_EST_WARP_BLOCKS, Nmax);
    const int h0 = g * PSA_G;
    const int kv = h0 / (Hq / Hkv);
    const int n_blocks = (seq_lens[b] + PSA_S - 1) / PSA_S;

    // B: column r carries head r & 3's vector (q, then |q| for the radius), its hi part (r < 4) or lo part;
    // lane quad q holds k = 16 ks + 2 q, + 1 (register 0) and 16 ks + 8 + 2 q, + 1 (register 1).
    const int bh = r & 3;
    const float lo_part = r >= 4 ? 1.f : 0.f;
    const float* qh = q + ((long)b * Hq + h0 + bh) * PSA_D;
    unsigned int bq[PSA_KS][2];
#pragma unroll
    for (int ks = 0; ks < PSA_KS; ++ks)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            float v[2];
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int k = 16 * ks + 8 * half + 2 * quad + e;
                const float x = bh < PSA_G ? __ldg(qh + (k < PSA_D ? k : k - PSA_D)) : 0.f;
                v[e] = k < PSA_D ? x : fabsf(x);
            }
            bq[ks][half] = pack_part(v[0], v[1], lo_part);
        }

    // The warp's tiles of 16 blocks, each copied whole (rows past Nmax are not read; past the sequence's
    // blocks their scores are overwritten with -inf below).
    __half* stage = reinterpret_cast<__half*>(dyn_smem) + warp * 2 * PSA_TILE_HALVES;
    const __half* rows = meta + ((long)b * Hkv + kv) * Nmax * 2 * PSA_D;
    auto load = [&](int j0, int buf) {
        if (j0 < jend) {
            __half* dst = stage + buf * PSA_TILE_HALVES;
            for (int e = lane; e < 16 * PSA_KC; e += 32) {
                const int rr = e / PSA_KC, c = e % PSA_KC;
                if (j0 + rr < Nmax) {
                    const unsigned int s = static_cast<unsigned int>(
                        __cvta_generic_to_shared(dst + rr * PSA_K + (c ^ (rr & PSA_KSWZ)) * 8));
                    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s),
                                 "l"(rows + (long)(j0 + rr) * 2 * PSA_D + c * 8) : "memory");
                }
            }
        }
        asm volatile("cp.async.commit_group;" ::: "memory");  // one group per tile, empty past the end
    };
    load(jw, 0);
    int buf = 0;
    for (int j0 = jw; j0 < jend; j0 += 16, buf ^= 1) {
        __syncwarp();  // every lane is done with the stage the next load refills
        load(j0 + 16, buf ^ 1);
        asm volatile("cp.async.wait_group 1;" ::: "memory");  // this tile's copies (this lane's) have landed ...
        __syncwarp();                                          // ... and every lane's
        const __half* tile = stage + buf * PSA_TILE_HALVES;
        float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int ks = 0; ks < PSA_KS; ++ks) {
            const int mi = lane >> 3;
            const int rr = (mi & 1) * 8 + (lane & 7), c = 2 * ks + (mi >> 1);
            unsigned int a[4];
            const unsigned int addr = static_cast<unsigned int>(
                __cvta_generic_to_shared(tile + rr * PSA_K + (c ^ (rr & PSA_KSWZ)) * 8));
            asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                         : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3]) : "r"(addr));
            mma16(acc, a, bq[ks][0], bq[ks][1]);
        }
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
