// Stage 2b on the GPU for short orders, in one launch: a group's blocks sorted in runs of 256 (one warp's, in
// registers, no barrier), then every block placed at its rank by binary search in the runs. It is psa_order_slice +
// psa_order_merge (slices of 512-1,024 keys sorted by a whole CTA, a second launch to merge) folded into one kernel.
// A group is a cluster of one CTA a run (up to 8: 2,048 blocks): each CTA's first warp sorts its run into shared
// memory, the cluster's barrier makes the runs visible, every CTA copies all of them from its peers' shared memory
// (DSMEM) and places the 256 blocks of its own run, two a thread. The comparisons are ~n log^2 256 a group where
// psa_order_rank's count is n^2 on the integer pipe (H100, 8 groups of 2,048 blocks: rank 7.0 µs, slices + merge 7.0
// in two launches; benchmarks/NOTES.md, fifty-seventh session).
//
// The runs hold 32-bit words, not sort.cuh's 64-bit keys (the word, then the block index for ties): a compare-exchange
// is one min and one max. Words as psa_order_rank's: orderable() of the score, 0xFFFFFFFF for sink and recent blocks,
// and 0 past the group's n blocks. Block i of run m (word w) comes after every word above w, after the words equal to
// w of the runs before m (lower block indices) and, in its own run, after the equal words of lower index: a binary
// search a run counts the words above w (above w - 1 in the runs before m), and where its own run holds another word
// equal to w (ties: rare in real scores, the forced blocks' and the tests'), a scan of the run's lower indices counts
// them. Blocks past n take positions n .. (as many as they are: the positions their own indices name) and write -1.
// (Versions: 1 sorted 64-bit keys, every CTA of a group all its runs: 5.5 µs at any group count; 2 sorted words; 3 ran
// a thread's nine searches in lock-step, 4.7 µs for 8 groups of 2,048, but 12.2 for 64, where every CTA sorting all of
// its group's runs was 8 times the work; 4 shares them in a cluster.)
//
//   scores   [B, Gn, Nmax] float (psa_estimate);  seq_lens [B] int
//   order    [B, Gn, Nmax] int out: block indices in processing order; -1 past the group's n blocks
// Launch: grid (PSA_CLUSTER, Gn, B) in clusters of PSA_CLUSTER = ceil(Nmax / 256) <= 8 CTAs (RUNS_MAX_BLOCKS),
// PSA_WARPS * 32 threads (a divisor of 256).
#include "common.cuh"

#define PSA_RUN 256                // words a run (a CTA's, sorted by its first warp)
#define PSA_RUN_KPL (PSA_RUN / 32)  // words a lane, consecutive: word r of lane l is the run's word 8 l + r
#define PSA_RUNS_MAX 8              // runs a group (the cluster's CTAs)
#define PSA_RUN_KPT (PSA_RUN / (PSA_WARPS * 32))  // blocks a thread places
static_assert(PSA_RUN % (PSA_WARPS * 32) == 0, "psa_order_runs: a CTA's threads place its run's blocks evenly");
static_assert(PSA_CLUSTER <= PSA_RUNS_MAX, "psa_order_runs: a group of at most 8 runs (2,048 blocks)");

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

