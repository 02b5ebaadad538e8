// Stage 2c on the GPU (stop = certified, sketch): per query head, the suffix log-sum-exp of
// x_i = vals[order[i]] + log n_j along the processing order, which the verifier reads as the
// unseen mass at a chunk boundary (certified: the min/max bounds; sketch: the sketch masses).
//
// One CTA per (request, query head), so every head of a small batch runs at once (the sort that
// used to compute it ran its group's heads one after another inside one CTA: 15 µs of the 37 µs
// the order took at 32K, B = 1). Each thread owns a contiguous run of the order; the runs' totals
// are combined by a suffix scan of warp shuffles, then every thread rewalks its run.
//
// PSA_SUFFIX_TILED (forty-second session; _kernels.SUFFIX_TILED_MIN_BLOCKS picks it, from 4,096 blocks): the
// order is taken in tiles of PSA_SUFFIX_RUN entries a thread, last tile first. A tile's x_i are gathered
// with coalesced loads of the order (each x computed once, where the plain build computes it on both
// walks) into shared memory, written to `ordered` and, after the walks, to `log_suffix` from there,
// coalesced; a running total carries the later tiles' mass.
// The plain build's loads and stores stride a thread's run (8 entries at 128K, so a warp's access
// touches 32 sectors): ncu on the H100 at Llama 128K, B = 1 (20.7 µs, 32 CTAs of 1024 threads) found
// 38.7 cycles an issued instruction, long-scoreboard 13.2 and LG-throttle 12.4 of them, DRAM 1.9%.
// The tiled build's first version (terms gathered one entry after another, 1,024 threads at any size) took
// 19.7 -> 9.5 µs there, 53 -> 19.5 at B = 8, but 4.4 -> 5.6 at 32K (2,048 blocks: 3/4 of its threads idle);
// now every block is loaded before any value, and the launch gives a thread PSA_SUFFIX_RUN blocks.
//
//   order      [B, Hq / PSA_G, Nmax] int (psa_order)
//   vals       [B, Hq, Nmax] float: per-head value of every block
//   log_suffix [B, Hq, Nmax + 1] float out: log sum_{i' >= i} n_j exp(vals_j), j = order[i'], i' < N_b;
//              -inf from i = N_b on
//   ordered    [B, Hq, Nmax] float out or null: x_i itself at i < N_b (the sketch rules' window sums read it
//              by position, psa_decode / psa_spec_verify, instead of order[i] then vals[j])
#include "common.cuh"

#define PSA_SUFFIX_THREADS 1024
#ifndef PSA_SUFFIX_TILED
#define PSA_SUFFIX_TILED 0
#endif
#define PSA_SUFFIX_RUN 8  // the tiled build's entries a thread a tile (two float4 of shared memory)

__device__ __forceinline__ float2 shfl_down2(float2 v, int off) {
    return make_float2(__shfl_down_sync(0xffffffffu, v.x, off), __shfl_down_sync(0xffffffffu, v.y, off));
}

// Inclusive suffix scan over the lanes of a warp: lane l gets the merge of lanes l .. 31.
__device__ __forceinline__ float2 warp_suffix(float2 v, int lane) {
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
        const float2 o = shfl_down2(v, off);
        if (lane + off < 32) v = lse_merge(v, o);
    }
    return v;
}

// Given `incl` (this lane's inclusive warp_suffix), everything after this thread in the CTA: the later lanes of its
// warp, then the later warps (two CTA barriers; `warp_total` holds a float2 a warp). `total`, if not null, gets the
// CTA's whole merge, in every thread.
__device__ __forceinline__ float2 cta_after(float2 incl, int lane, int warp, int nwarps, float2* warp_total,
                                            float2* total) {
    if (lane == 0) warp_total[warp] = incl;
    __syncthreads();
    if (warp == 0) {
        float2 w = lane < nwarps ? warp_total[lane] : make_float2(-PSA_INF, 0.f);
        w = warp_suffix(w, lane);
        __syncwarp();
        if (lane < nwarps) warp_total[lane] = w;  // now: merge of warps lane .. nwarps - 1
    }
    __syncthreads();
    float2 after = shfl_down2(incl, 1);
    if (lane == 31) after = make_float2(-PSA_INF, 0.f);
    if (warp + 1 < nwarps) after = lse_merge(after, warp_total[warp + 1]);
    if (total) *total = warp_total[0];
    return after;
}

