"""Is the dense split build's dependence on its split count a property of streaming on this GPU, or of the kernel?

The fifty-third session swept the split build's splits at Llama-3.1-8B's shape (32K, B = 2-16; results_h100_s53.md):
some counts lose 7-12% (2 splits at B = 5: 80 CTAs; 3 at B = 13: 312 CTAs) where their neighbours are at the floor,
and no model of waves fits. This launches a plain streaming kernel in the same shapes: N CTAs of 8 warps, one an SM
(its shared-memory ring keeps it so), each streaming its contiguous 1/N of B x 134 MB (K and V of one 32K request)
through a two-stage cp.async ring of UNROLL 16-byte copies a thread a stage, as the decode kernel moves K and V, and
recording its SM, start and end (``%globaltimer``). For N = 8 B x s at each split count s it prints the time
(median of ``--reps``, CUDA events), the read rate against the read-only ceiling of the same run, and the CTAs'
timeline: when the last one starts and how long after the median CTA the last one ends (the tail). With ``--s53
FILE`` (exp_dense_tune.py's jsonl) the split build's time at the same B and s sits beside it. If the plain kernel
loses at the same counts, the split rule is a property of the GPU's scheduling and can be fitted on this kernel for
any card; if not, the decode kernel's own start and end are what differ.

    python benchmarks/exp_split_waves.py --batches 5,6,11,13 --splits 1,2,3,4,6,8 --s53 s53d.jsonl
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from bench_decode import median_us, parse_ints, read_ceiling_gbs

REQUEST_BYTES = 32768 * 8 * 128 * 2 * 2  # K and V of one Llama-3.1-8B request at 32K, float16
THREADS = 256  # a CTA: 8 warps, as the dense split build's at D 128

SOURCE = r"""
// Each CTA streams its contiguous share through a two-stage cp.async ring in shared memory, as the decode kernel moves
// K and V (UNROLL 16-byte copies a thread a stage; the ring's size also keeps one CTA an SM).
__device__ __forceinline__ void copy16(unsigned int dst, const uint4* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src));
}
extern "C" __global__ void psa_wave_read(const uint4* __restrict__ x, long long per_cta, unsigned int* out,
                                         unsigned long long* times) {
    extern __shared__ uint4 ring[];  // 2 stages of UNROLL x blockDim.x 16-byte pieces
    unsigned long long t0 = 0, t1 = 0;
    if (threadIdx.x == 0) asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    const uint4* base = x + (long long)blockIdx.x * per_cta;
    const long long stage = (long long)UNROLL * blockDim.x, stages = per_cta / stage;
    const unsigned int ring0 = (unsigned int)__cvta_generic_to_shared(ring);
    for (long long c = 0; c < stages; ++c) {
        const unsigned int dst = ring0 + (unsigned int)(((c & 1) * stage + threadIdx.x) * 16);
#pragma unroll
        for (int k = 0; k < UNROLL; ++k)
            copy16(dst + k * blockDim.x * 16, base + c * stage + k * blockDim.x + threadIdx.x);
        asm volatile("cp.async.commit_group;");
        asm volatile("cp.async.wait_group 1;");  // the stage before this one has landed
        __syncthreads();                          // (before any thread refills it)
    }
    asm volatile("cp.async.wait_group 0;");
    unsigned int acc = 0u;
    for (long long i = stages * stage + threadIdx.x; i < per_cta; i += blockDim.x) acc ^= __ldcs(base + i).x;
    if (acc == 0x9e3779b9u) out[0] = acc;  // keeps the tail's loads; (almost) never runs
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned int sm;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t1));
        asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
        times[3 * blockIdx.x] = t0;
        times[3 * blockIdx.x + 1] = t1;
        times[3 * blockIdx.x + 2] = sm;
    }
}
"""


def timeline(times: np.ndarray) -> tuple[float, float]:
    """(last start, tail) in µs from a ``[N, 3]`` array of (start ns, end ns, SM): when the last CTA started after
    the first, and how long after the median CTA's end the last one ended."""
    start, end = times[:, 0].astype(np.float64), times[:, 1].astype(np.float64)
    return (start.max() - start.min()) / 1e3, (end.max() - np.median(end)) / 1e3


