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

// (m, s) <- the log-sum-exp pair of (m, s) and (mo, so): sum = s e^m + so e^mo, kept as m' = max and
// s' = sum / e^m'. An empty pair is (-inf, 0). The same merge as common.cuh's lse_merge, in place: with that float2
// form this kernel took 5.3 / 7.2 µs at B = 8 / 32 on Gemma 3's layer 5 against 4.1 / 4.8 with this one (H100, the
// same run twice; benchmarks/NOTES.md, forty-eighth session, s48a).
__device__ __forceinline__ void lse_merge_into(float& m, float& s, float mo, float so) {
    const float mn = fmaxf(m, mo);
    if (mn == -PSA_INF) return;
    s = s * __expf(m - mn) + so * __expf(mo - mn);
    m = mn;
}

extern "C" __global__ void __launch_bounds__(PSA_SHARE_THREADS)
psa_share_key(const float* __restrict__ ests, const int* __restrict__ seq_lens, float* __restrict__ scores,
              int Hq, int Nmax) {
    __shared__ float red_m[PSA_G][PSA_SHARE_WARPS], red_s[PSA_G][PSA_SHARE_WARPS];
    __shared__ float total[PSA_G];
    const int grp = blockIdx.x, b = blockIdx.y;
    const int len = seq_lens[b];
    const int n = (len + PSA_S - 1) / PSA_S;
    const float* e0 = ests + ((long)b * Hq + grp * PSA_G) * Nmax;
    float m[PSA_G], s[PSA_G];  // each head's estimated total log sum_j n_j exp(e_j), online
#pragma unroll
    for (int r = 0; r < PSA_G; ++r) m[r] = -PSA_INF, s[r] = 0.f;
    for (int j = threadIdx.x; j < n; j += PSA_SHARE_THREADS) {
        const float log_n = __logf((float)min(PSA_S, len - j * PSA_S));
#pragma unroll
        for (int r = 0; r < PSA_G; ++r) lse_merge_into(m[r], s[r], e0[(long)r * Nmax + j] + log_n, 1.f);
    }
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
    for (int r = 0; r < PSA_G; ++r) {
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float mo = __shfl_xor_sync(0xffffffffu, m[r], o), so = __shfl_xor_sync(0xffffffffu, s[r], o);
            lse_merge_into(m[r], s[r], mo, so);
        }
        if (lane == 0) red_m[r][warp] = m[r], red_s[r][warp] = s[r];
    }
    __syncthreads();
    for (int r = warp; r < PSA_G; r += PSA_SHARE_WARPS) {  // warp r reduces head r's pairs over the warps
        float mr = lane < PSA_SHARE_WARPS ? red_m[r][lane] : -PSA_INF;
        float sr = lane < PSA_SHARE_WARPS ? red_s[r][lane] : 0.f;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float mo = __shfl_xor_sync(0xffffffffu, mr, o), so = __shfl_xor_sync(0xffffffffu, sr, o);
            lse_merge_into(mr, sr, mo, so);
        }
        if (lane == 0) total[r] = mr + __logf(sr);
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
