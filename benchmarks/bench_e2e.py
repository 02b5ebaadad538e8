"""End-to-end decode under a GPU memory cap: 32 layers of Llama-3.1-8B shapes at 128K context.

Each decode step runs, per layer, the dense projections and the MLP as real bf16 GEMMs (QKV 4096 -> 6144,
O 4096 -> 4096, gate/up 4096 -> 2 x 14336, down 14336 -> 4096; RMSNorm and RoPE left out) and attention
over a 128K-token KV cache with real-attention skew (psa_fast.synthetic):

* dense: the whole KV cache resident in GPU memory (float16, [B, 8, T, 128] per layer), torch SDPA with
  enable_gqa; the largest batch whose KV cache fits under the cap next to the weights;
* PSA + offload: the KV cache in mapped pinned host memory (psa_fast.offload.OffloadKVCache), metadata
  resident, a unified GPU pool of whatever the cap leaves, OffloadDecoder per layer (tau, ema, step).

The attention query of each layer is the skewed query that matches its KV (a random GEMM output would
see flat attention); the GEMM's own q is computed and discarded, so the cost is counted. No token is
appended (both sides read the same cache every step). Reported: tokens/s (B x steps / wall time over
timed steps, after warm-up), the pool's hit rate, GPU memory of each side.

    python benchmarks/bench_e2e.py [--cap-gib 48] [--tokens 131072] [--psa-batch 4] [--steps 4]
"""

from __future__ import annotations

import argparse
import json
import os
import time

GIB = 2**30
HID, HQ, HKV, D, FFN, LAYERS, S = 4096, 32, 8, 128, 14336, 32, 16


class Layers:
    """Random bf16 weights of the 32 layers (about 13 GiB)."""

    def __init__(self, torch, device):
        g = torch.Generator(device=device).manual_seed(0)

        def w(i, o):
            return (torch.randn(i, o, device=device, dtype=torch.bfloat16, generator=g) / i**0.5)

        self.w = [(w(HID, HID + 2 * HKV * D), w(HID, HID), w(HID, 2 * FFN), w(FFN, HID)) for _ in range(LAYERS)]
        self.bytes = sum(t.numel() * 2 for ws in self.w for t in ws)

    def step(self, torch, x, attend):
        """One decode step of ``x`` ([B, 4096] bf16); ``attend(layer)`` returns [B, 32, 128]."""
        for layer, (wqkv, wo, wgu, wd) in enumerate(self.w):
            _ = x @ wqkv                                   # q, k, v (q replaced by the skewed query)
            o = attend(layer).reshape(x.shape[0], HID).to(torch.bfloat16)
            x = x + o @ wo
            h = x @ wgu
            x = x + (torch.nn.functional.silu(h[:, :FFN]) * h[:, FFN:]) @ wd
        return x


def timed(torch, fn, steps: int, warmup: int) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / steps


def resident_bound(torch, cupy, model, stage, qp, xp, args) -> dict:
    """32 layers of PSA over a resident PagedKVCache (psa_fast.plan), the same KV and queries."""
    import psa_fast

    b, t = qp.shape[0], args.tokens
    res = psa_fast.PagedKVCache(num_layers=LAYERS, batch=b, num_kv_heads=HKV, head_dim=D, max_tokens=t,
                                block_size=S)
    for layer in range(LAYERS):
        for r in range(b):
            res.prefill(layer, r, stage._dense_view(stage.k_pool, 0, r)[:, :t],
                        stage._dense_view(stage.v_pool, 0, r)[:, :t])
    out = {}
    for step in args.step:
        plan = psa_fast.plan(res, num_q_heads=HQ, threshold=args.tau, stop="ema", step=step)

        def attend(layer):
            return torch.from_dlpack(plan.run(qp, layer=layer).out)

        sec = timed(torch, lambda: model.step(torch, xp, attend), args.steps, 2)
        out[step] = dict(batch=b, step=step, step_ms=sec * 1e3, tokens_per_s=b / sec)
        print(f"PSA resident (no cap, bound for offload): B={b}, step {step}: {sec * 1e3:.1f} ms/step, "
              f"{b / sec:.1f} tokens/s", flush=True)
    del res
    cupy.get_default_memory_pool().free_all_blocks()
    return out


