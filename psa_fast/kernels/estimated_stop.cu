// first_chunk="estimated_stop" (psa_ref.progressive.estimated_stop_first_chunk): per group, the ranked blocks after
// which the stop rule (ema or remaining), run on the estimated block masses n_j exp(s_j) along the processing
// order, first holds for every head of the group, times `margin`, rounded up: at least 1, at most the ranked
// blocks. Written to first_len, which the decode kernel reads as its first ranked chunk (as psa_first_chunk's).
// It reads the per-head estimates and the order itself, so the plan runs no suffix pass for it (psa_order_suffix
// costs 4.4 µs at 2,048 blocks, 8.4 at 8,192 for one Llama request on the H100: more than the decisions it saves).
//
// One CTA of PSA_ES_THREADS per (group, request); thread t owns the consecutive positions [t R, (t + 1) R) of the
// order, R = ceil(n / PSA_ES_THREADS). Every head of the group at once (PSA_G states a thread): each head's x_i at
// position i is vals[order[i]] + log n_{order[i]}, and the head's maximum X over the CTA is the masses' reference
// (exp(x_i - X) <= 1: none overflows, and the rule's ratios do not depend on X). Then, in processing order, the
// attended mass AS_acc (a sum) and the rule's running term (ema: the moving average as a composition of affine maps
// E -> a E + b, position 0 (0, m_0), position i (1 - w, w m_i); remaining: the running minimum) in three steps: each
// thread folds its run; the folds are scanned across the CTA (lanes by shuffles, then the warps' totals by one warp
// scan in every warp); each thread rewalks its run from its exclusive prefix and tests every position as the loop
// tests a boundary, AS_acc / (AS_acc + N_left rest) >= tau, for every head. A thread's first position past the
// forced blocks where every head holds is its candidate; the group's is the CTA's minimum.
// The first version went head by head (three barriers each) and took each thread's candidate by a shared atomicMin
// (~1,000 on one word): 15.9 µs for one Llama request at 32K on the H100 (s60i); this one, three barriers in all,
// 8.5 µs there and 23.6 at 128K (s61a). Timed alone (H200, s62, exp_estimated_stop_time.py): ~5 µs fixed and
// ~1.4 µs a position of a thread's run, staged in shared memory or not: its work on one SM a group, not its loads.
// v4 (PSA_ES_WINDOWS 1, below; s63) walks the order in windows and leaves at the stop; on the H100 (s64) it was slower
// than this (9.7 µs alone at 2,048 blocks, 11.8 against 8.6 in a per-head step): each window waited on its loads. v5
// (the same switch; not yet timed) issues them two to four windows ahead.
//   vals       [B, Hq, Nmax] float: each query head's estimate s_j of every block (the plan's per-head estimates)
//   order      [B, Gn, Nmax] int: the group's processing order (forced blocks first)
//   seq_lens   [B] int: tokens of each request (n = ceil(len / PSA_S) blocks; the last may be partial)
//   first_len  [B, Gn] int out: the first ranked chunk's blocks (0 where no block is ranked, or tau >= 1)
//   stop       0: ema, 1: remaining
#include "common.cuh"

#ifndef PSA_ES_THREADS
#define PSA_ES_THREADS 512  // _kernels.ESTIMATED_STOP_THREADS (an experiment may define another)
#endif
#define PSA_ES_WARPS (PSA_ES_THREADS / 32)
static_assert(PSA_ES_WARPS <= 32, "psa_estimated_stop: one warp scans the warps' totals");

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

