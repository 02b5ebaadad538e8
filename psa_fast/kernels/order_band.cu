// Stage 2b on the GPU for one request or a few of long caches: every block's position counted as in
// order_rank.cu, but only against the blocks of its own band of keys, so a group of n blocks costs about
// n * (n / PSA_BANDS) comparisons instead of n^2.
//
// The order is the one every order kernel gives (forced blocks first, then scores descending, ties by the
// lower block index). Here a block is one unique 64-bit key, key_j = orderable(s_j) << 32 | ~j (0xFFFFFFFF
// for a forced block's word), and position_j = #{i : key_i > key_j}.
//
//  1. psa_order_band (one CTA a group): the keys in shared memory; PSA_BAND_SAMPLES of them, evenly spaced by
//     index, ranked among themselves (four threads counting each one's rank); every (samples / PSA_BANDS)-th of the ranked samples is a splitter, and
//     band(k) = how many splitters exceed k (band 0 holds the largest keys). The keys are written to the
//     workspace grouped by band (in any order inside a band) with each band's first slot (`bounds`).
//  2. psa_order_band_rank (many CTAs a group): a warp owns 32 consecutive slots of the grouped keys, so its
//     keys lie in bands kf .. kl. Every key of a band above kf precedes all of them and lies before
//     bounds[kf]; every key of a band below kl follows them all. So a key's position is lo plus the number of
//     keys in slots lo .. hi - 1 that are >= it, less one (itself), where [lo, hi) is bands kf .. kl's slots
//     (lo rounded down, hi up to even slots for 16-byte loads: the slots added belong to higher bands, counted
//     as they should be, or lower ones, never counted; slots past n read as key 0, below every key).
//
//   scores    [B, Gn, Nmax] float (psa_estimate);  seq_lens [B] int
//   workspace uint64: [B, Gn, Npad] keys, then [B, Gn, PSA_BANDS + 1] int bounds (_kernels.order_workspace_shape)
//   order     [B, Gn, Nmax] int out: block indices in processing order; -1 past the group's n blocks
// Launch: psa_order_band grid (Gn, B), PSA_BAND_THREADS threads, Npad * 9 bytes of dynamic shared memory;
// psa_order_band_rank grid (ceil(Nmax / (32 PSA_WARPS)), Gn, B), PSA_WARPS * 32 threads, Npad * 8 bytes.
#include "common.cuh"

#ifndef PSA_BANDS
#define PSA_BANDS 32  // bands a group's keys are split into (a power of two)
#endif
#ifndef PSA_BAND_SAMPLES
#define PSA_BAND_SAMPLES 256  // keys ranked to pick the splitters (8 a band), PSA_BAND_THREADS / 4 ...
#endif
#ifndef PSA_BAND_THREADS
#define PSA_BAND_THREADS 1024  // ... so that four threads count each sample's rank
#endif

typedef unsigned long long u64;

__device__ __forceinline__ int band_of(const u64 k, const u64* __restrict__ split) {
    // split[1] >= split[2] >= ... >= split[PSA_BANDS - 1]; the count of those > k, by bisection
    int lo = 0;  // split[1 .. lo] > k
#pragma unroll
    for (int step = PSA_BANDS / 2; step >= 1; step >>= 1)
        if (lo + step < PSA_BANDS && split[lo + step] > k) lo += step;
    return lo;
}

__device__ __forceinline__ int* band_bounds(u64* ws, int Npad, int b, int g, int Gn, int B) {
    return reinterpret_cast<int*>(ws + (long)B * Gn * Npad) + ((long)b * Gn + g) * (PSA_BANDS + 1);
}

