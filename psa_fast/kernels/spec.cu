// The speculative schedule (DecodePlan(speculate=...)): psa_decode's PSA_SPEC build has attended each
// group's chunks that start below its speculated position (psa_spec_len: a margin over the prefix the
// estimates predict for tau), one CTA per chunk with no barrier between them, and written every chunk's
// partial output and statistics. This kernel evaluates the loop's rule (verifier_decide) after each of
// those chunks, finds the first chunk after which it holds, and merges the outputs of the chunks up to
// it: the blocks attended, the decision and the output are the loop's up to float rounding (below). A
// group whose rule did not hold within the speculated
// chunks leaves the loop's state after them in istate/vstate, and psa_decode's PSA_RESUME build goes on
// from there; every other group is marked done there, so its resumed CTAs leave at once.
//
// Grid (Gn, B), PSA_VERIFY_THREADS threads. The chunks are taken PSA_WIN at a time, one warp each: the
// warps gather their statistics at once (the partials, and for the sketch rules the window sums by the
// loop's own sketch_window_sums: all independent of the decision), then warp h folds head h's 32
// chunks by prefix scans and every lane decides on its chunk. The scans sum in another order than the
// loop's fold, so a decision can differ from the loop's where rounding straddles the threshold. The
// output then needs one pass over the partials: the verifier's running max and mass are the merge's.
//   partial    [B, Hq, Cmax, PSA_SPEC_PIECES, PSA_D + 4] float: per chunk (and piece) O[D] (unnormalised), max
//              logit, mass relative to it, min log block mass, moving-average terms (psa_decode's PSA_SPEC build);
//              a chunk's pieces (the forced chunk one, the first ranked chunk as many as verifier.cuh's
//              spec_pieces_of gives with `spec_extra`) are combined in piece order first (combine_stats, as the loop
//              combines a cluster's CTAs), then the chunks are folded as below
//   spec_len   [B, Gn] int: the speculated positions (psa_spec_len), or null: each group's forced and first ranked
//              chunks (DecodePlan(speculate="first_chunk"))
//   log_suffix, ordered, lmass, first_len: as psa_decode
//   out [B, Hq, PSA_D], num_used / iterations / reason [B, Gn], mass_est [B, Hq]: written for groups that stop
//   istate     [B, Gn, 4] int out: next position, iterations done, reason (-1: the loop goes on), and the
//              positions the speculated chunks cover (read, attended or not)
//   vstate     [B, Hq, 7 + PSA_D] float out: verifier state, then the running output's max, mass and O[D]
//   spec_total [1] int out: set to 0 (psa_spec_len's count, read by the speculative attend before this launch)
#include "common.cuh"
#include "verifier.cuh"

#ifndef PSA_VERIFY_CLOCK
#define PSA_VERIFY_CLOCK 0
#endif
// PSA_VERIFY_CLOCK = 1 (benchmarks/exp_verify_clock.py): thread 0 of every CTA writes the SM cycles of each
// phase to clocks [B, Gn, 8]: whole kernel, up to the first window, the windows' gathering, scans and decisions
// (summed over windows), the output pass, the windows and the chunks C. Adds two barriers; not for production.
#if PSA_VERIFY_CLOCK
#define PSA_CLOCK(var) long long var = 0; if (threadIdx.x == 0) var = clock64()
#define PSA_CLOCK_ADD(acc, from) if (threadIdx.x == 0) acc += clock64() - (from)
#else
#define PSA_CLOCK(var)
#define PSA_CLOCK_ADD(acc, from)
#endif

#ifndef PSA_SPEC_PIECES
#define PSA_SPEC_PIECES 1  // the speculative attend's CTAs (and partials) a chunk
#endif

#define PSA_VERIFY_THREADS 1024
#define PSA_WIN (PSA_VERIFY_THREADS / 32)