__device__ __forceinline__ EsState es_shfl(const EsState& v, int src) {
    return EsState{__shfl_sync(0xffffffffu, v.s, src), __shfl_sync(0xffffffffu, v.a, src),
                   __shfl_sync(0xffffffffu, v.b, src), __shfl_sync(0xffffffffu, v.mn, src)};
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

#ifndef PSA_ES_WINDOWS
#define PSA_ES_WINDOWS 0  // _kernels.ESTIMATED_STOP_WINDOWS: 1 = v5 (below), 0 = v2
#endif

#if PSA_ES_WINDOWS
// v5 (v4's walk, its loads further ahead): the order in windows of one position a thread, in processing order,
// leaving after the first window where a position holds (the rule at position i reads nothing after i), so the
// kernel reads up to the stop's window and one more, not the whole order twice. Each window's masses are relative to
// the running maximum of the windows read so far (the carried state is rescaled when it grows: the rule's ratios do
// not depend on the reference). A window: every head's maximum (barrier 1; the previous window's candidates are read
// after it), each position's state as the scan of the window composed with the carried one (barrier 2), the test,
// each warp's first holding position. The loads run two to four windows ahead (below).
extern "C" __global__ void __launch_bounds__(PSA_ES_THREADS)
psa_estimated_stop(const float* __restrict__ vals, const int* __restrict__ order, const int* __restrict__ seq_lens,
                   int* __restrict__ first_len, int Hq, int Nmax, int forced, float threshold, float ema_w, int stop,
                   float margin) {
    __shared__ EsState warp_tot[PSA_G][PSA_ES_WARPS];
    __shared__ float warp_max[PSA_G][PSA_ES_WARPS];
    __shared__ int warp_best[PSA_ES_WARPS];
    const int g = blockIdx.x, b = blockIdx.y, Gn = gridDim.x, h0 = g * PSA_G;
    const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
    const int len = seq_lens[b];
    const int n = (len + PSA_S - 1) / PSA_S, f = min(n, forced);
    int* out = first_len + (long)b * Gn + g;
    if (n == f || threshold >= 1.f) {  // no ranked block, or every block read anyway: the plain schedule
        if (t == 0) *out = 0;
        return;
    }
    const float keep = 1.f - ema_w;
    const int* orow = order + ((long)b * Gn + g) * Nmax;
    const float* v = vals + ((long)b * Hq + h0) * Nmax;  // head h's row: v + h Nmax
    const float log_last = __logf((float)(len - (n - 1) * PSA_S));  // the last block's tokens (others: PSA_S)
    const float log_full = __logf((float)PSA_S);
    // every head's x at position i (block j = order[i]): its estimate plus the log of the block's tokens; -inf
    // past the order (such a position holds no mass and is never a candidate)
    auto x_of = [&](int i, int j, float (&x)[PSA_G]) {
        const float lt = j == n - 1 ? log_last : log_full;
#pragma unroll
        for (int h = 0; h < PSA_G; ++h) x[h] = i < n ? __ldg(v + (long)h * Nmax + j) + lt : -PSA_INF;
    };
    EsState carry[PSA_G];  // every head's state after the windows read so far (the same in every thread)
    float ref[PSA_G];      // the reference its masses are relative to: the largest x read so far
#pragma unroll
    for (int h = 0; h < PSA_G; ++h) {
        carry[h] = es_identity();
        ref[h] = -PSA_INF;
    }
    // The loads run ahead of the walk (v5; v4 issued them one window ahead, and each window then waited on their two
    // dependent round trips, the order entry and the estimates it points to: ~3 µs a window on the H100, s64): the
    // order entries of windows w + 2 and w + 3 are held at the top of window w, which issues the entry of window w + 4
    // and the estimates of window w + 2, so each window's estimates were asked for two windows before it.
    constexpr int T = PSA_ES_THREADS;
    auto entry = [&](int p) { return p < n ? __ldg(orow + p) : 0; };
    const int j0 = entry(t), j1 = entry(t + T);
    int j2 = entry(t + 2 * T), j3 = entry(t + 3 * T);
    float x[PSA_G], xn[PSA_G];  // the estimates of windows w and w + 1
    x_of(t, j0, x);
    x_of(t + T, j1, xn);
    for (int start = 0;; start += PSA_ES_THREADS) {
        const int i = start + t;
        const int j4 = entry(i + 4 * T);
        float xnn[PSA_G];
        x_of(i + 2 * T, j2, xnn);
        // 1. every head's maximum over the window
        float top[PSA_G];
#pragma unroll
        for (int h = 0; h < PSA_G; ++h) {
            top[h] = x[h];
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) top[h] = fmaxf(top[h], __shfl_xor_sync(0xffffffffu, top[h], off));
            if (lane == 0) warp_max[h][warp] = top[h];
        }
        __syncthreads();
        if (start > 0) {  // the previous window's first holding position, if any: the walk ends there
            const int best = __reduce_min_sync(0xffffffffu, lane < PSA_ES_WARPS ? warp_best[lane] : n);
            if (best < n) {
                if (t == 0) *out = min(n - f, max(1, (int)ceilf(margin * (float)(best + 1 - f) - 1e-6f)));
                return;
            }
        }
        if (start >= n) {  // unreachable: the order's last position holds (N_left = 0); a NaN estimate must not hang
            if (t == 0) *out = n - f;
            return;
        }
        EsState incl[PSA_G];
#pragma unroll
        for (int h = 0; h < PSA_G; ++h) {
            top[h] = lane < PSA_ES_WARPS ? warp_max[h][lane] : -PSA_INF;
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) top[h] = fmaxf(top[h], __shfl_xor_sync(0xffffffffu, top[h], off));
            const float now = fmaxf(ref[h], top[h]);
            if (ref[h] > -PSA_INF) {  // the carried masses relative to the new maximum (mn stays inf until a mass)
                const float scale = expf(ref[h] - now);
                carry[h].s *= scale;
                carry[h].b *= scale;
                carry[h].mn = carry[h].mn < PSA_INF ? carry[h].mn * scale : PSA_INF;
            }
            ref[h] = now;
            // 2. this position's own state, scanned over the warp's lanes
            const EsState own = i < n ? es_push(es_identity(), i, expf(x[h] - now), keep, ema_w) : es_identity();
            incl[h] = es_warp_scan(own, lane);
            if (lane == 31) warp_tot[h][warp] = incl[h];
        }
        __syncthreads();
        bool holds = i < n && i >= f;
#pragma unroll
        for (int h = 0; h < PSA_G; ++h) {
            const EsState tot = es_warp_scan(lane < PSA_ES_WARPS ? warp_tot[h][lane] : es_identity(), lane);
            const EsState before = es_shfl(tot, warp == 0 ? 0 : warp - 1);
            const EsState st = es_then(carry[h], warp > 0 ? es_then(before, incl[h]) : incl[h]);
            const float rest = stop == 0 ? st.b : st.mn;
            holds = holds && st.s / (st.s + (float)(n - 1 - i) * rest) >= threshold;
            carry[h] = es_then(carry[h], es_shfl(tot, PSA_ES_WARPS - 1));
        }
        const int mine = __reduce_min_sync(0xffffffffu, holds ? i : n);
        if (lane == 0) warp_best[warp] = mine;  // read after the next window's barrier 1
#pragma unroll
        for (int h = 0; h < PSA_G; ++h) {
            x[h] = xn[h];
            xn[h] = xnn[h];
        }
        j2 = j3;
        j3 = j4;
    }
}
#else
extern "C" __global__ void __launch_bounds__(PSA_ES_THREADS)
psa_estimated_stop(const float* __restrict__ vals, const int* __restrict__ order, const int* __restrict__ seq_lens,
                   int* __restrict__ first_len, int Hq, int Nmax, int forced, float threshold, float ema_w, int stop,
                   float margin) {
    __shared__ EsState warp_tot[PSA_G][PSA_ES_WARPS];
    __shared__ float warp_max[PSA_G][PSA_ES_WARPS];
    __shared__ int warp_best[PSA_ES_WARPS];
    const int g = blockIdx.x, b = blockIdx.y, Gn = gridDim.x, h0 = g * PSA_G;
    const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
    const int len = seq_lens[b];
    const int n = (len + PSA_S - 1) / PSA_S, f = min(n, forced);
    if (n == f || threshold >= 1.f) {  // no ranked block, or every block read anyway: the plain schedule
        if (t == 0) first_len[(long)b * Gn + g] = 0;
        return;
    }
    const int R = (n + PSA_ES_THREADS - 1) / PSA_ES_THREADS;
    const int i0 = min(n, t * R), i1 = min(n, i0 + R);
    const float keep = 1.f - ema_w;
    const int* orow = order + ((long)b * Gn + g) * Nmax;
    const float* v = vals + ((long)b * Hq + h0) * Nmax;  // head h's row: v + h Nmax
    const float log_last = __logf((float)(len - (n - 1) * PSA_S));  // the last block's tokens (others: PSA_S)
    const float log_full = __logf((float)PSA_S);
    // every head's x at position i: its estimate of the block there plus the log of the block's tokens
    auto x_at = [&](int i, float (&x)[PSA_G]) {
        const int j = __ldg(orow + i);
        const float lt = j == n - 1 ? log_last : log_full;
#pragma unroll
        for (int h = 0; h < PSA_G; ++h) x[h] = __ldg(v + (long)h * Nmax + j) + lt;
    };
    // 0. each head's maximum x over the CTA (positions strided over the threads: coalesced loads of the order, and
    // the L1 then holds every line the runs below read again)
    float top[PSA_G];
#pragma unroll
    for (int h = 0; h < PSA_G; ++h) top[h] = -PSA_INF;
#pragma unroll 4
    for (int i = t; i < n; i += PSA_ES_THREADS) {
        float x[PSA_G];
        x_at(i, x);
#pragma unroll
        for (int h = 0; h < PSA_G; ++h) top[h] = fmaxf(top[h], x[h]);
    }
#pragma unroll
    for (int h = 0; h < PSA_G; ++h) {
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) top[h] = fmaxf(top[h], __shfl_xor_sync(0xffffffffu, top[h], off));
        if (lane == 0) warp_max[h][warp] = top[h];
    }
    __syncthreads();