extern "C" __global__ void __launch_bounds__(PSA_BAND_THREADS)
psa_order_band(const float* __restrict__ scores, const int* __restrict__ seq_lens, u64* __restrict__ ws, int Nmax,
               int Npad, int sink_blocks, int recent_blocks) {
    extern __shared__ u64 keys[];  // Npad keys, then Npad bytes: each key's band
    __shared__ u64 sample[PSA_BAND_SAMPLES], split[PSA_BANDS];
    __shared__ int count[PSA_BANDS];
    constexpr int PARTS = PSA_BAND_THREADS / PSA_BAND_SAMPLES;  // threads ranking one sample, a power of two
    static_assert(PSA_BANDS == 32 && PARTS >= 1 && (PARTS & (PARTS - 1)) == 0, "one warp scans the bands");
    unsigned char* band = reinterpret_cast<unsigned char*>(keys + Npad);
    const int g = blockIdx.x, b = blockIdx.y, Gn = gridDim.x;
    const int lane = threadIdx.x & 31;
    const int n = min((seq_lens[b] + PSA_S - 1) / PSA_S, Nmax);
    const float* srow = scores + ((long)b * Gn + g) * Nmax;
    u64* row = ws + ((long)b * Gn + g) * Npad;
    int* bounds = band_bounds(ws, Npad, b, g, Gn, gridDim.y);
    for (int j = threadIdx.x; j < n; j += PSA_BAND_THREADS) {
        const unsigned int w = (j < sink_blocks || j >= n - recent_blocks) ? 0xFFFFFFFFu : orderable(srow[j]);
        keys[j] = (u64)w << 32 | (unsigned int)~j;
    }
    if (threadIdx.x < PSA_BANDS) count[threadIdx.x] = 0;
    const int m = min(n, PSA_BAND_SAMPLES);
    __syncthreads();
    for (int t = threadIdx.x; t < m; t += PSA_BAND_THREADS) sample[t] = keys[(long)t * n / m];
    __syncthreads();
    {  // sample t's rank among the samples, counted by PARTS neighbouring lanes (samples part, part + PARTS, ...)
        const int t = threadIdx.x / PARTS, part = threadIdx.x % PARTS;
        const u64 x = t < m ? sample[t] : 0ull;
        int r[4] = {0, 0, 0, 0};
        int i = part;
#pragma unroll 1
        for (; i + 3 * PARTS < m; i += 4 * PARTS) {  // four independent loads in flight
            r[0] += sample[i] > x;
            r[1] += sample[i + PARTS] > x;
            r[2] += sample[i + 2 * PARTS] > x;
            r[3] += sample[i + 3 * PARTS] > x;
        }
        for (; i < m; i += PARTS) r[0] += sample[i] > x;
        int rank = r[0] + r[1] + r[2] + r[3];
#pragma unroll
        for (int o = 1; o < PARTS; o <<= 1) rank += __shfl_xor_sync(0xffffffffu, rank, o);
        __syncthreads();  // every sample read before any is moved
        if (t < m && part == 0) sample[rank] = x;  // ranks are distinct: the samples' keys are
    }
    __syncthreads();
    if (threadIdx.x < PSA_BANDS)  // split[k] = the ranked sample k m / BANDS (split[0] is never read)
        split[threadIdx.x] = m ? sample[threadIdx.x * m / PSA_BANDS] : 0ull;
    __syncthreads();
    for (int j = threadIdx.x; j < n; j += PSA_BAND_THREADS) {
        const int k = band_of(keys[j], split);
        band[j] = (unsigned char)k;
        atomicAdd(&count[k], 1);
    }
    __syncthreads();
    if (threadIdx.x < 32) {  // the bands' first slots: an exclusive scan of the counts over one warp
        const int c = count[lane];
        int incl = c;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int v = __shfl_up_sync(0xffffffffu, incl, o);
            if (lane >= o) incl += v;
        }
        count[lane] = incl - c;
        bounds[lane] = incl - c;
        if (lane == 31) bounds[PSA_BANDS] = incl;
    }
    __syncthreads();
    for (int j = threadIdx.x; j < n; j += PSA_BAND_THREADS) row[atomicAdd(&count[band[j]], 1)] = keys[j];
}

// c += how many of v's two keys are >= x
__device__ __forceinline__ void count2(int& c, const ulonglong2 v, const u64 x) { c += (v.x >= x) + (v.y >= x); }

__device__ __forceinline__ int slot_band(const int* __restrict__ bounds, int e) {
    // the band whose slots hold e: the largest k with bounds[k] <= e (empty bands skipped by the search)
    int lo = 0;
#pragma unroll
    for (int step = PSA_BANDS / 2; step >= 1; step >>= 1)
        if (bounds[lo + step] <= e) lo += step;
    return lo;
}

extern "C" __global__ void __launch_bounds__(PSA_WARPS * 32)
psa_order_band_rank(const int* __restrict__ seq_lens, const u64* __restrict__ ws, int* __restrict__ order, int Nmax,
                    int Npad) {
    extern __shared__ __align__(16) u64 range[];  // the CTA's slots lo .. hi - 1
    __shared__ int bounds[PSA_BANDS + 1];
    const int b = blockIdx.z, g = blockIdx.y, Gn = gridDim.y;
    const int warp = threadIdx.x >> 5;
    const int n = min((seq_lens[b] + PSA_S - 1) / PSA_S, Nmax);
    const int e0 = blockIdx.x * PSA_WARPS * 32, e = e0 + threadIdx.x;  // the CTA's first slot, this thread's
    int* orow = order + ((long)b * Gn + g) * Nmax;
    if (e0 >= n) {
        if (e < Nmax) orow[e] = -1;
        return;
    }
    const u64* row = ws + ((long)b * Gn + g) * Npad;
    if (threadIdx.x <= PSA_BANDS) bounds[threadIdx.x] = band_bounds(const_cast<u64*>(ws), Npad, b, g, Gn,
                                                                    gridDim.z)[threadIdx.x];
    __syncthreads();
    const int lo = bounds[slot_band(bounds, e0)] & ~1;
    const int hi = (bounds[slot_band(bounds, min(e0 + PSA_WARPS * 32, n) - 1) + 1] + 1) & ~1;
    for (int i = lo + threadIdx.x; i < hi; i += PSA_WARPS * 32) range[i - lo] = i < n ? row[i] : 0ull;
    __syncthreads();
    const int w0 = e0 + warp * 32;  // this warp's first slot
    if (w0 >= n) {
        if (e < Nmax) orow[e] = -1;
        return;
    }
    const int wlo = bounds[slot_band(bounds, w0)] & ~1;
    const int whi = (bounds[slot_band(bounds, min(w0 + 32, n) - 1) + 1] + 1) & ~1;
    const u64 x = e < n ? range[e - lo] : ~0ull;
    const ulonglong2* v = reinterpret_cast<const ulonglong2*>(range + (wlo - lo));
    int c[4] = {0, 0, 0, 0};
    const int pairs = (whi - wlo) >> 1;
    int p = 0;
#pragma unroll 1
    for (; p + 3 < pairs; p += 4) {  // the same address for the whole warp: a broadcast; four loads in flight
        count2(c[0], v[p], x);
        count2(c[1], v[p + 1], x);
        count2(c[2], v[p + 2], x);
        count2(c[3], v[p + 3], x);
    }
    for (; p < pairs; ++p) count2(c[0], v[p], x);
    if (e < n) orow[wlo + c[0] + c[1] + c[2] + c[3] - 1] = (int)~(unsigned int)x;
    else if (e < Nmax) orow[e] = -1;
}
