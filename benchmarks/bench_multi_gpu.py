"""Head-parallel PSA decode on several GPUs (``psa_fast.distributed``): step time per rank, scaling against one GPU
with the same total batch, the all-reduce's share of the step, and each rank's budget.

    torchrun --nproc_per_node 2 benchmarks/bench_multi_gpu.py            # the run of record: 128K, B = 8 and 32
    torchrun --nproc_per_node 2 benchmarks/bench_multi_gpu.py --profile per-head --batches 32
    python benchmarks/bench_multi_gpu.py --quick                         # one process (world_size 1): checks the script

Shape: Llama-3.1-8B attention (32 query / 8 KV heads, D 128, d_model 4096), blocks of 16 tokens, float16 KV and W_o.
Data: ``fill_heads``, the construction of ``psa_fast.synthetic.fill_skewed`` drawn per (layer, request, KV head) from
its own seed, so rank r's cache holds exactly KV heads [r * 8 / W, (r + 1) * 8 / W) of the one-GPU cache: block
log-masses from the shipped trace (``--profile pooled``, every head from one distribution, the run of record of
``bench_decode.py``; ``per-head``: each KV head from one (layer, position, head) of the trace, so heads, and ranks,
differ as they do in a real model).

For each (T, B), on every rank: its shard cache, a ``HeadParallelDecoder`` (PSA τ ``--threshold``, ``--step``), one
warm-up step, its budget; then, timed with CUDA events (median of ``--reps``; each sample replays a CUDA graph of
``PER_GRAPH`` calls where the capture works, else runs them eagerly, as the ``graphs`` column says):

* **step**: attention on the rank's heads + its rows of W_o + the all-reduce (what a layer costs);
* **local**: the same without the all-reduce (the rank's own work: where uneven budgets show);
* **all-reduce**: the ``[B, d_model]`` float16 all-reduce alone.

Then rank 0 alone runs the one-GPU baseline: all 8 KV heads of the same data in one cache, the plain plan and the
whole W_o, same B (the other ranks wait at a barrier). Speedup = one-GPU step ÷ the slowest rank's step;
efficiency = speedup ÷ W (target for 2 GPUs at 128K, B = 32: speedup ≥ 1.8). Outputs are compared (relative
error against the one-GPU output, beside the budget of a row-parallel float16 projection: two more float16
roundings, of the partials and of their sum) and so are the blocks each KV head read.

Rows go to ``bench_multi_gpu.jsonl`` in ``--out`` (rank 0 writes; one ``rank`` row per rank and one ``summary``
row per (T, B)); a table is printed last.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from dataclasses import dataclass

import numpy as np

from bench_decode import parse_ints

PER_GRAPH = 4  # calls captured in one CUDA graph per timing sample (the host's launch latency amortised)
EPS16 = float(np.finfo(np.float16).eps)


@dataclass(frozen=True)
class Shape:
    """Attention shape of one layer: ``hq`` query / ``hkv`` KV heads, head dim ``d``, ``d_model``, blocks of ``s``."""

    name: str
    hq: int
    hkv: int
    d: int
    d_model: int
    s: int = 16

    @property
    def g(self) -> int:
        return self.hq // self.hkv


LLAMA8B = Shape("llama8b", 32, 8, 128, 4096)


# --- arguments (pure) ------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default=None, help="tokens per request, e.g. 128K or 32768,131072 (default 128K)")
    p.add_argument("--batches", default=None, help="requests B (the total batch, the same on one GPU), default 8,32")
    p.add_argument("--quick", action="store_true", help="32K, B = 8, 10 reps (unless given)")
    p.add_argument("--reps", type=int, default=None, help="timing samples per measurement (default 30)")
    p.add_argument("--mode", choices=("psa", "topk", "dense"), default="psa")
    p.add_argument("--threshold", type=float, default=0.95, help="PSA's τ")
    p.add_argument("--step", type=int, default=None,
                   help="PSA blocks per iteration, the same on W GPUs and on one (default: max(cluster * 8, N / 64) "
                        "with the cluster of a rank's groups)")
    p.add_argument("--k", type=int, default=None, help="top-k budget (default: about 5%% of the blocks)")
    p.add_argument("--profile", choices=("pooled", "per-head"), default="pooled")
    p.add_argument("--wo-dtype", choices=("float16", "bfloat16", "float32"), default="float16")
    p.add_argument("--no-baseline", action="store_true", help="skip the one-GPU run (no speedup, no comparison)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    return p


def parse_args(argv=None) -> argparse.Namespace:
    """Parsed arguments with ``sizes`` and ``batches`` lists of ints and ``shape`` the Llama shape. Bad values
    exit through the parser's error."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        args.sizes = parse_ints(args.sizes or ("32K" if args.quick else "128K"), "--sizes")
        args.batches = parse_ints(args.batches or ("8" if args.quick else "8,32"), "--batches")
    except ValueError as exc:
        parser.error(str(exc))
    args.reps = args.reps if args.reps is not None else (10 if args.quick else 30)
    if args.reps < 1:
        parser.error(f"--reps must be >= 1, got {args.reps}")
    if not 0 < args.threshold <= 1:
        parser.error(f"--threshold must lie in (0, 1], got {args.threshold}")
    for name in ("step", "k"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    args.shape = LLAMA8B
    return args


# --- the data (pure given the array module; tested on the CPU with NumPy) ----------------------------------------

def head_seed(seed: int, layer: int, request: int, kv_head: int) -> int:
    """The 32-bit seed of one (layer, request, KV head): the same whichever rank (or the one GPU) draws it
    (NumPy's ``SeedSequence`` hash of the four numbers)."""
    if min(seed, layer, request, kv_head) < 0:
        raise ValueError(f"head_seed: seed {seed}, layer {layer}, request {request}, KV head {kv_head} must be >= 0")
    return int(np.random.SeedSequence([seed, layer, request, kv_head]).generate_state(1)[0])


def fill_heads(cache, layer: int, kv_heads: range, group: int, offsets, *, seed: int = 0, within_block: float = 0.5,
               xp=None):
    """Fill one layer of ``cache`` (holding KV heads ``kv_heads`` of the model, in order) to capacity; return the
    queries of their query heads, ``[B, len(kv_heads) * group, D]`` float16.

    ``fill_skewed``'s construction (``psa_fast.synthetic``), one KV head at a time from its own
    [`head_seed`]: a direction ``u``; the group's queries ``sqrt(D) u + 0.5 noise``; block ``j``'s keys
    ``offset_j u + within_block * noise`` with ``offset_j`` drawn from ``offsets`` (1-D: pooled; 2-D
    ``[sources, N]``: one row per head); values standard normal. ``xp`` is CuPy (default) or NumPy with any
    ``cache`` that has ``batch``, ``head_dim``, ``block_size``, ``nmax``, ``capacity`` and ``prefill``.
    """
    if xp is None:
        import cupy as xp

    b, d, s, n, t = cache.batch, cache.head_dim, cache.block_size, cache.nmax, cache.capacity
    off = xp.asarray(offsets, dtype=xp.float32)
    qs = xp.empty((b, len(kv_heads) * group, d), xp.float16)
    for r in range(b):
        keys = xp.empty((len(kv_heads), t, d), xp.float16)
        values = xp.empty_like(keys)
        for i, kv in enumerate(kv_heads):
            rs = xp.random.RandomState(head_seed(seed, layer, r, kv))

            def normal(shape, rs=rs):
                if xp is np:
                    return rs.standard_normal(shape).astype(np.float32)
                return rs.standard_normal(shape, dtype=xp.float32)

            u = normal((d,))
            u /= xp.linalg.norm(u)
            qs[r, i * group : (i + 1) * group] = (math.sqrt(d) * u[None, :] + 0.5 * normal((group, d))).astype(
                xp.float16)
            if off.ndim == 1:
                pick = off[rs.randint(0, off.size, size=n)]
            else:
                pick = off[int(rs.randint(0, off.shape[0])), rs.randint(0, off.shape[1], size=n)]
            boost = xp.repeat(pick, s)[:t]
            keys[i] = (boost[:, None] * u[None, :] + within_block * normal((t, d))).astype(xp.float16)
            values[i] = normal((t, d)).astype(xp.float16)
        cache.prefill(layer, r, keys, values)
        del keys, values
    return qs


def default_step(num_blocks: int, cluster: int) -> int:
    """``bench_decode.py``'s PSA step: at least one block per warp of the cluster (8 warps a CTA), and at most
    ~64 iterations over the cache."""
    return max(cluster * 8, num_blocks // 64)


# --- results (pure) ----------------------------------------------------------------------------------------------

def scaling(one_gpu_us: float, rank_step_us, world_size: int) -> dict:
    """Speedup of ``world_size`` GPUs over one at the same total batch (the slowest rank sets the step) and the
    efficiency ``speedup / W``."""
    slowest = float(max(rank_step_us))
    if one_gpu_us <= 0 or slowest <= 0 or world_size < 1:
        raise ValueError(f"scaling needs positive times and world size, got {one_gpu_us}, {rank_step_us}, "
                         f"{world_size}")
    speedup = one_gpu_us / slowest
    return dict(step_us=slowest, speedup=speedup, efficiency=speedup / world_size)


def projection_budget(world_size: int, eps: float, reorder_rel: float) -> float:
    """Relative error budget of a row-parallel projection in a precision of epsilon ``eps`` against one GPU's: the
    reordered sum (``reorder_rel``: twice the one GPU's own error against float64, over max|y|), each rank's partial
    rounded to ``eps`` once more and each of the ``W - 1`` additions of the all-reduce rounded once (up to 2 ulps
    of the larger partials: the factor 2)."""
    extra = 0.0 if world_size == 1 else 2.0 * world_size * eps
    return reorder_rel + extra


def same_blocks(num_used: list, orders: list, num_used_1, order_1) -> bool:
    """Whether the ranks' selection groups, side by side, attended the blocks the one GPU's did, in the same order.

    Args:
        num_used: per rank ``[B, Gn / W]``.
        orders: per rank ``[B, Gn / W, Nmax]`` (only the first ``num_used`` entries count).
        num_used_1: the one GPU's ``[B, Gn]``.
        order_1: the one GPU's ``[B, Gn, Nmax]``.
    """
    n = np.concatenate(num_used, axis=1)
    if n.shape != num_used_1.shape or not np.array_equal(n, num_used_1):
        return False
    order = np.concatenate(orders, axis=1)
    attended = np.arange(order.shape[-1])[None, None, :] < n[..., None]
    return bool(np.array_equal(np.where(attended, order, -1), np.where(attended, order_1, -1)))


def format_rank_row(r: dict) -> str:
    return (f"  T {r['T'] // 1024}K B {r['B']:>3} rank {r['rank']}/{r['world_size']}: step {r['step_us']:8.1f} us  "
            f"local {r['local_us']:8.1f} us  all-reduce {r['allreduce_us']:6.1f} us ({100 * r['allreduce_share']:.1f}%)"
            f"  blocks/head {r['blocks_per_head']:7.1f} ({100 * r['share']:.1f}%)  graphs {r['graphs']}")


def table(rows: list[dict]) -> str:
    """The markdown table printed last: one line per (T, B) summary row."""
    lines = ["| T | B | W | 1 GPU µs | step µs (slowest rank) | speedup | efficiency | local µs per rank | "
             "all-reduce µs (share) | blocks/head per rank | busiest | imbalance | rel. err (budget) | same blocks |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        one = "—" if r.get("one_gpu_us") is None else f"{r['one_gpu_us']:.1f}"
        sp = "—" if r.get("speedup") is None else f"{r['speedup']:.2f}×"
        ef = "—" if r.get("efficiency") is None else f"{100 * r['efficiency']:.0f}%"
        err = "—" if r.get("rel_err") is None else f"{r['rel_err']:.1e} ({r['err_budget']:.1e})"
        same = "—" if r.get("same_blocks") is None else ("yes" if r["same_blocks"] else "NO")
        lines.append(
            f"| {r['T'] // 1024}K | {r['B']} | {r['world_size']} | {one} | {r['step_us']:.1f} | {sp} | {ef} | "
            + " / ".join(f"{x:.1f}" for x in r["local_us"]) + " | "
            + f"{r['allreduce_us']:.1f} ({100 * r['allreduce_share']:.1f}%) | "
            + " / ".join(f"{x:.1f}" for x in r["blocks_per_head"])
            + f" | {r['busiest']} | {r['imbalance']:.2f} | {err} | {same} |")
    return "\n".join(lines)


# --- on the GPUs ---------------------------------------------------------------------------------------------------

def _on_torch_stream():
    """CuPy's launches on torch's current stream (a context manager)."""
    import cupy
    import torch

    ptr = torch.cuda.current_stream().cuda_stream
    return cupy.cuda.Stream.null if ptr == 0 else cupy.cuda.ExternalStream(ptr)


def median_us(fn, reps: int) -> tuple[float, bool]:
    """``(median µs per call of fn(), graphs)``: each sample replays a CUDA graph of PER_GRAPH calls, captured once
    (after two eager warm-ups on the capture stream); where capture fails the calls run eagerly (graphs False)."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph, graphs = torch.cuda.CUDAGraph(), True
    try:
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            for _ in range(PER_GRAPH):
                fn()
    except Exception as exc:  # e.g. a library call that a capture does not allow
        print(f"    (CUDA graph capture failed, timing eagerly: {type(exc).__name__}: {str(exc)[:160]})", flush=True)
        graph, graphs = None, False
        torch.cuda.synchronize()

    def once():
        if graph is not None:
            graph.replay()
        else:
            for _ in range(PER_GRAPH):
                fn()

    once()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for a, b in zip(starts, ends):
        a.record()
        once()
        b.record()
    torch.cuda.synchronize()
    return float(np.median([a.elapsed_time(b) * 1e3 for a, b in zip(starts, ends)])) / PER_GRAPH, graphs


def run_size(args, t: int, b: int, offsets, rank: int, world: int, log) -> dict | None:
    """Every measurement of one (T, B); returns the summary row on rank 0 (None elsewhere)."""
    import cupy
    import torch
    import torch.distributed as dist

    import psa_fast
    from psa_fast import _kernels
    from psa_fast.distributed import HeadParallelDecoder, shard_cache, shard_heads

    sh = args.shape
    shard = shard_heads(num_q_heads=sh.hq, num_kv_heads=sh.hkv, world_size=world)[rank]
    n = -(-t // sh.s)
    hkv_r = len(shard.kv_heads)
    step = args.step or default_step(n, _kernels.pick_cluster(b * hkv_r))
    k = args.k or max(1, round(0.05 * n))
    options = dict(mode=args.mode, threshold=args.threshold, step=step) if args.mode == "psa" else (
        dict(mode="topk", k=k) if args.mode == "topk" else dict(mode="dense"))
    wdt = getattr(torch, args.wo_dtype)
    gen = torch.Generator(device="cuda").manual_seed(args.seed + 1)  # the same W_o on every rank
    w_full = (torch.randn(sh.hq * sh.d, sh.d_model, generator=gen, device="cuda") / math.sqrt(sh.hq * sh.d)).to(wdt)
    w_local = w_full[shard.wo_rows(sh.d)]

    with _on_torch_stream():
        cache = shard_cache(num_kv_heads=sh.hkv, num_layers=1, batch=b, head_dim=sh.d, max_tokens=t, block_size=sh.s)
        q = torch.from_dlpack(fill_heads(cache, 0, shard.kv_heads, sh.g, offsets, seed=args.seed))
    dec = HeadParallelDecoder(cache, num_q_heads=sh.hq, **options)
    y = dec.step(q, w_local, 0).clone()
    rep = dec.budgets()
    mine = None if args.mode == "dense" else (cupy.asnumpy(dec.last.num_used), cupy.asnumpy(dec.last.order))
    step_us, graphs = median_us(lambda: dec.step(q, w_local, 0), args.reps)
    local_us, _ = median_us(lambda: dec.partial(q, w_local, 0), args.reps)
    buf = torch.zeros(b, sh.d_model, dtype=wdt, device="cuda")
    allreduce_us, _ = median_us(lambda: dist.all_reduce(buf), args.reps)
    read = rep.blocks_read[rank]  # [B, Hkv/W]
    row = dict(kind="rank", T=t, B=b, rank=rank, world_size=world, mode=args.mode, step=step if args.mode == "psa"
               else None, profile=args.profile, step_us=step_us, local_us=local_us, allreduce_us=allreduce_us,
               allreduce_share=allreduce_us / step_us, blocks_per_head=float(read.mean()),
               share=float(read.mean() / n), graphs=graphs, kv_heads=[shard.kv_heads.start, shard.kv_heads.stop])
    rows: list = [None] * world
    dist.all_gather_object(rows, row)
    used: list = [None] * world
    dist.all_gather_object(used, mine)
    dec = cache = None  # frees this rank's cache before the one-GPU baseline allocates its own
    cupy.get_default_memory_pool().free_all_blocks()
    torch.cuda.empty_cache()

    summary = None
    if rank == 0:
        for r in rows:
            log(r)
        summary = dict(kind="summary", T=t, B=b, world_size=world, mode=args.mode, profile=args.profile,
                       step_us=max(r["step_us"] for r in rows), local_us=[r["local_us"] for r in rows],
                       allreduce_us=rows[rep.busiest]["allreduce_us"],
                       allreduce_share=rows[rep.busiest]["allreduce_share"],
                       blocks_per_head=[r["blocks_per_head"] for r in rows], busiest=rep.busiest,
                       imbalance=rep.imbalance, per_rank_blocks=rep.per_rank.tolist(), graphs=rows[0]["graphs"],
                       one_gpu_us=None, speedup=None, efficiency=None, rel_err=None, err_budget=None,
                       same_blocks=None, wo_dtype=args.wo_dtype)
        if not args.no_baseline:  # one GPU: every KV head of the same data, the plain plan, the whole W_o
            with _on_torch_stream():
                full = psa_fast.PagedKVCache(num_layers=1, batch=b, num_kv_heads=sh.hkv, head_dim=sh.d, max_tokens=t,
                                             block_size=sh.s)
                q1 = torch.from_dlpack(fill_heads(full, 0, range(sh.hkv), sh.g, offsets, seed=args.seed))
                plan = psa_fast.plan(full, num_q_heads=sh.hq, **options)

            def one_gpu():
                with _on_torch_stream():
                    o = torch.from_dlpack(plan.run(q1, 0).out)
                return o.reshape(b, -1).to(wdt) @ w_full

            y1 = one_gpu().clone()
            o1 = cupy.asnumpy(plan.out[..., : sh.d]).reshape(b, -1)
            one_us, _ = median_us(one_gpu, args.reps)
            ref = y1.float().cpu().numpy()
            scale = float(np.abs(ref).max())
            err = float(np.abs(y.float().cpu().numpy() - ref).max()) / scale
            eps = float(torch.finfo(wdt).eps)
            # The worst-case bound of a reordered sum (row_parallel_atol) is far above what a GEMM does in
            # practice (16 n eps ~ 64 at n = 4096 in float16); the budget that can fail is twice the one GPU's
            # own error against the same projection in float64 (STYLE.md's rule), plus the all-reduce's roundings.
            exact = o1.astype(np.float64) @ w_full.double().cpu().numpy()
            reorder = 2 * float(np.abs(ref - exact).max()) / scale
            same = None
            if args.mode != "dense":  # groups in head order: rank r's are a contiguous slice of the one GPU's
                same = same_blocks([u[0] for u in used], [u[1] for u in used], cupy.asnumpy(plan.num_used),
                                   cupy.asnumpy(plan.order_buf))
            summary.update(one_gpu_us=one_us, **scaling(one_us, [r["step_us"] for r in rows], world),
                           rel_err=err, err_budget=projection_budget(world, eps, reorder), same_blocks=same)
            plan = full = None
            cupy.get_default_memory_pool().free_all_blocks()
            torch.cuda.empty_cache()
        log(summary)
    dist.barrier()
    return summary


def main(argv=None) -> None:
    args = parse_args(argv)

    import cupy
    import torch
    import torch.distributed as dist

    from psa_fast.synthetic import trace_block_offsets, trace_block_profiles

    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    local = int(os.environ.get("LOCAL_RANK", 0))
    torch.cuda.set_device(local)
    cupy.cuda.Device(local).use()
    if world == 1 and "MASTER_ADDR" not in os.environ:  # plain `python`: a group of one
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("MASTER_PORT", "29511"))
    dist.init_process_group("nccl", rank=rank, world_size=world)
    offsets = (trace_block_offsets if args.profile == "pooled" else trace_block_profiles)(block_size=args.shape.s)
    if rank == 0:
        name = torch.cuda.get_device_name(local)
        print(f"{world} x {name}; shape {args.shape.name} (Hq {args.shape.hq}, Hkv {args.shape.hkv}, D {args.shape.d}, "
              f"d_model {args.shape.d_model}), mode {args.mode}, τ {args.threshold}, profile {args.profile}, "
              f"W_o {args.wo_dtype}", flush=True)
    summaries = []
    start = time.time()
    path = os.path.join(args.out, "bench_multi_gpu.jsonl")
    f = open(path, "w") if rank == 0 else None
    try:
        def log(r):
            f.write(json.dumps(r) + "\n")
            f.flush()
            print(format_rank_row(r) if r["kind"] == "rank" else f"  summary: {json.dumps(r)}", flush=True)

        for t in args.sizes:
            for b in args.batches:
                s = run_size(args, t, b, offsets, rank, world, log)
                if s is not None:
                    summaries.append(s)
    finally:
        if f is not None:
            f.close()
        dist.destroy_process_group()
    if rank == 0:
        print(f"\n{len(summaries)} sizes in {time.time() - start:.0f} s; rows in {path}\n")
        print(table(summaries))


if __name__ == "__main__":
    main()
