"""The decode simulator: selections are the reference's, the replay's counts add up, the CLI runs."""

import dataclasses

import numpy as np
import pytest

import psa_ref
from psa_ref.kvcache import sim
from psa_ref.tools.cli import main as cli_main
from psa_ref.trace import load_trace


def small_trace():
    """Layers 2 and 3 of the shipped trace, its last 4 decode positions (2044..2047)."""
    t = load_trace()
    return dataclasses.replace(t, q=t.q[2:4, -4:], k=t.k[2:4], v=t.v[2:4], layers=t.layers[2:4],
                               positions=t.positions[-4:])


def tiny_synthetic(**kw):
    args = dict(seed=1, num_requests=5, num_layers=2, num_kv_heads=2, group=2, head_dim=16, block_size=8,
                prompt_tokens=(40, 90), decode_steps=(3, 6)) | kw
    return sim.synthetic_workload(**args)


@pytest.fixture(scope="module")
def trace_case():
    trace = small_trace()
    wl = sim.trace_workload(trace)
    return trace, wl, sim.select(wl, "psa", threshold=0.9), sim.select(wl, "topk", k=5, step=2)


@pytest.fixture(scope="module")
def synthetic_case():
    wl = tiny_synthetic()
    # the paper's rule reads few enough blocks that a small pool both hits and evicts (the default,
    # stop="ema", reads so many that a 24-slot pool never hits)
    return wl, sim.select(wl, "psa", threshold=0.9, stop="remaining")


def test_trace_workload_is_one_request_decoding_the_traced_positions(trace_case):
    trace, wl, _, _ = trace_case
    (req,) = wl.requests
    assert req.prompt_keys.shape == (2, 3, 2044, 64) and req.keys.shape == (2, 3, 4, 64)
    assert req.queries.shape == (4, 2, 9, 64) and np.array_equal(req.queries[1, 0], trace.q[0, 1])
    assert wl.layer_names == ["12", "18"] and wl.scale == trace.scale
    with pytest.raises(ValueError, match="trace positions must be consecutive"):
        sim.trace_workload(dataclasses.replace(trace, positions=trace.positions[[0, 2, 3, 1]]))