extern "C" __global__ void __launch_bounds__(PSA_SUFFIX_THREADS)
psa_order_suffix(const int* __restrict__ order, const int* __restrict__ seq_lens, const float* __restrict__ vals,
                 float* __restrict__ log_suffix, int Hq, int Nmax, float* __restrict__ ordered) {
    __shared__ float2 warp_total[32];
    const int h = blockIdx.x, b = blockIdx.y;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nwarps = blockDim.x >> 5;
    const int len = seq_lens[b];
    const int n = (len + PSA_S - 1) / PSA_S;
    const int* orow = order + ((long)b * (Hq / PSA_G) + h / PSA_G) * Nmax;
    const float* v = vals + ((long)b * Hq + h) * Nmax;
    float* ls = log_suffix + ((long)b * Hq + h) * (Nmax + 1);
    float* xs = ordered ? ordered + ((long)b * Hq + h) * Nmax : nullptr;

#if PSA_SUFFIX_TILED
    __shared__ float4 tile_x[PSA_SUFFIX_THREADS * PSA_SUFFIX_RUN / 4];  // x, then the suffix, by position
    float* sx = reinterpret_cast<float*>(tile_x);
    const int tile = PSA_SUFFIX_RUN * blockDim.x;
    float2 carry = make_float2(-PSA_INF, 0.f);  // the mass of the tiles after this one
    for (int base = (n - 1) / tile * tile; base >= 0; base -= tile) {
        // entry base + k * blockDim.x + tid: its block (coalesced), then every block's value at once
        int jk[PSA_SUFFIX_RUN];
        float vk[PSA_SUFFIX_RUN];
#pragma unroll
        for (int k = 0; k < PSA_SUFFIX_RUN; ++k) {
            const int i = base + k * blockDim.x + tid;
            jk[k] = i < n ? __ldg(orow + i) : -1;
        }
#pragma unroll
        for (int k = 0; k < PSA_SUFFIX_RUN; ++k) vk[k] = jk[k] >= 0 ? __ldg(v + jk[k]) : 0.f;
#pragma unroll
        for (int k = 0; k < PSA_SUFFIX_RUN; ++k) {
            const int li = k * blockDim.x + tid;
            float x = -PSA_INF;
            if (jk[k] >= 0) {
                x = vk[k] + __logf((float)min(PSA_S, len - jk[k] * PSA_S));
                if (xs) xs[base + li] = x;
            }
            sx[li] = x;
        }
        __syncthreads();
        float r[PSA_SUFFIX_RUN];  // this thread's run: entries base + PSA_SUFFIX_RUN * tid + k
#pragma unroll
        for (int k = 0; k < PSA_SUFFIX_RUN / 4; ++k) {
            const float4 f = tile_x[PSA_SUFFIX_RUN / 4 * tid + k];
            r[4 * k] = f.x; r[4 * k + 1] = f.y; r[4 * k + 2] = f.z; r[4 * k + 3] = f.w;
        }
        const int own = min(PSA_SUFFIX_RUN, n - base - PSA_SUFFIX_RUN * tid);  // entries before n (<= 0: none)
        float2 run = make_float2(-PSA_INF, 0.f);
#pragma unroll
        for (int k = PSA_SUFFIX_RUN - 1; k >= 0; --k)
            if (k < own) run = lse_merge(run, make_float2(r[k], 1.f));
        float2 tile_total;
        float2 after = cta_after(warp_suffix(run, lane), lane, warp, nwarps, warp_total, &tile_total);
        after = lse_merge(after, carry);
#pragma unroll
        for (int k = PSA_SUFFIX_RUN - 1; k >= 0; --k) {
            if (k < own) {
                after = lse_merge(after, make_float2(r[k], 1.f));
                r[k] = after.x + __logf(after.y);
            }
        }
#pragma unroll
        for (int k = 0; k < PSA_SUFFIX_RUN / 4; ++k)
            tile_x[PSA_SUFFIX_RUN / 4 * tid + k] = make_float4(r[4 * k], r[4 * k + 1], r[4 * k + 2], r[4 * k + 3]);
        carry = lse_merge(tile_total, carry);
        __syncthreads();
#pragma unroll
        for (int k = 0; k < PSA_SUFFIX_RUN; ++k) {
            const int li = k * blockDim.x + tid, i = base + li;
            if (i < n) ls[i] = sx[li];
        }
        __syncthreads();  // (the next tile overwrites the shared x and the warp totals)
    }
#else
    const int per = (n + blockDim.x - 1) / blockDim.x;
    const int lo = tid * per, hi = min(lo + per, n);
    float2 run = make_float2(-PSA_INF, 0.f);  // this run's total
    for (int i = hi - 1; i >= lo; --i) {
        const int j = __ldg(orow + i);
        run = lse_merge(run, make_float2(__ldg(v + j) + __logf((float)min(PSA_S, len - j * PSA_S)), 1.f));
    }
    // everything after this run: later lanes of the warp, then later warps
    float2 after = cta_after(warp_suffix(run, lane), lane, warp, nwarps, warp_total, nullptr);
    for (int i = hi - 1; i >= lo; --i) {
        const int j = __ldg(orow + i);
        const float x = __ldg(v + j) + __logf((float)min(PSA_S, len - j * PSA_S));
        after = lse_merge(after, make_float2(x, 1.f));
        ls[i] = after.x + __logf(after.y);
        if (xs) xs[i] = x;
    }
#endif
    for (int i = n + tid; i <= Nmax; i += blockDim.x) ls[i] = -PSA_INF;
}
