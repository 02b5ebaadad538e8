"""The speculative schedule (``DecodePlan(speculate=m)``), issue 14 items 3-5: how far the prediction
reaches, how many groups resume the loop, and what each kernel costs, against the loop on the same cache.

    python benchmarks/exp_speculate.py [--cases gemma3:32768:1,...] [--margins 1.25,2,3] [--reps 20]
    python benchmarks/exp_speculate.py --compare 200   # loop vs speculate on small random problems

Each case builds the long-context Gemma-shaped cache of ``bench_decode.py --profile long-context`` (quant3
metadata, so ``stop="auto"`` is ``sketch_avg``), then per plan prints the share of blocks attended
(``num_used``) and speculated (``num_speculated``), the share of groups whose stop lay past the speculated
chunks (resumed), the step's median µs (16 calls in one CUDA graph), and each kernel's mean µs from
``torch.profiler`` (the speculative and resumed builds of the decode kernel have their own names).
``--compare`` runs random small problems through both schedules and prints every case whose blocks or
iterations differ.
"""

from __future__ import annotations

import argparse

import numpy as np


def kernel_times(run, calls: int = 8) -> dict:
    """Mean device µs per call of each kernel ``run()`` launches (torch.profiler sees CuPy's launches too)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    run()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            run()
        torch.cuda.synchronize()
    return {e.key: e.device_time_total / calls for e in prof.key_averages() if e.device_time_total > 0}


def cases(args):
    import cupy

    import psa_fast
    from bench_decode import PER_GRAPH, SHAPES, capture, long_context_fill, median_us

    stream = cupy.cuda.Stream(non_blocking=True)
    for case in args.cases.split(","):
        name, t, b = case.split(":")
        t, b = int(t), int(b)
        shape = SHAPES[name]
        layers = 4
        with stream:
            cache = psa_fast.PagedKVCache(num_layers=layers, batch=b, num_kv_heads=shape.hkv, head_dim=shape.d,
                                          max_tokens=t, block_size=shape.s, metadata="quant3")
            fill = long_context_fill(shape)
            qs = [fill(cache, layer) for layer in range(layers)]
            n = cache.nmax
            loop_step = max(8 * psa_fast._kernels.pick_cluster(b * shape.hkv), n // 64)
            plans = [("loop", dict(step=loop_step))]
            plans += [(f"speculate {m} step {st}", dict(step=st, speculate=m)) for m in args.margins
                      for st in args.steps]
            for label, opts in plans:
                p = psa_fast.plan(cache, num_q_heads=shape.hq, threshold=0.95, scale=shape.scale, **opts)
                used, spec, resumed = [], [], []
                for layer in range(layers):
                    dec = p.run(qs[layer], layer)
                    u = cupy.asnumpy(dec.num_used).astype(float)
                    used.append(u.mean() / n)
                    if dec.num_speculated is not None:
                        sp = cupy.asnumpy(dec.num_speculated).astype(float)
                        spec.append(np.maximum(sp, u).mean() / n)
                        resumed.append(np.mean(u > sp))

                def calls():
                    for i in range(PER_GRAPH):
                        p.run(qs[i % layers], i % layers)

                gr = capture(calls, stream)
                gr.launch(stream)
                us = median_us(lambda i: gr.launch(stream), stream, args.reps, 1) / PER_GRAPH
                kt = kernel_times(lambda: p.run(qs[0], 0))
                ks = ", ".join(f"{k} {v:.1f}" for k, v in sorted(kt.items(), key=lambda kv: -kv[1]))
                sp_txt = f"read {np.mean(spec):.1%}, resumed {np.mean(resumed):.0%}" if spec else ""
                print(f"{name} T={t} B={b} {label}: {us:.1f} us, attended {np.mean(used):.1%} {sp_txt} | {ks}",
                      flush=True)
        del cache
        cupy.get_default_memory_pool().free_all_blocks()


def compare(args):
    import cupy

    import psa_fast

    rng = np.random.default_rng(0)
    diff = 0
    for i in range(args.compare):
        hkv, g = int(rng.choice([1, 2])), int(rng.choice([1, 4]))
        d, s = int(rng.choice([64, 128])), int(rng.choice([5, 16]))
        t = int(rng.integers(20, 300))
        metadata = str(rng.choice(["cuboid_mean", "quant3"]))
        stop = str(rng.choice(["ema", "remaining", "seed", "sketch", "sketch_avg"]))
        step, margin = int(rng.choice([1, 2, 5])), float(rng.choice([0.01, 1.0, 4.0]))
        tau = float(rng.choice([0.5, 0.9, 0.95, 0.99]))
        sink, recent = int(rng.integers(0, 2)), int(rng.integers(0, 2))
        k = rng.standard_normal((hkv, t, d)).astype(np.float16)
        v = rng.standard_normal((hkv, t, d)).astype(np.float16)
        q = (rng.standard_normal((1, hkv * g, d)) * 2).astype(np.float32)
        blocks = psa_fast.KVBlocks.from_dense(cupy.asarray(k), cupy.asarray(v), block_size=s, metadata=metadata)
        n = blocks.num_blocks
        sink = min(sink, n)
        recent = min(recent, n - sink)
        got = []
        for spec in (None, margin):
            p = psa_fast.plan(blocks.cache, num_q_heads=hkv * g, threshold=tau, stop=stop, step=step,
                              sink_blocks=sink, recent_blocks=recent, speculate=spec)
            dec = p.run(cupy.asarray(q))
            got.append(dict(used=cupy.asnumpy(dec.num_used[0]), it=cupy.asnumpy(dec.iterations[0]),
                            why=cupy.asnumpy(dec.reason[0]), est=cupy.asnumpy(dec.mass_estimate[0]),
                            spec=None if dec.num_speculated is None else cupy.asnumpy(dec.num_speculated[0]),
                            out=cupy.asnumpy(dec.out[0])))
        a, c = got
        if not (np.array_equal(a["used"], c["used"]) and np.array_equal(a["it"], c["it"])):
            diff += 1
            print(f"#{i} n={n} hkv={hkv} g={g} d={d} s={s} {metadata} {stop} tau={tau} step={step} margin={margin} "
                  f"sink={sink} recent={recent}: loop used {a['used']} it {a['it']} why {a['why']} est "
                  f"{np.round(a['est'], 5)} | spec used {c['used']} it {c['it']} why {c['why']} est "
                  f"{np.round(c['est'], 5)} speculated {c['spec']} | "
                  f"max |dout| {np.abs(a['out'] - c['out']).max():.2e}",
                  flush=True)
    print(f"{diff} of {args.compare} differ", flush=True)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default="gemma3:32768:1,gemma3:32768:8,gemma3:131072:1,gemma3:131072:8")
    ap.add_argument("--margins", default="1.25,2,3")
    ap.add_argument("--steps", default="16,32")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--compare", type=int, default=0)
    args = ap.parse_args(argv)
    args.margins = [float(m) for m in args.margins.split(",")]
    args.steps = [int(x) for x in args.steps.split(",")]
    if args.compare:
        compare(args)
    else:
        cases(args)


if __name__ == "__main__":
    main()
