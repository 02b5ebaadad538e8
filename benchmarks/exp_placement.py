"""Where a launch's CTAs land, and whether it matters for the bytes they stream (issue 14: the grid build's attend).

The thirty-fifth session's loop clock (`device_pending.sh s35a`) gave Gemma 3's loop at 32K, B = 8, eight CTAs a
group, an attend of 18.0 µs as clusters of 8 and 23.0 µs on the grid build, the same blocks on the same number of
CTAs. A cluster's CTAs share one GPC; the grid's 64 CTAs go wherever the block scheduler puts them. This script asks
three things of the GPU, every CTA holding an SM's shared memory (one CTA an SM, as the decode builds do):

1. which SMs share a GPC: clusters of 16, 8 and 4 record their SMs (`%smid`); SMs met in one cluster are joined;
2. which SMs a plain launch of N CTAs takes (N = 8 .. all SMs), and how many GPCs that is;
3. what N SMs stream from HBM, GB/s, when they are the plain launch's SMs, N SMs spread evenly over the GPCs, or N
   SMs packed into as few GPCs as hold them (one launch of a CTA an SM; only the chosen SMs read, each its own
   slice of a buffer far larger than L2, median of repeats by CUDA events).

    python benchmarks/exp_placement.py [--counts 16,32,64,128] [--mib 8] [--reps 20]
"""

from __future__ import annotations

import argparse

SOURCE = r"""
extern "C" __global__ void
#if CL > 1
__cluster_dims__(CL, 1, 1)
#endif
psa_place(int* smid_out, const float4* __restrict__ src, long per_cta, const int* __restrict__ slot_of_sm,
          float* sink)
{
    unsigned s;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
    const int cta = blockIdx.x;
    if (threadIdx.x == 0 && smid_out) smid_out[cta] = (int)s;
    if (!slot_of_sm) return;
    const int slot = slot_of_sm[s];
    if (slot < 0) return;
    const float4* p = src + slot * per_cta;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    for (long i = threadIdx.x; i < per_cta; i += 4 * blockDim.x) {
        float4 v[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) v[u] = i + u * blockDim.x < per_cta ? __ldcs(p + i + u * blockDim.x) : acc;
#pragma unroll
        for (int u = 0; u < 4; ++u) acc.x += v[u].x + v[u].y + v[u].z + v[u].w;
    }
    if (acc.x == 1234.5f) sink[0] = acc.x;  // never (the buffer is zero): keeps the loads
}
"""


def gpcs_of(place_fn, sms: int, smem: int, null, sizes=(16, 8, 4), rounds: int = 6) -> list[list[int]]:
    """The SMs of each GPC, found by joining the SMs of every cluster of ``sizes`` over ``rounds`` launches."""
    import cupy
    import numpy as np

    parent = list(range(sms))

    def find(a: int) -> int:
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    for c in sizes:
        fn = place_fn(c)
        n = c * max(1, sms // c)
        out = cupy.full(n, -1, dtype=cupy.int32)
        for _ in range(rounds):
            fn((n,), (32,), (out, null, np.int64(0), null, null), shared_mem=smem)
            ids = out.get().reshape(-1, c)
            for row in ids:
                for x in row[1:]:
                    parent[find(int(x))] = find(int(row[0]))
    groups: dict[int, list[int]] = {}
    for s in range(sms):
        groups.setdefault(find(s), []).append(s)
    return sorted(groups.values(), key=lambda g: g[0])


def spread(gpcs: list[list[int]], n: int) -> list[int]:
    """``n`` SMs taken round-robin over the GPCs (each GPC's SMs in order)."""
    out, i = [], 0
    queues = [list(g) for g in gpcs]
    while len(out) < n and any(queues):
        q = queues[i % len(queues)]
        if q:
            out.append(q.pop(0))
        i += 1
    return out


def packed(gpcs: list[list[int]], n: int) -> list[int]:
    """``n`` SMs filling the largest GPCs first."""
    return [s for g in sorted(gpcs, key=len, reverse=True) for s in g][:n]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--counts", default="16,32,64,128", help="CTAs (SMs) of the plain launches and reading sets")
    ap.add_argument("--mib", type=float, default=8.0, help="MiB each reading SM streams")
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()

    import functools

    import cupy
    import numpy as np

    from psa_fast import _kernels

    sms = _kernels.num_sms()
    smem = int(cupy.cuda.Device().attributes["MaxSharedMemoryPerBlockOptin"]) - 1024  # one CTA an SM

    @functools.lru_cache(maxsize=None)
    def place_fn(c: int):
        fn = cupy.RawKernel(SOURCE, "psa_place", options=(f"-DCL={c}",))
        fn.compile()
        fn.max_dynamic_shared_size_bytes = smem
        _kernels.allow_cluster(fn, c)
        return fn

    null = np.uint64(0)
    gpcs = gpcs_of(place_fn, sms, smem, null)
    gpc_of = {s: i for i, g in enumerate(gpcs) for s in g}
    print(f"# {sms} SMs in {len(gpcs)} GPCs (joined by clusters of 16, 8, 4): sizes {[len(g) for g in gpcs]}")
    for i, g in enumerate(gpcs):
        print(f"#   GPC {i}: SMs {g}")

    counts = [int(x) for x in args.counts.split(",")]
    plain = {}
    print("\n| plain launch, CTAs | SMs taken | GPCs touched | CTAs a GPC | first SMs |")
    print("|---|---|---|---|---|")
    for n in counts:
        out = cupy.full(n, -1, dtype=cupy.int32)
        place_fn(1)((n,), (32,), (out, null, np.int64(0), null, null), shared_mem=smem)
        ids = [int(x) for x in out.get()]
        plain[n] = ids
        per = np.bincount([gpc_of[s] for s in ids], minlength=len(gpcs))
        print(f"| {n} | {len(set(ids))} | {int((per > 0).sum())} | {per.tolist()} | {ids[:12]} |")

    per_cta = int(args.mib * 2**20) // 16
    src = cupy.zeros(per_cta * sms * 4, dtype=cupy.float32)  # a float4 is 4 floats
    sink = cupy.zeros(1, dtype=cupy.float32)
    fn = place_fn(1)
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    print(f"\n| SMs reading | set | GPCs | µs (median of {args.reps}) | GB/s | GB/s an SM |")
    print("|---|---|---|---|---|---|")
    for n in counts + [sms]:
        sets = {"plain launch": plain.get(n), "spread over GPCs": spread(gpcs, n), "packed GPCs": packed(gpcs, n)}
        for name, chosen in sets.items():
            if chosen is None:
                continue
            slot = np.full(sms, -1, dtype=np.int32)
            slot[chosen] = np.arange(len(chosen), dtype=np.int32)
            slot_d = cupy.asarray(slot)
            times = []
            for r in range(args.reps + 2):
                start.record()
                fn((sms,), (1024,), (null, src, np.int64(per_cta), slot_d, sink), shared_mem=smem)
                stop.record()
                stop.synchronize()
                if r >= 2:
                    times.append(cupy.cuda.get_elapsed_time(start, stop) * 1e3)
            us = float(np.median(times))
            gbs = len(chosen) * per_cta * 16 / us / 1e3
            touched = len({gpc_of[s] for s in chosen})
            print(f"| {len(chosen)} | {name} | {touched} | {us:.1f} | {gbs:.0f} | {gbs / len(chosen):.1f} |")


if __name__ == "__main__":
    main()
