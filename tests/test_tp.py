"""Head-parallel decode in the reference (psa_ref.tools.tensor_parallel): 2 gloo processes equal one process.

The two-process run and the one-process run call the same worker (``_worker``) on the same data. Error budget:
each rank attends its own heads with the same float64 operations as the single process (the loop of a KV head
reads only that head's arrays), so blocks used are identical and attention outputs agree to ``budget64(T)``
(in practice they are bit-identical); the projected output differs only in the order of its final sum
(``n = Hq * D`` products summed as one GEMM vs two partial GEMMs plus an all-reduce), bounded by
``psa_ref.testing.parallel.row_parallel_atol``: ``16 n eps64 max_j sum_i |o_i W_ij|`` (at n = 128 about 1.6e-12,
1.1e-12 of max|output|; measured: 2-3e-16, one or two ulps), plus any measured difference of the attention
outputs passed through ``W_o``.
"""

import time

import numpy as np
import pytest

import psa_ref
from psa_ref.testing import assert_close, budget64, random_problem, skewed_like_trace
from psa_ref.testing.parallel import row_parallel_atol
from psa_ref.tools import tensor_parallel as tp

HQ, HKV, T, D, D_MODEL, S = 8, 4, 997, 16, 24, 16  # T not a multiple of S: a partial last block
CASES = {  # name -> (mode, options)
    "psa ema": ("psa", dict(threshold=0.9)),
    "psa remaining": ("psa", dict(threshold=0.9, stop="remaining")),
    "psa per_head": ("psa", dict(threshold=0.95, step=2, gqa="per_head")),
    "topk": ("topk", dict(k=5)),
    "dense": ("dense", {}),
}
SPAWN_TIMEOUT_S = 120  # a hung collective fails the test after this long instead of blocking CI