def test_selections_are_what_the_reference_selects(trace_case):
    """Independent route: KVBlocks.from_dense on the trace's tokens, not the host store's view."""
    trace, wl, psa, topk = trace_case
    for s in range(4):
        for layer in range(2):
            q, keys, values = trace.case(layer, s)
            blocks = psa_ref.KVBlocks.from_dense(keys, values, block_size=16)
            ref = psa_ref.attention(q, blocks, 0.9, scale=trace.scale)
            assert [b.tolist() for b in psa.blocks[0][s][layer]] == [b.tolist() for b in ref.blocks_used]
            ref = psa_ref.topk_attention(q, blocks, 5, scale=trace.scale)
            assert [b.tolist() for b in topk.blocks[0][s][layer]] == [b.tolist() for b in ref.blocks_used]
        assert psa.num_blocks[0][s] == -(-(2045 + s) // 16)
    # chunks: `step` blocks per KV head per iteration, a head that stopped drops out
    chunks = topk.chunks(0, 0, 1)
    assert len(chunks) == 3 and [len(c) for c in chunks] == [6, 6, 3]
    assert [j for h, j in sum(chunks, []) if h == 2] == topk.blocks[0][0][1][2].tolist()


def expected_tokens(wl, sel, r, s, layer):
    """Tokens read at one (request, step, layer), from the selection and the cache length alone."""
    req = wl.requests[r]
    t = req.prompt_keys.shape[2] + s + 1
    return sum(min(wl.block_size, t - j * wl.block_size) for b in sel.blocks[r][s][layer] for j in b)


@pytest.mark.parametrize("pool", sim.POOL_KINDS)
@pytest.mark.parametrize("policy", ["lru", "fifo"])
def test_replay_counts_add_up(synthetic_case, pool, policy):
    wl, sel = synthetic_case
    rep = sim.replay(wl, sel, pool=pool, num_slots=24, policy=policy, max_batch=2)
    reads = sum(b.size for req in sel.blocks for st in req for lay in st for b in lay)
    assert sum(r.blocks for r in rep.records) == reads == rep.stats.accesses == rep.layer_accesses.sum()
    assert all(r.hits + r.misses == r.blocks for r in rep.records)
    assert sum(r.hits for r in rep.records) == rep.stats.hits == rep.layer_hits.sum()
    assert sum(r.bytes_pcie for r in rep.records) == rep.stats.bytes_loaded
    bpt = 2 * wl.head_dim * 2
    assert sum(r.bytes_attended for r in rep.records) == bpt * sum(
        expected_tokens(wl, sel, r, s, layer) for r, req in enumerate(wl.requests)
        for s in range(req.num_steps) for layer in range(wl.num_layers))
    # FCFS, at most two at a time, every step of every request decoded
    assert rep.admitted == list(range(len(wl.requests))) and max(r.batch for r in rep.records) == 2
    assert sum(r.batch for r in rep.records) == sum(req.num_steps for req in wl.requests)
    assert rep.stats.evictions > 0 and 0 < rep.hit_rate < 1


def test_a_pool_that_holds_everything_misses_each_block_once(synthetic_case):
    wl, sel = synthetic_case
    rep = sim.replay(wl, sel, pool="per_layer", num_slots=2 * wl.final_blocks(), max_batch=3)
    distinct = {(r, layer, h, int(j)) for r, req in enumerate(sel.blocks) for st in req
                for layer, lay in enumerate(st) for h, b in enumerate(lay) for j in b}
    assert rep.stats.misses == len(distinct) and rep.stats.evictions == 0


@pytest.mark.parametrize("pool", sim.POOL_KINDS)
def test_lru_hits_never_fall_as_the_pool_grows(synthetic_case, pool):
    """LRU is a stack algorithm: a larger pool holds a superset, so it hits at least as often
    on the same access sequence (FIFO has no such guarantee)."""
    wl, sel = synthetic_case
    reps = [sim.replay(wl, sel, pool=pool, num_slots=n, max_batch=2) for n in (8, 16, 24, 40, 64, 128)]
    assert all(r.admitted == reps[0].admitted and [x.batch for x in r.records] == [x.batch for x in reps[0].records]
               for r in reps)  # the same access sequence
    hits = [r.stats.hits for r in reps]
    assert hits == sorted(hits) and hits[0] < hits[-1]


def test_modelled_time_is_the_formula(synthetic_case):
    wl, sel = synthetic_case
    args = dict(pool="unified", num_slots=16, max_batch=2)
    only_pcie = sim.replay(wl, sel, cost=sim.CostModel(hbm_bytes_per_s=np.inf, pcie_bytes_per_s=1.0,
                                                       iteration_overhead_s=0.0), **args)
    assert [r.seconds for r in only_pcie.records] == [float(r.bytes_pcie) for r in only_pcie.records]
    only_hbm = sim.replay(wl, sel, cost=sim.CostModel(hbm_bytes_per_s=1.0, pcie_bytes_per_s=np.inf,
                                                      iteration_overhead_s=0.0), **args)
    assert [r.seconds for r in only_hbm.records] == [float(r.bytes_attended) for r in only_hbm.records]
    only_overhead = sim.replay(wl, sel, cost=sim.CostModel(hbm_bytes_per_s=np.inf, pcie_bytes_per_s=np.inf,
                                                           iteration_overhead_s=1.0), **args)
    assert [r.seconds for r in only_overhead.records] == [float(r.iterations) for r in only_overhead.records]
    # iterations: the longest loop of the batch at each layer, summed over layers
    first = only_overhead.records[0]
    assert first.iterations == sum(max(len(sel.chunks(r, 0, layer)) for r in (0, 1)) for layer in range(2))
    both = sim.replay(wl, sel, cost=sim.CostModel(hbm_bytes_per_s=1.0, pcie_bytes_per_s=1.0,
                                                  iteration_overhead_s=0.0), **args)
    assert all(max(a.bytes_attended, a.bytes_pcie) <= b.seconds <= a.bytes_attended + a.bytes_pcie
               for a, b in zip(only_pcie.records, both.records))


def test_a_pool_smaller_than_one_iteration_is_refused(synthetic_case):
    wl, sel = synthetic_case
    with pytest.raises(ValueError, match=r"blocks_per_iteration \(2\) exceeds the pool's capacity \(1 slots"):
        sim.replay(wl, sel, pool="per_layer", num_slots=2)


def test_synthetic_workload_is_seeded_and_layers_differ():
    a, b = tiny_synthetic(seed=3, num_requests=2), tiny_synthetic(seed=3, num_requests=2)
    assert all(np.array_equal(x.queries, y.queries) and np.array_equal(x.prompt_keys, y.prompt_keys)
               for x, y in zip(a.requests, b.requests))
    other = tiny_synthetic(seed=4, num_requests=2)
    assert not np.array_equal(other.requests[0].keys[0, 0, 0], a.requests[0].keys[0, 0, 0])
    wl = sim.synthetic_workload(seed=0, num_requests=2, num_layers=3, prompt_tokens=(400, 500), decode_steps=(2, 3))
    per_layer = [n.mean() for n in sim.select(wl, "psa", stop="remaining").per_layer()]
    assert per_layer[0] > 3 * per_layer[2]  # the flat layer needs far more blocks than the peaked one


def test_cli_sim_writes_tables_and_figures(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sim, "load_trace", lambda path=None: small_trace())
    tiny = tiny_synthetic()
    monkeypatch.setattr(sim, "synthetic_workload", lambda: tiny)
    assert cli_main(["sim", "--out", str(tmp_path), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "| trace | psa | 25% |" in out and "| synthetic | top-" in out and "| 12 |" in out
    for name in ("psa_sim_pools.png", "psa_sim_layers.png", "psa_sim.json"):
        assert (tmp_path / name).stat().st_size > 1000
