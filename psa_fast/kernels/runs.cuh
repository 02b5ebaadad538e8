// psa_order_runs' sort of a warp's run of 256 words, its binary searches in sorted runs and a block's rank from them
// (order_runs.cu's header comment describes the method), shared with psa_estimate_order (estimate_order.cu).
#pragma once
#include "common.cuh"

#define PSA_RUN 256                // words a run (a warp's)
#define PSA_RUN_KPL (PSA_RUN / 32)  // words a lane, consecutive: word r of lane l is the run's word 8 l + r
#ifndef PSA_RUN_SWIZZLE
#define PSA_RUN_SWIZZLE 0
#endif

// Where a sorted run's row in shared memory holds its word e. The binary searches of a warp's 32 blocks in one run
// diverge to addresses 32, 64 or 128 words apart, all in one bank: 4.7 shared-memory wavefronts a search load on
// random words (CPU model, NOTES s74). PSA_RUN_SWIZZLE 1 XORs word e's low three bits with its 32-word row (e / 32):
// 1.34 wavefronts, every lane's 8 words still one aligned group of 8 (run_lane_order puts them in that order).
__device__ __forceinline__ int run_slot(int e) { return PSA_RUN_SWIZZLE ? e ^ ((e >> 5) & 7) : e; }

// This lane's sorted words k (word r is the run's word e = 8 lane + r) in the order its row's slots 8 lane .. 8 lane
// + 7 hold them (run_slot): k[j] becomes word j ^ (lane / 4), by three conditional swaps. Nothing without the swizzle.
__device__ __forceinline__ void run_lane_order(unsigned int (&k)[PSA_RUN_KPL], int lane) {
#if PSA_RUN_SWIZZLE
    const int x = (lane >> 2) & 7;
#pragma unroll
    for (int bit = 4; bit > 0; bit >>= 1) {
        const bool flip = (x & bit) != 0;
#pragma unroll
        for (int j = 0; j < PSA_RUN_KPL; ++j)
            if ((j & bit) == 0) {
                const unsigned int a = k[j], c = k[j | bit];
                k[j] = flip ? c : a;
                k[j | bit] = flip ? a : c;
            }
    }
#endif
}

// Sort the warp's 256 words (k: this lane's 8, blocked: word r of lane l is the run's e = 8 l + r) descending by the
// "flip" form of the bitonic network: merging two sorted halves of size kk / 2 compares e with e ^ (kk - 1) (the second
// half read backwards), then e with e ^ j for j = kk / 4 .. 1, and every compare-exchange keeps the larger word at the
// lower e. No stage has a direction to choose: distances below 8 are a min and a max within a lane, the others a
// shuffle with lane ^ (distance / 8) (the flip also reading the partner's slot 7 - r) and a min or a max.
__device__ __forceinline__ void warp_sort_desc(unsigned int (&k)[PSA_RUN_KPL], int lane) {
#pragma unroll
    for (int kk = 2; kk <= PSA_RUN; kk <<= 1) {
#pragma unroll
        for (int j = kk >> 1; j > 0; j >>= 1) {
            const int dist = j == kk >> 1 ? kk - 1 : j;  // the partner is e ^ dist
            if (dist < PSA_RUN_KPL) {
#pragma unroll
                for (int r = 0; r < PSA_RUN_KPL; ++r) {
                    const int rp = r ^ dist;
                    if (rp > r) {
                        const unsigned int a = k[r], c = k[rp];
                        k[r] = max(a, c);
                        k[rp] = min(a, c);
                    }
                }
            } else {
                const int lane_mask = dist / PSA_RUN_KPL, slot_mask = dist % PSA_RUN_KPL;  // slot_mask 7 or 0
                const bool lower = (lane & (j / PSA_RUN_KPL)) == 0;  // the pair's lower e: its highest differing bit
                unsigned int other[PSA_RUN_KPL];
#pragma unroll
                for (int r = 0; r < PSA_RUN_KPL; ++r)
                    other[r] = __shfl_xor_sync(0xffffffffu, k[r ^ slot_mask], lane_mask);
#pragma unroll
                for (int r = 0; r < PSA_RUN_KPL; ++r) k[r] = lower ? max(k[r], other[r]) : min(k[r], other[r]);
            }
        }
    }
}

