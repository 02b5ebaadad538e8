"""first_chunk: the size of the first ranked iteration (a fixed count, or predicted from the estimates).

The schedule moves the boundaries where the stop rule is tested and nothing else: the order, the
rules and the output's definition are those of Algorithm 1, so every invariant is checked again
with the new boundaries (psa_ref.testing.conformance.check_result takes first_chunk).
"""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import psa_ref
from psa_ref import sweep
from psa_ref.progressive import (ESTIMATED_STOP_MARGIN, estimated_stop_first_chunk, predicted_first_chunk,
                                 previous_first_chunk, split_chunks)
from psa_ref.scoring import processing_order
from psa_ref.testing import exact_fraction
from psa_ref.testing.conformance import check_result
from psa_ref.testing.strategies import problems, thresholds

# Two float64 evaluations of a stop-rule ratio agree to ~1e-12; a boundary whose ratio lies this close to
# the threshold may go either way (as in tests/test_stop_rules.py).
RATIO_SLACK = 1e-9
FIRST = st.one_of(st.none(), st.integers(1, 6), st.just("predicted"))


def blocks_of(p, block_size=None):
    return psa_ref.KVBlocks.from_dense(p.keys, p.values, block_size=block_size or p.block_size, metadata=p.metadata,
                                       kv_layout="HND")


def test_split_chunks_with_a_first_chunk():
    order = np.arange(10)
    assert [c.tolist() for c in split_chunks(order, 2, 3, first=4)] == [[0, 1], [2, 3, 4, 5], [6, 7, 8], [9]]
    assert [c.tolist() for c in split_chunks(order, 0, 4, first=1)] == [[0], [1, 2, 3, 4], [5, 6, 7, 8], [9]]
    assert [c.tolist() for c in split_chunks(order, 2, 3, first=20)] == [[0, 1], list(range(2, 10))]
    assert [c.tolist() for c in split_chunks(order, 2, 3)] == [[0, 1], [2, 3, 4], [5, 6, 7], [8, 9]]
    assert [c.tolist() for c in split_chunks(order[:2], 2, 3, first=4)] == [[0, 1]]  # no ranked block: no chunk


def test_predicted_first_chunk_by_hand():
    """Blocks of 2, 2, 1 tokens; estimates log 4, log 1, log 2 give estimated masses 8, 2, 2 (total 12).
    In the order [0, 2, 1]: prefixes hold 8/12, 10/12, 12/12."""
    scores = np.log([[4.0, 1.0, 2.0]])
    lengths = np.array([2, 2, 1])
    order = np.array([0, 2, 1])
    assert predicted_first_chunk(scores, order, 0, lengths, 0.6) == 1
    assert predicted_first_chunk(scores, order, 0, lengths, 0.8) == 2
    assert predicted_first_chunk(scores, order, 0, lengths, 10 / 12) == 2  # exactly tau counts
    assert predicted_first_chunk(scores, order, 0, lengths, 0.9) == 3
    assert predicted_first_chunk(scores, order, 1, lengths, 0.6) == 0  # the forced block 0 alone holds 2/3
    assert predicted_first_chunk(scores, order, 1, lengths, 0.8) == 1
    assert predicted_first_chunk(scores, order, 0, lengths, 1.0) == 0  # tau = 1: every block in the usual steps
    # two heads sharing the order: the count that satisfies both
    two = np.log([[4.0, 1.0, 2.0], [1.0, 4.0, 1.0]])  # head 1's masses in order: 2, 1, 8 -> needs all three
    assert predicted_first_chunk(two, order, 0, lengths, 0.6) == 3


@given(problems(metadata=psa_ref.METADATA_KINDS), thresholds, st.sampled_from(psa_ref.STOP_RULES),
       st.integers(1, 4), FIRST)