def split_build_us(path: str | None) -> dict[tuple[int, int], float]:
    """``{(B, splits): µs}`` of exp_dense_tune.py's jsonl rows (the mean of repeated rows; the plan's default row
    under its own split count); empty without a path."""
    if not path:
        return {}
    seen: dict[tuple[int, int], list[float]] = {}
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            seen.setdefault((r["B"], r["plan_splits"]), []).append(r["us"])
    return {k: float(np.mean(v)) for k, v in seen.items()}


def main(argv=None) -> None:
    import cupy

    from psa_fast import _kernels

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="3,5,6,9,11,12,13")
    ap.add_argument("--splits", default="1,2,3,4,5,6,8,11")
    ap.add_argument("--groups-per-request", type=int, default=8, help="KV heads a request (Llama-3.1-8B: 8)")
    ap.add_argument("--unroll", type=int, default=16, help="16-byte copies a thread a stage (2 stages in the ring)")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--s53", default=None, help="exp_dense_tune.py jsonl of the split build at the same shapes")
    ap.add_argument("--out", default=None, help=".npz of every launch's [N, 3] (start ns, end ns, SM) rows, keyed "
                    "'B<b>_s<s>', for reading the CTAs' placement and ends offline")
    args = ap.parse_args(argv)
    batches, splits = parse_ints(args.batches, "--batches"), parse_ints(args.splits, "--splits")
    if args.unroll < 1 or args.groups_per_request < 1:
        raise ValueError("--unroll and --groups-per-request: expected positive integers")
    split_build = split_build_us(args.s53)

    stream = cupy.cuda.Stream(non_blocking=True)
    ceiling = read_ceiling_gbs(stream)
    fn = cupy.RawKernel(SOURCE, "psa_wave_read", options=(f"-DUNROLL={args.unroll}",))
    ring = 2 * args.unroll * THREADS * 16
    fn.max_dynamic_shared_size_bytes = ring
    sms = _kernels.num_sms()
    print(f"# read-only ceiling {ceiling:.0f} GB/s; {sms} SMs; CTAs of {THREADS} threads, a ring of 2 x {args.unroll} "
          f"16-byte copies a thread ({ring // 1024} KiB of shared memory)")
    print("| B | splits | CTAs | waves | µs | GB/s | % of ceiling | SMs used | last start µs | tail µs "
          "| split build µs |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    kept = {}
    with stream:
        x = cupy.zeros(max(batches) * REQUEST_BYTES, cupy.uint8)
        out = cupy.zeros(1, cupy.uint32)
        for b in batches:
            for s in splits:
                n = args.groups_per_request * b * s
                per_cta = np.int64(b * REQUEST_BYTES // 16 // n)
                times = cupy.zeros((n, 3), cupy.uint64)

                def launch(i, n=n, per_cta=per_cta, times=times):
                    fn((n,), (THREADS,), (x, per_cta, out, times), shared_mem=ring)

                us = median_us(launch, stream, args.reps, 1)
                launch(0)
                stream.synchronize()
                rows = cupy.asnumpy(times)
                kept[f"B{b}_s{s}"] = rows
                start, tail = timeline(rows)
                rate = int(per_cta) * 16 * n / us / 1e3
                other = split_build.get((b, s))
                print(f"| {b} | {s} | {n} | {n / sms:.2f} | {us:.1f} | {rate:.0f} | {100 * rate / ceiling:.0f}% | "
                      f"{len(np.unique(rows[:, 2]))} | {start:.1f} | {tail:.1f} | "
                      f"{'-' if other is None else f'{other:.1f}'} |", flush=True)
    if args.out:
        np.savez_compressed(args.out, **kept)


if __name__ == "__main__":
    main()