extern "C" __global__ void __launch_bounds__(PSA_VERIFY_THREADS)
psa_spec_verify(const float* __restrict__ partial, const int* __restrict__ spec_len, const int* __restrict__ seq_lens,
                const float* __restrict__ log_suffix, const float* __restrict__ ordered,
                const float* __restrict__ lmass, const int* __restrict__ first_len, float* __restrict__ out,
                int* __restrict__ num_used, int* __restrict__ iterations, int* __restrict__ reason,
                float* __restrict__ mass_est, int* __restrict__ istate, float* __restrict__ vstate, int Hq, int Nmax,
                int Cmax, int stop, float threshold, int step, int forced, float ema_w, float sketch_share,
                int sketch_window, int* __restrict__ spec_total, int spec_extra
#if PSA_VERIFY_CLOCK
                , long long* __restrict__ clocks
#endif
                ) {
    constexpr int PW = PSA_D + 4;  // floats per chunk (piece) and head in `partial`
    constexpr int P = PSA_SPEC_PIECES;  // the partials' entries a chunk
    const int g = blockIdx.x, b = blockIdx.y, Gn = gridDim.x, h0 = g * PSA_G;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    PSA_CLOCK(t_start);
#if PSA_VERIFY_CLOCK
    long long c_first = -1, c_gather = 0, c_scan = 0, c_decide = 0;
    int windows = 0;
#endif
    if (g == 0 && b == 0 && threadIdx.x == 0) *spec_total = 0;
    const long gi = (long)b * Gn + g;
    const int len = seq_lens[b], n = (len + PSA_S - 1) / PSA_S, first = min(n, forced);
    const int first2 = first_len ? min(n, first + __ldg(first_len + gi)) : first;
    const int C = min(Cmax, chunks_before(min(n, spec_len ? __ldg(spec_len + gi) : first2), first, first2, step));
    const bool sketchy = stop == PSA_STOP_SKETCH || stop == PSA_STOP_SKETCH_AVG;
    const bool tail = stop == PSA_STOP_CERTIFIED || sketchy;
    const float next_share = stop == PSA_STOP_SKETCH_AVG ? sketch_share / (float)n : sketch_share;
    const float log_keep = __logf(1.f - ema_w);
    const long row0 = (long)b * Hq + h0;  // the group's first head
#if PSA_SPEC_PIECES > 1
    // Pieces: the first ranked chunk's (the attend's count, from every group's blocks); every other chunk has one
    __shared__ int s_pieces;
    if (threadIdx.x < 32) {
        const long long total = spec_blocks_total(first_len, seq_lens, Gn * gridDim.y, Gn, forced);
        if (threadIdx.x == 0) s_pieces = spec_pieces_of(first2 - first, total, spec_extra, P);
    }
    __syncthreads();
    const int ranked_pieces = s_pieces;
    auto pieces_of = [&](int c) { return c == (first > 0) ? ranked_pieces : 1; };  // chunk c's
#endif

    // Per chunk of the window and head: tm, ts, tmin, te, log_tail, w_true, w_sketch, next_sketch; per chunk
    // its end; per head the window's decisions as a bit mask.
    __shared__ float st[PSA_WIN][PSA_G][8];
    __shared__ int s_end[PSA_WIN];
    __shared__ unsigned int s_hold[PSA_G];
    __shared__ float s_M[PSA_G], s_L[PSA_G];
    Verifier ver = verifier_start();  // warp h < PSA_G, every lane: head h's state before the window
    int last = -1, why = -1;           // the chunk where the loop ended, and why (block-uniform)
    for (int c0 = 0; c0 < C && why < 0; c0 += PSA_WIN) {
        const int cn = min(PSA_WIN, C - c0);
        __syncthreads();  // the previous window's st, s_end and s_hold are read by now
        PSA_CLOCK(t_w0);
#if PSA_VERIFY_CLOCK
        if (threadIdx.x == 0 && c_first < 0) c_first = t_w0 - t_start;
        ++windows;
#endif
        if (warp < cn) {  // chunk c0 + warp
            const int c = c0 + warp;
            const int end = chunk_end(chunk_start(c, first, first2, step), first, first2, step, n);
            if (lane == 0) s_end[warp] = end;
#if PSA_SPEC_PIECES > 1
            // Pieces: J lanes a head, lane j combining the chunk's pieces j, j + J, ... in order (loads four at a
            // time), then the head's lanes combined pairwise at growing distances (lane j with j + 1, then j + 2 ...)
            constexpr int J = 32 / PSA_G;
            const int hp = lane / J, j = lane % J, pn = pieces_of(c);
            float4 x = make_float4(-PSA_INF, 0.f, PSA_INF, 0.f);  // no piece yet
            if (hp < PSA_G) {
                const float* pc = partial + ((row0 + hp) * Cmax + c) * P * PW + PSA_D;
                for (int p0 = j; p0 < pn; p0 += 4 * J) {
                    float4 xp[4];
#pragma unroll
                    for (int k = 0; k < 4; ++k)
                        if (p0 + k * J < pn) xp[k] = __ldcg(reinterpret_cast<const float4*>(pc + (p0 + k * J) * PW));
#pragma unroll
                    for (int k = 0; k < 4; ++k)
                        if (p0 + k * J < pn) x = combine_stats(x, xp[k]);
                }
            }
#pragma unroll
            for (int off = 1; off < J; off <<= 1) {
                float4 y;
                y.x = __shfl_down_sync(0xffffffffu, x.x, off);
                y.y = __shfl_down_sync(0xffffffffu, x.y, off);
                y.z = __shfl_down_sync(0xffffffffu, x.z, off);
                y.w = __shfl_down_sync(0xffffffffu, x.w, off);
                if (j % (2 * off) == 0 && j + off < J) x = combine_stats(x, y);
            }
            const int head = hp;
            const bool writes = hp < PSA_G && j == 0;
#else
            const int head = lane;  // lane h: head h's partial statistics
            const bool writes = lane < PSA_G;
            const float4 x = writes
                ? __ldcg(reinterpret_cast<const float4*>(partial + ((row0 + head) * Cmax + c) * P * PW + PSA_D))
                : make_float4(0.f, 0.f, 0.f, 0.f);
#endif
            if (writes) {  // the head's partial statistics (its pieces' combined) and tail
                const float lt = tail ? __ldg(log_suffix + (row0 + head) * (Nmax + 1) + end) : 0.f;
                st[warp][head][0] = x.x;
                st[warp][head][1] = x.y;
                st[warp][head][2] = x.z;
                st[warp][head][3] = x.w;
                st[warp][head][4] = lt;
            }
            if (sketchy) {  // the calibration window's sums and the next block's sketch mass, as psa_decode's
                float wt[PSA_G], ws[PSA_G], nx[PSA_G];
                sketch_window_sums(lmass, ordered, row0, Nmax, first, end, n, sketch_window, wt, ws, nx);
                if (lane == 0)
#pragma unroll
                    for (int h = 0; h < PSA_G; ++h) {
                        st[warp][h][5] = wt[h];
                        st[warp][h][6] = ws[h];
                        st[warp][h][7] = nx[h];
                    }
            }
        }
        __syncthreads();
        PSA_CLOCK(t_w1);
        PSA_CLOCK_ADD(c_gather, t_w0);
        // Warp h folds head h's chunks of the window by prefix scans over lanes (lane k: chunk c0 + k): the
        // running max and mass (log-sum-exp), the lightest block, and the moving average (a linear recurrence:
        // each chunk scales what came before by (1-w)^clen and adds its terms), each from the state before the
        // window; then every lane decides on its own state (verifier_decide, the loop's arithmetic).
        Verifier vk = ver;
        if (warp < PSA_G) {
            const int h = warp, k = lane;
            const bool valid = k < cn;
            const int start = valid ? chunk_start(c0 + k, first, first2, step) : 0;
            const int end = valid ? s_end[k] : n;
            const float* x = st[valid ? k : 0][h];
            float m = valid ? x[0] : -PSA_INF, a = valid ? x[1] : 0.f, mn = valid ? x[2] : PSA_INF;
            float ld = valid ? (end - start) * log_keep : 0.f;  // log of the decay over the chunks so far
            float tm = m, ts = valid ? x[3] : 0.f;              // the moving average's terms, as (max, mass)
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const float pm = __shfl_up_sync(0xffffffffu, m, o), pa = __shfl_up_sync(0xffffffffu, a, o);
                const float pmn = __shfl_up_sync(0xffffffffu, mn, o), pld = __shfl_up_sync(0xffffffffu, ld, o);
                const float ptm = __shfl_up_sync(0xffffffffu, tm, o), pts = __shfl_up_sync(0xffffffffu, ts, o);
                if (k >= o) {
                    const float2 s1 = lse_merge(make_float2(pm, pa), make_float2(m, a));
                    const float2 s2 = lse_merge(make_float2(ptm + ld, pts), make_float2(tm, ts));
                    m = s1.x; a = s1.y; tm = s2.x; ts = s2.y;
                    mn = fminf(pmn, mn);
                    ld += pld;
                }
            }
            const float2 run = lse_merge(make_float2(ver.M, ver.acc), make_float2(m, a));
            const float2 ema = lse_merge(make_float2(ver.M + ld, ver.ema), make_float2(tm, ts));
            vk.M = run.x;
            vk.acc = run.y;
            vk.min = fminf(ver.min, mn);
            vk.ema = ema.x == -PSA_INF ? 0.f : ema.y * __expf(ema.x - run.x);
            const bool hold = valid && verifier_decide(vk, end, first, n, stop, threshold, x[4], x[5], x[6], x[7],
                                                       next_share);
            const unsigned int mask = __ballot_sync(0xffffffffu, hold);
            if (lane == 0) s_hold[h] = mask;
        }
        __syncthreads();
        PSA_CLOCK(t_w2);
        PSA_CLOCK_ADD(c_scan, t_w1);
        // Every thread: the first chunk of the window where the loop ends (exhausted, or every head holds).
        unsigned int all = stop != PSA_STOP_NONE ? 0xffffffffu : 0u, exhausted = 0u;
#pragma unroll
        for (int h = 0; h < PSA_G; ++h) all &= s_hold[h];
        for (int k = 0; k < cn; ++k) exhausted |= (s_end[k] >= n ? 1u : 0u) << k;
        const unsigned int ends = all | exhausted;
        const int k_end = ends ? __ffs(ends) - 1 : cn - 1;
        if (ends) why = (exhausted >> k_end) & 1u ? PSA_REASON_EXHAUSTED : PSA_REASON_THRESHOLD;
        last = c0 + k_end;
        if (warp < PSA_G) {  // the state after chunk `last` is the next window's start
            ver.M = __shfl_sync(0xffffffffu, vk.M, k_end);
            ver.acc = __shfl_sync(0xffffffffu, vk.acc, k_end);
            ver.min = __shfl_sync(0xffffffffu, vk.min, k_end);
            ver.ema = __shfl_sync(0xffffffffu, vk.ema, k_end);
            ver.frac = __shfl_sync(0xffffffffu, vk.frac, k_end);
            if (lane == 0) { s_M[warp] = ver.M; s_L[warp] = ver.acc; }
        }
        PSA_CLOCK_ADD(c_decide, t_w2);
    }
    __syncthreads();
    PSA_CLOCK(t_out);

    // The output of chunks [0, last]: the verifier's running max M and mass L (relative to M) are the
    // merge's, so one pass adds O_c e^(m_c - M); normalised if the loop ended here, else kept (with M and
    // L) for the resumed loop.
    auto put = [&](int h, int d, float O) {
        const float M = last < 0 ? -PSA_INF : s_M[h], L = last < 0 ? 0.f : s_L[h];
        if (why >= 0) {
            out[(row0 + h) * PSA_D + d] = O / L;
        } else {
            float* vs = vstate + (row0 + h) * (7 + PSA_D);
            vs[7 + d] = O;
            if (d == 0) { vs[5] = M; vs[6] = L; }
        }
    };
