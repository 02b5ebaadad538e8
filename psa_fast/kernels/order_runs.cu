// Stage 2b on the GPU for short orders, in one launch: a group's blocks sorted in runs of 256 keys (one warp's, in
// registers, no barrier), then every block placed at its rank by binary search in the other runs. It is
// psa_order_slice + psa_order_merge (slices of 512-1,024 keys sorted by a whole CTA, a second launch to merge) folded
// into one kernel: every CTA of a group sorts all of the group's runs (at most 8, one a warp) into shared memory and
// places the 256 keys of its own run. The comparisons are ~n log n a group where psa_order_rank's count is n^2 on
// the integer pipe (7.5 µs for 8 groups of 2,048 blocks, the slices + merge 7.3 in two launches; H100,
// benchmarks/NOTES.md, fifty-seventh session).
//
// Keys as in sort.cuh: the high word the block's score as an orderable integer (0xFFFFFFFF for sink and recent
// blocks), the low word 0xFFFFFFFF - block, so keys are unique and a descending order breaks ties by the lower block
// index (psa_ref.scoring.processing_order). Padding keys (blocks n .. of the last run) are (0, 0xFFFFFFFF - block):
// unique too, below every block's key, so they take the positions n .., where they write -1.
//
// A key's rank is the number of keys above it: in its own run its position there, in another run a binary search
// (eight keys a lane searched at once, eight independent shared-memory loads a round, as psa_order_merge does).
// Warp w searches run w for all 256 keys of the CTA's run; the counts meet in shared memory.
//
//   scores   [B, Gn, Nmax] float (psa_estimate);  seq_lens [B] int
//   order    [B, Gn, Nmax] int out: block indices in processing order; -1 past the group's n blocks
// Launch: grid (ceil(Nmax / 256), Gn, B), 256 threads (PSA_WARPS 8), Nmax <= 2,048 (_kernels.RUNS_MAX_BLOCKS).
#include "sort.cuh"

#define PSA_RUN 256                // keys a run (a warp's)
#define PSA_RUN_KPL (PSA_RUN / 32)  // keys a lane, consecutive: key r of lane l is the run's key 8 l + r
static_assert(PSA_WARPS * 32 == PSA_RUN, "psa_order_runs: a CTA's threads place one run's keys, one each");

// Sort the warp's 256 keys (k: this lane's 8, blocked: key r of lane l is the run's key e = 8 l + r) descending by
// the "flip" form of the bitonic network: merging two sorted halves of size kk / 2 compares e with e ^ (kk - 1) (the
// second half read backwards), then e with e ^ j for j = kk / 4 .. 1, and every compare-exchange keeps the larger key
// at the lower e. No stage has a direction to choose (sort.cuh's block_sort_desc alternates them): distances below 8
// are compare-exchanges within a lane, the others shuffles with lane ^ (distance / 8), the flip also reading the
// partner's slot 7 - r.
__device__ __forceinline__ void warp_sort_desc(u64 (&k)[PSA_RUN_KPL], int lane) {
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
                        const u64 a = k[r], c = k[rp];
                        const bool swap = c > a;
                        k[r] = swap ? c : a;
                        k[rp] = swap ? a : c;
                    }
                }
            } else {
                const int lane_mask = dist / PSA_RUN_KPL, slot_mask = dist % PSA_RUN_KPL;  // slot_mask 7 or 0
                const bool lower = (lane & (j / PSA_RUN_KPL)) == 0;  // the pair's lower e: its highest differing bit
                u64 other[PSA_RUN_KPL];
#pragma unroll
                for (int r = 0; r < PSA_RUN_KPL; ++r) other[r] = shfl_xor64(k[r ^ slot_mask], lane_mask);
#pragma unroll
                for (int r = 0; r < PSA_RUN_KPL; ++r)  // the keys are unique: never equal
                    k[r] = (other[r] > k[r]) == lower ? other[r] : k[r];
            }
        }
    }
}

