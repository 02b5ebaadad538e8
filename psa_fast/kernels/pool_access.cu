// The GPU pool's policy (psa_fast.pool): GPUSlotPool.access as one CUDA C thread, the fast launch of
// the Numba kernel `_access_kernel` in psa_fast/pool.py, which is the readable twin tested against
// psa_ref in CI; this file must stay a line-for-line translation of it (tests/test_fast_pool.py
// checks both on the device). CuPy launches it in ~10 us, where Numba's dispatch of 24 arguments
// takes ~200 us on the host.
//
// State (see psa_fast/pool.py): slot_of [store ids], block_of/pin/load_seq [slots], nxt/prv
// [slots + P] (sentinel of partition p at slots + p), free [slots] (a stack per partition),
// free_top/epoch [P], seq [1], counters [4], error [1]. Outputs: slots/hit/load_src/load_dst/
// evicted [n], num_loads/num_evicted [1].

#define PSA_NO_VICTIM 1
#define PSA_BAD_ID 2
#define PSA_WRONG_PARTITION 3

__device__ __forceinline__ void unlink(int* nxt, int* prv, int node) {
    nxt[prv[node]] = nxt[node];
    prv[nxt[node]] = prv[node];
}

__device__ __forceinline__ void append(int* nxt, int* prv, int node, int sentinel) {
    const int tail = prv[sentinel];
    nxt[tail] = node;
    prv[node] = tail;
    nxt[node] = sentinel;
    prv[sentinel] = node;
}

extern "C" __global__ void psa_pool_access(
    const int* __restrict__ ids, int n, int p, int per, int lru, int pin_window, int num_slots, int num_store,
    int* slot_of, int* block_of, int* nxt, int* prv, const int* free, int* free_top, long long* pin,
    long long* epoch, long long* load_seq, long long* seq, long long* counters, int* error, int* slots,
    signed char* hit, int* load_src, int* load_dst, int* num_loads, int* evicted, int* num_evicted) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    const int sentinel = num_slots + p;
    const long long e = epoch[p] + 1;
    epoch[p] = e;
    const long long oldest_pinned = e - pin_window + 1;
    for (int i = 0; i < n; ++i) {  // the reference pins every block the access names before the loop
        const int b = ids[i];
        if (b >= 0 && b < num_store) {
            const int s = slot_of[b];
            if (s >= 0 && s / per == p) pin[s] = e;
        }
    }
    int num_free = free_top[p];
    long long next_seq = seq[0];
    int hits = 0, loads = 0, evictions = 0;
    bool failed = false;
    for (int i = 0; i < n; ++i) {
        const int b = ids[i];
        slots[i] = -1;
        hit[i] = -1;
        if (failed || b == -1) continue;
        if (b < -1 || b >= num_store) {
            error[0] = PSA_BAD_ID;
            failed = true;
            continue;
        }
        int s = slot_of[b];
        if (s >= 0) {
            if (s / per != p) {
                error[0] = PSA_WRONG_PARTITION;
                failed = true;
                continue;
            }
            hit[i] = 1;
            ++hits;
            if (lru) {
                unlink(nxt, prv, s);
                append(nxt, prv, s, sentinel);
            }
        } else {
            if (num_free > 0) {
                --num_free;
                s = free[p * per + num_free];
            } else {
                s = nxt[sentinel];
                while (s != sentinel && pin[s] >= oldest_pinned) s = nxt[s];
                if (s == sentinel) {
                    error[0] = PSA_NO_VICTIM;
                    failed = true;
                    continue;
                }
                unlink(nxt, prv, s);
                const int victim = block_of[s];
                slot_of[victim] = -1;
                evicted[evictions++] = victim;
            }
            slot_of[b] = s;
            block_of[s] = b;
            append(nxt, prv, s, sentinel);
            load_seq[s] = next_seq++;
            load_src[loads] = b;
            load_dst[loads] = s;
            ++loads;
            hit[i] = 0;
        }
        pin[s] = e;
        slots[i] = s;
    }
    free_top[p] = num_free;
    seq[0] = next_seq;
    counters[0] += hits;
    counters[1] += loads;
    counters[2] += evictions;
    counters[3] += loads;
    num_loads[0] = loads;
    num_evicted[0] = evictions;
}
