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
#include "runs.cuh"

static_assert(PSA_WARPS * 32 == PSA_RUN, "psa_order_runs: a CTA's threads place one run's blocks, one each");

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
    run_lane_order(k, lane);
    uint4* rrow = reinterpret_cast<uint4*>(&runs[warp][lane * PSA_RUN_KPL]);
    rrow[0] = make_uint4(k[0], k[1], k[2], k[3]);
    rrow[1] = make_uint4(k[4], k[5], k[6], k[7]);
    __syncthreads();

    const int t = threadIdx.x, i = mine * PSA_RUN + t;
    if (i >= n) {  // padding: blocks n .. of the last run take positions n .., one each
        if (i < Nmax) orow[i] = -1;
        return;
    }
    const int rank = run_rank<PSA_WARPS>(runs, words, t, mine);
    orow[rank] = i;
#if PSA_L2_FIRST
    if (rank < l2_first) l2_ask_block(k_pool, v_pool, slot, tile_bytes);
#endif
}
