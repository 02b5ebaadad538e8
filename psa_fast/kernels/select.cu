// Stage 2 without a full sort: the head of the processing order, exactly as the full sort would
// give it (psa_ref.rank: forced blocks first, then estimate descending, ties by lower block index).
//
// When only the first K positions of the order are attended (top-k: K = min(k, n)), sorting all n
// blocks is wasted work: the one-CTA bitonic sort of 8192 keys is issue-bound on its SM (~80 us),
// and the sliced sort that spreads it still cost 24 us at 128K, B = 1, against a metadata read of
// 8 us. Here one CTA of 1024 threads per group:
//   1. builds the sort's 64-bit keys (orderable score << 32 | ~block; forced blocks get the
//      largest score word) in registers, KPT_N = PSA_NPAD_N / 1024 a thread;
//   2. takes the forced blocks whole (they are first in the order) and radix-selects the rest of
//      the head among the ranked keys, 8 bits a pass, starting at the highest byte in which the
//      smallest and largest candidate keys differ (estimates of one group usually share their
//      sign and exponent byte: a pass over it would put every key in one bin). Each pass is a
//      256-bin histogram of the keys that match the prefix so far, kept in 8 copies (warp w adds
//      to copy w % 8; a warp whose keys all fall in one bin adds once) so that keys sharing a bin
//      do not serialise on one counter; it stops as soon as a whole bin is taken;
//   3. gathers the K selected keys into shared memory and orders only them: by counting, for each
//      key, the keys above it (K <= PSA_RANK_MAX: K^2 / 1024 comparisons a thread), else by the
//      bitonic sort of sort.cuh;
//   4. writes order[0, K); positions past K are left as they were.
// Memory: reads the group's n scores once (4 n bytes), writes 4 K bytes.
//
//   scores  [B, Gn, Nmax] float (psa_estimate);  seq_lens [B] int
//   order   [B, Gn, Nmax] int out: the first min(head, n) positions
#include "sort.cuh"

#ifndef PSA_NPAD_N
#define PSA_NPAD_N 8192
#endif
#ifndef PSA_SKIP
#define PSA_SKIP 0  // experiments only (benchmarks/exp_select.py): 1 skips the radix select, 2 the ordering
#endif
#define PSA_SEL_THREADS 1024
#define PSA_KPT_N ((PSA_NPAD_N + PSA_SEL_THREADS - 1) / PSA_SEL_THREADS)
#define PSA_RANK_MAX 512   // heads up to this size are ordered by counting, larger ones by the bitonic sort
#define PSA_HCOPIES 8      // copies of the histogram
#define FORCED_HI 0xFFFFFFFFu
static_assert(PSA_SORT_THREADS == PSA_SEL_THREADS, "select.cu sorts with every thread: PSA_NPAD >= 1024");

__device__ __forceinline__ u64 warp_min64(u64 x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) { const u64 y = shfl_xor64(x, o); x = y < x ? y : x; }
    return x;
}
__device__ __forceinline__ u64 warp_max64(u64 x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) { const u64 y = shfl_xor64(x, o); x = y > x ? y : x; }
    return x;
}

