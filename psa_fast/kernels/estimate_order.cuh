// One CTA's part of psa_estimate_order (estimate_order.cu): stages 1 and 2 for its group's run, as a device function
// so that a kernel of the same launch shape (a group a cluster of one CTA a run) can run it before its own work.
//
// The CTA (grid (R, Gn / H, B): run blockIdx.x of group blockIdx.y of request blockIdx.z) scores its run, sorts it,
// pushes it into every placing CTA of its cluster and places its own run's blocks (estimate_order.cu's header says
// how). `runs`, `words` and `bar` are the caller's shared memory ([H][R][256] and [H][256] words, one mbarrier),
// at the same offsets in every CTA of the cluster (the pushes address them there). Every thread returns when its part
// is done: the CTAs past the request's runs at once, false (they arrive at the cluster barrier the start arms, and do
// not wait there), the others after their placements, true (they waited there). `on_place` hears of each block
// placed (group orders: its position, the block and the request's n), where a caller passes one.
#pragma once
#include "estimate_mma.cuh"
#include "runs.cuh"

#ifndef PSA_EO_HEADS
#define PSA_EO_HEADS 1
#endif
#define PSA_H PSA_EO_HEADS
static_assert(PSA_BOUNDS == (PSA_H > 1 ? 2 : 0), "psa_estimate_order: the heads' own estimates (BOUNDS 2) for H > 1");
static_assert(PSA_H == 1 || PSA_H == PSA_G, "psa_estimate_order orders the group (H 1) or each of its heads (H G)");
static_assert(PSA_WARPS == 8 || PSA_WARPS == 16, "psa_estimate_order: 8 warps score two tiles each, 16 one each");
static_assert(PSA_CLUSTER >= 1 && PSA_CLUSTER <= 8, "psa_estimate_order: a group's runs, one a CTA, at most 8");
static_assert(PSA_H == 1 || !PSA_L2_FIRST, "psa_estimate_order: the L2 first chunk for group orders only");
#define PSA_WARP_RUN (PSA_RUN / PSA_WARPS)  // blocks a warp scores
#ifndef PSA_EO_EARLY
#define PSA_EO_EARLY 0  // 1: rows requested before the request's length is read (_kernels.ESTIMATE_ORDER_EARLY)
#endif
#ifndef PSA_EO_CLOCK
#define PSA_EO_CLOCK 0
#endif
// PSA_EO_CLOCK = 1 (benchmarks/exp_eo_clock.py; not for production): thread 0 of each CTA writes eo_clocks [B, Gn / H,
// R, 10]: the global timer (ns) at its start and at its end, then the SM clock's cycles from the start to: the run
// scored (after the CTA's barrier), the run sorted (warp 0), its pushes issued, every run received (after the CTA's
// barrier), its own placements written; 1 (the CTA had blocks to place); then the cycles to the request's length
// read and to warp 0's tiles scored. CTAs past the request's runs write 0s.
#if PSA_EO_CLOCK
#define PSA_EMARK(i) if (t == 0) eclk[i] = clock64() - eclk0
#else
#define PSA_EMARK(i)
#endif

// What a placing thread tells its caller beside `order` (on_place(position, block, n) for each of its blocks below the
// request's n; group orders only): nothing, unless a fused kernel passes its own (decode.cu's PSA_FUSED_FIRST).
struct eo_place_nothing {
    __device__ __forceinline__ void operator()(int, int, int) const {}
};