#pragma unroll
    for (int h = 0; h < PSA_G; ++h) {
        top[h] = lane < PSA_ES_WARPS ? warp_max[h][lane] : -PSA_INF;
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) top[h] = fmaxf(top[h], __shfl_xor_sync(0xffffffffu, top[h], off));
    }
    // 1. this thread's fold of its run, every head
    EsState st[PSA_G];
#pragma unroll
    for (int h = 0; h < PSA_G; ++h) st[h] = es_identity();
    for (int i = i0; i < i1; ++i) {
        float x[PSA_G];
        x_at(i, x);
#pragma unroll
        for (int h = 0; h < PSA_G; ++h) st[h] = es_push(st[h], i, expf(x[h] - top[h]), keep, ema_w);
    }
    // 2. the prefix of everything before this thread: the earlier lanes, then the earlier warps
#pragma unroll
    for (int h = 0; h < PSA_G; ++h) {
        const EsState incl = es_warp_scan(st[h], lane);
        st[h] = es_shfl_up(incl, 1);
        if (lane == 0) st[h] = es_identity();
        if (lane == 31) warp_tot[h][warp] = incl;
    }
    __syncthreads();
#pragma unroll
    for (int h = 0; h < PSA_G; ++h) {
        const EsState tot = es_warp_scan(lane < PSA_ES_WARPS ? warp_tot[h][lane] : es_identity(), lane);
        const EsState before = es_shfl(tot, warp == 0 ? 0 : warp - 1);
        if (warp > 0) st[h] = es_then(before, st[h]);
    }
    // 3. rewalk: each position's test, as the loop's at a boundary after it; the first that every head passes
    int mine = n;
    for (int i = i0; i < i1; ++i) {
        float x[PSA_G];
        x_at(i, x);
        bool holds = true;
#pragma unroll
        for (int h = 0; h < PSA_G; ++h) {
            st[h] = es_push(st[h], i, expf(x[h] - top[h]), keep, ema_w);
            const float rest = stop == 0 ? st[h].b : st[h].mn;
            const float n_left = (float)(n - 1 - i);
            holds = holds && st[h].s / (st[h].s + n_left * rest) >= threshold;
        }
        if (holds && i >= f) {
            mine = i;
            break;
        }
    }
    mine = __reduce_min_sync(0xffffffffu, mine);
    if (lane == 0) warp_best[warp] = mine;
    __syncthreads();
    if (warp == 0) {
        int best = __reduce_min_sync(0xffffffffu, lane < PSA_ES_WARPS ? warp_best[lane] : n);
        if (lane == 0) {
            const int ranked = best + 1 - f;  // best < n: the last position always holds (N_left = 0)
            const int sized = (int)ceilf(margin * (float)ranked - 1e-6f);
            first_len[(long)b * Gn + g] = min(n - f, max(1, sized));
        }
    }
}
#endif  // PSA_ES_WINDOWS
