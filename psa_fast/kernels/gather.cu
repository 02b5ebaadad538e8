// Offload: copy KV blocks from the host store (mapped pinned memory, read through its UVA
// address) into slots of the GPU pool, all of an iteration's misses in one launch.
//
// Measured alternatives on the H200 (DESIGN.md): one cudaMemcpyAsync per 64 KiB block reaches
// 9-14 GB/s, a zero-copy gather 43-51 GB/s, one bulk pinned copy 55.4 GB/s. The gather keeps many
// 16-byte PCIe reads in flight: PSA_GATHER_THREADS threads per block, each issuing its loads
// before its stores.
//
//   host_k, host_v  [blocks_in_store, S * D] 16-bit KV (float16 or bfloat16: copied as bits), mapped pinned host memory
//   src             [count] long: block index in the host store
//   dst             [count] int: slot in the pool
//   k_pool, v_pool  [slots, S * D] the same on the GPU
//
// With PSA_DEVICE_COUNT = 1 (the offload decoder) `src` is int and the count is read from device
// memory, as the GPU pool wrote it, so the host never waits for the count. Each CTA copies blocks
// blockIdx.x, blockIdx.x + gridDim.x, ...: a grid of a few CTAs per SM keeps as many reads in
// flight as one CTA per block would, and costs nothing when there is nothing to load.
#include "common.cuh"

#ifndef PSA_GATHER_THREADS
#define PSA_GATHER_THREADS 128
#endif
#ifndef PSA_DEVICE_COUNT
#define PSA_DEVICE_COUNT 0
#endif
#if PSA_DEVICE_COUNT
typedef int src_index_t;
typedef const int* count_t;
#define PSA_COUNT (*count)
#else
typedef long long src_index_t;
typedef int count_t;
#define PSA_COUNT count
#endif

extern "C" __global__ void __launch_bounds__(PSA_GATHER_THREADS)
psa_gather(const unsigned short* __restrict__ host_k, const unsigned short* __restrict__ host_v,
           const src_index_t* __restrict__ src, const int* __restrict__ dst, count_t count,
           unsigned short* __restrict__ k_pool, unsigned short* __restrict__ v_pool) {
    constexpr int VECS = PSA_S * PSA_D / 8;  // 16-byte vectors per block of K (or V)
    constexpr int PER = (VECS + PSA_GATHER_THREADS - 1) / PSA_GATHER_THREADS;
    const int count_now = PSA_COUNT;
    for (int i = blockIdx.x; i < count_now; i += gridDim.x) {
        const long long from = src[i];
        const uint4* sk = reinterpret_cast<const uint4*>(host_k + from * (PSA_S * PSA_D));
        const uint4* sv = reinterpret_cast<const uint4*>(host_v + from * (PSA_S * PSA_D));
        uint4* dk = reinterpret_cast<uint4*>(k_pool + (long long)dst[i] * (PSA_S * PSA_D));
        uint4* dv = reinterpret_cast<uint4*>(v_pool + (long long)dst[i] * (PSA_S * PSA_D));
        uint4 a[PER], c[PER];
#pragma unroll
        for (int r = 0; r < PER; ++r) {  // all reads first: many PCIe requests in flight
            const int e = threadIdx.x + r * PSA_GATHER_THREADS;
            if (e < VECS) {
                a[r] = sk[e];
                c[r] = sv[e];
            }
        }
#pragma unroll
        for (int r = 0; r < PER; ++r) {
            const int e = threadIdx.x + r * PSA_GATHER_THREADS;
            if (e < VECS) {
                dk[e] = a[r];
                dv[e] = c[r];
            }
        }
    }
}
