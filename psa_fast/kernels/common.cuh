// Shared device helpers for the psa_fast kernels.
//
// Compile-time parameters (set with -D by psa_fast/_kernels.py):
//   PSA_D        padded head dimension (a multiple of 8, at most 256)
//   PSA_S        block size in tokens
//   PSA_G        query heads per selection group (G for gqa="shared", 1 for "per_head")
//   PSA_CLUSTER  CTAs that cooperate on one group (a thread-block cluster when > 1)
//   PSA_WARPS    warps per CTA
//   PSA_BF16     1: the KV pools hold bfloat16 (kv_t), 0: float16 (metadata is float16 either way)
//   PSA_KIND     the estimates' metadata: 0 cuboid_mean, 1 minmax, 2 mean (quant3 has its own kernel)
//   PSA_BOUNDS   what an estimate kernel writes per head beside the group scores: 0 nothing, 1 the min/max
//                bounds (stop = certified), 2 each head's estimate
//   PSA_QRAW     the query a kernel reads (query_pair): 0 the plan's scaled float copy, or the caller's query (1
//                float16, 2 bfloat16 bits, 3 float32) multiplied by a factor the kernel is given
#pragma once
#include <cuda_fp16.h>

#ifndef PSA_BF16
#define PSA_BF16 0
#endif
#if PSA_BF16
#include <cuda_bf16.h>
typedef __nv_bfloat16 kv_t;
#else
typedef __half kv_t;
#endif

#ifndef PSA_QRAW
#define PSA_QRAW 0
#endif
#if PSA_QRAW == 1
typedef __half q_in_t;
#elif PSA_QRAW == 2
typedef unsigned short q_in_t;  // bfloat16 bits
#else
typedef float q_in_t;
#endif

// The GPU's global timer (ns, the same clock on every SM): the clock builds' marks across CTAs and kernels.
__device__ __forceinline__ long long globaltimer_ns() {
    long long v;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(v));
    return v;
}

// Channels k, k + 1 (k even) of the query: the plan's scaled floats (PSA_QRAW 0), or the caller's values times mul,
// loaded as one pair. __fmul_rn is never contracted into a following fma (estimate_mma's hi / lo split), so the
// bits are psa_scale_query's float32 product.
__device__ __forceinline__ float2 query_pair(const q_in_t* p, float mul) {
#if PSA_QRAW == 0
    return make_float2(__ldg(p), __ldg(p + 1));
#elif PSA_QRAW == 1
    const float2 x = __half22float2(__ldg(reinterpret_cast<const __half2*>(p)));
    return make_float2(__fmul_rn(x.x, mul), __fmul_rn(x.y, mul));
#elif PSA_QRAW == 2
    const unsigned int w = __ldg(reinterpret_cast<const unsigned int*>(p));
    return make_float2(__fmul_rn(__int_as_float(w << 16), mul), __fmul_rn(__int_as_float(w & 0xffff0000u), mul));
#else
    const float2 x = __ldg(reinterpret_cast<const float2*>(p));
    return make_float2(__fmul_rn(x.x, mul), __fmul_rn(x.y, mul));
#endif
}

// NVRTC does not define INFINITY without the host math headers.
#define PSA_INF __int_as_float(0x7f800000)

#ifndef PSA_D
#define PSA_D 128
#endif
#ifndef PSA_S
#define PSA_S 16
#endif
#ifndef PSA_G
#define PSA_G 4
#endif
#ifndef PSA_CLUSTER
#define PSA_CLUSTER 1
#endif
#ifndef PSA_WARPS
#define PSA_WARPS 8
#endif
#ifndef PSA_KIND
#define PSA_KIND 0
#endif
#ifndef PSA_BOUNDS
#define PSA_BOUNDS 0
#endif

// One 16-byte vector (8 halves) per lane; LPT lanes cover one row of D channels, so one
// warp-wide load instruction reads TPI token rows of a block.
#define PSA_LPT (PSA_D / 8)
#define PSA_TPI (32 / PSA_LPT)
#define PSA_ROWS ((PSA_S + PSA_TPI - 1) / PSA_TPI)

static_assert(PSA_D % 8 == 0 && PSA_D >= 8 && PSA_D <= 256, "PSA_D must be a multiple of 8 in [8, 256]");
static_assert(32 % PSA_LPT == 0, "PSA_D / 8 must divide 32");

