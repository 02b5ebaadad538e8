// rank = "share" for shared groups (psa_ref.scoring.group_rank_key): each block's key is the largest
// estimated share of one of the group's heads' mass,
//
//   key_j = max_h (e_hj - log sum_i n_i exp(e_hi)),
//
// from each head's block estimates e (the estimate kernel's per-head output) and the blocks' token
// counts n_i. One CTA per (group, request): the group's heads' log-sum-exp over the blocks, then the
// keys, written where the order kernel reads the group scores; blocks past the request's end keep
// the estimate kernel's -inf.
//
//   ests   [B, Hq, Nmax]        float: each head's block estimates (log mean token mass)
//   scores [B, Hq/PSA_G, Nmax]  float out: the rank keys
#include "common.cuh"

#define PSA_SHARE_THREADS 256

// The CTA's max / sum, returned to every thread: each warp reduces the warps' partials itself (reading
// them by lane, so no warp is left with a partial of its own).
__device__ __forceinline__ float cta_max(float x, float* red) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = x;
    __syncthreads();
    x = threadIdx.x % 32 < PSA_SHARE_THREADS / 32 ? red[threadIdx.x % 32] : -PSA_INF;  // every warp: all
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    __syncthreads();
    return x;
}

__device__ __forceinline__ float cta_sum(float x, float* red) {
    x = warp_sum(x);
    if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = x;
    __syncthreads();
    x = warp_sum(threadIdx.x % 32 < PSA_SHARE_THREADS / 32 ? red[threadIdx.x % 32] : 0.f);
    __syncthreads();
    return x;
}

extern "C" __global__ void __launch_bounds__(PSA_SHARE_THREADS)
psa_share_key(const float* __restrict__ ests, const int* __restrict__ seq_lens, float* __restrict__ scores,
              int Hq, int Nmax) {
    __shared__ float red[PSA_SHARE_THREADS / 32];
    __shared__ float total[PSA_G];
    const int grp = blockIdx.x, b = blockIdx.y;
    const int len = seq_lens[b];
    const int n = (len + PSA_S - 1) / PSA_S;
    const float* e0 = ests + ((long)b * Hq + grp * PSA_G) * Nmax;
    for (int r = 0; r < PSA_G; ++r) {  // each head's estimated total: log sum_j n_j exp(e_j)
        const float* e = e0 + (long)r * Nmax;
        float m = -PSA_INF;
        for (int j = threadIdx.x; j < n; j += PSA_SHARE_THREADS)
            m = fmaxf(m, e[j] + __logf((float)min(PSA_S, len - j * PSA_S)));
        m = cta_max(m, red);
        float s = 0.f;
        for (int j = threadIdx.x; j < n; j += PSA_SHARE_THREADS)
            s += __expf(e[j] + __logf((float)min(PSA_S, len - j * PSA_S)) - m);
        s = cta_sum(s, red);
        if (threadIdx.x == 0) total[r] = m + __logf(s);
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
