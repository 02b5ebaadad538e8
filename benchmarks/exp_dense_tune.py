"""The dense paged decode kernel's launch shape, swept: warps per CTA, prefetch stages and split-KV CTAs per group,
for one decode step of a model shape (random K/V: dense reads every block whatever they hold).

Each variant is timed as bench_decode times a stage (16 calls over rotating layers in one CUDA graph, median of
``--reps`` launches, CUDA events), beside torch SDPA on the same memory, and checked against the default plan's
output (the same attention summed in another split: float32 rounding, budget 1e-3 relative).

    python benchmarks/exp_dense_tune.py --shape gemma3 --sizes 32768 --batches 1,8,32 --out dense_tune.jsonl
"""

from __future__ import annotations

import argparse
import itertools
import json

from bench_decode import (SHAPES, copy_ceiling_gbs, floor_us, kv_layer_bytes, parse_ints, per_call_us,
                          random_cache, read_ceiling_gbs, rotating_layers)


def variants(d: int, s: int, g: int, default_splits: int, default_only: bool = False, groups: int | None = None,
             splits: list[int] | None = None):
    """(warps, stages, splits) to try, each launch shape once after ``decode_config`` fits it to shared memory;
    splits None is the plan's default (about one wave over the SMs). ``default_only``: the plan's own shape (warps and
    stages None: whatever DecodePlan picks, so a launch rule switched on by exp_kernels_attr.py is what is timed);
    ``splits``: the plan's own shape at its default and at each of these splits."""
    from psa_fast import _kernels

    if default_only or splits:
        for n in [None] + sorted(set(splits or [])):
            yield None, None, n
        return
    split_options = [None] + sorted({max(1, default_splits // 2), default_splits * 2, default_splits * 4})
    seen = set()
    for warps, stages in itertools.product((1, 2, 4, 8), (2, 3, 4, 6)):
        fitted = _kernels.decode_config(d=d, s=s, g=g, version=3, warps=warps, stages=stages)[1:3]
        if fitted in seen:
            continue
        seen.add(fitted)
        for splits in split_options:
            yield fitted[0], fitted[1], splits


def main() -> None:
    import cupy
    import torch

    import psa_fast
    from psa_fast import _kernels

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="gemma3", choices=sorted(SHAPES))
    ap.add_argument("--sizes", default="32768")
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", default="dense_tune.jsonl")
    ap.add_argument("--default-only", action="store_true", help="time the plan's own launch shape only")
    ap.add_argument("--splits", default="", help="comma list: the plan's launch shape at these split counts (and its "
                    "default) instead of the full sweep, e.g. 1,2,3,6 (whole waves against the rounded-down one)")
    args = ap.parse_args()
    split_list = parse_ints(args.splits, "--splits") if args.splits.strip() else []
    shape = SHAPES[args.shape]
    stream = cupy.cuda.Stream(non_blocking=True)
    ceiling, read_ceiling = copy_ceiling_gbs(stream), read_ceiling_gbs(stream)
    print(f"# {shape.name}: Hq {shape.hq}, Hkv {shape.hkv}, D {shape.d}, S {shape.s}; copy ceiling {ceiling:.0f} GB/s, "
          f"read-only ceiling {read_ceiling:.0f} GB/s")
    for t, b in itertools.product([int(x) for x in args.sizes.split(",")], [int(x) for x in args.batches.split(",")]):
        n = -(-t // shape.s)
        layers = rotating_layers(shape, t, b)
        per_layer = kv_layer_bytes(shape, t, b)
        with stream:
            rng = cupy.random.default_rng(0)
            cache = random_cache(shape, t, b, layers, rng)
            qs = [rng.standard_normal((b, shape.hq, shape.d), dtype=cupy.float32).astype(cupy.float16)
                  for _ in range(layers)]

            def graph_us(fn):
                return per_call_us(fn, layers, stream, args.reps)

            tk = [torch.from_dlpack(cache.k_pool.reshape(layers, b, shape.hkv, n * shape.s, shape.d)[i])
                  for i in range(layers)]
            tv = [torch.from_dlpack(cache.v_pool.reshape(layers, b, shape.hkv, n * shape.s, shape.d)[i])
                  for i in range(layers)]
            tq = [torch.from_dlpack(q).unsqueeze(2) for q in qs]
            with torch.cuda.stream(torch.cuda.ExternalStream(stream.ptr)):
                sdpa = graph_us(lambda i: torch.nn.functional.scaled_dot_product_attention(
                    tq[i], tk[i], tv[i], enable_gqa=True))
            floor = floor_us(per_layer, ceiling)  # K and V of one layer over the copy ceiling
            read_floor = floor_us(per_layer, read_ceiling)  # the same bytes at the read-only ceiling
            base = psa_fast.DecodePlan(cache, num_q_heads=shape.hq, mode="dense")
            ref = [cupy.array(base.run(qs[i], i).out) for i in range(layers)]
            groups = b * shape.hkv
            fitted = _kernels.decode_config(d=cache.dp, s=shape.s, g=shape.hq // shape.hkv, version=3,
                                            warps=base.warps, stages=base.stages)  # the plan's own launch shape
            default_splits = _kernels.pick_splits(groups, n, fitted[1], fitted[3])
            print(f"T={t} B={b}: SDPA {sdpa:.1f} µs, floor {floor:.1f} µs (read-only {read_floor:.1f}), "
                  "default splits "
                  f"{default_splits}", flush=True)
            rows = []
            for warps, stages, splits in variants(cache.dp, shape.s, shape.hq // shape.hkv, default_splits,
                                                  args.default_only, groups, split_list):
                try:
                    p = psa_fast.DecodePlan(cache, num_q_heads=shape.hq, mode="dense", warps=warps, stages=stages,
                                            splits=splits)
                    err = max(float(cupy.abs(p.run(qs[i], i).out - ref[i]).max() / cupy.abs(ref[i]).max())
                              for i in range(layers))
                    us = graph_us(lambda i, p=p: p.run(qs[i], i))
                except Exception as exc:  # a launch shape this GPU or kernel refuses: say so, go on
                    print(f"  warps {warps} stages {stages} splits {splits}: {type(exc).__name__}: {str(exc)[:120]}")
                    continue
                if warps is None:  # the plan's own shape: name what it picked
                    warps, stages = _kernels.decode_config(d=cache.dp, s=shape.s, g=shape.hq // shape.hkv, version=3,
                                                           warps=p.warps, stages=p.stages)[1:3]
                row = dict(shape=shape.name, T=t, B=b, warps=warps, stages=stages, splits=splits,
                           plan_splits=p.splits, us=us, sdpa_us=sdpa,
                           floor_us=floor, read_floor_us=read_floor, rel_diff=err, ok=err <= 1e-3)
                rows.append(row)
                with open(args.out, "a") as f:
                    f.write(json.dumps(row) + "\n")
            rows.sort(key=lambda r: r["us"])
            default = [r for r in rows if r["splits"] is None and (r["warps"], r["stages"]) == fitted[1:3]]
            shown = rows if split_list else rows[:6] + [r for r in default if r not in rows[:6]]
            for r in shown:
                print(f"  warps {r['warps']} stages {r['stages']} splits {r['splits']} ({r['plan_splits']}): "
                      f"{r['us']:7.1f} µs  x{sdpa / r['us']:.2f} SDPA  x{r['us'] / floor:.2f} floor  "
                      f"x{r['us'] / read_floor:.2f} read-only floor  "
                      f"diff {r['rel_diff']:.1e}{'' if r['ok'] else ' OVER BUDGET'}", flush=True)
        cache = qs = tk = tv = tq = ref = None  # (the next size's buffers take their place)
        cupy.get_default_memory_pool().free_all_blocks()
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
