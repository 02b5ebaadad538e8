// first_chunk="estimated_stop" (psa_ref.progressive.estimated_stop_first_chunk): per group, the ranked blocks after
// which the stop rule (ema or remaining), run on the estimated block masses n_j exp(s_j) along the processing
// order, first holds for every head of the group, times `margin`, rounded up: at least 1, at most the ranked
// blocks. Written to first_len, which the decode kernel reads as its first ranked chunk (as psa_first_chunk's).
//
// One CTA of PSA_ES_THREADS per (group, request); thread t owns the consecutive positions [t R, (t + 1) R) of the
// order, R = ceil(n / PSA_ES_THREADS) <= 32 (the host checks Nmax). For each head of the group the CTA scans, in
// processing order, the attended mass AS_acc (a sum), the rule's running term (ema: the moving average as a
// composition of affine maps E -> a E + b, position 0 (0, m_0), position i (1 - w, w m_i); remaining: the running
// minimum) in three steps: each thread folds its run; the folds are scanned across the CTA (warp shuffles, then the
// warps' totals); each thread rewalks its run from its exclusive prefix and tests every position as the loop tests
// a boundary, AS_acc / (AS_acc + N_left rest) >= tau. A position's bit in the thread's mask survives only if every
// head holds there. The first surviving position past the forced blocks is a CTA minimum. The masses are taken
// relative to each head's estimated total (log_suffix[0]), so none overflows and the ratios are the reference's up
// to float32 rounding.
//   ordered    [B, Hq, Nmax] float: x_i = s_{order[i]} + log n_{order[i]} at i < n (psa_order_suffix's `ordered`)
//   log_suffix [B, Hq, Nmax + 1] float: entry 0, each head's log estimated total
//   seq_lens   [B] int: tokens of each request (n = ceil(len / PSA_S) blocks)
//   first_len  [B, Gn] int out: the first ranked chunk's blocks (0 where no block is ranked)
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
psa_estimated_stop(const float* __restrict__ ordered, const float* __restrict__ log_suffix,
                   const int* __restrict__ seq_lens, int* __restrict__ first_len, int Hq, int Nmax, int forced,
                   float threshold, float ema_w, int stop, float margin) {
    __shared__ EsState warp_tot[PSA_ES_WARPS];
    __shared__ int best;
    const int g = blockIdx.x, b = blockIdx.y, Gn = gridDim.x, h0 = g * PSA_G;
    const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
    const int n = (seq_lens[b] + PSA_S - 1) / PSA_S, f = min(n, forced);
    if (n == f || threshold >= 1.f) {  // no ranked block, or every block read anyway: the plain schedule
        if (t == 0) first_len[(long)b * Gn + g] = 0;
        return;
    }
    const int R = (n + PSA_ES_THREADS - 1) / PSA_ES_THREADS;  // <= 32 (host check)
    const int i0 = t * R, i1 = min(n, i0 + R);
    const float keep = 1.f - ema_w;
    unsigned int mask = 0xffffffffu;  // bit r: position i0 + r holds for every head so far
    if (t == 0) best = n;
    for (int h = 0; h < PSA_G; ++h) {
        const long row = (long)b * Hq + h0 + h;
        const float* x = ordered + row * Nmax;
        const float total = __ldg(log_suffix + row * (Nmax + 1));
        // 1. this thread's fold
        EsState mine = es_identity();
        for (int i = i0; i < i1; ++i) mine = es_push(mine, i, expf(__ldg(x + i) - total), keep, ema_w);
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
            st = es_push(st, i, expf(__ldg(x + i) - total), keep, ema_w);
            const float rest = stop == 0 ? st.b : st.mn;
            const float n_left = (float)(n - 1 - i);
            const bool holds = st.s / (st.s + n_left * rest) >= threshold;
            if (!holds) mask &= ~(1u << (i - i0));
        }
        __syncthreads();  // warp_tot is rewritten by the next head
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
