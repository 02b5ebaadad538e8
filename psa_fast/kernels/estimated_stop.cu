// first_chunk="estimated_stop" (psa_ref.progressive.estimated_stop_first_chunk): per group, the ranked blocks after
// which the stop rule (ema or remaining), run on the estimated block masses n_j exp(s_j) along the processing
// order, first holds for every head of the group, times `margin`, rounded up: at least 1, at most the ranked
// blocks. Written to first_len, which the decode kernel reads as its first ranked chunk (as psa_first_chunk's).
// It reads the per-head estimates and the order itself, so the plan runs no suffix pass for it (psa_order_suffix
// costs 4.4 µs at 2,048 blocks, 8.4 at 8,192 for one Llama request on the H100: more than the decisions it saves).
//
// One CTA of PSA_ES_THREADS per (group, request); thread t owns the consecutive positions [t R, (t + 1) R) of the
// order, R = ceil(n / PSA_ES_THREADS) <= 32 (the host checks Nmax). For each head of the group: each thread gathers
// its positions' x_i = vals[order[i]] + log n_{order[i]} and the CTA takes their maximum X (masses exp(x_i - X) <= 1:
// none overflows, and the rule's ratios do not depend on X); then the CTA scans, in processing order, the attended
// mass AS_acc (a sum) and the rule's running term (ema: the moving average as a composition of affine maps
// E -> a E + b, position 0 (0, m_0), position i (1 - w, w m_i); remaining: the running minimum) in three steps: each
// thread folds its run; the folds are scanned across the CTA (warp shuffles, then the warps' totals); each thread
// rewalks its run from its exclusive prefix and tests every position as the loop tests a boundary, AS_acc /
// (AS_acc + N_left rest) >= tau. A position's bit in the thread's mask survives only if every head holds there. The
// first surviving position past the forced blocks is a CTA minimum.
//   vals       [B, Hq, Nmax] float: each query head's estimate s_j of every block (the plan's per-head estimates)
//   order      [B, Gn, Nmax] int: the group's processing order (forced blocks first)
//   seq_lens   [B] int: tokens of each request (n = ceil(len / PSA_S) blocks; the last may be partial)
//   first_len  [B, Gn] int out: the first ranked chunk's blocks (0 where no block is ranked, or tau >= 1)
//   stop       0: ema, 1: remaining
#include "common.cuh"

#define PSA_ES_THREADS 1024
#define PSA_ES_WARPS (PSA_ES_THREADS / 32)

// Running state of a prefix: attended mass, the moving average as the affine map (a, b), the lightest mass.
struct EsState {
    float s, a, b, mn;
};

__device__ __forceinline__ EsState es_identity() { return EsState{0.f, 1.f, 0.f, PSA_INF}; }

// `lo` then `hi` (positions of `lo` come first in the order).
__device__ __forceinline__ EsState es_then(const EsState& lo, const EsState& hi) {
    return EsState{lo.s + hi.s, lo.a * hi.a, lo.b * hi.a + hi.b, fminf(lo.mn, hi.mn)};
}

// State after folding the block at position i of mass m (keep = 1 - w).
__device__ __forceinline__ EsState es_push(const EsState& st, int i, float m, float keep, float w) {
    const float ai = i == 0 ? 0.f : keep, bi = i == 0 ? m : w * m;
    return EsState{st.s + m, st.a * ai, st.b * ai + bi, fminf(st.mn, m)};
}

__device__ __forceinline__ EsState es_shfl_up(const EsState& v, int off) {
    return EsState{__shfl_up_sync(0xffffffffu, v.s, off), __shfl_up_sync(0xffffffffu, v.a, off),
                   __shfl_up_sync(0xffffffffu, v.b, off), __shfl_up_sync(0xffffffffu, v.mn, off)};
}

// Inclusive scan over a warp's lanes in lane order.
__device__ __forceinline__ EsState es_warp_scan(EsState v, int lane) {
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
        const EsState o = es_shfl_up(v, off);
        if (lane >= off) v = es_then(o, v);
    }
    return v;
}

