"""What a launch of the loop kernel's shape costs with nothing to do: an empty kernel of ``--groups`` groups of
``--cluster`` CTAs (``__cluster_dims__``; 1: no cluster) of ``--threads`` threads, each given ``--smem`` KiB of
dynamic shared memory, timed per launch in a CUDA graph of bench_decode.PER_GRAPH launches (as the bench's rows are).
Bodies: ``empty``; ``sync``, one cluster barrier with its release (``barrier.cluster.arrive.release`` + ``wait``,
as cluster_sync); ``relaxed``, the same barrier with a relaxed arrival (no ``MEMBAR.ALL.GPU``).

    python benchmarks/exp_launch_shape.py --groups 8 --clusters 1,8 --smem 0,96,212 --bodies empty,sync,relaxed
    python benchmarks/exp_launch_shape.py --clusters 8 --smem 0,212 --bodies empty --after 0,212 --carveout=-2,100

``--after KIB`` times launches in pairs: each configuration's launch, then the same kernel given KIB (so a step's
small kernel after the loop's 212 KiB, or the loop after it); against the two rows alone, a pair that costs more says
the SMs pay to change their shared-memory configuration between the two. ``--carveout`` sets the kernel's preferred
carve-out (percent; -1 the driver's default; -2 not set), as ``_kernels.PREFERRED_CARVEOUT`` (written
``--carveout=-2,100``: argparse takes a bare ``-2,100`` for an option).

The sixty-ninth session's loop clock with K/V from HBM read 17.2 µs for the kernel (rank 0's first clock read to its
last) where the profiler read 21.6 for Llama's one request at 32K (5% profile, clusters of 8, 192 KiB of rings and
~20 KiB static): this says how much of the 4.4 µs a launch of that shape costs before any work.
"""

from __future__ import annotations

import argparse
import itertools

BODIES = {
    "empty": "",
    "sync": 'asm volatile("barrier.cluster.arrive.release.aligned;\\n\\tbarrier.cluster.wait.acquire.aligned;" ::: '
            '"memory");',
    "relaxed": 'asm volatile("barrier.cluster.arrive.relaxed.aligned;\\n\\tbarrier.cluster.wait.acquire.aligned;" ::: '
               '"memory");',
}


def launch_source(cluster: int, body: str) -> str:
    """CUDA source of ``psa_launch_probe``: a kernel of clusters of ``cluster`` CTAs (none for 1) whose threads run
    ``BODIES[body]`` (a cluster barrier needs a cluster: ``sync`` and ``relaxed`` need ``cluster >= 2``)."""
    if body not in BODIES:
        raise ValueError(f"body must be one of {sorted(BODIES)}, got {body!r}")
    if cluster < 1 or (cluster > 1 and cluster & (cluster - 1)) or cluster > 16:
        raise ValueError(f"cluster must be 1 or a power of two up to 16, got {cluster}")
    if body != "empty" and cluster == 1:
        raise ValueError(f"body {body!r} is a cluster barrier: it needs cluster >= 2")
    dims = f"__cluster_dims__({cluster}, 1, 1) " if cluster > 1 else ""
    return ('extern "C" __global__ void ' + dims + "psa_launch_probe(int* out) {\n"
            "    extern __shared__ int dyn[];\n"
            f"    {BODIES[body]}\n"
            "    if (out != nullptr && threadIdx.x == 0) out[blockIdx.x] = dyn[0];  // (never: out is null)\n"
            "}\n")


def configurations(clusters: list[int], smem_kib: list[int], bodies: list[str]) -> list[tuple[int, int, str]]:
    """``(cluster, smem KiB, body)`` of every combination that can run: the barrier bodies only on clusters."""
    return [(c, k, body) for c in clusters for k in smem_kib for body in bodies if body == "empty" or c > 1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--groups", type=int, default=8, help="groups (a cluster each): one Llama request's 8")
    ap.add_argument("--clusters", default="1,8", help="CTAs a group, comma-separated (1: no cluster)")
    ap.add_argument("--threads", type=int, default=256, help="threads a CTA (the loop's 8 warps)")
    ap.add_argument("--smem", default="0,96,212", help="KiB of dynamic shared memory a CTA, comma-separated")
    ap.add_argument("--bodies", default="empty,sync,relaxed", help=f"kernel bodies, comma-separated: {sorted(BODIES)}")
    ap.add_argument("--after", default="", help="KiB of a second launch after each (pairs), comma-separated")
    ap.add_argument("--carveout", default="-2", help="preferred carve-outs (percent; -1 default, -2 unset)")
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    try:
        clusters = [int(x) for x in args.clusters.split(",")]
        smem_kib = [int(x) for x in args.smem.split(",")]
        after_kib = [int(x) for x in args.after.split(",")] if args.after else [None]
        carveouts = [int(x) for x in args.carveout.split(",")]
    except ValueError:
        ap.error("--clusters, --smem, --after and --carveout take comma-separated integers")
    bodies = args.bodies.split(",")
    if args.groups < 1 or args.threads < 32 or args.threads % 32 or args.threads > 1024:
        ap.error(f"--groups must be >= 1 and --threads a multiple of 32 in [32, 1024], got {args.groups}, "
                 f"{args.threads}")
    if any(k < 0 or k > 227 for k in smem_kib + [a for a in after_kib if a is not None]):
        ap.error(f"--smem and --after take KiB in [0, 227], got {args.smem!r}, {args.after!r}")
    if any(c < -2 or c > 100 for c in carveouts):
        ap.error(f"--carveout takes percents in [0, 100], -1 or -2, got {args.carveout}")
    for c in clusters:
        for body in bodies:
            try:
                launch_source(c, body if c > 1 else "empty")
            except ValueError as e:
                ap.error(str(e))

    import cupy
    import numpy as np
    from bench_decode import PER_GRAPH, per_call_us

    from psa_fast import _kernels

    stream = cupy.cuda.Stream(non_blocking=True)
    null = np.uint64(0)
    print(f"# {cupy.cuda.runtime.getDeviceProperties(0)['name'].decode()}: empty launches, {args.groups} groups, "
          f"{args.threads} threads a CTA, {PER_GRAPH} launches a graph, median of {args.reps}")
    print("| CTAs a group | CTAs | KiB a CTA | body | then KiB | carve-out | µs a call |")
    print("|---|---|---|---|---|---|---|")
    for (c, kib, body), after, carve in itertools.product(configurations(clusters, smem_kib, bodies), after_kib,
                                                          carveouts):
        fn = cupy.RawKernel(launch_source(c, body), "psa_launch_probe", options=("-std=c++17",))
        fn.compile()
        smem = kib * 1024
        _kernels._with_smem(fn, max(smem, (after or 0) * 1024))
        if carve != -2:
            fn.preferred_shared_memory_carveout = carve

        def launch(layer, fn=fn, c=c, smem=smem, after=after):
            fn((c * args.groups,), (args.threads,), (null,), shared_mem=smem)
            if after is not None:
                fn((c * args.groups,), (args.threads,), (null,), shared_mem=after * 1024)

        with stream:
            us = per_call_us(launch, 1, stream, args.reps)
        print(f"| {c} | {c * args.groups} | {kib} | {body} | {'-' if after is None else after} | {carve} | "
              f"{us:.2f} |", flush=True)


if __name__ == "__main__":
    main()
