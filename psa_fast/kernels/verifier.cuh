// The schedule of Algorithm 1's loop (which positions of the order each chunk holds) and its verifier,
// one head at a time: fold one chunk's statistics into the head's state and say whether the stop rule
// holds after it. The progressive loop of decode.cu and the
// speculative schedule's verification (spec.cu) both call verify_step, so they decide by the same
// arithmetic.
#pragma once
#include "common.cuh"

// The end of the chunk that holds position x of the order: forced blocks [0, first) form the first
// chunk, ranked positions [first, first2) the next (first_chunk; none when first2 == first), then
// chunks of `step`.
__device__ __forceinline__ int chunk_end(int x, int first, int first2, int step, int n) {
    const int e = x < first ? first : x < first2 ? first2 : first2 + ((x - first2) / step + 1) * step;
    return min(e, n);
}

// The first position of chunk c (the schedule of chunk_end: forced, first ranked, then `step` at a time).
__device__ __forceinline__ int chunk_start(int c, int first, int first2, int step) {
    const int nf = first > 0, n2 = first2 > first;
    return c < nf ? 0 : c < nf + n2 ? first : first2 + (c - nf - n2) * step;
}

// The number of chunks that start before position x.
__device__ __forceinline__ int chunks_before(int x, int first, int first2, int step) {
    const int nf = first > 0, n2 = first2 > first;
    if (x <= 0) return 0;
    if (x <= first) return nf;
    if (x <= first2) return nf + n2;
    return nf + n2 + (x - first2 + step - 1) / step;
}

// Pieces (DecodePlan(speculate="first_chunk"), PSA_SPEC_PIECES = the most a chunk): a group's forced chunk is one
// CTA's, and its first ranked chunk, of w blocks, is cut into P contiguous pieces of w / P blocks (rounded down at
// each cut), each a CTA's. With `extra` >= 0 the groups share the launch's CTAs by their blocks: P = 1 + extra w / W
// (rounded down; W every group's w, `extra` the CTAs past one a group), so the busiest group's pieces are no longer
// than the rest; with `extra` < 0 every group takes `pmax`. Never more pieces than blocks, nor more than `pmax`. The
// attend (psa_decode's PSA_SPEC build) and the verifier (psa_spec_verify) compute the same counts from the same
// integers.
__device__ __forceinline__ int spec_ranked_blocks(const int* __restrict__ first_len, const int* __restrict__ seq_lens,
                                                  long gi, int Gn, int forced) {
    const int n = (__ldg(seq_lens + gi / Gn) + PSA_S - 1) / PSA_S, first = min(n, forced);
    return min(n, first + __ldg(first_len + gi)) - first;
}

__device__ __forceinline__ int spec_pieces_of(int w, long long total, int extra, int pmax) {
    const int p = extra < 0 ? pmax : 1 + (total > 0 ? (int)((long long)extra * w / total) : 0);
    return max(1, min(min(p, pmax), w));
}

// Every group's ranked blocks of its first chunk, summed over the warp's lanes (each lane a stride of the groups; the
// sum returned in every lane). Called by one whole warp.
__device__ __forceinline__ long long spec_blocks_total(const int* __restrict__ first_len,
                                                       const int* __restrict__ seq_lens, int groups, int Gn,
                                                       int forced) {
    long long total = 0;
    for (int gi = threadIdx.x & 31; gi < groups; gi += 32)
        total += spec_ranked_blocks(first_len, seq_lens, gi, Gn, forced);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) total += __shfl_xor_sync(0xffffffffu, total, o);
    return total;
}

// The first position of piece `piece` of P in a chunk of n positions (piece P: n).
__device__ __forceinline__ int spec_piece_start(int piece, int pieces, int n) {
    return (int)((long long)piece * n / pieces);
}

// Merge two shares of a chunk's statistics (max logit, mass and EMA terms relative to it, min log
// block mass): a cluster's CTAs in rank order, a speculated chunk's pieces in piece order. Every warp that merges
// the same shares in the same order gets the same bits.
__device__ __forceinline__ float4 combine_stats(float4 a, float4 b) {
    const float nm = fmaxf(a.x, b.x);
    if (nm == -PSA_INF) return make_float4(nm, 0.f, fminf(a.z, b.z), 0.f);
    const float ea = __expf(a.x - nm), eb = __expf(b.x - nm);
    return make_float4(nm, a.y * ea + b.y * eb, fminf(a.z, b.z), a.w * ea + b.w * eb);
}

// Per head: the running max logit M, the attended mass AS_acc relative to M, the log of the lightest
// attended block's mass (AS_min = exp(min - M)), the moving average AS_ema relative to M (stop = ema),
// and the rule's estimated attended fraction AS_acc / (AS_acc + rest).
struct Verifier {
    float M, acc, min, ema, frac;
};

__device__ __forceinline__ Verifier verifier_start() { return Verifier{-PSA_INF, 0.f, PSA_INF, 0.f, 0.f}; }

