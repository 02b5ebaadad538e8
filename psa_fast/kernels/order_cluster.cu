// Stage 2b on the GPU for one request of a long cache: the two-kernel sort (psa_order_slice, then psa_order_merge)
// in one launch. A group's P = PSA_CLUSTER CTAs are a thread-block cluster; CTA p sorts slice p of PSA_SN keys
// (sort.cuh, keys as in psa_order) and leaves it at slice p of its shared memory; after a cluster barrier every CTA
// copies the other P - 1 sorted slices into its own shared memory through distributed shared memory, and gives each
// of its keys its rank: its position in its slice plus each other slice's count of larger keys, found by binary
// lifting in shared memory (psa_order_merge lifts through L2, one dependent round trip a step; probing the other
// slices in place through distributed shared memory instead of copying them was 2.5x slower: benchmarks/NOTES.md),
// then writes the key's block there. Faster than the two kernels only while every group's cluster is resident at
// once (_kernels.order_cost_us): one request of one to three groups at 8,192 blocks, of eight at 4,096. Keys are
// unique but for the zero padding, so the ranks are a permutation.
//
//   scores   [B, Gn, Nmax] float (from psa_estimate)
//   order    [B, Gn, Nmax] int out: block indices in processing order; -1 past the group's N_b blocks
//   grid (P, Gn, B), clusters of P; dynamic shared memory: P * PSA_SN keys (8 bytes each)
#include "sort.cuh"

#define PSA_ALL (PSA_CLUSTER * PSA_SN)  // keys of a group: every slice
static_assert(PSA_CLUSTER > 1 && (PSA_ALL / 2) % PSA_SORT_THREADS == 0, "a cluster of slices, whole pairs a thread");

// Two keys at `local_ptr` in the shared memory of CTA `rank` of this cluster (one 16-byte load).
__device__ __forceinline__ void dsmem_load_pair(const u64* local_ptr, unsigned int rank, u64& a, u64& b) {
    asm volatile("ld.shared::cluster.v2.u64 {%0, %1}, [%2];" : "=l"(a), "=l"(b) : "r"(dsmem_addr(local_ptr, rank)));
}

extern "C" __global__ void __cluster_dims__(PSA_CLUSTER, 1, 1) __launch_bounds__(PSA_SORT_THREADS)
psa_order_cluster(const float* __restrict__ scores, const int* __restrict__ seq_lens, int* __restrict__ order,
                  int Nmax, int sink_blocks, int recent_blocks) {
    extern __shared__ __align__(16) u64 slices[];  // PSA_ALL keys: slice q at q * PSA_SN
    const int b = blockIdx.z, g = blockIdx.y, Gn = gridDim.y;
    const int p = (int)cluster_rank();
    const int n = (seq_lens[b] + PSA_S - 1) / PSA_S;
    const float* srow = scores + ((long)b * Gn + g) * Nmax;
    const int tid = threadIdx.x;

    u64 k[PSA_KPT];
    load_keys(k, srow, n, p * PSA_SN, sink_blocks, recent_blocks);
    u64* mine = slices + p * PSA_SN;
    block_sort_desc(k, mine);  // (its exchange buffer: this CTA's slice, free again after the sort's last barrier)
#pragma unroll
    for (int r = 0; r < PSA_KPT; ++r) mine[tid * PSA_KPT + r] = k[r];
    cluster_sync();  // every slice sorted, in its CTA's shared memory

    // The other slices, copied in: pair i of the group's keys (slice 2 i / PSA_SN), all loads issued before any store.
    constexpr int PAIRS = PSA_ALL / 2 / PSA_SORT_THREADS;  // pairs a thread copies (its own slice's skipped)
    u64 lo[PAIRS], hi[PAIRS];
#pragma unroll
    for (int j = 0; j < PAIRS; ++j) {
        const int i = tid + j * PSA_SORT_THREADS, q = 2 * i / PSA_SN;
        if (q != p) dsmem_load_pair(slices + 2 * i, q, lo[j], hi[j]);
    }
#pragma unroll
    for (int j = 0; j < PAIRS; ++j) {
        const int i = tid + j * PSA_SORT_THREADS, q = 2 * i / PSA_SN;
        if (q != p) {
            slices[2 * i] = lo[j];
            slices[2 * i + 1] = hi[j];
        }
    }
    // This CTA is done reading the others' shared memory; it waits for them to be done with its own before it leaves.
    asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
    __syncthreads();  // every slice in this CTA's shared memory

    int* orow = order + ((long)b * Gn + g) * Nmax;
    for (int e = p * PSA_SN + tid; e < (p + 1) * PSA_SN; e += PSA_SORT_THREADS)
        if (e >= n && e < Nmax) orow[e] = -1;
#pragma unroll
    for (int r = 0; r < PSA_KPT; ++r) {
        const u64 key = k[r];
        if (key == 0ull) continue;  // padding
        // Each other slice's count of keys above `key`, all slices' lifting interleaved: the count is found among
        // the first PSA_SN - 1 positions by halves PSA_SN / 2 .. 1 (s[q][c] = slice q's key c - 1), then one probe
        // decides whether it is PSA_SN.
        int count[PSA_CLUSTER];
#pragma unroll
        for (int q = 0; q < PSA_CLUSTER; ++q) count[q] = 0;
#pragma unroll
        for (int half = PSA_SN >> 1; half > 0; half >>= 1)
#pragma unroll
            for (int q = 0; q < PSA_CLUSTER; ++q) {
                const int at = count[q] + half;
                if (q != p) count[q] = slices[q * PSA_SN + at - 1] > key ? at : count[q];
            }
        int rank = tid * PSA_KPT + r;  // its position in its own slice
#pragma unroll
        for (int q = 0; q < PSA_CLUSTER; ++q)
            if (q != p) rank += count[q] + (slices[q * PSA_SN + count[q]] > key);
        orow[rank] = (int)(0xFFFFFFFFu - (unsigned int)(key & 0xFFFFFFFFull));
    }
    asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
}
