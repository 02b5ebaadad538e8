"""Where the offload decoder's time goes: host issue vs wall time per warm step (32K, B = 1, tau 0.95,
half the KV cache in the pool) for several lookaheads, then a cProfile of the loader's loop.

    python benchmarks/profile_offload.py
"""
import cProfile
import pstats
import time

import numpy as np


def main():
    import cupy

    import psa_fast
    from psa_fast.offload import OffloadDecoder, OffloadKVCache
    from psa_fast.synthetic import fill_skewed, trace_block_offsets

    t, b = 32768, 1
    dims = dict(num_layers=1, batch=b, num_kv_heads=8, head_dim=128, max_tokens=t, block_size=16)
    res = psa_fast.PagedKVCache(**dims)
    q = fill_skewed(res, 0, 32, trace_block_offsets(), seed=1)
    off = OffloadKVCache(num_slots=b * 8 * res.nmax // 2, **dims)
    off.prefill(0, 0, res._dense_view(res.k_pool, 0, 0)[:, :t], res._dense_view(res.v_pool, 0, 0)[:, :t])
    for la, unroll in ((1, 4),):
        dec = OffloadDecoder(off, num_q_heads=32, threshold=0.95, stop="ema", step=64, lookahead=la, unroll=unroll)
        for _ in range(3):
            dec.run(q)
        cupy.cuda.Device().synchronize()
        dec.stats["host_wait_s"] = 0.0
        it0 = dec.stats["iterations"]
        t0 = time.perf_counter()
        for _ in range(10):
            dec.run(q)
        host = (time.perf_counter() - t0) / 10
        cupy.cuda.Device().synchronize()
        wall = (time.perf_counter() - t0) / 10
        print(f"lookahead {la}, unroll {unroll}: host issue {host * 1e6:.0f} us/step, wall {wall * 1e6:.0f} us/step, "
              f"iterations {(dec.stats['iterations'] - it0) / 10:.0f}, host waiting on events "
              f"{dec.stats['host_wait_s'] / 10 * 1e6:.0f} us/step", flush=True)
    # cProfile sees only its own thread: run a step's stages and the loader's body in this one
    def stages():
        t = [time.perf_counter()]
        dec.load_query(q, 0)
        dec.estimate(0)
        dec.order(0)
        t.append(time.perf_counter())
        dec._token += 1
        dec._reset_state()
        t.append(time.perf_counter())
        dec._loader(0, dec._token, [])
        t.append(time.perf_counter())
        cupy.cuda.Device().synchronize()
        t.append(time.perf_counter())
        return np.diff(t) * 1e6

    parts = np.median([stages() for _ in range(10)], axis=0)
    print("host us: query+estimate+order %.0f, reset %.0f, loader %.0f, then GPU drain %.0f" % tuple(parts))
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(5):
        stages()
    prof.disable()
    pstats.Stats(prof).sort_stats("tottime").print_stats(30)


if __name__ == "__main__":
    main()
