"""What one launch streaming one request's K/V can reach, and how much of it is the slowest CTA (issue 14: the dense
kernel for one request, 1.2x its floor against 1.0x at B = 8; NOTES.md, twenty-first session: "~10 µs of each CTA is
not streaming").

A kernel that only reads (float4 ``__ldcs``, every CTA holding enough shared memory to sit alone on its SM, or half
of it for two an SM) streams ``--mb`` MB, a new slice of a buffer far larger than L2 at every repeat, in one of two
ways:

* ``static``: CTA i reads the i-th of ``grid`` equal contiguous slices (what the dense split build does: every split
  one contiguous run of positions);
* ``claimed KB``: the CTAs take units of KB from a counter in global memory (each claims its next unit while it reads
  the current one); the last CTA to leave zeroes the counter for the next launch.

Each CTA records ``%globaltimer`` at its start and end. Per variant the table gives the launch's time (median of
repeats, CUDA events around the launch: they include the host's launch, ~18 µs for an empty launch on the H200, so
compare variants by it, not with kernel durations), GB/s and its share of a device-to-device copy's in the same run,
and from the median repeat's timers: the span from the first CTA's start to the last one's end (the kernel's own
time, less its launch), the mean CTA end, and how much the last end trails the median end (the tail a static split
pays and claiming should remove).

    python benchmarks/exp_stream_tail.py [--mb 25,33.5,134,537] [--grids 128,132,264] [--units 64,256] [--reps 30]
"""

from __future__ import annotations

import argparse