#if PSA_SPEC_PIECES > 1
    // Pieces: K threads an output element where they fit, thread k adding pieces k, k + K, ... of each chunk; their
    // sums then added in k order.
    constexpr int E = PSA_G * PSA_D, K = E < PSA_VERIFY_THREADS ? PSA_VERIFY_THREADS / E : 1;
    __shared__ float s_part[K > 1 ? E * K : 1];
    for (int idx = threadIdx.x; idx < E * K; idx += blockDim.x) {
        const int e = idx / K, k = idx % K, h = e / PSA_D, d = e % PSA_D;
        const float* pr = partial + (row0 + h) * Cmax * P * PW;
        const float M = last < 0 ? -PSA_INF : s_M[h];
        float O = 0.f;
        if (M != -PSA_INF) {
            for (int c = 0; c <= last; ++c) {  // every piece of chunks 0 .. last
                const int pn = pieces_of(c);
#pragma unroll 8
                for (int p = k; p < pn; p += K) {
                    const float m = __ldcg(pr + (c * P + p) * PW + PSA_D);
                    const float o = __ldcg(pr + (c * P + p) * PW + d);
                    O += m == -PSA_INF ? 0.f : o * __expf(m - M);
                }
            }
        }
        if (K > 1) s_part[idx] = O;
        else put(h, d, O);
    }
    if (K > 1) {
        __syncthreads();
        for (int e = threadIdx.x; e < E; e += blockDim.x) {
            float O = 0.f;
#pragma unroll
            for (int k = 0; k < K; ++k) O += s_part[e * K + k];
            put(e / PSA_D, e % PSA_D, O);
        }
    }
