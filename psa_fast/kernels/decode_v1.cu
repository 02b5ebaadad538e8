// Stage 3 on the GPU, version 1 (kept for comparison: benchmarks/bench_decode.py --versions 1,2).
// Each warp loads one block into registers and waits for it: no prefetch. Superseded by decode.cu.
//
// Progressive sparse attention of one decode step (Algorithm 1), with the
// verifier on the device. The same kernel runs top-k (one chunk of k blocks) and dense attention
// (identity order, one chunk of every block).
//
// Work split: a selection group (request b, group g: one KV head's query heads, or one query
// head for gqa="per_head") is handled by PSA_CLUSTER CTAs of PSA_WARPS warps. In each iteration
// the group's NW = PSA_CLUSTER * PSA_WARPS warps share the chunk's blocks round-robin; one warp
// reads one block (K and V: 2 * S * D halves, 8 KiB at S = 16, D = 128) with 16-byte loads.
// Each warp keeps its own online-softmax output (max, mass, output); they are merged once, at the
// end. Per iteration only three scalars per query head cross warps and CTAs: the chunk's largest
// logit, its mass relative to that, and its lightest block's log-mass. Every CTA combines the
// cluster's scalars through distributed shared memory in the same order, so all CTAs compute the
// same verifier decision without another barrier; the loop stops at the first chunk boundary
// where the rule holds. Nothing is read for chunks after the stop, and the host never waits.
//
//   q          [B, Hq, D]  float, scaled by the logit scale, zero-padded to PSA_D
//   k_pool     [slots, S, D] half;  v_pool likewise
//   block_table[B, Hkv, Nmax] int: slot of each block
//   seq_lens   [B] int
//   order      [B, Gn, Nmax] int (psa_order), or null for the identity order (dense)
//   log_suffix [B, Hq, Nmax + 1] float (stop = certified)
//   out        [B, Hq, D] float out;  num_used, iterations, reason [B, Gn] int out;
//   mass_est   [B, Hq] float out: the rule's estimated attended fraction when the loop ended
#include "common.cuh"

