// Tensor-core helpers shared by decode.cu and sketch.cu: mma.sync m16n8k16 with only the first 8 rows
// of A in use, and the split of a float operand into parts of the MMA's input type: float16 hi + lo
// keeps about 22 bits; bfloat16 (PSA_BF16, for bfloat16 KV) keeps 16 bits in two parts, 24 in three.
#pragma once
#include "common.cuh"

#if PSA_BF16
#define PSA_MMA_AB "bf16"  // A and B of one mma.sync share their type: the KV's
#else
#define PSA_MMA_AB "f16"
#endif

// d += A B for one m16n8k16 tile; A rows 8..15 are zero here (a1 = a3 = 0).
__device__ __forceinline__ void mma_rows8(float (&d)[4], unsigned int a0, unsigned int a2, unsigned int b0,
                                          unsigned int b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." PSA_MMA_AB "." PSA_MMA_AB ".f32 {%0, %1, %2, %3}, "
                 "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(0u), "r"(a2), "r"(0u), "r"(b0), "r"(b1));
}

// d[0..1] += (A_hi + A_lo) B for rows 0..7 of one tile, through a fresh accumulator and one float32 add
// per element. The tensor cores add each k-step's products to the accumulator after aligning them to the
// largest term and truncating: chained into d, every product would lose the bits below d's last place,
// an error that grows with the running sum (benchmarks/NOTES.md, "Output precision of decode v3").
// `with_lo` false skips the lo product (a warp-uniform choice: an A operand that is float16 already).
__device__ __forceinline__ void mma_rows8_add(float (&d)[2], unsigned int hi0, unsigned int hi2, unsigned int lo0,
                                              unsigned int lo2, unsigned int b0, unsigned int b1, bool with_lo = true) {
    float t[4] = {0.f, 0.f, 0.f, 0.f};
    mma_rows8(t, hi0, hi2, b0, b1);
    if (with_lo) mma_rows8(t, lo0, lo2, b0, b1);
    d[0] += t[0];
    d[1] += t[1];
}

// The same with the A operand in P parts, a[p] = (rows 0..7 of columns 0..7, of columns 8..15): d[0..1] +=
// (a[0] + ... + a[P-1]) B; `with_lo` false multiplies a[0] only.
template <int P>
__device__ __forceinline__ void mma_rows8_parts(float (&d)[2], const unsigned int (&a)[P][2], unsigned int b0,
                                                unsigned int b1, bool with_lo = true) {
    float t[4] = {0.f, 0.f, 0.f, 0.f};
    mma_rows8(t, a[0][0], a[0][1], b0, b1);
    if (with_lo) {
#pragma unroll
        for (int p = 1; p < P; ++p) mma_rows8(t, a[p][0], a[p][1], b0, b1);
    }
    d[0] += t[0];
    d[1] += t[1];
}

// Two floats rounded to a kv_t pair: the packed register, and (x, y) minus what it holds (exact).
__device__ __forceinline__ unsigned int pack_rest(float& x, float& y) {
#if PSA_BF16
    const __nv_bfloat162 h = __floats2bfloat162_rn(x, y);
    const float2 hf = __bfloat1622float2(h);
#else
    const __half2 h = __floats2half2_rn(x, y);
    const float2 hf = __half22float2(h);
#endif
    x -= hf.x;
    y -= hf.y;
    return *reinterpret_cast<const unsigned int*>(&h);
}

// Two floats as kv_t x2 hi and lo parts (x = hi + lo: about 22 bits in float16, 16 in bfloat16).
__device__ __forceinline__ void split2(float x, float y, unsigned int& hi, unsigned int& lo) {
    hi = pack_rest(x, y);
    lo = pack_rest(x, y);
}

// Three parts (x = hi + lo + lo2: 24 bits in bfloat16, as float32).
__device__ __forceinline__ void split3(float x, float y, unsigned int& hi, unsigned int& lo, unsigned int& lo2) {
    hi = pack_rest(x, y);
    lo = pack_rest(x, y);
    lo2 = pack_rest(x, y);
}
