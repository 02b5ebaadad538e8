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
// Walking the order in windows of one position a thread and leaving after the first window where the rule holds (v4,
// s63; v5, its loads two to four windows ahead, s64) was slower on the H100: ~3 µs a window whether its loads were
// one window ahead or three, 10.0 µs alone at 2,048 blocks against this version's 8.4, and 12.1 against 8.6 in a
// per-head step at 32K (s65). Removed after s65; the code is in git (commit 3239828, PSA_ES_WINDOWS). What those
// runs showed instead: the time is work on one SM a group, not waiting (a window of 1,024 threads cost 1.27x one of
// 512, and v2's time a position grows with its CTA: ~1 instruction-cycle a position and head in all).
// v6 (PSA_CLUSTER > 1, _kernels.ESTIMATED_STOP_CLUSTER) spreads that work: the group's order in PSA_CLUSTER slices,
// one a CTA of a cluster, each CTA v2 on its slice relative to its own maxima, with two exchanges over distributed
// shared memory (each a cluster_sync): each slice's maxima and fold (each CTA takes the largest maximum of the ranks
// up to its own as its reference and composes the folds of the ranks before it, each scaled by exp(its maximum -
// that), in rank order, before its threads' prefixes, also scaled), and each CTA's candidate (into rank 0, which takes
// the least). The sums are composed in another grouping than v2's (float32: the same tolerance against psa_ref).
// H100 s65 / s66, alone, one request of 8 groups, sorted: v6 with a third exchange (the maxima first) 64 blocks 7.6 µs
// (v2 4.7), 2,048 8.5 (8.5), 8,192 12.6 (24.0); without it (v6.1, this code) 7.4 / 8.2 / 11.7, 4,096 9.4 (v2 13.6).
// Every version's rewalk keeps the fold's masses in registers where a thread's run has at most PSA_ES_CACHE positions
// (no second load and exponential a position and head), and every test multiplies instead of dividing (below): s66,
// v2 2,048 blocks 8.5 -> 7.2 µs, 8,192 24.0 -> 20.7; v6.1 8,192 11.7 -> 10.2.
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
// a thread whose run has at most this many positions keeps the fold's masses in registers for the rewalk (4 floats a
// head: 2,048 blocks over 512 threads, 8,192 over a cluster of 8 CTAs of 256)
#define PSA_ES_CACHE 4
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

// The loop's test at a boundary after the position this state ends at, n_left blocks after it: AS_acc / (AS_acc +
// N_left rest) >= tau, rest the moving average (stop 0, ema) or the lightest mass (1, remaining), multiplied out:
// s (1 - tau) >= tau N_left rest with s > 0 (the division's 0 / 0 is false).
__device__ __forceinline__ bool es_holds(const EsState& st, float n_left, int stop, float threshold) {
    const float rest = stop == 0 ? st.b : st.mn;
    return st.s > 0.f && st.s * (1.f - threshold) >= threshold * (n_left * rest);
}

__device__ __forceinline__ EsState es_shfl_up(const EsState& v, int off) {
    return EsState{__shfl_up_sync(0xffffffffu, v.s, off), __shfl_up_sync(0xffffffffu, v.a, off),
                   __shfl_up_sync(0xffffffffu, v.b, off), __shfl_up_sync(0xffffffffu, v.mn, off)};
}

__device__ __forceinline__ EsState es_shfl(const EsState& v, int src) {
    return EsState{__shfl_sync(0xffffffffu, v.s, src), __shfl_sync(0xffffffffu, v.a, src),
                   __shfl_sync(0xffffffffu, v.b, src), __shfl_sync(0xffffffffu, v.mn, src)};
}

#if PSA_CLUSTER > 1
// A state's masses times c (the reference they are relative to moved up by -log c): the sum, the moving average's
// offset and the lightest mass scale, the affine map's factor does not (the identity stays the identity).
__device__ __forceinline__ EsState es_scaled(const EsState& v, float c) {
    return EsState{v.s * c, v.a, v.b * c, v.mn < PSA_INF ? v.mn * c : PSA_INF};
}

// Inclusive scan over the first PSA_CLUSTER lanes in lane order (the cluster's CTA totals, lane r: rank r).
__device__ __forceinline__ EsState es_cluster_scan(EsState v, int lane) {
#pragma unroll
    for (int off = 1; off < PSA_CLUSTER; off <<= 1) {
        const EsState o = es_shfl_up(v, off);
        if (lane >= off) v = es_then(o, v);
    }
    return v;
}
#endif

