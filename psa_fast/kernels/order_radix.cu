// Stage 2b on the GPU for long orders: one CTA a group sorts the group's keys by an LSD radix sort in
// shared memory, four passes of 8 bits over the 32-bit score word.
//
// The order is the one the other order kernels give (forced blocks first, then scores descending, ties by
// the lower block index): the keys start in block order, every pass is stable, and a pass orders by the
// complement of its digit, so after the last one equal words keep the block order. The bitonic sort of one
// CTA (order.cu) does ~91 compare-exchange stages of 8,192 keys and is issue-bound at ~79 µs; slices + merge
// (order_slice.cu, order_merge.cu) spread a group over many CTAs but cost 68 µs at 128K, B = 8. Here a pass is
// a few dozen instructions a key: 27 µs for a group of 8,192 on the H200, two groups an SM twice that
// (benchmarks/NOTES.md; ~11 µs was predicted, the rest not profiled yet).
//
// Warp w holds positions [w SPAN, (w + 1) SPAN) of the pass's input, SPAN = 32 K (K keys a lane), lane l the
// positions w SPAN + 32 j + l (j = 0 .. K - 1), so a warp's keys in (j, lane) order are in position order.
// A pass: (1) each key's rank among the warp's earlier keys of its digit: the lanes of one digit find each
// other by 8 ballots (one a digit bit), the lowest of them adds their number to the warp's count of the digit
// in shared memory; (2) the counts, digit-major ([digit][warp]), become their exclusive prefix sums (every
// thread sums 8 consecutive counts, then a block scan); (3) each key goes to its digit's and warp's offset plus
// its rank; (4) every lane reads back its positions. Padding keys (past n) are 0 and sort last; a -NaN
// score's word is 0 too, and the stable passes keep it before the padding. The counters are padded a word a
// digit: unpadded, a warp's 32 counters of different digits all sat in bank `warp` (2x slower overall).
//
//   scores   [B, Gn, Nmax] float (psa_estimate);  seq_lens [B] int
//   order    [B, Gn, Nmax] int out: block indices in processing order; -1 past the group's n blocks
// Launch: grid (Gn, B), PSA_RT threads (min(1024, PSA_NPAD)), PSA_NPAD * 8 + 1024 * (PSA_RW + 1) bytes of
// dynamic shared memory (PSA_RW = PSA_RT / 32 warps).
#include "common.cuh"

#ifndef PSA_NPAD
#define PSA_NPAD 8192
#endif
#define PSA_RN (PSA_NPAD < 32 ? 32 : PSA_NPAD)    // keys sorted: at least one warp's
#define PSA_RT (PSA_RN < 1024 ? PSA_RN : 1024)    // threads
#define PSA_RW (PSA_RT / 32)                      // warps
#define PSA_RK (PSA_RN / PSA_RT)                  // keys a lane
#define PSA_RSPAN (PSA_RK * 32)                   // positions a warp
static_assert(PSA_RN % PSA_RT == 0, "PSA_NPAD is a power of two");
static_assert(256 * PSA_RW == 8 * PSA_RT, "the scan gives every thread 8 counts");

typedef unsigned long long u64;

// Exclusive prefix sum of v over the CTA (threads in order); `warp_sums` holds PSA_RW words.
__device__ __forceinline__ unsigned int block_exclusive_scan(unsigned int v, unsigned int* warp_sums) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    unsigned int inc = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const unsigned int t = __shfl_up_sync(0xffffffffu, inc, o);
        if (lane >= o) inc += t;
    }
    if (lane == 31) warp_sums[warp] = inc;
    __syncthreads();
    if (warp == 0) {
        unsigned int s = lane < PSA_RW ? warp_sums[lane] : 0u, sinc = s;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const unsigned int t = __shfl_up_sync(0xffffffffu, sinc, o);
            if (lane >= o) sinc += t;
        }
        if (lane < PSA_RW) warp_sums[lane] = sinc - s;  // exclusive, per warp
    }
    __syncthreads();
    return warp_sums[warp] + inc - v;
}

