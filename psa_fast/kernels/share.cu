// rank = "share" for shared groups (psa_ref.scoring.group_rank_key): each block's key is the largest
// estimated share of one of the group's heads' mass,
//
//   key_j = max_h (e_hj - log sum_i n_i exp(e_hi)),
//
// from each head's block estimates e (the estimate kernel's per-head output) and the blocks' token
// counts n_i. One CTA per (group, request), two passes over the group's estimates: the first keeps
// each head's log-sum-exp online (a running max and a sum scaled to it, per thread, then one CTA
// reduction of the G pairs), the second writes the keys where the order kernel reads the group
// scores; blocks past the request's end keep the estimate kernel's -inf. (The first version made G + 1
// passes with 2G CTA reductions at 256 threads: 6.6 / 9.3 / 12.7 µs at B = 1 / 8 / 32 on Gemma 3's
// layer 5 at 32K, H100, against 3.7 / 4.1 / 4.8; benchmarks/NOTES.md, forty-fifth session.)
//
//   ests   [B, Hq, Nmax]        float: each head's block estimates (log mean token mass)
//   scores [B, Hq/PSA_G, Nmax]  float out: the rank keys
#include "common.cuh"

#ifndef PSA_SHARE_THREADS
#define PSA_SHARE_THREADS 512
#endif
#define PSA_SHARE_WARPS (PSA_SHARE_THREADS / 32)

extern "C" __global__ void __launch_bounds__(PSA_SHARE_THREADS)
psa_share_key(const float* __restrict__ ests, const int* __restrict__ seq_lens, float* __restrict__ scores,
              int Hq, int Nmax) {
    __shared__ float red_m[PSA_G][PSA_SHARE_WARPS], red_s[PSA_G][PSA_SHARE_WARPS];
    __shared__ float total[PSA_G];
    const int grp = blockIdx.x, b = blockIdx.y;
    const int len = seq_lens[b];
    const int n = (len + PSA_S - 1) / PSA_S;
    const float* e0 = ests + ((long)b * Hq + grp * PSA_G) * Nmax;
    float2 t[PSA_G];  // each head's estimated total log sum_j n_j exp(e_j), online: (max, sum relative to it)
#pragma unroll
    for (int r = 0; r < PSA_G; ++r) t[r] = make_float2(-PSA_INF, 0.f);
    for (int j = threadIdx.x; j < n; j += PSA_SHARE_THREADS) {
        const float log_n = __logf((float)min(PSA_S, len - j * PSA_S));
#pragma unroll
        for (int r = 0; r < PSA_G; ++r) t[r] = lse_merge(t[r], make_float2(e0[(long)r * Nmax + j] + log_n, 1.f));
    }
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
    for (int r = 0; r < PSA_G; ++r) {
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
            t[r] = lse_merge(t[r], make_float2(__shfl_xor_sync(0xffffffffu, t[r].x, o),
                                               __shfl_xor_sync(0xffffffffu, t[r].y, o)));
        if (lane == 0) red_m[r][warp] = t[r].x, red_s[r][warp] = t[r].y;
    }
    __syncthreads();
    for (int r = warp; r < PSA_G; r += PSA_SHARE_WARPS) {  // warp r reduces head r's pairs over the warps
        float2 w = lane < PSA_SHARE_WARPS ? make_float2(red_m[r][lane], red_s[r][lane]) : make_float2(-PSA_INF, 0.f);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
            w = lse_merge(w, make_float2(__shfl_xor_sync(0xffffffffu, w.x, o), __shfl_xor_sync(0xffffffffu, w.y, o)));
        if (lane == 0) total[r] = w.x + __logf(w.y);
    }
    __syncthreads();
    float* out = scores + ((long)b * (Hq / PSA_G) + grp) * Nmax;
    for (int j = threadIdx.x; j < n; j += PSA_SHARE_THREADS) {
        float key = -PSA_INF;
#pragma unroll
        for (int r = 0; r < PSA_G; ++r) key = fmaxf(key, e0[(long)r * Nmax + j] - total[r]);
        out[j] = key;
    }
}