// Stop rules (the order of psa_fast._kernels.STOP_CODES).
#define PSA_STOP_REMAINING 0
#define PSA_STOP_SEED 1
#define PSA_STOP_CERTIFIED 2
#define PSA_STOP_NONE 3    // attend every block (threshold 1, dense)
#define PSA_STOP_BUDGET 4  // top-k: exactly one chunk
#define PSA_STOP_EMA 5     // N_left times a moving average of the block masses seen
#define PSA_STOP_SKETCH 6  // sketch masses calibrated on the newest ranked blocks, and a share test
#define PSA_STOP_SKETCH_AVG 7  // as sketch, the share test relative to an average block (share / n)

// Why a loop ended (psa_fast._kernels.REASONS).
#define PSA_REASON_THRESHOLD 0
#define PSA_REASON_EXHAUSTED 1
#define PSA_REASON_BUDGET 2

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

// Max and sum over the 8 lanes that share a column pair of an MMA accumulator (equal lane & 3; lanes xor 4,
// 8, 16 in that order), the same bits in each of them.
__device__ __forceinline__ float column_max(float x) {
#pragma unroll
    for (int o = 4; o < 32; o <<= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}
__device__ __forceinline__ float column_sum(float x) {
#pragma unroll
    for (int o = 4; o < 32; o <<= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

// Two shares of a sum of exponentials, each as (max, sum relative to it), merged into one; (-inf, 0) is the
// identity. (psa_order_suffix's scans, psa_spec_verify's running sums; psa_share_key keeps its own in-place form.)
__device__ __forceinline__ float2 lse_merge(float2 a, float2 b) {
    const float m = fmaxf(a.x, b.x);
    if (m == -PSA_INF) return make_float2(m, 0.f);
    return make_float2(m, a.y * __expf(a.x - m) + b.y * __expf(b.x - m));
}

// out[i] = log sum_lanes exp(x[i]), the same bits in every lane; -inf when every lane's x[i] is -inf.
template <int N>
__device__ __forceinline__ void warp_logsumexp(const float (&x)[N], float (&out)[N]) {
    // N log-sum-exps at once, each the same bits as alone (max, then the sum of exp(x - max), both by the
    // butterfly over lanes 16 .. 1): their shuffle rounds interleave instead of running one after another.
    float m[N], s[N];
#pragma unroll
    for (int i = 0; i < N; ++i) m[i] = x[i];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
#pragma unroll
        for (int i = 0; i < N; ++i) m[i] = fmaxf(m[i], __shfl_xor_sync(0xffffffffu, m[i], o));
#pragma unroll
    for (int i = 0; i < N; ++i) s[i] = m[i] == -PSA_INF ? 0.f : __expf(x[i] - m[i]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
#pragma unroll
        for (int i = 0; i < N; ++i) s[i] += __shfl_xor_sync(0xffffffffu, s[i], o);
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = m[i] == -PSA_INF ? -PSA_INF : m[i] + __logf(s[i]);
}

// Unpack 8 16-bit floats held in a uint4 into floats (exact): halves (unpack8) or KV elements (unpack8_kv).
__device__ __forceinline__ float2 pair_to_float2(__half2 h) { return __half22float2(h); }
#if PSA_BF16
__device__ __forceinline__ float2 pair_to_float2(__nv_bfloat162 h) { return __bfloat1622float2(h); }
#endif
template <typename Pair>
__device__ __forceinline__ void unpack8_as(const uint4 v, float* f) {
    const Pair* h = reinterpret_cast<const Pair*>(&v);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float2 t = pair_to_float2(h[i]);
        f[2 * i] = t.x;
        f[2 * i + 1] = t.y;
    }
}
__device__ __forceinline__ void unpack8(const uint4 v, float* f) { unpack8_as<__half2>(v, f); }
#if PSA_BF16
__device__ __forceinline__ void unpack8_kv(const uint4 v, float* f) { unpack8_as<__nv_bfloat162>(v, f); }
#else
__device__ __forceinline__ void unpack8_kv(const uint4 v, float* f) { unpack8_as<__half2>(v, f); }
#endif

// A float's bits as an unsigned integer that sorts in the same order as the float.
__device__ __forceinline__ unsigned int orderable(float x) {
    unsigned int u = __float_as_uint(x);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// ---- thread-block clusters (Hopper), through PTX so that NVRTC needs no extra headers ----
__device__ __forceinline__ unsigned int cluster_rank() {
#if PSA_CLUSTER > 1
    unsigned int r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
#else
    return 0;
#endif
}

// A barrier for every thread of every CTA of the cluster, with release/acquire ordering of
// shared memory, so that what one CTA wrote before it is visible to the others after it.
__device__ __forceinline__ void cluster_sync() {
#if PSA_CLUSTER > 1
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
#else
    __syncthreads();
#endif
}

#if PSA_CLUSTER > 1
// The address in CTA `rank`'s shared memory of what sits at `local_ptr` in this CTA's.
__device__ __forceinline__ unsigned int dsmem_addr(const void* local_ptr, unsigned int rank) {
    const unsigned int addr = static_cast<unsigned int>(__cvta_generic_to_shared(local_ptr));
    unsigned int remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(addr), "r"(rank));
    return remote;
}
#endif

// Read a float4 from the shared memory of CTA `rank` of this cluster (distributed shared memory).
__device__ __forceinline__ float4 dsmem_load4(const float4* local_ptr, unsigned int rank) {
#if PSA_CLUSTER > 1
    float4 v;
    asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(dsmem_addr(local_ptr, rank)));
    return v;
#else
    return *local_ptr;
#endif
}

// Read a float from the shared memory of CTA `rank` of this cluster (distributed shared memory).
__device__ __forceinline__ float dsmem_load(const float* local_ptr, unsigned int rank) {
#if PSA_CLUSTER > 1
    float v;
    asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(dsmem_addr(local_ptr, rank)) : "memory");
    return v;
#else
    return *local_ptr;
#endif
}

#if PSA_CLUSTER > 1
// Write an int into the shared memory of CTA `rank` of this cluster, at what sits at `local_ptr` in this CTA's (seen
// by `rank` after the next cluster_sync).
__device__ __forceinline__ void dsmem_store_int(int* local_ptr, unsigned int rank, int v) {
    asm volatile("st.shared::cluster.s32 [%0], %1;" :: "r"(dsmem_addr(local_ptr, rank)), "r"(v) : "memory");
}
#endif

#if PSA_CLUSTER > 1
// Exchanges by push (decode.cu's PSA_PUSH builds): a CTA writes into another CTA's shared memory with st.async, whose
// completion counts its bytes on the receiver's mbarrier; the receiver waits on its own mbarrier (acquire at cluster
// scope) and reads its own shared memory. Unlike cluster_sync: no release fence (barrier.cluster.arrive.release
// compiles to MEMBAR.ALL.GPU + ERRBAR: 7-9% of one request's decode samples, ncu, sixty-eighth session), no round
// trip of remote reads after it, and a CTA whose data are sent and that waits for none may leave.
__device__ __forceinline__ unsigned int smem_addr(const void* p) {
    return static_cast<unsigned int>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mbar_init(unsigned long long* bar, unsigned int arrivals) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(smem_addr(bar)), "r"(arrivals) : "memory");
}

