"""benchmarks/plot_model.py (the tokens/s-vs-context figure of docs/gpu.md) and bench_model's byte floor."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import plot_model  # noqa: E402


def test_plot_model_writes_a_png_per_batch_panel(tmp_path):
    rows = [dict(model="gemma3", context=c, batch=b, method=m, tokens_per_s=b * 1000.0 / (1 + c / 8192))
            for c in (8192, 16384) for b in (1, 8) for m in ("sdpa", "psa0.95")]
    src = tmp_path / "rows.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert plot_model.load_rows(str(src)) == rows
    dst = tmp_path / "tps.png"
    plot_model.main(str(src), str(dst))
    assert dst.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(ValueError, match="no rows"):
        plot_model.main(str(empty), str(tmp_path / "x.png"))


def test_bench_model_floor_counts_the_metadata_each_kind_reads():
    """By hand for a toy model: 2 global layers of 4 (window 8), 1 KV head, D 4, 64 tokens = 4 blocks."""
    torch = pytest.importorskip("torch")
    import bench_model

    class Text:
        num_key_value_heads, head_dim, hidden_size, num_attention_heads, num_hidden_layers = 1, 4, 8, 2, 4
        layer_types = ["sliding_attention", "full_attention"] * 2
        sliding_window = 8

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(10, dtype=torch.bfloat16))  # 20 bytes
            self.config = type("C", (), {"get_text_config": lambda self: Text()})()

    m = Model()
    per_token = 2 * 1 * 4 * 2  # K and V, bf16
    dense = 20 + 2 * (2 * 8 * per_token + 2 * 64 * per_token)
    assert bench_model.floor_bytes(m, 64, 2, 1.0, "sdpa") == dense
    cuboid = 20 + 2 * (2 * 8 * per_token + 2 * 64 * per_token * 0.5 + 2 * 4 * 4 * 4 * 2)
    assert bench_model.floor_bytes(m, 64, 2, 0.5, "psa0.95", metadata="cuboid_mean") == cuboid
    quant3 = 20 + 2 * (2 * 8 * per_token + 2 * 64 * per_token * 0.5 + 2 * 4 * (2 * 4 * 2 + 16 * 4 // 2))
    assert bench_model.floor_bytes(m, 64, 2, 0.5, "psa0.95") == quant3


def test_wilson_interval_of_agreement():
    """bench_model's agreement interval: the Wilson score interval, checked at a worked value (505 of 512 tokens,
    98.6%: about 97.2% to 99.3%), containing the rate, narrowing with more tokens, and 0/n and n/n at the edges."""
    import bench_model

    lo, hi = bench_model.wilson_interval(505, 512)
    assert lo == pytest.approx(0.9721, abs=5e-4) and hi == pytest.approx(0.9934, abs=5e-4)
    lo4, hi4 = bench_model.wilson_interval(4 * 505, 4 * 512)
    assert lo < lo4 < 505 / 512 < hi4 < hi
    assert bench_model.wilson_interval(16, 16)[1] == 1.0 and bench_model.wilson_interval(0, 16)[0] == 0.0
    with pytest.raises(ValueError, match="agree"):
        bench_model.wilson_interval(17, 16)


def test_psa_method_names():
    """bench_model's method names: threshold, speculation margin, chunks speculated past it."""
    pytest.importorskip("torch")
    import bench_model

    assert bench_model.psa_method("psa0.95", 16) == (0.95, None)
    assert bench_model.psa_method("psa0.99s", 16) == (0.99, {"speculate": bench_model.SPECULATE})
    assert bench_model.psa_method("psa0.95s1.5", 16) == (0.95, {"speculate": 1.5})
    assert bench_model.psa_method("psa0.95s1.0x4", 16) == (0.95, {"speculate": 1.0, "speculate_extra": 64})
    for bad in ("psa", "psa0.9s1.0x", "psa0.95s1.0x2.5", "psaXs1"):
        with pytest.raises(ValueError, match="expected psa<tau>"):
            bench_model.psa_method(bad, 16)


def test_step_argument_takes_a_positive_integer_or_auto():
    """bench_model --step: blocks an iteration, or "auto" (DecodePlan's pick through PSAConfig)."""
    import argparse

    pytest.importorskip("torch")
    import bench_model

    assert bench_model.step_arg("16") == 16 and bench_model.step_arg("auto") == "auto"
    for bad in ("0", "-3", "1.5", "Auto", ""):
        with pytest.raises(argparse.ArgumentTypeError, match="positive integer or 'auto'"):
            bench_model.step_arg(bad)


def test_bench_model_method_suffixes():
    """--methods entries: +share (rank="share" whatever --rank says) and +first (first_chunk="predicted")."""
    import bench_model

    assert bench_model.method_options("psa0.95s1.0", "estimate") == ("psa0.95s1.0", "estimate", None)
    assert bench_model.method_options("psa0.95+share", "estimate") == ("psa0.95", "share", None)
    assert bench_model.method_options("psa0.95+first+share", "estimate") == ("psa0.95", "share", "predicted")
    for bad, words in (("psa0.95+fast", "suffixes are"), ("topk+first", "has none")):
        with pytest.raises(ValueError, match=words):
            bench_model.method_options(bad, "estimate")