extern "C" __global__ void __launch_bounds__(PSA_RT)
psa_order_radix(const float* __restrict__ scores, const int* __restrict__ seq_lens, int* __restrict__ order,
                int Nmax, int sink_blocks, int recent_blocks) {
    extern __shared__ __align__(16) unsigned char smem[];
    u64* buf = reinterpret_cast<u64*>(smem);                                // PSA_RN keys, by position
    // [256][PSA_RW + 1] counts, then offsets: digit-major, each digit's row padded by a word, so that a warp's
    // counters of different digits fall in different banks
    unsigned int* cnt = reinterpret_cast<unsigned int*>(buf + PSA_RN);
    __shared__ unsigned int warp_sums[32];
    const int b = blockIdx.y, g = blockIdx.x, Gn = gridDim.x;
    const int n = (seq_lens[b] + PSA_S - 1) / PSA_S;
    const float* srow = scores + ((long)b * Gn + g) * Nmax;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const unsigned int below = (1u << lane) - 1u;  // the lanes before this one

    // key = score word << 32 | block; the word 0xFFFFFFFF for sink and recent blocks, 0 past n
    u64 k[PSA_RK];
#pragma unroll
    for (int j = 0; j < PSA_RK; ++j) {
        const int i = warp * PSA_RSPAN + j * 32 + lane;
        unsigned int w = 0u;
        // (the score requested before the length arrives: the same key; see sort.cuh's load_keys)
        const float x = i < Nmax ? __ldg(srow + i) : 0.f;
        if (i < n) w = (i < sink_blocks || i >= n - recent_blocks) ? 0xFFFFFFFFu : orderable(x);
        k[j] = ((u64)w << 32) | (unsigned int)i;
    }

#pragma unroll 1
    for (int shift = 32; shift < 64; shift += 8) {
        for (int e = threadIdx.x; e < 256 * (PSA_RW + 1); e += PSA_RT) cnt[e] = 0u;
        __syncthreads();
        // (1) ranks within the warp, in position order
        unsigned int dig[PSA_RK], rk[PSA_RK];
#pragma unroll
        for (int j = 0; j < PSA_RK; ++j) {
            dig[j] = 255u - ((unsigned int)(k[j] >> shift) & 255u);  // ascending digit = descending word
            // the lanes with this digit: 8 ballots (match.any measured ~1.4 µs an iteration of the CTA's warps)
            unsigned int peers = 0xffffffffu;
#pragma unroll
            for (int bit = 0; bit < 8; ++bit) {
                const bool set = (dig[j] >> bit) & 1u;
                const unsigned int v = __ballot_sync(0xffffffffu, set);
                peers &= set ? v : ~v;
            }
            unsigned int* c = cnt + dig[j] * (PSA_RW + 1) + warp;
            const unsigned int before = *c;
            rk[j] = before + __popc(peers & below);
            __syncwarp();
            if ((peers & below) == 0u) *c = before + __popc(peers);  // the digit's lowest lane
            __syncwarp();
        }
        __syncthreads();
        // (2) counts -> offsets, digit-major: thread t owns entries 8t .. 8t + 7 (digit e / RW, warp e % RW)
        {
            unsigned int c[8], sum = 0u;
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                const int e = 8 * threadIdx.x + i;
                c[i] = cnt[e / PSA_RW * (PSA_RW + 1) + e % PSA_RW];
                sum += c[i];
            }
            unsigned int run = block_exclusive_scan(sum, warp_sums);
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                const int e = 8 * threadIdx.x + i;
                cnt[e / PSA_RW * (PSA_RW + 1) + e % PSA_RW] = run;
                run += c[i];
            }
        }
        __syncthreads();
        // (3) every key to its place; (4) every lane reads its positions back
#pragma unroll
        for (int j = 0; j < PSA_RK; ++j) buf[cnt[dig[j] * (PSA_RW + 1) + warp] + rk[j]] = k[j];
        __syncthreads();
#pragma unroll
        for (int j = 0; j < PSA_RK; ++j) k[j] = buf[warp * PSA_RSPAN + j * 32 + lane];
    }

    int* orow = order + ((long)b * Gn + g) * Nmax;
#pragma unroll
    for (int j = 0; j < PSA_RK; ++j) {
        const int p = warp * PSA_RSPAN + j * 32 + lane;
        if (p < Nmax) orow[p] = p < n ? (int)(unsigned int)k[j] : -1;
    }
}