def psa_run(torch, cupy, model, off, qp, xp, args, step: int, cluster, slots: int, nmax: int) -> dict:
    """Decode steps of the 32 layers with a fresh OffloadDecoder (the pool keeps its contents)."""
    from psa_fast.offload import OffloadDecoder

    dec = OffloadDecoder(off, num_q_heads=HQ, threshold=args.tau, stop="ema", step=step, cluster=cluster)
    b = qp.shape[0]

    def psa_attend(layer):
        return torch.from_dlpack(dec.run(qp, layer=layer).out)

    for _ in range(3):  # eager first step per layer, then graph capture, then warm
        model.step(torch, xp, psa_attend)
    torch.cuda.synchronize()
    st0 = off.pool.stats()
    it0 = dec.stats["iterations"]
    sec = timed(torch, lambda: model.step(torch, xp, psa_attend), args.steps, 0)
    st1 = off.pool.stats()
    acc = (st1["hits"] - st0["hits"]) + (st1["misses"] - st0["misses"])
    hit = (st1["hits"] - st0["hits"]) / max(acc, 1)
    used = float(cupy.asnumpy(dec.num_used).mean())
    mem = (torch.cuda.memory_allocated() + cupy.get_default_memory_pool().used_bytes()) / GIB
    its = (dec.stats["iterations"] - it0) / args.steps / LAYERS
    run = dict(batch=b, step=step, cluster=dec.cluster, step_ms=sec * 1e3, tokens_per_s=b / sec, hit_rate=hit,
               blocks_used=used, selected=used / nmax, iterations_per_layer=its, pool_slots=slots, gpu_gib=mem)
    import psa_fast.offload
    import psa_fast.pool

    print(f"PSA + offload: B={b}, step {step}, cluster {dec.cluster}, loader CTAs/SM "
          f"{psa_fast.pool.WIDE_CTAS_PER_SM}:{psa_fast.offload.GATHER_CTAS_PER_SM}: {sec * 1e3:.1f} ms/step, "
          f"{b / sec:.1f} "
          f"tokens/s, hit rate {hit:.3f}, {used:.0f} of {nmax} blocks per group ({used / nmax:.0%}), {its:.1f} "
          f"iterations per layer, GPU {mem:.1f} GiB", flush=True)
    if args.profile:
        profile_step(torch, lambda: model.step(torch, xp, psa_attend), args.out, f"step{step}_cluster{dec.cluster}")
    return run


