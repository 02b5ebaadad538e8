"""The ``psa`` command's arguments: a bad value is a usage error (exit 2, the argument named) before any work starts,
and good values reach the tools as the numbers they name."""

import pytest

from psa_ref.kvcache import sim as sim_module
from psa_ref.tools import cli, evaluate


@pytest.fixture
def no_work(monkeypatch):
    """The tools' entry points record their keyword arguments instead of loading a trace or a model."""
    calls = []
    monkeypatch.setattr(sim_module, "main", lambda **kw: calls.append(("sim", kw)))
    monkeypatch.setattr(evaluate, "main", lambda **kw: calls.append(("eval", kw)))
    return calls


@pytest.mark.parametrize("argv, argument", [
    (["sim", "--stop", "emaa"], "--stop"),
    (["sim", "--threshold", "1.5"], "--threshold"),
    (["sim", "--threshold", "0"], "--threshold"),
    (["sim", "--threshold", "nan"], "--threshold"),
    (["sim", "--step", "0"], "--step"),
    (["eval", "--rules", "ema,emaa"], "--rules"),
    (["eval", "--rules", ","], "--rules"),
    (["eval", "--taus", "0.9,x"], "--taus"),
    (["eval", "--taus", "0.9,1.2"], "--taus"),
    (["eval", "--topk", "8,0"], "--topk"),
    (["eval", "--contexts", "2048,4k"], "--contexts"),
    (["eval", "--tokens", "-1"], "--tokens"),
    (["eval", "--jobs", "0"], "--jobs"),
    (["eval", "--offset", "-3"], "--offset"),
    (["eval", "--first-chunk", "previous"], "--first-chunk"),
    (["eval", "--first-chunk", "0"], "--first-chunk"),
    (["eval", "--step", "0"], "--step"),
    (["eval", "--step", "auto"], "--step"),
])
def test_bad_arguments_are_usage_errors_before_any_work(no_work, capsys, argv, argument):
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {argument}:" in err and "Traceback" not in err, err
    assert no_work == []


def test_arguments_reach_the_tools_as_numbers(no_work):
    assert cli.main(["sim", "--threshold", "0.9", "--step", "4", "--stop", "remaining", "--no-plots", "--quiet"]) == 0
    assert cli.main(["eval", "--contexts", "1024, 2048", "--rules", "ema,sketch_avg", "--taus", "0.95",
                     "--topk", "4,8", "--tokens", "3", "--no-plots", "--quiet"]) == 0
    (_, sim), (_, ev) = no_work
    assert (sim["threshold"], sim["step"], sim["stop"]) == (0.9, 4, "remaining")
    assert ev["contexts"] == (1024, 2048) and ev["rules"] == ("ema", "sketch_avg") and ev["taus"] == (0.95,)
    assert ev["topk"] == (4, 8) and ev["tokens"] == 3 and ev["first_chunk"] is None
    cli.main(["eval", "--first-chunk", "predicted", "--quiet"])
    cli.main(["eval", "--first-chunk", "12", "--quiet"])
    cli.main(["eval", "--first-chunk", "estimated_stop", "--quiet"])
    assert [kw["first_chunk"] for _, kw in no_work[2:]] == ["predicted", 12, "estimated_stop"]
    cli.main(["eval", "--step", "96", "--quiet"])
    assert no_work[-1][1]["step"] == 96 and ev["step"] == 1


def test_defaults_are_the_tools_defaults(no_work):
    cli.main(["sim", "--quiet"])
    cli.main(["eval", "--quiet"])
    (_, sim), (_, ev) = no_work
    assert "stop" not in sim  # psa_ref's default rule
    assert ev["contexts"] == evaluate.CONTEXTS and ev["rules"] == evaluate.BLOCK_STOP_RULES
    assert ev["taus"] == evaluate.TAUS and ev["topk"] == evaluate.TOPK_LADDER
