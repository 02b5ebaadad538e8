// Stage 2b on the GPU: the processing order of every selection group, and (for
// stop="certified") the suffix sums of the min/max bounds along that order.
//
// One CTA per group sorts all the group's keys (sort.cuh) and writes the order; long caches use
// psa_order_slice + psa_order_merge instead, which spread a group over many CTAs.
//
//   scores       [B, Gn, Nmax] float (from psa_estimate)
//   order        [B, Gn, Nmax] int out: block indices in processing order (first N_b valid)
//   bounds       [B, Hq, Nmax] float (certified only)
//   log_suffix   [B, Hq, Nmax + 1] float out (certified only): log sum_{i' >= i} n_j exp(ub_j),
//                over j = order[i'], i' < N_b; -inf at i = N_b.
#include "sort.cuh"

extern "C" __global__ void __launch_bounds__(PSA_SORT_THREADS)
psa_order(const float* __restrict__ scores, const int* __restrict__ seq_lens, int* __restrict__ order,
          const float* __restrict__ bounds, float* __restrict__ log_suffix, int Hq, int Nmax, int npad_unused,
          int sink_blocks, int recent_blocks, int want_suffix) {
    extern __shared__ u64 keys[];  // PSA_SN keys: exchange buffer of the long stages; reused by the scan
    const int b = blockIdx.y, g = blockIdx.x, Gn = gridDim.x;
    const int len = seq_lens[b];
    const int n = (len + PSA_S - 1) / PSA_S;
    const float* srow = scores + ((long)b * Gn + g) * Nmax;
    const int tid = threadIdx.x;

    u64 k[PSA_KPT];
    load_keys(k, srow, n, 0, sink_blocks, recent_blocks);

    block_sort_desc(k, keys);

    int* orow = order + ((long)b * Gn + g) * Nmax;
#pragma unroll
    for (int r = 0; r < PSA_KPT; ++r) {
        const int i = tid * PSA_KPT + r;
        if (i < Nmax) orow[i] = i < n ? (int)(0xFFFFFFFFu - (unsigned int)(k[r] & 0xFFFFFFFFull)) : -1;
    }
    if (!want_suffix) return;
    __syncthreads();

    // Certified: per query head, a reverse inclusive log-sum-exp scan of log(n_j) + ub_j along the
    // order. Each thread owns a contiguous run of the order; runs are combined with a suffix scan
    // over threads in shared memory (floats, after the keys are no longer needed).
    float* run_max = reinterpret_cast<float*>(keys);
    float* run_sum = run_max + PSA_SORT_THREADS;
    const int per = (n + PSA_SORT_THREADS - 1) / PSA_SORT_THREADS;
    const int lo = tid * per, hi = min(lo + per, n);
    for (int hh = 0; hh < PSA_G; ++hh) {
        const int h = g * PSA_G + hh;
        const float* ub = bounds + ((long)b * Hq + h) * Nmax;
        float* ls = log_suffix + ((long)b * Hq + h) * (Nmax + 1);
        float m = -PSA_INF, s = 0.f;  // this run's total, relative to its max
        for (int i = hi - 1; i >= lo; --i) {
            const int j = orow[i];
            const float x = ub[j] + logf((float)min(PSA_S, len - j * PSA_S));
            const float nm = fmaxf(m, x);
            s = (m == -PSA_INF ? 0.f : s * __expf(m - nm)) + __expf(x - nm);
            m = nm;
        }
        run_max[tid] = m;
        run_sum[tid] = s;
        __syncthreads();
        for (int off = 1; off < PSA_SORT_THREADS; off <<= 1) {  // inclusive suffix scan over runs
            float am = run_max[tid], as = run_sum[tid];
            if (tid + off < PSA_SORT_THREADS) {
                const float bm = run_max[tid + off], bs = run_sum[tid + off];
                const float nm = fmaxf(am, bm);
                if (nm != -PSA_INF) {
                    as = as * __expf(am - nm) + bs * __expf(bm - nm);
                    am = nm;
                }
            }
            __syncthreads();
            run_max[tid] = am;
            run_sum[tid] = as;
            __syncthreads();
        }
        float tm = -PSA_INF, ts = 0.f;  // everything after this run
        if (tid + 1 < PSA_SORT_THREADS) {
            tm = run_max[tid + 1];
            ts = run_sum[tid + 1];
        }
        for (int i = hi - 1; i >= lo; --i) {
            const int j = orow[i];
            const float x = ub[j] + logf((float)min(PSA_S, len - j * PSA_S));
            const float nm = fmaxf(tm, x);
            ts = (tm == -PSA_INF ? 0.f : ts * __expf(tm - nm)) + __expf(x - nm);
            tm = nm;
            ls[i] = tm + logf(ts);
        }
        if (tid == 0)
            for (int i = n; i <= Nmax; ++i) ls[i] = -PSA_INF;
        __syncthreads();
    }
}