extern "C" __global__ void __launch_bounds__(PSA_SEL_THREADS)
psa_order_head(const float* __restrict__ scores, const int* __restrict__ seq_lens, int* __restrict__ order, int Nmax,
               int sink_blocks, int recent_blocks, int head) {
    extern __shared__ u64 buf[];  // PSA_SN keys: the selected keys, then the sort's exchange buffer
    __shared__ unsigned int hist[PSA_HCOPIES][256];
    __shared__ u64 w_min[32], w_max[32];
    __shared__ unsigned int s_bin, s_remaining, s_done, s_count;
    const int b = blockIdx.y, g = blockIdx.x, Gn = gridDim.x;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int n = (seq_lens[b] + PSA_S - 1) / PSA_S;
    const int K = min(n, head);
    const float* srow = scores + ((long)b * Gn + g) * Nmax;

    // 1. keys, strided so that a warp's loads are coalesced; 0 past the end (never selected: K <= n)
    u64 key[PSA_KPT_N];
#pragma unroll
    for (int r = 0; r < PSA_KPT_N; ++r) {
        const int i = r * PSA_SEL_THREADS + tid;
        u64 k = 0ull;
        if (i < n) {
            const bool forced = i < sink_blocks || i >= n - recent_blocks;
            const unsigned int hi = forced ? FORCED_HI : orderable(__ldg(srow + i));
            k = ((u64)hi << 32) | (0xFFFFFFFFu - (unsigned int)i);
        }
        key[r] = k;
    }
    // 2. the candidates: the ranked keys, with the forced ones taken whole, unless the head is shorter
    // than the forced blocks (then it is chosen among them). `need` of the candidates are selected.
    const int n_forced = min(n, sink_blocks + recent_blocks);  // sink and recent ranges, overlapping or not
    const bool among_forced = K < n_forced;
    const int need = among_forced ? K : K - n_forced;
    auto candidate = [&](u64 k) { return k != 0ull && ((unsigned int)(k >> 32) == FORCED_HI) == among_forced; };
    u64 lo = ~0ull, hi = 0ull;
#pragma unroll
    for (int r = 0; r < PSA_KPT_N; ++r)
        if (candidate(key[r])) { lo = key[r] < lo ? key[r] : lo; hi = key[r] > hi ? key[r] : hi; }
    lo = warp_min64(lo);
    hi = warp_max64(hi);
    if (lane == 0) { w_min[warp] = lo; w_max[warp] = hi; }
    __syncthreads();
    if (warp == 0) {
        lo = warp_min64(w_min[lane]);
        hi = warp_max64(w_max[lane]);
        if (lane == 0) {
            s_remaining = (unsigned int)need;
            s_done = need == 0 || lo == hi;
            w_min[0] = lo;
            w_max[0] = hi;
        }
    }
    __syncthreads();
    lo = w_min[0];
    hi = w_max[0];
    // Every candidate shares the bytes above the highest one in which lo and hi differ.
    const int top = lo == hi ? 0 : (63 - __clzll(lo ^ hi)) / 8 * 8;
    u64 mask = top == 56 ? 0ull : ~0ull << (top + 8), prefix = hi & mask;
    if (need > 0 && lo == hi) { mask = ~0ull; prefix = hi; }  // one candidate: it is the one selected

    for (int shift = top; shift >= 0 && !s_done && PSA_SKIP != 1; shift -= 8) {
        for (int e = tid; e < PSA_HCOPIES * 256; e += PSA_SEL_THREADS) (&hist[0][0])[e] = 0u;
        __syncthreads();
#pragma unroll
        for (int r = 0; r < PSA_KPT_N; ++r) {
            const bool in = candidate(key[r]) && (key[r] & mask) == prefix;
            const unsigned int bin = in ? (unsigned int)(key[r] >> shift) & 255u : 256u;
            // The common case of the first passes: the whole warp in one bin adds once.
            const unsigned int bin0 = __shfl_sync(0xffffffffu, bin, 0);
            if (__all_sync(0xffffffffu, bin == bin0)) {
                if (lane == 0 && bin0 < 256u) atomicAdd(&hist[warp % PSA_HCOPIES][bin0], 32u);
            } else if (in) {
                atomicAdd(&hist[warp % PSA_HCOPIES][bin], 1u);
            }
        }
        __syncthreads();
        if (tid < 256) {  // fold the copies into copy 0
            unsigned int t = 0u;
#pragma unroll
            for (int c = 0; c < PSA_HCOPIES; ++c) t += hist[c][tid];
            hist[0][tid] = t;
        }
        __syncthreads();
        if (warp == 0) {
            // lane L holds bins 255 - 8L down to 248 - 8L: lane 0 the largest keys
            unsigned int h[8], sum = 0u;
#pragma unroll
            for (int e = 0; e < 8; ++e) {
                h[e] = hist[0][255 - 8 * lane - e];
                sum += h[e];
            }
            unsigned int above = sum;  // inclusive prefix over lanes, then exclusive
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const unsigned int t = __shfl_up_sync(0xffffffffu, above, o);
                if (lane >= o) above += t;
            }
            above -= sum;
            const unsigned int want = s_remaining;
            __syncwarp();  // every lane has read s_remaining before the one that finds the bin rewrites it
            if (above < want && above + sum >= want) {  // the want-th key lies in this lane's bins
#pragma unroll
                for (int e = 0; e < 8; ++e) {
                    if (above < want && above + h[e] >= want) {
                        s_bin = 255u - 8u * lane - e;
                        s_remaining = want - above;
                        s_done = above + h[e] == want;  // the whole bin is taken: no finer pass needed
                    }
                    above += h[e];
                }
            }
        }
        __syncthreads();
        prefix |= (u64)s_bin << shift;
        mask |= 255ull << shift;
    }

    // 3. gather the selected keys: the forced ones (unless chosen among) and the candidates with
    // (key & mask) >= prefix, exactly `need` of them
    if (tid == 0) s_count = 0u;
    __syncthreads();
#pragma unroll
    for (int r = 0; r < PSA_KPT_N; ++r) {
        const bool forced = key[r] != 0ull && (unsigned int)(key[r] >> 32) == FORCED_HI;
        const bool sel = PSA_SKIP == 1 ? r * PSA_SEL_THREADS + tid < K
                         : (forced && !among_forced) || (need > 0 && candidate(key[r]) && (key[r] & mask) >= prefix);
        const unsigned int ballot = __ballot_sync(0xffffffffu, sel);
        unsigned int base = 0u;
        if (lane == 0 && ballot) base = atomicAdd(&s_count, (unsigned int)__popc(ballot));
        base = __shfl_sync(0xffffffffu, base, 0);
        if (sel) buf[base + __popc(ballot & ((1u << lane) - 1u))] = key[r];
    }
    __syncthreads();
    int* orow = order + ((long)b * Gn + g) * Nmax;
    if (K <= PSA_RANK_MAX) {
        // 4a. rank by counting: K keys, distinct (they carry the block index), read as broadcasts
        if (tid < K) {
            const u64 mine = buf[tid];
            int rank = 0;
            for (int j = 0; j < K; ++j) rank += buf[j] > mine;
            orow[rank] = (int)(0xFFFFFFFFu - (unsigned int)(mine & 0xFFFFFFFFull));
        }
        return;
    }
    u64 k[PSA_KPT];
#pragma unroll
    for (int r = 0; r < PSA_KPT; ++r) {
        const int i = tid * PSA_KPT + r;
        k[r] = i < K ? buf[i] : 0ull;
    }
    __syncthreads();  // buf becomes the sort's exchange buffer
    if (PSA_SKIP != 2) block_sort_desc(k, buf);
#pragma unroll
    for (int r = 0; r < PSA_KPT; ++r) {
        const int i = tid * PSA_KPT + r;
        if (i < K) orow[i] = (int)(0xFFFFFFFFu - (unsigned int)(k[r] & 0xFFFFFFFFull));
    }
}
