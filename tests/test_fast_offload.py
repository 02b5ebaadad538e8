"""psa_fast.offload on the GPU: decoding from host memory through a small GPU pool gives the resident
result; the pool never holds a stale block; loader faults surface in the caller (skipped without a GPU).

Error budget: the offload decoder attends the same blocks, in the same order, with the same
float32 per-block terms as the resident kernel; only the merge of the iterations' partial
outputs is ordered differently (one merge per launch instead of per-warp accumulators), so the
outputs agree to a few float32 roundings of the output's scale: ``rtol = 1e-5`` of ``max|out|``
(float32 epsilon is 1.2e-7; each of up to ~40 merges rounds once). Decisions (blocks used,
iterations, stop reason, the rule's estimate) must be identical: the verifier's state is
computed with the same operations in the same order.
"""

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import psa_fast
import psa_ref
from psa_ref.testing import assert_close

pytestmark = pytest.mark.skipif(not psa_fast.gpu_available(), reason="needs a CUDA GPU (cupy.cuda.is_available())")

if psa_fast.gpu_available():
    import cupy

    from psa_fast.offload import LoaderError, OffloadDecoder, OffloadKVCache

OUT_RTOL = 1e-5


def build(rng, *, lens, hq, hkv, d, s, num_slots, pool="unified", policy="lru", layers=2, extra=0):
    """A resident cache and an offload cache holding the same random (skewed) KV; returns them and q."""
    dims = dict(num_layers=layers, batch=len(lens), num_kv_heads=hkv, head_dim=d, max_tokens=max(lens) + extra,
                block_size=s)
    res = psa_fast.PagedKVCache(**dims)
    off = OffloadKVCache(num_slots=num_slots, pool=pool, policy=policy, **dims)
    qs = []
    for layer in range(layers):
        q_l = []
        for b, t in enumerate(lens):
            q, k, v = psa_ref.testing.random_problem(rng, num_q_heads=hq, num_kv_heads=hkv, num_tokens=t, head_dim=d,
                                                     logit_scale=3.0, dtype=np.float16)
            for c in (res, off):
                c.prefill(layer, b, cupy.asarray(k), cupy.asarray(v))
            q_l.append(q)
        qs.append(cupy.asarray(np.stack(q_l)))
    return res, off, qs


def frozen(dec):
    """A copy of a plan's outputs (the next run of that plan overwrites its buffers)."""
    fields = (getattr(dec, f.name) for f in dataclasses.fields(dec))
    return psa_fast.api.DecodeOutput(*(None if x is None else x.copy() for x in fields))


def same_decode(a, b, what):
    for name in ("num_used", "iterations", "reason"):
        np.testing.assert_array_equal(cupy.asnumpy(getattr(b, name)), cupy.asnumpy(getattr(a, name)),
                                      err_msg=f"{what}: {name}")
    used = cupy.asnumpy(a.num_used)
    oa, ob = cupy.asnumpy(a.order), cupy.asnumpy(b.order)
    for i in np.ndindex(used.shape):
        np.testing.assert_array_equal(ob[i][: used[i]], oa[i][: used[i]], err_msg=f"{what}: order of group {i}")
    np.testing.assert_array_equal(cupy.asnumpy(b.mass_estimate), cupy.asnumpy(a.mass_estimate),
                                  err_msg=f"{what}: mass_estimate")
    assert_close(f"{what}: output", cupy.asnumpy(b.out), cupy.asnumpy(a.out), rtol=OUT_RTOL)


