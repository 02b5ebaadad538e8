"""Run the PSA decode kernel at 128K tokens (for ncu): psa mode, then top-k at the same budget.

    ncu -k regex:psa_decode --launch-skip 2 --launch-count 1 python benchmarks/ncu_decode.py [B] [warps] [cluster]
"""


def main() -> None:
    import sys

    import cupy

    import psa_fast
    from psa_fast.synthetic import fill_skewed, trace_block_offsets

    b = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    opts = dict(warps=int(sys.argv[2])) if len(sys.argv) > 2 else {}
    if len(sys.argv) > 3:
        opts["cluster"] = int(sys.argv[3])
    cache = psa_fast.PagedKVCache(num_layers=1, batch=b, num_kv_heads=8, head_dim=128, max_tokens=131072)
    q = fill_skewed(cache, 0, 32, trace_block_offsets(), seed=0)
    p = psa_fast.plan(cache, num_q_heads=32, threshold=0.95, step=128, **opts)
    for _ in range(3):
        p.run(q)
    k = int(cupy.asnumpy(p.num_used).mean())
    t = psa_fast.plan(cache, num_q_heads=32, mode="topk", k=k, **opts)
    for _ in range(3):
        t.run(q)
    cupy.cuda.Device().synchronize()
    print("blocks", k, "iterations", float(cupy.asnumpy(p.iterations).mean()))


if __name__ == "__main__":
    main()
