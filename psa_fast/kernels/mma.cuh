// Tensor-core helpers shared by decode.cu, sketch.cu and estimate_mma.cu: mma.sync m16n8k16 on whole tiles, an
// 8 x 8 transpose in registers, and the split of a float operand into parts of the MMA's input type: float16
// hi + lo keeps about 22 bits; bfloat16 (PSA_BF16, for bfloat16 KV) keeps 16 bits in two parts, 24 in three.
#pragma once
#include "common.cuh"

#if PSA_BF16
#define PSA_MMA_AB "bf16"  // A and B of one mma.sync share their type: the KV's
#else
#define PSA_MMA_AB "f16"
#endif

// d += A B for one whole m16n8k16 tile (A's four registers in ldmatrix x4 order: rows 0-7 / 8-15 of
// columns 0-7, then of columns 8-15).
__device__ __forceinline__ void mma16(float (&d)[4], const unsigned int (&a)[4], unsigned int b0, unsigned int b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." PSA_MMA_AB "." PSA_MMA_AB ".f32 {%0, %1, %2, %3}, "
                 "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
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

// Two floats' hi part (lo_part 0: kv_t(x)) or lo part (lo_part 1: kv_t(x - kv_t(x)); the rest is exact in
// float32), packed: lanes of one B operand whose columns carry both parts of the same values choose by lo_part.
__device__ __forceinline__ unsigned int pack_part(float x, float y, float lo_part) {
#if PSA_BF16
    const float2 hi = __bfloat1622float2(__floats2bfloat162_rn(x, y));
#else
    const float2 hi = __half22float2(__floats2half2_rn(x, y));
#endif
    x = fmaf(-lo_part, hi.x, x);
    y = fmaf(-lo_part, hi.y, y);
    return pack_rest(x, y);
}

// Two floats as kv_t x2 hi and lo parts (x = hi + lo: about 22 bits in float16, 16 in bfloat16).
__device__ __forceinline__ void split2(float x, float y, unsigned int& hi, unsigned int& lo) {
    hi = pack_rest(x, y);
    lo = pack_rest(x, y);
}

// d += A (b[0] + ... + b[P-1]) through a fresh accumulator and one float32 add per element. The tensor cores
// add each k-step's products to the accumulator after aligning them to the largest term and truncating:
// chained into d, every product would lose the bits below d's last place, an error that grows with the
// running sum (benchmarks/NOTES.md, "Output precision of decode v3"). `with_lo` false multiplies b[0] only (a
// warp-uniform choice: a B operand that is of the KV's type already).
template <int P>
__device__ __forceinline__ void mma16_parts(float (&d)[4], const unsigned int (&a)[4], const unsigned int (&b)[P][2],
                                            bool with_lo = true) {
    float t[4] = {0.f, 0.f, 0.f, 0.f};
    mma16(t, a, b[0][0], b[0][1]);
    if (with_lo) {
#pragma unroll
        for (int p = 1; p < P; ++p) mma16(t, a, b[p][0], b[p][1]);
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) d[i] += t[i];
}

// An 8 x 8 matrix of 16-bit elements held as an MMA fragment (lane l: row l / 4, columns 2 (l % 4), + 1),
// transposed within the warp: lane l then holds row l / 4 of the transpose.
__device__ __forceinline__ unsigned int movmatrix_trans(unsigned int x) {
    unsigned int y;
    asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(y) : "r"(x));
    return y;
}