// Orders this thread's mbar_init before other CTAs' use of the mbarriers (with the cluster barrier that follows).
__device__ __forceinline__ void mbar_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }

// Arrive on the mbarrier's current phase, which then completes once `bytes` more have been pushed into it (pushes
// may land before this: the transaction count runs negative until it).
__device__ __forceinline__ void mbar_expect(unsigned long long* bar, unsigned int bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(smem_addr(bar)), "r"(bytes)
                 : "memory");
}

// Wait until the mbarrier's phase of parity `parity` has completed; what was pushed in it is then visible.
__device__ __forceinline__ void mbar_wait(unsigned long long* bar, unsigned int parity) {
    const unsigned int a = smem_addr(bar);
    unsigned int done;
    do {
        asm volatile("{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n\t"
                     "selp.u32 %0, 1, 0, p;\n\t}" : "=r"(done) : "r"(a), "r"(parity) : "memory");
    } while (!done);
}

// Write v at what sits at `local_ptr` in this CTA's shared memory, in CTA `rank`'s, counted on rank's copy of `bar`.
__device__ __forceinline__ void push4(const void* local_ptr, unsigned int rank, float4 v,
                                      const unsigned long long* bar) {
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32 [%0], {%1, %2, %3, %4}, [%5];"
                 :: "r"(dsmem_addr(local_ptr, rank)), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w),
                    "r"(dsmem_addr(bar, rank)) : "memory");
}

__device__ __forceinline__ void push2(const void* local_ptr, unsigned int rank, float2 v,
                                      const unsigned long long* bar) {
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.f32 [%0], {%1, %2}, [%3];"
                 :: "r"(dsmem_addr(local_ptr, rank)), "f"(v.x), "f"(v.y), "r"(dsmem_addr(bar, rank)) : "memory");
}

// cluster_sync in two halves, without the release fence: for the mbarriers' initialisation only.
__device__ __forceinline__ void cluster_arrive_relaxed() {
    asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
}

__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.aligned;" ::: "memory"); }
#endif

