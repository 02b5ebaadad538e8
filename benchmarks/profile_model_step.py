"""Where a whole-model decode step's GPU time goes: torch.profiler over eager decode steps of
[`psa_fast.hf`][psa_fast.hf] (the same kernels a captured step replays), top CUDA kernels by total time.

    python benchmarks/profile_model_step.py --model gemma3 --context 8192 --batch 1 --mode sdpa [--compile]
"""

from __future__ import annotations

import argparse

import bench_model
import torch


@torch.no_grad()
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gemma3")
    ap.add_argument("--context", type=int, default=8192)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--mode", default="sdpa", choices=("sdpa", "dense", "psa"))
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--compile", action="store_true", help="CapturedDecoder(compile=True): the layers compiled")
    ap.add_argument("--weights", default="random", help="'random' or a GGUF path (as bench_model.py)")
    ap.add_argument("--text", default=None, help="held-out text for real weights (as bench_model.py)")
    ap.add_argument("--speculate", type=float, default=None, help="psa mode: DecodePlan(speculate=M)")
    ap.add_argument("--step", default=16, type=bench_model.step_arg,
                    help="psa mode: blocks an iteration (PSAConfig(step=...)), or auto (the plan's pick)")
    ap.add_argument("--first-chunk", default=None, choices=("predicted",),
                    help="psa mode: PSAConfig(first_chunk=...), the first ranked chunk from the estimates")
    ap.add_argument("--rank", default="estimate", choices=("estimate", "share"),
                    help="psa mode: PSAConfig(rank=...), how a shared group's blocks are ranked")
    args = ap.parse_args()

    import psa_fast.hf
    from psa_ref.tools.hf import PSAConfig

    ns = argparse.Namespace(model=args.model, weights=args.weights, contexts=[args.context], steps=args.steps,
                            text=args.text)
    model, tok = bench_model.load_model(ns)
    psa_fast.hf.enable(model, PSAConfig(threshold=0.95, step=args.step, first_chunk=args.first_chunk, rank=args.rank,
                                                 record=False))
    spec = {"speculate": args.speculate} if args.speculate else None
    cache = psa_fast.hf.PagedCache(model, batch=args.batch, max_tokens=args.context + 64, static=True,
                                   mode={"sdpa": "sdpa", "dense": "dense"}.get(args.mode), plan_options=spec)
    dec = psa_fast.hf.CapturedDecoder(model, cache, args.batch, compile=args.compile)
    ids = bench_model.token_ids(ns, tok, args.context + args.steps + 8, args.batch).cuda()
    dec.prefill(ids[:, : args.context])
    dec.step(ids[:, args.context])  # eager warm-up (compiles)
    for _ in range(2):  # inductor tunes some kernels on their first real calls: keep that out of the profile
        dec._forward()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        for i in range(args.steps):
            dec._forward()  # eager steps: the kernels a replay runs, one by one
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=30, max_name_column_width=70))
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    gpu_us = sum(e.device_time for e in kernels)
    print(f"per step: {len(kernels) / args.steps:.0f} kernels, {gpu_us / args.steps / 1e3:.3f} ms of GPU time "
          f"({'compiled' if args.compile else 'eager'} layers)")


if __name__ == "__main__":
    main()