extern "C" __global__ void
#if PSA_CLUSTER > 1
__cluster_dims__(PSA_CLUSTER, 1, 1)
#endif
__launch_bounds__(PSA_WARPS * 32)
psa_decode_v1(const float* __restrict__ q, const __half* __restrict__ k_pool, const __half* __restrict__ v_pool,
           const int* __restrict__ block_table, const int* __restrict__ seq_lens, const int* __restrict__ order,
           const float* __restrict__ log_suffix, float* __restrict__ out, int* __restrict__ num_used,
           int* __restrict__ iterations, int* __restrict__ reason, float* __restrict__ mass_est,
           int Hq, int Hkv, int Nmax, int stop, float threshold, int step, int forced) {
    constexpr int NW = PSA_CLUSTER * PSA_WARPS;
    const int b = blockIdx.z, g = blockIdx.y, Gn = gridDim.y;
    const unsigned int rank = cluster_rank();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int gw = (int)rank * PSA_WARPS + warp;   // this warp's index within the group
    const int h0 = g * PSA_G, kv = h0 / (Hq / Hkv);
    const int len = seq_lens[b];
    const int n = (len + PSA_S - 1) / PSA_S;
    const int* orow = order ? order + ((long)b * Gn + g) * Nmax : nullptr;
    const int* btab = block_table + ((long)b * Hkv + kv) * Nmax;
    const int sub = lane / PSA_LPT;                // token of a load instruction this lane reads
    const int ch = 8 * (lane % PSA_LPT);           // first of the 8 channels this lane reads

    float qr[PSA_G][8];
#pragma unroll
    for (int h = 0; h < PSA_G; ++h) {
        const float4* src = reinterpret_cast<const float4*>(q + ((long)b * Hq + h0 + h) * PSA_D + ch);
        const float4 a = __ldg(src), c = __ldg(src + 1);
        qr[h][0] = a.x; qr[h][1] = a.y; qr[h][2] = a.z; qr[h][3] = a.w;
        qr[h][4] = c.x; qr[h][5] = c.y; qr[h][6] = c.z; qr[h][7] = c.w;
    }

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

    const int first = min(n, forced);
    int pos = 0, it = 0, why = -1;
    while (why < 0) {
        const int end = min(n, pos + ((it == 0 && first > 0) ? first : step));
        float cm[PSA_G], cs[PSA_G], cmin[PSA_G];  // this warp's share of the chunk
#pragma unroll
        for (int h = 0; h < PSA_G; ++h) { cm[h] = -PSA_INF; cs[h] = 0.f; cmin[h] = PSA_INF; }

        for (int i = pos + gw; i < end; i += NW) {
            const int j = orow ? orow[i] : i;
            const long slot = btab[j];
            const int ntok = min(PSA_S, len - j * PSA_S);
            const __half* kb = k_pool + slot * (PSA_S * PSA_D) + ch;
            const __half* vb = v_pool + slot * (PSA_S * PSA_D) + ch;
            // One block: PSA_ROWS 16-byte loads of K and of V per lane, all issued before use.
            uint4 kr[PSA_ROWS], vr[PSA_ROWS];
#pragma unroll
            for (int r = 0; r < PSA_ROWS; ++r) {
                const int t = r * PSA_TPI + sub;
                if (PSA_S % PSA_TPI == 0 || t < PSA_S) {
                    kr[r] = __ldg(reinterpret_cast<const uint4*>(kb + t * PSA_D));
                    vr[r] = __ldg(reinterpret_cast<const uint4*>(vb + t * PSA_D));
                } else {
                    kr[r] = make_uint4(0, 0, 0, 0);
                    vr[r] = make_uint4(0, 0, 0, 0);
                }
            }
            // Logits of this lane's tokens, summed over the PSA_LPT lanes that share a token.
            float p[PSA_G][PSA_ROWS];
#pragma unroll
            for (int r = 0; r < PSA_ROWS; ++r) {
                float kf[8];
                unpack8(kr[r], kf);
                const bool valid = r * PSA_TPI + sub < ntok;
#pragma unroll
                for (int h = 0; h < PSA_G; ++h) {
                    float d = 0.f;
#pragma unroll
                    for (int k = 0; k < 8; ++k) d = fmaf(qr[h][k], kf[k], d);
#pragma unroll
                    for (int o = PSA_LPT / 2; o > 0; o >>= 1) d += __shfl_xor_sync(0xffffffffu, d, o);
                    p[h][r] = valid ? d : -PSA_INF;
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
                float vf[8];
                unpack8(vr[r], vf);
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
                float m = -PSA_INF, s = 0.f, mn = PSA_INF;
                for (unsigned int r = 0; r < PSA_CLUSTER; ++r) {
                    const float rm = dsmem_load(&cta_stats[it & 1][lane][0], r);
                    const float nm = fmaxf(m, rm);
                    if (nm != -PSA_INF) s = s * __expf(m - nm) + dsmem_load(&cta_stats[it & 1][lane][1], r) * __expf(rm - nm);
                    m = nm;
                    mn = fminf(mn, dsmem_load(&cta_stats[it & 1][lane][2], r));
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

    // ---- merge the warps' outputs: token groups of a warp, warps of a CTA, CTAs of the cluster ----
#pragma unroll
    for (int h = 0; h < PSA_G; ++h)
#pragma unroll
        for (int k = 0; k < 8; ++k)
#pragma unroll
            for (int o = PSA_LPT; o < 32; o <<= 1) wo[h][k] += __shfl_xor_sync(0xffffffffu, wo[h][k], o);

    __shared__ float f_m[PSA_WARPS][PSA_G], f_l[PSA_WARPS][PSA_G];
    __shared__ float f_o[PSA_WARPS][PSA_G][PSA_D];
    __shared__ float c_m[PSA_G], c_l[PSA_G], c_o[PSA_G][PSA_D];
    if (lane < PSA_LPT) {
#pragma unroll
        for (int h = 0; h < PSA_G; ++h)
#pragma unroll
            for (int k = 0; k < 8; ++k) f_o[warp][h][ch + k] = wo[h][k];
    }
    if (lane == 0) {
#pragma unroll
        for (int h = 0; h < PSA_G; ++h) { f_m[warp][h] = wm[h]; f_l[warp][h] = wl[h]; }
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < PSA_G * PSA_D; idx += blockDim.x) {
        const int h = idx / PSA_D, d = idx % PSA_D;
        float M = -PSA_INF;
        for (int w = 0; w < PSA_WARPS; ++w) M = fmaxf(M, f_m[w][h]);
        float L = 0.f, O = 0.f;
        if (M != -PSA_INF)
            for (int w = 0; w < PSA_WARPS; ++w) {
                const float e = __expf(f_m[w][h] - M);
                L += f_l[w][h] * e;
                O += f_o[w][h][d] * e;
            }
        c_o[h][d] = O;
        if (d == 0) { c_m[h] = M; c_l[h] = L; }
    }
    cluster_sync();
    if (rank == 0) {
        for (int idx = threadIdx.x; idx < PSA_G * PSA_D; idx += blockDim.x) {
            const int h = idx / PSA_D, d = idx % PSA_D;
            float M = -PSA_INF;
            for (unsigned int r = 0; r < PSA_CLUSTER; ++r) M = fmaxf(M, dsmem_load(&c_m[h], r));
            float L = 0.f, O = 0.f;
            for (unsigned int r = 0; r < PSA_CLUSTER; ++r) {
                const float rm = dsmem_load(&c_m[h], r);
                if (rm == -PSA_INF) continue;
                const float e = __expf(rm - M);
                L += dsmem_load(&c_l[h], r) * e;
                O += dsmem_load(&c_o[h][d], r) * e;
            }
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
