// Stage 2c on the GPU (stop = certified, sketch): per query head, the suffix log-sum-exp of
// x_i = vals[order[i]] + log n_j along the processing order, which the verifier reads as the
// unseen mass at a chunk boundary (certified: the min/max bounds; sketch: the sketch masses).
//
// One CTA per (request, query head), so every head of a small batch runs at once (the sort that
// used to compute it ran its group's heads one after another inside one CTA: 15 µs of the 37 µs
// the order took at 32K, B = 1). Each thread owns a contiguous run of the order; the runs' totals
// are combined by a suffix scan of warp shuffles, then every thread rewalks its run.
//
//   order      [B, Hq / PSA_G, Nmax] int (psa_order)
//   vals       [B, Hq, Nmax] float: per-head value of every block
//   log_suffix [B, Hq, Nmax + 1] float out: log sum_{i' >= i} n_j exp(vals_j), j = order[i'], i' < N_b;
//              -inf from i = N_b on
//   ordered    [B, Hq, Nmax] float out or null: x_i itself at i < N_b (the sketch rules' window sums read it
//              by position, psa_decode / psa_spec_verify, instead of order[i] then vals[j])
#include "common.cuh"

#define PSA_SUFFIX_THREADS 1024

// (max, sum relative to it) of two log-sum-exp shares.
__device__ __forceinline__ float2 lse_merge(float2 a, float2 b) {
    const float nm = fmaxf(a.x, b.x);
    if (nm == -PSA_INF) return make_float2(nm, 0.f);
    return make_float2(nm, a.y * __expf(a.x - nm) + b.y * __expf(b.x - nm));
}

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

    const int per = (n + blockDim.x - 1) / blockDim.x;
    const int lo = tid * per, hi = min(lo + per, n);
    float2 run = make_float2(-PSA_INF, 0.f);  // this run's total
    for (int i = hi - 1; i >= lo; --i) {
        const int j = __ldg(orow + i);
        run = lse_merge(run, make_float2(__ldg(v + j) + __logf((float)min(PSA_S, len - j * PSA_S)), 1.f));
    }
    // everything after this run: later lanes of the warp, then later warps
    const float2 incl = warp_suffix(run, lane);
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
    for (int i = hi - 1; i >= lo; --i) {
        const int j = __ldg(orow + i);
        const float x = __ldg(v + j) + __logf((float)min(PSA_S, len - j * PSA_S));
        after = lse_merge(after, make_float2(x, 1.f));
        ls[i] = after.x + __logf(after.y);
        if (xs) xs[i] = x;
    }
    for (int i = n + tid; i <= Nmax; i += blockDim.x) ls[i] = -PSA_INF;
}