def check_pool_matches_store(off):
    """Every resident block's slot holds exactly the host store's block (no stale slot)."""
    off.synchronize_writeback()  # appended rows reach the host store on their own stream
    slot_of = off.pool.resident()
    ids = np.flatnonzero(slot_of >= 0)
    slots = slot_of[ids]
    assert len(set(slots.tolist())) == len(slots), "two blocks share a slot"
    sk, sv = cupy.asnumpy(off.slot_k), cupy.asnumpy(off.slot_v)
    np.testing.assert_array_equal(sk[slots], off.store.k[ids], err_msg="a slot's keys differ from the host store")
    np.testing.assert_array_equal(sv[slots], off.store.v[ids], err_msg="a slot's values differ from the host store")
    return len(ids)


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_offload_decode_equals_resident(data):
    seed = data.draw(st.integers(0, 2**32 - 1), label="seed")
    rng = np.random.default_rng(seed)
    b = data.draw(st.integers(1, 3), label="batch")
    lens = [data.draw(st.integers(1, 400), label=f"len{i}") for i in range(b)]
    hkv = data.draw(st.sampled_from([1, 2]), label="hkv")
    hq = hkv * data.draw(st.sampled_from([1, 4]), label="g")
    d, s = data.draw(st.sampled_from([(64, 16), (128, 16), (32, 8)]), label="d, s")
    gqa = data.draw(st.sampled_from(["shared", "per_head"]), label="gqa")
    stop = data.draw(st.sampled_from(psa_fast.offload.STOP_RULES), label="stop")
    tau = data.draw(st.sampled_from([0.5, 0.9, 0.99, 1.0]), label="tau")
    step = data.draw(st.sampled_from([1, 3, 8]), label="step")
    sink, recent = data.draw(st.sampled_from([(0, 0), (1, 1), (2, 0)]), label="sink, recent")
    pool = data.draw(st.sampled_from(["unified", "per_layer"]), label="pool")
    policy = data.draw(st.sampled_from(["lru", "fifo"]), label="policy")
    gn = hq if gqa == "per_head" else hkv
    need = 2 * b * gn * max(step, sink + recent)          # two iterations in flight
    slack = data.draw(st.integers(0, 40), label="slack")  # small pools evict constantly
    res, off, qs = build(rng, lens=lens, hq=hq, hkv=hkv, d=d, s=s, num_slots=2 * (need + slack), pool=pool,
                         policy=policy)
    opts = dict(num_q_heads=hq, threshold=tau, stop=stop, step=step, gqa=gqa, sink_blocks=sink, recent_blocks=recent)
    ref_plan = psa_fast.plan(res, **opts)
    dec = OffloadDecoder(off, **opts)
    for step_i in range(2):          # twice per layer: the second finds blocks resident
        for layer in (1, 0):
            a = ref_plan.run(qs[layer], layer=layer)
            a = frozen(a)
            bo = dec.run(qs[layer], layer=layer)
            same_decode(a, bo, f"layer {layer}, pass {step_i}")
    check_pool_matches_store(off)


def test_topk_offload_equals_resident():
    rng = np.random.default_rng(3)
    res, off, qs = build(rng, lens=[300, 77], hq=8, hkv=2, d=128, s=16, num_slots=64)
    a = psa_fast.plan(res, num_q_heads=8, mode="topk", k=6, sink_blocks=1, recent_blocks=1).run(qs[0])
    b = OffloadDecoder(off, num_q_heads=8, mode="topk", k=6, sink_blocks=1, recent_blocks=1).run(qs[0])
    same_decode(a, b, "topk")


def test_offload_decoder_never_takes_the_grid_build(monkeypatch, lift_grid_thresholds):
    """The grid build (_kernels.pick_grid) runs a group's whole loop in one launch; the offload decoder runs an
    iteration a launch, so it stays on clusters where a resident plan goes to the grid, and decodes what the resident
    plan on clusters decodes (bit for bit; the grid build combines its CTAs in another order)."""
    from psa_fast import _kernels

    lift_grid_thresholds()
    monkeypatch.setattr(_kernels, "LOOP_GRID", 8)
    res, off, qs = build(np.random.default_rng(5), lens=[300, 77], hq=8, hkv=2, d=128, s=16, num_slots=64)
    opts = dict(num_q_heads=8, threshold=0.9, step=4, sink_blocks=1, recent_blocks=1)
    dec = OffloadDecoder(off, **opts)
    assert psa_fast.plan(res, **opts).grid_ctas == 8 and dec.grid_ctas == 0
    monkeypatch.setattr(_kernels, "LOOP_GRID", 0)
    on_clusters = psa_fast.plan(res, **opts)
    same_decode(frozen(on_clusters.run(qs[0])), dec.run(qs[0]), "offload beside the grid build")


