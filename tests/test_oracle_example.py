"""The oracle selections of examples/oracle_in_model.py (the bound quoted in docs/accuracy.md)."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("transformers")
spec = importlib.util.spec_from_file_location("oracle_in_model",
                                              Path(__file__).parents[1] / "examples" / "oracle_in_model.py")
oracle = importlib.util.module_from_spec(spec)
spec.loader.exec_module(oracle)

from psa_ref.analysis import blocks_for_mass  # noqa: E402


@pytest.mark.parametrize("seed", range(20))
def test_mass_oracle_is_the_fewest_blocks_holding_tau(seed):
    rng = np.random.default_rng(seed)
    mass = np.exp(rng.normal(scale=2.0, size=(40, 1)))
    tau = rng.uniform(0.5, 0.99)
    chosen = oracle.oracle_selection(mass, tau, np.array([], dtype=int))
    assert chosen.size == blocks_for_mass(mass, tau)[0]
    m = mass[:, 0]
    assert m[chosen].sum() >= tau * m.sum() * (1 - 1e-12)
    assert m[chosen].sum() - m[chosen].min() < tau * m.sum()  # one block fewer is not enough
    forced = np.array([0, 39])
    with_forced = oracle.oracle_selection(mass, tau, forced)
    assert set(forced) <= set(with_forced) and m[with_forced].sum() >= tau * m.sum() * (1 - 1e-12)


def test_mass_oracle_takes_the_union_of_the_heads():
    mass = np.array([[5, 0], [1, 1], [3, 1], [0.5, 6], [0.5, 2]], float)
    assert oracle.oracle_selection(mass, 0.9, np.array([0, 4])).tolist() == [0, 1, 2, 3, 4]
    assert oracle.oracle_selection(mass, 0.5, np.array([0])).tolist() == [0, 3]


@pytest.mark.parametrize("seed", range(10))
def test_output_oracle_stops_at_the_first_prefix_within_delta(seed):
    rng = np.random.default_rng(seed)
    t, d, s = 96, 8, 8
    weights = np.exp(rng.normal(scale=2.0, size=(t, 1)))
    values = rng.normal(size=(t, d))
    starts = np.arange(0, t, s)
    forced = np.array([0])
    dense = (weights * values).sum(axis=0) / weights.sum()

    def error(blocks):
        idx = np.concatenate([np.arange(b * s, b * s + s) for b in blocks])
        out = (weights[idx] * values[idx]).sum(axis=0) / weights[idx].sum()
        return np.linalg.norm(out - dense) / np.linalg.norm(dense)

    block_mass = np.add.reduceat(weights, starts, axis=0)  # [N, 1]
    weighted = np.add.reduceat(weights[:, :, None] * values[:, None, :], starts, axis=0)  # [N, 1, D]

    def select(delta):
        return oracle.output_oracle_selection(block_mass, weighted, delta, forced)

    for delta in (0.3, 0.1, 0.02):
        chosen = select(delta)
        assert 0 in chosen and error(chosen) <= delta
        mass = np.add.reduceat(weights[:, 0], starts)
        lightest = min((b for b in chosen if b != 0), key=lambda b: mass[b], default=None)
        if lightest is not None:  # the prefix one block shorter was not within delta
            assert error([b for b in chosen if b != lightest]) > delta
    assert select(1e9).tolist() == [0]
    assert select(0.0).size == t // s