template <class OnPlace = eo_place_nothing>
__device__ __forceinline__ bool estimate_order_cta(
    const q_in_t* __restrict__ q, const __half* __restrict__ meta, const int* __restrict__ seq_lens,
    float* __restrict__ scores, int* __restrict__ order, int Hq, int Hkv, int Nmax, int sink_blocks, int recent_blocks,
    float q_scale, unsigned int (*__restrict__ runs)[PSA_CLUSTER][PSA_RUN], unsigned int (*__restrict__ words)[PSA_RUN],
    unsigned long long& bar PSA_L2_FIRST_PARAMS
#if PSA_EO_CLOCK
    , long long* __restrict__ eo_clocks
#endif
    , OnPlace on_place = OnPlace()) {
    const int b = blockIdx.z, g = blockIdx.y, mine = blockIdx.x;  // (the cluster spans x: its rank)
    const int Gn = gridDim.y * PSA_H;  // the orders of a request
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, t = threadIdx.x;
#if PSA_EO_CLOCK
    long long* eclk = eo_clocks + (((long)b * gridDim.y + g) * gridDim.x + mine) * 10;
    const long long eclk0 = clock64();
    if (t == 0) eclk[0] = globaltimer_ns();
#endif
#if PSA_CLUSTER > 1
    if (t == 0) {
        mbar_init(&bar, 1);
        mbar_init_fence();
    }
    cluster_arrive_relaxed();  // (waited for before the first push)
#endif
    const long row = ((long)b * Gn + g * PSA_H) * Nmax;  // order h's row: row + h Nmax
    const int base = mine * PSA_RUN;
#if PSA_L2_FIRST
    // the slot of the block this thread places (if any), asked for now: its load waits beside the estimate's work
    const int slot = t < PSA_RUN && base + t < Nmax ? __ldg(block_table + row + base + t) : 0;
#endif
    const int n = (seq_lens[b] + PSA_S - 1) / PSA_S;
    const int nruns = (n + PSA_RUN - 1) / PSA_RUN;
    const int run_end = min(base + PSA_RUN, Nmax);
    // no block of the request: scores -inf, positions past the group's runs -1 (without PSA_EO_EARLY before the
    // scoring; with it after, every CTA having scored its rows)
    auto leave = [&]() {
#if PSA_EO_CLOCK
        if (t == 0)
            for (int i = 0; i < 10; ++i) eclk[i] = 0;
#endif
        for (int p = t; p < PSA_H * PSA_RUN; p += PSA_WARPS * 32) {
            const int h = p / PSA_RUN, i = base + p % PSA_RUN;
            if (i < run_end) {
                scores[row + (long)h * Nmax + i] = -PSA_INF;
                order[row + (long)h * Nmax + i] = -1;
            }
        }
    };
#if !PSA_EO_EARLY
    if (mine >= nruns) {
        leave();
        return false;
    }
#if PSA_CLUSTER > 1
    if (t == 0) mbar_expect(&bar, PSA_H * nruns * PSA_RUN * sizeof(unsigned int));  // the placing CTAs' runs
#endif
    PSA_EMARK(8);
#endif

    // the estimate of this warp's blocks into `scores` and, as words, into `words`; with PSA_EO_EARLY the warp's
    // rows are requested before the request's length arrives (its load is waited for only where the scores become
    // words): every warp with rows scores them, -inf past n
    auto word = [&](int j, float s) {
        return j < sink_blocks || j >= n - recent_blocks ? 0xFFFFFFFFu : orderable(s);
    };
    const int jw = base + warp * PSA_WARP_RUN, jend = min(jw + PSA_WARP_RUN, Nmax);
    if (jw < (PSA_EO_EARLY ? Nmax : n)) {
        const int h0 = g * PSA_G;
        estimate_tiles(
            q, meta, b, h0, h0 / (Hq / Hkv), Hq, Hkv, Nmax, n, jw, jend, q_scale, lane,
            [&](int j, float s) {
                if (PSA_H == 1) {
                    scores[row + j] = s;
                    words[0][j - base] = word(j, s);
                }
            },
            [&](int h, int j, float est) {
                scores[row + (long)h * Nmax + j] = est;
                words[h][j - base] = word(j, est);
            });
        PSA_EMARK(9);
    } else {
        for (int p = lane; p < PSA_H * PSA_WARP_RUN; p += 32) {
            const int j = jw + p % PSA_WARP_RUN;
            if (j < jend) scores[row + (long)(p / PSA_WARP_RUN) * Nmax + j] = -PSA_INF;
        }
    }
#if PSA_EO_EARLY
    if (mine >= nruns) {
        leave();
        return false;
    }
#if PSA_CLUSTER > 1
    if (t == 0) mbar_expect(&bar, PSA_H * nruns * PSA_RUN * sizeof(unsigned int));  // (pushes may have come)
#endif
    PSA_EMARK(8);
#endif
    __syncthreads();
    PSA_EMARK(2);

    if (warp < PSA_H) {  // warp h sorts order h's run (words past n are 0) and sends it to every placing CTA
        unsigned int k[PSA_RUN_KPL];
#pragma unroll
        for (int r = 0; r < PSA_RUN_KPL; ++r) {
            const int e = lane * PSA_RUN_KPL + r;
            k[r] = base + e < n ? words[warp][e] : 0u;
        }
        warp_sort_desc(k, lane);
        PSA_EMARK(3);
        run_lane_order(k, lane);
#if PSA_CLUSTER > 1
        cluster_wait();  // every CTA's mbarrier initialised
        const float4 lo = make_float4(__uint_as_float(k[0]), __uint_as_float(k[1]), __uint_as_float(k[2]),
                                      __uint_as_float(k[3]));
        const float4 hi = make_float4(__uint_as_float(k[4]), __uint_as_float(k[5]), __uint_as_float(k[6]),
                                      __uint_as_float(k[7]));
        for (int dst = 0; dst < nruns; ++dst) {
            push4(&runs[warp][mine][lane * PSA_RUN_KPL], dst, lo, &bar);
            push4(&runs[warp][mine][lane * PSA_RUN_KPL + 4], dst, hi, &bar);
        }
        PSA_EMARK(4);
#else
        uint4* rrow = reinterpret_cast<uint4*>(&runs[warp][0][lane * PSA_RUN_KPL]);
        rrow[0] = make_uint4(k[0], k[1], k[2], k[3]);
        rrow[1] = make_uint4(k[4], k[5], k[6], k[7]);
#endif
    }
#if PSA_CLUSTER > 1
    else {
        cluster_wait();  // (every thread arrived; each waits once)
    }
    // runs past the request's hold zeros (they count none), as psa_order_runs' warps past n sort zeros
    const int past = (PSA_CLUSTER - nruns) * PSA_RUN;
    for (int e = t; e < PSA_H * past; e += PSA_WARPS * 32)
        runs[e / past][nruns + e % past / PSA_RUN][e % PSA_RUN] = 0u;
    mbar_wait(&bar, 0);
#endif
    __syncthreads();
    PSA_EMARK(5);

    // each of the run's blocks placed in each order: thread t places block u = t % 256 of the run in orders
    // t / 256 + k THREADS / 256 (K of them, the placements' searches in lock-step; orders past H none)
    constexpr int THREADS = PSA_WARPS * 32, K = (PSA_H * PSA_RUN + THREADS - 1) / THREADS;
    const int u = t % PSA_RUN, i = base + u;
    int o[K], rank[K];
#pragma unroll
    for (int k = 0; k < K; ++k) o[k] = min(t / PSA_RUN + k * (THREADS / PSA_RUN), PSA_H - 1);
    const int placed = min(K, (PSA_H - t / PSA_RUN + THREADS / PSA_RUN - 1) / (THREADS / PSA_RUN));  // o[k] < H
    if (i >= run_end || placed <= 0) return true;
    if (i >= n) {  // padding: blocks n .. of the last run take positions n .., one each
#pragma unroll
        for (int k = 0; k < K; ++k)
            if (k < placed) order[row + (long)o[k] * Nmax + i] = -1;
        return true;
    }
    run_ranks<PSA_CLUSTER, K>(&runs[0][0], &words[0][0], u, mine, o, rank);
#pragma unroll
    for (int k = 0; k < K; ++k)
        if (k < placed) order[row + (long)o[k] * Nmax + rank[k]] = i;
    if (PSA_H == 1) on_place(rank[0], i, n);
#if PSA_EO_CLOCK
    if (t == 0) {
        eclk[6] = clock64() - eclk0;
        eclk[7] = 1;
        eclk[1] = globaltimer_ns();
    }
#endif
#if PSA_L2_FIRST
    if (rank[0] < l2_first) l2_ask_block(k_pool, v_pool, slot, tile_bytes);  // (H 1: the one order)
#endif
    return true;
}
