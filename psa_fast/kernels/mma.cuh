// Tensor-core helpers shared by decode.cu and sketch.cu: mma.sync m16n8k16 with only the first 8 rows
// of A in use, and the float16 hi + lo split that keeps about 22 bits of a float operand.
#pragma once
#include <cuda_fp16.h>

// d += A B for one m16n8k16 tile; A rows 8..15 are zero here (a1 = a3 = 0).
__device__ __forceinline__ void mma_rows8(float (&d)[4], unsigned int a0, unsigned int a2, unsigned int b0,
                                          unsigned int b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};"
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

// Two floats as f16x2 hi and lo parts (x = hi + lo to about 22 bits).
__device__ __forceinline__ void split2(float x, float y, unsigned int& hi, unsigned int& lo) {
    const __half2 h = __floats2half2_rn(x, y);
    const float2 hf = __half22float2(h);
    const __half2 l = __floats2half2_rn(x - hf.x, y - hf.y);
    hi = *reinterpret_cast<const unsigned int*>(&h);
    lo = *reinterpret_cast<const unsigned int*>(&l);
}