// How many words of run which[q] of `runs` (each sorted descending, word e in slot run_slot(e)) are above thr[q], the
// Q searches in lock-step (Q independent shared-memory loads a round): binary lifting over the first 255 positions,
// then one probe for the 256th (as psa_order_merge counts).
template <int Q>
__device__ __forceinline__ void count_above(const unsigned int (*runs)[PSA_RUN], const int (&which)[Q],
                                            const unsigned int (&thr)[Q], int (&c)[Q]) {
#pragma unroll
    for (int q = 0; q < Q; ++q) c[q] = 0;
#pragma unroll
    for (int half = PSA_RUN / 2; half > 0; half >>= 1)
#pragma unroll
        for (int q = 0; q < Q; ++q) {
            const int at = c[q] + half;
            c[q] = runs[which[q]][run_slot(at - 1)] > thr[q] ? at : c[q];
        }
#pragma unroll
    for (int q = 0; q < Q; ++q) c[q] += runs[which[q]][run_slot(c[q])] > thr[q];
}

// The positions of block t of run `mine` in K orders at once, order o[k]'s R runs (each sorted descending) at
// runs[o[k] R ..] and its run `mine` by block index at words[o[k] PSA_RUN ..]: for each order, the block's word w
// counted in every run (run `mine` twice: the words above w and above w - 1, from there on the equal ones; runs
// before `mine` count above w - 1 too, their equal words having lower block indices; runs past the group's hold only
// zeros and count none), the K (R + 1) searches of one count_above in lock-step.
template <int R, int K>
__device__ __forceinline__ void run_ranks(const unsigned int (*runs)[PSA_RUN], const unsigned int* words, int t,
                                          int mine, const int (&o)[K], int (&rank)[K]) {
    constexpr int Q = R + 1;  // searches an order
    unsigned int w[K], thr[K * Q];
    int which[K * Q], c[K * Q];
#pragma unroll
    for (int k = 0; k < K; ++k) {
        w[k] = words[o[k] * PSA_RUN + t];
#pragma unroll
        for (int r = 0; r < R; ++r) {
            which[k * Q + r] = o[k] * R + r;
            thr[k * Q + r] = r < mine ? w[k] - 1u : w[k];
        }
        which[k * Q + R] = o[k] * R + mine;
        thr[k * Q + R] = w[k] - 1u;
    }
    count_above(runs, which, thr, c);
#pragma unroll
    for (int k = 0; k < K; ++k) {
        int above = 0;
        rank[k] = 0;
#pragma unroll
        for (int r = 0; r < R; ++r) {
            rank[k] += r < mine && w[k] == 0u ? PSA_RUN : c[k * Q + r];  // (w - 1 wrapped: all of the run)
            above = r == mine ? c[k * Q + r] : above;
        }
        const int from = w[k] == 0u ? PSA_RUN : c[k * Q + R];
        if (from - above > 1)  // another block of this run has the word: those of lower index come first
            for (int u = 0; u < t; ++u) rank[k] += words[o[k] * PSA_RUN + u] == w[k];
    }
}

// The position in the group's order of word w, the t-th of run `mine` (its words by block index in `words`), among
// R runs each sorted descending: run_ranks for one order.
template <int R>
__device__ __forceinline__ int run_rank(const unsigned int (*runs)[PSA_RUN], const unsigned int* words, int t,
                                        int mine) {
    const int o[1] = {0};
    int rank[1];
    run_ranks<R, 1>(runs, words, t, mine, o, rank);
    return rank[0];
}
