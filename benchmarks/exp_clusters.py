"""How many of the decode loop's clusters the GPU holds at once (issue 14, item 3: one request on every SM).

One request's loop runs one cluster of CTAs a selection group (8 at Llama's shape: 64 of 132 SMs). Two clusters a
group would need all of them resident together, or a cluster waiting on the other for the chunk's statistics never
sees it run. The driver says how many clusters of a kernel can be resident at once
(``cuOccupancyMaxActiveClusters``; CuPy has no call for it: ``psa_fast._driver``). This script runs one step of a
plan at each shape, records the decode builds it compiled, and prints that count for each at its cluster size and
at the others a build could take (a kernel compiled with ``__cluster_dims__`` answers only for its own size; the
rest print "-").

    python benchmarks/exp_clusters.py [--shapes llama8b,gemma3] [--size 32768] [--clusters 8,4]

``--clusters``: the plan's cluster sizes to build (each build answers for its own size; 4 CTAs a cluster and four
clusters a group would fill 128 SMs for one Llama request if 32 of them fit).
"""

from __future__ import annotations

import argparse

from psa_fast._driver import launch_config, max_active_clusters


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="llama8b,gemma3")
    ap.add_argument("--size", type=int, default=32768)
    ap.add_argument("--clusters", default="8", help="the plans' cluster sizes, comma-separated")
    args = ap.parse_args()

    import cupy
    import numpy as np

    import psa_fast
    from psa_fast import _kernels
    from bench_decode import SHAPES

    built = []
    original = _kernels.kernel

    def recording(name, **options):
        fn = original(name, **options)
        if name == "decode" and options.get("cluster", 1) > 1:
            built.append((options, fn))
        return fn

    _kernels.kernel = recording
    print(f"# {_kernels.num_sms()} SMs; max active clusters (cuOccupancyMaxActiveClusters) of each loop build")
    print("| shape | build | block | dyn. smem KiB | cluster | max active clusters | at 2, 4, 8, 16 |")
    print("|---|---|---|---|---|---|---|")
    for name in args.shapes.split(","):
        shape = SHAPES[name]
        cache = psa_fast.PagedKVCache(num_layers=1, batch=1, num_kv_heads=shape.hkv, head_dim=shape.d,
                                      max_tokens=args.size, block_size=shape.s)
        rng = np.random.default_rng(0)
        k = cupy.asarray(rng.standard_normal((shape.hkv, args.size, shape.d)).astype(np.float16))
        cache.prefill(0, 0, k, k)
        q = cupy.asarray(rng.standard_normal((1, shape.hq, shape.d)).astype(np.float32))
        built.clear()
        for c in (int(x) for x in args.clusters.split(",")):
            psa_fast.plan(cache, num_q_heads=shape.hq, stop="ema", cluster=c).run(q)
        cupy.cuda.Device().synchronize()
        for options, fn in built:
            block, smem, cluster = options.get("warps", 8) * 32, fn.max_dynamic_shared_size_bytes, options["cluster"]
            gn = shape.hq // options["g"]
            own = max_active_clusters(fn.kernel.ptr, launch_config((cluster, gn, 1), block, smem, None))
            others = [max_active_clusters(fn.kernel.ptr, launch_config((c, 1, 1), block, smem, c))
                      for c in (2, 4, 8, 16)]
            tags = ",".join(f"{k}={v}" for k, v in sorted(options.items()) if k not in ("d", "s", "g", "cluster",
                                                                                      "warps"))
            print(f"| {name} | {tags} | {block} | {smem / 1024:.0f} | {cluster} | {own} | "
                  f"{', '.join('-' if o is None else str(o) for o in others)} |")
    _kernels.kernel = original


if __name__ == "__main__":
    main()