def test_appends_write_through_and_pool_never_stale():
    """Pool fuzz: decode steps with appends between them, small pool; after every step each resident
    slot equals the host store, and the decode equals the resident one."""
    rng = np.random.default_rng(4)
    hq, hkv, d, s = 8, 2, 64, 8
    lens = [90, 41, 130]
    res, off, qs = build(rng, lens=lens, hq=hq, hkv=hkv, d=d, s=s, num_slots=2 * 2 * 3 * 2 * 4 + 6, extra=40,
                         layers=2)
    opts = dict(num_q_heads=hq, threshold=0.9, stop="ema", step=4, sink_blocks=1, recent_blocks=1)
    ref_plan, dec = psa_fast.plan(res, **opts), OffloadDecoder(off, **opts)
    resident_seen = 0
    for i in range(30):
        layer = int(rng.integers(2))
        k = rng.standard_normal((len(lens), hkv, d)).astype(np.float16)
        v = rng.standard_normal((len(lens), hkv, d)).astype(np.float16)
        for c in (res, off):
            c.append(layer, cupy.asarray(k), cupy.asarray(v))
        q = cupy.asarray(rng.standard_normal((len(lens), hq, d)).astype(np.float16) * 2)
        a = ref_plan.run(q, layer=layer)
        a = frozen(a)
        same_decode(a, dec.run(q, layer=layer), f"step {i}")
        resident_seen += check_pool_matches_store(off)
    assert resident_seen > 0
    # the write-back stream lost nothing: the host store is the resident cache, block for block
    off.synchronize_writeback()
    np.testing.assert_array_equal(off.store.k, cupy.asnumpy(res.k_pool))
    np.testing.assert_array_equal(off.store.v, cupy.asnumpy(res.v_pool))


@pytest.mark.parametrize("stage", ["ids", "access", "gather"])
@pytest.mark.parametrize("when", [0, 1, 3])
def test_loader_fault_raises_and_leaves_no_stale_block(stage, when):
    rng = np.random.default_rng(5)
    res, off, qs = build(rng, lens=[400], hq=4, hkv=1, d=64, s=16, num_slots=40, layers=1)
    opts = dict(num_q_heads=4, threshold=0.99, stop="ema", step=4)

    def fault(at, j):
        if at == stage and j == when:
            raise OSError(f"injected at {at} {j}")

    dec = OffloadDecoder(off, fault=fault, loader_thread=when == 1, **opts)  # on a thread or inline
    with pytest.raises(LoaderError, match="injected"):
        dec.run(qs[0])
    check_pool_matches_store(off)
    dec.fault = None
    a = psa_fast.plan(res, **opts).run(qs[0])
    same_decode(a, dec.run(qs[0]), "after the fault")
    check_pool_matches_store(off)


def test_pool_smaller_than_two_iterations_is_refused():
    rng = np.random.default_rng(6)
    _, off, _ = build(rng, lens=[100], hq=8, hkv=2, d=64, s=16, num_slots=30, layers=1)
    with pytest.raises(ValueError, match="num_slots"):
        OffloadDecoder(off, num_q_heads=8, step=8)      # 2 x 1 x 2 x 8 = 32 > 30


def test_bad_cache_type():
    rng = np.random.default_rng(7)
    res, _, _ = build(rng, lens=[20], hq=4, hkv=1, d=64, s=16, num_slots=64, layers=1)
    with pytest.raises(TypeError, match="OffloadKVCache"):
        OffloadDecoder(res, num_q_heads=4)


def test_quant3_and_sketch_are_refused_with_offload():
    """The host store keeps per-block summaries, not quant3's per-token codes; sketch is meant for quant3."""
    with pytest.raises(NotImplementedError, match="quant3"):
        OffloadKVCache(num_slots=64, num_layers=1, batch=1, num_kv_heads=1, head_dim=64, max_tokens=64,
                       metadata="quant3")
    rng = np.random.default_rng(8)
    _, off, _ = build(rng, lens=[20], hq=4, hkv=1, d=64, s=16, num_slots=64, layers=1)
    for stop in ("sketch", "sketch_avg"):
        with pytest.raises(NotImplementedError, match=f"stop='{stop}' is not offered with host offload"):
            OffloadDecoder(off, num_q_heads=4, stop=stop)
    assert OffloadDecoder(off, num_q_heads=4, step=4).stop == "ema"  # "auto" on the store's per-block metadata