def test_every_invariant_holds_with_the_first_chunk(p, tau, stop, step, first):
    """I1, I4 and I5 (the stop is the first of the new boundaries where the rule holds) against the
    contract; the vectorised twin gives the same blocks."""
    b = blocks_of(p)
    opts = dict(gqa=p.gqa, sink_blocks=p.sink_blocks, recent_blocks=p.recent_blocks)
    res = psa_ref.attention(p.q, b, tau, stop=stop, step=step, first_chunk=first, **opts)
    check_result(res, p.q, p.keys, p.values, threshold=tau, stop=stop, step=step, block_size=p.block_size,
                 metadata=p.metadata, first_chunk=first, **opts)
    tw = sweep.attention(p.q, b, tau, stop=stop, step=step, first_chunk=first, **opts)
    groups = (lambda r: r.blocks_used if isinstance(r.blocks_used, list) else [r.blocks_used])
    for gi, (ur, uv) in enumerate(zip(groups(res), groups(tw))):
        if ur.tolist() != uv.tolist():  # only where a ratio sits on the threshold
            assert np.any(np.abs(np.atleast_1d(res.mass_estimate) - tau) <= RATIO_SLACK) or np.any(
                np.abs(np.atleast_1d(tw.mass_estimate) - tau) <= RATIO_SLACK), f"group {gi}: {ur} != {uv}"


@given(problems(), thresholds, st.integers(1, 4), FIRST)
def test_ema_never_stops_before_remaining_on_the_same_schedule(p, tau, step, first):
    """I7 holds for any schedule: both rules are tested at the same boundaries."""
    b = blocks_of(p)
    opts = dict(gqa=p.gqa, sink_blocks=p.sink_blocks, recent_blocks=p.recent_blocks, step=step, first_chunk=first)
    ema = psa_ref.attention(p.q, b, tau, stop="ema", **opts)
    rem = psa_ref.attention(p.q, b, tau, stop="remaining", **opts)
    for e, r in zip(np.atleast_1d(ema.iterations), np.atleast_1d(rem.iterations)):
        assert e >= r