#else
    for (int idx = threadIdx.x; idx < PSA_G * PSA_D; idx += blockDim.x) {
        const int h = idx / PSA_D, d = idx % PSA_D;
        const float* pr = partial + (row0 + h) * Cmax * P * PW;
        const float M = last < 0 ? -PSA_INF : s_M[h];
        float O = 0.f;
        if (M != -PSA_INF) {
#pragma unroll 8
            for (int c = 0; c <= last; ++c) {
                const float m = __ldcg(pr + c * PW + PSA_D);
                const float o = __ldcg(pr + c * PW + d);
                O += m == -PSA_INF ? 0.f : o * __expf(m - M);
            }
        }
        put(h, d, O);
    }
#endif
#if PSA_VERIFY_CLOCK
    __syncthreads();
    if (threadIdx.x == 0) {
        const long long t_end = clock64();
        long long* ck = clocks + gi * 8;
        ck[0] = t_end - t_start;
        ck[1] = c_first < 0 ? t_out - t_start : c_first;
        ck[2] = c_gather;
        ck[3] = c_scan;
        ck[4] = c_decide;
        ck[5] = t_end - t_out;
        ck[6] = windows;
        ck[7] = C;
    }
#endif
    if (warp < PSA_G && lane == 0) {
        if (why >= 0) {
            mass_est[row0 + warp] = ver.frac;
        } else {
            float* vs = vstate + (row0 + warp) * (7 + PSA_D);
            vs[0] = ver.M; vs[1] = ver.acc; vs[2] = ver.min; vs[3] = ver.ema; vs[4] = ver.frac;
        }
    }
    if (threadIdx.x == 0) {
        const int pos = last < 0 ? 0 : chunk_end(chunk_start(last, first, first2, step), first, first2, step, n);
        istate[gi * 4] = pos;
        istate[gi * 4 + 1] = last + 1;
        istate[gi * 4 + 2] = why;
        istate[gi * 4 + 3] = C == 0 ? 0 : chunk_end(chunk_start(C - 1, first, first2, step), first, first2, step, n);
        if (why >= 0) {
            num_used[gi] = pos;
            iterations[gi] = last + 1;
            reason[gi] = why;
        }
    }
}
