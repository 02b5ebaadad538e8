"""Where a whole-model decode step's GPU time goes: torch.profiler over eager decode steps of
[`psa_fast.hf`][psa_fast.hf] (the same kernels a captured step replays), top CUDA kernels by total time.

    python benchmarks/profile_model_step.py --model gemma3 --context 8192 --batch 1 --mode sdpa
"""

from __future__ import annotations

import argparse

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gemma3")
    ap.add_argument("--context", type=int, default=8192)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--mode", default="sdpa", choices=("sdpa", "dense", "psa"))
    ap.add_argument("--steps", type=int, default=5)
    args = ap.parse_args()
    import bench_model

    import psa_fast.hf
    from psa_ref.tools.hf import PSAConfig

    ns = argparse.Namespace(model=args.model, weights="random", contexts=[args.context], steps=args.steps, text=None)
    model, _ = bench_model.load_model(ns)
    psa_fast.hf.enable(model, PSAConfig(threshold=0.95, step=16, record=False))
    cache = psa_fast.hf.PagedCache(model, batch=args.batch, max_tokens=args.context + 64, static=True,
                                   mode={"sdpa": "sdpa", "dense": "dense"}.get(args.mode))
    dec = psa_fast.hf.CapturedDecoder(model, cache, args.batch)
    ids = torch.randint(10, 1000, (args.batch, args.context + args.steps + 4), device="cuda")
    dec.prefill(ids[:, : args.context])
    dec.step(ids[:, args.context])  # eager warm-up (compiles)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        for i in range(args.steps):
            dec._forward()  # eager steps: the kernels a replay runs, one by one
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=25, max_name_column_width=70))


if __name__ == "__main__":
    main()