SOURCE = r"""
extern "C" __global__ void
psa_stream(const float4* __restrict__ src, long total, long unit, unsigned int* counter,
           unsigned long long* times, float* sink)
{
    __shared__ long next_s;
    unsigned long long t0;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    const int nt = blockDim.x;
    // unit == 0: static, CTA i reads slice i; else units claimed from counter[0]
    long lo, hi;
    if (unit == 0) {
        const long per = (total + gridDim.x - 1) / gridDim.x;
        lo = min(total, (long)blockIdx.x * per);
        hi = min(total, lo + per);
    } else {
        if (threadIdx.x == 0) next_s = (long)atomicAdd(counter, 1u);
        __syncthreads();
        lo = min(total, next_s * unit);
        hi = min(total, lo + unit);
        __syncthreads();
    }
    while (lo < hi) {
        unsigned int claimed = 0;
        if (unit != 0 && threadIdx.x == 0) claimed = atomicAdd(counter, 1u);  // the next unit, while reading this one
        for (long i = lo + threadIdx.x; i < hi; i += 4 * nt) {
            float4 v[4];
#pragma unroll
            for (int u = 0; u < 4; ++u) v[u] = i + u * nt < hi ? __ldcs(src + i + u * nt) : acc;
#pragma unroll
            for (int u = 0; u < 4; ++u) acc.x += v[u].x + v[u].y + v[u].z + v[u].w;
        }
        if (unit == 0) break;
        if (threadIdx.x == 0) next_s = (long)claimed;
        __syncthreads();
        lo = min(total, next_s * unit);
        hi = min(total, lo + unit);
        __syncthreads();
    }
    __syncthreads();
    unsigned long long t1;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t1));
    if (threadIdx.x == 0) {
        times[2 * blockIdx.x] = t0;
        times[2 * blockIdx.x + 1] = t1;
        if (unit != 0) {
            __threadfence();
            if (atomicAdd(counter + 1, 1u) == gridDim.x - 1) {  // the last CTA: both counters back to zero
                counter[0] = 0u;
                counter[1] = 0u;
            }
        }
    }
    if (acc.x == 1234.5f) sink[0] = acc.x;  // never (the buffer is zero): keeps the loads
}
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", default="25,33.5,134,537", help="MB (1e6 bytes) one launch reads: SmolLM2 / Gemma 3 / "
                    "Llama-3.1-8B one layer at 32K, Llama at 128K")
    ap.add_argument("--grids", default="128,132,264", help="CTAs (above the SM count: two an SM)")
    ap.add_argument("--units", default="64,256", help="KB a claimed unit")
    ap.add_argument("--threads", type=int, default=1024)
    ap.add_argument("--reps", type=int, default=30)
    args = ap.parse_args()

    import cupy
    import numpy as np

    from psa_fast import _kernels

    sms = _kernels.num_sms()
    opt_in = int(cupy.cuda.Device().attributes["MaxSharedMemoryPerBlockOptin"])
    fn = cupy.RawKernel(SOURCE, "psa_stream")
    fn.compile()
    fn.max_dynamic_shared_size_bytes = opt_in - 1024

    sizes = [float(x) for x in args.mb.split(",")]
    pool = cupy.zeros(int(4 * max(sizes) * 1e6 / 4) + (1 << 20), dtype=cupy.float32)  # 4x the largest read
    sink = cupy.zeros(1, dtype=cupy.float32)
    counter = cupy.zeros(2, dtype=cupy.uint32)
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()

    def timed(launch) -> float:
        start.record()
        launch()
        stop.record()
        stop.synchronize()
        return cupy.cuda.get_elapsed_time(start, stop) * 1e3

    # the copy ceiling of this run: a device-to-device copy of 512 MB (read + write)
    a = pool[: 128 << 20]
    dst = cupy.empty_like(a)
    copy = sorted(timed(lambda: cupy.copyto(dst, a)) for _ in range(10))[5]
    ceiling = 2 * a.nbytes / copy / 1e3
    dst = None  # the memory back for the pool's reads
    print(f"# {sms} SMs; copy ceiling {ceiling:.0f} GB/s (512 MB copied in {copy:.1f} µs); {args.threads} threads a "
          f"CTA, one CTA an SM (two above {sms} CTAs); median of {args.reps}")
    empty = sorted(timed(lambda: fn((sms,), (args.threads,), (pool, np.int64(0), np.int64(0), counter,
                                                                  cupy.empty(2 * sms, cupy.uint64), sink),
                                    shared_mem=opt_in - 1024)) for _ in range(20))[10]
    print(f"# an empty launch of {sms} CTAs: {empty:.1f} µs\n")
    print("| MB | CTAs | split | µs (events) | GB/s (events) | % ceiling | µs at ceiling | span µs | mean end µs "
          "| last end - median end µs |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for mb in sizes:
        total = int(mb * 1e6) // 16
        slots = (pool.size * 4 // 16) // total
        for grid in (int(x) for x in args.grids.split(",")):
            smem = opt_in - 1024 if grid <= sms else opt_in // 2 - 1024
            times_d = cupy.zeros(2 * grid, cupy.uint64)
            for unit_kb in [0] + [int(x) for x in args.units.split(",")]:
                unit = unit_kb * 1024 // 16
                runs = []
                for r in range(args.reps + 3):
                    view = pool[(r % slots) * total * 4:]
                    us = timed(lambda: fn((grid,), (args.threads,), (view, np.int64(total), np.int64(unit), counter,
                                                                     times_d, sink), shared_mem=smem))
                    if r >= 3:
                        runs.append((us, times_d.get().reshape(grid, 2)))
                runs.sort(key=lambda x: x[0])
                us, t = runs[len(runs) // 2]
                t = (t - t[:, 0].min()).astype(np.float64) / 1e3
                ends = np.sort(t[:, 1])
                gbs = total * 16 / us / 1e3
                name = "static" if unit == 0 else f"claimed {unit_kb} KB"
                print(f"| {mb:g} | {grid} | {name} | {us:.1f} | {gbs:.0f} | {100 * gbs / ceiling:.0f}% | "
                      f"{total * 16 / ceiling / 1e3:.1f} | {ends[-1]:.1f} | {ends.mean():.1f} | "
                      f"{ends[-1] - np.median(ends):.1f} |", flush=True)
            if int(cupy.asnumpy(counter).any()):
                raise RuntimeError("the claim counter was not reset by the last CTA")


if __name__ == "__main__":
    main()
