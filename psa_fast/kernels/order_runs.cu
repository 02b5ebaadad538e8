// Stage 2b on the GPU for short orders, in one launch: a group's blocks sorted in runs of 256 (one warp's, in
// registers, no barrier), then every block placed at its rank by binary search in the runs. It is psa_order_slice +
// psa_order_merge (slices of 512-1,024 keys sorted by a whole CTA, a second launch to merge) folded into one kernel:
// every CTA of a group sorts all of the group's runs (at most 8, one a warp) into shared memory and places the 256
// blocks of its own run. The comparisons are ~n log^2 256 a group where psa_order_rank's count is n^2 on the integer
// pipe: H100, 8 groups of 2,048 blocks 4.7 µs, where rank took 7.0 and the slices + merge 7.0 in two launches; one
// group 4.3 (rank 3.7), 64 groups 12.2 (one CTA a group's radix passes 10.4). Sharing the sorted runs instead, a
// group's CTAs a cluster reading each other's over DSMEM, lost (5.7 µs at 8 groups: the cluster's barriers and round
// trip cost more than the redundant sorts, which run on warps that would otherwise wait). benchmarks/NOTES.md,
// fifty-seventh session.
//
// The runs hold 32-bit words, not sort.cuh's 64-bit keys (the word, then the block index for ties): a compare-exchange
// is one min and one max (the first version sorted the keys: 5.5 µs at any group count, its ~1,500 instructions a
// warp the floor). Words as psa_order_rank's: orderable() of the score, 0xFFFFFFFF for sink and recent blocks, and 0
// past the group's n blocks. Block i of run m (word w) comes after every word above w, after the words equal to w of
// the runs before m (lower block indices) and, in its own run, after the equal words of lower index: a binary search
// a run counts the words above w (above w - 1 in the runs before m), and where its own run holds another word equal
// to w (ties: rare in real scores, the forced blocks' and the tests'), a scan of the run's lower indices counts them.
// Blocks past n take positions n .. (as many as they are: the positions their own indices name) and write -1 there.
//
//   scores   [B, Gn, Nmax] float (psa_estimate);  seq_lens [B] int
//   order    [B, Gn, Nmax] int out: block indices in processing order; -1 past the group's n blocks
// Launch: grid (ceil(Nmax / 256), Gn, B), 256 threads (PSA_WARPS 8), Nmax <= 2,048 (_kernels.RUNS_MAX_BLOCKS).
// PSA_L2_FIRST (common.cuh): the blocks placed among the decode's first ones have their K and V asked into L2.
#include "common.cuh"

#define PSA_RUN 256                // words a run (a warp's)
#define PSA_RUN_KPL (PSA_RUN / 32)  // words a lane, consecutive: word r of lane l is the run's word 8 l + r
static_assert(PSA_WARPS * 32 == PSA_RUN, "psa_order_runs: a CTA's threads place one run's blocks, one each");

// Sort the warp's 256 words (k: this lane's 8, blocked: word r of lane l is the run's e = 8 l + r) descending by the
// "flip" form of the bitonic network: merging two sorted halves of size kk / 2 compares e with e ^ (kk - 1) (the second
// half read backwards), then e with e ^ j for j = kk / 4 .. 1, and every compare-exchange keeps the larger word at the
// lower e. No stage has a direction to choose: distances below 8 are a min and a max within a lane, the others a
// shuffle with lane ^ (distance / 8) (the flip also reading the partner's slot 7 - r) and a min or a max.
__device__ __forceinline__ void warp_sort_desc(unsigned int (&k)[PSA_RUN_KPL], int lane) {
#pragma unroll
    for (int kk = 2; kk <= PSA_RUN; kk <<= 1) {
#pragma unroll
        for (int j = kk >> 1; j > 0; j >>= 1) {
            const int dist = j == kk >> 1 ? kk - 1 : j;  // the partner is e ^ dist
            if (dist < PSA_RUN_KPL) {
#pragma unroll
                for (int r = 0; r < PSA_RUN_KPL; ++r) {
                    const int rp = r ^ dist;
                    if (rp > r) {
                        const unsigned int a = k[r], c = k[rp];
                        k[r] = max(a, c);
                        k[rp] = min(a, c);
                    }
                }
            } else {
                const int lane_mask = dist / PSA_RUN_KPL, slot_mask = dist % PSA_RUN_KPL;  // slot_mask 7 or 0
                const bool lower = (lane & (j / PSA_RUN_KPL)) == 0;  // the pair's lower e: its highest differing bit
                unsigned int other[PSA_RUN_KPL];
#pragma unroll
                for (int r = 0; r < PSA_RUN_KPL; ++r)
                    other[r] = __shfl_xor_sync(0xffffffffu, k[r ^ slot_mask], lane_mask);
#pragma unroll
                for (int r = 0; r < PSA_RUN_KPL; ++r) k[r] = lower ? max(k[r], other[r]) : min(k[r], other[r]);
            }
        }
    }
}