// A CTA's combine of its warps' outputs (after a barrier): for each head h and channel d, the warps' max logits
// f_m[w][h], masses f_l[w][h] relative to them and unnormalised outputs f_o[(w PSA_G + h) PSA_D + d] into the CTA's
// c_m[h], c_l[h] (relative to c_m) and c_o[h][d], in warp order; warps that attended nothing (-inf) add nothing.
// Threads take (h, d) pairs blockDim.x apart. Both decode kernels (decode.cu, decode_v2.cu) end with it.
__device__ __forceinline__ void combine_warps(const float (*f_m)[PSA_G], const float (*f_l)[PSA_G], const float* f_o,
                                              float* c_m, float* c_l, float (*c_o)[PSA_D]) {
    for (int idx = threadIdx.x; idx < PSA_G * PSA_D; idx += blockDim.x) {
        const int h = idx / PSA_D, d = idx % PSA_D;
        float M = -PSA_INF;
        for (int w = 0; w < PSA_WARPS; ++w) M = fmaxf(M, f_m[w][h]);
        float L = 0.f, O = 0.f;
        if (M != -PSA_INF)
            for (int w = 0; w < PSA_WARPS; ++w) {
                const float e = __expf(f_m[w][h] - M);
                L += f_l[w][h] * e;
                O += f_o[(w * PSA_G + h) * PSA_D + d] * e;
            }
        c_o[h][d] = O;
        if (d == 0) { c_m[h] = M; c_l[h] = L; }
    }
}

// The combine of the cluster's terms (rank r's max logit rm[r], mass rl[r] and output ro[r]), in rank order.
__device__ __forceinline__ float3 cluster_terms(const float (&rm)[PSA_CLUSTER], const float (&rl)[PSA_CLUSTER],
                                               const float (&ro)[PSA_CLUSTER]) {
    float M = -PSA_INF;
#pragma unroll
    for (int r = 0; r < PSA_CLUSTER; ++r) M = fmaxf(M, rm[r]);
    float L = 0.f, O = 0.f;
#pragma unroll
    for (int r = 0; r < PSA_CLUSTER; ++r) {
        if (rm[r] == -PSA_INF) continue;
        const float e = __expf(rm[r] - M);
        L += rl[r] * e;
        O += ro[r] * e;
    }
    return make_float3(M, L, O);
}

// Rank 0's combine of a cluster's outputs for head h, channel d: each CTA's max logit m, mass l relative to it
// and unnormalised output o (its c_m[h], c_l[h], c_o[h][d]) into the cluster's (M, L, O), L and O relative to M.
// CTAs that attended nothing (m = -inf) are skipped. Every CTA's three words are requested before any is used:
// one round trip to the cluster's shared memory, not one a CTA (~0.1 µs each, in the kernel's finish).
__device__ __forceinline__ float3 cluster_combine(const float* c_m, const float* c_l, const float* c_o) {
    float rm[PSA_CLUSTER], rl[PSA_CLUSTER], ro[PSA_CLUSTER];
#pragma unroll
    for (int r = 0; r < PSA_CLUSTER; ++r) {
        rm[r] = dsmem_load(c_m, r);
        rl[r] = dsmem_load(c_l, r);
        ro[r] = dsmem_load(c_o, r);
    }
    return cluster_terms(rm, rl, ro);
}

// The order kernels' PSA_L2_FIRST (_kernels.ORDER_L2_FIRST_MIB): the thread that places a block at a position below
// `l2_first` asks its K and V tiles into L2, one bulk prefetch a tile by the copy engine (tiles of `tile_bytes`, a
// multiple of 16, at `slot` of each pool; the block's slot from block_table [B, Gn, Nmax], Gn = Hkv), so that the
// decode's first copies find them there. The order written is the same.
#ifndef PSA_L2_FIRST
#define PSA_L2_FIRST 0
#endif
#if PSA_L2_FIRST
#define PSA_L2_FIRST_PARAMS                                                                                        \
    , const int *__restrict__ block_table, const char *__restrict__ k_pool, const char *__restrict__ v_pool,       \
        unsigned int tile_bytes, int l2_first
#define PSA_L2_FIRST_ARGS , block_table, k_pool, v_pool, tile_bytes, l2_first  // (a device function's call)
__device__ __forceinline__ void l2_ask_block(const char* k_pool, const char* v_pool, int slot, unsigned int bytes) {
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(k_pool + (long)slot * bytes), "r"(bytes)
                 : "memory");
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(v_pool + (long)slot * bytes), "r"(bytes)
                 : "memory");
}
#else
#define PSA_L2_FIRST_PARAMS
#define PSA_L2_FIRST_ARGS
#endif
