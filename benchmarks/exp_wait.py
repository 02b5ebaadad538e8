"""Experiment: how the offload loader waits between launches, in one run: polling mapped memory
(the default) vs synchronising on a CUDA event per launch. One layer, tau 0.95, step 64, pool = half
the KV cache, cold (pool emptied before each step) and warm.

    python benchmarks/exp_wait.py
"""
def main():
    import cupy

    import psa_fast
    from bench_offload import _events_us
    from psa_fast.offload import OffloadDecoder, OffloadKVCache
    from psa_fast.synthetic import fill_skewed, trace_block_offsets

    stream = cupy.cuda.Stream(non_blocking=True)
    print("| T | B | pool | wait | offload µs (median of 9) |\n|---|---|---|---|---|")
    for t, b in ((32768, 1), (32768, 4), (131072, 1)):
        dims = dict(num_layers=1, batch=b, num_kv_heads=8, head_dim=128, max_tokens=t, block_size=16)
        with stream:
            res = psa_fast.PagedKVCache(**dims)
            q = fill_skewed(res, 0, 32, trace_block_offsets(), seed=1)
            off = OffloadKVCache(num_slots=b * 8 * res.nmax // 2, **dims)
            for r in range(b):
                off.prefill(0, r, res._dense_view(res.k_pool, 0, r)[:, :t], res._dense_view(res.v_pool, 0, r)[:, :t])
            dec = OffloadDecoder(off, num_q_heads=32, threshold=0.95, stop="ema", step=64)
            for state in ("cold", "warm"):
                for rnd in range(2):  # alternate, twice, so drift shows
                    for wait in ("memory", "events"):
                        dec._wait = wait
                        dec.run(q)
                        stream.synchronize()
                        us = _events_us(lambda: dec.run(q), stream, 9, off.pool.clear if state == "cold" else None)
                        print(f"| {t // 1024}K | {b} | {state} | {wait} (round {rnd}) | {us:.0f} |", flush=True)
            del res, off
            cupy.get_default_memory_pool().free_all_blocks()


if __name__ == "__main__":
    main()