extern "C" __global__ void __launch_bounds__(PSA_WARPS * 32)
psa_order_runs(const float* __restrict__ scores, const int* __restrict__ seq_lens, int* __restrict__ order, int Nmax,
               int sink_blocks, int recent_blocks) {
    __shared__ __align__(16) u64 runs[PSA_WARPS][PSA_RUN];  // the group's runs, each sorted descending
    __shared__ int part[PSA_WARPS][PSA_RUN];                // run w's count of keys above each of the CTA's keys
    const int b = blockIdx.z, g = blockIdx.y, Gn = gridDim.y, mine = blockIdx.x;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const float* srow = scores + ((long)b * Gn + g) * Nmax;
    int* orow = order + ((long)b * Gn + g) * Nmax;

    // the warp's run of scores, requested before the request's length decides which are keys (as load_keys)
    const int first = warp * PSA_RUN + lane * PSA_RUN_KPL;
    float x[PSA_RUN_KPL];
#pragma unroll
    for (int r = 0; r < PSA_RUN_KPL; ++r) x[r] = first + r < Nmax ? __ldg(srow + first + r) : 0.f;
    const int n = (seq_lens[b] + PSA_S - 1) / PSA_S;
    const int nruns = (n + PSA_RUN - 1) / PSA_RUN;
    // every warp sorts, whether or not its run holds blocks (the shuffles then need no divergence handling)
    u64 k[PSA_RUN_KPL];
#pragma unroll
    for (int r = 0; r < PSA_RUN_KPL; ++r) {
        const int i = first + r;
        unsigned int hi = 0u;
        if (i < n) hi = (i < sink_blocks || i >= n - recent_blocks) ? 0xFFFFFFFFu : orderable(x[r]);
        k[r] = ((u64)hi << 32) | (0xFFFFFFFFu - (unsigned int)i);
    }
    warp_sort_desc(k, lane);
    if (mine >= nruns) {  // positions past the group's runs (all >= n)
        const int p = mine * PSA_RUN + threadIdx.x;
        if (p < Nmax) orow[p] = -1;
        return;
    }
#pragma unroll
    for (int r = 0; r < PSA_RUN_KPL; ++r) runs[warp][lane * PSA_RUN_KPL + r] = k[r];
    __syncthreads();

    if (warp < nruns) {  // run `warp`'s count above each key of run `mine`: lane l takes keys l, l + 32, ...
        const u64* run = runs[warp];
        u64 key[PSA_RUN_KPL];
        int count[PSA_RUN_KPL];
#pragma unroll
        for (int q = 0; q < PSA_RUN_KPL; ++q) {
            key[q] = runs[mine][lane + 32 * q];
            count[q] = 0;
        }
        if (warp == mine) {  // keys are unique: a key's position in its own run is its count there
#pragma unroll
            for (int q = 0; q < PSA_RUN_KPL; ++q) count[q] = lane + 32 * q;
        } else {
            // binary lifting over the first 255 positions (run[count + half - 1] > key: count + half keys above), then
            // one probe for the 256th
#pragma unroll
            for (int half = PSA_RUN / 2; half > 0; half >>= 1)
#pragma unroll
                for (int q = 0; q < PSA_RUN_KPL; ++q) {
                    const int at = count[q] + half;
                    count[q] = run[at - 1] > key[q] ? at : count[q];
                }
#pragma unroll
            for (int q = 0; q < PSA_RUN_KPL; ++q) count[q] += run[count[q]] > key[q];
        }
#pragma unroll
        for (int q = 0; q < PSA_RUN_KPL; ++q) part[warp][lane + 32 * q] = count[q];
    }
    __syncthreads();

    const int t = threadIdx.x;
    int rank = 0;
    for (int w = 0; w < nruns; ++w) rank += part[w][t];
    const int block = (int)(0xFFFFFFFFu - (unsigned int)(runs[mine][t] & 0xFFFFFFFFull));
    if (block < n) orow[rank] = block;
    else if (rank < Nmax) orow[rank] = -1;  // padding: ranks n .. nruns * 256 - 1
}
