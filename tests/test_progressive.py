"""Stage 3: Algorithm 1, checked on invariants I1-I5 and a worked example."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import psa_ref
from psa_ref.scoring import kv_head_of
from psa_ref.progressive import SKETCH_AVG_SHARE, SKETCH_NEXT_SHARE, split_chunks
from psa_ref.scoring import forced_blocks, processing_order
from psa_ref.testing.strategies import problems, thresholds
from psa_ref.testing import (
    assert_close,
    brute_force_bound,
    brute_force_estimate,
    budget64,
    dense_over_blocks,
    exact_fraction,
    log_block_mass,
    oracle_fractions,
    oracle_sketch,
    used_by_head,
)

ALL_KINDS = psa_ref.METADATA_KINDS  # draw quant3 too: every rule runs on every kind of metadata

# Two float64 evaluations of a stop-rule ratio agree to ~1e-12; a boundary whose ratio
# lies within this distance of the threshold may go either way.
RATIO_SLACK = 1e-9


def run(p, threshold, stop, step):
    b = psa_ref.KVBlocks.from_dense(p.keys, p.values, block_size=p.block_size, metadata=p.metadata)
    res = psa_ref.attention(p.q, b, threshold, stop=stop, step=step, gqa=p.gqa, sink_blocks=p.sink_blocks,
                            recent_blocks=p.recent_blocks, exact_mass=True)
    return b, res


def group_heads(p):
    hq, hkv = p.q.shape[0], p.keys.shape[0]
    g = hq // hkv
    if p.gqa == "per_head":
        return [(h // g, [h]) for h in range(hq)]
    return [(kv, list(range(kv * g, (kv + 1) * g))) for kv in range(hkv)]


@given(problems(dtypes=("float16", "float32", "float64"), metadata=ALL_KINDS), thresholds,
       st.sampled_from(psa_ref.STOP_RULES), st.integers(1, 4))
def test_I1_output_is_dense_attention_over_blocks_used(p, tau, stop, step):
    b, res = run(p, tau, stop, step)
    used = used_by_head(res, p.q.shape[0], p.keys.shape[0], p.gqa)
    kv = kv_head_of(p.q.shape[0], p.keys.shape[0])
    assert res.output.shape == p.q.shape
    for h in range(p.q.shape[0]):
        assert len(set(used[h].tolist())) == used[h].size, "a block was attended twice"
        ref = dense_over_blocks(p.q[h], p.keys[kv[h]], p.values[kv[h]], p.block_size, used[h],
                                1 / np.sqrt(p.q.shape[1]))
        assert_close("output vs dense over blocks_used", res.output[h], ref,
                     rtol=budget64(p.keys.shape[1] * p.q.shape[1]))


@given(problems(metadata=ALL_KINDS), st.sampled_from(psa_ref.STOP_RULES), st.integers(1, 4))
def test_I2_threshold_one_is_dense(p, stop, step):
    b, res = run(p, 1.0, stop, step)
    dense = psa_ref.dense_attention(p.q, p.keys, p.values)
    assert_close("tau=1 output vs dense", res.output, dense, rtol=budget64(p.keys.shape[1] * p.q.shape[1]))
    for u in used_by_head(res, p.q.shape[0], p.keys.shape[0], p.gqa):
        assert sorted(u.tolist()) == list(range(b.num_blocks))


@given(problems(), thresholds, st.integers(1, 4))
def test_I3_certified_attends_at_least_threshold_of_true_mass(p, tau, step):
    b, res = run(p, tau, "certified", step)
    kv = kv_head_of(p.q.shape[0], p.keys.shape[0])
    used = used_by_head(res, p.q.shape[0], p.keys.shape[0], p.gqa)
    for h in range(p.q.shape[0]):
        true = exact_fraction(p.q[h], p.keys[kv[h]], p.block_size, 1 / np.sqrt(p.q.shape[1]), used[h])
        assert true >= tau - RATIO_SLACK, f"head {h}: attended {true:.6f} of the mass < threshold {tau}"
        assert abs(true - res.mass_exact[h]) <= 1e-9


@given(problems(metadata=ALL_KINDS), thresholds, st.sampled_from(psa_ref.STOP_RULES), st.integers(1, 4))
def test_I4_ranked_blocks_in_non_increasing_estimate(p, tau, stop, step):
    b, res = run(p, tau, stop, step)
    scale = 1 / np.sqrt(p.q.shape[1])
    n_forced = len(set(range(min(p.sink_blocks, b.num_blocks))) |
                   set(range(max(b.num_blocks - p.recent_blocks, 0), b.num_blocks)))
    for (kv, heads), used in zip(group_heads(p), res.blocks_used):
        score = np.max([brute_force_estimate(p.q[h], p.keys[kv], p.block_size, scale, p.metadata) for h in heads],
                       axis=0)
        assert set(used[:n_forced].tolist()) == set(range(min(p.sink_blocks, b.num_blocks))) | set(
            range(max(b.num_blocks - p.recent_blocks, 0), b.num_blocks))
        ranked = used[n_forced:]
        tol = 1e-9 * (1 + np.abs(score).max())
        s = score[ranked]
        assert np.all(np.diff(s) <= tol), f"estimates not non-increasing: {s}"
        # exact ties (as the reference computes the estimates) go to the lower block index
        own = psa_ref.estimate(p.q.astype(np.float64), b, scale)[heads].max(axis=0)[ranked]
        tied = own[1:] == own[:-1]
        assert np.all(ranked[1:][tied] > ranked[:-1][tied]), "tie not broken by the lower block index"
        # nothing left unprocessed ranks strictly above a processed block
        rest = np.setdiff1d(np.arange(b.num_blocks), used)
        if ranked.size and rest.size:
            assert score[rest].max() <= s.min() + tol


@given(problems(metadata=ALL_KINDS), thresholds, st.sampled_from(psa_ref.STOP_RULES), st.integers(1, 4))
def test_I5_stop_is_first_boundary_where_rule_holds(p, tau, stop, step):
    b, res = run(p, tau, stop, step)
    scale = 1 / np.sqrt(p.q.shape[1])
    n_forced = len(set(range(min(p.sink_blocks, b.num_blocks))) |
                   set(range(max(b.num_blocks - p.recent_blocks, 0), b.num_blocks)))
    iters = np.atleast_1d(res.iterations)
    for gi, ((kv, heads), used) in enumerate(zip(group_heads(p), res.blocks_used)):
        chunks = split_chunks(used, n_forced, step)
        assert len(chunks) == iters[gi]
        if stop in ("sketch", "sketch_avg"):  # the mass test and the share test, from the brute-force estimates
            share = SKETCH_AVG_SHARE / b.num_blocks if stop == "sketch_avg" else SKETCH_NEXT_SHARE  # lambda
            # the block the loop would attend next: I4 checks the order, so take it from the reference
            order = processing_order(psa_ref.estimate(p.q.astype(np.float64), b, scale)[heads].max(axis=0),
                                     forced_blocks(b.num_blocks, p.sink_blocks, p.recent_blocks))
            nxt = int(order[used.size]) if used.size < b.num_blocks else None
            frac, margin = np.array([
                oracle_sketch(log_block_mass(p.q[h], p.keys[kv], p.block_size, scale), chunks,
                              brute_force_estimate(p.q[h], p.keys[kv], p.block_size, scale, p.metadata)
                              + np.log(b.block_lengths), n_forced, nxt, share=share)
                for h in heads
            ]).transpose(1, 0, 2)  # each [G, iterations]; margin in nats, > 0 where the next block is small
        else:
            frac = np.array([
                oracle_fractions(stop, log_block_mass(p.q[h], p.keys[kv], p.block_size, scale), chunks,
                                 brute_force_bound(p.q[h], p.keys[kv], p.block_size, scale), b.block_lengths)
                for h in heads
            ])  # [G, iterations]
            margin = np.full_like(frac, np.inf)
        holds_low = ((frac >= tau + RATIO_SLACK) & (margin > RATIO_SLACK)).all(axis=0)  # surely holds
        holds_high = ((frac >= tau - RATIO_SLACK) & (margin > -RATIO_SLACK)).all(axis=0)  # may hold
        if tau < 1:
            assert not holds_low[:-1].any(), f"the rule held earlier, at boundary {np.argmax(holds_low)}"
        if res.stop_reason[gi] == "threshold":
            assert holds_high[-1], f"stopped at boundary {len(chunks) - 1} where the rule does not hold"
        else:
            assert res.stop_reason[gi] == "exhausted" and used.size == b.num_blocks
        assert_close("mass_estimate", res.mass_estimate[heads], frac[:, -1], rtol=1e-9, atol=1e-12)


@given(problems(max_tokens=40, metadata=ALL_KINDS), st.sampled_from(psa_ref.STOP_RULES), thresholds)
def test_huge_logits_finite_and_equal_to_dense_over_blocks(p, stop, tau):
    q = p.q.astype(np.float64)
    k = p.keys.astype(np.float64)
    peak = max(np.abs(np.einsum("hd,ktd->hkt", q, k)).max(), 1e-300)
    q = q * (1e4 / peak)  # logits up to +-1e4 at scale 1
    b = psa_ref.KVBlocks.from_dense(k, p.values, block_size=p.block_size, metadata=p.metadata)
    res = psa_ref.attention(q, b, tau, stop=stop, scale=1.0, gqa=p.gqa)
    assert np.isfinite(res.output).all() and np.isfinite(res.mass_estimate).all()
    used = used_by_head(res, q.shape[0], k.shape[0], p.gqa)
    kv = kv_head_of(q.shape[0], k.shape[0])
    for h in range(q.shape[0]):
        ref = dense_over_blocks(q[h], k[kv[h]], p.values[kv[h]], p.block_size, used[h], 1.0)
        assert_close("output at logits 1e4", res.output[h], ref, rtol=1e-9)
    dense = psa_ref.attention(q, b, 1.0, stop=stop, scale=1.0, gqa=p.gqa).output
    assert_close("tau=1 at logits 1e4", dense, psa_ref.dense_attention(q, k, p.values, scale=1.0), rtol=1e-9)


def test_float16_inputs_are_computed_in_float64():
    rng = np.random.default_rng(3)
    k, v = rng.standard_normal((2, 2, 37, 16)).astype(np.float16)
    q = rng.standard_normal((4, 16)).astype(np.float16)
    res = psa_ref.attention(q, psa_ref.KVBlocks.from_dense(k, v, block_size=8), 1.0)
    assert res.output.dtype == np.float64
    assert_close("fp16 inputs", res.output, psa_ref.dense_attention(q.astype(np.float64), k.astype(np.float64),
                                                                       v.astype(np.float64)), rtol=budget64(37 * 16))


def test_single_head_result_has_scalars():
    rng = np.random.default_rng(4)
    k, v = rng.standard_normal((2, 20, 3))
    res = psa_ref.attention(rng.standard_normal(3), psa_ref.KVBlocks.from_dense(k, v, block_size=4), 0.9)
    assert isinstance(res.blocks_used, np.ndarray) and res.blocks_used.dtype == np.int64
    assert isinstance(res.iterations, int) and isinstance(res.stop_reason, str)
    assert isinstance(res.mass_estimate, float) and res.mass_exact is None
    assert res.output.shape == (3,) and res.num_used == res.blocks_used.size


# --- worked example (the same numbers appear in docs/tutorial.md) ------------------------------
# One head, D = 2, q = (1, 0), scale 1: the logit of a token is its first key channel.
# Blocks of S = 2 tokens, exp(logits):   B0 (1, 1)  B1 (8, 4)  B2 (2, 2)  B3 (0.5, 0.5)  B4 (4, 2)
# With two tokens per block and q = (1, 0), every metadata ranks a block by its largest
# logit: order B1, B4, B2, B0, B3. Block masses 12, 6, 4, 2, 1 (total 25); min/max bounds
# n_j * max exp = 16, 8, 4, 2, 1.
# tau = 0.74, step 1:
#   after B1: acc 12, min 12, left 4 -> seed 12/24 = .50, remaining 12/60 = .20, certified 12/(12+15) = .44
#   after B4: acc 18, min 6,  left 3 -> seed 18/24 = .75 STOP, remaining 18/36 = .50, certified 18/25 = .72
#   after B2: acc 22, min 4,  left 2 ->                       remaining 22/30 = .73, certified 22/25 = .88 STOP
#   after B0: acc 24, min 2,  left 1 ->                       remaining 24/26 = .92 STOP
WORKED_EXP_LOGITS = [1, 1, 8, 4, 2, 2, 0.5, 0.5, 4, 2]


def worked_example():
    logits = np.log(np.array(WORKED_EXP_LOGITS))
    keys = np.stack([logits, np.zeros_like(logits)], axis=1)
    values = np.arange(20, dtype=np.float64).reshape(10, 2)
    return np.array([1.0, 0.0]), keys, values


@pytest.mark.parametrize("metadata", psa_ref.METADATA_KINDS)
@pytest.mark.parametrize(
    "stop, blocks, true_mass",
    [("seed", [1, 4], 18 / 25), ("certified", [1, 4, 2], 22 / 25), ("remaining", [1, 4, 2, 0], 24 / 25)],
)
def test_worked_example_stop_index_by_hand(metadata, stop, blocks, true_mass):
    q, keys, values = worked_example()
    b = psa_ref.KVBlocks.from_dense(keys, values, block_size=2, metadata=metadata)
    res = psa_ref.attention(q, b, 0.74, scale=1.0, stop=stop, exact_mass=True)
    assert res.blocks_used.tolist() == blocks
    assert res.iterations == len(blocks) and res.stop_reason == "threshold"
    assert res.mass_exact == pytest.approx(true_mass, rel=1e-12)
    # output: softmax over the attended tokens, by hand
    idx = np.concatenate([[2 * j, 2 * j + 1] for j in blocks])
    w = np.array(WORKED_EXP_LOGITS)[idx]
    assert_close("worked output", res.output, w @ values[idx] / w.sum(), rtol=1e-14)


def test_worked_example_step_two_and_sink():
    q, keys, values = worked_example()
    b = psa_ref.KVBlocks.from_dense(keys, values, block_size=2)
    # step 2: boundaries after {B1, B4} and {B2, B0}; seed holds at the first one (.75)
    res = psa_ref.attention(q, b, 0.74, scale=1.0, stop="seed", step=2)
    assert res.blocks_used.tolist() == [1, 4] and res.iterations == 1
    # remaining with step 2: after {B1,B4}: .50; after {B2,B0}: acc 24, min 2, left 1 -> .92
    res = psa_ref.attention(q, b, 0.74, scale=1.0, stop="remaining", step=2)
    assert res.blocks_used.tolist() == [1, 4, 2, 0] and res.iterations == 2
    # a sink block goes first, in an iteration of its own: B0 then B1 (acc 14, min 2, left 3: 14/20 = .70),
    # then B4 (acc 20, min 2, left 2: 20/24 = .83 STOP)
    res = psa_ref.attention(q, b, 0.74, scale=1.0, stop="remaining", sink_blocks=1)
    assert res.blocks_used.tolist() == [0, 1, 4] and res.iterations == 3