def profile_step(torch, fn, out: str, tag: str) -> None:
    """GPU time per kernel name over one step (CUPTI through torch.profiler), and host time issuing it."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    try:
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            t0 = time.perf_counter()
            fn()
            host = time.perf_counter() - t0
            torch.cuda.synchronize()
            wall = time.perf_counter() - t0
    except Exception as e:  # CUPTI may be unavailable in a sandbox
        print(f"profile failed: {e!r}", flush=True)
        return
    print(f"profiled step: host issue {host * 1e3:.1f} ms, wall {wall * 1e3:.1f} ms", flush=True)
    table = prof.key_averages().table(sort_by="self_device_time_total", row_limit=25, max_name_column_width=60)
    print(table, flush=True)
    with open(os.path.join(out, f"bench_e2e_profile_{tag}.txt"), "w") as f:
        f.write(table)


def main(argv=None) -> None:
    import cupy
    import torch

    import psa_fast
    from psa_fast.offload import OffloadKVCache
    from psa_fast.synthetic import fill_skewed, trace_block_offsets

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cap-gib", type=float, default=48.0, help="GPU memory for weights + KV (+ pool, metadata)")
    ap.add_argument("--tokens", type=int, default=131072)
    ap.add_argument("--psa-batch", type=int, default=4, help="requests for PSA + offload (host memory bound)")
    ap.add_argument("--tau", type=float, default=0.95)
    ap.add_argument("--step", type=int, nargs="+", default=[128],
                    help="blocks per iteration of the progressive loop (several: one PSA run each, same cache)")
    ap.add_argument("--cluster", type=int, nargs="+", default=[0],
                    help="CTAs per group of the decode kernel (0: psa_fast's choice); several: one run each")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--skip-dense", action="store_true")
    ap.add_argument("--loader-grid", nargs="+", default=[None], metavar="POOL:GATHER",
                    help="CTAs per SM of the pool's grid launches and of the gather (psa_fast.pool.WIDE_CTAS_PER_SM, "
                         "psa_fast.offload.GATHER_CTAS_PER_SM); several: one run each")
    ap.add_argument("--resident-bound", action="store_true",
                    help="also run PSA with the whole KV cache of the PSA batch resident (ignoring the cap): the "
                         "speed the offload system would reach if moving blocks cost nothing")
    ap.add_argument("--profile", action="store_true", help="after timing, print GPU time per kernel of one PSA step "
                    "(torch.profiler / CUPTI) and the host's time issuing it")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args(argv)
    t = args.tokens
    dev = torch.device("cuda")
    ts = torch.cuda.Stream()
    results = {"args": vars(args)}
    with torch.cuda.stream(ts), cupy.cuda.ExternalStream(ts.cuda_stream):
        model = Layers(torch, dev)
        kv_per_request = LAYERS * 2 * HKV * t * D * 2
        free_for_kv = args.cap_gib * GIB - model.bytes - 1 * GIB  # 1 GiB for activations and workspaces
        b_dense = int(free_for_kv // kv_per_request)
        print(f"weights {model.bytes / GIB:.1f} GiB; KV per request {kv_per_request / GIB:.1f} GiB; cap "
              f"{args.cap_gib:.0f} GiB -> dense batch {b_dense}", flush=True)
        # one layer of skewed KV per request, staged on the GPU, copied into every layer of both sides
        b_max = max(b_dense, args.psa_batch)
        stage = psa_fast.PagedKVCache(num_layers=1, batch=b_max, num_kv_heads=HKV, head_dim=D, max_tokens=t,
                                      block_size=S)
        q = fill_skewed(stage, 0, HQ, trace_block_offsets(), seed=1)  # [b_max, 32, 128] float16
        x0 = torch.randn(b_max, HID, device=dev, dtype=torch.bfloat16)

        if b_dense >= 1 and not args.skip_dense:
            qd = torch.from_dlpack(q[:b_dense]).unsqueeze(2)  # [B, 32, 1, 128]
            k_layers, v_layers = [], []
            for _ in range(LAYERS):
                k = torch.empty(b_dense, HKV, t, D, device=dev, dtype=torch.float16)
                v = torch.empty_like(k)
                for r in range(b_dense):
                    k[r].copy_(torch.from_dlpack(stage._dense_view(stage.k_pool, 0, r)[:, :t]))
                    v[r].copy_(torch.from_dlpack(stage._dense_view(stage.v_pool, 0, r)[:, :t]))
                k_layers.append(k)
                v_layers.append(v)

            def dense_attend(layer):
                return torch.nn.functional.scaled_dot_product_attention(qd, k_layers[layer], v_layers[layer],
                                                                        enable_gqa=True)

            xd = x0[:b_dense].clone()
            sec = timed(torch, lambda: model.step(torch, xd, dense_attend), args.steps, 1)
            mem = torch.cuda.memory_allocated() / GIB
            results["dense"] = dict(batch=b_dense, step_ms=sec * 1e3, tokens_per_s=b_dense / sec, gpu_gib=mem)
            print(f"dense: B={b_dense}, {sec * 1e3:.1f} ms/step, {b_dense / sec:.1f} tokens/s, GPU {mem:.1f} GiB",
                  flush=True)
            del k_layers, v_layers, qd
            torch.cuda.empty_cache()

        b = args.psa_batch
        if args.resident_bound:
            results["resident_bound"] = resident_bound(torch, cupy, model, stage, q[:b].copy(), x0[:b].clone(), args)
        nmax = -(-t // S)
        meta_bytes = LAYERS * b * HKV * nmax * 2 * D * 2 * 2  # meta + lohi, float16
        slot_bytes = 2 * S * D * 2
        pool_bytes = free_for_kv - meta_bytes - 2 * GIB  # estimate/order/decode buffers
        slots = int(pool_bytes // slot_bytes)
        print(f"PSA + offload: B={b}, host store {LAYERS * b * HKV * nmax * slot_bytes / GIB:.0f} GiB pinned, "
              f"metadata {meta_bytes / GIB:.1f} GiB, pool {slots} slots = {slots * slot_bytes / GIB:.1f} GiB "
              f"({slots / (LAYERS * b * HKV * nmax):.0%} of the KV cache)", flush=True)
        t0 = time.perf_counter()
        off = OffloadKVCache(num_slots=slots, num_layers=LAYERS, batch=b, num_kv_heads=HKV, head_dim=D, max_tokens=t,
                             block_size=S)
        for layer in range(LAYERS):
            for r in range(b):
                off.prefill(layer, r, stage._dense_view(stage.k_pool, 0, r)[:, :t],
                            stage._dense_view(stage.v_pool, 0, r)[:, :t])
        torch.cuda.synchronize()
        print(f"  filled in {time.perf_counter() - t0:.0f} s", flush=True)
        del stage
        qp = q[:b].copy()
        results["psa_runs"] = []
        import psa_fast.offload
        import psa_fast.pool

        for grid in args.loader_grid:
            if grid:
                psa_fast.pool.WIDE_CTAS_PER_SM, psa_fast.offload.GATHER_CTAS_PER_SM = map(int, grid.split(":"))
            for step in args.step:
                for cluster in args.cluster:
                    run = psa_run(torch, cupy, model, off, qp, x0[:b].clone(), args, step, cluster or None, slots,
                                  nmax)
                    run["loader_grid"] = [psa_fast.pool.WIDE_CTAS_PER_SM, psa_fast.offload.GATHER_CTAS_PER_SM]
                    results["psa_runs"].append(run)
        results["psa"] = max(results["psa_runs"], key=lambda r: r["tokens_per_s"])
        if "dense" in results:
            ratio = results["psa"]["tokens_per_s"] / results["dense"]["tokens_per_s"]
            results["ratio"] = ratio
            print(f"PSA + offload (best run: step {results['psa']['step']}, cluster {results['psa']['cluster']}) / "
                  f"dense tokens/s: {ratio:.2f}x", flush=True)
    with open(os.path.join(args.out, "bench_e2e.json"), "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
