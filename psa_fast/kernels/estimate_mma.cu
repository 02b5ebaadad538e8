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
#include "estimate_mma.cuh"

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
    const int jw = (blockIdx.x * PSA_WARPS + warp) * PSA_EST_WARP_BLOCKS;
    if (jw >= Nmax) return;
    const int jend = min(jw + PSA_EST_WARP_BLOCKS, Nmax);
    const int h0 = g * PSA_G;
    const int kv = h0 / (Hq / Hkv);
    const int n_blocks = (seq_lens[b] + PSA_S - 1) / PSA_S;

    estimate_tiles(q, meta, b, h0, kv, Hq, Hkv, Nmax, n_blocks, jw, jend, q_scale, lane,
                   [&](int j, float s) { scores[((long)b * (Hq / PSA_G) + g) * Nmax + j] = s; },
                   [&](int h, int j, float est) { bounds[((long)b * Hq + h0 + h) * Nmax + j] = est; });
}
