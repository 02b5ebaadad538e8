// The GPU pool's policy, parallel (psa_fast.pool, kernel="parallel"): the same decisions as the
// sequential kernels (pool_access.cu and the Numba twin in pool.py) for every valid access, by one
// CTA whose cost grows with the ids named, not with their dependent chain of list updates.
//
// The policy order is kept as stamps instead of a linked list: stamp[slot] is the time of the
// block's last access (LRU) or of its load (FIFO), from a clock that advances by n per access, so
// sorting resident slots by stamp gives the reference's eviction order. To find victims without
// sorting, each partition keeps a log of (slot, stamp) entries in stamp order (a ring of C
// entries): an access appends one entry per id; an entry is live while its slot still holds a
// block with that stamp, so touching a block makes its older entries dead without finding them.
// Victims are the first live, unpinned entries from the log's head; the head then moves past the
// dead and taken ones. When an access would overflow the ring, the live entries (at most one per
// slot) are compacted in place first.
//
// Semantics (psa_ref.pool.SlotPool.access): every block the access names is pinned first (with
// pin_window = 2 also those named by the previous access); misses, in order of first occurrence,
// take free slots (the stack's top first), then evict the first unpinned blocks in policy order.
// A bad id or an access that finds too few victims changes nothing but pins and sets `error`.
#define PSA_T 1024
#define PSA_NO_VICTIM 1
#define PSA_BAD_ID 2
#define PSA_WRONG_PARTITION 3
#define PSA_UNCLAIMED 0x7fffffff

// Inclusive prefix sum of x over the CTA (PSA_T threads); `buf` is [PSA_T] shared.
__device__ int cta_scan(int x, int* buf) {
    const int t = threadIdx.x;
    buf[t] = x;
    __syncthreads();
    for (int o = 1; o < PSA_T; o <<= 1) {
        const int y = t >= o ? buf[t - o] : 0;
        __syncthreads();
        buf[t] += y;
        __syncthreads();
    }
    return buf[t];
}

