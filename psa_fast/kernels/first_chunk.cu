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
// blocks, and `extra` more, at most n. It also adds the group's speculated chunks (the schedule's: the
// forced ones, first_chunk's ranked chunk, then `step` positions at a time) to `spec_total`, from which the
// speculative attend picks its CTA shape (psa_decode's PSA_SPEC build) and which psa_spec_verify sets back
// to 0, and lists them in `spec_items` (entry `gi * spec_chunks + chunk` at the group's offset in the count,
// those below `items_cap`) for the attend's build of several warps.
//
// One warp per group (lane h < PSA_G searches head h); grid (Gn, B).
//   log_suffix [B, Hq, Nmax + 1] float (psa_order_suffix over the per-head estimates)
//   first_len  [B, Gn] int: psa_first_chunk's output, the ranked blocks of the first ranked chunk (0: none);
//              psa_spec_len's input (or null), the schedule's second chunk
//   spec_len   [B, Gn] int out: positions to speculate
//   spec_total [1] int in/out: the chunks speculated over all groups (0 before the launch)
//   spec_items [items_cap] int out or null: the speculated chunks, in no particular order of groups
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
             const int* __restrict__ first_len, int* __restrict__ spec_total, int* __restrict__ spec_items,
             int items_cap, int spec_chunks) {
    const int g = blockIdx.x, b = blockIdx.y, Gn = gridDim.x, gi = b * Gn + g;
    const int n = (seq_lens[b] + PSA_S - 1) / PSA_S, f = min(n, forced);
    const int need = predicted_prefix(log_suffix, b, g, Hq, Nmax, n, log_rest);
    const int ranked = (int)ceilf(margin * (float)max(0, need - f));
    const int len = min(n, f + ranked + extra);
    const int f2 = first_len ? min(n, f + __ldg(first_len + gi)) : f;
    const int chunks = chunks_before(len, f, f2, step);  // the attend's live chunks 0 .. chunks - 1
    int at = 0;
    if (threadIdx.x == 0) {
        spec_len[gi] = len;
        at = atomicAdd(spec_total, chunks);
    }
    at = __shfl_sync(0xffffffffu, at, 0);
    if (spec_items)
        for (int c = threadIdx.x; c < chunks && at + c < items_cap; c += 32) spec_items[at + c] = gi * spec_chunks + c;
}
