"""A captured layer's decode steps in order on the GPU: PSA's plain loop against ``first_chunk="previous"``.

Replaying one query every call (bench_decode's ``--profile real``) would make the previous call's stop an oracle.
Here every call is a different decode step: the trace's queries in order, each request at its own position
(request ``r`` runs the trace's step ``(i + 4 r) mod S`` at call ``i``: a batch holds different steps, as a model's
does), its length set to that position + 1 before the call. Each layer of the cache holds the same captured K/V (as
many layers as keep the timed calls out of L2, ``bench_decode.rotating_layers``), and a decode step runs every layer
in turn, so each layer's plan state sees the previous decode step, as in a model. One CUDA graph holds all the
steps; it is replayed a few times first (the state settles) and then timed (median of ``--reps``). The lengths'
copy (one small kernel a decode step) is timed alone and taken off. (The cache holds the capture's whole length;
a shorter length leaves the last block's metadata covering up to 124 tokens past the query: the estimate of one
block of ~2,000, harmless to the timing.)

Blocks read, iterations and the error against psa_fast dense come from one more pass, eager, over layer 0.

    python benchmarks/exp_previous_steps.py --kv .gl/gemma3_xml_l17_32k.npz --batches 1,8,32
"""

from __future__ import annotations

import argparse

import numpy as np


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kv", required=True, help="a captured layer (.npz, benchmarks/slice_trace.py)")
    ap.add_argument("--shape", default="gemma3")
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--stop", default="ema")
    ap.add_argument("--fixed", type=int, default=None, help="also a plan whose first chunk is this many blocks")
    ap.add_argument("--stages", action="store_true",
                    help="also each plan's stages timed apart by CUDA events (eager, the latest step, layer 0)")
    ap.add_argument("--unaliased", action="store_true",
                    help="also first_chunk='previous' reading a frozen copy of the previous plan's stops (taken after "
                         "the warm-up) instead of the num_used it writes: is one array read and written the cost?")
    ap.add_argument("--same", action="store_true",
                    help="every call the latest decode step (the previous stop an oracle: the schedule's cost alone)")
    args = ap.parse_args(argv)

    import cupy

    import psa_fast
    from psa_fast import _kernels
    from bench_decode import (SHAPES, capture, copy_ceiling_gbs, floor_bytes, floor_us, median_us, rel_err,
                              rotating_layers)

    shape = SHAPES[args.shape]
    z = np.load(args.kv)
    q_all, k_all, v_all = z["q"], z["k"], z["v"]
    positions = np.asarray(z["positions"])
    steps = np.argsort(positions, kind="stable")
    t = int(positions.max()) + 1
    if (q_all.shape[2], k_all.shape[1], q_all.shape[3]) != (shape.hq, shape.hkv, shape.d):
        raise SystemExit(f"the trace has Hq {q_all.shape[2]}, Hkv {k_all.shape[1]}, D {q_all.shape[3]}; "
                         f"--shape {shape.name} needs {shape.hq}, {shape.hkv}, {shape.d}")
    # --unaliased: the decode launches of a plan whose num_used (by pointer) is listed here read this array instead
    swaps = {}
    if args.unaliased:
        launch_decode = _kernels.decode

        def decode(*a, first_len=None, first_prev=False, **kw):
            if first_prev:
                first_len = swaps.get(a[8].data.ptr, first_len)  # a[8]: num_used
            return launch_decode(*a, first_len=first_len, first_prev=first_prev, **kw)

        _kernels.decode = decode
    stream = cupy.cuda.Stream(non_blocking=True)
    ceiling = copy_ceiling_gbs(stream)
    what = "the latest decode step every call" if args.same else f"{steps.size} decode steps in order"
    print(f"# {args.kv}: {what} (positions {positions.min()}..{positions.max()}), stop {args.stop}, copy ceiling "
          f"{ceiling:.0f} GB/s")
    print("| T | B | method | µs a call | floor µs | step ÷ floor | vs dense | blocks read "
          "| iterations (mean / max) | rel. error |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for b in (int(x) for x in args.batches.split(",")):
        layers = rotating_layers(shape, t, b)
        cache = psa_fast.PagedKVCache(num_layers=layers, batch=b, num_kv_heads=shape.hkv, head_dim=shape.d,
                                      max_tokens=t, block_size=shape.s)
        k, v = cupy.asarray(k_all[0, :, :t]), cupy.asarray(v_all[0, :, :t])
        for layer in range(layers):
            for r in range(b):
                cache.prefill(layer, r, k, v)
        pick = np.array([[steps[-1 if args.same else (i + 4 * r) % steps.size] for r in range(b)]
                         for i in range(steps.size)])
        lens = cupy.asarray((positions[pick] + 1).astype(np.int32))  # [steps, B]
        qs = [cupy.asarray(q_all[0, pick[i], :, :].astype(np.float32)) for i in range(steps.size)]  # [B, Hq, D]
        plans = {"psa_fast dense": psa_fast.plan(cache, num_q_heads=shape.hq, mode="dense"),
                 f"PSA τ=0.95 {args.stop}": psa_fast.plan(cache, num_q_heads=shape.hq, stop=args.stop),
                 f"PSA τ=0.95 {args.stop}, first_chunk previous": psa_fast.plan(
                     cache, num_q_heads=shape.hq, stop=args.stop, first_chunk="previous")}
        previous = plans[f"PSA τ=0.95 {args.stop}, first_chunk previous"]
        if args.unaliased:
            unaliased = psa_fast.plan(cache, num_q_heads=shape.hq, stop=args.stop, first_chunk="previous")
            frozen = cupy.zeros_like(unaliased.num_used_layers)
            swaps.update({unaliased.num_used_layers[layer].data.ptr: frozen[layer] for layer in range(layers)})
            plans[f"PSA τ=0.95 {args.stop}, first_chunk previous, unaliased"] = unaliased
        if args.fixed:
            plans[f"PSA τ=0.95 {args.stop}, first_chunk {args.fixed}"] = psa_fast.plan(
                cache, num_q_heads=shape.hq, stop=args.stop, first_chunk=args.fixed)

        def sequence(plan):
            def run():
                for i in range(steps.size):
                    cache.seq_lens[...] = lens[i]
                    if plan is not None:
                        for layer in range(layers):
                            plan.run(qs[i], layer=layer)
            return run

        calls = steps.size * layers
        with stream:
            graphs = {name: capture(sequence(p), stream) for name, p in plans.items()}
            copies = capture(sequence(None), stream)
            for gr in list(graphs.values()) + [copies]:
                for _ in range(3):
                    gr.launch(stream)
            if args.unaliased:
                frozen[...] = previous.num_used_layers  # the aliased plan's stops after the warm-up, read from now on
            base = median_us(lambda i: copies.launch(stream), stream, args.reps, 1)
            times = {name: (median_us(lambda i, g=gr: g.launch(stream), stream, args.reps, 1) - base) / calls
                     for name, gr in graphs.items()}
            stats = {name: {"used": [], "it": [], "err": []} for name in plans}
            for i in range(steps.size):
                cache.seq_lens[...] = lens[i]
                dense = plans["psa_fast dense"].run(qs[i], layer=0).out.copy()
                for name, p in plans.items():
                    dec = p.run(qs[i], layer=0)
                    s = stats[name]
                    blocks = -(-cupy.asnumpy(lens[i]) // shape.s)  # [B]
                    s["used"].append(cupy.asnumpy(dec.num_used) / blocks[:, None])
                    s["it"].append(cupy.asnumpy(dec.iterations))
                    s["err"].append(rel_err(dec.out, dense))
            stream.synchronize()
        n_blocks = -(-t // shape.s)
        for name in plans:
            s = stats[name]
            share = float(np.mean(s["used"])) if name != "psa_fast dense" else 1.0
            meta = None if name == "psa_fast dense" else "cuboid_mean"
            fl = floor_us(floor_bytes(shape, t=t, b=b, blocks_read=min(n_blocks, share * n_blocks), metadata=meta),
                          ceiling)
            it = np.array(s["it"])
            us = times[name]
            print(f"| {t // 1024}K | {b} | {name} | {us:.1f} | {fl:.1f} | {us / fl:.2f} | "
                  f"{times['psa_fast dense'] / us:.2f}× | {share:.1%} | "
                  f"{it.mean():.2f} / {it.max()} | {float(np.mean(s['err'])):.4f} |", flush=True)
        if args.stages:
            with stream:
                cache.seq_lens[...] = lens[-1]
                for name, p in plans.items():
                    if p.mode == "dense":
                        continue
                    stages = {"query": lambda p=p: p.load_query(qs[-1], 0), "estimate": lambda p=p: p.estimate(0),
                              "order": lambda p=p: p.order(0), "attend": lambda p=p: p.attend(0)}
                    got = []
                    for stage, fn in stages.items():
                        ev = [(cupy.cuda.Event(), cupy.cuda.Event()) for _ in range(args.reps * 5)]
                        for a, e in ev:
                            for other, g in stages.items():  # the stages before it, untimed
                                if other == stage:
                                    break
                                g()
                            a.record(stream)
                            fn()
                            e.record(stream)
                        stream.synchronize()
                        got.append(f"{stage} {np.median([cupy.cuda.get_elapsed_time(a, e) * 1e3 for a, e in ev]):.1f}")
                    print(f"# B = {b}, {name}, eager µs by stage (median): {', '.join(got)}", flush=True)


if __name__ == "__main__":
    main()
