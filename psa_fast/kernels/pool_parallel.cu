// The GPU pool's policy, parallel (psa_fast.pool, kernel="parallel"): the same decisions as the
// sequential kernels (pool_access.cu and the Numba twin in pool.py) for every valid access, in three
// launches whose cost grows with the ids named, not with their dependent chain of list updates:
//
//   psa_pool_probe    (grid, one thread per id)  pins the resident blocks named, lets each missing
//                     block be claimed by its first occurrence, finds the first bad id, and (when
//                     the log must be compacted) counts its live entries per tile;
//   psa_pool_compact  (grid, one CTA per tile)   when the log must be compacted: copies its live
//                     entries, in order, into the log's other buffer;
//   psa_pool_parallel (one CTA)                  the decisions that are sequential by nature: misses
//                     in access order, free slots, victims; an access with no miss only does the
//                     bookkeeping;
//   psa_pool_finish   (grid, one thread per id)  every id's slot and hit, its LRU stamp, its log entry.
//
// The policy order is kept as stamps instead of a linked list: stamp[slot] is the time of the
// block's last access (LRU) or of its load (FIFO), from a clock that advances by n per access, so
// sorting resident slots by stamp gives the reference's eviction order. To find victims without
// sorting, each partition keeps a log of (slot, stamp) entries in stamp order (a ring of C
// entries): an access appends one entry per id; an entry is live while its slot still holds a
// block with that stamp, so touching a block makes its older entries dead without finding them.
// Victims are the first live, unpinned entries from the log's head; the head then moves past the
// dead and taken ones. When an access would overflow the ring, the live entries (at most one per
// slot) are first compacted into the partition's other log buffer (log_base[p] says which of the two
// is current), by the whole GPU: tiles of PSA_COMPACT entries per thread are counted, each tile's
// CTA sums the counts before it and writes its live entries from there.
//
// Semantics (psa_ref.kvcache.pool.SlotPool.access): every block the access names is pinned first (with
// pin_window = 2 also those named by the previous access); misses, in order of first occurrence,
// take free slots (the stack's top first), then evict the first unpinned blocks in policy order.
// A bad id or an access that finds too few victims changes nothing but pins and sets `error` (the
// code of the first bad id in access order).
//
// ctl (int64 [8], per pool) carries one access from launch to launch: [0] min over bad ids of
// (i << 2 | code), [1] ids named, [2] 1 if any id missed; then, for psa_pool_finish, [3] the
// failure code, [4] the log position of id 0, [5] the clock of id 0. psa_pool_parallel resets
// [0..2] for the next access.
#define PSA_T 1024
#define PSA_NO_VICTIM 1
#define PSA_BAD_ID 2
#define PSA_WRONG_PARTITION 3
#define PSA_UNCLAIMED 0x7fffffff
#define PSA_NO_BAD 0x7fffffffffffffffll
#define PSA_ID_T 256   // threads per CTA of the grid launches (psa_fast.pool._ID_THREADS)
#define PSA_COMPACT 8  // log entries per thread of a tile when compacting
#define PSA_TILE ((long long)PSA_ID_T * PSA_COMPACT)

// The log of partition p: buffer `base` (0 or 1) of its two, C entries each.
#define PSA_LOG(arr, base) ((arr) + ((long long)p * 2 + (base)) * C)

// An entry is live while its slot still holds a block stamped with the entry's stamp.
__device__ __forceinline__ bool live_entry(int sl, long long st, const int* block_of, const long long* stamp) {
    return sl >= 0 && block_of[sl] >= 0 && stamp[sl] == st;
}

// Exclusive prefix sum of x over the CTA (any blockDim.x <= 1024); *total gets the sum. `warp_sums`
// is [32] shared. Ends with a barrier, so it may be called again at once.
__device__ int cta_exclusive_scan(int x, int* warp_sums, int* total) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    int incl = x;
    for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += y;
    }
    if (lane == 31) warp_sums[w] = incl;
    __syncthreads();
    if (w == 0) {
        int v = lane < nw ? warp_sums[lane] : 0;
        for (int o = 1; o < 32; o <<= 1) {
            const int y = __shfl_up_sync(0xffffffffu, v, o);
            if (lane >= o) v += y;
        }
        warp_sums[lane] = v;
    }
    __syncthreads();
    const int before = (w ? warp_sums[w - 1] : 0) + incl - x;
    *total = warp_sums[nw - 1];
    __syncthreads();
    return before;
}

