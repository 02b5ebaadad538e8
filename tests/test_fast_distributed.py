"""psa_fast.distributed: head-parallel decode through torch.distributed, on one GPU with world_size = 1.

The GPU tests (skipped without a GPU) build an NCCL group of one rank in this process (a FileStore) and compare
[`HeadParallelDecoder.step`] with the plain single-GPU path: ``psa_fast.plan(...).run(q).out`` times ``W_o`` with
torch. Error budget (float32): the decoder runs the same kernels on the same cache, so its decisions (blocks used,
iterations, stop reasons) must be identical and its attention outputs agree to ``ATTN_RTOL = 1e-6`` of max|out|
(8 float32 epsilons: room for a kernel whose partial outputs merge in another order; in practice they are equal);
the projected output then lies within ``row_parallel_atol(o, W_o, eps=EPS32, attention_rtol=measured)``: a
float32 GEMM whose ``n = Hq * D`` products may be summed in another order (``16 n eps32 max_j sum_i |o_i W_ij|``),
plus the measured attention difference passed through ``W_o``. A one-rank all-reduce adds nothing.
With offload the reference is an [`OffloadDecoder`] on the same cache (same budget), and the resident plan within
``tests/test_fast_offload.py``'s ``1e-5`` of max|out|.

What this cannot show: two ranks. ``benchmarks/bench_multi_gpu.py`` under ``torchrun --nproc_per_node 2``
compares 2 GPUs with one on the same data (outputs, blocks per head); the CPU twin with 2 gloo processes is
``tests/test_tp.py``.

The last tests run everywhere: importing ``psa_fast.distributed`` needs no GPU, CuPy or torch, and building a
decoder without a GPU raises ``RuntimeError``.
"""

import math
import subprocess
import sys

import numpy as np
import pytest

import psa_fast
import psa_ref
from psa_ref.testing import assert_close
from psa_ref.testing.parallel import EPS32, row_parallel_atol

needs_gpu = pytest.mark.skipif(not psa_fast.gpu_available(), reason="needs a CUDA GPU (cupy.cuda.is_available())")

HQ, HKV, D, D_MODEL, S = 8, 2, 64, 96, 16
LENS = (1000, 333, 17)  # one full-ish request, one with a partial last block, one of two blocks
ATTN_RTOL = 1e-6
OFFLOAD_RTOL = 1e-5  # offload vs resident, tests/test_fast_offload.py's budget