def uneven_problem(seed: int = 0):
    """``(q [Hq, D], keys, values [Hkv, T, D], w_o [Hq * D, d_model])``, float64. KV heads 0-1 (rank 0 of 2) are
    skewed like real attention (a sink, a recent window, a few hot blocks: few blocks hold the mass); heads 2-3
    (rank 1) are nearly flat (small logits: PSA reads almost everything). So the two ranks' budgets differ."""
    rng = np.random.default_rng(seed)
    half = dict(num_q_heads=HQ // 2, num_kv_heads=HKV // 2, num_tokens=T, head_dim=D)
    qa, ka, va = skewed_like_trace(rng, **half, block_size=S, dtype=np.float64)
    qb, kb, vb = random_problem(rng, **half, logit_scale=0.2)
    w_o = rng.standard_normal((HQ * D, D_MODEL)) / np.sqrt(HQ * D)
    return np.concatenate([qa, qb]), np.concatenate([ka, kb]), np.concatenate([va, vb]), w_o


def _worker(rank: int, world_size: int) -> dict:
    """Every case on this rank's shard; with 2 ranks also two failing steps (the failure in the middle shows that
    every rank raises, and that the group still works for the cases after them)."""
    q, keys, values, w_o = uneven_problem()
    shard = tp.shard_heads(num_q_heads=HQ, num_kv_heads=HKV, world_size=world_size)[rank]
    ql, kl, vl, wl = shard.take(q, keys, values, w_o)
    blocks = psa_ref.KVBlocks.from_dense(kl, vl, block_size=S)
    out = {}

    def attempt(name, *args, **kwargs):
        try:
            s = tp.decode_step(*args, **kwargs)
            out[name] = dict(output=s.output, partial=s.partial, attention=s.attention, blocks_used=s.blocks_used,
                             budgets=s.budgets, shard=s.shard)
        except Exception as exc:
            out[name] = dict(error=type(exc).__name__, message=str(exc))

    names = list(CASES)
    for name in names[:2]:
        attempt(name, ql, blocks, wl, mode=CASES[name][0], **CASES[name][1])
    if world_size > 1:  # the last rank's W_o has one column more; then its q is not [Hq / W, D]
        last = rank == world_size - 1
        attempt("d_model differs", ql, blocks, np.pad(wl, ((0, 0), (0, 1))) if last else wl)
        attempt("bad q on one rank", ql[0] if last else ql, blocks, wl)
    for name in names[2:]:
        attempt(name, ql, blocks, wl, mode=CASES[name][0], **CASES[name][1])
    return out


@pytest.fixture
def one_process_group():
    """torch.distributed in this process with world_size 1 (gloo over an in-memory store), torn down after."""
    dist = pytest.importorskip("torch.distributed")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield dist
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def two_ranks():
    """The worker on 2 spawned gloo processes: ``(results by rank, seconds)``."""
    pytest.importorskip("torch.distributed")
    t0 = time.perf_counter()
    results = tp.spawn(_worker, 2, timeout_s=SPAWN_TIMEOUT_S)
    return results, time.perf_counter() - t0


@pytest.mark.parametrize("name", list(CASES))
def test_two_processes_equal_one(name, two_ranks, one_process_group):
    (r0, r1), _ = two_ranks
    one = _worker(0, 1)[name]
    a, b = r0[name], r1[name]
    assert "error" not in a and "error" not in b, (a.get("message"), b.get("message"))
    # blocks: rank 0's groups then rank 1's are the single process's groups, in the same order
    used = a["blocks_used"] + b["blocks_used"]
    assert len(used) == len(one["blocks_used"])
    for g, (x, y) in enumerate(zip(used, one["blocks_used"])):
        np.testing.assert_array_equal(x, y, err_msg=f"{name}: blocks_used of selection group {g}")
    attention = np.concatenate([a["attention"], b["attention"]])
    assert_close(f"{name}: attention outputs", attention, one["attention"], rtol=budget64(T))
    # the all-reduce leaves the same numbers on every rank (a 2-term sum is commutative in floating point)
    np.testing.assert_array_equal(a["output"], b["output"])
    _, _, _, w_o = uneven_problem()
    # the attention outputs' own difference (0 in practice, at most budget64(T)) passes through W_o
    attention_rtol = float(np.abs(attention - one["attention"]).max() / np.abs(one["attention"]).max())
    atol = row_parallel_atol(one["attention"], w_o, attention_rtol=attention_rtol)
    assert atol < 1e-11 * float(np.abs(one["output"]).max())  # here ~1.1e-12 of the output: a tight budget
    assert_close(f"{name}: all-reduced output", a["output"], one["output"], rtol=0.0, atol=atol)
    np.testing.assert_array_equal(a["partial"] + b["partial"], a["output"])
    # budgets: the same blocks per KV head as one process, split by rank; the same report on both ranks
    assert a["budgets"].blocks_read.shape == (2, 1, HKV // 2)
    np.testing.assert_array_equal(a["budgets"].blocks_read.reshape(-1), one["budgets"].blocks_read.reshape(-1))
    np.testing.assert_array_equal(a["budgets"].blocks_read, b["budgets"].blocks_read)
    assert (a["shard"].kv_heads, b["shard"].kv_heads) == (range(0, 2), range(2, 4))
    assert (a["shard"].q_heads, b["shard"].q_heads) == (range(0, 4), range(4, 8))


def test_uneven_budgets_are_reported(two_ranks):
    (r0, r1), _ = two_ranks
    for name in ("psa ema", "psa remaining"):
        rep = r0[name]["budgets"]
        n = int(rep.num_blocks[0])
        assert n == -(-T // S)
        assert rep.per_rank[0] < rep.per_rank[1], f"{name}: the skewed heads (rank 0) should read fewer blocks"
        assert rep.busiest == 1 and rep.imbalance > 1.0
        assert f"{rep.imbalance:.2f}" in rep.table() and rep.table().splitlines()[2].endswith("<- busiest")
    stark = r0["psa remaining"]["budgets"]
    assert stark.per_rank[1] > 3 * stark.per_rank[0] and stark.imbalance > 1.5
    assert np.all(r0["dense"]["budgets"].blocks_read == -(-T // S))
    assert np.all(r0["topk"]["budgets"].blocks_read == 5) and r0["topk"]["budgets"].imbalance == 1.0
    assert r0["topk"]["budgets"].busiest == 0  # ties go to the lowest rank


def test_a_failing_rank_makes_every_rank_raise(two_ranks):
    (r0, r1), _ = two_ranks
    for r in (r0, r1):
        e = r["d_model differs"]
        assert e["error"] == "ValueError" and "d_model" in e["message"], e
        assert "rank 0: 24, rank 1: 25" in e["message"]
    bad = r1["bad q on one rank"]
    assert bad["error"] == "ValueError" and "q must have shape" in bad["message"]
    assert r0["bad q on one rank"]["error"] == "RuntimeError"
    assert "rank 1 of 2 failed" in r0["bad q on one rank"]["message"]


def test_two_processes_are_quick(two_ranks):
    _, seconds = two_ranks
    assert seconds < 30, f"2 gloo processes took {seconds:.1f} s"


# --- which heads each rank owns (no processes) ---------------------------------------------------------------

def test_llama_heads_over_two_and_eight_ranks():
    s0, s1 = tp.shard_heads(num_q_heads=32, num_kv_heads=8, world_size=2)
    assert (s0.kv_heads, s0.q_heads, s0.wo_rows(128)) == (range(0, 4), range(0, 16), slice(0, 2048))
    assert (s1.kv_heads, s1.q_heads, s1.wo_rows(128)) == (range(4, 8), range(16, 32), slice(2048, 4096))
    eight = tp.shard_heads(num_q_heads=32, num_kv_heads=8, world_size=8)
    assert [(s.rank, s.kv_heads, s.q_heads) for s in eight] == [(r, range(r, r + 1), range(4 * r, 4 * r + 4))
                                                               for r in range(8)]


@pytest.mark.parametrize("hkv,g,w", [(1, 1, 1), (2, 3, 2), (8, 4, 4), (6, 1, 3), (12, 2, 6)])
def test_shards_cover_every_head_once_and_keep_groups_whole(hkv, g, w):
    shards = tp.shard_heads(num_q_heads=hkv * g, num_kv_heads=hkv, world_size=w)
    assert [s.rank for s in shards] == list(range(w)) and all(s.world_size == w for s in shards)
    assert [h for s in shards for h in s.kv_heads] == list(range(hkv))
    assert [h for s in shards for h in s.q_heads] == list(range(hkv * g))
    for s in shards:  # query head h reads KV head h // g: every query head of a rank reads one of its KV heads
        assert {h // g for h in s.q_heads} == set(s.kv_heads)


def test_take_slices_the_rank_s_part():
    q, keys, values, w_o = uneven_problem()
    shard = tp.shard_heads(num_q_heads=HQ, num_kv_heads=HKV, world_size=2)[1]
    ql, kl, vl, wl = shard.take(q, keys, values, w_o)
    np.testing.assert_array_equal(ql, q[4:8])
    np.testing.assert_array_equal(kl, keys[2:4])
    np.testing.assert_array_equal(vl, values[2:4])
    np.testing.assert_array_equal(wl, w_o[4 * D : 8 * D])
    qb = np.stack([q, q + 1])  # [B, Hq, D]
    np.testing.assert_array_equal(shard.take(qb, keys, values, w_o)[0], qb[:, 4:8])


@pytest.mark.parametrize("kwargs,match", [
    (dict(num_q_heads=12, num_kv_heads=3, world_size=2), r"3 KV heads do not split evenly over world_size 2"),
    (dict(num_q_heads=32, num_kv_heads=8, world_size=16),
     r"num_kv_heads \(8\) must be a multiple of world_size \(16\)"),
    (dict(num_q_heads=12, num_kv_heads=8, world_size=2), r"query heads \(12\) must be a multiple .* KV heads \(8\)"),
    (dict(num_q_heads=8, num_kv_heads=4, world_size=0), r"world_size must be >= 1"),
])
def test_shard_heads_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        tp.shard_heads(**kwargs)


def test_take_rejects_wrong_shapes():
    q, keys, values, w_o = uneven_problem()
    shard = tp.shard_heads(num_q_heads=HQ, num_kv_heads=HKV, world_size=2)[0]
    with pytest.raises(ValueError, match=r"q must have shape \[Hq=8, D\]"):
        shard.take(q[:6], keys, values, w_o)
    with pytest.raises(ValueError, match=r"keys must have shape \[Hkv=4, T, D=16\]"):
        shard.take(q, keys[:3], values[:3], w_o)
    with pytest.raises(ValueError, match="values must have the shape of keys"):
        shard.take(q, keys, values[:, :5], w_o)
    with pytest.raises(ValueError, match=r"w_o must have shape \[Hq \* D = 128, d_model\]"):
        shard.take(q, keys, values, w_o[:100])


def test_budget_arithmetic():
    # per_head: a KV head's reads are the sum over its query heads' budgets
    np.testing.assert_array_equal(tp.blocks_read_per_kv_head([[3, 4, 5, 6]], 2), [[7, 11]])
    np.testing.assert_array_equal(tp.blocks_read_per_kv_head([3, 4], 2), [3, 4])
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        tp.blocks_read_per_kv_head([1, 2, 3], 2)
    rep = tp.RankBudgets(np.array([[[2, 4], [6, 8]], [[10, 10], [10, 10]]]), np.array([10, 10]))
    assert rep.per_rank.tolist() == [20, 40] and rep.busiest == 1 and rep.imbalance == pytest.approx(40 / 30)
    assert rep.share.tolist() == [0.5, 1.0] and rep.world_size == 2


# --- errors in one process ---------------------------------------------------------------------------------

def test_not_initialised_is_a_clear_error():
    dist = pytest.importorskip("torch.distributed")
    assert not dist.is_initialized()
    q, keys, values, w_o = uneven_problem()
    with pytest.raises(RuntimeError, match="torch.distributed is not initialised: call .*init_process_group"):
        tp.decode_step(q, psa_ref.KVBlocks.from_dense(keys, values), w_o)


def _bad_inputs():
    q, keys, values, w_o = uneven_problem()
    blocks = psa_ref.KVBlocks.from_dense(keys, values, block_size=S)
    return [
        ((q[0], blocks, w_o), {}, ValueError, r"q must have shape \[Hq / W, D\]"),
        ((q.astype(np.int32), blocks, w_o), {}, TypeError, "q must have dtype float16, float32 or float64"),
        ((q, blocks, w_o[:-1]), {}, ValueError, r"w_o must have shape .*\[8 \* 16 = 128, d_model\]"),
        ((q, blocks, w_o.astype(np.int64)), {}, TypeError, "w_o must have dtype"),
        ((q, (keys, values), w_o), {}, TypeError, "blocks must be a psa_ref.KVBlocks"),
        ((q, psa_ref.KVBlocks.from_dense(keys[0], values[0]), w_o), {}, ValueError, r"\[Hkv / W, T, D\] keys"),
        ((q, blocks, w_o), dict(mode="sparse"), ValueError, "mode must be one of"),
        ((q, blocks, w_o), dict(threshold=1.5), ValueError, r"threshold must lie in \(0, 1\]"),
        ((q[:6], blocks, w_o[: 6 * D]), {}, ValueError, r"query heads \(6\) must be a multiple"),
    ]


@pytest.mark.parametrize("case", range(len(_bad_inputs())))
def test_bad_inputs_are_clear_errors(case, one_process_group):
    args, kwargs, exc, match = _bad_inputs()[case]
    with pytest.raises(exc, match=match):
        tp.decode_step(*args, **kwargs)
    # the group is still usable: a good step after the failed one
    q, keys, values, w_o = uneven_problem()
    assert tp.decode_step(q, psa_ref.KVBlocks.from_dense(keys, values, block_size=S), w_o).output.shape == (D_MODEL,)


def _sleeper(rank: int, world_size: int, seconds: float) -> None:
    time.sleep(seconds)


def test_spawn_fails_on_a_hang_instead_of_blocking():
    pytest.importorskip("torch.multiprocessing")
    t0 = time.perf_counter()
    with pytest.raises(TimeoutError, match="not done after 2"):
        tp.spawn(_sleeper, 1, args=(60.0,), timeout_s=2)
    assert time.perf_counter() - t0 < 15


def test_spawn_checks_its_arguments():
    with pytest.raises(ValueError, match="world_size must be >= 1"):
        tp.spawn(_sleeper, 0)
    with pytest.raises(ValueError, match="timeout_s must be a positive number"):
        tp.spawn(_sleeper, 1, timeout_s=0)
