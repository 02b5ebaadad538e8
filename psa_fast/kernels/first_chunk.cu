// first_chunk = "predicted" on the GPU: per selection group, how many ranked blocks the estimates say
// reach tau (psa_ref.progressive.predicted_first_chunk), from the per-head suffix sums that
// psa_order_suffix computes along the order over the heads' estimates:
//   log_suffix[h][i] = log sum_{i' >= i} n_j exp(s_jh),  j = order[i'].
// The prefix [0, L) holds tau of head h's estimated total when
//   1 - exp(log_suffix[h][L] - log_suffix[h][0]) >= tau,  i.e.  log_suffix[h][L] <= log_suffix[h][0] + log(1 - tau),
// and log_suffix is non-increasing in L, so each head's smallest such L is found by a binary search
// (14 steps at 16384 blocks). The group's count is the largest over its heads, less the forced blocks.
//
// psa_spec_len (DecodePlan(speculate=...)) turns the same prediction into the positions the speculative
// schedule attends in parallel before verifying: the forced blocks, `margin` times the predicted ranked
// blocks, and `extra` more, at most n. It also adds the group's speculated chunks (of `step` positions
// after the forced ones; without first_chunk's ranked chunk) to `spec_total`, from which the speculative
// attend picks its CTA shape (psa_decode's PSA_SPEC build) and which psa_spec_verify sets back to 0.
//
// One warp per group (lane h < PSA_G searches head h); grid (Gn, B).
//   log_suffix [B, Hq, Nmax + 1] float (psa_order_suffix over the per-head estimates)
//   first_len  [B, Gn] int out: ranked blocks of the first ranked chunk (0: none)
//   spec_len   [B, Gn] int out: positions to speculate
//   spec_total [1] int in/out: the chunks speculated over all groups (0 before the launch)
#include "common.cuh"
#include "verifier.cuh"

// The smallest prefix of the order that holds tau of every head's estimated total, over the group's
// heads (every lane gets it).
__device__ __forceinline__ int predicted_prefix(const float* __restrict__ log_suffix, int b, int g, int Hq, int Nmax,
                                                int n, float log_rest) {
    const int lane = threadIdx.x;
    int need = 0;
    if (lane < PSA_G) {
        const float* ls = log_suffix + ((long)b * Hq + g * PSA_G + lane) * (Nmax + 1);
        const float target = __ldg(ls) + log_rest;
        int lo = 1, hi = n;  // the answer lies in [1, n]: ls[n] = -inf passes
        while (lo < hi) {
            const int mid = (lo + hi) >> 1;
            if (__ldg(ls + mid) <= target) hi = mid; else lo = mid + 1;
        }
        need = lo;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) need = max(need, __shfl_xor_sync(0xffffffffu, need, o));
    return need;
}

extern "C" __global__ void __launch_bounds__(32)
psa_first_chunk(const float* __restrict__ log_suffix, const int* __restrict__ seq_lens, int* __restrict__ first_len,
                int Hq, int Nmax, int forced, float log_rest) {
    const int g = blockIdx.x, b = blockIdx.y, Gn = gridDim.x;
    const int n = (seq_lens[b] + PSA_S - 1) / PSA_S;
    const int need = predicted_prefix(log_suffix, b, g, Hq, Nmax, n, log_rest);
    if (threadIdx.x == 0) first_len[(long)b * Gn + g] = max(0, need - min(n, forced));
}

extern "C" __global__ void __launch_bounds__(32)
psa_spec_len(const float* __restrict__ log_suffix, const int* __restrict__ seq_lens, int* __restrict__ spec_len,
             int Hq, int Nmax, int forced, float log_rest, float margin, int extra, int step,
             int* __restrict__ spec_total) {
    const int g = blockIdx.x, b = blockIdx.y, Gn = gridDim.x;
    const int n = (seq_lens[b] + PSA_S - 1) / PSA_S, f = min(n, forced);
    const int need = predicted_prefix(log_suffix, b, g, Hq, Nmax, n, log_rest);
    const int ranked = (int)ceilf(margin * (float)max(0, need - f));
    const int len = min(n, f + ranked + extra);
    if (threadIdx.x == 0) {
        spec_len[(long)b * Gn + g] = len;
        atomicAdd(spec_total, chunks_before(len, f, f, step));
    }
}
