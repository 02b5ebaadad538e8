"""benchmarks/plot_rank.py (KL against KV read per rank, docs/accuracy.md's figure at 32K)."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import plot_rank  # noqa: E402


def _eval_json(path, rank, runs, step=320):
    d = dict(model="m", step=step, metadata="quant3", text="t", offset=0, gqa="shared", first_chunk=None, rank=rank,
             runs=[dict(method="dense", context=1024, tau=None, k=None, kv_share=1.0, kl_mean=0.0)] + runs)
    path.write_text(json.dumps(d))
    return str(path)


def _psa(tau, share, kl):
    return dict(method="psa", context=1024, tau=tau, k=None, kv_share=share, kl_mean=kl)


def _topk(k, share, kl):
    return dict(method="topk", context=1024, tau=None, k=k, kv_share=share, kl_mean=kl)


def test_plot_rank_groups_runs_by_rank_and_top_k_and_refuses_mixed_settings(tmp_path):
    a = _eval_json(tmp_path / "a.json", "share", [_psa(0.95, 0.5, 2e-5), _psa(1.0, 1.0, 0.0), _topk(16, 0.5, 3e-4)])
    b = _eval_json(tmp_path / "b.json", "estimate", [_psa(0.98, 0.8, 2e-6), _psa(0.9, 0.6, 7e-5), _topk(8, 0.25, 1e-3)])
    lines, common = plot_rank.load_points([a, b])
    # tau 1 (dense through PSA) is left out; each line sorted by KV read
    assert lines == {"PSA rank=share": [(0.5, 2e-5, 0.95)],
                     "PSA rank=estimate": [(0.6, 7e-5, 0.9), (0.8, 2e-6, 0.98)],
                     "top-k": [(0.25, 1e-3, 8), (0.5, 3e-4, 16)]}
    assert common["context"] == [1024] and common["step"] == 320
    dst = tmp_path / "rank.png"
    plot_rank.main(str(dst), [a, b])
    assert dst.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    c = _eval_json(tmp_path / "c.json", "share", [_psa(0.95, 0.5, 2e-5)], step=144)
    with pytest.raises(ValueError, match="c.json.*step"):
        plot_rank.load_points([a, c])
    with pytest.raises(ValueError, match="paths"):
        plot_rank.load_points([])