// The rule's decision on a head's state `v` after a chunk that ends at position `end` of the order: sets
// v.frac, the estimated attended fraction, and returns whether the rule holds. `log_tail` is log_suffix at
// `end` (stop = certified, sketch, sketch_avg: the bounds' or the estimates' log-sum-exp over the
// unattended positions); the sketch rules also take the window's log true mass and log sketch mass and
// the next block's log sketch mass. (The caller adds: every head of the group, and not when `end` reached n.)
__device__ __forceinline__ bool verifier_decide(Verifier& v, int end, int first, int n, int stop, float threshold,
                                                float log_tail, float w_true, float w_sketch, float next_sketch,
                                                float next_share) {
    float rest = 0.f;
    if (stop == PSA_STOP_EMA) rest = (float)(n - end) * v.ema;
    else if (stop == PSA_STOP_REMAINING) rest = (float)(n - end) * __expf(v.min - v.M);
    else if (stop == PSA_STOP_SEED) rest = __expf(v.min - v.M);
    else if (stop == PSA_STOP_CERTIFIED) rest = __expf(log_tail - v.M);
    bool next_small = true;
    if (stop == PSA_STOP_SKETCH || stop == PSA_STOP_SKETCH_AVG) {
        // rest = kappa sum_unseen p_j = (sum_W m_j) exp(lse_unseen - lse_W); infinite while no ranked
        // block has been attended; the next block's sketch mass must be a small share
        rest = end <= first ? (end < n ? PSA_INF : 0.f) : __expf(w_true - v.M + log_tail - w_sketch);
        next_small = __expf(next_sketch - v.M) < next_share * (v.acc + rest);
    }
    v.frac = v.acc / (v.acc + rest);
    return v.frac >= threshold && next_small;
}

// Fold a chunk of `clen` blocks that ends at position `end` of the order into `v`: its largest logit
// tm, its mass relative to tm (ts), its lightest block's log-mass (tmin) and its moving-average terms
// relative to tm (te); then decide (verifier_decide).
__device__ __forceinline__ bool verify_step(Verifier& v, float tm, float ts, float tmin, float te, int clen, int end,
                                            int first, int n, int stop, float threshold, float log_keep,
                                            float log_tail, float w_true, float w_sketch, float next_sketch,
                                            float next_share) {
    const float nM = fmaxf(v.M, tm);
    const float a = __expf(v.M - nM), e = __expf(tm - nM);
    v.acc = v.acc * a + ts * e;
    v.ema = v.ema * a * __expf(clen * log_keep) + te * e;  // 0 * ... before the first chunk
    v.M = nM;
    v.min = fminf(v.min, tmin);
    return verifier_decide(v, end, first, n, stop, threshold, log_tail, w_true, w_sketch, next_sketch, next_share);
}

// stop = sketch / sketch_avg: per head of the group (rows row0 .. row0 + PSA_G - 1 of `lmass` and
// `ordered`, [.., Nmax] each), log sums over the calibration window (the last `window` ranked positions before
// `end`, one per lane; window <= 32) of the attended blocks' true masses and of their sketch masses
// n_j exp(s_j), and the log sketch mass of the block at position `end` (the next one). Both arrays are by
// position of the order: `lmass` as the attend wrote it, `ordered` as psa_order_suffix did (log n_j + s_j,
// j = order[i]). Called by a whole warp; every lane gets the same bits. In two parts, so that a caller can issue
// the loads early and reduce later (decode.cu's PSA_DECIDE_OVERLAP): sketch_window_load, then sketch_window_reduce.
__device__ __forceinline__ void sketch_window_load(const float* __restrict__ lmass, const float* __restrict__ ordered,
                                                   long row0, int Nmax, int first, int end, int n, int window,
                                                   float (&x)[2 * PSA_G], float (&next_sketch)[PSA_G]) {
    // Every load is made (at positions clamped into the row) and masked after, so that none waits on a branch:
    // the lanes' loads of all heads go out together, none behind another. x: the lane's true masses of the heads,
    // then their sketch masses (-inf outside the window).
    const int p = max(first, end - window) + (int)(threadIdx.x & 31);
    const bool in_w = p < end, has_next = end < n;
    const int pc = in_w ? p : max(0, end - 1), ec = has_next ? end : max(0, n - 1);
#pragma unroll
    for (int h = 0; h < PSA_G; ++h) {
        const long row = (row0 + h) * Nmax;
        const float lt = __ldcg(lmass + row + pc), es = __ldg(ordered + row + pc), en = __ldg(ordered + row + ec);
        x[h] = in_w ? lt : -PSA_INF;
        x[PSA_G + h] = in_w ? es : -PSA_INF;
        next_sketch[h] = has_next ? en : -PSA_INF;
    }
}

__device__ __forceinline__ void sketch_window_reduce(const float (&x)[2 * PSA_G], float (&w_true)[PSA_G],
                                                     float (&w_sketch)[PSA_G]) {
    float sums[2 * PSA_G];  // heads' true masses, then their sketch masses: one interleaved reduction
    warp_logsumexp(x, sums);
#pragma unroll
    for (int h = 0; h < PSA_G; ++h) {
        w_true[h] = sums[h];
        w_sketch[h] = sums[PSA_G + h];
    }
}

__device__ __forceinline__ void sketch_window_sums(const float* __restrict__ lmass, const float* __restrict__ ordered,
                                                   long row0, int Nmax, int first, int end, int n, int window,
                                                   float (&w_true)[PSA_G], float (&w_sketch)[PSA_G],
                                                   float (&next_sketch)[PSA_G]) {
    float x[2 * PSA_G];
    sketch_window_load(lmass, ordered, row0, Nmax, first, end, n, window, x, next_sketch);
    sketch_window_reduce(x, w_true, w_sketch);
}