extern "C" __global__ void
#if PSA_CLUSTER > 1
__cluster_dims__(PSA_CLUSTER, 1, 1)
#endif
__launch_bounds__(PSA_WARPS * 32)
psa_order_runs(const float* __restrict__ scores, const int* __restrict__ seq_lens, int* __restrict__ order, int Nmax,
               int sink_blocks, int recent_blocks) {
    __shared__ __align__(16) unsigned int runs[PSA_RUNS_MAX][PSA_RUN];  // the group's runs, each sorted descending
    __shared__ __align__(16) unsigned int mine_sorted[PSA_RUN];         // this CTA's run, for its peers to copy
    __shared__ __align__(16) unsigned int words[PSA_RUN];               // this CTA's run by block index
    const int b = blockIdx.z, g = blockIdx.y, Gn = gridDim.y;
    const int mine = cluster_rank();  // = blockIdx.x: the grid's x is one cluster
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const float* srow = scores + ((long)b * Gn + g) * Nmax;
    int* orow = order + ((long)b * Gn + g) * Nmax;
    const int n = (seq_lens[b] + PSA_S - 1) / PSA_S;

    if (warp == 0) {  // the run's scores, then its words sorted by this warp
        const int first = mine * PSA_RUN + lane * PSA_RUN_KPL;
        float x[PSA_RUN_KPL];
#pragma unroll
        for (int r = 0; r < PSA_RUN_KPL; ++r) x[r] = first + r < Nmax ? __ldg(srow + first + r) : 0.f;
        unsigned int k[PSA_RUN_KPL];
#pragma unroll
        for (int r = 0; r < PSA_RUN_KPL; ++r) {
            const int i = first + r;
            k[r] = i >= n ? 0u : (i < sink_blocks || i >= n - recent_blocks) ? 0xFFFFFFFFu : orderable(x[r]);
        }
        uint4* wrow = reinterpret_cast<uint4*>(&words[lane * PSA_RUN_KPL]);
        wrow[0] = make_uint4(k[0], k[1], k[2], k[3]);
        wrow[1] = make_uint4(k[4], k[5], k[6], k[7]);
        warp_sort_desc(k, lane);
        uint4* srun = reinterpret_cast<uint4*>(&mine_sorted[lane * PSA_RUN_KPL]);
        srun[0] = make_uint4(k[0], k[1], k[2], k[3]);
        srun[1] = make_uint4(k[4], k[5], k[6], k[7]);
    }
    cluster_sync();  // every CTA's run written (release / acquire over the cluster)
    // every run of the group, from its CTA's shared memory (runs past the cluster's, never read, stay unset)
    for (int idx = threadIdx.x; idx < PSA_CLUSTER * PSA_RUN / 4; idx += PSA_WARPS * 32) {
        const int r = idx / (PSA_RUN / 4), c = idx % (PSA_RUN / 4);
        const float4 v = dsmem_load4(reinterpret_cast<const float4*>(mine_sorted) + c, r);
        reinterpret_cast<float4*>(runs[r])[c] = v;
    }
#if PSA_CLUSTER > 1
    // this CTA has read its peers' runs; it waits for theirs to have read its own before it exits (below)
    asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
#endif
    __syncthreads();

#pragma unroll
    for (int u = 0; u < PSA_RUN_KPT; ++u) {
        const int t = threadIdx.x + u * PSA_WARPS * 32, i = mine * PSA_RUN + t;
        // past the group's runs (a CTA whose run holds no block), or padding of the last: positions n .., one each
        if (i >= n) {
            if (i < Nmax) orow[i] = -1;
            continue;
        }
        // every run's count at once (runs past the group's hold only zeros and count none), run `mine` twice: the
        // words above w and above w - 1 (from there on, the equal ones); runs before `mine` count above w - 1 too
        const unsigned int w = words[t];
        int which[PSA_CLUSTER + 1], c[PSA_CLUSTER + 1];
        unsigned int thr[PSA_CLUSTER + 1];
#pragma unroll
        for (int r = 0; r < PSA_CLUSTER; ++r) {
            which[r] = r;
            thr[r] = r < mine ? w - 1u : w;
        }
        which[PSA_CLUSTER] = mine;
        thr[PSA_CLUSTER] = w - 1u;
        count_above(runs, which, thr, c);
        int rank = 0, above = 0;
#pragma unroll
        for (int r = 0; r < PSA_CLUSTER; ++r) {
            rank += r < mine && w == 0u ? PSA_RUN : c[r];  // (w - 1 wrapped: all of the run)
            above = r == mine ? c[r] : above;
        }
        const int from = w == 0u ? PSA_RUN : c[PSA_CLUSTER];
        if (from - above > 1)  // another block of this run has the word: those of lower index come first
            for (int v = 0; v < t; ++v) rank += words[v] == w;
        orow[rank] = i;
    }
#if PSA_CLUSTER > 1
    asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
#endif
}