// Live entries of tile k of the log ([head + k * tile, ...) up to tail), as this thread's
// PSA_COMPACT consecutive entries: slots (-1 where dead) and stamps.
__device__ int tile_entries(const int* lslot, const long long* lstamp, long long head, long long tail, long long k,
                            int C, const int* block_of, const long long* stamp, int* sl, long long* st) {
    int live = 0;
#pragma unroll
    for (int e = 0; e < PSA_COMPACT; ++e) {
        const long long j = head + k * PSA_TILE + (long long)threadIdx.x * PSA_COMPACT + e;
        sl[e] = j < tail ? lslot[j % C] : -1;
        st[e] = j < tail ? lstamp[j % C] : 0;
    }
#pragma unroll
    for (int e = 0; e < PSA_COMPACT; ++e) {
        if (!live_entry(sl[e], st[e], block_of, stamp)) sl[e] = -1;
        live += sl[e] >= 0;
    }
    return live;
}

extern "C" __global__ void __launch_bounds__(PSA_ID_T) psa_pool_probe(
    const int* __restrict__ ids, int n, int p, int per, int num_store, int C, const int* __restrict__ slot_of,
    const int* __restrict__ block_of, long long* pin, const long long* __restrict__ epoch, int* claim,
    signed char* hit, long long* ctl, const long long* __restrict__ stamp, const int* __restrict__ log_slot,
    const long long* __restrict__ log_stamp, const long long* __restrict__ log_head,
    const long long* __restrict__ log_tail, const int* __restrict__ log_base, int* log_count) {
    __shared__ int warp_sums[32];
    const long long head = log_head[p], tail = log_tail[p];
    if (tail + n - head > C) {  // this access overflows the log: count each tile's live entries
        const int base = log_base[p];
        for (long long k = blockIdx.x; head + k * PSA_TILE < tail; k += gridDim.x) {
            int sl[PSA_COMPACT], total;
            long long st[PSA_COMPACT];
            const int live = tile_entries(PSA_LOG(log_slot, base), PSA_LOG(log_stamp, base), head, tail, k, C,
                                          block_of, stamp, sl, st);
            cta_exclusive_scan(live, warp_sums, &total);
            if (threadIdx.x == 0) log_count[k] = total;
        }
    }
    const long long e = epoch[p] + 1;
    long long bad = PSA_NO_BAD;
    int named = 0, miss = 0;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        const int b = ids[i];
        hit[i] = -1;  // psa_pool_parallel marks first misses 0, psa_pool_finish the hits 1
        if (b == -1) continue;
        if (b < -1 || b >= num_store) {
            bad = min(bad, (long long)i << 2 | PSA_BAD_ID);
            continue;
        }
        ++named;
        const int s = slot_of[b];
        if (s >= 0) {
            if (s / per != p) bad = min(bad, (long long)i << 2 | PSA_WRONG_PARTITION);
            else pin[s] = e;
        } else {
            atomicMin(claim + b, i);
            miss = 1;
        }
    }
    for (int o = 16; o; o >>= 1) {
        named += __shfl_xor_sync(0xffffffffu, named, o);
        miss |= __shfl_xor_sync(0xffffffffu, miss, o);
        bad = min(bad, __shfl_xor_sync(0xffffffffu, bad, o));
    }
    if ((threadIdx.x & 31) == 0) {
        if (named) atomicAdd(reinterpret_cast<unsigned long long*>(ctl + 1), (unsigned long long)named);
        if (miss) ctl[2] = 1;
        if (bad != PSA_NO_BAD) atomicMin(ctl, bad);
    }
}

