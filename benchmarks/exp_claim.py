"""What balance inside one launch would pay per chunk slot (issue 14, item 5; NOTES, "A design for balance inside
one launch"): the latency of claiming a slot from a counter in global memory, and of one CTA seeing what another
published, on the GPU at hand. Three microkernels, timed by the SM clock inside the kernel (cycles, then µs at
the clock measured in the same run):

* ``claim``: thread 0 of each of C CTAs takes K slots one after another from a counter (``atomicAdd`` in global
  memory, each claim waiting for the previous one's answer), the CTAs sharing one counter per group of G CTAs
  (G = C: all contend on one counter; G = 1: each has its own).
* ``pingpong``: CTA pairs pass a token back and forth through two flags (a release store, the other side
  spinning on an acquire load): half a round trip is what a waiting CTA pays to see a finished slot.
* ``publish``: a CTA writes a slot's partial (D + 4 floats for each of H heads), fences, bumps a count; its
  partner spins on the count, then reads the partial back: the hand-over of one slot's result end to end.

    python benchmarks/exp_claim.py [--ctas 128] [--rounds 256]
"""

from __future__ import annotations

import argparse

import numpy as np

SOURCE = r"""
extern "C" __global__ void claim(unsigned int* counters, int group, int rounds, long long* cycles) {
    if (threadIdx.x != 0) return;
    unsigned int* c = counters + blockIdx.x / group;
    unsigned int t = 0;
    const long long t0 = clock64();
    // the address waits for the last answer (t < 2^30)
    for (int i = 0; i < rounds; ++i) t += atomicAdd(c + (t >> 30), 1u);
    const long long t1 = clock64();
    cycles[blockIdx.x] = (t1 - t0) + (t == 0xFFFFFFFFu);  // (t kept live)
}

__device__ __forceinline__ void store_release(unsigned int* p, unsigned int v) {
    asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ unsigned int load_acquire(const unsigned int* p) {
    unsigned int v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

// CTAs 2p and 2p + 1 pass a token `rounds` times: even waits for ack == i, then sets flag = i + 1; odd waits for
// flag == i + 1, then sets ack = i + 1.
extern "C" __global__ void pingpong(unsigned int* flags, int rounds, long long* cycles) {
    if (threadIdx.x != 0) return;
    unsigned int* flag = flags + (blockIdx.x / 2) * 64;  // a pair's two words on their own lines
    unsigned int* ack = flag + 32;
    const bool even = (blockIdx.x & 1) == 0;
    const long long t0 = clock64();
    for (int i = 0; i < rounds; ++i) {
        if (even) {
            while (load_acquire(ack) != (unsigned int)i) {}
            store_release(flag, i + 1);
        } else {
            while (load_acquire(flag) != (unsigned int)(i + 1)) {}
            store_release(ack, i + 1);
        }
    }
    cycles[blockIdx.x] = clock64() - t0;
}

// CTA 2p writes a partial of `words` floats (all its threads), fences, bumps the pair's count; CTA 2p + 1 spins on
// the count, reads the partial (all its threads) and acknowledges; `rounds` times.
extern "C" __global__ void publish(float* partials, unsigned int* flags, int words, int rounds, long long* cycles,
                                   float* sink) {
    const int pair = blockIdx.x / 2;
    float* part = partials + (long)pair * words;
    unsigned int* count = flags + pair * 64;
    unsigned int* ack = count + 32;
    const bool even = (blockIdx.x & 1) == 0;
    __shared__ unsigned int seen;
    float acc = 0.f;
    const long long t0 = clock64();
    for (int i = 0; i < rounds; ++i) {
        if (even) {
            if (threadIdx.x == 0) { while (load_acquire(ack) != (unsigned int)i) {} }
            __syncthreads();
            for (int w = threadIdx.x; w < words; w += blockDim.x) part[w] = (float)(i + w);
            __threadfence();
            __syncthreads();
            if (threadIdx.x == 0) store_release(count, i + 1);
        } else {
            if (threadIdx.x == 0) {
                while (load_acquire(count) != (unsigned int)(i + 1)) {}
                seen = i + 1;
            }
            __syncthreads();
            for (int w = threadIdx.x; w < words; w += blockDim.x) acc += __ldcg(part + w);
            __syncthreads();
            if (threadIdx.x == 0) store_release(ack, seen);
        }
    }
    if (threadIdx.x == 0) cycles[blockIdx.x] = clock64() - t0;
    if (acc == -1.f) sink[0] = acc;
}
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ctas", type=int, default=128, help="CTAs (all resident: at most one a multiprocessor)")
    ap.add_argument("--rounds", type=int, default=256, help="claims or round trips a CTA")
    ap.add_argument("--heads", type=int, default=4, help="query heads a slot's partial holds (publish)")
    ap.add_argument("--d", type=int, default=128, help="head dimension (publish: D + 4 floats a head)")
    args = ap.parse_args()

    import cupy

    mod = cupy.RawModule(code=SOURCE, options=("-std=c++17",))
    sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
    if args.ctas > sms or args.ctas % 2:
        raise SystemExit(f"--ctas must be even and at most the {sms} multiprocessors (all CTAs resident)")
    cycles = cupy.zeros(args.ctas, cupy.int64)

    # the SM clock: a kernel's clock64 span against its CUDA-event time
    spin = cupy.RawKernel(r"""extern "C" __global__ void spin(long long n, long long* out) {
        long long t0 = clock64(); while (clock64() - t0 < n) {} out[0] = clock64() - t0; }""", "spin")
    out = cupy.zeros(1, cupy.int64)
    spin((1,), (1,), (np.int64(1000), out))
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    start.record()
    spin((1,), (1,), (np.int64(20_000_000), out))
    end.record()
    end.synchronize()
    ghz = float(out[0]) / (cupy.cuda.get_elapsed_time(start, end) * 1e6)
    print(f"# SM clock {ghz:.2f} GHz; {args.ctas} CTAs, {args.rounds} rounds each")
    print("| what | cycles (median CTA) | µs | per |")
    print("|---|---|---|---|")

    def report(what, per):
        c = float(np.median(cupy.asnumpy(cycles))) / args.rounds
        print(f"| {what} | {c:.0f} | {c / ghz / 1e3:.3f} | {per} |", flush=True)

    counters = cupy.zeros(args.ctas, cupy.uint32)
    for group in (1, 8, args.ctas):
        for _ in range(2):  # the second run is reported (the first compiles and warms)
            counters.fill(0)
            mod.get_function("claim")((args.ctas,), (32,), (counters, np.int32(group), np.int32(args.rounds), cycles))
        cupy.cuda.Device().synchronize()
        report(f"claim, {group} CTA{'s' if group > 1 else ''} a counter", "claim")

    flags = cupy.zeros(args.ctas * 64, cupy.uint32)
    for _ in range(2):
        flags.fill(0)
        mod.get_function("pingpong")((args.ctas,), (32,), (flags, np.int32(args.rounds), cycles))
    cupy.cuda.Device().synchronize()
    report("ping-pong between two CTAs", "round trip")

    words = args.heads * (args.d + 4)
    partials = cupy.zeros((args.ctas // 2) * words, cupy.float32)
    sink = cupy.zeros(1, cupy.float32)
    for _ in range(2):
        flags.fill(0)
        mod.get_function("publish")((args.ctas,), (256,), (partials, flags, np.int32(words), np.int32(args.rounds),
                                                           cycles, sink))
    cupy.cuda.Device().synchronize()
    report(f"publish {words * 4} B, partner reads it", "hand-over and ack")


if __name__ == "__main__":
    main()
