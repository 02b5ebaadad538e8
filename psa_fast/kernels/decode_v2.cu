// Stage 3 on the GPU, version 2 (kept for comparison: benchmarks/bench_decode.py --versions).
// CUDA-core arithmetic with a per-warp cp.async ring; superseded by decode.cu (tensor cores).
//
// Progressive sparse attention of one decode step (Algorithm 1), with the
// verifier on the device. The same kernel runs top-k (one chunk of k blocks) and dense attention
// (identity order, one chunk of every block).
//
// Work split: a selection group (request b, group g: one KV head's query heads, or one query
// head for gqa="per_head") is handled by PSA_CLUSTER CTAs of PSA_WARPS warps. The group's
// NW = PSA_CLUSTER * PSA_WARPS warps share each chunk's blocks round-robin; one warp attends one
// block (K and V: 2 * S * D halves, 8 KiB at S = 16, D = 128) at a time.
//
// Memory pipeline: the chunk boundaries are known in advance (forced blocks, then `step` at a
// time), so each warp knows the whole sequence of blocks it will attend if the loop does not
// stop. It keeps PSA_STAGES - 1 of them in flight in a private ring of shared-memory stages
// filled by cp.async (16 bytes per lane, no registers held), across chunk boundaries: while the
// cluster runs the verifier between two chunks, the next chunk's blocks are already loading. If
// the loop stops, at most PSA_STAGES - 1 prefetched blocks per warp go unused. The block and slot
// indices are themselves prefetched one step earlier, so no dependent load is exposed.
//
// Verifier: per iteration only three scalars per query head cross warps and CTAs (the chunk's
// largest logit, its mass relative to that, its lightest block's log-mass). Every CTA combines
// the cluster's scalars through distributed shared memory in the same order, so all CTAs reach
// the same decision after one cluster barrier; the loop stops at the first chunk boundary where
// the rule holds. Nothing is computed for chunks after the stop and the host never waits.
//
//   q          [B, Hq, D]  float, scaled by the logit scale, zero-padded to PSA_D
//   k_pool     [slots, S, D] kv_t (half or bfloat16);  v_pool likewise
//   block_table[B, Hkv, Nmax] int: slot of each block
//   seq_lens   [B] int
//   order      [B, Gn, Nmax] int (psa_order), or null for the identity order (dense)
//   log_suffix [B, Hq, Nmax + 1] float (stop = certified)
//   out        [B, Hq, D] float out;  num_used, iterations, reason [B, Gn] int out;
//   mass_est   [B, Hq] float out: the rule's estimated attended fraction when the loop ended
//   dynamic shared memory: PSA_WARPS * PSA_STAGES * 2 * S * D halves (reused for the final merge)
#include "common.cuh"

#ifndef PSA_STAGES
#define PSA_STAGES 3
#endif
#define PSA_STAGE_HALVES (2 * PSA_S * PSA_D)

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
    const unsigned int s = static_cast<unsigned int>(__cvta_generic_to_shared(smem));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

// The end of the chunk that holds position x of the order: forced blocks form the first chunk,
// then chunks of `step`.
__device__ __forceinline__ int chunk_end(int x, int first, int step, int n) {
    const int e = x < first ? first : first + ((x - first) / step + 1) * step;
    return min(e, n);
}

// The next position of the order that warp `gw` of NW attends after position i (n if none).
__device__ __forceinline__ int next_position(int i, int gw, int nw, int first, int step, int n) {
    int e = chunk_end(i, first, step, n);
    if (i + nw < e) return i + nw;
    while (e < n) {
        const int e2 = chunk_end(e, first, step, n);
        if (e + gw < e2) return e + gw;
        e = e2;
    }
    return n;
}

// The first position of the order that warp `gw` attends (n if none).
__device__ __forceinline__ int first_position(int gw, int first, int step, int n) {
    for (int e = 0; e < n;) {
        const int e2 = chunk_end(e, first, step, n);
        if (e + gw < e2) return e + gw;
        e = e2;
    }
    return n;
}