extern "C" __global__ void __launch_bounds__(PSA_T) psa_pool_parallel(
    const int* __restrict__ ids, int n, int p, int per, int lru, int pin_window, int num_store, int C,
    int* slot_of, int* block_of, const int* free, int* free_top, long long* pin, long long* epoch,
    long long* load_seq, long long* seq, long long* counters, int* error, long long* stamp, long long* clock,
    int* log_slot, long long* log_stamp, long long* log_head, long long* log_tail, int* claim, int* slots,
    signed char* hit, int* load_src, int* load_dst, int* num_loads, int* evicted, int* num_evicted) {
    __shared__ int buf[PSA_T];
    __shared__ int s_bad, s_named;
    __shared__ unsigned long long s_keep;
    const int t = threadIdx.x;
    const long long e = epoch[p] + 1, oldest = e - pin_window + 1, clk = clock[0], seq0 = seq[0];
    int* lslot = log_slot + (long long)p * C;
    long long* lstamp = log_stamp + (long long)p * C;
    long long head = log_head[p], tail = log_tail[p];
    if (t == 0) { s_bad = 0; s_named = 0; }
    __syncthreads();

    // 1. pin the resident blocks named; each missing block is claimed by its first occurrence
    int named = 0;
    for (int i = t; i < n; i += PSA_T) {
        const int b = ids[i];
        if (b == -1) continue;
        if (b < -1 || b >= num_store) { s_bad = PSA_BAD_ID; continue; }
        ++named;
        const int s = slot_of[b];
        if (s >= 0) {
            if (s / per != p) s_bad = PSA_WRONG_PARTITION;
            else pin[s] = e;
        } else {
            atomicMin(claim + b, i);
        }
    }
    atomicAdd(&s_named, named);
    __syncthreads();
    const int bad = s_bad;

    // 2. misses in access order: load_src[rank] = block
    int m = 0;
    if (!bad)
        for (int base = 0; base < n; base += PSA_T) {
            const int i = base + t;
            int f = 0, b = -1;
            if (i < n) {
                b = ids[i];
                f = b >= 0 && slot_of[b] < 0 && claim[b] == i;
            }
            const int r = cta_scan(f, buf);
            if (f) load_src[m + r - 1] = b;
            m += buf[PSA_T - 1];
            __syncthreads();
        }
    const int nf = free_top[p], from_free = min(m, nf), need = m - from_free;

    // 3. compact the log if this access would overflow it, then take victims from its head
    if (!bad && tail + n - head > C) {
        long long out = head;
        for (long long base = head; base < tail; base += PSA_T) {
            const long long j = base + t;
            int sl = -1;
            long long st = 0;
            bool live = false;
            if (j < tail) {
                sl = lslot[j % C];
                st = lstamp[j % C];
                live = sl >= 0 && block_of[sl] >= 0 && stamp[sl] == st;
            }
            const int r = cta_scan(live, buf);  // ends with a barrier: every entry of the tile is read
            if (live) {
                lslot[(out + r - 1) % C] = sl;
                lstamp[(out + r - 1) % C] = st;
            }
            out += buf[PSA_T - 1];
            __syncthreads();
        }
        tail = out;
    }
    for (int r = t; r < from_free; r += PSA_T) load_dst[r] = free[p * per + nf - 1 - r];
    if (t == 0) s_keep = ~0ull;
    __syncthreads();
    int found = 0;
    long long pos = head;
    while (!bad && found < need && pos < tail) {
        const long long j = pos + t;
        int sl = -1;
        bool live = false, take = false;
        if (j < tail) {
            sl = lslot[j % C];
            live = sl >= 0 && block_of[sl] >= 0 && stamp[sl] == lstamp[j % C];
        }
        const bool free_victim = live && pin[sl] < oldest;
        const int r = found + cta_scan(free_victim, buf) - 1;
        take = free_victim && r < need;
        if (take) {
            load_dst[from_free + r] = sl;
            evicted[r] = block_of[sl];
        }
        if (live && !take) atomicMin(&s_keep, (unsigned long long)j);  // the new head cannot pass it
        found = min(need, found + buf[PSA_T - 1]);
        pos += PSA_T;
        __syncthreads();
    }
    const int fail = bad ? bad : (found < need ? PSA_NO_VICTIM : 0);
    if (fail) {  // change nothing but pins: release the claims, report
        for (int i = t; i < n; i += PSA_T) {
            const int b = ids[i];
            if (b >= 0 && b < num_store && slot_of[b] < 0) claim[b] = PSA_UNCLAIMED;
            slots[i] = -1;
            hit[i] = -1;
        }
        if (t == 0) {
            error[0] = fail;
            epoch[p] = e;
            num_loads[0] = 0;
            num_evicted[0] = 0;
        }
        return;
    }

    // 4. load: victims leave, misses take their slots
    for (int r = t; r < m; r += PSA_T) {
        const int b = load_src[r], sl = load_dst[r];
        if (r >= from_free) slot_of[evicted[r - from_free]] = -1;
        block_of[sl] = b;
        slot_of[b] = sl;
        load_seq[sl] = seq0 + r;
        pin[sl] = e;
        stamp[sl] = lru ? 0 : clk + claim[b];  // LRU: set below from the last occurrence
    }
    __syncthreads();

    // 5. per id: slot, hit, LRU stamp (last occurrence wins), one log entry
    for (int i = t; i < n; i += PSA_T) {
        const int b = ids[i];
        const long long at = (tail + i) % C;
        if (b == -1) {
            slots[i] = -1;
            hit[i] = -1;
            lslot[at] = -1;
            continue;
        }
        const int sl = slot_of[b];
        const bool first_miss = claim[b] == i;
        slots[i] = sl;
        hit[i] = first_miss ? 0 : 1;
        if (lru) atomicMax(reinterpret_cast<unsigned long long*>(stamp + sl), (unsigned long long)(clk + i));
        lslot[at] = lru || first_miss ? sl : -1;
        lstamp[at] = clk + i;
    }
    __syncthreads();
    for (int r = t; r < m; r += PSA_T) claim[load_src[r]] = PSA_UNCLAIMED;
    if (t == 0) {
        epoch[p] = e;
        clock[0] = clk + n;
        seq[0] = seq0 + m;
        free_top[p] = nf - from_free;
        log_head[p] = min((long long)min(s_keep, (unsigned long long)pos), tail);
        log_tail[p] = tail + n;
        counters[0] += s_named - m;
        counters[1] += m;
        counters[2] += need;
        counters[3] += m;
        num_loads[0] = m;
        num_evicted[0] = need;
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