// How many words of run which[q] of `runs` (each sorted descending) are above thr[q], the Q searches in lock-step (Q
// independent shared-memory loads a round): binary lifting over the first 255 positions, then one probe for the 256th
// (as psa_order_merge counts).
template <int Q>
__device__ __forceinline__ void count_above(const unsigned int (*runs)[PSA_RUN], const int (&which)[Q],
                                            const unsigned int (&thr)[Q], int (&c)[Q]) {
#pragma unroll
    for (int q = 0; q < Q; ++q) c[q] = 0;
#pragma unroll
    for (int half = PSA_RUN / 2; half > 0; half >>= 1)
#pragma unroll
        for (int q = 0; q < Q; ++q) {
            const int at = c[q] + half;
            c[q] = runs[which[q]][at - 1] > thr[q] ? at : c[q];
        }
#pragma unroll
    for (int q = 0; q < Q; ++q) c[q] += runs[which[q]][c[q]] > thr[q];
}

extern "C" __global__ void __launch_bounds__(PSA_WARPS * 32)
psa_order_runs(const float* __restrict__ scores, const int* __restrict__ seq_lens, int* __restrict__ order, int Nmax,
               int sink_blocks, int recent_blocks PSA_L2_FIRST_PARAMS) {
    __shared__ __align__(16) unsigned int runs[PSA_WARPS][PSA_RUN];   // the group's runs, each sorted descending
    __shared__ __align__(16) unsigned int words[PSA_RUN];  // this CTA's run (`mine`) by block index
    const int b = blockIdx.z, g = blockIdx.y, Gn = gridDim.y, mine = blockIdx.x;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const float* srow = scores + ((long)b * Gn + g) * Nmax;
    int* orow = order + ((long)b * Gn + g) * Nmax;

    // the warp's run of scores, requested before the request's length decides which are blocks (as load_keys)
    const int first = warp * PSA_RUN + lane * PSA_RUN_KPL;
    float x[PSA_RUN_KPL];
#pragma unroll
    for (int r = 0; r < PSA_RUN_KPL; ++r) x[r] = first + r < Nmax ? __ldg(srow + first + r) : 0.f;
#if PSA_L2_FIRST
    // the slot of the block this thread places (if any), asked for now: its load waits beside the sort's work
    const int own = mine * PSA_RUN + threadIdx.x;
    const int slot = own < Nmax ? __ldg(block_table + ((long)b * Gn + g) * Nmax + own) : 0;
#endif
    const int n = (seq_lens[b] + PSA_S - 1) / PSA_S;
    const int nruns = (n + PSA_RUN - 1) / PSA_RUN;
    // every warp sorts, whether or not its run holds blocks (the shuffles then need no divergence handling)
    unsigned int k[PSA_RUN_KPL];
#pragma unroll
    for (int r = 0; r < PSA_RUN_KPL; ++r) {
        const int i = first + r;
        k[r] = i >= n ? 0u : (i < sink_blocks || i >= n - recent_blocks) ? 0xFFFFFFFFu : orderable(x[r]);
    }
    if (warp == mine) {  // the only run whose blocks this CTA places
        uint4* wrow = reinterpret_cast<uint4*>(&words[lane * PSA_RUN_KPL]);
        wrow[0] = make_uint4(k[0], k[1], k[2], k[3]);
        wrow[1] = make_uint4(k[4], k[5], k[6], k[7]);
    }
    warp_sort_desc(k, lane);
    if (mine >= nruns) {  // positions past the group's runs (all >= n)
        const int p = mine * PSA_RUN + threadIdx.x;
        if (p < Nmax) orow[p] = -1;
        return;
    }
    uint4* rrow = reinterpret_cast<uint4*>(&runs[warp][lane * PSA_RUN_KPL]);
    rrow[0] = make_uint4(k[0], k[1], k[2], k[3]);
    rrow[1] = make_uint4(k[4], k[5], k[6], k[7]);
    __syncthreads();

    const int t = threadIdx.x, i = mine * PSA_RUN + t;
    if (i >= n) {  // padding: blocks n .. of the last run take positions n .., one each
        if (i < Nmax) orow[i] = -1;
        return;
    }
    // Every run's count at once (runs past the group's hold only zeros and count none), run `mine` twice: the words
    // above w and above w - 1 (from there on, the equal ones). Runs before `mine` count above w - 1 too.
    const unsigned int w = words[t];
    int which[PSA_WARPS + 1], c[PSA_WARPS + 1];
    unsigned int thr[PSA_WARPS + 1];
#pragma unroll
    for (int r = 0; r < PSA_WARPS; ++r) {
        which[r] = r;
        thr[r] = r < mine ? w - 1u : w;
    }
    which[PSA_WARPS] = mine;
    thr[PSA_WARPS] = w - 1u;
    count_above(runs, which, thr, c);
    int rank = 0, above = 0;
#pragma unroll
    for (int r = 0; r < PSA_WARPS; ++r) {
        rank += r < mine && w == 0u ? PSA_RUN : c[r];  // (w - 1 wrapped: all of the run)
        above = r == mine ? c[r] : above;
    }
    const int from = w == 0u ? PSA_RUN : c[PSA_WARPS];
    if (from - above > 1)  // another block of this run has the word: those of lower index come first
        for (int u = 0; u < t; ++u) rank += words[u] == w;
    orow[rank] = i;
#if PSA_L2_FIRST
    if (rank < l2_first) l2_ask_block(k_pool, v_pool, slot, tile_bytes);
#endif
}