extern "C" __global__ void
#if PSA_CLUSTER > 1
__cluster_dims__(PSA_CLUSTER, 1, 1)
#endif
__launch_bounds__(PSA_WARPS * 32)
psa_decode_v2(const float* __restrict__ q, const kv_t* __restrict__ k_pool, const kv_t* __restrict__ v_pool,
           const int* __restrict__ block_table, const int* __restrict__ seq_lens, const int* __restrict__ order,
           const float* __restrict__ log_suffix, float* __restrict__ out, int* __restrict__ num_used,
           int* __restrict__ iterations, int* __restrict__ reason, float* __restrict__ mass_est,
           int Hq, int Hkv, int Nmax, int stop, float threshold, int step, int forced) {
    constexpr int NW = PSA_CLUSTER * PSA_WARPS;
    extern __shared__ __align__(16) unsigned char dyn_smem[];
    const int b = blockIdx.z, g = blockIdx.y, Gn = gridDim.y;
    const unsigned int rank = cluster_rank();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int gw = (int)rank * PSA_WARPS + warp;   // this warp's index within the group
    const int h0 = g * PSA_G, kv = h0 / (Hq / Hkv);
    const int len = seq_lens[b];
    const int n = (len + PSA_S - 1) / PSA_S;
    const int first = min(n, forced);
    const int* orow = order ? order + ((long)b * Gn + g) * Nmax : nullptr;
    const int* btab = block_table + ((long)b * Hkv + kv) * Nmax;
    const int sub = lane / PSA_LPT;                // token of a 16-byte row group this lane reads
    const int ch = 8 * (lane % PSA_LPT);           // first of the 8 channels this lane reads
    kv_t* ring = reinterpret_cast<kv_t*>(dyn_smem) + warp * (PSA_STAGES * PSA_STAGE_HALVES);

    float qr[PSA_G][8];
#pragma unroll
    for (int h = 0; h < PSA_G; ++h) {
        const float4* src = reinterpret_cast<const float4*>(q + ((long)b * Hq + h0 + h) * PSA_D + ch);
        const float4 a = __ldg(src), c = __ldg(src + 1);
        qr[h][0] = a.x; qr[h][1] = a.y; qr[h][2] = a.z; qr[h][3] = a.w;
        qr[h][4] = c.x; qr[h][5] = c.y; qr[h][6] = c.z; qr[h][7] = c.w;
    }

    // ---- the prefetch stream: positions of the order this warp will attend, in sequence ----
    int f_pos = first_position(gw, first, step, n);                  // next position to load
    int f_blk = f_pos < n ? (orow ? __ldg(orow + f_pos) : f_pos) : 0;
    int f_slot = f_pos < n ? __ldg(btab + f_blk) : 0;
    int a_pos = f_pos < n ? next_position(f_pos, gw, NW, first, step, n) : n;  // the one after it
    int a_blk = a_pos < n ? (orow ? __ldg(orow + a_pos) : a_pos) : 0;
    int issued = 0;
    auto issue = [&]() {
        if (f_pos < n) {
            const kv_t* kb = k_pool + (long)f_slot * (PSA_S * PSA_D) + ch;
            const kv_t* vb = v_pool + (long)f_slot * (PSA_S * PSA_D) + ch;
            kv_t* st = ring + (issued % PSA_STAGES) * PSA_STAGE_HALVES + ch;
#pragma unroll
            for (int r = 0; r < PSA_ROWS; ++r) {
                const int t = r * PSA_TPI + sub;
                if (PSA_S % PSA_TPI == 0 || t < PSA_S) {
                    cp_async16(st + t * PSA_D, kb + t * PSA_D);
                    cp_async16(st + PSA_S * PSA_D + t * PSA_D, vb + t * PSA_D);
                }
            }
        }
        cp_async_commit();  // one group per element, empty past the end, so group counts stay aligned
        ++issued;
        f_pos = a_pos;      // advance: the slot load below was made possible by a_blk, loaded a step ago
        f_blk = a_blk;
        f_slot = f_pos < n ? __ldg(btab + f_blk) : 0;
        a_pos = f_pos < n ? next_position(f_pos, gw, NW, first, step, n) : n;
        a_blk = a_pos < n ? (orow ? __ldg(orow + a_pos) : a_pos) : 0;
    };
#pragma unroll
    for (int s = 0; s < PSA_STAGES - 1; ++s) issue();

    // This warp's running output: max logit, mass relative to it, and the weighted values of
    // its lane's channels over the tokens its lane read.
    float wm[PSA_G], wl[PSA_G], wo[PSA_G][8];
#pragma unroll
    for (int h = 0; h < PSA_G; ++h) {
        wm[h] = -PSA_INF;
        wl[h] = 0.f;
#pragma unroll
        for (int k = 0; k < 8; ++k) wo[h][k] = 0.f;
    }

    __shared__ float warp_stats[PSA_WARPS][PSA_G][3];
    __shared__ float cta_stats[2][PSA_G][3];  // read by the whole cluster; double-buffered by iteration
    __shared__ int decision;
    // Verifier state, identical in every CTA (lane h of warp 0 keeps query head h): running max M,
    // attended mass AS_acc relative to M, log of the lightest block's mass (AS_min = exp(vmin - M)).
    float vM = -PSA_INF, vacc = 0.f, vmin = PSA_INF, vfrac = 0.f;

    int cur = first_position(gw, first, step, n), consumed = 0;
    int pos = 0, it = 0, why = -1;
    while (why < 0) {
        const int end = chunk_end(pos, first, step, n);
        float cm[PSA_G], cs[PSA_G], cmin[PSA_G];  // this warp's share of the chunk
#pragma unroll
        for (int h = 0; h < PSA_G; ++h) { cm[h] = -PSA_INF; cs[h] = 0.f; cmin[h] = PSA_INF; }

        for (; cur < end; cur = next_position(cur, gw, NW, first, step, n), ++consumed) {
            const int j = orow ? __ldg(orow + cur) : cur;
            const int ntok = min(PSA_S, len - j * PSA_S);
            issue();
            cp_async_wait<PSA_STAGES - 1>();  // this lane's copies for `cur` have landed
            const kv_t* st = ring + (consumed % PSA_STAGES) * PSA_STAGE_HALVES + ch;

            // Logits of this lane's tokens, summed over the PSA_LPT lanes that share a token.
            float p[PSA_G][PSA_ROWS];
#pragma unroll
            for (int r = 0; r < PSA_ROWS; ++r) {
                const int t = r * PSA_TPI + sub;
                float kf[8];
                if (PSA_S % PSA_TPI == 0 || t < PSA_S) unpack8_kv(*reinterpret_cast<const uint4*>(st + t * PSA_D), kf);
                else
#pragma unroll
                    for (int k = 0; k < 8; ++k) kf[k] = 0.f;
#pragma unroll
                for (int h = 0; h < PSA_G; ++h) {
                    float d = 0.f;
#pragma unroll
                    for (int k = 0; k < 8; ++k) d = fmaf(qr[h][k], kf[k], d);
#pragma unroll
                    for (int o = PSA_LPT / 2; o > 0; o >>= 1) d += __shfl_xor_sync(0xffffffffu, d, o);
                    p[h][r] = t < ntok ? d : -PSA_INF;
                }
            }
            // Per head: block max, block mass, chunk statistics, and the warp's online softmax.
            float c_new[PSA_G];
#pragma unroll
            for (int h = 0; h < PSA_G; ++h) {
                float bm = -PSA_INF;
#pragma unroll
                for (int r = 0; r < PSA_ROWS; ++r) bm = fmaxf(bm, p[h][r]);
#pragma unroll
                for (int o = PSA_LPT; o < 32; o <<= 1) bm = fmaxf(bm, __shfl_xor_sync(0xffffffffu, bm, o));
                float bs = 0.f;
#pragma unroll
                for (int r = 0; r < PSA_ROWS; ++r) {
                    p[h][r] = __expf(p[h][r] - bm);
                    bs += p[h][r];
                }
#pragma unroll
                for (int o = PSA_LPT; o < 32; o <<= 1) bs += __shfl_xor_sync(0xffffffffu, bs, o);
                cmin[h] = fminf(cmin[h], bm + __logf(bs));
                const float nm = fmaxf(cm[h], bm);
                cs[h] = cs[h] * __expf(cm[h] - nm) + bs * __expf(bm - nm);
                cm[h] = nm;
                const float nw = fmaxf(wm[h], bm);
                const float a = __expf(wm[h] - nw);
                c_new[h] = __expf(bm - nw);
                wl[h] = wl[h] * a + bs * c_new[h];
                wm[h] = nw;
#pragma unroll
                for (int k = 0; k < 8; ++k) wo[h][k] *= a;
            }
#pragma unroll
            for (int r = 0; r < PSA_ROWS; ++r) {
                const int t = r * PSA_TPI + sub;
                if (!(PSA_S % PSA_TPI == 0 || t < PSA_S)) continue;
                float vf[8];
                unpack8_kv(*reinterpret_cast<const uint4*>(st + PSA_S * PSA_D + t * PSA_D), vf);
#pragma unroll
                for (int h = 0; h < PSA_G; ++h) {
                    const float w = p[h][r] * c_new[h];
#pragma unroll
                    for (int k = 0; k < 8; ++k) wo[h][k] = fmaf(w, vf[k], wo[h][k]);
                }
            }
        }

        // ---- verifier: combine the chunk's scalars over warps, then over the cluster ----
        if (lane == 0) {
#pragma unroll
            for (int h = 0; h < PSA_G; ++h) {
                warp_stats[warp][h][0] = cm[h];
                warp_stats[warp][h][1] = cs[h];
                warp_stats[warp][h][2] = cmin[h];
            }
        }
        __syncthreads();
        if (warp == 0 && lane < PSA_G) {
            float m = -PSA_INF, s = 0.f, mn = PSA_INF;
#pragma unroll
            for (int w = 0; w < PSA_WARPS; ++w) {
                const float wm_ = warp_stats[w][lane][0];
                const float nm = fmaxf(m, wm_);
                if (nm != -PSA_INF) s = s * __expf(m - nm) + warp_stats[w][lane][1] * __expf(wm_ - nm);
                m = nm;
                mn = fminf(mn, warp_stats[w][lane][2]);
            }
            cta_stats[it & 1][lane][0] = m;
            cta_stats[it & 1][lane][1] = s;
            cta_stats[it & 1][lane][2] = mn;
        }
        cluster_sync();
        if (warp == 0) {
            bool holds = true;
            if (lane < PSA_G) {
                // all remote loads first, then the arithmetic: the loads overlap
                float rm[PSA_CLUSTER], rs[PSA_CLUSTER], rmin[PSA_CLUSTER];
#pragma unroll
                for (int r = 0; r < PSA_CLUSTER; ++r) {
                    rm[r] = dsmem_load(&cta_stats[it & 1][lane][0], r);
                    rs[r] = dsmem_load(&cta_stats[it & 1][lane][1], r);
                    rmin[r] = dsmem_load(&cta_stats[it & 1][lane][2], r);
                }
                float m = -PSA_INF, s = 0.f, mn = PSA_INF;
#pragma unroll
                for (int r = 0; r < PSA_CLUSTER; ++r) {
                    const float nm = fmaxf(m, rm[r]);
                    if (nm != -PSA_INF) s = s * __expf(m - nm) + rs[r] * __expf(rm[r] - nm);
                    m = nm;
                    mn = fminf(mn, rmin[r]);
                }
                const float nM = fmaxf(vM, m);
                vacc = vacc * __expf(vM - nM) + s * __expf(m - nM);
                vM = nM;
                vmin = fminf(vmin, mn);
                // The rule's estimate of the attended fraction: AS_acc / (AS_acc + rest).
                float rest = 0.f;
                if (stop == PSA_STOP_REMAINING) rest = (float)(n - end) * __expf(vmin - vM);
                else if (stop == PSA_STOP_SEED) rest = __expf(vmin - vM);
                else if (stop == PSA_STOP_CERTIFIED)
                    rest = __expf(log_suffix[((long)b * Hq + h0 + lane) * (Nmax + 1) + end] - vM);
                vfrac = vacc / (vacc + rest);
                holds = vfrac >= threshold;
            }
            const bool all_hold = __all_sync(0xffffffffu, holds);
            if (lane == 0) {
                int d = -1;
                if (stop == PSA_STOP_BUDGET) d = PSA_REASON_BUDGET;
                else if (end >= n) d = PSA_REASON_EXHAUSTED;
                else if (stop != PSA_STOP_NONE && all_hold) d = PSA_REASON_THRESHOLD;
                decision = d;
            }
        }
        __syncthreads();
        why = decision;
        pos = end;
        ++it;
    }
    cp_async_wait_all();  // prefetches past the stop must land before the ring is reused below

    // ---- merge the warps' outputs: token groups of a warp, warps of a CTA, CTAs of the cluster ----
#pragma unroll
    for (int h = 0; h < PSA_G; ++h)
#pragma unroll
        for (int k = 0; k < 8; ++k)
#pragma unroll
            for (int o = PSA_LPT; o < 32; o <<= 1) wo[h][k] += __shfl_xor_sync(0xffffffffu, wo[h][k], o);

    __syncthreads();  // every warp is done with its ring
    float* f_o = reinterpret_cast<float*>(dyn_smem);  // [PSA_WARPS][PSA_G][PSA_D], reusing the rings
    __shared__ float f_m[PSA_WARPS][PSA_G], f_l[PSA_WARPS][PSA_G];
    __shared__ float c_m[PSA_G], c_l[PSA_G], c_o[PSA_G][PSA_D];
    if (lane < PSA_LPT) {
#pragma unroll
        for (int h = 0; h < PSA_G; ++h)
#pragma unroll
            for (int k = 0; k < 8; ++k) f_o[(warp * PSA_G + h) * PSA_D + ch + k] = wo[h][k];
    }
    if (lane == 0) {
#pragma unroll
        for (int h = 0; h < PSA_G; ++h) { f_m[warp][h] = wm[h]; f_l[warp][h] = wl[h]; }
    }
    __syncthreads();
    combine_warps(f_m, f_l, f_o, c_m, c_l, c_o);
    cluster_sync();
    if (rank == 0) {
        for (int idx = threadIdx.x; idx < PSA_G * PSA_D; idx += blockDim.x) {
            const int h = idx / PSA_D, d = idx % PSA_D;
            const float3 mlo = cluster_combine(&c_m[h], &c_l[h], &c_o[h][d]);
            const float L = mlo.y, O = mlo.z;
            out[((long)b * Hq + h0 + h) * PSA_D + d] = O / L;
        }
        if (threadIdx.x == 0) {
            const long gi = (long)b * Gn + g;
            num_used[gi] = pos;
            iterations[gi] = it;
            reason[gi] = why;
        }
        if (warp == 0 && lane < PSA_G) mass_est[(long)b * Hq + h0 + lane] = vfrac;
    }
    cluster_sync();  // no CTA leaves while rank 0 may still read its shared memory
}
