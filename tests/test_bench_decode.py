"""The CPU side of benchmarks/bench_decode.py and plot_decode.py: arguments, the floor arithmetic, the
blocks-read count, the sparsity data path and the plots (the timing itself needs the GPU)."""

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))

import bench_decode as bd  # noqa: E402
import plot_decode  # noqa: E402
import plot_step  # noqa: E402

LLAMA, GEMMA = bd.SHAPES["llama8b"], bd.SHAPES["gemma3"]


def test_import_needs_no_gpu_library():
    code = (f"import sys; sys.path.insert(0, {str(BENCH)!r}); import bench_decode, plot_decode; "
            "assert not {'cupy', 'torch', 'matplotlib'} & set(sys.modules), sorted(sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=BENCH.parent)


def test_default_arguments_are_the_run_of_record():
    a = bd.parse_args([])
    assert a.shape is LLAMA and (a.shape.hq, a.shape.hkv, a.shape.d, a.shape.s) == (32, 8, 128, 16)
    assert a.profile == "pooled" and a.shares == [None] and a.skip == set() and a.versions == []
    assert a.sizes == [(t, b) for t in (8192, 32768, 131072) for b in (1, 8, 32)]
    assert bd.parse_args(["--quick"]).sizes == [(8192, 1), (8192, 8), (32768, 1), (32768, 8)]
    assert (a.speculate, a.extra_chunks) == (bd.SPECULATE, None)  # the speculative rows: margin 2, one step past it
    b = bd.parse_args(["--speculate", "1", "--extra-chunks", "8"])
    assert (b.speculate, b.extra_chunks) == (1.0, 8)


def test_sparsity_arguments():
    a = bd.parse_args(["--profile", "sparsity", "--shape", "gemma3", "--sizes", "32768:1,131072:1,131072:8",
                       "--skip", "sketch,topk", "--versions", "2"])
    assert a.sizes == [(32768, 1), (131072, 1), (131072, 8)]
    assert a.shares == [0.02, 0.05, 0.1, 0.2, 0.3]
    assert (a.shape.hq, a.shape.hkv, a.shape.d, a.shape.g) == (4, 1, 256, 4)
    assert a.shape.logit_scale == 0.0625 and a.skip == {"sketch", "topk"} and a.versions == [2]
    smol = bd.parse_args(["--shape", "smollm2", "--sizes", "32K,128K", "--batches", "1,8"])
    assert (smol.shape.hq, smol.shape.hkv, smol.shape.d) == (9, 3, 64)
    assert smol.shape.logit_scale == pytest.approx(1 / 8)
    assert smol.sizes == [(32768, 1), (32768, 8), (131072, 1), (131072, 8)]
    assert bd.parse_args(["--profile", "sparsity", "--shares", "0.3,0.02"]).shares == [0.3, 0.02]


@pytest.mark.parametrize("argv", [
    ["--sizes", "32768:x"], ["--sizes", "0"], ["--batches", "1,0"], ["--profile", "sparsity", "--shares", "0.1,1.5"],
    ["--profile", "sparsity", "--shares", "a"], ["--skip", "dense"], ["--shape", "gpt2"], ["--profile", "flat"],
    ["--reps", "0"], ["--recent-blocks", "-1"], ["--speculate", "0"], ["--extra-chunks", "-1"],
])
def test_bad_arguments_exit(argv):
    with pytest.raises(SystemExit):
        bd.parse_args(argv)


def test_floor_of_dense_is_the_whole_kv():
    # Llama-3.1-8B, 128K tokens, one request: 8 KV heads x 131072 tokens x 128 x float16, K and V
    kv = 8 * 131072 * 128 * 2 * 2
    assert bd.floor_bytes(LLAMA, t=131072, b=1) == kv + 32 * 128 * 6  # + query in, output out
    # at DESIGN.md's 4229 GB/s that is ~127 µs: torch SDPA's ~129 µs there is at its floor
    assert bd.floor_us(bd.floor_bytes(LLAMA, t=131072, b=1), 4229.0) == pytest.approx(126.95, abs=0.01)
    # Gemma 3's global layer, 32K, B = 8: one KV head of D 256
    assert bd.floor_bytes(GEMMA, t=32768, b=8) == 8 * (32768 * 256 * 4 + 4 * 256 * 6)
    # a partial last block is read whole
    assert bd.floor_bytes(LLAMA, t=17, b=1) == bd.floor_bytes(LLAMA, t=32, b=1)


def test_floor_of_psa_is_metadata_plus_the_blocks_it_read():
    n = 8192  # 128K / 16
    read = 0.04 * n  # issue 14: ~4% of blocks, floor ~13.5 µs
    want = (8 * read * 16 * 128 * 4  # K and V of the blocks read
            + 8 * n * 128 * 4  # centre and radius per block, float16
            + 8 * (12 * n + 4 * read)  # scores written and read, order written, its head read
            + 32 * 128 * 6)
    got = bd.floor_bytes(LLAMA, t=131072, b=1, blocks_read=read, metadata="cuboid_mean")
    assert got == round(want)
    assert bd.floor_us(got, 4229.0) == pytest.approx(13.2, abs=0.1)
    # the metadata is most of it: at 4% of blocks a step cannot beat ~10x fewer bytes than dense
    assert 9 < bd.floor_bytes(LLAMA, t=131072, b=1) / got < 10
    # per head: Hq groups of scores and order instead of Hkv
    ph = bd.floor_bytes(LLAMA, t=131072, b=1, blocks_read=read, metadata="cuboid_mean", groups=32)
    assert ph - got == pytest.approx(24 * (12 * n + 4 * read), abs=1)  # each rounded to whole bytes
    # quant3 reads 4-bit codes of every key besides lo/hi; sketch adds 3 passes over [B, Hq, N] floats
    q3 = bd.floor_bytes(LLAMA, t=131072, b=1, blocks_read=read, metadata="quant3", per_head_passes=3)
    assert q3 - got == 8 * n * 16 * 128 // 2 + 32 * n * 4 * 3
    # more blocks read, more bytes; B requests, B times the bytes
    assert bd.floor_bytes(LLAMA, t=131072, b=1, blocks_read=2 * read, metadata="cuboid_mean") > got
    batch = bd.floor_bytes(LLAMA, t=131072, b=8, blocks_read=read, metadata="cuboid_mean")
    assert batch == pytest.approx(8 * got, abs=8)


def test_floor_rejects_nonsense():
    with pytest.raises(ValueError, match="blocks_read"):
        bd.floor_bytes(LLAMA, t=1024, b=1, blocks_read=65)
    with pytest.raises(ValueError, match="metadata"):
        bd.floor_bytes(LLAMA, t=1024, b=1, blocks_read=3, metadata="minmax")
    with pytest.raises(ValueError, match="ceiling"):
        bd.floor_us(1e6, 0.0)
    assert bd.floor_us(4229e3, 4229.0) == pytest.approx(1.0)


def test_blocks_read_counts_each_kv_heads_union():
    # shared: one group per KV head, its first num_used blocks
    order = np.tile(np.arange(4), (2, 2, 1))
    assert bd.blocks_read_per_kv_head(order, np.array([[1, 4], [2, 0]]), 2) == pytest.approx(1.75)
    # per head: the two query heads of one KV head read {3, 1} and {1, 2}: three distinct blocks
    order = np.array([[[3, 1, 0, 2], [1, 2, 3, 0]]])
    assert bd.blocks_read_per_kv_head(order, np.array([[2, 2]]), 1) == 3.0
    assert bd.blocks_read_per_kv_head(order, np.array([[2, 2]]), 2) == 2.0  # as two KV heads
    with pytest.raises(ValueError):
        bd.blocks_read_per_kv_head(order, np.array([[2, 2]]), 3)


def test_output_names_and_printing():
    assert bd.out_stem("pooled", LLAMA) == "bench_decode"
    assert bd.out_stem("per-head", LLAMA) == "bench_decode_per_head"
    assert bd.out_stem("sparsity", GEMMA) == "bench_decode_sparsity_gemma3"
    assert bd.out_stem("pooled", bd.SHAPES["smollm2"]) == "bench_decode_pooled_smollm2"
    assert bd.out_stem("real", GEMMA, spread=True) == "bench_decode_real_gemma3_spread"
    r = dict(T=32768, B=8, shape="gemma3", profile="sparsity", share=0.05, method="PSA τ=0.95", us=50.0,
             floor_bytes=84_560_000, floor_us=20.0, step_floor=2.5, gbs=1691.2, pct=0.4, speedup=1.86, err=0.0123,
             frac=0.081, ideal=0.049, launches=5, note="stop ema")
    line = bd.format_row(r)
    for part in ("5.0%", "PSA τ=0.95", "50.0 us", "floor    20.0 us", "x 2.50 floor", "x1.86 SDPA", "8.1%"):
        assert part in line, (part, line)
    assert "| gemma3 | 5% | 32K | 8 | PSA τ=0.95 | 50.0 | 20.0 | 2.50 | 1691 | 40% | 1.86× | 8.1% | 4.9% |" in \
        bd.table([r], 4229.0)
    assert "skipped: NotImplementedError" in bd.format_row(dict(T=1, B=1, skipped="x", reason="NotImplementedError"))
    ideal = bd.format_row(dict(T=1, B=1, share=0.02, ideal=0.0196, ideal_p90=0.031, ideal_profile=0.02))
    assert "mean 2.0% of blocks" in ideal and "p90 3.1%" in ideal


def test_report_adds_psa_against_top_k_at_its_error_where_the_run_has_it():
    """bench_decode's closing report: the row table, then (only where top-k ran at a PSA row's error) each such PSA row
    with its ratio to that top-k row."""
    base = dict(T=32768, B=1, shape="llama8b", profile="per-head", share=None, floor_bytes=1, floor_us=10.0,
                step_floor=2.0, gbs=1.0, pct=0.5, speedup=1.0, err=0.001, frac=0.3, ideal=0.1, launches=1, note="")
    psa = dict(base, method="PSA τ=0.95", us=48.0)
    topk = dict(base, method="top-k k=1043 (error ≤ PSA τ=0.95)", us=40.0)
    alone = bd.report([psa], 3000.0)
    assert alone == bd.table([psa], 3000.0) and "PSA ÷ top-k" not in alone
    both = bd.report([psa, topk], 3000.0)
    assert both.startswith(bd.table([psa, topk], 3000.0))
    assert both.splitlines()[-1] == "| 32K | 1 | PSA (shared) | 48.0 | k = 1043 | 40.0 | **1.20** |"


def test_sparsity_fill_uses_each_profile_once():
    """The bench's data path on the CPU: every (layer, request, KV head) gets its own profile, so the mean
    ideal share of the whole cache is the target's."""
    from psa_fast.synthetic import HostCache
    from test_synthetic import head_shares

    shape = bd.Shape("tiny", 4, 2, 64)
    fill = bd.sparsity_fill(shape, 0.1, 2, xp=np)
    cache = HostCache(batch=2, num_kv_heads=2, head_dim=64, max_tokens=4096, num_layers=3)
    qs = [fill(cache, layer) for layer in range(3)]
    assert fill.profile_share == pytest.approx(0.1, rel=0.03)
    got = np.concatenate([head_shares(cache, layer, q).ravel() for layer, q in enumerate(qs)])
    assert got.size == 12 and np.unique(got).size >= 8  # heads differ
    assert got.mean() == pytest.approx(0.1, rel=0.06)
    q_again = fill(cache, 1)  # the sketch row refills a second cache: the same data
    np.testing.assert_array_equal(q_again, qs[1])


def test_data_fill_takes_exactly_one_source():
    """bench_decode.data_fill (profile_decode_step.py's and exp_verify_clock.py's data options): one of captured
    traces, the per-head profile or a drawn share; none or two is a ValueError. The per-head and share fills are
    built without a GPU (their draws happen at the first fill)."""
    shape = bd.Shape("tiny", 4, 2, 64)
    for bad in ({}, dict(per_head=True, share=0.1), dict(kv="x.npz", share=0.1)):
        with pytest.raises(ValueError, match="give one of kv"):
            bd.data_fill(shape, **bad)
    assert callable(bd.data_fill(shape, per_head=True)) and callable(bd.data_fill(shape, share=0.1))
    with pytest.raises(FileNotFoundError):
        bd.data_fill(shape, kv="/nonexistent/trace.npz")


def fake_rows():
    rows = []
    for b, sdpa in ((1, 40.0), (8, 300.0)):
        for frac in (0.03, 0.3, 0.1):
            rows.append(dict(T=32768, B=b, shape="llama8b", profile="sparsity", share=frac, method="PSA τ=0.95",
                             us=sdpa * frac * 3, speedup=1 / (frac * 3), step_floor=2.0, frac=frac, err=0.01))
            topk = f"top-k k={int(frac * 3000)} (error ≤ PSA τ=0.95)"
            rows.append(dict(T=32768, B=b, shape="llama8b", method=topk,
                             us=sdpa * frac * 4, speedup=1 / (frac * 4), frac=1.5 * frac, err=0.01))
            rows.append(dict(T=32768, B=b, shape="llama8b", method="psa_fast dense", us=sdpa * 1.2,
                             speedup=1 / 1.2, frac=1.0, err=0.0))
            rows.append(dict(T=32768, B=b, shape="llama8b", method="torch SDPA", us=sdpa, speedup=1.0, frac=1.0))
        rows.append(dict(T=32768, B=b, breakdown_us={"query": 3.0}))
        rows.append(dict(T=32768, B=b, skipped="PSA τ=0.95 sketch (quant3)", reason="NotImplementedError: D"))
        rows.append(dict(T=32768, B=b, ideal=0.05, ideal_p90=0.08))
    return rows


def test_plot_speedup_against_blocks_read(tmp_path):
    src, dst = tmp_path / "rows.jsonl", tmp_path / "vs_blocks.png"
    src.write_text("".join(json.dumps(r) + "\n" for r in fake_rows()))
    lines = plot_decode.plot_vs_blocks(str(src), str(dst))
    assert dst.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and dst.stat().st_size > 10_000
    psa = lines[32768, 1, "PSA τ=0.95"]
    assert [x for x, _ in psa] == [0.03, 0.1, 0.3]  # sorted by share read, one point per share
    assert psa[0][1] == pytest.approx(1 / 0.09)
    assert lines[32768, 8, "PSA τ=0.95 at its floor"][0][1] == pytest.approx(2 / 0.09)
    assert len(lines[32768, 8, "top-k (error ≤ PSA τ=0.95)"]) == 3
    assert (32768, 1, "torch SDPA") not in lines
    plot_decode.main(str(src), str(tmp_path / "bars.png"))  # the bar chart reads the same rows
    assert (tmp_path / "bars.png").stat().st_size > 10_000
    with pytest.raises(ValueError, match="no rows"):
        plot_decode.plot_vs_blocks(str(src), str(dst), batches=(32,))


def test_plot_dense_against_sdpa_by_batch(tmp_path):
    """plot_decode --dense: exp_dense_tune.py rows of the plan's own launch shape only (a forced split count is not
    the library's dense step), one line per (shape, T) sorted by batch, SDPA µs over dense µs; the first row of a
    repeated (shape, T, B) kept."""
    rows = [dict(shape="smollm2", T=32768, B=2, warps=8, stages=3, splits=None, us=25.0, sdpa_us=22.5),
            dict(shape="smollm2", T=32768, B=1, warps=8, stages=3, splits=None, us=16.0, sdpa_us=15.2),
            dict(shape="smollm2", T=32768, B=1, warps=8, stages=3, splits=4, us=30.0, sdpa_us=15.2),
            dict(shape="smollm2", T=32768, B=2, warps=8, stages=3, splits=None, us=50.0, sdpa_us=22.5),
            dict(shape="llama8b", T=131072, B=8, warps=8, stages=3, splits=None, us=1342.0, sdpa_us=1338.9)]
    src, dst = tmp_path / "dense.jsonl", tmp_path / "dense.png"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    lines = plot_decode.plot_dense(str(src), str(dst))
    assert list(lines) == [("llama8b", 131072), ("smollm2", 32768)]
    assert lines["smollm2", 32768] == [(1, pytest.approx(0.95)), (2, pytest.approx(0.9))]
    assert dst.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and dst.stat().st_size > 10_000
    src.write_text(json.dumps(rows[2]) + "\n")
    with pytest.raises(ValueError, match="splits None"):
        plot_decode.plot_dense(str(src), str(dst))


def test_one_legend_lists_every_panels_lines_once():
    left = (["h1", "h32"], ["PSA, B=1", "PSA, B=32"])  # B = 32 drawn at 32K only
    right = (["h1b", "h8"], ["PSA, B=1", "PSA, B=8"])
    handles, labels = plot_decode.merged_legend([left, right])
    assert labels == ["PSA, B=1", "PSA, B=32", "PSA, B=8"] and handles == ["h1", "h32", "h8"]



def test_plot_step_reads_exp_steps_tables_and_draws_them(tmp_path):
    text = """# a comment
| T | B | mode | step | µs | vs dense | blocks read | iterations (mean / max) | rel. error |
|---|---|---|---|---|---|---|---|---|
| 32768 | 1 | dense | - | 44.2 | 1.00x | 100% | - | 0 |
| 32768 | 1 | loop | 64 | 53.0 | 0.84x | 14.1% | 4.5 / 6 | 0.0003 |

| T | B | mode | cluster | step | µs | vs dense | blocks read | iterations (mean / max) | rel. error |
|---|---|---|---|---|---|---|---|---|---|
| 32768 | 1 | loop | 8 | 384 (auto) | 37.5 | 1.19x | 18.8% | 1.0 / 1 | 0.0001 |
| 32768 | 1 | loop | 16 | 256 | failed: RuntimeError: no |
| 131072 | 8 | first | 2 | 512 | 421.0 | 2.28x | 15.3% | 2.9 / 4 | 0.0002 |
"""
    rows = plot_step.parse(text)
    assert [(r["T"], r["B"], r["mode"], r["cluster"], r["step"], r["auto"], r["us"]) for r in rows] == [
        (32768, 1, "dense", None, None, False, 44.2), (32768, 1, "loop", None, 64, False, 53.0),
        (32768, 1, "loop", 8, 384, True, 37.5), (131072, 8, "first", 2, 512, False, 421.0)]
    out = tmp_path / "step.png"
    plot_step.plot(rows, str(out))
    assert out.stat().st_size > 10_000
    with pytest.raises(ValueError, match="no rows"):
        plot_step.plot([], str(tmp_path / "none.png"))


def test_margin_coverage_by_hand_and_monotone():
    import exp_margin

    # one group: 100 blocks, 2 forced, 30 ranked attended (the stop chunk ends at 2 + 32 = 34), 20 predicted
    assert exp_margin.coverage([100], [2], [30], [20], 1.0, 16) == (1.0, 50 / 32)  # spec 38: chunks to 50 read
    assert exp_margin.coverage([100], [2], [30], [20], 0.5, 16)[0] == 0.0                     # spec 28 < 34
    rng = np.random.default_rng(0)
    n = rng.integers(50, 500, 200)
    f = np.full(200, 2)
    a = rng.integers(1, 40, 200)
    p = rng.integers(1, 40, 200)
    got = [exp_margin.coverage(n, f, a, p, m, 16) for m in (0.5, 1, 1.5, 2, 4)]
    assert all(x[0] <= y[0] and x[1] <= y[1] for x, y in zip(got, got[1:]))  # more margin: more covered, more read
    assert all(r >= 1.0 for _, r in got)


def test_kv_reads_counts_shared_per_head_and_union_blocks():
    """benchmarks/exp_long_rule_search.kv_reads on one hand-made query: two query heads on one KV head whose
    mass sits at opposite ends of 4 blocks; the oracle rule at tau 0.9 stops each head after its 2 heaviest
    blocks (per head: half the blocks each, all four in the union and in the sum), while the shared order needs
    every block before both heads hold 0.9."""
    import exp_long_rule_search as lrs

    mass = np.array([[0.7, 0.05], [0.2, 0.05], [0.05, 0.2], [0.05, 0.7]])
    zeros = np.zeros((4, 2))
    arrays = {"mass": mass, "lengths": np.full(4, 16), "ideal": np.array([2, 2]), "bmax": zeros,
              "est/quant3": np.log(mass / 16)}
    arrays["order/quant3/per_head/0+0"] = np.array([[0, 3], [1, 2], [2, 1], [3, 0]], dtype=np.int16)
    arrays["order/quant3/shared/0+0"] = np.array([[0, 0], [3, 3], [1, 1], [2, 2]], dtype=np.int16)
    for gqa in ("per_head", "shared"):
        arrays[f"err/quant3/{gqa}/0+0"] = zeros.astype(np.float32)
    (row,) = lrs.kv_reads([("held-out", "xml", "case", arrays)], "quant3", "oracle", 0.9, forced=0)
    assert row["shared"] == 1.0
    assert row["per_head_mean"] == 0.5 and row["per_head_sum"] == 1.0 and row["per_head_union"] == 1.0
    assert row["ideal_per_head_mean"] == 0.5 and row["ideal_union"] == 1.0
    mass[:, 1] = mass[:, 0]  # both heads alike: the union is one head's blocks
    arrays["order/quant3/per_head/0+0"][:, 1] = [0, 1, 2, 3]
    (row,) = lrs.kv_reads([("held-out", "xml", "case", arrays)], "quant3", "oracle", 0.9, forced=0)
    assert row["per_head_union"] == 0.5 and row["per_head_sum"] == 1.0 and row["ideal_union"] == 0.5


class _RecordingCache:
    """What ``real_fill`` uses of a ``PagedKVCache``: its dimensions and ``prefill``, recorded in NumPy."""

    def __init__(self, batch, max_tokens, block_size=16):
        self.batch, self.num_kv_heads, self.block_size = batch, 1, block_size
        self.capacity = -(-max_tokens // block_size) * block_size
        self.written = {}

    def prefill(self, layer, request, keys, values):
        self.written[layer, request] = (keys, values)


def test_real_fill_replays_the_traces_decode_steps():
    """--profile real on the shipped Gemma 3 trace (layer 17): every request holds keys and values 0..T-1 and the
    query captured at position T - 1, exactly one decode step of the model; requests cycle over the traces given
    (here the trace and a copy cut to 4K, which has no query at 8191: refused, as a trace of another shape)."""
    from psa_ref.trace import load_trace

    trace = load_trace("gemma3_8k")
    fill = bd.real_fill(GEMMA, [trace], xp=np)
    cache = _RecordingCache(batch=3, max_tokens=8192)
    q = fill(cache, 1)
    j = int(np.flatnonzero(trace.positions == 8191)[0])
    for r in range(3):
        k, v = cache.written[1, r]
        assert k.shape == v.shape == (1, 8192, 256) and k.dtype == np.float16
        np.testing.assert_array_equal(k, trace.k[0])
        np.testing.assert_array_equal(v, trace.v[0])
        np.testing.assert_array_equal(q[r], trace.q[0, j])
    short = trace.select(positions=np.flatnonzero(trace.positions < 4096))
    np.testing.assert_array_equal(bd.real_fill(GEMMA, [trace, short], xp=np)(_RecordingCache(1, 4096), 0)[0],
                                  trace.q[0, int(np.flatnonzero(trace.positions == 4095)[0])])
    with pytest.raises(ValueError, match="no query at position 8191"):
        bd.real_fill(GEMMA, [trace, short], xp=np)(_RecordingCache(batch=2, max_tokens=8192), 0)
    with pytest.raises(ValueError, match="Hq 4, Hkv 1, D 256"):
        bd.real_fill(LLAMA, [trace], xp=np)


def test_real_fill_spread_replays_a_different_step_per_request():
    """spread=True: request r replays the trace's r-th latest captured step (keys and values up to its position),
    so the batch holds different decode steps; request 0 is the plain replay's."""
    from psa_ref.trace import load_trace

    trace = load_trace("gemma3_8k")
    cache = _RecordingCache(batch=3, max_tokens=8192)
    q = bd.real_fill(GEMMA, [trace], xp=np, spread=True)(cache, 0)
    latest = np.argsort(-np.asarray(trace.positions), kind="stable")
    assert trace.positions[latest[0]] == 8191
    for r in range(3):
        p = int(trace.positions[latest[r]])
        k, v = cache.written[0, r]
        assert k.shape == v.shape == (1, p + 1, 256)
        np.testing.assert_array_equal(k, trace.k[0, :, : p + 1])
        np.testing.assert_array_equal(q[r], trace.q[0, latest[r]])
    assert len({int(trace.positions[latest[r]]) for r in range(3)}) == 3


def test_real_profile_needs_its_trace(capsys):
    assert bd.parse_args(["--profile", "real", "--kv", "x.npz", "--shape", "gemma3"]).kv == "x.npz"
    assert bd.parse_args(["--profile", "real", "--kv", "x.npz", "--spread"]).spread
    assert not bd.parse_args(["--profile", "real", "--kv", "x.npz"]).spread
    for argv in (["--profile", "real"], ["--kv", "x.npz"], ["--spread"]):
        with pytest.raises(SystemExit):
            bd.parse_args(argv)
    assert "--spread replays captured decode steps" in capsys.readouterr().err


def test_slice_trace_cuts_layers_and_last_queries(tmp_path, capsys):
    import slice_trace

    from psa_ref.trace import load_trace

    slice_trace.main(["gemma3_8k", str(tmp_path / "cut.npz"), "--layers", "17", "--last", "4"])
    cut, full = load_trace(tmp_path / "cut.npz"), load_trace("gemma3_8k")
    assert cut.layers.tolist() == [17] and cut.positions.tolist() == full.positions[-4:].tolist()
    assert cut.k.shape[2] == full.positions[-1] + 1 and "4 queries" in capsys.readouterr().out
    for argv in (["--layers", "5"], ["--last", "0"]):
        with pytest.raises(SystemExit):
            slice_trace.main(["gemma3_8k", str(tmp_path / "bad.npz"), *argv])


def test_long_rule_search_share_order_is_the_librarys():
    """exp_long_rule_search caches the share-ranked shared order that psa_ref.attention(rank="share") processes
    (its numbers in docs/accuracy.md stand for the library's option): same forced blocks, same ranked order."""
    import exp_long_rule_search as lrs

    import psa_ref
    from psa_ref.scoring import forced_blocks, group_rank_key, processing_order

    rng = np.random.default_rng(4)
    t, d = 16 * 23 + 5, 16
    keys, values = rng.normal(size=(t, d)), rng.normal(size=(t, d))
    q = rng.normal(size=(4, d)) * np.array([[3.0], [0.5], [1.0], [2.0]])
    arrays = lrs.build_case(q, keys, values, 0.25)
    blocks = psa_ref.KVBlocks.from_dense(keys[None], values[None], block_size=16, metadata="quant3", kv_layout="HND")
    est = psa_ref.estimate(q, blocks, 0.25)
    want = processing_order(group_rank_key(est, blocks.block_lengths, "share"), forced_blocks(blocks.num_blocks, 1, 1))
    np.testing.assert_array_equal(arrays["order/quant3/share/1+1"][:, 0], want)
    assert not np.array_equal(arrays["order/quant3/share/1+1"], arrays["order/quant3/shared/1+1"])


# --- profile_decode_step.py: its variants and its per-kernel table -------------------------------------

def test_profile_decode_step_variants():
    import profile_decode_step as pds

    assert pds.parse_variants("dense, default:s1.0,ema,default:s2,topk,share,share+first") == [
        ("dense", None), ("default", 1.0), ("ema", None), ("default", 2.0), ("topk", None), ("share", None),
        ("share+first", None)]
    assert "share+first" in pds.QUANT3_VARIANTS and "default+first" in pds.QUANT3_VARIANTS
    assert pds.parse_variants("ema+first:s1.0") == [("ema+first", 1.0)]  # ema's rule on cuboid_mean, not quant3
    assert "ema+first" not in pds.QUANT3_VARIANTS
    assert pds.parse_variants("ema+stop") == [("ema+stop", None)] and "ema+stop" not in pds.QUANT3_VARIANTS
    # speculate="first_chunk": only where a variant has a first ranked chunk
    assert pds.parse_variants("ema+stop:sfirst,default+first:sfirst") == [("ema+stop", "first_chunk"),
                                                                         ("default+first", "first_chunk")]
    for bad, says in (("loop", "not dense"), ("default:2.0", "sM"), ("dense:s1", "not dense"), ("topk:s1", "topk"),
                      (" , ", "no variant"), ("ema:sfirst", "only the"), ("default:sfirsts", "sM")):
        with pytest.raises(ValueError, match=says):
            pds.parse_variants(bad)


def test_profile_decode_step_kernel_table_sums_per_step():
    import profile_decode_step as pds

    class Event:
        def __init__(self, name, us):
            self.name, self.device_time = name, us

    events = [Event("psa_estimate", 10.0), Event("psa_decode", 30.0), Event("psa_estimate", 14.0),
              Event("psa_decode", 26.0), Event("psa_merge", 4.0), Event("psa_merge", 6.0), Event("psa_merge", 8.0)]
    rows = pds.kernel_table(events, steps=2)
    assert [r["kernel"] for r in rows] == ["psa_decode", "psa_estimate", "psa_merge"]
    dec, est, merge = rows
    assert dec["us_per_step"] == 28.0 and dec["us_per_launch"] == 28.0 and dec["per_step"] == 1.0
    assert merge["per_step"] == 1.5 and merge["us_per_launch"] == 6.0 and merge["us_per_step"] == 9.0
    assert abs(sum(r["share"] for r in rows) - 1.0) < 1e-12 and est["share"] == 12.0 / 49.0


def test_profile_decode_step_rejects_no_layers(monkeypatch, capsys):
    import profile_decode_step as pds

    monkeypatch.setattr("sys.argv", ["profile_decode_step.py", "--share", "0.05", "--layers", "0"])
    with pytest.raises(SystemExit) as exc:
        pds.main()
    assert exc.value.code == 2 and "--layers must be >= 1, got 0" in capsys.readouterr().err


@pytest.mark.parametrize("flag,value,message", [("--warps", "0", "--warps must be >= 1, got 0"),
                                                ("--stages", "1", "--stages must be >= 2 (a prefetch ring), got 1")])
def test_profile_decode_step_rejects_a_launch_shape_that_cannot_run(monkeypatch, capsys, flag, value, message):
    import profile_decode_step as pds

    monkeypatch.setattr("sys.argv", ["profile_decode_step.py", "--share", "0.05", flag, value])
    with pytest.raises(SystemExit) as exc:
        pds.main()
    assert exc.value.code == 2 and message in capsys.readouterr().err


def test_exp_step_spread_needs_captured_kv(monkeypatch, capsys):
    import exp_step

    monkeypatch.setattr("sys.argv", ["exp_step.py", "--spread", "--stop", "auto"])
    with pytest.raises(SystemExit) as exc:
        exp_step.main()
    assert exc.value.code == 2 and "--spread replays captured decode steps: it needs --kv" in capsys.readouterr().err


# --- exp_kernel_defines.py: extra defines on one kernel file's builds --------------------------------

def test_kernel_defines_reach_one_file_only_and_yield_to_the_caller():
    import exp_kernel_defines as ekd

    assert ekd.parse_defines(["trans=0", "EST_V=4", "x=-1"]) == {"trans": 0, "est_v": 4, "x": -1}
    for bad in ("trans", "trans=", "=1", "trans=a"):
        with pytest.raises(SystemExit, match="NAME=integer"):
            ekd.parse_defines([bad])
    calls = []
    kernel = ekd.with_defines(lambda file, **options: calls.append((file, options)), "decode", {"trans": 0, "split": 7})
    kernel("decode", d=64, split=1)
    kernel("sketch", d=64)
    assert calls == [("decode", {"trans": 0, "split": 1, "d": 64}), ("sketch", {"d": 64})]


def test_kernel_defines_runs_the_script_with_its_arguments(tmp_path):
    script = tmp_path / "probe.py"
    script.write_text("import sys\nfrom psa_fast import _kernels\n"
                      "print('ARGS', sys.argv[1:], _kernels.kernel.__qualname__)\n")
    run = subprocess.run([sys.executable, str(BENCH / "exp_kernel_defines.py"), "decode", "trans=0", "--", str(script),
                          "--flag", "1"], capture_output=True, text=True, cwd=BENCH.parent, check=True)
    assert "ARGS ['--flag', '1'] with_defines.<locals>.kernel" in run.stdout
    bad = subprocess.run([sys.executable, str(BENCH / "exp_kernel_defines.py"), "decode", "trans=0"],
                         capture_output=True, text=True, cwd=BENCH.parent)
    assert bad.returncode != 0 and "exp_kernel_defines.py decode" in bad.stderr


# --- exp_kernel_source.py: one kernel file swapped for another version ----------------------------------

def test_kernel_source_swaps_one_file_and_keeps_the_headers(tmp_path):
    old = tmp_path / "decode_old.cu"
    old.write_text('// MARKER of the old version\n#include "common.cuh"\nextern "C" __global__ void psa_decode() {}\n')
    script = tmp_path / "probe.py"
    script.write_text("import sys\nfrom psa_fast import _kernels\nd = _kernels._source('decode.cu')\n"
                      "print('ARGS', sys.argv[1:], 'MARKER' in d, 'include \"common' in d, 'PSA_INF' in d,\n"
                      "      'MARKER' in _kernels._source('order.cu'))\n")
    run = subprocess.run([sys.executable, str(BENCH / "exp_kernel_source.py"), "decode", str(old), "--", str(script),
                          "--flag", "1"], capture_output=True, text=True, cwd=BENCH.parent, check=True)
    assert "ARGS ['--flag', '1'] True False True False" in run.stdout  # swapped, its header inlined, others not
    older = tmp_path / "order_old.cu"
    older.write_text('// OLDER\nextern "C" __global__ void psa_order() {}\n')
    script.write_text("from psa_fast import _kernels\n"
                      "print('BOTH', 'MARKER' in _kernels._source('decode.cu'),\n"
                      "      'OLDER' in _kernels._source('order.cu'))\n")
    run = subprocess.run([sys.executable, str(BENCH / "exp_kernel_source.py"), "decode,order", f"{old},{older}", "--",
                          str(script)], capture_output=True, text=True, cwd=BENCH.parent, check=True)
    assert "BOTH True True" in run.stdout  # two files swapped at once
    for argv in (["decode", str(old)], ["decode", str(tmp_path / "missing.cu"), "--", str(script)],
                 ["decode,order", str(old), "--", str(script)]):
        bad = subprocess.run([sys.executable, str(BENCH / "exp_kernel_source.py"), *argv], capture_output=True,
                             text=True, cwd=BENCH.parent)
        assert bad.returncode != 0 and any(m in bad.stderr for m in ("exp_kernel_source.py decode", "no such",
                                                                     "as many kernel files"))


def test_kernel_sets_the_preferred_carveout_only_when_asked(monkeypatch):
    """_kernels.kernel leaves a build's preferred shared-memory carve-out to the driver by default
    (PREFERRED_CARVEOUT -2) and sets it on every build where the probe asks (-1: the driver's default, set
    explicitly; 0-100 percent), each time a build is fetched, so one process can A/B it (exp_kernels_attr.py)."""
    import types

    from psa_fast import _kernels

    class Stub:  # cupy.RawKernel without a GPU: records the attribute's settings
        def __init__(self, code, name, options=(), **kw):
            self.name, self.settings = name, []

        def compile(self):
            pass

        def __setattr__(self, key, value):
            if key == "preferred_shared_memory_carveout":
                self.settings.append(value)
            object.__setattr__(self, key, value)

    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(RawKernel=Stub))  # (CI has no CuPy)
    _kernels._build.cache_clear()
    try:
        assert _kernels.PREFERRED_CARVEOUT == -2
        assert _kernels.kernel("estimate_order", d=128, s=16, g=4).settings == []
        for value in (100, -1):  # the same build (compiled once), its carve-out set each time
            monkeypatch.setattr(_kernels, "PREFERRED_CARVEOUT", value)
            fn = _kernels.kernel("estimate_order", d=128, s=16, g=4)
            assert fn.name == "psa_estimate_order"
        assert fn.settings == [100, -1] and _kernels._build.cache_info().misses == 1
    finally:
        _kernels._build.cache_clear()  # (no stub left for later tests)


def test_kernels_attr_runs_the_script_once_per_value_and_restores_the_constant(tmp_path):
    import exp_kernels_attr as eka

    assert eka.parse_assignment("SLICE=1024,16384") == ("SLICE", [1024, 16384])
    share = eka.parse_assignment("STEP_SHARE=0.25,0.5")  # a float constant takes numbers
    assert share == ("STEP_SHARE", [0.25, 0.5]) and all(type(v) is float for v in share[1])
    assert eka.parse_assignment("ESTIMATE_ON_TENSOR_CORES=0,1") == ("ESTIMATE_ON_TENSOR_CORES", [0, 1])  # a flag
    for bad in ("SLICE", "slice=1", "NOT_THERE=1", "SLICE=a", "SLICE=0.5", "STEP_SHARE=x", "GRID_COOPERATIVE_=1"):
        with pytest.raises(SystemExit):
            eka.parse_assignment(bad)
    script = tmp_path / "probe.py"
    script.write_text("import sys\nfrom psa_fast import _kernels\nprint('SEEN', _kernels.SLICE, sys.argv[1:])\n")
    run = subprocess.run([sys.executable, str(BENCH / "exp_kernels_attr.py"), "SLICE=7,9", "--", str(script), "-x"],
                         capture_output=True, text=True, cwd=BENCH.parent, check=True)
    assert run.stdout.splitlines() == ["# _kernels.SLICE = 7", "SEEN 7 ['-x']", "# _kernels.SLICE = 9", "SEEN 9 ['-x']"]
    script.write_text("from psa_fast import _kernels\nprint('SEEN', _kernels.SLICE, _kernels.LOOP_GRID)\n")
    run = subprocess.run([sys.executable, str(BENCH / "exp_kernels_attr.py"), "SLICE=7,9", "LOOP_GRID=0,8", "--",
                          str(script)], capture_output=True, text=True, cwd=BENCH.parent, check=True)
    assert [line for line in run.stdout.splitlines() if line.startswith("SEEN")] == [
        "SEEN 7 0", "SEEN 7 8", "SEEN 9 0", "SEEN 9 8"]  # every combination, the last name fastest
    assert "# _kernels.SLICE = 9; _kernels.LOOP_GRID = 8" in run.stdout
    for bad in (["SLICE=1", "SLICE=2", "--", str(script)], ["--", str(script)], ["SLICE=1", "--"]):
        with pytest.raises(SystemExit):
            eka.main(bad)
    # bench_decode's output files: each run's rows kept (the first run writes a fresh file, the later ones append),
    # each tagged with its values; outside exp_kernels_attr a run overwrites and tags nothing
    out = tmp_path / "rows.jsonl"
    out.write_text("stale\n")
    script.write_text("import json, sys\nfrom bench_decode import run_file, run_tags\n"
                      "with run_file(sys.argv[1]) as f:\n    f.write(json.dumps({**run_tags(), 'x': 1}) + '\\n')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(BENCH), str(BENCH.parent)]))
    subprocess.run([sys.executable, str(BENCH / "exp_kernels_attr.py"), "SLICE=7,9", "--", str(script), str(out)],
                   capture_output=True, text=True, cwd=BENCH.parent, check=True, env=env)
    assert [json.loads(line) for line in out.read_text().splitlines()] == [
        {"kernels_attr": "SLICE = 7", "x": 1}, {"kernels_attr": "SLICE = 9", "x": 1}]
    subprocess.run([sys.executable, str(script), str(out)], capture_output=True, text=True, cwd=BENCH.parent,
                   check=True, env={k: v for k, v in env.items() if not k.startswith("PSA_KERNELS_ATTR")})
    assert [json.loads(line) for line in out.read_text().splitlines()] == [{"x": 1}]


# --- exp_dense_tune.py: the launch shapes it sweeps ----------------------------------------------------

def test_dense_tune_variants_fit_shared_memory_and_default_only_is_the_plans_shape():
    import exp_dense_tune as edt

    from psa_fast import _kernels

    for d, g in ((256, 4), (128, 4), (64, 3)):
        default = _kernels.decode_config(d=d, s=16, g=g, version=3, warps=_kernels.default_warps(d, "dense"))
        # the plan's own shape is left to DecodePlan (so a launch rule an A/B switches on is the one timed)
        assert list(edt.variants(d, 16, g, 16, default_only=True)) == [(None, None, None)]
        assert list(edt.variants(d, 16, g, 16, splits=[3, 1, 3])) == [(None, None, n) for n in (None, 1, 3)]
        swept = list(edt.variants(d, 16, g, 16))
        assert (default[1], default[2], None) in swept and len(swept) == len(set(swept))
        for warps, stages, splits in swept:  # every shape as decode_config fits it, the default splits and 3 others
            assert _kernels.decode_config(d=d, s=16, g=g, version=3, warps=warps, stages=stages)[1:3] == (warps, stages)
            assert splits in (None, 8, 32, 64)


def test_dense_wide_stages_switch_picks_two_stages_only_where_asked(monkeypatch):
    """_kernels.DENSE_WIDE_STAGES (2 by default since the H100 A/B of s65; 0 turns it off): 8-warp dense CTAs at
    D <= 64 with more than DENSE_WIDE_STAGES_MIN_GROUPS and at most DENSE_WIDE_MAX_GROUPS groups take its stages, and
    their smaller shared memory lets pick_splits give about twice the splits (SmolLM2 at B = 3: 14 -> 29, at B = 5:
    8 -> 17, the s61e sweep's shapes); every other plan keeps decode_config's default. No GPU needed: the SM count is
    the H100's."""
    from psa_fast import _kernels

    monkeypatch.setattr(_kernels, "num_sms", lambda: 132)
    monkeypatch.setattr(_kernels, "DENSE_WIDE_MAX_GROUPS", 15)
    assert _kernels.DENSE_WIDE_STAGES == 2  # on by default
    monkeypatch.setattr(_kernels, "DENSE_WIDE_STAGES", 0)
    assert _kernels.default_stages(64, "dense", 8, 9) is None  # off: decode_config's default
    monkeypatch.setattr(_kernels, "DENSE_WIDE_STAGES", 2)
    assert [_kernels.default_stages(64, "dense", 8, n) for n in (7, 9, 12, 15)] == [2, 2, 2, 2]
    for args in ((64, "dense", 8, 6), (64, "dense", 8, 16), (64, "dense", 4, 9), (128, "dense", 8, 9),
                 (64, "topk", 8, 9), (64, "psa", 8, 9), (64, "dense", 8, None)):
        assert _kernels.default_stages(*args) is None, args

    def splits(stages, groups):
        _, warps, got, smem = _kernels.decode_config(d=64, s=16, g=3, version=3, warps=8, stages=stages)
        return got, _kernels.pick_splits(groups, 2048, warps, smem)

    assert splits(None, 9) == (3, 14) and splits(2, 9) == (2, 29)
    assert splits(None, 15) == (3, 8) and splits(2, 15) == (2, 17)


def test_push_fits_beside_the_rings():
    """_kernels.push_fits: the push exchanges' static buffers (each decision's totals by parity and rank; rank 0's
    finish buffers where they fit PUSH_FINISH_BYTES) beside the build's rings within the shared-memory limit. Llama's
    loop build at one request takes them (192 KiB of rings + 17.5 KiB); a one-CTA build never (no cluster); rings that
    leave too little room do not; Gemma 3's D 256 on clusters of 8 needs only the decisions' 1 KiB (its finish
    buffers, 32 KiB, are not pushed)."""
    from psa_fast import _kernels

    _, _, _, rings = _kernels.decode_config(d=128, s=16, g=4, version=3)
    assert rings == 196608 and _kernels.push_fits(cluster=8, g=4, d=128, smem=rings)
    assert not _kernels.push_fits(cluster=1, g=4, d=128, smem=rings)
    room = _kernels.SMEM_LIMIT - _kernels.STATIC_SMEM_RESERVE
    llama = 2 * 8 * 4 * 16 + 8 * 4 * 128 * 4 + 8 * 4 * 8  # decisions, finish outputs, finish (max, mass) pairs
    assert _kernels.push_fits(cluster=8, g=4, d=128, smem=room - llama)
    assert not _kernels.push_fits(cluster=8, g=4, d=128, smem=room - llama + 1)
    assert _kernels.push_fits(cluster=8, g=4, d=256, smem=room - 2 * 8 * 4 * 16)  # decisions only
    assert not _kernels.push_fits(cluster=8, g=4, d=256, smem=room - 2 * 8 * 4 * 16 + 1)


def test_l2_first_blocks_keeps_the_first_chunk_within_the_budget(monkeypatch):
    """_kernels.l2_first_blocks: the positions of each group's order whose K and V tiles psa_order_runs asks into L2,
    the first chunk's blocks but no more than ORDER_L2_FIRST_MIB for all groups together (K and V, a tile each); 0
    with the switch at 0 and past ORDER_L2_FIRST_MAX_GROUPS groups. Llama at one request (8 groups, tiles of 4 KiB):
    32 positions a group at the default 2 MiB, 256 at 16 MiB."""
    from psa_fast import _kernels

    assert (_kernels.ORDER_L2_FIRST_MIB, _kernels.ORDER_L2_FIRST_MAX_GROUPS) == (2, 32)
    assert _kernels.l2_first_blocks(8, 400, 4096) == 32
    monkeypatch.setattr(_kernels, "ORDER_L2_FIRST_MIB", 0)
    assert _kernels.l2_first_blocks(8, 400, 4096) == 0
    monkeypatch.setattr(_kernels, "ORDER_L2_FIRST_MIB", 16)
    assert _kernels.l2_first_blocks(8, 400, 4096) == 256 and _kernels.l2_first_blocks(8, 100, 4096) == 100
    assert _kernels.l2_first_blocks(32, 400, 4096) == 64  # four requests share the budget
    assert _kernels.l2_first_blocks(33, 400, 4096) == 0  # past the groups where it paid
    assert _kernels.l2_first_blocks(8, 0, 4096) == 0
    cap = _kernels.l2_first_blocks(3, 10**6, 2048)
    assert cap * 3 * 2 * 2048 <= 16 * 2**20 < (cap + 1) * 3 * 2 * 2048


def test_estimated_stop_cluster_only_where_it_paid(monkeypatch):
    """_kernels.estimated_stop_cluster: v6's clusters (ESTIMATED_STOP_CLUSTER CTAs a group) only where every group's
    cluster fits the SMs and the groups are long (ESTIMATED_STOP_CLUSTER_MIN_BLOCKS), where the H100 measured them
    faster; v2 (1) elsewhere and when the switch is 1. No GPU needed: the SM count is the H100's."""
    from psa_fast import _kernels

    monkeypatch.setattr(_kernels, "num_sms", lambda: 132)
    assert _kernels.ESTIMATED_STOP_CLUSTER == 8 and _kernels.ESTIMATED_STOP_CLUSTER_MIN_BLOCKS == 4096
    # Llama 128K: one request (8 groups) and two (16) take clusters, B = 3 (24 groups: 192 CTAs) and B = 8 do not;
    # Gemma 3's one group at 128K does; 32K (2,048 blocks) never
    assert [_kernels.estimated_stop_cluster(n, 8192) for n in (1, 8, 16, 17, 24, 64)] == [8, 8, 8, 1, 1, 1]
    assert [_kernels.estimated_stop_cluster(n, 2048) for n in (1, 8)] == [1, 1]
    assert _kernels.estimated_stop_cluster(8, 4096) == 8 and _kernels.estimated_stop_cluster(8, 4095) == 1
    monkeypatch.setattr(_kernels, "ESTIMATED_STOP_CLUSTER", 1)
    assert _kernels.estimated_stop_cluster(8, 8192) == 1
    for bad in ((0, 8192), (8, 0)):
        with pytest.raises(ValueError, match="groups and blocks"):
            _kernels.estimated_stop_cluster(*bad)


def test_exp_estimated_stop_time_checks_its_versions():
    """benchmarks/exp_estimated_stop_time.py: --cluster takes 1, 2, 4, 8; anything else is refused with the option's
    name (parse_choices also takes 0 where it is allowed, which bench_decode's parse_ints would refuse)."""
    import exp_estimated_stop_time as es

    assert es.parse_choices("1, 8", "--cluster", (1, 2, 4, 8)) == [1, 8]
    assert es.parse_choices("0,1", "--flag", (0, 1)) == [0, 1]
    for text, name, allowed in (("3", "--cluster", (1, 2, 4, 8)), ("", "--cluster", (1, 2, 4, 8)),
                                ("0,v6", "--flag", (0, 1)), ("2", "--flag", (0, 1))):
        with pytest.raises(ValueError, match=name):
            es.parse_choices(text, name, allowed)


def test_estimated_stop_launch_follows_the_longest_request(monkeypatch):
    """_kernels.estimated_stop_chunk launches v6 (a cluster of 8 CTAs of 256 a group) or v2 (one CTA of 512) by the
    longest request's blocks the host gives (``blocks``), the table's ``nmax`` when it gives none; a short request in a
    long table keeps v2, whose fixed cost is ~3 µs lower (H100 s65). No GPU: the kernel is a recorder."""
    from psa_fast import _kernels

    monkeypatch.setattr(_kernels, "num_sms", lambda: 132)
    launches = []

    def fake_kernel(name, **opts):
        assert name == "estimated_stop"
        return lambda grid, block, args: launches.append((grid, block, opts.get("cluster", 1)))

    monkeypatch.setattr(_kernels, "kernel", fake_kernel)
    first_len = np.zeros((1, 8), np.int32)  # one request of 8 groups
    common = dict(s=16, g=4, hq=32, nmax=8192, forced=3, threshold=0.95, stop="ema", margin=1.25)
    for blocks, want in ((None, ((64, 1), (256,), 8)), (8192, ((64, 1), (256,), 8)), (4096, ((64, 1), (256,), 8)),
                         (2048, ((8, 1), (512,), 1)), (1, ((8, 1), (512,), 1))):
        launches.clear()
        _kernels.estimated_stop_chunk(None, None, None, first_len, blocks=blocks, **common)
        assert launches == [want], blocks


def test_default_launch_shape_of_the_split_build(monkeypatch):
    """Dense and top-k at D <= 64 take CTAs of 4 warps and count several an SM; D 128 and 256 one (the sweep's
    best shapes, benchmarks/NOTES.md). No GPU needed: the SM count is the H200's."""
    from psa_fast import _kernels

    monkeypatch.setattr(_kernels, "num_sms", lambda: 132)
    assert [_kernels.default_warps(d, mode) for d, mode in ((64, "dense"), (64, "topk"), (64, "psa"), (128, "dense"))] \
        == [4, 4, 8, 8]

    def splits(d, g, groups, positions=2048):
        _, warps, _, smem = _kernels.decode_config(d=d, s=16, g=g, version=3, warps=_kernels.default_warps(d, "dense"))
        return _kernels.pick_splits(groups, positions, warps, smem)

    assert splits(64, 3, 96) == 4  # SmolLM2 at B = 32: three CTAs an SM, 396 slots over 96 groups
    assert splits(64, 3, 24) == 16
    assert splits(128, 4, 8) == 16 and splits(128, 4, 256) == 1  # Llama-3.1-8B at B = 1 and 32: one CTA an SM
    assert splits(256, 4, 1) == 132 and splits(256, 4, 32) == 4  # Gemma 3
    assert splits(256, 4, 1, positions=512) == 64  # at least two positions per warp (Gemma at 8K)
    assert _kernels.pick_splits(1000, 2048, 8, 1) == 1


def test_splits_within_one_wave(monkeypatch):
    """SPLITS_WITHIN_WAVE: the splits of a batch whose groups do not divide the wave are rounded down, so its CTAs fit
    one wave (Llama B = 3: 24 groups x 5 = 120 CTAs of one an SM, not 6 = 144; Gemma 3 B = 7: 18 x 7, not 19 x 7 =
    133); where the wave divides evenly (B = 1, 8, 32) nothing changes; off, the nearest count as before."""
    from psa_fast import _kernels

    monkeypatch.setattr(_kernels, "num_sms", lambda: 132)

    def splits(d, g, groups):
        _, warps, _, smem = _kernels.decode_config(d=d, s=16, g=g, version=3, warps=_kernels.default_warps(d, "dense"))
        return _kernels.pick_splits(groups, 2048, warps, smem)

    cases = [(128, 4, 24), (256, 4, 7), (64, 3, 21), (128, 4, 8), (128, 4, 64), (256, 4, 1), (256, 4, 8), (64, 3, 24)]
    monkeypatch.setattr(_kernels, "SPLITS_WITHIN_WAVE", 0)
    assert [splits(*c) for c in cases] == [6, 19, 19, 16, 2, 132, 16, 16]
    monkeypatch.setattr(_kernels, "SPLITS_WITHIN_WAVE", 1)
    assert [splits(*c) for c in cases] == [5, 18, 18, 16, 2, 132, 16, 16]
    for d, g, groups in cases:
        _, warps, _, smem = _kernels.decode_config(d=d, s=16, g=g, version=3, warps=_kernels.default_warps(d, "dense"))
        per_sm = max(1, min(64 // warps, (2 * _kernels.SMEM_LIMIT // 3) // smem))
        assert groups * splits(d, g, groups) <= per_sm * 132


def test_splits_fill_two_waves_where_one_leaves_sms_idle(monkeypatch):
    """SPLITS_MIN_FILL: where the splits within one wave leave more than a quarter of it idle, CTAs of 8 warps take
    enough splits for two waves (Llama B = 6: 48 groups x 2 = 96 CTAs on 132 -> 6; B = 11: 88 x 1 -> 3; B = 9: 72 x 1
    -> 4); a wave filled to 75% or more keeps its count (B = 3: 120, B = 13: 104, B = 8 and 16: 128), as do 4-warp
    CTAs (Gemma 3 at D 256, B = 45: 90 CTAs, which the two-wave count made slower); 0 turns it off."""
    from psa_fast import _kernels

    monkeypatch.setattr(_kernels, "num_sms", lambda: 132)

    def splits(d, g, groups):
        _, warps, _, smem = _kernels.decode_config(d=d, s=16, g=g, version=3, warps=_kernels.default_warps(d, "dense"))
        return _kernels.pick_splits(groups, 2048, warps, smem)

    llama = [8 * b for b in (3, 6, 8, 9, 11, 13, 16, 17)]
    monkeypatch.setattr(_kernels, "SPLITS_MIN_FILL", 0.75)
    assert [splits(128, 4, n) for n in llama] == [5, 6, 2, 4, 3, 1, 1, 1]
    assert splits(256, 4, 45) == 2
    monkeypatch.setattr(_kernels, "SPLITS_MIN_FILL", 0.0)
    assert [splits(128, 4, n) for n in llama] == [5, 2, 2, 1, 1, 1, 1, 1]


def test_dense_at_small_head_dims_widens_its_ctas_for_few_groups(monkeypatch):
    """DENSE_WIDE_MAX_GROUPS: dense at D <= 64 takes CTAs of 8 warps when B x Hkv is at most the threshold (given),
    4 above it or when the groups are not given; top-k, PSA and larger head dims keep their rule; 0 turns it off."""
    from psa_fast import _kernels

    assert _kernels.DENSE_WIDE_MAX_GROUPS == 15  # SmolLM2 up to B = 5 (s62, H200)
    assert [_kernels.default_warps(64, "dense", g) for g in (3, 15, 16, 96)] == [8, 8, 4, 4]
    monkeypatch.setattr(_kernels, "DENSE_WIDE_MAX_GROUPS", 12)
    assert [_kernels.default_warps(64, "dense", g) for g in (3, 12, 13, 96)] == [8, 8, 4, 4]
    assert _kernels.default_warps(64, "dense") == 4 and _kernels.default_warps(32, "dense", 3) == 8
    assert [_kernels.default_warps(d, m, 3) for d, m in ((64, "topk"), (64, "psa"), (128, "dense"))] == [4, 8, 8]
    monkeypatch.setattr(_kernels, "DENSE_WIDE_MAX_GROUPS", 0)
    assert _kernels.default_warps(64, "dense", 3) == 4


def test_scatter_slots_moves_blocks_and_keeps_every_block_readable():
    """After scattering, each (layer, request, head, block) still reads the same K and V through the table,
    and the table is no longer the identity (so a kernel walking blocks in order no longer streams)."""
    from types import SimpleNamespace

    rng = np.random.default_rng(0)
    table = np.arange(2 * 3 * 1 * 5, dtype=np.int32).reshape(2, 3, 1, 5)
    k, v = rng.normal(size=(30, 4, 8)).astype(np.float16), rng.normal(size=(30, 4, 8)).astype(np.float16)
    cache = SimpleNamespace(k_pool=k.copy(), v_pool=v.copy(), block_table=table.copy())
    bd.scatter_slots(cache, seed=3, xp=np)
    np.testing.assert_array_equal(cache.k_pool[cache.block_table], k[table])
    np.testing.assert_array_equal(cache.v_pool[cache.block_table], v[table])
    assert sorted(cache.block_table.ravel()) == list(range(30)) and (cache.block_table != table).any()


def test_shared_set_bounds_by_hand_and_on_random_heads():
    """exp_shared_set: one head whose 4 blocks hold 70/20/6/4% of the mass needs 3 blocks for tau 0.95 (any measure
    agrees); on random heads the largest head's ideal bounds the greedy shared set from below, and a set holding
    tau of every head is never smaller than it."""
    import exp_shared_set as ess

    s = 4
    keys = np.zeros((4 * s, 2))
    keys[:, 0] = np.log(np.repeat([0.70, 0.20, 0.06, 0.04], s))  # q = (1, 0), scale 1: token logits = log mass
    got = ess.shared_sets(np.array([[1.0, 0.0]]), keys, 1.0, block_size=s, tau=0.95)
    assert got == {"blocks": 4, "mean_head": 3.0, "max_head": 3, "union": 3, "greedy": 3}
    rng = np.random.default_rng(0)
    for _ in range(20):
        q, k = rng.normal(size=(4, 16)) * 2, rng.normal(size=(300, 16))
        got = ess.shared_sets(q, k, 0.25, block_size=16, tau=0.9)
        assert got["mean_head"] <= got["max_head"] <= got["greedy"] <= got["blocks"]
        assert got["max_head"] <= got["union"] <= got["blocks"] == 19


def test_spec_coverage_counts_the_loops_blocks_and_the_speculated_prefix():
    """exp_spec_coverage on the shipped 8K trace (two queries): the loop's blocks are the reference's, and the
    speculated prefix grows with the margin and the extra blocks, at most every block."""
    import exp_spec_coverage as esc
    import psa_ref
    from psa_ref.trace import load_trace

    trace = load_trace("gemma3_8k")
    schedules = [(1.0, 16), (1.0, 64), (2.0, 16), (100.0, 16)]
    rows = esc.coverage(trace, 0, [126, 127], threshold=0.95, step=16, schedules=schedules, sink=1, recent=1)
    assert len(rows) == 2
    blocks = psa_ref.KVBlocks.from_dense(trace.k[0].astype(np.float32), trace.v[0].astype(np.float32),
                                         metadata="quant3")
    for (used, spec, n), j in zip(rows, [126, 127]):
        res = psa_ref.attention(trace.q[0, j].astype(np.float64), blocks, 0.95, scale=trace.scale, step=16,
                                sink_blocks=1, recent_blocks=1)
        assert used == [len(res.blocks_used[0])] and n == 512
        assert spec[(1.0, 16)][0] <= spec[(1.0, 64)][0] <= spec[(100.0, 16)][0] == n
        assert spec[(1.0, 16)][0] <= spec[(2.0, 16)][0] <= n
def test_speculative_attend_takes_one_warp_ctas_from_four_speculated_chunks_an_sm(monkeypatch):
    from psa_fast import _kernels

    monkeypatch.setattr(_kernels, "num_sms", lambda: 132)
    assert _kernels.spec_one_warp_from() == 4 * 132  # chunks counted on the GPU by psa_spec_len
    assert _kernels.spec_shapes(4 * 132, 8) == (8, 1)  # both builds launched; the count picks one on the GPU
    assert _kernels.spec_shapes(4 * 132 - 1, 8) == (8,)  # the count cannot reach the line: one build
    assert _kernels.spec_shapes(10**6, 1) == (1,)
    monkeypatch.setattr(_kernels, "SPEC_ONE_WARP_WAVES", 0)
    assert _kernels.spec_shapes(1, 8) == (1,)  # a line at 0 chunks: one warp always


def test_verify_clock_phase_table_converts_cycles_at_the_sm_clock():
    import exp_verify_clock as evc

    from psa_fast import _kernels

    assert _kernels.VERIFY_CLOCK == 0  # the production build has no clock reads
    clocks = np.zeros((2, 1, 8), np.int64)
    clocks[0, 0] = [2000, 100, 400, 600, 200, 700, 3, 70]
    clocks[1, 0] = [4000, 300, 800, 1000, 400, 1500, 5, 130]
    rows = evc.phase_table(clocks, khz=1e6)  # 1 GHz: 1,000 cycles a µs
    assert rows[0] == "| kernel | 3.00 | 4.00 |"
    assert rows[2] == "| gather | 0.60 | 0.80 |"
    assert rows[5] == "| output | 1.10 | 1.50 |"
    assert rows[-1] == "| windows / chunks | 4.0 | 100.0 |"
    with pytest.raises(ValueError, match="no group"):
        evc.phase_table(np.zeros((0, 8)), khz=1e6)


def test_verify_clock_speculate_takes_a_margin_none_or_first_chunk():
    import exp_verify_clock as evc

    def error(message):
        raise ValueError(message)

    assert evc.parse_speculate("first_chunk", error) == "first_chunk"
    assert evc.parse_speculate("1.25", error) == 1.25
    assert evc.parse_speculate("0", error) is None  # the plain loop
    for bad in ("-1", "nan", "first", ""):
        with pytest.raises(ValueError, match="--speculate must be a margin >= 0"):
            evc.parse_speculate(bad, error)


@pytest.mark.parametrize("argv,message", [
    (["--share", "0.05", "--per-head"], "give the data: one of --kv TRACES, --share S or --per-head"),
    (["--per-head", "--speculate", "first_chunk"], "--speculate first_chunk speculates the first ranked chunk"),
    (["--per-head", "--step", "0"], "--step must be a positive integer or auto, got '0'"),
    (["--per-head", "--warps", "0"], "--warps must be >= 1, got 0"),
    (["--per-head", "--stages", "1"], "--stages must be >= 2 (a prefetch ring), got 1"),
    (["--per-head", "--layers", "-1"], "--layers must be >= 0 (0: bench_decode.rotating_layers), got -1")])
def test_verify_clock_rejects_bad_arguments(monkeypatch, capsys, argv, message):
    import exp_verify_clock as evc

    monkeypatch.setattr("sys.argv", ["exp_verify_clock.py", *argv])
    with pytest.raises(SystemExit) as exc:
        evc.main()
    assert exc.value.code == 2 and message in capsys.readouterr().err


def test_eo_clock_table_counts_only_the_ctas_that_placed_blocks():
    """exp_eo_clock.eo_table: each mark's mean and largest µs over the CTAs that placed blocks (flag 1; CTAs past a
    request's runs wrote zeros), and the launch's spread of starts and ends by the global timer."""
    import exp_eo_clock as eoc

    from psa_fast import _kernels

    assert _kernels.EO_CLOCK == 0  # the production builds have no clock reads
    clocks = np.zeros((1, 2, 3, 10), np.int64)
    clocks[0, 0, 0] = [1_000, 9_000, 2000, 3000, 3500, 5000, 6000, 1, 500, 1500]
    clocks[0, 1, 0] = [3_000, 13_000, 4000, 5000, 5500, 7000, 10000, 1, 700, 3500]  # (CTAs 1, 2: no blocks)
    rows = eoc.eo_table(clocks, khz=1e6)  # 1 GHz: 1,000 cycles a µs
    assert rows[0] == "| the request's length read | 0.60 | 0.70 |"
    assert rows[1] == "| warp 0's tiles scored | 2.50 | 3.50 |"
    assert rows[2] == "| scored | 3.00 | 4.00 |"
    assert rows[6] == "| placed (thread 0) | 8.00 | 10.00 |"
    assert rows[7] == "| starts spread (global timer) | 1.00 | 2.00 |"
    assert rows[8] == "| ends after the first start (global timer) | 10.00 | 12.00 |"
    with pytest.raises(ValueError, match="no CTA placed"):
        eoc.eo_table(np.zeros((1, 1, 2, 10), np.int64), khz=1e6)


def test_step_timeline_places_both_kernels_on_the_global_timer():
    """exp_step_timeline.timeline_rows: the fused estimate-order kernel's CTAs (those that placed blocks) and the
    loop's groups (those that ran) on one time axis from the first CTA's start, the gap between the kernels, and the
    step's period left outside them."""
    import exp_step_timeline as est

    eo = np.zeros((1, 2, 3, 10), np.int64)
    eo[0, 0, 0, [0, 1, 7]] = [1_000_000, 1_008_000, 1]
    eo[0, 1, 0, [0, 1, 7]] = [1_000_500, 1_009_000, 1]
    eo[0, 1, 1, [0, 1, 7]] = [900_000, 2_000_000, 0]  # no blocks placed: not counted
    loop = np.zeros((1, 3, 18), np.int64)
    loop[0, 0, [9, 16, 17]] = [1, 1_011_000, 1_027_000]
    loop[0, 1, [9, 16, 17]] = [1, 1_011_200, 1_029_500]
    loop[0, 2, [9, 16, 17]] = [0, 1, 5_000_000]  # left at once: not counted
    rows = est.timeline_rows(eo, loop, step_us=31.0)
    assert rows == ["| psa_estimate_order: first CTA start | 0.00 |",
                    "| psa_estimate_order: last CTA start | 0.50 |",
                    "| psa_estimate_order: last CTA end | 9.00 |",
                    "| psa_decode: first group start | 11.00 |",
                    "| psa_decode: last group start | 11.20 |",
                    "| psa_decode: first group end | 27.00 |",
                    "| psa_decode: last group end | 29.50 |",
                    "| gap: psa_estimate_order's last end to psa_decode's first start | 2.00 |",
                    "| step (graph, µs a call) | 31.00 |",
                    "| step outside the two kernels' first start .. last end | 1.50 |"]
    with pytest.raises(ValueError, match="18 words"):
        est.timeline_rows(eo, loop[..., :16], step_us=31.0)
    with pytest.raises(ValueError, match="nothing to time"):
        est.timeline_rows(eo, np.zeros((1, 1, 18)), step_us=31.0)
    # one kernel alone (--only): its span and the rest of the period, from either clock's words
    assert est.alone_rows(eo, 10, step_us=10.0) == ["| CTAs' span (first start .. last end) | 9.00 |",
                                                    "| period (graph, µs a call) | 10.00 |",
                                                    "| outside the span (the kernel's boundary with itself) | 1.00 |"]
    assert est.alone_rows(loop, 18, step_us=20.0)[0] == "| CTAs' span (first start .. last end) | 18.50 |"
    with pytest.raises(ValueError, match="nothing to time"):
        est.alone_rows(np.zeros((2, 18)), 18, step_us=1.0)


def test_loop_clock_table_counts_only_the_groups_that_ran():
    import exp_verify_clock as evc

    from psa_fast import _kernels

    assert _kernels.LOOP_CLOCK == 0  # the production builds have no clock reads
    clocks = np.zeros((3, 1, 12), np.int64)
    clocks[0, 0, :10] = [10000, 1000, 4000, 2000, 500, 1000, 500, 1000, 4, 1]
    clocks[2, 0, :10] = [30000, 1000, 12000, 6000, 1000, 4000, 1000, 5000, 6, 1]  # request 1 left at once: no row
    rows = evc.loop_table(clocks, khz=1e6)
    assert rows[0] == "| kernel | 20.00 | 30.00 |"
    assert rows[2] == "| attend | 8.00 | 12.00 |"
    assert rows[5] == "| decide: sketch sums | 2.50 | 4.00 |"
    assert rows[8] == "| iterations | 5.0 | 6 |"
    assert rows[9] == "| µs an iteration | 3.00 | 4.00 |"  # (4 + 2 + 0.5 + 1 + 0.5) / 4 and (12 + 6 + 6) / 6
    assert rows[10] == "| groups that ran | 2 | |"
    assert evc.loop_table(np.zeros((2, 12)), khz=1e6) == ["| (no group ran the loop) | | |"]
    clocks[0, 0, 10:] = [300, 800]  # the marks within the start (cycles from the kernel's start)
    clocks[2, 0, 10:] = [500, 900]
    rows = evc.loop_table(clocks, khz=1e6)
    assert rows[1:4] == ["| start | 1.00 | 1.00 |", "| start: to the query loaded | 0.40 | 0.50 |",
                         "| start: to the first copies issued | 0.85 | 0.90 |"]
    assert rows[4] == "| attend | 8.00 | 12.00 |" and rows[10] == "| iterations | 5.0 | 6 |"
    # the builds since the thirty-first session write 16 words: four marks within the finish, from its start
    wide = np.zeros((3, 1, 16), np.int64)
    wide[..., :12] = clocks
    assert evc.loop_table(wide, khz=1e6) == rows  # (no finish marks written: the same rows)
    wide[0, 0, 12:] = [200, 600, 1500, 2500]
    wide[2, 0, 12:] = [400, 800, 2500, 3500]
    rows16 = evc.loop_table(wide, khz=1e6)
    assert rows16[:10] == rows[:10] and rows16[14:] == rows[10:]  # (rows[9]: the finish itself)
    assert rows16[10:14] == ["| finish: to the prefetches drained | 0.30 | 0.40 |",
                             "| finish: to the warps combined | 0.70 | 0.80 |",
                             "| finish: to the end's barrier | 2.00 | 2.50 |",
                             "| finish: to the outputs written | 3.00 | 3.50 |"]
    grid = evc.loop_table(wide, khz=1e6, grid=True)  # the grid build's finish: no warps' combine, no end barrier
    assert grid[:10] == rows16[:10] and grid[14:] == rows16[14:]
    assert [r.split(" |")[0] for r in grid[10:14]] == ["| finish: to the prefetches drained",
                                                       "| finish: to the combine's start",
                                                       "| finish: to the outputs written",
                                                       "| finish: to the end"]
    # since the seventy-fifth session 18: the global timer at the kernel's start and end after them (not in the table)
    timed = np.zeros((3, 1, 18), np.int64)
    timed[..., :16] = wide
    timed[..., 16:] = [5_000_000, 5_020_000]
    assert evc.loop_table(timed, khz=1e6) == rows16
    with pytest.raises(ValueError, match="12, 16 or 18 words"):
        evc.loop_table(np.zeros((2, 13)), khz=1e6)


def test_resumed_loop_takes_no_more_ctas_than_a_chunk_has_blocks_for_its_warps():
    from psa_fast import _kernels

    assert _kernels.resume_cluster(8, 16, 4) == 4  # Gemma 3: step 16, 4 warps at D 256
    assert _kernels.resume_cluster(4, 16, 4) == 4  # the plan's cluster is the most
    assert _kernels.resume_cluster(8, 16, 8) == 2 and _kernels.resume_cluster(8, 32, 8) == 4
    assert _kernels.resume_cluster(8, 24, 4) == 4  # a power of two below step / warps
    assert _kernels.resume_cluster(8, 4, 8) == 1 and _kernels.resume_cluster(1, 256, 8) == 1


def test_slices_of_512_keys_only_where_every_group_s_slices_fit_in_one_wave(monkeypatch):
    """slice_keys: 512 keys a CTA where all groups' slices of 512 fit on the 132 SMs at once and a group has more
    than 512 blocks (one Llama request at 32K-128K, Gemma's up to 128K), else SLICE (1,024): a batch of long caches,
    or SLICE_ONE_WAVE 0; the workspace follows (none where one slice would hold a group)."""
    from psa_fast import _kernels

    monkeypatch.setattr(_kernels, "num_sms", lambda: 132)
    assert [_kernels.slice_keys(1, 8, n) for n in (1024, 4096, 8192)] == [512, 512, 512]
    assert [_kernels.slice_keys(b, 8, 8192) for b in (2, 8)] == [1024, 1024]  # 256 / 1,024 CTAs of 512
    assert _kernels.slice_keys(1, 1, 16384) == 512 and _kernels.slice_keys(5, 1, 16384) == 1024
    assert _kernels.slice_keys(1, 8, 512) == 1024  # one slice of 512 would hold the group
    assert _kernels.order_workspace_shape(1, 8, 1000) == (1, 8, 1024)
    assert _kernels.order_workspace_shape(1, 8, 512) is None
    monkeypatch.setattr(_kernels, "SLICE_ONE_WAVE", 0)
    assert _kernels.slice_keys(1, 8, 8192) == 1024 and _kernels.order_workspace_shape(1, 8, 1000) is None


def test_the_slices_cost_model_reproduces_its_measurements(monkeypatch):
    """order_cost_us("slices") within 0.65 µs (its fit's largest residual is 0.62) of the in-graph times it was fitted
    to (exp_order_rank.py, H200, thirty-first session, the merge searching in shared memory): slices of 512 wherever
    they fit in one wave, from one group of 2,048 blocks to 32 of 2,048 and one of 16,384; of 1,024 at 1x8x4096 /
    1x8x8192 (15.6 / 18.4, twenty-sixth session, where the model of that path was fitted)."""
    from psa_fast import _kernels

    monkeypatch.setattr(_kernels, "num_sms", lambda: 132)
    measured = {(1, 1, 2048): 6.8, (8, 1, 2048): 7.1, (32, 1, 2048): 8.2, (1, 1, 4096): 7.9, (1, 1, 8192): 10.7,
                (4, 1, 8192): 10.8, (1, 1, 16384): 15.9, (1, 8, 2048): 7.1, (4, 8, 2048): 8.1, (1, 8, 4096): 8.0,
                (1, 8, 8192): 12.6, (1, 32, 1024): 6.8}
    for (b, gn, n), us in measured.items():
        assert _kernels.slice_keys(b, gn, n) == 512
        assert abs(_kernels.order_cost_us("slices", b, gn, n) - us) <= 0.65, (b, gn, n)
    monkeypatch.setattr(_kernels, "SLICE_ONE_WAVE", 0)
    for (b, gn, n), us in {(1, 8, 4096): 15.6, (1, 8, 8192): 18.4}.items():
        assert abs(_kernels.order_cost_us("slices", b, gn, n) - us) <= 0.3, (b, gn, n)


def test_shared_memory_past_the_limit_is_a_clear_error():
    """_with_smem raises the shared memory a kernel may use only while dynamic and static together fit SMEM_LIMIT;
    past it (the s31b case: 7 warps x 2 stages of D 256 rings, 224 KiB, beside the grid build's 6.5 KiB static) a
    ValueError names the kernel and what to ask for, where the driver said only CUDA_ERROR_INVALID_VALUE."""
    from psa_fast import _kernels

    class Kernel:  # the attributes of a cupy.RawKernel that _with_smem reads and sets
        name = "psa_decode"
        shared_size_bytes = 6656
        max_dynamic_shared_size_bytes = 48 * 1024

    fn = Kernel()
    ring = 4 * 2 * 2 * 16 * 256 * 2  # 4 warps x 2 stages: 128 KiB
    assert _kernels._with_smem(fn, ring) is fn and fn.max_dynamic_shared_size_bytes == ring
    assert _kernels._with_smem(fn, 1024).max_dynamic_shared_size_bytes == ring  # never lowered
    with pytest.raises(ValueError, match="psa_decode needs 229376 bytes .* fewer warps or stages"):
        _kernels._with_smem(fn, 7 * 2 * 2 * 16 * 256 * 2)
    assert fn.max_dynamic_shared_size_bytes == ring
    fits = _kernels.SMEM_LIMIT - fn.shared_size_bytes
    assert _kernels._with_smem(fn, fits).max_dynamic_shared_size_bytes == fits


def test_order_method_is_the_fastest_measured(monkeypatch):
    """Without psa_order_runs (ORDER_RUNS 0), order_method picks the fastest method exp_order_rank.py measured at
    each shape, and order_cost_us("rank") is within 0.3 µs of the counts measured where few groups leave the SMs with
    few warps (one group of 2,048, 4,096 and 8,192 blocks: 3.7 µs on the H100 since the scores load in batches,
    fifty-seventh session; 7.5 and 16.3 on the H200, twenty-ninth and thirty-first) and where many groups fill them
    (8 groups of 2,048 and of 4,096: 7.6 and 20.8)."""
    from psa_fast import _kernels

    monkeypatch.setattr(_kernels, "num_sms", lambda: 132)
    monkeypatch.setattr(_kernels, "ORDER_RUNS", 0)
    # every row of exp_order_rank.py on the H200 (NOTES.md, thirty-first session, after the merge searched in shared
    # memory: slices now win from 8 groups of 2,048 blocks or one of 4,097 where one wave of slices of 512 holds them;
    # one group of 4,096 counted 7.5 against slices 7.9)
    measured = {(1, 1, 2048): "rank", (8, 1, 2048): "slices", (32, 1, 2048): "slices", (1, 1, 4096): "rank",
                (1, 1, 8192): "slices", (4, 1, 8192): "slices", (1, 8, 2048): "slices", (4, 8, 2048): "slices",
                (8, 8, 2048): "radix", (1, 8, 4096): "slices", (1, 8, 8192): "slices", (1, 32, 1024): "slices",
                (8, 8, 512): "sort", (32, 8, 512): "sort", (8, 8, 8192): "radix", (32, 8, 8192): "radix",
                (32, 1, 8192): "radix", (32, 8, 2048): "radix"}
    for (b, gn, nmax), fastest in measured.items():
        assert _kernels.order_method(b, gn, nmax) == fastest, (b, gn, nmax)
    for (b, gn, nmax), us in {(1, 1, 2048): 3.7, (1, 1, 4096): 7.5, (1, 1, 8192): 16.3, (1, 8, 2048): 7.6,
                              (1, 8, 4096): 20.8}.items():
        assert abs(_kernels.order_cost_us("rank", b, gn, nmax) - us) <= 0.3, (b, gn, nmax)
    assert _kernels.order_method(1, 8, 8192, workspace=False) == "radix"  # no workspace: no slices
    assert _kernels.order_method(1, 1, 16384) == "slices"  # past what one CTA counts or radix-sorts
    assert _kernels.order_method(32, 8, 16384, workspace=False) == "sort"  # the only one left


def test_order_method_takes_the_runs_where_they_were_fastest(monkeypatch):
    """With psa_order_runs weighed (ORDER_RUNS 1, the default), order_method picks the fastest method the H100
    measured at each shape of benchmarks/results_h100_s57c_order.md (runs from 3 to 32 groups of 1,024-2,048 blocks;
    rank for one group; radix from 64 groups of 2,048), order_cost_us("runs") is within 0.3 µs of those runs at 11 of
    them (0.5 at 1 x 8 and 32 x 3 groups of 2,048, 1.3 at 32 x 8), and runs are never picked past RUNS_MAX_BLOCKS."""
    from psa_fast import _kernels

    monkeypatch.setattr(_kernels, "num_sms", lambda: 132)
    monkeypatch.setattr(_kernels, "ORDER_RUNS", 1)
    measured = {(1, 1, 2048): ("rank", 4.3), (8, 1, 2048): ("runs", 4.7), (32, 1, 2048): ("runs", 7.5),
                (1, 8, 2048): ("runs", None), (4, 8, 2048): ("runs", 7.3), (8, 8, 2048): ("radix", 12.2),
                (1, 1, 1024): ("rank", 3.6), (32, 1, 1024): ("runs", 4.0), (1, 3, 2048): ("runs", 4.4),
                (8, 3, 2048): ("runs", 7.1), (1, 1, 512): ("rank", 3.2), (32, 8, 2048): ("radix", None),
                (16, 1, 2048): ("runs", 4.9), (32, 3, 2048): ("radix", None)}
    for (b, gn, nmax), (fastest, runs_us) in measured.items():
        assert _kernels.order_method(b, gn, nmax) == fastest, (b, gn, nmax)
        if runs_us is not None:
            assert abs(_kernels.order_cost_us("runs", b, gn, nmax) - runs_us) <= 0.3, (b, gn, nmax)
    for nmax in (_kernels.RUNS_MAX_BLOCKS + 1, 4096, 8192):
        assert _kernels.order_method(8, 1, nmax) != "runs"
    with pytest.raises(ValueError, match="method='runs' orders up to 2048"):
        _kernels.order(np.zeros((1, 1, 4096), np.float32), None, None, None, None, s=16, g=1, hq=1, nmax=4096,
                       sink_blocks=0, recent_blocks=0, want_suffix=False, method="runs")


def test_topk_selects_its_head_only_where_the_cost_models_say_it_pays(monkeypatch):
    """head_cost_us (psa_order_head) within 10% of the in-graph times exp_topk_order.py measured on the H100
    (benchmarks/results_h100_s59c_topk_*.md) at 23 of 24 shapes (19% at one group of 2,048, k = 256: 7.3 µs where
    8 and 32 groups took 8.4 and 8.5), and topk_uses_head takes the select exactly where it measured faster
    than the full order (the order stage alone) at each of those 24 shapes: never for one request or a few at 32K,
    nor for a head over 512 keys (sorted by one CTA a group), but for many groups with a short head; and never past
    what the select holds in shared memory."""
    from psa_fast import _kernels

    monkeypatch.setattr(_kernels, "num_sms", lambda: 132)
    # (B, groups a request, blocks a group, k): (full order µs, select µs), H100, fifty-ninth session
    measured = {(1, 1, 2048, 64): (3.7, 6.9), (1, 1, 2048, 256): (3.7, 7.3), (1, 1, 2048, 640): (3.7, 13.4),
                (1, 1, 2048, 1280): (3.7, 23.0), (8, 1, 2048, 64): (4.6, 6.8), (8, 1, 2048, 256): (4.6, 8.4),
                (8, 1, 2048, 640): (4.6, 14.4), (8, 1, 2048, 1280): (4.6, 22.6), (32, 1, 2048, 64): (7.3, 6.8),
                (32, 1, 2048, 256): (7.3, 8.5), (32, 1, 2048, 640): (7.3, 14.2), (32, 1, 2048, 1280): (7.3, 21.8),
                (1, 8, 2048, 102): (4.6, 7.2), (1, 8, 2048, 410): (4.6, 11.7), (1, 8, 2048, 1024): (4.6, 13.5),
                (8, 8, 2048, 102): (10.5, 7.2), (8, 8, 2048, 410): (10.5, 11.8), (8, 8, 2048, 1024): (10.5, 14.3),
                (1, 8, 8192, 410): (12.4, 17.4), (1, 8, 8192, 1638): (12.4, 28.8), (8, 8, 8192, 410): (27.2, 17.5),
                (8, 8, 8192, 1638): (27.2, 28.9), (32, 8, 8192, 410): (54.1, 35.9),
                (32, 8, 8192, 1638): (54.1, 58.6)}
    for (b, gn, nmax, k), (full_us, select_us) in measured.items():
        budget = 0.2 if (b, gn, nmax, k) == (1, 1, 2048, 256) else 0.1
        assert abs(_kernels.head_cost_us(b, gn, nmax, k) - select_us) <= budget * select_us, (b, gn, nmax, k)
        assert _kernels.topk_uses_head(b, gn, nmax, k) == (select_us < full_us), (b, gn, nmax, k)
    assert _kernels.head_cost_us(1, 264, 2048, 82) == 2 * _kernels.head_cost_us(1, 132, 2048, 82)  # waves
    assert not _kernels.topk_uses_head(32, 8, 2 * _kernels.MAX_SMEM_SORT, 64)
    # the model's switch from counting to sorting is select.cu's
    assert f"#define PSA_RANK_MAX {_kernels.SELECT_RANK_MAX} " in _kernels._source("select.cu")


def test_the_kernels_read_the_callers_query_only_where_built_to():
    """estimate(q_scale=...) (the query branch: psa_estimate_mma scales the caller's query itself) exists for
    cuboid_mean and mean groups of at most 4 heads, shared or scored one launch a KV head (estimate_reads_raw_query,
    as the plan asks it); anywhere else (quant3, minmax, the certified bounds, groups of 8) it is a ValueError naming
    what it needs, raised before any launch; so is decode(q_raw=...) outside the builds that read it."""
    from psa_fast import _kernels

    assert _kernels.estimate_reads_raw_query("cuboid_mean", None, 4, 32, 8, 128)
    assert _kernels.estimate_reads_raw_query("mean", "estimates", 4, 4, 1, 256)
    assert _kernels.estimate_reads_raw_query("cuboid_mean", None, 1, 9, 3, 64, group_scores=object())
    assert not _kernels.estimate_reads_raw_query("cuboid_mean", None, 1, 32, 4, 128, group_scores=object())  # 8 heads
    assert not _kernels.estimate_reads_raw_query("cuboid_mean", "bounds", 4, 32, 8, 128)
    assert not _kernels.estimate_reads_raw_query("quant3", None, 4, 32, 8, 128)
    assert not _kernels.estimate_reads_raw_query("minmax", None, 4, 32, 8, 128)
    q = np.zeros((1, 4, 64), np.float16)
    for kind, per_head in [("quant3", None), ("minmax", None), ("cuboid_mean", "bounds")]:
        with pytest.raises(ValueError, match="q_scale=.*tensor cores"):
            _kernels.estimate(q, None, None, None, None, None, d=64, s=16, g=4, hq=4, hkv=1, nmax=8, kind=kind,
                              per_head=per_head, q_scale=0.125)
    # the decode reads it (q_raw) in version 3's loop, grid and split builds, given q_mma's scale: not otherwise
    for other in (dict(version=2), dict(spec=()), dict(offload=()), dict(q_mma=None)):
        with pytest.raises(ValueError, match="q_raw is read by decode version 3"):
            _kernels.decode(q, *[None] * 11, **{**dict(d=64, s=16, g=4, hq=4, hkv=1, nmax=8, stop="ema",
                                                         threshold=0.9, step=8, forced=0, cluster=1,
                                                         q_mma=q, q_raw=(q, 1.0)), **other})


def test_spec_pieces_give_the_groups_about_one_wave(monkeypatch):
    """speculate="first_chunk": a chunk's CTAs are the power of two at or below SMs / groups, 1 to SPEC_PIECES_MAX: one
    Llama request (8 groups) 16 (128 CTAs a chunk between them), per head (32) 4, B = 8 (64) 2, B = 32 1, Gemma 3's one
    group the cap."""
    from psa_fast import _kernels

    monkeypatch.setattr(_kernels, "num_sms", lambda: 132)
    assert [_kernels.spec_pieces(n) for n in (1, 2, 3, 8, 32, 64, 66, 67, 256)] == [64, 64, 32, 16, 4, 2, 2, 1, 1]
    for n in range(1, 300):
        p = _kernels.spec_pieces(n)
        assert p & (p - 1) == 0 and 1 <= p <= _kernels.SPEC_PIECES_MAX
        assert p == 1 or n * p <= 132  # never more than one wave of CTAs a chunk


def test_spec_share_fills_one_wave_and_shares_it_by_blocks(monkeypatch):
    """speculate="first_chunk" with SPEC_BALANCE: one wave of CTAs (an SM each) less a CTA a group for the forced
    chunks, at least one a group, the rest shared by blocks; without it every group's chunk takes spec_pieces. The
    host's mirror of the device's count (spec_ranked_pieces) gives every group 1 to pmax pieces and never more than
    its blocks, fits the CTAs, and cuts no uncapped group's chunk into pieces longer than W / extra blocks (the busiest
    group's pieces as long as the rest's)."""
    from psa_fast import _kernels

    monkeypatch.setattr(_kernels, "num_sms", lambda: 132)
    assert _kernels.spec_share(8, True) == (132, 64, 116)
    assert _kernels.spec_share(8, False) == (132, 64, 124)
    assert _kernels.spec_share(100, False) == (132, 33, 32)
    assert _kernels.spec_share(256, True) == (512, 1, 0)  # more groups than SMs: a CTA a chunk
    monkeypatch.setattr(_kernels, "SPEC_BALANCE", 0)
    assert _kernels.spec_share(8, True) == (8 + 8 * 16, 16, -1)
    np.testing.assert_array_equal(_kernels.spec_ranked_pieces([5, 40, 0], -1, 16), [5, 16, 1])
    rng = np.random.default_rng(0)
    for _ in range(200):
        groups = int(rng.integers(1, 140))
        forced = bool(rng.integers(0, 2))
        monkeypatch.setattr(_kernels, "SPEC_BALANCE", 1)
        ctas, pmax, extra = _kernels.spec_share(groups, forced)
        w = rng.integers(0, 3000, groups) * (rng.random(groups) < 0.9)
        p = _kernels.spec_ranked_pieces(w, extra, pmax)
        assert p.min() >= 1 and p.max() <= pmax and np.all((p <= w) | (w == 0))
        assert p.sum() + (groups if forced else 0) <= ctas
        free = (p < pmax) & (p < w)
        if w.sum() > 0 and extra > 0:
            assert np.all(w[free] / p[free] < w.sum() / extra)


def test_decode_refuses_pieces_with_a_list_of_chunks():
    """The speculative build's pieces run with no spec_len and no list: with psa_spec_len's compact list or a spec_len,
    a null spec_len without pieces, or a partial buffer that does not hold chunks x pieces entries a head, decode()
    raises before any launch."""
    from psa_fast import _kernels

    q = np.zeros((1, 4, 64), np.float32)
    common = dict(d=64, s=16, g=4, hq=4, hkv=1, nmax=8, stop="ema", threshold=0.9, step=8, forced=0, cluster=1)
    partial = np.zeros((1, 4, 2 * 4, 68), np.float32)  # 2 chunks x 4 pieces
    items, lens = np.zeros(8, np.int32), np.zeros((1, 1), np.int32)
    four, two, none = _kernels.SpecShare(8, 4, 4), _kernels.SpecShare(4, 2, 2), _kernels.SpecShare(4, 0, 0)
    for spec, pieces, says in (((None, partial, None, None, 2, None, 8, items), four, "no list of chunks"),
                               ((lens, partial, None, None, 2, None, 8, None), four, "spec_len given: True"),
                               ((None, partial, None, None, 2, None, 8, None), None, "spec_len given: False"),
                               ((None, partial, None, None, 2, None, 8, None), none, "pmax must be"),
                               ((None, partial, None, None, 2, None, 8, None), two, "need 4")):
        with pytest.raises(ValueError, match=says):
            _kernels.decode(q, np.zeros(1, np.float16), *[None] * 10, **common, q_mma=q, spec=spec,
                            spec_pieces=pieces)


def test_pick_cluster_covers_the_sms_once_up_to_the_largest_cluster(monkeypatch):
    """One cluster a selection group, doubled while the grid stays within the 132 SMs, above 8 CTAs only where the GPU
    holds every group's cluster at once (the H200: 7 clusters of 16). One request of up to 5 groups (Gemma 3: 1,
    SmolLM2: 3) takes 16; one Llama-3.1-8B request (8 groups: 8 clusters of 16 do not fit) and two (16) take 8; 4 a
    group for 33 groups (132 CTAs), 2 for 34, 1 from 67 on. With MAX_CLUSTER 8, or where no cluster of 16 fits,
    every size stops at 8."""
    from psa_fast import _kernels

    monkeypatch.setattr(_kernels, "num_sms", lambda: 132)
    fits = {16: 7}
    monkeypatch.setattr(_kernels, "max_active_clusters", lambda c: fits[c])
    sizes = (1, 3, 4, 5, 8, 16, 33, 34, 66, 67, 256)
    assert [_kernels.pick_cluster(n) for n in sizes] == [16, 16, 16, 16, 8, 8, 4, 2, 2, 1, 1]
    fits[16] = 0
    assert [_kernels.pick_cluster(n) for n in sizes] == [8, 8, 8, 8, 8, 8, 4, 2, 2, 1, 1]
    fits[16] = 7
    monkeypatch.setattr(_kernels, "MAX_CLUSTER", 8)
    assert [_kernels.pick_cluster(n) for n in sizes] == [8, 8, 8, 8, 8, 8, 4, 2, 2, 1, 1]


def test_pick_grid_takes_the_grid_build_where_it_was_measured_faster(monkeypatch):
    """The loop's grid build (LOOP_GRID > 0) gives each group up to LOOP_GRID CTAs, as many as fit one an SM for every
    group at once on the 132 SMs, where that is at least 16 CTAs and twice the cluster, the head dim is 128 or more,
    and the cache holds 1,024 blocks a group where the clusters would cover at most a quarter of the SMs, 32 MiB of K
    and V a group elsewhere: every shape measured faster on it in s30c and s30h (Gemma 3 from 16K at one and two
    requests, from 32K up to eight; Llama one request from 64K), none measured slower (Llama at 32K; SmolLM2's D 64 at
    32K and 128K). On by default (LOOP_GRID 64); none while LOOP_GRID is 0."""
    from psa_fast import _kernels

    monkeypatch.setattr(_kernels, "num_sms", lambda: 132)
    monkeypatch.setattr(_kernels, "max_active_clusters", {2: 66, 4: 30, 8: 15, 16: 7}.get)  # the H200's
    assert _kernels.LOOP_GRID == 64 and _kernels.GRID_COOPERATIVE == 1
    gemma, llama, smollm2 = 16 << 10, 8 << 10, 4 << 10  # a block's K and V, bytes
    cases = {  # (groups, cluster, blocks a group, head dim, block bytes): CTAs a group
        (1, 16, 1024, 256, gemma): 64, (1, 16, 2048, 256, gemma): 64, (2, 16, 2048, 256, gemma): 64,
        (4, 16, 2048, 256, gemma): 33, (8, 8, 2048, 256, gemma): 16, (1, 16, 8192, 256, gemma): 64,
        (2, 16, 8192, 256, gemma): 64, (4, 16, 8192, 256, gemma): 33, (8, 8, 8192, 256, gemma): 16,  # measured faster
        (8, 8, 4096, 128, llama): 16, (8, 8, 8192, 128, llama): 16,  # Llama one request at 64K and 128K: faster
        (8, 8, 2048, 128, llama): 0, (3, 16, 2048, 64, smollm2): 0, (3, 16, 8192, 64, smollm2): 0,  # slower
        (1, 16, 512, 256, gemma): 0, (4, 16, 1024, 256, gemma): 0,  # shorter than measured
        (16, 4, 8192, 128, llama): 0, (64, 1, 8192, 128, llama): 0,  # fewer than 16 CTAs a group (batches)
        (30, 4, 2048, 256, gemma): 0, (15, 8, 8192, 128, llama): 0,  # every cluster fits
    }
    assert {k: _kernels.pick_grid(*k) for k in cases} == cases
    monkeypatch.setattr(_kernels, "LOOP_GRID", 128)
    assert [_kernels.pick_grid(n, 16, 8192, 256, gemma) for n in (1, 2)] == [128, 66]  # one an SM for every group
    monkeypatch.setattr(_kernels, "LOOP_GRID", 24)
    assert _kernels.pick_grid(1, 16, 8192, 256, gemma) == 0  # less than twice the cluster
    monkeypatch.setattr(_kernels, "LOOP_GRID", 0)
    assert [_kernels.pick_grid(n, 16, 8192, 256, gemma) for n in (1, 2)] == [0, 0]


def test_grid_exchange_buffers_hold_the_iterations_the_build_keeps():
    """The grid build's exchange buffers (psa_fast._kernels.grid_exchange_shapes): every CTA's statistics of two
    iterations, the two counters, and every warp's output terms of one iteration, as decode.cu's PSA_XSTATS and
    PSA_XCOUNT and the finish index them."""
    from psa_fast import _kernels

    xstats, xcount, xpart = _kernels.grid_exchange_shapes(3, 2, 16, 4, 4, 256)
    assert (xstats, xcount, xpart) == ((3, 2, 2, 16, 4, 4), (3, 2, 2), (3, 2, 64, 4, 260))


def _launches(monkeypatch, **kwargs):
    """psa_fast._kernels.decode's launches for a PSA loop of Llama-3.1-8B's shape (B = 2, 8 query heads, groups of 4,
    D 128, 64 blocks; stop ema unless ``stop`` is given), recorded by a stand-in for the kernel build (no GPU): a list
    of ``(build options, grid, block, arguments, launch keywords)``."""
    from psa_fast import _kernels

    launches = []

    def build(*, entry, cluster, smem, name="decode", **options):
        def launch(grid, block, args, **kw):
            launches.append((dict(options, cluster=cluster, entry=entry), grid, block, args, kw))
        return launch

    monkeypatch.setattr(_kernels, "_decode_build", build)
    b, hq, g, d, nmax = 2, 8, 4, 128, 64
    q = np.zeros((b, hq, d), np.float32)
    pool = np.zeros((4 * nmax, 16, d), np.float16)
    ints = np.zeros((b, hq // g, nmax), np.int32)
    kwargs.setdefault("stop", "ema")
    _kernels.decode(q, pool, pool, ints, np.zeros(b, np.int32), ints, None, q, ints, ints, ints, q,
                    d=d, s=16, g=g, hq=hq, hkv=hq // g, nmax=nmax, threshold=0.95, step=64, forced=2,
                    warps=8, **kwargs)
    return launches


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (the kernel's PTX, no GPU)")
def test_decode_fused_step_passes_the_estimate_orders_arguments(monkeypatch, tmp_path):
    """_kernels.decode(fused=...) (FUSED_STEP, CPU, the build replaced): the loop's build with PSA_FUSED_EO and the
    fused estimate-order kernel's defines (its kind, chunk group, group orders, the runs' swizzle), the caller's query
    (PSA_QRAW), and after the kernel's arguments the metadata, the scores, the sink and recent blocks and the query's
    scale; FUSED_FIRST adds its define and no argument; compiled to PTX (nvcc, with FUSED_FIRST) it takes as many
    parameters as the launch passes. Builds that cannot run the step in one launch are a ValueError."""
    from psa_fast import _kernels

    monkeypatch.setattr(_kernels, "_raw_query_code", lambda q, shape, what: _kernels._QRAW_CODES[q.dtype])  # (no .ptr)
    b, hq, d, nmax = 2, 8, 128, 64
    q16 = np.zeros((b, hq, d), np.float16)
    meta, scores = np.zeros((b, 2, nmax, 2, d), np.float16), np.zeros((b, 2, nmax), np.float32)
    ok = dict(cluster=8, q_mma=np.zeros((b, hq, d), np.float32), q_raw=(q16, 0.125),
              fused=(meta, scores, 1, 2, 0.088, "cuboid_mean"))
    (options, grid, block, args, kw), = _launches(monkeypatch, **ok)
    assert grid == (8, 2, 2) and block == (256,)
    assert {k: options.get(k) for k in ("fused_eo", "kind", "est_kg", "bounds", "eo_heads", "qraw", "run_swizzle")} == {
        "fused_eo": 1, "kind": _kernels.KIND_CODES["cuboid_mean"], "est_kg": _kernels.ESTIMATE_MMA_CHUNK_GROUP,
        "bounds": 0, "eo_heads": 1, "qraw": _kernels._QRAW_CODES[q16.dtype], "run_swizzle": _kernels.RUN_SWIZZLE}
    assert args[-5] is meta and args[-4] is scores and [float(x) for x in args[-3:]] == [1, 2, np.float32(0.088)]
    assert "fused_first" not in options  # (FUSED_FIRST off)
    monkeypatch.setattr(_kernels, "FUSED_FIRST", 1)  # the placements write the loop's first windows: a define only
    (first, _, _, first_args, _), = _launches(monkeypatch, **ok)
    assert first == {**options, "fused_first": 1} and len(first_args) == len(args)
    src = tmp_path / "decode.cu"
    src.write_text(_kernels._source("decode.cu"))
    flags = [f"-DPSA_{k.upper()}={int(v)}" for k, v in first.items() if k not in ("entry", "cluster")]
    flags += [f"-DPSA_D={d}", "-DPSA_S=16", "-DPSA_G=4", "-DPSA_CLUSTER=8"]
    ptx = tmp_path / "decode.ptx"
    subprocess.run(["nvcc", "-ptx", "-arch=sm_90", "-std=c++17", "-o", str(ptx), str(src)] + flags, check=True)
    text = ptx.read_text()
    head = text[text.index(".entry psa_decode("):]
    assert head[:head.index(")")].count(".param") == len(args)
    assert "st.shared::cluster.s32" in text  # (the placements' writes into the warps' first windows)
    for bad, says in ((dict(q_raw=None), "the caller's query"), (dict(cluster=1), "clusters of 2 to 8"),
                      (dict(stop="certified"), "per-head values")):
        with pytest.raises(ValueError, match=says):
            _launches(monkeypatch, **{**ok, **bad})


def test_decode_launches_the_grid_build_as_its_buffers_say(monkeypatch):
    """_kernels.decode (CPU, the build replaced): the grid build launches ``ctas`` CTAs a group, cooperatively, with its
    three exchange buffers as the last arguments; a buffer of another shape is a ValueError naming it, of another dtype
    a TypeError; a cluster build has no grid define."""
    from psa_fast import _kernels

    warps = _kernels.loop_launch(d=128, s=16, g=4, version=3, warps=8)[0]
    shapes = _kernels.grid_exchange_shapes(2, 2, 16, warps, 4, 128)
    bufs = tuple(np.zeros(sh, dtype) for sh, dtype in zip(shapes, _kernels.GRID_EXCHANGE_DTYPES))
    (options, grid, block, args, kw), = _launches(monkeypatch, cluster=1, grid_group=(16,) + bufs)
    assert grid == (16, 2, 2) and block == (warps * 32,) and options["grid"] == 16
    assert options.get("cooperative", False) == bool(_kernels.GRID_COOPERATIVE) and "cooperative" not in kw
    assert args[-3:] == bufs
    (options, grid, _, args, _), = _launches(monkeypatch, cluster=8)
    assert grid == (8, 2, 2) and "grid" not in options
    wrong = bufs[:2] + (np.zeros(shapes[2][:2] + (shapes[2][2] + 1,) + shapes[2][3:], np.float32),)
    with pytest.raises(ValueError, match="xpart"):
        _launches(monkeypatch, cluster=1, grid_group=(16,) + wrong)
    with pytest.raises(TypeError, match="xstats: expected uint64, got float32"):  # (the tagged words, PSA_GRID_TAGS)
        _launches(monkeypatch, cluster=1, grid_group=(16, bufs[0].astype(np.float32)) + bufs[1:])


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (the kernel's PTX, no GPU)")
def test_decode_passes_every_parameter_of_the_build_it_launches(monkeypatch, tmp_path):
    """Each build of decode.cu that _kernels.decode launches takes as many arguments as the host passes: the plain
    loop on clusters and on the grid, each for ema and for the sketch rule (whose plain loop and grid builds take the
    decision's loads early, PSA_SKETCH_RULE), compiled to PTX with the launch's own defines (nvcc, no GPU); a missing
    or extra argument would otherwise be found only on the device."""
    from psa_fast import _kernels

    warps = _kernels.loop_launch(d=128, s=16, g=4, version=3, warps=8)[0]
    src = tmp_path / "decode.cu"
    src.write_text(_kernels._source("decode.cu"))
    grid_bufs = tuple(np.zeros(sh, dtype) for sh, dtype in zip(_kernels.grid_exchange_shapes(2, 2, 16, warps, 4, 128),
                                                               _kernels.GRID_EXCHANGE_DTYPES))
    sketch = (np.zeros((2, 8, 64), np.float32),) * 2
    for kwargs in ({"cluster": 1, "grid_group": (16,) + grid_bufs}, {"cluster": 8},
                   {"cluster": 1, "grid_group": (16,) + grid_bufs, "stop": "sketch_avg", "sketch": sketch},
                   {"cluster": 8, "stop": "sketch_avg", "sketch": sketch}):
        (options, _, _, args, _), = _launches(monkeypatch, **kwargs)
        assert options.get("sketch_rule", 0) == (kwargs.get("stop") == "sketch_avg")
        flags = [f"-DPSA_{k.upper()}={int(v)}" for k, v in options.items() if k not in ("entry", "cooperative")]
        ptx = tmp_path / "k.ptx"
        subprocess.run(["nvcc", "-ptx", "-arch=sm_90", "-std=c++17", "-o", str(ptx), str(src)] + flags, check=True)
        text = ptx.read_text()
        head = text[text.index(".entry psa_decode("):]
        params = head[:head.index(")")].count(".param")
        assert params == len(args), (kwargs.keys(), params, len(args))


def _record_kernel_launches(monkeypatch) -> list:
    """psa_fast._kernels.kernel replaced by a stand-in (no GPU): each launch recorded as ``(file name, entry,
    defines with d / s / g, arguments)``."""
    from psa_fast import _kernels

    launches = []

    def build(name, *, d, s, g, entry=None, **defines):
        def launch(grid, block, args, **kw):
            launches.append((name, entry or name, dict(defines, d=d, s=s, g=g), args))
        return launch

    monkeypatch.setattr(_kernels, "kernel", build)
    return launches


def _assert_launches_pass_every_parameter(launches, tmp_path) -> None:
    """Each recorded launch's kernel, compiled to PTX with its own defines (nvcc), takes as many parameters as the
    launch passes arguments."""
    from psa_fast import _kernels

    for name, entry, defines, args in launches:
        src = tmp_path / f"{name}.cu"
        src.write_text(_kernels._source(f"{name}.cu"))
        flags = [f"-DPSA_{k.upper()}={int(v)}" for k, v in defines.items()]
        ptx = tmp_path / f"{name}.ptx"
        subprocess.run(["nvcc", "-ptx", "-arch=sm_90", "-std=c++17", "-o", str(ptx), str(src)] + flags, check=True)
        text = ptx.read_text()
        head = text[text.index(f".entry psa_{entry}("):]
        assert head[:head.index(")")].count(".param") == len(args), (entry, defines, len(args))


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (the kernel's PTX, no GPU)")
def test_order_launches_pass_every_parameter_with_and_without_the_l2_first_chunk(monkeypatch, tmp_path):
    """The kernels that place the order's blocks (psa_order_runs, psa_order_rank, psa_order_merge after
    psa_order_slice) take as many arguments as _kernels.order passes, with the L2 first chunk asked (PSA_L2_FIRST:
    the block table, both pools, the tile's bytes and the positions) and without, compiled to PTX with each launch's
    own defines (nvcc, no GPU). With ORDER_L2_FIRST_ALL 0 only psa_order_runs asks."""
    from psa_fast import _kernels

    launches = _record_kernel_launches(monkeypatch)
    monkeypatch.setattr(_kernels, "_with_smem", lambda fn, smem: fn)
    monkeypatch.setattr(_kernels, "num_sms", lambda: 132)  # (slice_keys: the H100's)
    b, gn, nmax = 2, 2, 1500
    scores, seq = np.zeros((b, gn, nmax), np.float32), np.zeros(b, np.int32)
    order = np.zeros((b, gn, nmax), np.int32)
    pool = np.zeros((64, 16, 128), np.float16)
    l2 = (order, pool, pool, 32)
    workspace = np.zeros((b, gn, 2048), np.uint64)
    for every in (0, 1):
        monkeypatch.setattr(_kernels, "ORDER_L2_FIRST_ALL", every)
        for method in ("runs", "rank", "slices"):
            for asked in (None, l2):
                _kernels.order(scores, seq, order, None, None, s=16, g=4, hq=8, nmax=nmax, sink_blocks=1,
                               recent_blocks=1, want_suffix=False, workspace=workspace, method=method, l2_first=asked)
    placing = [(n, d.get("l2_first", 0)) for n, _, d, _ in launches if n != "order_slice"]
    assert placing == [
        ("order_runs", 0), ("order_runs", 1), ("order_rank", 0), ("order_rank", 0), ("order_merge", 0),
        ("order_merge", 0), ("order_runs", 0), ("order_runs", 1), ("order_rank", 0), ("order_rank", 1),
        ("order_merge", 0), ("order_merge", 1)]
    _assert_launches_pass_every_parameter(launches, tmp_path)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (the kernel's PTX, no GPU)")
def test_estimate_order_launches_a_cluster_a_group_with_every_parameter(monkeypatch, tmp_path):
    """_kernels.estimate_order (psa_estimate_order: the estimate and the order in one launch) launches a cluster of one
    CTA a run of 256 blocks for each group (grid (runs, Gn, B), PSA_CLUSTER = runs), or for per-head selection one a
    KV head making each of its query heads' orders; ESTIMATE_ORDER warps a CTA (8 at D 256, where 16 would spill);
    and passes as many arguments as the kernel takes with the caller's query (its scale) or the scaled copy, with the
    L2 first chunk asked or not, with RUN_SWIZZLE on (the default) and off, and with ESTIMATE_ORDER_EARLY on (their
    defines; nvcc, no GPU)."""
    from psa_fast import _kernels

    launches = []

    def build(name, *, d, s, g, entry=None, **defines):
        def launch(grid, block, args, **kw):
            launches.append((name, entry or name, dict(defines, d=d, s=s, g=g), args, grid, block))
        return launch

    monkeypatch.setattr(_kernels, "kernel", build)
    monkeypatch.setattr(_kernels, "_raw_query_code", lambda q, shape, what: _kernels._QRAW_CODES[q.dtype])  # (no .ptr)
    pool = np.zeros((64, 16, 128), np.float16)
    shapes = []
    for warps, d, g, hkv, b, nmax, kind in [(8, 128, 4, 2, 1, 1500, "cuboid_mean"), (16, 64, 3, 3, 2, 200, "mean"),
                                            (16, 256, 4, 1, 1, 2048, "cuboid_mean"), (8, 128, 1, 2, 1, 1500, "mean")]:
        monkeypatch.setattr(_kernels, "ESTIMATE_ORDER", warps)
        hq = (g if g > 1 else 4) * hkv  # (g 1: per-head selection, 4 query heads a KV head)
        for raw in (False, True):
            q = np.zeros((b, hq, d), np.float16 if raw else np.float32)
            for l2 in (None, (np.zeros((b, hkv, nmax), np.int32), pool, pool, 32))[: 1 if g == 1 else 2]:
                _kernels.estimate_order(q, None, None, None, None, d=d, s=16, g=g, hq=hq, hkv=hkv, nmax=nmax,
                                        kind=kind, sink_blocks=1, recent_blocks=2, q_scale=0.1 if raw else None,
                                        l2_first=l2)
                if g > 1:
                    shapes.append((launches[-1][4], launches[-1][5], launches[-1][2]["cluster"],
                                   launches[-1][2].get("qraw", 0), launches[-1][2].get("l2_first", 0)))
    assert {sh[:3] for sh in shapes} == {((6, 2, 1), (256,), 6), ((1, 3, 2), (512,), 1), ((8, 1, 1), (256,), 8)}
    assert [sh[3:] for sh in shapes[:4]] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    per_head = [launch[2] for launch in launches[-2:]]  # a cluster a KV head (grid y 2), 4 orders, each head's scores
    assert [(d["g"], d["eo_heads"], d["bounds"]) for d in per_head] == [(4, 4, 2)] * 2
    assert all(launch[2].get("run_swizzle") == 1 and "eo_early" not in launch[2] for launch in launches)  # defaults
    q = np.zeros((1, 8, 128), np.float32)
    for swizzle, early in ((0, 0), (1, 1)):  # the switches: defines (none where off), the same arguments
        monkeypatch.setattr(_kernels, "RUN_SWIZZLE", swizzle)
        monkeypatch.setattr(_kernels, "ESTIMATE_ORDER_EARLY", early)
        _kernels.estimate_order(q, None, None, None, None, d=128, s=16, g=4, hq=8, hkv=2, nmax=1500,
                                kind="cuboid_mean", sink_blocks=1, recent_blocks=2,
                                l2_first=(np.zeros((1, 2, 1500), np.int32), pool, pool, 32))
        assert [launches[-1][2].get(k, 0) for k in ("run_swizzle", "eo_early")] == [swizzle, early]
    _assert_launches_pass_every_parameter([launch[:4] for launch in launches], tmp_path)


def test_estimate_order_is_fused_only_where_it_gives_the_same_results(monkeypatch):
    """_kernels.fuses_estimate_order: on by default (ESTIMATE_ORDER 16; 0 turns it off), only for group scores on the
    tensor cores' estimate (cuboid_mean, mean; groups of at most 4 heads, not one launch a KV head's query heads), no
    per-head values (the certified bounds, the sketch rules', the estimated stop's and the predicted first chunk's
    estimates), orders that order_method gives to psa_order_runs (any, where ESTIMATE_ORDER_ANY_ORDER), and at most
    ESTIMATE_ORDER_MAX_GROUPS groups.
    estimate_order refuses what it cannot do with a ValueError naming it."""
    from psa_fast import _kernels

    monkeypatch.setattr(_kernels, "num_sms", lambda: 132)  # (order_method's costs: the H100's)
    llama = dict(kind="cuboid_mean", per_head=None, g=4, hq=32, hkv=8, d=128)
    assert _kernels.ESTIMATE_ORDER == 16 and _kernels.fuses_estimate_order(1, 8, 2048, **llama)  # on by default
    monkeypatch.setattr(_kernels, "ESTIMATE_ORDER", 0)
    assert not _kernels.fuses_estimate_order(1, 8, 2048, **llama)  # off
    monkeypatch.setattr(_kernels, "ESTIMATE_ORDER", 8)
    assert _kernels.order_method(1, 8, 2048) == "runs" and _kernels.fuses_estimate_order(1, 8, 2048, **llama)
    assert _kernels.fuses_estimate_order(1, 8, 1024, **llama)
    assert _kernels.fuses_estimate_order(1, 3, 2048, kind="mean", per_head=None, g=3, hq=9, hkv=3, d=64)
    assert _kernels.ESTIMATE_ORDER_MAX_GROUPS == 8  # (one Llama request: 32 groups lost on the H100, s73a)
    assert not _kernels.fuses_estimate_order(2, 8, 2048, **llama)  # 16 groups
    per_head = dict(llama, g=1)  # per-head selection: a cluster a KV head scores its 4 query heads, orders each
    assert not _kernels.fuses_estimate_order(1, 32, 2048, **per_head, group_scores=object())  # 32 groups
    monkeypatch.setattr(_kernels, "ESTIMATE_ORDER_MAX_GROUPS", 32)
    assert _kernels.fuses_estimate_order(4, 8, 2048, **llama)
    assert not _kernels.fuses_estimate_order(8, 8, 2048, **llama)  # 64 groups
    assert not _kernels.fuses_estimate_order(1, 8, 8192, **llama)  # (128K: past the runs' 2,048 blocks)
    for other in (dict(per_head="estimates"), dict(per_head="bounds"), dict(kind="quant3"), dict(kind="minmax"),
                  dict(g=8, hq=64)):
        assert not _kernels.fuses_estimate_order(1, 8, 2048, **{**llama, **other}), other
    assert _kernels.fuses_estimate_order(1, 32, 2048, **per_head, group_scores=object())
    assert not _kernels.fuses_estimate_order(1, 64, 2048, **dict(per_head, hq=64), group_scores=object())  # 8 a KV head
    assert not _kernels.fuses_estimate_order(2, 32, 2048, **per_head, group_scores=object())  # 64 groups
    monkeypatch.setattr(_kernels, "order_method", lambda *a, **k: "rank")
    assert not _kernels.fuses_estimate_order(1, 8, 2048, **llama)
    gemma = dict(kind="cuboid_mean", per_head=None, g=4, hq=4, hkv=1, d=256)  # (order_method says rank, as above)
    assert not _kernels.fuses_estimate_order(1, 1, 2048, **gemma)
    monkeypatch.setattr(_kernels, "ESTIMATE_ORDER_ANY_ORDER", 1)  # fused whatever order_method says
    assert _kernels.fuses_estimate_order(1, 1, 2048, **gemma) and _kernels.fuses_estimate_order(1, 8, 2048, **llama)
    assert not _kernels.fuses_estimate_order(1, 8, 8192, **llama)  # (still at most the runs' 2,048 blocks)
    monkeypatch.setattr(_kernels, "ESTIMATE_ORDER_ANY_ORDER", 0)
    q = np.zeros((1, 32, 128), np.float32)
    call = dict(d=128, s=16, g=4, hq=32, hkv=8, nmax=2048, kind="cuboid_mean", sink_blocks=0, recent_blocks=0)
    for change, match in [(dict(kind="minmax"), "cuboid_mean or mean"), (dict(nmax=2049), "up to 2048 blocks"),
                          (dict(g=1, hq=64), "at most 4 heads a launch; got kind='cuboid_mean', 8 heads"),
                          (dict(l2_first=(np.zeros((1, 32, 2048), np.int32), q, q, 8)), r"\[B, Gn, Nmax\]"),
                          (dict(g=1, l2_first=(np.zeros((1, 8, 2048), np.int32), q, q, 8)), r"\[B, Gn, Nmax\]")]:
        with pytest.raises(ValueError, match=match):
            _kernels.estimate_order(q, None, None, None, None, **{**call, **change})
    monkeypatch.setattr(_kernels, "ESTIMATE_ORDER", 4)
    with pytest.raises(ValueError, match="ESTIMATE_ORDER must be 0 .off., 8 or 16"):
        _kernels.estimate_order(q, None, None, None, None, **call)


def test_order_refuses_an_l2_first_chunk_whose_table_is_not_one_a_group(monkeypatch):
    """_kernels.order(l2_first=...): the placing kernels look a block's slot up as block_table[b, group, block], so a
    table of another shape (per-head groups over a KV head's table: Gn = Hq, the table's Hkv) is refused with a
    ValueError naming the shape it needs, not read past its groups; without l2_first the same call launches."""
    from psa_fast import _kernels

    launches = _record_kernel_launches(monkeypatch)
    b, hkv, gn, nmax = 1, 2, 8, 1500
    scores, seq = np.zeros((b, gn, nmax), np.float32), np.zeros(b, np.int32)
    order = np.zeros((b, gn, nmax), np.int32)
    pool = np.zeros((64, 16, 128), np.float16)
    kv_table = np.zeros((b, hkv, nmax), np.int32)
    call = dict(s=16, g=1, hq=gn, nmax=nmax, sink_blocks=1, recent_blocks=1, want_suffix=False, method="runs")
    with pytest.raises(ValueError, match=r"\[B, Gn, Nmax\] = \(1, 8, 1500\)"):
        _kernels.order(scores, seq, order, None, None, l2_first=(kv_table, pool, pool, 32), **call)
    assert launches == []
    _kernels.order(scores, seq, order, None, None, l2_first=None, **call)
    assert [(name, defines.get("l2_first", 0)) for name, _, defines, _ in launches] == [("order_runs", 0)]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (the kernel's PTX, no GPU)")
def test_suffix_and_first_chunk_launches_pass_every_parameter(monkeypatch, tmp_path):
    """psa_order_suffix (plain and tiled) and psa_first_chunk take as many arguments as _kernels.suffix and
    _kernels.first_chunk pass, compiled to PTX with each launch's own defines (nvcc, no GPU): a missing or extra
    argument would otherwise be found only on the device."""
    from psa_fast import _kernels

    launches = _record_kernel_launches(monkeypatch)
    b, hq, g, nmax = 2, 8, 4, 64
    seq, order = np.zeros(b, np.int32), np.zeros((b, hq // g, nmax), np.int32)
    vals, log_suffix = np.zeros((b, hq, nmax), np.float32), np.zeros((b, hq, nmax + 1), np.float32)
    first_len = np.zeros((b, hq // g), np.int32)
    for tiled_from in (0, 1):
        monkeypatch.setattr(_kernels, "SUFFIX_TILED_MIN_BLOCKS", tiled_from)
        _kernels.suffix(order, seq, vals, log_suffix, s=16, g=g, hq=hq, nmax=nmax, ordered=vals)
    _kernels.first_chunk(log_suffix, seq, first_len, s=16, g=g, hq=hq, nmax=nmax, forced=1, threshold=0.9)
    assert len(launches) == 3 and launches[0][2]["suffix_tiled"] == 0 and launches[1][2]["suffix_tiled"] == 1
    _assert_launches_pass_every_parameter(launches, tmp_path)


def test_pick_grid_takes_the_grid_build_where_the_clusters_would_wait(monkeypatch):
    """Where the GPU cannot hold every group's cluster at once (the H200 holds 30 clusters of 4 and 15 of 8, one CTA
    an SM), the last clusters would run in a second wave: there the grid build gives every group 132 // groups CTAs,
    all resident, at any head dim and size (s34c/d: Gemma 3 32K B = 32 125.4 -> 99.9 µs, B = 16 76.5 -> 64.7; Llama
    128K B = 2 125.9 -> 113.4, 128K B = 4 175.4 -> 184.1 the one loss). Not with GRID_WHERE_CLUSTERS_WAIT 0, nor where
    the groups would get one CTA each."""
    from psa_fast import _kernels

    monkeypatch.setattr(_kernels, "num_sms", lambda: 132)
    monkeypatch.setattr(_kernels, "max_active_clusters", {2: 66, 4: 30, 8: 15, 16: 7}.get)
    gemma, llama, smollm2 = 16 << 10, 8 << 10, 4 << 10
    cases = {  # (groups, cluster, blocks a group, head dim, block bytes): CTAs a group
        (32, 4, 2048, 256, gemma): 4, (32, 4, 8192, 256, gemma): 4, (16, 8, 2048, 256, gemma): 8,  # Gemma 3 B = 32, 16
        (16, 8, 2048, 128, llama): 8, (32, 4, 8192, 128, llama): 4,  # Llama B = 2 and 4
        (33, 4, 64, 64, smollm2): 4,  # any head dim and size
        (67, 2, 2048, 128, llama): 0,  # one CTA a group
    }
    assert {k: _kernels.pick_grid(*k) for k in cases} == cases
    assert _kernels.pick_cluster(32) == 4 and _kernels.pick_cluster(16) == 8  # the clusters that would wait
    for n in range(1, 300):  # whatever the batch: clusters that all fit at once, the grid, or one CTA a group
        c = _kernels.pick_cluster(n)
        for d, block in ((256, gemma), (128, llama), (64, smollm2)):
            fits = c == 1 or {2: 66, 4: 30, 8: 15, 16: 7}[c] >= n
            assert fits or _kernels.pick_grid(n, c, 2048, d, block) > 1, (n, d)
    monkeypatch.setattr(_kernels, "GRID_WHERE_CLUSTERS_WAIT", 0)
    assert [_kernels.pick_grid(*k) for k in ((32, 4, 2048, 256, gemma), (16, 8, 2048, 128, llama))] == [0, 0]


def test_loop_step_auto_lies_where_the_measured_steps_were_fastest(monkeypatch):
    """step="auto" on Llama-3.1-8B's shape (8 groups, 8 KiB blocks, 8 warps attending two blocks at once), against
    exp_step.py's sweep (benchmarks/results_h200_exp_step_llama8b_pairs.md): between the two fastest measured steps
    at each size, whole pairs for every warp, larger for one request than for a batch sharing the bandwidth; and
    one block a warp for a build that does not pair (Gemma 3's D 256, 4 warps)."""
    from psa_fast import _kernels

    monkeypatch.setattr(_kernels, "num_sms", lambda: 132)
    monkeypatch.setattr(_kernels, "max_active_clusters", lambda c: 7)  # the H200's, clusters of 16
    assert _kernels.COPY_CEILING_GBS == 4300.0  # ... and its copy ceiling, the default

    def step(b, nmax, pairs=True):
        cluster = _kernels.pick_cluster(b * 8)
        unit = cluster * 8 * (2 if pairs else 1)
        return _kernels.pick_step(b, 8, nmax, cluster=cluster, warps=8, block_bytes=8192, pairs=pairs), unit

    # (B, blocks): the fastest and second-fastest steps measured (µs): 384 (33.6) and 512 (36.7); 768 (88.5) and
    # 512 (92.0), where 704, the pick of the rule fitted one block a warp, took 106.7; 352 (308.4) and 256 (316.2);
    # 176 (1019.6) and 152 (1027.5)
    measured = {(1, 2048): (384, 512), (1, 8192): (512, 768), (8, 8192): (256, 352), (32, 8192): (152, 176)}
    for (b, nmax), (lo, hi) in measured.items():
        got, unit = step(b, nmax)
        assert lo <= got <= hi and got % unit == 0, (b, nmax, got)
        if b <= 8:  # the first rule took 64 / 128 / 128 here, slower at each (nineteenth session)
            assert got >= 2 * max(unit // 2, nmax // 64), (b, nmax, got)
    assert step(8, 8192)[0] < step(1, 8192)[0]
    assert step(1, 2048)[0] <= step(1, 8192)[0]
    assert step(1, 3)[0] == step(1, 3)[1]  # a short cache: one pair a warp, not fewer
    for pairs in (False, True):
        for nmax in (1, 100, 2048, 8192):  # never more than the cache, rounded up to whole blocks (pairs) a warp
            got, unit = step(1, nmax, pairs)
            assert unit <= got <= -(-nmax // unit) * unit and got % unit == 0
    # Gemma 3's layer (one group, 16 KiB blocks, 4 warps unpaired): 256 measured 45.8 / 62.7 µs at 32K B = 1 / 8,
    # 288 48.7 / 66.5
    assert [_kernels.pick_step(b, 1, 2048, cluster=8, warps=4, block_bytes=16384) for b in (1, 8)] == [256, 256]
    assert _kernels.pick_step(1, 8, 8192, cluster=8, warps=8, block_bytes=8192, speculate=True) == 32
    # after a predicted first chunk the step sizes only the residual: smaller (never below a block a warp, and the
    # same rounding), fewer blocks read past the stop for the same decisions (psa_ref on Gemma 3's layer 17 at 32K:
    # 128 after the prediction 2.8 iterations and 35.8% of blocks, 256 2.9 and 42.1%)
    for b, groups, nmax, cluster, warps, block_bytes, pairs in ((1, 1, 2048, 8, 4, 16384, False),
                                                               (8, 1, 2048, 8, 4, 16384, False),
                                                               (1, 8, 8192, 16, 8, 8192, True),
                                                               (32, 8, 8192, 4, 8, 8192, True)):
        shape = dict(cluster=cluster, warps=warps, block_bytes=block_bytes, pairs=pairs)
        plain = _kernels.pick_step(b, groups, nmax, **shape)
        predicted = _kernels.pick_step(b, groups, nmax, **shape, predicted=True)
        unit = cluster * warps * (2 if pairs else 1)
        assert unit <= predicted < plain and predicted % unit == 0, (b, nmax, plain, predicted)
    assert _kernels.pick_step(1, 1, 3, cluster=8, warps=4, block_bytes=16384, predicted=True) == 32  # a block a warp
    assert [_kernels.spec_step(n) for n in (1, 2048, 4096, 8192, 32768)] == [16, 16, 16, 32, 128]  # the benches'
    # a slower card shares less bandwidth over a batch's groups: a smaller step where the batch sets it (B = 8; the
    # H100's ceiling gave 288 where the H200's gave 352, -1.3% at Llama 128K, fifty-fifth session), none at B = 1
    shape = dict(cluster=_kernels.pick_cluster(64), warps=8, block_bytes=8192, pairs=True)
    assert _kernels.pick_step(8, 8, 8192, **shape, ceiling_gbs=3050.0) < _kernels.pick_step(8, 8, 8192, **shape)
    assert _kernels.pick_step(8, 8, 8192, **shape, ceiling_gbs=4300.0) == _kernels.pick_step(8, 8, 8192, **shape)
    one = dict(shape, cluster=_kernels.pick_cluster(8))
    assert _kernels.pick_step(1, 8, 8192, **one, ceiling_gbs=3050.0) == _kernels.pick_step(1, 8, 8192, **one)


def test_copy_ceiling_is_the_cards_unless_set(monkeypatch):
    """pick_step's copy ceiling: COPY_CEILING_GBS where set, else COPY_CEILING_OF_PEAK of the current device's peak
    from its memory clock (kHz) and bus width (bits), per device; a card that reports neither is a ValueError."""
    import types

    from psa_fast import _kernels

    cards = {0: (2_619_000, 5120), 1: (3_201_000, 6144), 2: (0, 0)}  # an H100 SXM's, an H200's, one without
    current = [0]
    runtime = types.SimpleNamespace(getDevice=lambda: current[0],
                                    deviceGetAttribute=lambda attr, dev: cards[dev][{36: 0, 37: 1}[attr]])
    cuda = types.ModuleType("cupy.cuda")
    cuda.runtime = runtime
    monkeypatch.setitem(sys.modules, "cupy", types.ModuleType("cupy"))
    monkeypatch.setitem(sys.modules, "cupy.cuda", cuda)
    monkeypatch.setattr(_kernels, "COPY_CEILING_GBS", 0.0)
    _kernels.card_copy_ceiling_gbs.cache_clear()
    try:
        h100 = _kernels.copy_ceiling_gbs()
        assert h100 == pytest.approx(_kernels.COPY_CEILING_OF_PEAK * 3352.32)
        assert 2900 < h100 < 3150  # bench_decode measured 3,044 on the H100 (fifty-third session)
        current[0] = 1
        assert 4200 < _kernels.copy_ceiling_gbs() < 4500  # the design card's H200: 4,229-4,274
        current[0] = 2
        with pytest.raises(ValueError, match="COPY_CEILING_GBS"):
            _kernels.copy_ceiling_gbs()
        monkeypatch.setattr(_kernels, "COPY_CEILING_GBS", 2000.0)
        assert _kernels.copy_ceiling_gbs() == 2000.0  # set: no device asked
    finally:
        _kernels.card_copy_ceiling_gbs.cache_clear()


def test_the_loop_pairs_where_decode_cu_does(monkeypatch):
    """loop_launch mirrors decode.cu's PSA_PAIR_ON (version 3, DECODE_PAIR, three stages or more) after
    decode_config fits the ring: Llama's D 128 at 8 warps pairs, Gemma 3's D 256 runs 4 warps of 2 stages unpaired,
    version 2 (groups over 8 heads) never pairs, nor any build with DECODE_PAIR = 0."""
    from psa_fast import _kernels

    assert _kernels.loop_launch(d=128, s=16, g=4, version=3, warps=8) == (8, True)
    assert _kernels.loop_launch(d=256, s=16, g=4, version=3, warps=8) == (4, False)
    assert _kernels.loop_launch(d=128, s=16, g=4, version=3, warps=8, stages=2) == (8, False)
    assert _kernels.loop_launch(d=64, s=16, g=16, version=3, warps=8) == (8, False)
    source = (Path(_kernels.__file__).parent / "kernels" / "decode.cu").read_text()
    assert "#define PSA_PAIR_ON (PSA_PAIR && PSA_STAGES >= 3 && !PSA_SPLIT)" in source
    monkeypatch.setattr(_kernels, "DECODE_PAIR", 0)
    assert _kernels.loop_launch(d=128, s=16, g=4, version=3, warps=8) == (8, False)


def test_every_kernel_call_of_the_package_matches_its_launcher_signature():
    """The launchers in psa_fast._kernels run only on a GPU, which CI lacks: a keyword the caller passes and the
    launcher no longer takes (or a positional too many) must fail here, not on the device."""
    import ast
    import inspect
    from pathlib import Path

    import psa_fast
    from psa_fast import _kernels

    calls = 0
    for path in Path(psa_fast.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "_kernels"):
                continue
            fn = getattr(_kernels, node.func.attr, None)
            if not callable(fn) or isinstance(fn, type):
                continue
            params = inspect.signature(fn).parameters.values()
            if any(p.kind is p.VAR_KEYWORD for p in params):
                continue
            names = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
            positional = [p for p in params if p.kind is p.POSITIONAL_OR_KEYWORD]
            where = f"{path.name}:{node.lineno} _kernels.{node.func.attr}"
            for kw in node.keywords:
                assert kw.arg is None or kw.arg in names, f"{where} passes {kw.arg}="
            if not any(isinstance(a, ast.Starred) for a in node.args):
                assert len(node.args) <= len(positional), f"{where} passes {len(node.args)} positional arguments"
            calls += 1
    assert calls >= 15  # the scan saw the package's launches (19 when written)


def test_order_names_a_bad_method_before_touching_the_gpu():
    from psa_fast import _kernels

    scores, seq, out = np.zeros((1, 1, 9000), np.float32), np.zeros(1, np.int32), np.zeros((1, 1, 9000), np.int32)
    kw = dict(s=16, g=1, hq=1, nmax=9000, sink_blocks=0, recent_blocks=0, want_suffix=False)
    with pytest.raises(ValueError, match="method must be one of"):
        _kernels.order(scores, seq, out, None, None, method="bitonic", **kw)
    with pytest.raises(ValueError, match="rank' orders up to 8192 blocks"):
        _kernels.order(scores, seq, out, None, None, method="rank", **kw)
    with pytest.raises(ValueError, match="needs a workspace"):
        _kernels.order(scores, seq, out, None, None, method="slices", **kw)


def test_kv_layer_bytes_counts_whole_blocks_of_float16_k_and_v():
    """exp_dense_tune's floors and the rotating layers both size a layer's K/V by kv_layer_bytes."""
    llama = bd.SHAPES["llama8b"]
    assert bd.kv_layer_bytes(llama, 32768, 1) == 8 * 32768 * 128 * 2 * 2  # 128 MiB
    assert bd.kv_layer_bytes(llama, 32768 - 15, 2) == 2 * bd.kv_layer_bytes(llama, 32768, 1)  # a partial block


def test_rotating_layers_keep_the_kv_and_the_metadata_out_of_l2():
    """Enough layers that both the K/V and the estimate's metadata of all of them are at least 4x L2 (the metadata
    decides for one request: 32K of Llama's shape is 8 MiB a layer), at least 2, at most the calls of one graph."""
    llama, gemma = bd.SHAPES["llama8b"], bd.SHAPES["gemma3"]
    assert bd.meta_layer_bytes(llama, 32768, 1) == 8 * 2048 * 2 * 128 * 2  # 8 MiB
    for shape, t, b in [(llama, 32768, 1), (llama, 131072, 1), (llama, 131072, 8), (gemma, 32768, 32)]:
        layers = bd.rotating_layers(shape, t, b)
        assert 2 <= layers <= bd.PER_GRAPH
        if layers < bd.PER_GRAPH:
            assert layers * bd.meta_layer_bytes(shape, t, b) >= 4 * bd.L2_BYTES
            assert layers * bd.kv_layer_bytes(shape, t, b) >= 4 * bd.L2_BYTES
    assert bd.rotating_layers(llama, 32768, 1) == bd.PER_GRAPH  # 8 MiB a layer: 30 layers would be 4x L2
    assert bd.rotating_layers(llama, 131072, 8) == 2  # 4 GiB of K/V and 256 MiB of metadata a layer


def test_the_driver_gets_a_launch_config_of_the_c_layout():
    """psa_fast._driver (pick_cluster's check, exp_clusters.py) hands cuOccupancyMaxActiveClusters a CUlaunchConfig
    through ctypes: 56 bytes with the stream pointer aligned to 8, a 72-byte CUlaunchAttribute whose value starts at
    byte 8 with the cluster's x, y, z."""
    import ctypes

    from psa_fast import _driver as ec

    assert ctypes.sizeof(ec.LaunchAttribute) == 72 and ec.LaunchAttribute.value.offset == 8
    assert ctypes.sizeof(ec.LaunchConfig) == 56 and ec.LaunchConfig.stream.offset == 32
    cfg = ec.launch_config((8, 4, 2), 256, 200 * 1024, 8)
    assert list(cfg.grid) == [8, 4, 2] and list(cfg.block) == [256, 1, 1] and cfg.shared_mem == 200 * 1024
    assert cfg.num_attrs == 1 and cfg.attrs.contents.id == ec.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
    assert list(cfg.attrs.contents.value[:3]) == [8, 1, 1]
    assert ec.launch_config((1, 1, 1), 32, 0, None).num_attrs == 0


def test_placement_sets_spread_and_pack_the_gpcs():
    """exp_placement: `spread` takes SMs round-robin over the GPCs (no GPC gets two more than another while any has
    SMs left), `packed` fills the largest GPCs first; both give distinct SMs, never more than exist."""
    import exp_placement as ep

    gpcs = [[0, 1, 2, 3, 4, 5], [6, 7, 8, 9], [10], [11, 12, 13]]
    assert ep.spread(gpcs, 6) == [0, 6, 10, 11, 1, 7]
    assert ep.packed(gpcs, 7) == [0, 1, 2, 3, 4, 5, 6]
    for n in range(1, 16):
        s, p = ep.spread(gpcs, n), ep.packed(gpcs, n)
        assert len(s) == len(set(s)) == len(p) == len(set(p)) == min(n, 14)
        counts = [len(set(g) & set(s)) for g in gpcs]
        assert all(c == len(g) or c >= max(counts) - 1 for c, g in zip(counts, gpcs))
        touched = sum(bool(set(g) & set(p)) for g in gpcs)
        assert touched == next(k for k in range(1, 5) if sum(sorted(map(len, gpcs), reverse=True)[:k]) >= min(n, 14))


def _elf64(sections: dict[str, bytes]) -> bytes:
    """A minimal ELF64 file holding ``sections`` (name -> contents) after a null section and a name table."""
    import struct

    names = b"\0" + b"".join(n.encode() + b"\0" for n in sections) + b".shstrtab\0"
    body, offsets, data_off = b"", [], 64
    for contents in sections.values():
        offsets.append(data_off + len(body))
        body += contents
    strtab_off = data_off + len(body)
    shoff = strtab_off + len(names)
    headers = [struct.pack("<IIQQQQIIQQ", 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)]
    name_at = 1
    for (name, contents), off in zip(sections.items(), offsets):
        headers.append(struct.pack("<IIQQQQIIQQ", name_at, 1, 6, 0, off, len(contents), 0, 0, 128, 0))
        name_at += len(name) + 1
    headers.append(struct.pack("<IIQQQQIIQQ", name_at, 3, 0, 0, strtab_off, len(names), 0, 0, 1, 0))
    ident = b"\x7fELF\x02\x01\x01" + b"\0" * 9
    header = ident + struct.pack("<HHIQQQIHHHHHH", 2, 190, 1, 0, 0, shoff, 0, 64, 0, 0, 64, len(headers),
                                 len(headers) - 1)
    return header + body + names + b"".join(headers)


def test_sass_size_reads_each_kernels_text_section_and_ptxas_usage():
    """benchmarks/sass_size.py (a kernel's static SASS size without a disassembler): the ``.text.<kernel>`` sections'
    sizes of an ELF64 cubin, other sections ignored; registers and spill stores per kernel from ptxas -v; a file that
    is not ELF64 is refused."""
    import sass_size

    cubin = _elf64({".text.psa_decode": b"\0" * 16 * 37, ".nv.info": b"\1" * 24, ".text.psa_merge_splits": b"\0" * 160})
    assert sass_size.text_sections(cubin) == {"psa_decode": 592, "psa_merge_splits": 160}
    digests = sass_size.text_sections(cubin, digest=True)
    assert digests["psa_decode"] == hashlib.md5(b"\0" * 16 * 37).hexdigest() != digests["psa_merge_splits"]
    with pytest.raises(ValueError, match="ELF64"):
        sass_size.text_sections(b"\x7fELF\x01" + b"\0" * 60)
    report = """ptxas info    : Compiling entry function 'psa_merge_splits' for 'sm_90'
ptxas info    : Function properties for psa_merge_splits
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 33 registers, used 1 barriers, 1152 bytes smem
ptxas info    : Compiling entry function 'psa_decode' for 'sm_90'
ptxas info    : Function properties for psa_decode
    96 bytes stack frame, 84 bytes spill stores, 84 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 3072 bytes smem"""
    assert sass_size.ptxas_usage(report) == {"psa_merge_splits": (33, 0), "psa_decode": (255, 84)}


def test_sass_loops_places_spill_traffic_in_the_loops_that_hold_it():
    """sass_size.sass_loops (``--loops``) on nvdisasm -c -g text: a loop per backward branch (a forward branch is
    none), spanning its label to the branch, counting its instructions and its LDL / STL; the branch's line is the
    named source file's (a CUDA header's line keeps the last line of that file); each kernel apart."""
    import sass_size

    sass = """//--------------------- .text.psa_decode --------------------------
.text.psa_decode:
        //## File "/tmp/x/decode.cu", line 10
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/              @P0 BRA `(.L_x_1) ;
.L_x_0:
        //## File "/tmp/x/decode.cu", line 20
        /*0020*/                   LDL R2, [R1+0x8] ;
.L_x_2:
        /*0030*/                   FADD R3, R3, R2 ;
        //## File "/usr/local/cuda/include/sm_32_intrinsics.hpp", line 112
        /*0040*/              @P1 BRA `(.L_x_2) ;
        //## File "/tmp/x/decode.cu", line 30
        /*0050*/                   STL [R1+0x8], R3 ;
        /*0060*/              @P2 BRA `(.L_x_0) ;
.L_x_1:
        /*0070*/                   EXIT ;
.text.psa_merge_splits:
        /*0000*/                   NOP ;
"""
    loops = sass_size.sass_loops(sass, "decode.cu")
    assert loops["psa_merge_splits"] == []
    assert loops["psa_decode"] == [dict(start=0x20, end=0x60, instructions=5, local=2, line=30),
                                   dict(start=0x30, end=0x40, instructions=2, local=0, line=20)]


def test_exp_ceiling_refuses_an_unknown_fill():
    """benchmarks/exp_ceiling.py's fill names the kinds it knows when given another (before touching the GPU)."""
    import exp_ceiling

    with pytest.raises(ValueError, match="kind: expected 'zeros', 'random' or 'float16', got 'ones'"):
        exp_ceiling.fill(None, "ones")


def test_exp_split_waves_host_side(tmp_path):
    """benchmarks/exp_split_waves.py before the GPU: its lists (bench_decode.parse_ints, which bench_multi_gpu.py
    shares) refuse what is not a positive integer, naming the flag; its timeline reads the last start and the tail
    from the CTAs' (start, end, SM) rows; it reads exp_dense_tune.py's jsonl as {(B, the plan's splits): mean µs}."""
    import exp_split_waves as esw

    assert esw.parse_ints("1, 2,16", "--splits") == [1, 2, 16]
    assert esw.parse_ints("32K", "--sizes") == [32768]
    for bad in ("", "0,2", "a", "2,-1"):
        with pytest.raises(ValueError, match="--splits must be comma-separated positive integers"):
            esw.parse_ints(bad, "--splits")
    rows = np.array([[1000, 11000, 0], [3000, 12000, 1], [1000, 30000, 2]], dtype=np.uint64)
    assert esw.timeline(rows) == (2.0, 18.0)  # starts 1, 3, 1 µs; ends 11, 12, 30: median 12
    path = tmp_path / "s53.jsonl"
    runs = (dict(B=5, plan_splits=3, us=10.0), dict(B=5, plan_splits=3, us=12.0), dict(B=6, plan_splits=2, us=7.0))
    path.write_text("".join(json.dumps(r) + "\n" for r in runs))
    assert esw.split_build_us(str(path)) == {(5, 3): 11.0, (6, 2): 7.0}
    assert esw.split_build_us(None) == {}


def test_sass_size_builds_are_the_librarys():
    """sass_size.py's BUILDS (the decode builds whose digests a switch must leave unchanged) launch as
    psa_fast._kernels.decode would build them: warps and stages from decode_config for the warps the plan asks
    (default_warps: dense at D 64 takes 4), the windowed stream where the head dim allows it, pairs as the library
    sets them, the push exchanges on the clusters where they fit; every build named once, at each of the three head
    dims."""
    import sass_size
    from psa_fast import _kernels

    assert {b["D"] for b in sass_size.BUILDS.values()} == {64, 128, 256}
    for name, b in sass_size.BUILDS.items():
        mode = "dense" if b.get("SPLIT") else "psa"
        want = _kernels.default_warps(b["D"], mode)
        _, warps, stages, _ = _kernels.decode_config(d=b["D"], s=b["S"], g=b["G"], version=3, warps=want)
        assert (b["WARPS"], b["STAGES"]) == (warps, stages), name
        assert b["STREAM_WINDOW"] == int(b["D"] <= _kernels.DECODE_STREAM_WINDOW), name
        assert b["PAIR"] == _kernels.DECODE_PAIR and b["QPARTS"] == (3 if b.get("BF16") else 2), name
        smem = _kernels.decode_config(d=b["D"], s=b["S"], g=b["G"], version=3, warps=want)[3]
        pushes = bool(_kernels.DECODE_PUSH) and _kernels.push_fits(cluster=b["CLUSTER"], g=b["G"], d=b["D"], smem=smem)
        assert b.get("PUSH", 0) == int(pushes), name


def test_sass_mix_groups_the_source_page_by_opcode_and_by_times_run(tmp_path):
    """benchmarks/sass_mix.py: an ncu source-page CSV (comment lines skipped) gives the dynamic mix by opcode (the
    predicate and modifiers dropped) and the lines grouped by execution count, the largest share first; a CSV of
    another page is refused with the missing column named."""
    import sass_mix

    csv_path = tmp_path / "src.csv"
    csv_path.write_text(
        "# ncu source page\n"
        "Address,Source,Warp Stall Sampling (All Samples),Instructions Executed\n"
        '0x0,"      LDC R1, c[0x0][0x28]",3,512\n'
        '0x10,"      HMMA.16816.F32 R4, R8, R12, R4",5,"5,376"\n'
        '0x20,"@!P0 HMMA.16816.F32 R4, R8, R14, R4",1,"5,376"\n'
        '0x30,"      FADD R4, R4, R20",0,"5,376"\n'
        '0x40,"      EXIT",0,512\n')
    lines = sass_mix.load(csv_path)
    assert lines[1] == ("HMMA", 5376, 5) and lines[2] == ("HMMA", 5376, 1)
    assert sass_mix.mix(lines) == {"HMMA": 10752, "FADD": 5376, "LDC": 512, "EXIT": 512}
    groups = sass_mix.by_count(lines)
    assert [(g["count"], g["lines"]) for g in groups] == [(5376, 3), (512, 2)]
    assert abs(sum(g["share"] for g in groups) - 1) < 1e-12 and groups[0]["ops"][0] == ("HMMA", 2)
    bad = tmp_path / "bad.csv"
    bad.write_text("ID,Kernel Name,Duration\n1,psa_decode,3\n")
    with pytest.raises(ValueError, match="'Source' column"):
        sass_mix.load(bad)


def test_host_overhead_lists_the_functions_with_the_most_own_time():
    """exp_host_overhead.top_functions: a cProfile of N calls becomes (file:line(function), own µs a call,
    cumulative µs a call) rows, the most own time first, cut to n; a function that does the work outranks its
    caller, whose cumulative time holds it."""
    import cProfile

    import exp_host_overhead as eho

    def busy():
        return sum(i * i for i in range(20000))

    def caller():
        return busy()

    profile = cProfile.Profile()
    profile.enable()
    for _ in range(5):
        caller()
    profile.disable()
    rows = eho.top_functions(profile, 5, n=3)
    assert len(rows) == 3 and all(r[1] >= s[1] for r, s in zip(rows, rows[1:]))
    names = [r[0] for r in rows]
    assert any("(<genexpr>)" in n or "(busy)" in n for n in names[:2])
    by_name = {r[0].split("(")[-1]: r for r in eho.top_functions(profile, 5, n=50)}
    assert by_name["caller)"][2] >= by_name["busy)"][2] > 0 and "test_bench_decode.py:" in by_name["busy)"][0]


def test_order_head_rows_grow_with_the_multiple_and_hold_shares():
    """exp_order_head (CPU, psa_ref): on the shipped trace, one row per (step, multiple); a larger multiple of the
    predicted prefix gives a head at least as long that the loop stays within at least as often; every share lies in
    [0, 1] and the head is never shorter than the predicted prefix."""
    import exp_order_head as eoh
    from psa_ref.trace import load_trace

    rows = eoh.head_rows(load_trace(), metadata="cuboid_mean", stop="ema", steps=[4, 16], multiples=[1, 2, 4])
    assert [(r["step"], r["multiple"]) for r in rows] == [(s, m) for s in (4, 16) for m in (1, 2, 4)]
    for r in rows:
        assert all(0 <= r[key] <= 1 for key in ("read", "read_p90", "predicted", "head", "within"))
        assert r["head"] >= r["predicted"] - 1e-12 and r["read_p90"] >= r["read"] - 1e-12
    for s in (4, 16):
        mine = [r for r in rows if r["step"] == s]
        assert all(a["head"] <= b["head"] and a["within"] <= b["within"] for a, b in zip(mine, mine[1:]))


def test_growing_chunks_split_the_order_like_the_reference_and_grow():
    """exp_step_growth.growing_chunks: growth 1 is psa_ref's split_chunks (forced blocks first, then chunks of step);
    growth 2 doubles each ranked chunk (rounded up, the last what is left); every block once, in order; growth < 1 is
    refused."""
    import exp_step_growth as esg
    from psa_ref.progressive import split_chunks

    order = np.arange(100)[::-1].copy()
    for forced in (0, 3):
        same = esg.growing_chunks(order, forced, 7, 1.0)
        assert [c.tolist() for c in same] == [c.tolist() for c in split_chunks(order, forced, 7)]
    grown = esg.growing_chunks(order, 3, 5, 2.0)
    assert [len(c) for c in grown] == [3, 5, 10, 20, 40, 22]
    assert np.concatenate(grown).tolist() == order.tolist()
    assert [len(c) for c in esg.growing_chunks(order, 0, 10, 1.5)] == [10, 15, 23, 34, 18]
    with pytest.raises(ValueError, match="growth must be >= 1"):
        esg.growing_chunks(order, 0, 4, 0.5)


def test_step_growth_rows_on_the_shipped_trace():
    """exp_step_growth.schedule_rows (CPU, psa_ref) on the shipped trace: one row per (step, growth); growth 1 at a
    step matches psa_ref.attention's iterations; a batch's slowest group takes at least the mean iterations and its
    largest read at least the mean read; shares lie in [0, 1]."""
    import exp_step_growth as esg
    import psa_ref
    from psa_ref.trace import load_trace

    trace = load_trace()
    rows = esg.schedule_rows(trace, metadata="cuboid_mean", stop="ema", steps=[8], growths=[1, 2], batch=4)
    assert [(r["step"], r["growth"]) for r in rows] == [(8, 1), (8, 2)]
    for r in rows:
        assert 0 < r["read"] <= 1 and 0 < r["batch_read"] <= r["batch_read_max"] <= 1
        assert r["batch_iterations"] >= r["iterations"] - 1e-12 and r["batches"] == r["queries"] // 4
    blocks = psa_ref.KVBlocks.from_dense(trace.k[0].astype(np.float32), trace.v[0].astype(np.float32),
                                         block_size=16, metadata="cuboid_mean")
    its = [int(psa_ref.attention(trace.q[0, i].astype(np.float32), blocks, 0.95, scale=trace.scale, stop="ema",
                                 step=8, sink_blocks=1, recent_blocks=2).iterations[0])
           for i in range(trace.q.shape[1])]
    assert rows[0]["iterations"] == pytest.approx(np.mean(its))
    assert rows[1]["iterations"] < rows[0]["iterations"]  # (on this trace: growing chunks take fewer iterations)
    # a predicted first chunk: psa_ref's first_chunk="predicted" at that step (growth 1 only)
    rows = esg.schedule_rows(trace, metadata="cuboid_mean", stop="ema", steps=[8], growths=[1, 2], batch=4,
                             firsts=(None, "predicted"))
    assert [(r["growth"], r["first"]) for r in rows] == [(1, "-"), (1, "predicted"), (2, "-")]
    its = [int(psa_ref.attention(trace.q[0, i].astype(np.float32), blocks, 0.95, scale=trace.scale, stop="ema",
                                 step=8, sink_blocks=1, recent_blocks=2, first_chunk="predicted").iterations[0])
           for i in range(trace.q.shape[1])]
    assert rows[1]["iterations"] == pytest.approx(np.mean(its))


def test_first_margin_rows_on_a_one_head_layer():
    """exp_first_margin.margin_rows (CPU, psa_ref) on a drawn layer of one KV head: margin 1 is psa_ref's
    first_chunk="predicted" (its iterations, reads and error against dense); a margin past every block reads them all
    in the first ranked chunk (two iterations: the forced chunk, then that one); ``predict_at`` is psa_ref's loop with
    an integer first chunk, the prefix that holds that tau of the estimated mass; psa_ref's first_chunk_size is
    restored after. A trace of several KV heads is a ValueError."""
    from types import SimpleNamespace

    import exp_first_margin as efm
    import psa_ref
    from psa_ref import progressive

    rng = np.random.default_rng(5)
    t, d = 40 * 16 + 3, 32
    k = rng.standard_normal((1, 1, t, d)).astype(np.float32)
    k[0, 0, 100:140] += 1.5  # a few heavy blocks, so the prediction is short of every block
    v = rng.standard_normal((1, 1, t, d)).astype(np.float32)
    q = rng.standard_normal((1, 8, 4, d)).astype(np.float32)
    q[0, :, :] += 0.5 * k[0, 0, 100:140].mean(0)  # (heavy, not all the mass: the first chunks vary with tau)
    trace = SimpleNamespace(k=k, v=v, q=q, scale=1 / np.sqrt(d))
    original = progressive.first_chunk_size
    rows = efm.margin_rows(trace, margins=[1.0, 100.0], step=4, batch=4)
    assert progressive.first_chunk_size is original
    blocks = psa_ref.KVBlocks.from_dense(k[0], v[0], block_size=16, metadata="quant3")
    res = [psa_ref.attention(q[0, i], blocks, 0.95, scale=trace.scale, step=4, sink_blocks=1, recent_blocks=2,
                             first_chunk="predicted", rank="share") for i in range(8)]
    assert rows[0]["iterations"] == pytest.approx(np.mean([int(r.iterations[0]) for r in res]))
    assert rows[0]["read"] == pytest.approx(np.mean([len(r.blocks_used[0]) / blocks.num_blocks for r in res]))
    dense = [psa_ref.dense_attention(q[0, i], k[0], v[0], scale=trace.scale) for i in range(8)]
    errs = [np.linalg.norm(r.output - want) / np.linalg.norm(want) for r, want in zip(res, dense)]
    assert rows[0]["error"] == pytest.approx(np.mean(errs))
    assert rows[0]["read"] < 1 and rows[1]["read"] == 1.0 and rows[1]["iterations"] == 2
    assert rows[0]["batch_iterations"] >= rows[0]["iterations"] and rows[0]["batches"] == 2
    # predicting for a higher tau (margin 1): psa_ref's loop with the first chunk that holds 0.99 of each query's
    # estimated mass along the share rank's order, as an integer first_chunk
    from psa_ref._problem import prepare
    from psa_ref.scoring import group_rank_key, processing_order

    more = efm.margin_rows(trace, margins=[1.0], step=4, batch=4, predict_at=[0.99])
    assert [(r["margin"], r["predict_at"]) for r in more] == [(1.0, 0.95), (1.0, 0.99)]
    assert more[0]["read"] == rows[0]["read"]
    used, grew = [], 0
    for i in range(8):
        p = prepare(q[0, i], blocks, scale=trace.scale, gqa="shared", sink_blocks=1, recent_blocks=2, exact_mass=False)
        order = processing_order(group_rank_key(p.scores, blocks.block_lengths, "share"), p.forced)
        size = progressive.predicted_first_chunk(p.scores, order, p.forced.size, blocks.block_lengths, 0.99)
        grew += size > progressive.predicted_first_chunk(p.scores, order, p.forced.size, blocks.block_lengths, 0.95)
        r = psa_ref.attention(q[0, i], blocks, 0.95, scale=trace.scale, step=4, sink_blocks=1, recent_blocks=2,
                              first_chunk=size or None, rank="share")
        used.append(len(r.blocks_used[0]) / blocks.num_blocks)
    assert grew > 0  # (the higher tau moves some query's first chunk)
    assert more[1]["read"] == pytest.approx(np.mean(used))
    with pytest.raises(ValueError, match="one KV head"):
        efm.margin_rows(SimpleNamespace(k=np.zeros((1, 2, t, d)), v=np.zeros((1, 2, t, d)), q=q, scale=1.0),
                        margins=[1.0], step=4, batch=4)


def test_first_chunk_experiment_prints_accuracy_md_s_rows(capsys):
    """exp_first_chunk.py (CPU, psa_ref) at step 8 on the shipped trace prints the rows docs/accuracy.md quotes."""
    import exp_first_chunk

    exp_first_chunk.main(["--steps", "8"])
    out = capsys.readouterr().out
    doc = (Path(__file__).parent.parent / "docs" / "accuracy.md").read_text()
    for schedule in ("step 8", "predicted, then 8"):
        row = next(line for line in out.splitlines() if line.startswith(f"| {schedule} |"))
        assert f"| `ema` |{row[1:]}" in doc, row


def test_residual_past_the_predicted_chunk_is_the_fewest_blocks_that_stop():
    """exp_first_chunk.residual_shares (CPU, psa_ref): what a group attends past its predicted first chunk is the
    smallest number of extra blocks e for which an integer first chunk of (prediction + e) stops right after it;
    one block fewer does not stop there. Checked on two positions of the shipped trace, every KV-head group."""
    import exp_first_chunk
    import psa_ref
    from psa_ref import sweep
    from psa_ref.progressive import predicted_first_chunk
    from psa_ref.scoring import forced_blocks, processing_order
    from psa_ref.trace import load_trace

    trace = load_trace(None)
    cases = [(0, 5), (1, 30)]  # residuals of 10-16 blocks, and of 0-3
    opts = dict(metadata="quant3", stop="sketch_avg", tau=0.95, sink=1, recent=2)
    shares = exp_first_chunk.residual_shares(trace, cases, **opts)
    seen = []
    for li, pi in cases:
        q, k, v = (a.astype(np.float64) for a in trace.case(li, pi))
        blocks = psa_ref.KVBlocks.from_dense(k, v, block_size=16, metadata="quant3", kv_layout="HND")
        g = q.shape[0] // k.shape[0]
        forced = forced_blocks(blocks.num_blocks, 1, 2)
        scores = psa_ref.estimate(q, blocks, trace.scale)
        for kv in range(k.shape[0]):
            heads = scores[kv * g : (kv + 1) * g]
            order = processing_order(heads.max(axis=0), forced)
            c = predicted_first_chunk(heads, order, forced.size, blocks.block_lengths, 0.95)
            one = psa_ref.KVBlocks.from_dense(k[kv], v[kv], block_size=16, metadata="quant3")

            def stops_at_once(first):
                res = sweep.attention(q[kv * g : (kv + 1) * g], one, 0.95, stop="sketch_avg", scale=trace.scale,
                                      sink_blocks=1, recent_blocks=2, step=1, first_chunk=first)
                return int(np.atleast_1d(res.iterations)[0]) == 2

            e = round(shares[len(seen)] * blocks.num_blocks)
            assert stops_at_once(c + e), (li, pi, kv, c, e)
            assert e == 0 or not stops_at_once(c + e - 1), (li, pi, kv, c, e)
            seen.append(e)
    assert len(seen) == shares.size and min(seen) == 0 and max(seen) >= 10


def test_predicted_profile_experiment_runs_its_schedules(capsys, monkeypatch):
    """exp_predicted_profile.py (CPU, psa_ref) at a tiny size: one row per (step, first chunk) with decisions, reads
    and errors in range; --steps auto takes the plan's two steps (smaller after a predicted chunk); --residual prints
    the share past the prediction beside PREDICTED_SHARE."""
    import exp_predicted_profile as epp
    from psa_fast import _kernels

    epp.main(["--tokens", "2048", "--batch", "2", "--gqa", "shared", "--steps", "4,16"])
    rows = [line.split("|")[1:-1] for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    body = [[c.strip() for c in r] for r in rows[1:]]
    assert [(r[0], r[1]) for r in body] == [("4", "-"), ("4", "predicted"), ("16", "-"), ("16", "predicted")]
    for step, first, mean_it, busiest, read, largest, err in body:
        assert 1 <= float(mean_it) <= int(busiest) <= 128 and 0 < float(read[:-1]) <= float(largest[:-1]) <= 100
        assert 0 <= float(err) < 1
    before = _kernels.num_sms
    plain, predicted = epp.plan_steps(8, "per_head", 2048)
    assert _kernels.num_sms is before  # the H200's values only for the call
    monkeypatch.setattr(_kernels, "num_sms", lambda: 132)
    monkeypatch.setattr(_kernels, "max_active_clusters", epp.h200_active_clusters)
    want = [_kernels.pick_step(8, 32, 2048, cluster=_kernels.pick_cluster(256), warps=8, block_bytes=8192, pairs=True,
                               predicted=p, ceiling_gbs=epp.H200_COPY_GBS) for p in (False, True)]
    assert [plain, predicted] == want and predicted < plain
    epp.main(["--tokens", "2048", "--batch", "2", "--residual"])
    out = capsys.readouterr().out
    assert f"| {_kernels.PREDICTED_SHARE:.2%} |" in out and "| 64 |" in out  # 2 requests x 32 query heads


def test_shared_budgets_bound_a_shared_selection():
    """exp_shared_ideal.shared_budgets on three blocks and two heads that want different blocks: each head alone
    needs its one heavy block, the busiest head one, the union of their sets two, and the shortest prefix of the
    max-share order that gives both heads 0.9 the same two; a third head equal to the first changes nothing but the
    mean."""
    import exp_shared_ideal

    mass = np.array([[0.95, 0.01], [0.01, 0.95], [0.04, 0.04]])
    assert exp_shared_ideal.shared_budgets(mass, 0.9) == (1.0, 1.0, 2.0, 2.0)
    assert exp_shared_ideal.shared_budgets(np.c_[mass, mass[:, :1]], 0.9) == (1.0, 1.0, 2.0, 2.0)
    uneven = np.array([[0.5, 0.9], [0.3, 0.05], [0.2, 0.05]])  # for 0.95 head 0 needs all three blocks, head 1 two
    assert exp_shared_ideal.shared_budgets(uneven, 0.95) == (2.5, 3.0, 3.0, 3.0)


def test_union_chunks_by_hand():
    """exp_union_chunks: a head's blocks cut into its iterations (the forced ones first, then chunks of the step), and
    a loop in step reading the union of the heads' current chunks once (a head that stopped adds nothing; a block two
    heads reach at different iterations is read twice)."""
    import exp_union_chunks as euc

    cut = euc.chunks(np.array([0, 9, 4, 5, 6, 7, 8]), 2, 2)
    assert [c.tolist() for c in cut] == [[0, 9], [4, 5], [6, 7], [8]]
    assert [c.tolist() for c in euc.chunks(np.array([3, 1, 2]), 0, 2)] == [[3, 1], [2]]
    a = euc.chunks(np.array([0, 9, 4, 5, 6]), 2, 2)  # [0 9] [4 5] [6]
    b = euc.chunks(np.array([0, 9, 5, 6]), 2, 2)  # [0 9] [5 6]
    c = euc.chunks(np.array([0, 9, 4]), 2, 2)  # [0 9] [4]
    assert euc.union_reads([a]) == 5
    assert euc.union_reads([a, b, c]) == 2 + 3 + 1  # {0, 9}, {4, 5, 6}, {6}: block 6 read twice
    assert euc.rel_error(np.array([[1.0, 0.0], [0.0, 2.0]]), np.array([[1.0, 0.0], [0.0, 1.0]])) == 0.5


def test_union_chunks_rows_on_a_drawn_layer(tmp_path, capsys):
    """exp_union_chunks on a drawn one-KV-head trace: psa_ref's per-head iterations match the cut (the script checks
    it), the in-step union lies between the final union and the heads' blocks read apart, and a query's row counts
    each selection's blocks as psa_ref returns them."""
    import exp_union_chunks as euc
    import psa_ref

    rng = np.random.default_rng(7)
    t, d, g = 30 * 16 + 5, 32, 4
    k = rng.standard_normal((1, 1, t, d)).astype(np.float16)
    k[0, 0, 64:96] += 1.0
    v = rng.standard_normal((1, 1, t, d)).astype(np.float16)
    q = (rng.standard_normal((1, 3, g, d)) + 2 * k[0, 0, 64:96].astype(np.float64).mean(0)).astype(np.float16)
    np.savez(tmp_path / "trace.npz", q=q, k=k, v=v, positions=np.array([t - 3, t - 2, t - 1]), scale=d ** -0.5)
    kk, vv = k[0, 0].astype(np.float64), v[0, 0].astype(np.float64)
    blocks = psa_ref.KVBlocks.from_dense(kk[None], vv[None], block_size=16, metadata="quant3", kv_layout="HND")
    qq = q[0, 2].astype(np.float64)
    ref = psa_ref.dense_attention(qq, kk[None], vv[None], scale=d ** -0.5, kv_layout="HND")
    row = euc.query_row(qq, blocks, ref, tau=0.9, scale=d ** -0.5, step=3, rank="share", sink=1, recent=1)
    per = psa_ref.attention(qq, blocks, 0.9, scale=d ** -0.5, step=3, gqa="per_head", sink_blocks=1, recent_blocks=1)
    assert row["apart"] == sum(len(u) for u in per.blocks_used)
    assert row["final union"] <= row["in step"] <= row["apart"]
    assert row["heads"] == g and 0 <= row["per-head error"] < 1
    euc.main([str(tmp_path / "trace.npz"), "--step", "3", "--queries", "2", "--tau", "0.9"])
    out = capsys.readouterr().out
    assert "| 2 |" in out and out.count("%") >= 5


def test_the_oracle_stop_on_the_metadata_s_shared_order():
    """exp_shared_ideal: prefix_holding is the fewest leading blocks of an order that give every head tau;
    estimate_orders puts the sink and recent blocks first, then ranks the rest, for every rank of psa_ref's."""
    import exp_shared_ideal
    from psa_ref.scoring import RANKS

    mass = np.array([[0.1, 0.0], [0.8, 0.1], [0.1, 0.9]])
    assert exp_shared_ideal.prefix_holding(mass, np.array([1, 2, 0]), 0.9) == 2
    assert exp_shared_ideal.prefix_holding(mass, np.array([0, 1, 2]), 0.9) == 3
    rng = np.random.default_rng(4)
    keys, values = rng.standard_normal((2, 100, 8))
    orders = exp_shared_ideal.estimate_orders(rng.standard_normal((2, 8)), keys, values, 8 ** -0.5, 16, "quant3", 1, 1)
    assert set(orders) == set(RANKS)
    for order in orders.values():  # 7 blocks: block 0 (sink) and 6 (recent) first, then the other five
        assert order[:2].tolist() == [0, 6] and sorted(order.tolist()) == list(range(7))


def test_exp_append_dumps_each_signature_and_goes_on_without_a_disassembler(tmp_path, capsys):
    """exp_append.py --dump writes a Numba kernel's PTX for each compiled signature and its SASS where nvdisasm runs;
    without nvdisasm it says so and keeps the PTX."""
    import exp_append

    class Kernel:
        def __init__(self, sass_error=None):
            self.sass_error = sass_error

        def inspect_asm(self):
            return {"sig a": "// ptx a", "sig b": "// ptx b"}

        def inspect_sass(self):
            if self.sass_error:
                raise self.sass_error
            return {"sig a": "LDG a", "sig b": "LDG b"}

    exp_append.dump_code(Kernel(), str(tmp_path / "with"))
    assert sorted(p.name for p in (tmp_path / "with").iterdir()) == ["append_0.ptx", "append_0.sass", "append_1.ptx",
                                                                      "append_1.sass"]
    assert (tmp_path / "with" / "append_1.sass").read_text() == "LDG b"
    exp_append.dump_code(Kernel(FileNotFoundError("nvdisasm")), str(tmp_path / "without"))
    assert sorted(p.name for p in (tmp_path / "without").iterdir()) == ["append_0.ptx", "append_1.ptx"]
    assert "no SASS: nvdisasm" in capsys.readouterr().out


def test_the_append_kernel_compiles_for_sm90_at_each_key_tile():
    """benchmarks/numba_ptx.py compiles psa_fast.metadata's append kernel to sm_90 PTX without a GPU (where NVVM and
    NVRTC are found: CUDA_HOME and LD_LIBRARY_PATH as its docstring says; otherwise skipped): the default build and
    KEY_TILE 1 and 4 compile, a larger tile issues more loads (its constant loops unrolled) and at least a tile of
    quant3's code atomics, and each kind's kernel holds that kind's code alone (cuboid_mean's no atomic; with ptxas on
    PATH, its instruction counts stay well below the one kernel of every kind's, without spills)."""
    counts = {}
    sass = ["--sass"] if shutil.which("ptxas") else []
    for tile, kind in ((1, "quant3"), (4, "quant3"), (16, "quant3"), (16, "cuboid_mean")):
        run = subprocess.run([sys.executable, str(BENCH / "numba_ptx.py"), "--key-tile", str(tile), "--kind", kind]
                             + sass,
                             capture_output=True, text=True, timeout=600,
                             env={**os.environ, "NUMBA_ENABLE_CUDASIM": "0"})
        if run.returncode and re.search(r"Failure finding|CudaSupportError|NvvmSupportError|libnvvm", run.stderr):
            pytest.skip("needs NVVM and NVRTC (benchmarks/numba_ptx.py's docstring)")
        assert run.returncode == 0, run.stderr[-2000:]
        counts[tile, kind] = json.loads(run.stdout.strip().splitlines()[-1])
    q3 = [counts[tile, "quant3"] for tile in (1, 4, 16)]
    assert q3[0]["ld.global"] < q3[1]["ld.global"] < q3[2]["ld.global"]
    assert q3[0]["atom"] < q3[2]["atom"] and q3[2]["atom"] >= 16
    assert counts[16, "cuboid_mean"]["atom"] == 0 and counts[16, "cuboid_mean"]["lines"] < q3[2]["lines"]
    if sass:  # one kernel of every kind was 9,472 instructions at tile 16 (quant3's alone is 3,640), no spill
        assert q3[2]["instructions"] < 5000 and counts[16, "cuboid_mean"]["instructions"] < 2500
        assert all(c["spill bytes"] == 0 for c in counts.values())


def test_queue_model_times_by_hand():
    """exp_queue_model.simulate on cases worked by hand (t = one block at an even share of the ceiling): one group's
    chunk over every CTA streams at the ceiling under either schedule; a light and a heavy group on the grid leave
    the heavy group's CTAs alone at the end, slower where a CTA cannot speed up (cap 1) and as fast as the queue
    where it can (cap 2); a decision waits between a group's chunks; bad names are refused."""
    import exp_queue_model as eq

    gpu = eq.Gpu(ctas=132, ceiling=3.0e6, cta_cap=1.0, block_bytes=16384, start=1.0, finish=1.0, dt=0.01)
    t = gpu.block_bytes / (gpu.ceiling / gpu.ctas)
    for schedule in ("grid", "queue"):
        got = eq.simulate([[264]], gpu, schedule=schedule, decide=0.0, piece=2, claim=0.0)
        assert got == pytest.approx(2.0 + 2 * t, abs=0.05), schedule
    light_heavy = [[132], [1320]]
    assert eq.simulate(light_heavy, gpu, schedule="grid", decide=0.0) == pytest.approx(2.0 + 20 * t, abs=0.1)
    # (a CTA takes its next piece at the step after one ends: up to dt lost a piece, 11 pieces a CTA here)
    assert eq.simulate(light_heavy, gpu, schedule="queue", decide=0.0, piece=1, claim=0.0) == pytest.approx(
        2.0 + 11 * t, abs=11 * gpu.dt + 0.05)
    fast = eq.Gpu(**{**gpu.__dict__, "cta_cap": 2.0})
    assert eq.simulate(light_heavy, fast, schedule="grid", decide=0.0) == pytest.approx(2.0 + 11 * t, abs=0.1)
    assert eq.simulate([[132, 132]], gpu, schedule="grid", decide=3.0) == pytest.approx(2.0 + 2 * t + 3.0, abs=0.05)
    with pytest.raises(ValueError, match="schedule"):
        eq.simulate([[1]], gpu, schedule="balanced", decide=0.0)
    with pytest.raises(ValueError, match="policy"):
        eq.simulate([[1]], gpu, schedule="queue", decide=0.0, policy="lifo")


def test_queue_model_chunks_are_psa_refs_loop():
    """exp_queue_model.group_chunks on a drawn one-head layer: per query, the chunks sum to the blocks psa_ref's loop
    attends with the same options; the first is the forced blocks and the predicted first chunk together (one chunk
    fewer than psa_ref's iterations, which count the forced chunk apart), the middle ones ``step`` blocks, the last at
    most ``step``; psa_ref's first_chunk_size is restored after."""
    from types import SimpleNamespace

    import exp_queue_model as eq
    import psa_ref
    from psa_ref import progressive

    rng = np.random.default_rng(6)
    t, d = 40 * 16 + 3, 32
    k = rng.standard_normal((1, 1, t, d)).astype(np.float32)
    k[0, 0, 100:140] += 1.5
    v = rng.standard_normal((1, 1, t, d)).astype(np.float32)
    q = rng.standard_normal((1, 6, 4, d)).astype(np.float32)
    q[0, :, :] += 0.5 * k[0, 0, 100:140].mean(0)
    trace = SimpleNamespace(k=k, v=v, q=q, scale=1 / np.sqrt(d))
    original = progressive.first_chunk_size
    chunks = eq.group_chunks(trace, step=4)
    assert progressive.first_chunk_size is original and len(chunks) == 6
    blocks = psa_ref.KVBlocks.from_dense(k[0], v[0], block_size=16, metadata="quant3")
    several = 0
    for i, sizes in enumerate(chunks):
        res = psa_ref.attention(q[0, i], blocks, 0.95, scale=trace.scale, step=4, sink_blocks=1, recent_blocks=2,
                                first_chunk="predicted", rank="share")
        assert sum(sizes) == len(res.blocks_used[0])
        assert len(sizes) == int(res.iterations[0]) - 1
        assert sizes[0] > 3 and all(s == 4 for s in sizes[1:-1]) and 0 < sizes[-1] <= (4 if len(sizes) > 1 else t)
        several += len(sizes) > 1
    assert several  # (some query needs chunks after the predicted one)


@pytest.mark.parametrize("seed", [0, 1])
def test_order_runs_emulation_gives_the_sort_order(seed):
    """benchmarks/emu_order_runs.py (psa_order_runs' network and placement on the CPU) gives the one-CTA sort's order
    on ties, specials, equal and distinct scores, ragged groups and forced blocks (also with runs of 128, the next
    version's), and psa_ref's order where the scores are finite; and the runs before a block's own count its equal
    words (above w - 1), where the words above w alone would count none."""
    import emu_order_runs as emu
    from psa_ref.scoring import forced_blocks, processing_order

    rng = np.random.default_rng(seed)
    for nmax, n, sink, recent in [(2048, 2048, 1, 2), (2048, 1305, 3, 40), (1000, 257, 0, 0), (45, 3, 70, 70)]:
        scores = (rng.integers(-50, 50, nmax) / 4).astype(np.float32)  # many exact ties
        got = emu.order_runs(scores, n, nmax, sink, recent)
        assert got[:n].tolist() == emu.sort_order(scores, n, sink, recent)
        assert got[:n].tolist() == list(processing_order(scores[:n].astype(np.float64),
                                                         forced_blocks(n, sink, recent)))
        assert (got[n:] == -1).all()
    special = rng.choice(np.array([np.inf, -np.inf, np.nan, -0.0, 0.0, 1.0], np.float32), 600)
    assert emu.order_runs(special, 597, 600, 1, 2)[:597].tolist() == emu.sort_order(special, 597, 1, 2)
    assert emu.order_runs(special, 597, 600, 1, 2, run=128)[:597].tolist() == emu.sort_order(special, 597, 1, 2)
    with pytest.raises(ValueError, match="run must be a power of two"):
        emu.order_runs(special, 597, 600, 1, 2, run=96)
    words = emu.words_of(np.repeat(np.float32(1.5), 600), 600, 0, 0)
    runs = [emu.warp_sort_desc(words[w * emu.RUN:(w + 1) * emu.RUN]) for w in range(emu.GROUP_MAX // emu.RUN)]
    # block 300 (run 1, all equal words): 256 blocks of run 0 come first only if equal words there count
    assert emu.count_above(runs[0], int(words[300]) - 1) == 256 and emu.count_above(runs[0], int(words[300])) == 0


def test_order_runs_emulation_of_the_swizzle_keeps_the_order():
    """emu_order_runs.py with the runs in RUN_SWIZZLE's layout (each lane's words permuted, read through run_slot): the
    order is still the one-CTA sort's, ties and zeros included; and the bank model behind the swizzle: a warp's search
    loads cost ~4.7 wavefronts on plain rows, under 1.5 swizzled."""
    import emu_order_runs as emu

    rng = np.random.default_rng(74)
    row = emu.swizzled_row(np.arange(emu.RUN, dtype=np.uint64))
    assert all(row[emu.run_slot(e)] == e for e in range(emu.RUN)) and sorted(row.tolist()) == list(range(emu.RUN))
    for nmax, n, sink, recent in [(2048, 2048, 1, 2), (1000, 257, 0, 0), (300, 299, 3, 40)]:
        scores = (rng.integers(-50, 50, nmax) / 4).astype(np.float32)  # many exact ties
        got = emu.order_runs(scores, n, nmax, sink, recent, swizzle=True)
        assert got[:n].tolist() == emu.sort_order(scores, n, sink, recent) and (got[n:] == -1).all()
    with pytest.raises(ValueError, match="runs of 256"):
        emu.order_runs(scores, n, nmax, sink, recent, run=128, swizzle=True)
    plain, swizzled = emu.search_wavefronts(False, trials=2), emu.search_wavefronts(True, trials=2)
    assert plain > 4 and swizzled < 1.5


def test_estimated_stop_emulation_gives_the_reference_first_chunk():
    """benchmarks/emu_estimated_stop.py: the kernel's runs, folds and rewalk (float64) give psa_ref's first chunk on
    every random group, at two CTA sizes."""
    import emu_estimated_stop as emu

    assert emu.compare(150, 16, 1) == 0
    assert emu.compare(100, 3, 2) == 0


@pytest.mark.parametrize("cluster, threads", [(2, 3), (8, 8), (8, 1)])
def test_estimated_stop_emulation_in_slices_gives_the_reference_first_chunk(cluster, threads):
    """benchmarks/emu_estimated_stop.py: v6's slices (each relative to its own maximum, the folds rescaled to the
    largest of the ranks so far when composed) give psa_ref's first chunk on every random group (float64). When
    written, leaving out the rescaling of a slice's threads' prefixes made 75 of 300 groups differ (8 slices of 8
    threads, seed 1), so the comparison can fail."""
    import emu_estimated_stop as emu

    assert emu.compare(120, threads, 3, cluster) == 0
    assert emu.compare(120, threads, 4, cluster) == 0
    # ascending masses: every rank's maximum exceeds the ones before it, so each composition rescales
    x = np.log(np.array([[0.0625, 0.125, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0]]))
    from psa_ref.progressive import estimated_stop_first_chunk

    want = estimated_stop_first_chunk(x, np.arange(8), 0, np.ones(8), 0.9, "remaining", margin=1.0)
    assert emu.emulate_cluster(x, 8, 0, 0.9, "remaining", 1.0, threads, cluster) == want


# --- exp_first_decisions.py: decisions by first chunk on the drawn profiles (CPU) ---------------------------------

def test_first_decisions_reports_each_schedule_and_the_reference_matches_its_own_margin(capsys):
    """One request of the drawn 5% profile at 4K tokens: every schedule's line, the busiest group's blocks over the
    mean (at least 1), and psa_ref's first_chunk="estimated_stop" (margin 1.25) attends what the script's own x 1.25
    first chunk does, at the same error (the margins' errors put each group's output together)."""
    import exp_first_decisions as efd

    efd.main(["--profile", "sparsity", "--share", "0.05", "--tokens", "4096", "--requests", "1", "--step", "64",
              "--margins", "1.25", "--errors"])
    out = capsys.readouterr().out.splitlines()
    summary = out[out.index(next(x for x in out if x.startswith("# sparsity 0.05"))) + 1:]
    errors = [x for x in summary if " error " in x]
    (busiest,) = [x for x in summary if x.startswith("  busiest group's")]
    summary = [x for x in summary if x not in errors and x != busiest]
    rows = {x[:30].strip(): x for x in summary}  # the label column, 28 wide after two spaces
    # the busiest group reads at least its request's mean (one request: the ratio itself, two decimals)
    ratios = [float(x.strip(" ,")) for x in busiest.split("loop")[1].split("estimated_stop")]
    assert len(ratios) == 2 and all(r >= 1.0 for r in ratios)
    assert set(rows) == {"plain loop", "predicted first chunk", 'first_chunk="estimated_stop"',
                         "ema on estimates x 1.25"}
    assert [x[:30].strip() for x in errors] == ["plain loop", 'first_chunk="estimated_stop"',
                                                "ema on estimates x 1.25"]
    assert all("top-k at that error reads" in x for x in errors)
    tail = (lambda x: x.split("decisions", 1)[1])
    assert tail(rows['first_chunk="estimated_stop"']) == tail(rows["ema on estimates x 1.25"])
    assert errors[1][30:] == errors[2][30:]
    with pytest.raises(SystemExit):
        efd.main(["--step", "0"])


def test_fluid_stream_model_shares_hbm_then_caps_each_cta():
    """exp_first_decisions.fluid_stream_us: two groups of 8 CTAs, HBM 1,000 GB/s shared, a CTA at most 100 GB/s. While
    both stream each CTA gets 1000 / 16 = 62.5 GB/s; the light group (0.5 MB) ends at 1 µs, having read 0.5 MB of
    the heavy one's 2 MB; the heavy one's 8 CTAs then run at their cap (800 GB/s) through the 1.5 MB left: 1.875 µs
    more. 20 CTAs shared out by blocks as speculate="first_chunk" shares its pieces (one each, the other 18 by
    1 : 4, rounded down: 4 and 15) keep HBM busy to the end: 2.5 µs, the HBM line."""
    import exp_first_decisions as efd

    from psa_fast import _kernels

    assert efd.fluid_stream_us([0.5e6, 2e6], [8, 8], 100.0, 1000.0) == pytest.approx(1.0 + 1.5e6 / 800e3)
    assert efd.fluid_stream_us([0.5e6, 2e6], [8, 8], 1000.0, 1000.0) == pytest.approx(2.5)  # HBM-bound throughout
    ctas = _kernels.spec_ranked_pieces([100, 400], 18, _kernels.SPEC_PIECES_MAX)  # (never more CTAs than blocks)
    assert ctas.tolist() == [4, 15]
    assert efd.fluid_stream_us([0.5e6, 2e6], ctas, 100.0, 1000.0) == pytest.approx(2.5)
    assert efd.fluid_stream_us([0.0, 2e6], [0, 4], 100.0, 1000.0) == pytest.approx(5.0)  # a group with none: no CTA
    with pytest.raises(ValueError, match="a CTA or more"):
        efd.fluid_stream_us([1e6], [0], 100.0, 1000.0)


def test_first_decisions_fluid_prints_each_schedule_under_three_launch_shapes(capsys):
    """--fluid: after the summary, the model's line and one line a schedule with the three launch shapes' µs (each a
    positive number; HBM at 2,500 GB/s bounds them from below by the request's bytes)."""
    import exp_first_decisions as efd

    efd.main(["--profile", "sparsity", "--share", "0.05", "--tokens", "4096", "--requests", "1", "--step", "64",
              "--margins", "", "--fluid"])
    out = capsys.readouterr().out.splitlines()
    at = next(i for i, x in enumerate(out) if x.startswith("  fluid model (a CTA <= 48 GB/s, HBM 2500 GB/s shared"))
    for line, label in zip(out[at + 1:at + 3], ("plain loop", 'first_chunk="estimated_stop"')):
        assert line.strip().startswith(label)
        values = [float(part.rsplit(" ", 1)[1]) for part in line.strip()[len(label):].split(",")]
        assert len(values) == 3 and all(v > 0 for v in values)
    with pytest.raises(SystemExit):
        efd.main(["--fluid", "--cta-gbs", "0"])


def test_estimated_stop_margin_option_sets_the_library_margin_and_names_the_rows(monkeypatch):
    """--estimated-stop-margin: a margin > 0 or a parser error; where the run's margin is not the library's own, the
    estimated-stop rows' names carry it (the other first-chunk rows never do)."""
    import bench_decode
    from psa_ref import progressive

    assert bench_decode.parse_args(["--estimated-stop-margin", "1.1"]).estimated_stop_margin == 1.1
    with pytest.raises(SystemExit):
        bench_decode.parse_args(["--estimated-stop-margin", "0"])
    assert bench_decode.first_chunk_label("estimated_stop") == "estimated_stop"
    monkeypatch.setattr(progressive, "ESTIMATED_STOP_MARGIN", 1.1)
    assert bench_decode.first_chunk_label("estimated_stop") == "estimated_stop x1.1"
    assert bench_decode.first_chunk_label("predicted") == "predicted"


# --- exp_metadata_rank.py: how well each summary orders the drawn profiles, and what each rule reads (CPU) ---------

def test_metadata_rank_block_masses_and_oracle_prefix_by_hand():
    """exp_metadata_rank: a block's log mass is the log-sum-exp of its tokens' scaled logits (a partial last block
    holds its own tokens only; query head h reads KV head h // (Hq / Hkv)); the oracle prefix is the fewest leading
    blocks after which every head holds tau of its mass; the attended mass is the least head's share."""
    import exp_metadata_rank as emr

    rng = np.random.default_rng(0)
    q, keys = rng.standard_normal((4, 8)), rng.standard_normal((2, 37, 8))
    got = emr.block_log_masses(q, keys, 0.5, 16)
    assert got.shape == (4, 3)
    for h in range(4):
        logits = 0.5 * keys[h // 2] @ q[h]
        want = [np.log(np.exp(logits[a:a + 16]).sum()) for a in (0, 16, 32)]
        np.testing.assert_allclose(got[h], want, rtol=1e-12)
    # two heads, four blocks: head 0's mass 0.7 / 0.1 / 0.1 / 0.1, head 1's 0.1 / 0.1 / 0.1 / 0.7
    log_mass = np.log(np.array([[0.7, 0.1, 0.1, 0.1], [0.1, 0.1, 0.1, 0.7]]))
    assert emr.oracle_prefix(np.array([0, 3, 1, 2]), log_mass, 0.85) == 3  # 0.9 for both after three blocks
    assert emr.oracle_prefix(np.array([0, 3, 1, 2]), log_mass, 0.75) == 2  # 0.8 after two
    assert emr.oracle_prefix(np.array([0, 1, 2, 3]), log_mass, 0.75) == 4  # head 1 holds 0.3 until its heavy block
    assert emr.oracle_prefix(np.array([0, 3, 1, 2]), log_mass, 0.5) == 2
    assert emr.attended_mass(np.array([0, 3, 1, 2]), 2, log_mass) == pytest.approx(0.8)
    assert emr.attended_mass(np.array([0, 1, 2, 3]), 2, log_mass) == pytest.approx(0.2)
    assert emr.true_order(log_mass).tolist() == [0, 3, 1, 2]  # by the larger share, ties by lower index


def test_metadata_rank_reports_every_summary_and_its_rules(capsys):
    """One request of the drawn 5% profile at 4K tokens: a row for the true order, each metadata's order and each rule
    meant for it (certified on minmax only, the sketch rules on quant3; ema and remaining everywhere). The oracle
    prefixes hold tau by construction, so no metadata's order reads fewer blocks than the true one; every rule reads
    at least its order's oracle prefix (it stops once its own test holds, and the forced blocks come first)."""
    import exp_metadata_rank as emr

    emr.main(["--share", "0.05", "--tokens", "4096", "--requests", "1", "--metadata", "cuboid_mean,minmax,quant3",
              "--stops", "ema,certified,sketch_avg", "--step", "4"])
    out = capsys.readouterr().out.splitlines()
    rows = {x.split("|")[1].strip(): float(x.split("|")[2].strip(" %")) for x in out
            if x.startswith("| ") and "%" in x}
    assert set(rows) == {"true", "cuboid_mean order", "cuboid_mean ema", "minmax order", "minmax ema",
                         "minmax certified", "quant3 order", "quant3 ema", "quant3 sketch_avg"}
    for kind in ("cuboid_mean", "minmax", "quant3"):
        assert rows[f"{kind} order"] >= rows["true"] > 0
        assert rows[f"{kind} ema"] >= rows[f"{kind} order"] - 1e-9
    assert rows["minmax certified"] >= rows["minmax order"]
    with pytest.raises(SystemExit):
        emr.main(["--stops", "nope"])
    with pytest.raises(SystemExit):
        emr.main(["--metadata", "cuboid"])


# --- bench_decode.equal_error_k: top-k's k at PSA's error -----------------------------------------------------------

def test_equal_error_k_bisects_to_the_smallest_k_at_the_target():
    """A falling error curve err(k) = 100 / k: the k at a target is ceil(100 / target), found exactly (the grid
    alone gave the first multiple of the budget past it), each k asked once, and from below the budget too."""
    from bench_decode import equal_error_k

    asked = []

    def err_of(k):
        asked.append(k)
        return 100.0 / k

    assert equal_error_k(err_of, 100 / 130, 100, 2048) == 130  # grid: 125 misses, 150 meets -> bisect (125, 150]
    assert len(asked) == len(set(asked))
    assert equal_error_k(lambda k: 100.0 / k, 100 / 61, 100, 2048) == 61  # the budget meets it: bisect [1, 100]
    assert equal_error_k(lambda k: 1.0, 0.5, 100, 2048) == 2048  # never met: every block, as before
    assert equal_error_k(lambda k: 100.0 / k, 100 / 1500, 100, 1000) == 1000  # the grid reaches n first
    # an error that is not monotone in k: the result meets the target and k - 1 does not
    wiggly = {k: (0.5 if k in (140, 141) else 100.0 / k) for k in range(1, 4000)}
    k = equal_error_k(wiggly.__getitem__, 100 / 142, 100, 3000)
    assert wiggly[k] <= 100 / 142 and wiggly[k - 1] > 100 / 142


# --- plot_topk_line.py: top-k's line at one request, PSA beside it ----------------------------------------------

def test_topk_line_fits_the_rows_and_pairs_psa_with_top_k_at_its_error(tmp_path):
    import plot_topk_line as ptl

    rows = []
    for t, fixed, slope in ((32768, 20.0, 0.02), (131072, 40.0, 0.021)):
        n = t // 16
        for k in (100, 300, 900):
            rows.append(dict(T=t, B=1, profile="per-head", share=None, method=f"top-k k={k} (PSA τ=0.95 budget)",
                             us=fixed + slope * k + (0.3 if k == 300 else 0.0), frac=k / n))
        rows.append(dict(T=t, B=1, profile="per-head", share=None, method="top-k (quant3) k=50 (x budget)", us=1.0,
                         frac=50 / n))  # another cache's top-k: not on the line
        rows.append(dict(T=t, B=1, profile="per-head", share=None, method="PSA τ=0.95", us=fixed + 15, frac=200 / n))
        rows.append(dict(T=t, B=1, profile="per-head", share=None, method="top-k k=300 (error ≤ PSA τ=0.95)",
                         us=fixed + slope * 300, frac=300 / n))
    lines = ptl.fit_topk_line(rows)
    slope, fixed, resid = lines[32768]
    assert slope == pytest.approx(0.02, abs=2e-4) and fixed == pytest.approx(20.1, abs=0.2) and 0.0 < resid < 0.3
    paired = ptl.pairs(rows)
    assert [(p["T"], q["method"]) for p, q in paired] == [(32768, "top-k k=300 (error ≤ PSA τ=0.95)"),
                                                          (131072, "top-k k=300 (error ≤ PSA τ=0.95)")]
    src = tmp_path / "rows.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "line.png"
    ptl.main([str(src), "--out", str(out)])
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000
    with pytest.raises(ValueError, match="no rows of B = 8"):
        ptl.load([str(src)], batch=8)
    with pytest.raises(ValueError, match="a line needs two"):
        ptl.fit_topk_line([r for r in rows if r["method"].startswith("top-k k=100 ")])


def test_topk_line_table_gives_each_psa_row_its_ratio_to_top_k_at_its_error(tmp_path, capsys):
    """plot_topk_line.py --table: PSA rows paired with top-k at their own error within the same size and batch (a
    top-k row of another batch is never taken), the ratio PSA ÷ top-k, the least of each size and batch in bold."""
    import plot_topk_line as ptl

    def row(t, b, method, us):
        return dict(T=t, B=b, profile="per-head", share=None, method=method, us=us, frac=0.3)

    es = "PSA τ=0.95 first chunk estimated_stop, speculated"
    rows = [row(32768, 1, "PSA τ=0.95", 48.0), row(32768, 1, "top-k k=1043 (error ≤ PSA τ=0.95)", 40.0),
            row(32768, 1, es, 50.0), row(32768, 1, f"top-k k=1038 (error ≤ {es})", 50.0),
            row(32768, 8, "PSA τ=0.95", 180.0), row(32768, 8, "top-k k=884 (error ≤ PSA τ=0.95)", 200.0),
            row(131072, 8, "PSA τ=0.95", 640.0),  # its top-k row is missing: left out
            row(131072, 1, "top-k k=9 (error ≤ PSA τ=0.95)", 1.0)]
    table = ptl.ratio_table(rows).splitlines()
    assert table[2:] == [
        "| 32K | 1 | PSA (shared) | 48.0 | k = 1043 | 40.0 | 1.20 |",
        "| 32K | 1 | PSA, first chunk estimated_stop, speculated | 50.0 | k = 1038 | 50.0 | **1.00** |",
        "| 32K | 8 | PSA (shared) | 180.0 | k = 884 | 200.0 | **0.90** |"]
    src = tmp_path / "rows.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    ptl.main([str(src), "--table"])
    assert capsys.readouterr().out.strip().splitlines() == table
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(ValueError, match="no rows of any B"):
        ptl.load([str(empty)], batch=None)


def test_launch_shape_probe_sources_and_configurations():
    """benchmarks/exp_launch_shape.py: its kernel carries the cluster's dims and the body asked for (a cluster
    barrier with its release, or relaxed); barriers only on clusters; bad sizes and bodies are refused by name."""
    import exp_launch_shape as els

    src = els.launch_source(8, "sync")
    assert "__cluster_dims__(8, 1, 1)" in src and "arrive.release" in src
    assert "arrive.relaxed" in els.launch_source(16, "relaxed")
    assert "__cluster_dims__" not in els.launch_source(1, "empty") and "barrier" not in els.launch_source(1, "empty")
    for cluster, body, message in ((1, "sync", "needs cluster >= 2"), (3, "empty", "power of two"),
                                   (32, "empty", "up to 16"), (8, "spin", "body must be one of")):
        with pytest.raises(ValueError, match=message):
            els.launch_source(cluster, body)
    assert els.configurations([1, 8], [0, 212], ["empty", "sync"]) == [
        (1, 0, "empty"), (1, 212, "empty"), (8, 0, "empty"), (8, 0, "sync"), (8, 212, "empty"), (8, 212, "sync")]


@pytest.mark.parametrize("argv,message", [
    (["--clusters", "8,x"], "--clusters, --smem, --after and --carveout take comma-separated integers"),
    (["--carveout", "max"], "--clusters, --smem, --after and --carveout take comma-separated integers"),
    (["--threads", "100"], "--threads a multiple of 32"),
    (["--smem", "0,300"], "--smem and --after take KiB in [0, 227]"),
    (["--after", "228"], "--smem and --after take KiB in [0, 227]"),
    (["--carveout", "101"], "--carveout takes percents in [0, 100], -1 or -2"),
    (["--clusters", "6"], "power of two"),
    (["--bodies", "empty,spin"], "body must be one of")])
def test_launch_shape_probe_rejects_bad_arguments(monkeypatch, capsys, argv, message):
    import exp_launch_shape as els

    monkeypatch.setattr("sys.argv", ["exp_launch_shape.py", *argv])
    with pytest.raises(SystemExit) as exc:
        els.main()
    assert exc.value.code == 2 and message in capsys.readouterr().err


# --- benchmarks/NOTES.md's plan for the next session against device_pending.sh -------------------------------------

def _planned_parts(notes: str) -> list[str]:
    """The ``device_pending.sh NAME`` parts that the last "Prepared for the next session" section of ``notes`` runs."""
    start = notes.rindex("**Prepared for the next session")
    return re.findall(r"device_pending\.sh\s+([A-Za-z0-9_]+)", notes[start:])


def _parts(script: str) -> set[str]:
    """The part names of device_pending.sh (its ``if [ "$PART" = NAME ]`` blocks)."""
    return set(re.findall(r'"\$PART" = ([A-Za-z0-9_]+) \]', script))


def test_the_next_sessions_device_parts_are_on_main():
    """Every device part the notes plan for the next session exists on this checkout: a new checkout carries main
    only, and the seventy-first session's plan named parts of a branch that did not reach the next one."""
    notes = (BENCH / "NOTES.md").read_text()
    parts = _parts((BENCH / "device_pending.sh").read_text())
    assert {"all1", "all2", "run"} <= parts and len(parts) > 100
    planned = _planned_parts(notes)
    assert planned and set(planned) <= parts, sorted(set(planned) - parts)
    # the check sees a part that is missing, and reads the last plan only
    stale = "**Prepared for the next session (x).** run `device_pending.sh s99z`.\n"
    assert _planned_parts(notes + "\n" + stale) == ["s99z"] and "s99z" not in parts


def _device_call(tmp_path: Path, name: str, build: str, kcache_in: Path | None = None) -> tuple[str, Path]:
    """``device_pending.sh run`` as a device call runs it (from the repository root, $OUT a fresh folder), its command
    writing one fake build ``build`` into CuPy's cache and listing what the cache held before; the output and $OUT."""
    out = tmp_path / name
    out.mkdir()
    env = {**os.environ, "OUT": str(out), "KCACHE_IN": str(kcache_in or tmp_path / "none.tgz"),
           "KCACHE_DIR": str(tmp_path / f"{name}_machine")}  # (each call a fresh machine)
    cmd = f'ls "$CUPY_CACHE_DIR"; head -c 700000 /dev/urandom > "$CUPY_CACHE_DIR/{build}_2.cubin"'
    done = subprocess.run(["bash", str(BENCH / "device_pending.sh"), "run", "bash", "-c", cmd], cwd=BENCH.parent,
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout, out


def _kcache(archive: Path, *args: str, mib: int = 96) -> str:
    env = {**os.environ, "KCACHE": str(archive), "KCACHE_MIB": str(mib)}
    done = subprocess.run(["bash", str(BENCH / "kcache.sh"), *args], cwd=BENCH.parent, env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _members(archive: Path) -> set[str]:
    return set(subprocess.run(["tar", "tzf", str(archive)], capture_output=True, text=True, check=True).stdout.split())


@pytest.mark.skipif(shutil.which("tar") is None, reason="needs tar")
def test_the_kernel_cache_travels_to_the_device_and_back(tmp_path):
    """device_pending.sh points CuPy's kernel cache at a folder seeded from the carried archive and brings only the
    call's new builds back ($OUT/kcache.tgz), those of every part a call runs; kcache.sh merges them into the archive,
    newest first within its budget, and refuses a missing archive."""
    carried = tmp_path / "kcache.tgz"
    printed, out = _device_call(tmp_path, "first", "aaa")
    assert "aaa_2.cubin" not in printed.split("kcache:")[0] and "1 new builds" in printed  # (an empty cache)
    assert _members(out / "kcache.tgz") == {"aaa_2.cubin"}
    assert "1 builds" in _kcache(carried, "merge", str(out / "kcache.tgz"))
    printed, out = _device_call(tmp_path, "second", "bbb", kcache_in=carried)
    assert printed.splitlines()[0] == "aaa_2.cubin"  # the earlier call's build, there before this call compiled
    assert _members(out / "kcache.tgz") == {"bbb_2.cubin"}  # only what this call added comes back
    assert "2 builds" in _kcache(carried, "merge", str(out / "kcache.tgz")) and _members(carried) == {
        "aaa_2.cubin", "bbb_2.cubin"}
    # within a 1 MiB budget only the newest of the two 700 KB builds stays: the one brought back last
    assert "1 older ones dropped" in _kcache(carried, "merge", str(out / "kcache.tgz"), mib=1)
    assert _members(carried) == {"bbb_2.cubin"}
    assert "bbb_2.cubin" in _kcache(carried, "list")
    # two parts run in one call share its cache: the second brings back both parts' builds
    env = {**os.environ, "OUT": str(tmp_path / "both"), "KCACHE_IN": str(carried), "KCACHE_DIR": str(tmp_path / "m3")}
    (tmp_path / "both").mkdir()
    for build in ("ccc", "ddd"):
        cmd = f'head -c 1000 /dev/urandom > "$CUPY_CACHE_DIR/{build}_2.cubin"'
        subprocess.run(["bash", str(BENCH / "device_pending.sh"), "run", "bash", "-c", cmd], cwd=BENCH.parent,
                       env=env, capture_output=True, text=True, timeout=60, check=True)
    assert _members(tmp_path / "both" / "kcache.tgz") == {"ccc_2.cubin", "ddd_2.cubin"}
    bad = subprocess.run(["bash", str(BENCH / "kcache.sh"), "merge", str(tmp_path / "missing.tgz")], cwd=BENCH.parent,
                         env={**os.environ, "KCACHE": str(carried)}, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "no archive" in bad.stderr