extern "C" __global__ void __launch_bounds__(PSA_ID_T) psa_pool_compact(
    int n, int p, int C, const int* __restrict__ block_of, const long long* __restrict__ stamp, int* log_slot,
    long long* log_stamp, const long long* __restrict__ log_head, const long long* __restrict__ log_tail,
    const int* __restrict__ log_base, const int* __restrict__ log_count) {
    __shared__ int warp_sums[32];
    const long long head = log_head[p], tail = log_tail[p];
    if (tail + n - head <= C) return;
    const int base = log_base[p];
    const int* from_slot = PSA_LOG(log_slot, base);
    const long long* from_stamp = PSA_LOG(log_stamp, base);
    int* to_slot = PSA_LOG(log_slot, 1 - base);
    long long* to_stamp = PSA_LOG(log_stamp, 1 - base);
    for (long long k = blockIdx.x; head + k * PSA_TILE < tail; k += gridDim.x) {
        int before = 0, total;
        for (long long j = threadIdx.x; j < k; j += blockDim.x) before += log_count[j];
        cta_exclusive_scan(before, warp_sums, &total);  // total: the live entries of tiles 0 .. k - 1
        int sl[PSA_COMPACT];
        long long st[PSA_COMPACT];
        const int live = tile_entries(from_slot, from_stamp, head, tail, k, C, block_of, stamp, sl, st);
        int dummy;
        long long at = head + total + cta_exclusive_scan(live, warp_sums, &dummy);
#pragma unroll
        for (int e = 0; e < PSA_COMPACT; ++e)
            if (sl[e] >= 0) {
                to_slot[at % C] = sl[e];
                to_stamp[at % C] = st[e];
                ++at;
            }
    }
}

extern "C" __global__ void __launch_bounds__(PSA_T) psa_pool_parallel(
    const int* __restrict__ ids, int n, int p, int per, int lru, int pin_window, int num_store, int C,
    int* slot_of, int* block_of, const int* free, int* free_top, long long* pin, long long* epoch,
    long long* load_seq, long long* seq, long long* counters, int* error, long long* stamp, long long* clock,
    int* log_slot, long long* log_stamp, long long* log_head, long long* log_tail, int* log_base,
    const int* __restrict__ log_count, int* claim, long long* ctl, signed char* hit, int* load_src, int* load_dst,
    int* num_loads, int* evicted, int* num_evicted) {
    __shared__ int warp_sums[32];
    __shared__ unsigned long long s_keep;
    const int t = threadIdx.x;
    const long long e = epoch[p] + 1, oldest = e - pin_window + 1, clk = clock[0], seq0 = seq[0];
    long long head = log_head[p], tail = log_tail[p];
    int base = log_base[p];
    const long long first_bad = ctl[0], named = ctl[1], any_miss = ctl[2];
    const int bad = first_bad == PSA_NO_BAD ? 0 : (int)(first_bad & 3);
    __syncthreads();  // every thread has read ctl before thread 0 resets it

    // 1. misses in access order: load_src[rank] = block; the first occurrence is the miss
    int m = 0;
    if (!bad && any_miss)
        for (int i0 = 0; i0 < n; i0 += PSA_T) {
            const int i = i0 + t;
            int f = 0, b = -1, total;
            if (i < n) {
                b = ids[i];
                f = b >= 0 && slot_of[b] < 0 && claim[b] == i;
            }
            const int r = cta_exclusive_scan(f, warp_sums, &total);
            if (f) {
                load_src[m + r] = b;
                hit[i] = 0;
            }
            m += total;
        }
    const int nf = free_top[p], from_free = min(m, nf), need = m - from_free;

    // 2. if this access overflows the log, psa_pool_compact has copied its live entries into the
    // other buffer: switch to it; then take victims from the log's head
    if (!bad && tail + n - head > C) {
        const long long tiles = (tail - head + PSA_TILE - 1) / PSA_TILE;
        int live = 0, total;
        for (long long k = t; k < tiles; k += PSA_T) live += log_count[k];
        cta_exclusive_scan(live, warp_sums, &total);
        tail = head + total;
        base = 1 - base;
    }
    int* lslot = PSA_LOG(log_slot, base);
    long long* lstamp = PSA_LOG(log_stamp, base);
    for (int r = t; r < from_free; r += PSA_T) load_dst[r] = free[p * per + nf - 1 - r];
    if (t == 0) s_keep = ~0ull;
    __syncthreads();
    int found = 0;
    long long pos = head;
    while (!bad && found < need && pos < tail) {
        const long long j = pos + t;
        const int sl = j < tail ? lslot[j % C] : -1;
        const bool live = j < tail && live_entry(sl, lstamp[j % C], block_of, stamp);
        const bool free_victim = live && pin[sl] < oldest;
        int total;
        const int r = found + cta_exclusive_scan(free_victim, warp_sums, &total);
        const bool take = free_victim && r < need;
        if (take) {
            load_dst[from_free + r] = sl;
            evicted[r] = block_of[sl];
        }
        if (live && !take) atomicMin(&s_keep, (unsigned long long)j);  // the new head cannot pass it
        found = min(need, found + total);
        pos += PSA_T;
    }
    const int fail = bad ? bad : (found < need ? PSA_NO_VICTIM : 0);
    if (fail) {  // change nothing but pins: release the claims, report (psa_pool_finish skips every id)
        for (int i = t; i < n; i += PSA_T) {
            const int b = ids[i];
            if (b >= 0 && b < num_store && slot_of[b] < 0) claim[b] = PSA_UNCLAIMED;
        }
        if (t == 0) {
            error[0] = fail;
            epoch[p] = e;
            num_loads[0] = 0;
            num_evicted[0] = 0;
            ctl[0] = PSA_NO_BAD;
            ctl[1] = 0;
            ctl[2] = 0;
            ctl[3] = fail;
            log_base[p] = base;  // a compaction changes no decision: keep it
            log_tail[p] = tail;
        }
        return;
    }

    // 3. load: victims leave, misses take their slots
    for (int r = t; r < m; r += PSA_T) {
        const int b = load_src[r], sl = load_dst[r];
        if (r >= from_free) slot_of[evicted[r - from_free]] = -1;
        block_of[sl] = b;
        slot_of[b] = sl;
        load_seq[sl] = seq0 + r;
        pin[sl] = e;
        stamp[sl] = lru ? 0 : clk + claim[b];  // LRU: set by psa_pool_finish from the last occurrence
        claim[b] = PSA_UNCLAIMED;               // the same thread read it
    }
    if (t == 0) {
        epoch[p] = e;
        clock[0] = clk + n;
        seq[0] = seq0 + m;
        free_top[p] = nf - from_free;
        log_head[p] = min((long long)min(s_keep, (unsigned long long)pos), tail);
        log_tail[p] = tail + n;
        log_base[p] = base;
        counters[0] += named - m;
        counters[1] += m;
        counters[2] += need;
        counters[3] += m;
        num_loads[0] = m;
        num_evicted[0] = need;
        ctl[0] = PSA_NO_BAD;
        ctl[1] = 0;
        ctl[2] = 0;
        ctl[3] = 0;
        ctl[4] = tail;
        ctl[5] = clk;
    }
}

