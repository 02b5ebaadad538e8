"""The CPU side of benchmarks/bench_multi_gpu.py: its arguments, the per-head data (a rank's shard is exactly those
heads of the one-GPU cache), the scaling and budget arithmetic, the block comparison and the table. The timing
itself needs ``torchrun`` on GPUs."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))

import bench_multi_gpu as bm  # noqa: E402


def test_import_needs_no_gpu_library():
    code = (f"import sys; sys.path.insert(0, {str(BENCH)!r}); import bench_multi_gpu; "
            "assert not {'cupy', 'torch'} & set(sys.modules), sorted(sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=BENCH.parent)


def test_default_arguments_are_the_run_of_record():
    a = bm.parse_args([])
    assert (a.shape.hq, a.shape.hkv, a.shape.d, a.shape.d_model, a.shape.s) == (32, 8, 128, 4096, 16)
    assert a.sizes == [131072] and a.batches == [8, 32] and a.reps == 30
    assert a.mode == "psa" and a.threshold == 0.95 and a.profile == "pooled" and a.wo_dtype == "float16"
    assert a.step is None and not a.no_baseline
    q = bm.parse_args(["--quick"])
    assert q.sizes == [32768] and q.batches == [8] and q.reps == 10
    c = bm.parse_args(["--sizes", "32K,131072", "--batches", "1,32", "--mode", "topk", "--k", "400", "--profile",
                       "per-head", "--reps", "5", "--step", "64"])
    assert c.sizes == [32768, 131072] and c.batches == [1, 32] and (c.k, c.reps, c.step) == (400, 5, 64)


@pytest.mark.parametrize("argv", [["--sizes", "12x"], ["--sizes", "0"], ["--batches", "8,-1"], ["--reps", "0"],
                                  ["--threshold", "1.5"], ["--step", "0"], ["--mode", "sparse"], ["--k", "0"]])
def test_bad_arguments_exit(argv):
    with pytest.raises(SystemExit):
        bm.parse_args(argv)


class FakeCache:
    """What fill_heads needs of a PagedKVCache, on the CPU."""

    def __init__(self, batch, num_kv_heads, head_dim=8, block_size=4, nmax=5):
        self.batch, self.num_kv_heads, self.head_dim, self.block_size, self.nmax = (batch, num_kv_heads, head_dim,
                                                                                  block_size, nmax)
        self.capacity = nmax * block_size
        self.keys, self.values = {}, {}

    def prefill(self, layer, request, keys, values):
        assert keys.shape == (self.num_kv_heads, self.capacity, self.head_dim) and keys.dtype == np.float16
        self.keys[layer, request], self.values[layer, request] = keys.copy(), values.copy()


@pytest.mark.parametrize("offsets", [np.linspace(-8.0, 0.0, 33), np.linspace(-6.0, 0.0, 15).reshape(3, 5)])
def test_a_rank_s_shard_is_exactly_those_heads_of_the_one_gpu_data(offsets):
    hkv, g, b = 4, 3, 2
    full = FakeCache(b, hkv)
    q_full = bm.fill_heads(full, 1, range(hkv), g, offsets, seed=7, xp=np)
    assert q_full.shape == (b, hkv * g, 8) and q_full.dtype == np.float16
    for world in (2, 4):
        per = hkv // world
        for r in range(world):
            heads = range(r * per, (r + 1) * per)
            part = FakeCache(b, per)
            q = bm.fill_heads(part, 1, heads, g, offsets, seed=7, xp=np)
            np.testing.assert_array_equal(q, q_full[:, heads.start * g : heads.stop * g])
            for req in range(b):
                np.testing.assert_array_equal(part.keys[1, req], full.keys[1, req][heads.start : heads.stop])
                np.testing.assert_array_equal(part.values[1, req], full.values[1, req][heads.start : heads.stop])
    other = FakeCache(b, hkv)
    bm.fill_heads(other, 1, range(hkv), g, offsets, seed=8, xp=np)
    assert not np.array_equal(other.keys[1, 0], full.keys[1, 0])  # the seed matters
    assert not np.array_equal(full.keys[1, 0][0], full.keys[1, 0][1])  # and heads differ


def test_head_seeds_are_distinct():
    seeds = {bm.head_seed(0, layer, r, kv) for layer in range(3) for r in range(40) for kv in range(8)}
    assert len(seeds) == 3 * 40 * 8 and all(0 <= s < 2**32 for s in seeds)
    assert bm.head_seed(1, 0, 0, 0) != bm.head_seed(0, 0, 0, 0)  # the run's seed counts
    with pytest.raises(ValueError):
        bm.head_seed(0, 0, -1, 0)


def test_scaling_and_budget_arithmetic():
    s = bm.scaling(1000.0, [520.0, 540.0], 2)
    assert s == dict(step_us=540.0, speedup=pytest.approx(1000 / 540), efficiency=pytest.approx(1000 / 540 / 2))
    with pytest.raises(ValueError):
        bm.scaling(0.0, [1.0], 2)
    assert bm.projection_budget(1, 1e-3, 2e-4) == 2e-4
    assert bm.projection_budget(2, 1e-3, 2e-4) == pytest.approx(2e-4 + 4e-3)
    assert bm.default_step(8192, 2) == 128 and bm.default_step(100, 8) == 64


def test_same_blocks_compares_the_attended_prefix_only():
    n1 = np.array([[2, 3, 1, 2]])                       # [B=1, Gn=4]
    o1 = np.array([[[5, 1, 9, 9], [0, 2, 4, 7], [3, 8, 8, 8], [6, 7, 0, 0]]])
    ranks_n = [n1[:, :2], n1[:, 2:]]
    ranks_o = [o1[:, :2].copy(), o1[:, 2:].copy()]
    ranks_o[1][0, 0, 3] = 42                             # beyond the attended prefix: ignored
    assert bm.same_blocks(ranks_n, ranks_o, n1, o1)
    ranks_o[0][0, 1, 0] = 3                              # inside it: a different block
    assert not bm.same_blocks(ranks_n, ranks_o, n1, o1)
    assert not bm.same_blocks([n1[:, :2], n1[:, 2:] + 1], [o1[:, :2], o1[:, 2:]], n1, o1)


def test_table_and_rank_line():
    summary = dict(kind="summary", T=131072, B=32, world_size=2, step_us=1200.0, local_us=[1150.0, 980.0],
                   allreduce_us=15.0, allreduce_share=0.0125, blocks_per_head=[410.0, 350.0], busiest=0, imbalance=1.08,
                   one_gpu_us=2300.0, speedup=2300 / 1200, efficiency=2300 / 2400, rel_err=3e-4, err_budget=4.2e-3,
                   same_blocks=True)
    text = bm.table([summary, dict(summary, one_gpu_us=None, speedup=None, efficiency=None, rel_err=None,
                                   err_budget=None, same_blocks=None)])
    lines = text.splitlines()
    assert len(lines) == 4 and lines[0].startswith("| T | B | W | 1 GPU µs")
    assert "| 128K | 32 | 2 | 2300.0 | 1200.0 | 1.92× | 96% | 1150.0 / 980.0 | 15.0 (1.2%) |" in lines[2]
    assert lines[2].endswith("| 0 | 1.08 | 3.0e-04 (4.2e-03) | yes |")
    assert "| — | 1200.0 | — | — |" in lines[3] and lines[3].endswith("| — | — |")
    rank = dict(T=131072, B=8, rank=1, world_size=2, step_us=300.0, local_us=280.0, allreduce_us=9.0,
                allreduce_share=0.03, blocks_per_head=123.4, share=0.015, graphs=True)
    assert "rank 1/2" in bm.format_rank_row(rank) and "(3.0%)" in bm.format_rank_row(rank)