@given(problems(dtypes=("float64",), max_tokens=120), st.floats(0.5, 0.99))
def test_predicted_chunk_holds_tau_of_the_true_mass_when_estimates_are_exact(p, tau):
    """With one token per block, cuboid_mean's estimate is the logit itself (centre = key, radius 0),
    so the predicted prefix holds tau of every head's true mass: the estimates' share is the truth's."""
    b = blocks_of(p, block_size=1)
    res = psa_ref.attention(p.q, b, tau, stop="ema", step=1, first_chunk="predicted", gqa=p.gqa,
                            exact_mass=True)
    hq, hkv = p.q.shape[0], p.keys.shape[0]
    scale = 1 / np.sqrt(p.q.shape[1])
    groups = ([[h] for h in range(hq)] if p.gqa == "per_head" else
              [list(range(kv * (hq // hkv), (kv + 1) * (hq // hkv))) for kv in range(hkv)])
    used = res.blocks_used if isinstance(res.blocks_used, list) else [res.blocks_used]
    scores = psa_ref.estimate(p.q.astype(np.float64), b, scale)  # [Hq, N]
    for heads, u in zip(groups, used):
        kv = heads[0] // (hq // hkv)
        order = processing_order(scores[heads].max(axis=0), np.array([], dtype=np.int64))
        c = predicted_first_chunk(scores[heads], order, 0, b.block_lengths, tau)
        for h in heads:
            frac = exact_fraction(p.q[h].astype(np.float64), p.keys[kv].astype(np.float64), 1, scale, order[:c])
            assert frac >= tau - 1e-9, f"head {h}: the predicted prefix holds {frac:.6f} < tau {tau}"
        assert u.size >= c and set(order[:c].tolist()) <= set(u.tolist())  # the first ranked chunk is read whole


def test_estimated_stop_first_chunk_by_hand():
    """One head, masses halving along the order (8, 4, ..., 1/16), blocks of one token. ``remaining`` after p blocks:
    AS_acc / (AS_acc + (8 - p) AS_min): 15 / 19 = 0.79 after 4, 15.5 / 17 = 0.91 after 5. ``ema`` (weight 1/8) moves
    slowly from 8, so N_left AS_ema stays large: it holds 0.9 only once nothing is left."""
    s = np.log([[8.0, 4.0, 2.0, 1.0, 0.5, 0.25, 0.125, 0.0625]])
    order, ones = np.arange(8), np.ones(8)
    assert estimated_stop_first_chunk(s, order, 0, ones, 0.9, "remaining", margin=1.0) == 5
    assert estimated_stop_first_chunk(s, order, 0, ones, 0.75, "remaining", margin=1.0) == 4  # 0.789 >= 0.75
    assert estimated_stop_first_chunk(s, order, 0, ones, 0.9, "remaining", margin=1.25) == 7  # ceil(6.25)
    assert estimated_stop_first_chunk(s, order, 0, ones, 0.9, "remaining", margin=2.0) == 8  # at most every block
    assert estimated_stop_first_chunk(s, order, 2, ones, 0.9, "remaining", margin=1.0) == 3  # 5 less 2 forced
    assert estimated_stop_first_chunk(s, order, 0, ones, 0.9, "ema", margin=1.0) == 8
    assert estimated_stop_first_chunk(s, order, 0, ones, 1.0, "ema") == 0  # tau 1: every block in the usual steps
    assert estimated_stop_first_chunk(s, order, 8, ones, 0.9, "ema") == 0  # no ranked block
    # the default margin, and the block lengths' part of the estimated mass n_j exp(s_j)
    assert estimated_stop_first_chunk(s, order, 0, ones, 0.9, "remaining") == int(np.ceil(5 * ESTIMATED_STOP_MARGIN))
    flat = np.zeros((1, 3))  # equal estimates, lengths 6, 1, 1: masses 6, 1, 1
    assert estimated_stop_first_chunk(flat, np.arange(3), 0, np.array([6, 1, 1]), 0.7, "remaining", margin=1.0) == 2
    assert estimated_stop_first_chunk(s, order, 0, ones, 0.9, "remaining", margin=0.01) == 1  # never 0 ("step")
    with pytest.raises(ValueError, match="stop must be one of"):
        estimated_stop_first_chunk(s, order, 0, ones, 0.9, "sketch_avg")
    with pytest.raises(ValueError, match="margin must be > 0"):
        estimated_stop_first_chunk(s, order, 0, ones, 0.9, "ema", margin=0.0)


def test_the_estimated_stop_margin_is_read_at_the_call(monkeypatch):
    """ESTIMATED_STOP_MARGIN is read when a first chunk is sized, not when the module is loaded: an experiment that
    sets it moves estimated_stop_first_chunk's default and psa_ref.attention(first_chunk="estimated_stop") with it."""
    from psa_ref import progressive

    s = np.log([[8.0, 4.0, 2.0, 1.0, 0.5, 0.25, 0.125, 0.0625]])
    order, ones = np.arange(8), np.ones(8)
    monkeypatch.setattr(progressive, "ESTIMATED_STOP_MARGIN", 1.0)
    assert estimated_stop_first_chunk(s, order, 0, ones, 0.9, "remaining") == 5
    # one head whose estimates are its true block masses: keys of one token a block along q, values one-hot
    d = 8
    q = np.zeros((1, d))
    q[0, 0] = 1.0
    keys = np.zeros((1, 8, d))
    keys[0, :, 0] = s[0]
    values = np.eye(8, d)[None]
    blocks = psa_ref.KVBlocks.from_dense(keys, values, block_size=1, kv_layout="HND")
    used = {}
    for margin in (1.0, 1.25):
        monkeypatch.setattr(progressive, "ESTIMATED_STOP_MARGIN", margin)
        res = psa_ref.attention(q, blocks, 0.9, scale=1.0, stop="remaining", step=8, first_chunk="estimated_stop")
        used[margin] = int(np.asarray(res.num_used).ravel()[0])
    assert used == {1.0: 5, 1.25: 7}, used  # ceil(5 x margin) ranked blocks, then the rule holds at that boundary


@given(problems(dtypes=("float64",), max_tokens=120), st.floats(0.5, 0.99), st.sampled_from(("ema", "remaining")))
def test_estimated_stop_is_where_the_step_one_loop_stops_when_estimates_are_exact(p, tau, stop):
    """With one token per block cuboid_mean's estimate is the logit itself, so the rule run on the estimated masses
    is the rule run on the true ones: at margin 1 the first chunk is where the loop of step 1 stops (each group's
    ranked blocks), except where a ratio sits on the threshold (two float64 evaluations)."""
    b = blocks_of(p, block_size=1)
    res = psa_ref.attention(p.q, b, tau, stop=stop, step=1, gqa=p.gqa)
    hq, hkv = p.q.shape[0], p.keys.shape[0]
    scale = 1 / np.sqrt(p.q.shape[1])
    groups = ([[h] for h in range(hq)] if p.gqa == "per_head" else
              [list(range(kv * (hq // hkv), (kv + 1) * (hq // hkv))) for kv in range(hkv)])
    used = res.blocks_used if isinstance(res.blocks_used, list) else [res.blocks_used]
    fractions = np.atleast_1d(res.mass_estimate)
    scores = psa_ref.estimate(p.q.astype(np.float64), b, scale)  # [Hq, N]
    for heads, u in zip(groups, used):
        order = processing_order(scores[heads].max(axis=0), np.array([], dtype=np.int64))
        c = estimated_stop_first_chunk(scores[heads], order, 0, b.block_lengths, tau, stop, margin=1.0)
        if c != u.size:
            assert np.any(np.abs(fractions[heads] - tau) <= RATIO_SLACK), f"heads {heads}: {c} != {u.size}"


@given(problems(metadata=psa_ref.METADATA_KINDS), thresholds, st.sampled_from(("ema", "remaining")),
       st.integers(1, 4))
def test_every_invariant_holds_with_the_estimated_stop_first_chunk(p, tau, stop, step):
    """I1, I4, I5 against the contract (conformance recomputes the first chunk from the reference's estimates), and
    the vectorised twin gives the same blocks."""
    b = blocks_of(p)
    opts = dict(gqa=p.gqa, sink_blocks=p.sink_blocks, recent_blocks=p.recent_blocks)
    res = psa_ref.attention(p.q, b, tau, stop=stop, step=step, first_chunk="estimated_stop", **opts)
    check_result(res, p.q, p.keys, p.values, threshold=tau, stop=stop, step=step, block_size=p.block_size,
                 metadata=p.metadata, first_chunk="estimated_stop", **opts)
    tw = sweep.attention(p.q, b, tau, stop=stop, step=step, first_chunk="estimated_stop", **opts)
    groups = (lambda r: r.blocks_used if isinstance(r.blocks_used, list) else [r.blocks_used])
    for gi, (ur, uv) in enumerate(zip(groups(res), groups(tw))):
        if ur.tolist() != uv.tolist():  # only where a ratio sits on the threshold
            assert np.any(np.abs(np.atleast_1d(res.mass_estimate) - tau) <= RATIO_SLACK) or np.any(
                np.abs(np.atleast_1d(tw.mass_estimate) - tau) <= RATIO_SLACK), f"group {gi}: {ur} != {uv}"


def test_estimated_stop_needs_a_rule_of_block_masses():
    b = psa_ref.KVBlocks.from_dense(np.ones((32, 4)), np.ones((32, 4)), block_size=8)
    q = np.ones(4)
    for stop in ("certified", "seed"):
        with pytest.raises(ValueError, match="first_chunk='estimated_stop'.*stop='" + stop):
            psa_ref.attention(q, b, stop=stop, first_chunk="estimated_stop")
    with pytest.raises(ValueError, match="estimated_stop"):
        sweep.attention(q, b, stop="seed", first_chunk="estimated_stop")
    assert psa_ref.attention(q, b, stop="remaining", first_chunk="estimated_stop").iterations >= 1


def test_first_chunk_is_checked():
    b = psa_ref.KVBlocks.from_dense(np.ones((32, 4)), np.ones((32, 4)), block_size=8)
    q = np.ones(4)
    with pytest.raises(ValueError, match="first_chunk must be >= 1"):
        psa_ref.attention(q, b, first_chunk=0)
    with pytest.raises(ValueError, match="first_chunk must be one of"):
        psa_ref.attention(q, b, first_chunk="guess")
    with pytest.raises(TypeError, match="first_chunk"):
        psa_ref.attention(q, b, first_chunk=2.5)
    with pytest.raises(ValueError, match="first_chunk must be >= 1"):
        sweep.attention(q, b, first_chunk=-3)


def test_previous_first_chunk_is_the_last_calls_ranked_blocks_less_a_step():
    assert previous_first_chunk(None, 2, 5) is None  # the first call: the plain schedule
    assert previous_first_chunk(20, 2, 5) == 13
    assert previous_first_chunk(20, 0, 5) == 15
    assert previous_first_chunk(8, 2, 5) == 1
    assert previous_first_chunk(7, 2, 5) is None  # no ranked block left: the plain schedule
    assert previous_first_chunk(0, 0, 1) is None
    with pytest.raises(ValueError, match="step must be >= 1"):
        previous_first_chunk(20, 2, 0)
    with pytest.raises(ValueError, match="blocks_attended must be >= 0"):
        previous_first_chunk(-1, 2, 5)
    with pytest.raises(TypeError, match="num_forced"):
        previous_first_chunk(20, 2.0, 5)


@given(problems(), thresholds, st.sampled_from(psa_ref.STOP_RULES), st.integers(1, 4))
def test_the_previous_stop_keeps_every_invariant_and_never_moves_later_for_the_same_query(p, tau, stop, step):
    """DecodePlan(first_chunk="previous") on one query asked twice: each group's second call, with the first chunk
    its first call's stop gives, is Algorithm 1 on those boundaries (every invariant), and stops no later than the
    first call did: the boundary where the rule held is a boundary again, with the same blocks attended before it,
    and every rule decides from those alone."""
    b = blocks_of(p)
    forced = min(b.num_blocks, p.sink_blocks + p.recent_blocks)
    opts = dict(stop=stop, step=step, gqa=p.gqa, sink_blocks=p.sink_blocks, recent_blocks=p.recent_blocks)

    def groups(res):
        return res.blocks_used if isinstance(res.blocks_used, list) else [res.blocks_used]

    before = groups(psa_ref.attention(p.q, b, tau, **opts))
    for gi, u in enumerate(before):
        first = previous_first_chunk(u.size, forced, step)
        again = psa_ref.attention(p.q, b, tau, **opts, first_chunk=first)
        check_result(again, p.q, p.keys, p.values, threshold=tau, block_size=p.block_size, metadata=p.metadata,
                     first_chunk=first, **opts)
        assert groups(again)[gi].size <= u.size, (gi, first, u.size, groups(again)[gi].size)


def test_a_predicted_chunk_saves_iterations_on_the_shipped_trace():
    """On real attention (the shipped SmolLM2 trace, one layer) the predicted first chunk must cut the
    iterations of step = 1 by a large factor: it is read in one go where the loop took one block at a time."""
    from psa_ref.trace import load_trace

    trace = load_trace()
    q, k, v = (a.astype(np.float64) for a in trace.case(0, 0))
    b = psa_ref.KVBlocks.from_dense(k, v, block_size=16, kv_layout="HND")
    opts = dict(scale=trace.scale, sink_blocks=1, recent_blocks=1, step=1)
    base = psa_ref.attention(q, b, 0.95, **opts)
    pred = psa_ref.attention(q, b, 0.95, first_chunk="predicted", **opts)
    assert np.mean(pred.iterations) * 3 <= np.mean(base.iterations), (pred.iterations, base.iterations)