// Inclusive scan over a warp's lanes in lane order.
__device__ __forceinline__ EsState es_warp_scan(EsState v, int lane) {
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
        const EsState o = es_shfl_up(v, off);
        if (lane >= off) v = es_then(o, v);
    }
    return v;
}

extern "C" __global__ void
#if PSA_CLUSTER > 1
__cluster_dims__(PSA_CLUSTER, 1, 1)
#endif
__launch_bounds__(PSA_ES_THREADS)
psa_estimated_stop(const float* __restrict__ vals, const int* __restrict__ order, const int* __restrict__ seq_lens,
                   int* __restrict__ first_len, int Hq, int Nmax, int forced, float threshold, float ema_w, int stop,
                   float margin) {
    __shared__ EsState warp_tot[PSA_G][PSA_ES_WARPS];
    __shared__ float warp_max[PSA_G][PSA_ES_WARPS];
    __shared__ int warp_best[PSA_ES_WARPS];
#if PSA_CLUSTER > 1
    // v6: the group's order in PSA_CLUSTER slices, one a CTA of the cluster (rank r: positions [p0, p1)); what the
    // CTAs exchange: their heads' maxima with their slices' folds (each CTA composes those of the ranks before it),
    // then their candidates (written into rank 0's cta_best)
    __shared__ float cta_top[PSA_G];
    __shared__ __align__(16) EsState cta_tot[PSA_G];
    __shared__ int cta_best[PSA_CLUSTER];
    const unsigned int rank = cluster_rank();
    const int g = blockIdx.x / PSA_CLUSTER, b = blockIdx.y, Gn = gridDim.x / PSA_CLUSTER, h0 = g * PSA_G;
#else
    const int g = blockIdx.x, b = blockIdx.y, Gn = gridDim.x, h0 = g * PSA_G;
#endif
    const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
    const int len = seq_lens[b];
    const int n = (len + PSA_S - 1) / PSA_S, f = min(n, forced);
    if (n == f || threshold >= 1.f) {  // no ranked block, or every block read anyway: the plain schedule
#if PSA_CLUSTER > 1
        if (t == 0 && rank == 0) first_len[(long)b * Gn + g] = 0;  // (the same test in every CTA of the cluster)
#else
        if (t == 0) first_len[(long)b * Gn + g] = 0;
#endif
        return;
    }
#if PSA_CLUSTER > 1
    const int per = (n + PSA_CLUSTER - 1) / PSA_CLUSTER;
    const int p0 = min(n, (int)rank * per), p1 = min(n, p0 + per);
    const int R = (p1 - p0 + PSA_ES_THREADS - 1) / PSA_ES_THREADS;
    const int i0 = min(p1, p0 + t * R), i1 = min(p1, i0 + R);
#else
    const int p0 = 0, p1 = n;
    const int R = (n + PSA_ES_THREADS - 1) / PSA_ES_THREADS;
    const int i0 = min(n, t * R), i1 = min(n, i0 + R);
#endif
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
    for (int i = p0 + t; i < p1; i += PSA_ES_THREADS) {
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
#if PSA_CLUSTER > 1
    // (each CTA's masses relative to its own maximum, a finite reference even for a slice of -inf estimates; the
    // maxima travel with the folds)
#pragma unroll
    for (int h = 0; h < PSA_G; ++h) {
        if (t == 0) cta_top[h] = top[h];
        if (top[h] == -PSA_INF) top[h] = 0.f;
    }
#endif
    // 1. this thread's fold of its run, every head
    EsState st[PSA_G];
#pragma unroll
    for (int h = 0; h < PSA_G; ++h) st[h] = es_identity();
    float mc[PSA_ES_CACHE][PSA_G];  // the fold's masses where the run fits (R <= PSA_ES_CACHE), for the rewalk
    float rescale[PSA_G];           // what the rewalk multiplies them by (v6: its reference moves)
#pragma unroll
    for (int h = 0; h < PSA_G; ++h) rescale[h] = 1.f;
    if (R <= PSA_ES_CACHE) {
#pragma unroll
        for (int k = 0; k < PSA_ES_CACHE; ++k) {
            const int i = i0 + k;
            if (i < i1) {
                float x[PSA_G];
                x_at(i, x);
#pragma unroll
                for (int h = 0; h < PSA_G; ++h) {
                    mc[k][h] = expf(x[h] - top[h]);
                    st[h] = es_push(st[h], i, mc[k][h], keep, ema_w);
                }
            }
        }
    } else {
        for (int i = i0; i < i1; ++i) {
            float x[PSA_G];
            x_at(i, x);
#pragma unroll
            for (int h = 0; h < PSA_G; ++h) st[h] = es_push(st[h], i, expf(x[h] - top[h]), keep, ema_w);
        }
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
#if PSA_CLUSTER > 1
        const EsState slice = es_shfl(tot, PSA_ES_WARPS - 1);  // this CTA's slice, folded
        if (t == 0) cta_tot[h] = slice;
#endif
    }
#if PSA_CLUSTER > 1
    // the slices of the ranks before this one, composed in rank order (lane r < rank: rank r's), before every
    // thread's prefix, all relative to the largest maximum of ranks 0..rank (each rank's fold scaled by exp(its
    // maximum - that), this CTA's threads' prefixes too); the rewalk's masses then take that reference
    cluster_sync();
#pragma unroll
    for (int h = 0; h < PSA_G; ++h) {
        const float rank_top = lane < PSA_CLUSTER ? dsmem_load(&cta_top[h], lane) : -PSA_INF;  // lane r: rank r's
        float ref = lane <= (int)rank ? rank_top : -PSA_INF;
#pragma unroll
        for (int off = PSA_CLUSTER / 2; off > 0; off >>= 1) ref = fmaxf(ref, __shfl_xor_sync(0xffffffffu, ref, off));
        ref = __shfl_sync(0xffffffffu, ref, 0);
        EsState pre = es_identity();
        if (lane < (int)rank) {
            const float4 x = dsmem_load4(reinterpret_cast<const float4*>(&cta_tot[h]), lane);
            pre = es_scaled(EsState{x.x, x.y, x.z, x.w}, rank_top == -PSA_INF ? 0.f : expf(rank_top - ref));
        }
        pre = es_shfl(es_cluster_scan(pre, lane), PSA_CLUSTER - 1);
        const float own = __shfl_sync(0xffffffffu, rank_top, rank);
        const float c = own == -PSA_INF ? 0.f : expf(own - ref);
        st[h] = es_then(pre, es_scaled(st[h], c));
        top[h] = ref == -PSA_INF ? 0.f : ref;
        rescale[h] = c;
    }
#endif
    // 3. rewalk: each position's test, as the loop's at a boundary after it; the first that every head passes
    int mine = n;
    if (R <= PSA_ES_CACHE) {
#pragma unroll
        for (int k = 0; k < PSA_ES_CACHE; ++k) {
            const int i = i0 + k;
            if (i < i1 && mine == n) {
                bool holds = true;
#pragma unroll
                for (int h = 0; h < PSA_G; ++h) {
                    st[h] = es_push(st[h], i, mc[k][h] * rescale[h], keep, ema_w);
                    holds = holds && es_holds(st[h], (float)(n - 1 - i), stop, threshold);
                }
                if (holds && i >= f) mine = i;
            }
        }
    } else {
        for (int i = i0; i < i1; ++i) {
            float x[PSA_G];
            x_at(i, x);
            bool holds = true;
#pragma unroll
            for (int h = 0; h < PSA_G; ++h) {
                st[h] = es_push(st[h], i, expf(x[h] - top[h]), keep, ema_w);
                holds = holds && es_holds(st[h], (float)(n - 1 - i), stop, threshold);
            }
            if (holds && i >= f) {
                mine = i;
                break;
            }
        }
    }
    mine = __reduce_min_sync(0xffffffffu, mine);
    if (lane == 0) warp_best[warp] = mine;
    __syncthreads();
#if PSA_CLUSTER > 1
    // every CTA's candidate into rank 0's cta_best[rank]; rank 0 takes the least (no CTA's shared memory is read
    // after the barrier but rank 0's own, so the others may leave)
    if (warp == 0) {
        const int best = __reduce_min_sync(0xffffffffu, lane < PSA_ES_WARPS ? warp_best[lane] : n);
        if (lane == 0) dsmem_store_int(&cta_best[rank], 0, best);
    }
    cluster_sync();
    if (rank == 0 && warp == 0) {
        int best = __reduce_min_sync(0xffffffffu, lane < PSA_CLUSTER ? cta_best[lane] : n);
#else
    if (warp == 0) {
        int best = __reduce_min_sync(0xffffffffu, lane < PSA_ES_WARPS ? warp_best[lane] : n);
#endif
        if (lane == 0) {
            const int ranked = best + 1 - f;  // best < n: the last position always holds (N_left = 0)
            const int sized = (int)ceilf(margin * (float)ranked - 1e-6f);
            first_len[(long)b * Gn + g] = min(n - f, max(1, sized));
        }
    }
}
