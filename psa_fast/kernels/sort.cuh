// Block-wide bitonic sort of 64-bit keys, descending, shared by psa_order and psa_order_slice.
//
// Keys: the high word is the block's score as an orderable integer (0xFFFFFFFF for sink/recent
// blocks, which go first), the low word 0xFFFFFFFF - block, so a descending sort breaks ties by the
// lower block index, exactly like psa_ref.rank; padding keys are 0 and sort last.
//
// PSA_SORT_THREADS threads hold KPT = PSA_SN / threads consecutive keys each in registers. A
// compare-exchange at distance j is done inside a thread for j < KPT, with warp shuffles for
// j < 32 KPT, and through shared memory only above that (15 of the 91 stages at 8192 keys). In
// shared memory, key r of thread t sits at r * threads + t: consecutive threads touch consecutive
// words and so does each partner, so there are no bank conflicts (a blocked layout had 16-way
// conflicts: benchmarks/NOTES.md).
#pragma once
#include "common.cuh"

#ifndef PSA_NPAD
#define PSA_NPAD 8192
#endif
#define PSA_SN (PSA_NPAD < 32 ? 32 : PSA_NPAD)  // keys sorted: at least one full warp
#define PSA_SORT_THREADS (PSA_SN < 1024 ? PSA_SN : 1024)
#define PSA_KPT (PSA_SN / PSA_SORT_THREADS)

typedef unsigned long long u64;

// Keep the larger of (mine, other) when `keep_max`, else the smaller.
__device__ __forceinline__ u64 pick(u64 mine, u64 other, bool keep_max) {
    return (keep_max ? (other > mine) : (other < mine)) ? other : mine;
}

__device__ __forceinline__ u64 shfl_xor64(u64 x, int lane_mask) {
    const unsigned int lo = __shfl_xor_sync(0xffffffffu, (unsigned int)x, lane_mask);
    const unsigned int hi = __shfl_xor_sync(0xffffffffu, (unsigned int)(x >> 32), lane_mask);
    return ((u64)hi << 32) | lo;
}

// This thread's KPT keys for blocks first + tid * KPT + r of a group with n blocks. Every score below `nmax` is
// requested before `n` (which waits on the request's length) decides which are keys, so the length's round trip is
// not before the scores' (psa_order_slice 4.0 -> 3.7 µs at Llama's 32K, one request, H100; benchmarks/NOTES.md, s38i).
__device__ __forceinline__ void load_keys(u64 (&k)[PSA_KPT], const float* __restrict__ srow, int n, int nmax,
                                          int first, int sink_blocks, int recent_blocks) {
#pragma unroll
    for (int r = 0; r < PSA_KPT; ++r) {
        const int i = first + threadIdx.x * PSA_KPT + r;
        const float x = i < nmax ? __ldg(srow + i) : 0.f;
        u64 key = 0ull;
        if (i < n) {
            const bool forced = i < sink_blocks || i >= n - recent_blocks;
            const unsigned int hi = forced ? 0xFFFFFFFFu : orderable(x);
            key = ((u64)hi << 32) | (0xFFFFFFFFu - (unsigned int)i);
        }
        k[r] = key;
    }
}

// Sort k (this thread's KPT keys; together the block's PSA_SN keys in blocked order) descending.
// keys: PSA_SN words of shared memory.
__device__ __forceinline__ void block_sort_desc(u64 (&k)[PSA_KPT], u64* keys) {
    const int tid = threadIdx.x;
    // Bitonic network, descending overall: element e of the merge of size `kk` keeps the max of
    // the pair (e, e ^ j) when it is the lower index in a descending run or the upper in an ascending one.
    for (int kk = 2; kk <= PSA_SN; kk <<= 1) {
        for (int j = kk >> 1; j > 0; j >>= 1) {
            if (j < PSA_KPT) {
#pragma unroll
                for (int jj = 1; jj < PSA_KPT; jj <<= 1) {  // j as a compile-time constant: k stays in registers
                    if (jj != j) continue;
#pragma unroll
                    for (int r = 0; r < PSA_KPT; ++r) {
                        const int rp = r ^ jj;
                        if (rp > r) {
                            const int e = tid * PSA_KPT + r;
                            const bool desc = (e & kk) == 0;
                            const u64 a = k[r], c = k[rp];
                            const bool swap = desc ? (a < c) : (a > c);
                            k[r] = swap ? c : a;
                            k[rp] = swap ? a : c;
                        }
                    }
                }
            } else if (j < 32 * PSA_KPT) {
                const int lane_mask = j / PSA_KPT;
#pragma unroll
                for (int r = 0; r < PSA_KPT; ++r) {
                    const int e = tid * PSA_KPT + r;
                    const bool desc = (e & kk) == 0, lower = (e & j) == 0;
                    k[r] = pick(k[r], shfl_xor64(k[r], lane_mask), desc == lower);
                }
            } else {
                const int partner = tid ^ (j / PSA_KPT);
#pragma unroll
                for (int r = 0; r < PSA_KPT; ++r) keys[r * PSA_SORT_THREADS + tid] = k[r];
                __syncthreads();
#pragma unroll
                for (int r = 0; r < PSA_KPT; ++r) {
                    const int e = tid * PSA_KPT + r;
                    const bool desc = (e & kk) == 0, lower = (e & j) == 0;
                    k[r] = pick(k[r], keys[r * PSA_SORT_THREADS + partner], desc == lower);
                }
                __syncthreads();
            }
        }
    }

}
