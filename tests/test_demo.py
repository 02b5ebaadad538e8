"""The shipped trace and the demo (on a slice of the trace, to stay fast)."""

import dataclasses
import json

import numpy as np
import pytest

from psa_ref.progressive import BLOCK_STOP_RULES
from psa_ref.tools.cli import main as cli_main
from psa_ref.tools.demo import format_table, run_demo, strict_json
from psa_ref.trace import load_trace


@pytest.fixture(scope="module")
def trace():
    return load_trace()


def test_shipped_trace_is_what_the_docs_say(trace):
    n_layers, n_pos, hq, d = trace.q.shape
    assert (hq, d) == (9, 64) and trace.k.shape[1:] == (3, 2048, 64)
    assert trace.q.dtype == np.float16 and trace.k.dtype == np.float16
    assert np.isfinite(trace.q).all() and np.isfinite(trace.k).all() and np.isfinite(trace.v).all()
    assert list(trace.positions) == list(range(2048 - n_pos, 2048))
    assert trace.meta["model"].startswith("HuggingFaceTB/SmolLM2-135M") and trace.scale == 0.125
    q, keys, values = trace.case(0, 0)
    assert keys.shape == (3, int(trace.positions[0]) + 1, 64)


def small(trace):
    return dataclasses.replace(trace, q=trace.q[2:4, -2:], k=trace.k[2:4], v=trace.v[2:4], layers=trace.layers[2:4],
                               positions=trace.positions[-2:])


def test_demo_rows_are_consistent(trace):
    result = run_demo(small(trace), taus=(0.9, 0.99), progress=False)
    rows = {(r.rule, r.tau): r for r in result.rows}
    assert set(rows) == {(r, t) for r in ("ideal", *BLOCK_STOP_RULES) for t in (0.9, 0.99)}
    # certified is a guarantee, on real attention too (I3)
    assert rows["certified", 0.9].mass_p1 >= 0.9 - 1e-9
    for rule in ("ideal", *BLOCK_STOP_RULES):  # a higher threshold never attends fewer blocks
        assert rows[rule, 0.99].blocks >= rows[rule, 0.9].blocks
    # the matched top-k budget really reaches the row's mean error, and k - 1 does not
    for r in result.rows:
        assert result.topk_err[r.topk_k - 1] <= r.err_mean + 1e-12
        assert r.topk_k == 1 or result.topk_err[r.topk_k - 2] > r.err_mean
    table = format_table(result)
    assert table.count("\n") == len(result.rows) + 1 and "| remaining | 0.9 |" in table


def test_both_backends_give_the_same_table(trace):
    """The demo's default backend is the vectorised twin (psa_ref.sweep); the readable loop gives the same table
    (on the whole shipped trace too: checked when the default changed, the README's table digit for digit)."""
    part = small(trace)
    tables = {b: run_demo(part, taus=(0.8, 0.95), progress=False, backend=b) for b in ("sweep", "ref")}
    assert format_table(tables["sweep"]) == format_table(tables["ref"])
    assert tables["sweep"].meta["backend"] == "sweep"
    with pytest.raises(ValueError, match="backend must be one of 'sweep', 'ref'"):
        run_demo(part, progress=False, backend="loop")


def test_cli_demo_writes_table_and_figures(tmp_path, capsys, monkeypatch):
    import psa_ref.tools.demo as demo

    monkeypatch.setattr(demo, "load_trace", lambda path=None: small(load_trace(path)))
    assert cli_main(["demo", "--out", str(tmp_path), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "| rule | τ |" in out and "| certified | 0.95 |" in out
    assert json.loads((tmp_path / "psa_demo.json").read_text())["meta"]["backend"] == "sweep"
    assert cli_main(["demo", "--out", str(tmp_path), "--quiet", "--no-plots", "--backend", "ref"]) == 0
    assert json.loads((tmp_path / "psa_demo.json").read_text())["meta"]["backend"] == "ref"
    for name in ("psa_demo_blocks_cdf.png", "psa_demo_budget_error.png", "psa_demo.json"):
        assert (tmp_path / name).stat().st_size > 1000

    # strict JSON: the ideal rows' unmeasured masses are null, never NaN (which strict parsers reject)
    def reject(constant):
        raise ValueError(f"psa_demo.json contains {constant}, which is not JSON")

    text = (tmp_path / "psa_demo.json").read_text()
    summary = json.loads(text, parse_constant=reject)
    ideal = [r for r in summary["rows"] if r["rule"] == "ideal"]
    assert ideal and all(r["mass_mean"] is None and r["mass_p1"] is None for r in ideal)
    assert all(isinstance(r["mass_mean"], float) for r in summary["rows"] if r["rule"] != "ideal")
    assert '"mass_mean": null' in text


def test_strict_json_replaces_every_non_finite_float():
    x = {"a": [np.nan, 1.5, np.float32(np.inf)], "b": (np.int64(3), -np.inf), "c": {"d": float("nan"), "e": "x"}}
    assert strict_json(x) == {"a": [None, 1.5, None], "b": [3, None], "c": {"d": None, "e": "x"}}
    json.dumps(strict_json(x), allow_nan=False)