// 4. per id: slot, hit, LRU stamp (the last occurrence wins), one log entry.
extern "C" __global__ void __launch_bounds__(PSA_ID_T) psa_pool_finish(
    const int* __restrict__ ids, int n, int p, int lru, int C, const int* __restrict__ slot_of, long long* stamp,
    int* log_slot, long long* log_stamp, const int* __restrict__ log_base, const long long* __restrict__ ctl,
    int* slots, signed char* hit) {
    const long long fail = ctl[3], tail = ctl[4], clk = ctl[5];
    int* lslot = PSA_LOG(log_slot, log_base[p]);
    long long* lstamp = PSA_LOG(log_stamp, log_base[p]);
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        const int b = ids[i];
        if (fail || b == -1) {
            slots[i] = -1;
            hit[i] = -1;
            if (!fail) lslot[(tail + i) % C] = -1;
            continue;
        }
        const long long at = (tail + i) % C;
        const int sl = slot_of[b];
        const bool first_miss = hit[i] == 0;
        slots[i] = sl;
        hit[i] = first_miss ? 0 : 1;
        if (lru) atomicMax(reinterpret_cast<unsigned long long*>(stamp + sl), (unsigned long long)(clk + i));
        lslot[at] = lru || first_miss ? sl : -1;
        lstamp[at] = clk + i;
    }
}

// Free the slots of `ids` (those resident) in `order` (by load time), as psa_ref's release does.
extern "C" __global__ void psa_pool_release(const int* __restrict__ ids, const int* __restrict__ order, int n,
                                            int per, int num_store, int* slot_of, int* block_of, int* free,
                                            int* free_top, int* error) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    for (int k = 0; k < n; ++k) {
        const int b = ids[order[k]];
        if (b == -1) continue;
        if (b < -1 || b >= num_store) { error[0] = PSA_BAD_ID; continue; }
        const int s = slot_of[b];
        if (s < 0) continue;
        const int q = s / per;
        slot_of[b] = -1;
        block_of[s] = -1;
        free[q * per + free_top[q]] = s;
        ++free_top[q];
    }
}