@pytest.fixture
def nccl_one(tmp_path):
    """An NCCL process group of one rank in this process, on GPU 0; destroyed after the test."""
    torch = pytest.importorskip("torch")
    import cupy
    import torch.distributed as dist

    if not torch.cuda.is_available() or not dist.is_nccl_available():
        pytest.skip("torch has no CUDA or no NCCL here")
    torch.cuda.set_device(0)
    cupy.cuda.Device(0).use()
    dist.init_process_group("nccl", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    yield dist
    dist.destroy_process_group()


def fill(cache, seed: int = 0):
    """Random skewed KV in every layer and request of ``cache``; returns one ``[B, Hq, D]`` float16 query per
    layer (CuPy)."""
    import cupy

    rng = np.random.default_rng(seed)
    qs = []
    for layer in range(cache.num_layers):
        q_l = []
        for b, t in enumerate(LENS):
            q, k, v = psa_ref.testing.random_problem(rng, num_q_heads=HQ, num_kv_heads=HKV, num_tokens=t, head_dim=D,
                                                     logit_scale=3.0, dtype=np.float16)
            cache.prefill(layer, b, cupy.asarray(k), cupy.asarray(v))
            q_l.append(q)
        qs.append(cupy.asarray(np.stack(q_l)))
    return qs


def projection(seed: int = 1):
    """``W_o [Hq * D, d_model]`` float32 on the GPU."""
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(HQ * D, D_MODEL, generator=g, device="cuda") / math.sqrt(HQ * D)


def check_step(dec, plain, q, w_o, layer, what):
    """``dec.step`` against ``plain.run`` + the projection, within the budget of the module doc."""
    import cupy
    import torch

    y = dec.step(torch.from_dlpack(q), w_o, layer)
    got = {name: cupy.asnumpy(getattr(dec.last, name)) for name in ("out", "num_used", "iterations", "reason")}
    ref = plain.run(q, layer)
    y_ref = torch.from_dlpack(ref.out).reshape(len(LENS), -1) @ w_o
    for name in ("num_used", "iterations", "reason"):
        np.testing.assert_array_equal(got[name], cupy.asnumpy(getattr(ref, name)), err_msg=f"{what}: {name}")
    if ref.order is not None:
        order, n = cupy.asnumpy(ref.order), cupy.asnumpy(ref.num_used)
        mine = cupy.asnumpy(dec.last.order)
        for b in range(order.shape[0]):
            for g in range(order.shape[1]):
                np.testing.assert_array_equal(mine[b, g, : n[b, g]], order[b, g, : n[b, g]],
                                              err_msg=f"{what}: blocks of request {b}, group {g}")
    o_ref = cupy.asnumpy(ref.out)
    assert_close(f"{what}: attention outputs", got["out"], o_ref, rtol=ATTN_RTOL)
    rtol = float(np.abs(got["out"] - o_ref).max() / np.abs(o_ref).max())
    atol = row_parallel_atol(o_ref, w_o.cpu().numpy(), eps=EPS32, attention_rtol=rtol)
    assert_close(f"{what}: projected output", y.cpu().numpy(), y_ref.cpu().numpy(), rtol=0.0, atol=atol)
    return y, got


@needs_gpu
@pytest.mark.parametrize("mode,options", [
    ("psa", dict(threshold=0.95, step=4)),
    ("psa", dict(threshold=0.9, step=2, gqa="per_head", stop="remaining")),
    ("topk", dict(k=6)),
    ("dense", {}),
])
def test_one_rank_equals_the_single_gpu_plan(nccl_one, mode, options):
    from psa_fast.distributed import HeadParallelDecoder, shard_cache

    cache = shard_cache(num_kv_heads=HKV, num_layers=2, batch=len(LENS), head_dim=D, max_tokens=max(LENS),
                        block_size=S)
    assert isinstance(cache, psa_fast.PagedKVCache) and cache.num_kv_heads == HKV
    qs = fill(cache)
    dec = HeadParallelDecoder(cache, num_q_heads=HQ, mode=mode, **options)
    assert (dec.shard.kv_heads, dec.shard.q_heads) == (range(HKV), range(HQ))
    plain = psa_fast.plan(cache, num_q_heads=HQ, mode=mode, **options)
    w_o = projection()
    for layer in range(cache.num_layers):
        _, got = check_step(dec, plain, qs[layer], w_o, layer, f"{mode} {options} layer {layer}")
        rep = dec.budgets()
        assert rep.blocks_read.shape == (1, len(LENS), HKV) and rep.busiest == 0 and rep.imbalance == 1.0
        np.testing.assert_array_equal(rep.num_blocks, [-(-t // S) for t in LENS])
        expect = (np.repeat(rep.num_blocks[:, None], HKV, axis=1) if mode == "dense" else
                  got["num_used"].reshape(len(LENS), HKV, -1).sum(axis=-1))
        np.testing.assert_array_equal(rep.blocks_read[0], expect)


@needs_gpu
def test_one_rank_with_offload_equals_the_offload_decoder_and_the_resident_plan(nccl_one):
    import cupy

    from psa_fast.distributed import HeadParallelDecoder, shard_cache
    from psa_fast.offload import OffloadDecoder, OffloadKVCache

    dims = dict(num_layers=2, batch=len(LENS), head_dim=D, max_tokens=max(LENS), block_size=S)
    off = shard_cache(num_kv_heads=HKV, num_slots=96, **dims)
    assert isinstance(off, OffloadKVCache)
    res = shard_cache(num_kv_heads=HKV, **dims)
    qs, qs_res = fill(off), fill(res)
    options = dict(threshold=0.95, step=4)
    dec = HeadParallelDecoder(off, num_q_heads=HQ, **options)
    assert isinstance(dec.plan, OffloadDecoder)
    plain, resident = OffloadDecoder(off, num_q_heads=HQ, **options), psa_fast.plan(res, num_q_heads=HQ, **options)
    w_o = projection()
    for rep in range(3):  # the offload decoder captures its graphs at a layer's second step
        for layer in range(2):
            _, got = check_step(dec, plain, qs[layer], w_o, layer, f"offload step {rep} layer {layer}")
            r = resident.run(qs_res[layer], layer)
            np.testing.assert_array_equal(got["num_used"], cupy.asnumpy(r.num_used))
            assert_close(f"offload vs resident, layer {layer}", got["out"], cupy.asnumpy(r.out), rtol=OFFLOAD_RTOL)


@needs_gpu
def test_step_replays_in_a_cuda_graph(nccl_one):
    import torch

    from psa_fast.distributed import HeadParallelDecoder, shard_cache

    cache = shard_cache(num_kv_heads=HKV, num_layers=1, batch=len(LENS), head_dim=D, max_tokens=max(LENS))
    q = torch.from_dlpack(fill(cache)[0])
    dec = HeadParallelDecoder(cache, num_q_heads=HQ, threshold=0.95, step=4)
    w_o = projection()
    eager = dec.step(q, w_o, 0).clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up on the capture stream (torch's recipe)
        dec.step(q, w_o, 0)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):  # CuPy's launches come from this thread
        y = dec.step(q, w_o, 0)
    y.zero_()
    graph.replay()
    torch.cuda.synchronize()
    np.testing.assert_array_equal(y.cpu().numpy(), eager.cpu().numpy())


@needs_gpu
def test_clear_errors_on_the_gpu(nccl_one):
    import torch

    from psa_fast.distributed import HeadParallelDecoder, shard_cache

    cache = shard_cache(num_kv_heads=HKV, num_layers=1, batch=len(LENS), head_dim=D, max_tokens=max(LENS))
    q = torch.from_dlpack(fill(cache)[0])
    with pytest.raises(ValueError, match=r"query heads \(5\) must be a multiple of the number of KV heads \(2\)"):
        HeadParallelDecoder(cache, num_q_heads=5)
    with pytest.raises(TypeError, match="cache must be a psa_fast.PagedKVCache"):
        HeadParallelDecoder(object(), num_q_heads=HQ)
    dec = HeadParallelDecoder(cache, num_q_heads=HQ)
    w_o = projection()
    with pytest.raises(RuntimeError, match="run step"):
        dec.budgets()
    with pytest.raises(ValueError, match=r"q must have shape \[B=3, Hq / W=8, D=64\]"):
        dec.step(q[0], w_o)
    with pytest.raises(TypeError, match="w_o must be on this rank's GPU"):
        dec.step(q, w_o.cpu())
    with pytest.raises(TypeError, match="w_o must have dtype"):
        dec.step(q, w_o.to(torch.float64))
    with pytest.raises(ValueError, match=r"w_o must have shape \[Hq / W \* D = 512, d_model\]"):
        dec.step(q, w_o[:100])
    with pytest.raises(TypeError, match="w_o must be a CUDA torch tensor"):
        dec.step(q, w_o.cpu().numpy())


@needs_gpu
def test_not_initialised_on_the_gpu():
    torch = pytest.importorskip("torch")
    if torch.distributed.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    from psa_fast.distributed import shard_cache

    with pytest.raises(RuntimeError, match="torch.distributed is not initialised"):
        shard_cache(num_kv_heads=HKV, num_layers=1, batch=1, head_dim=D, max_tokens=64)


# --- everywhere -----------------------------------------------------------------------------------------------

def test_import_needs_no_gpu_cupy_or_torch():
    code = ("import sys, psa_fast.distributed as d; d.HeadParallelDecoder, d.shard_cache, d.RankBudgets; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'cupy', 'torch'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", f"import psa_fast.distributed loaded {out.strip()}"


@pytest.mark.skipif(psa_fast.gpu_available(), reason="checks the CPU-only error")
def test_without_a_gpu_building_raises_runtime_error():
    from psa_fast.distributed import HeadParallelDecoder, shard_cache

    with pytest.raises(RuntimeError, match="psa_fast needs an NVIDIA GPU"):
        shard_cache(num_kv_heads=8, num_layers=1, batch=1, head_dim=128, max_tokens=1024)
    with pytest.raises(RuntimeError, match="psa_fast needs an NVIDIA GPU"):
        HeadParallelDecoder(None, num_q_heads=32)