extern "C" __global__ void __launch_bounds__(PSA_ES_THREADS)
psa_estimated_stop(const float* __restrict__ vals, const int* __restrict__ order, const int* __restrict__ seq_lens,
                   int* __restrict__ first_len, int Hq, int Nmax, int forced, float threshold, float ema_w, int stop,
                   float margin) {
    __shared__ EsState warp_tot[PSA_ES_WARPS];
    __shared__ float warp_max[PSA_ES_WARPS];
    __shared__ int best;
    const int g = blockIdx.x, b = blockIdx.y, Gn = gridDim.x, h0 = g * PSA_G;
    const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
    const int len = seq_lens[b];
    const int n = (len + PSA_S - 1) / PSA_S, f = min(n, forced);
    if (n == f || threshold >= 1.f) {  // no ranked block, or every block read anyway: the plain schedule
        if (t == 0) first_len[(long)b * Gn + g] = 0;
        return;
    }
    const int R = (n + PSA_ES_THREADS - 1) / PSA_ES_THREADS;  // <= 32 (host check)
    const int i0 = t * R, i1 = min(n, i0 + R);
    const float keep = 1.f - ema_w;
    unsigned int mask = 0xffffffffu;  // bit r: position i0 + r holds for every head so far
    if (t == 0) best = n;
    const int* orow = order + ((long)b * Gn + g) * Nmax;
    const float log_last = __logf((float)(len - (n - 1) * PSA_S));  // the last block's tokens (others: PSA_S)
    const float log_full = __logf((float)PSA_S);
    for (int h = 0; h < PSA_G; ++h) {
        const float* v = vals + ((long)b * Hq + h0 + h) * Nmax;
        // this head's x_i at position i: its estimate of the block there plus the log of the block's tokens
        auto x_at = [&](int i) {
            const int j = __ldg(orow + i);
            return __ldg(v + j) + (j == n - 1 ? log_last : log_full);
        };
        // 0. the CTA's maximum x, the masses' common reference
        float mx = -PSA_INF;
        for (int i = i0; i < i1; ++i) mx = fmaxf(mx, x_at(i));
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
        if (lane == 0) warp_max[warp] = mx;
        __syncthreads();
        float top = -PSA_INF;
        for (int w = 0; w < PSA_ES_WARPS; ++w) top = fmaxf(top, warp_max[w]);
        // 1. this thread's fold
        EsState mine = es_identity();
        for (int i = i0; i < i1; ++i) mine = es_push(mine, i, expf(x_at(i) - top), keep, ema_w);
        // 2. the prefix of everything before this thread: the earlier lanes, then the earlier warps
        const EsState incl = es_warp_scan(mine, lane);
        EsState lane_excl = es_shfl_up(incl, 1);
        if (lane == 0) lane_excl = es_identity();
        if (lane == 31) warp_tot[warp] = incl;
        __syncthreads();
        EsState before = es_identity();
        for (int w = 0; w < warp; ++w) before = es_then(before, warp_tot[w]);
        EsState st = es_then(before, lane_excl);
        // 3. rewalk: each position's test, as the loop's at a boundary after it
        for (int i = i0; i < i1; ++i) {
            st = es_push(st, i, expf(x_at(i) - top), keep, ema_w);
            const float rest = stop == 0 ? st.b : st.mn;
            const float n_left = (float)(n - 1 - i);
            const bool holds = st.s / (st.s + n_left * rest) >= threshold;
            if (!holds) mask &= ~(1u << (i - i0));
        }
        __syncthreads();  // warp_tot and warp_max are rewritten by the next head
    }
    for (int i = max(i0, f); i < i1; ++i)
        if (mask >> (i - i0) & 1u) {
            atomicMin(&best, i);
            break;
        }
    __syncthreads();
    if (t == 0) {
        const int ranked = best + 1 - f;  // best < n: the last position always holds (N_left = 0)
        const int sized = (int)ceilf(margin * (float)ranked - 1e-6f);
        first_len[(long)b * Gn + g] = min(n - f, max(1, sized));
    }
}
