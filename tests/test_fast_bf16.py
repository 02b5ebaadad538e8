"""psa_fast with bfloat16 KV (the dtype models are served in) against the float64 reference (GPU only).

The reference is given the very numbers the kernels read: K, V (and a bfloat16 query) rounded to
bfloat16 (``psa_ref.testing.to_bfloat16``), in float64. Error budgets are float16's, unchanged:

* output (I1): twice a naive float32 attention's error over the same blocks (``check_result``): the
  tensor cores multiply bfloat16 K and V exactly and take P in three bfloat16 parts (24 bits, as
  float32), Q in one part when it is bfloat16 and in three when it is float32;
* order and stop (I4, I5): the metadata is float16 for both KV dtypes, computed in float32 from the
  exact keys, so the float16-metadata margin of ``check_result`` holds as it is.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import psa_fast
import psa_ref
from psa_ref.kvcache import HostStore
from psa_ref.testing import assert_close, to_bfloat16
from psa_ref.testing.conformance import FP16_META_REL, check_result

pytestmark = pytest.mark.skipif(not psa_fast.gpu_available(), reason="needs a CUDA GPU (cupy.cuda.is_available())")
torch = pytest.importorskip("torch")

if psa_fast.gpu_available():
    import cupy


def bf16_problem(rng, *, hq, hkv, t, d, logit_scale=2.0, sink=4.0, q_dtype="bfloat16"):
    """(q, k, v) on the host as float64 holding bfloat16 values (q float32 values if asked), and
    the same on the GPU as torch tensors."""
    q, k, v = psa_ref.testing.random_problem(rng, num_q_heads=hq, num_kv_heads=hkv, num_tokens=t, head_dim=d,
                                             logit_scale=logit_scale, sink_strength=sink, dtype=np.float32)
    k, v = to_bfloat16(k), to_bfloat16(v)
    q = to_bfloat16(q) if q_dtype == "bfloat16" else q.astype(np.float32)
    dev = dict(device="cuda")
    qt = torch.tensor(q, **dev).to(getattr(torch, q_dtype))
    kt, vt = (torch.tensor(x, **dev).to(torch.bfloat16) for x in (k, v))
    return (q.astype(np.float64), k.astype(np.float64), v.astype(np.float64)), (qt, kt, vt)


def on_host(res):
    out = res.output
    out = out.cpu().numpy() if hasattr(out, "cpu") else cupy.asnumpy(out)
    return type(res)(out, res.blocks_used, res.iterations, res.stop_reason, res.mass_estimate, res.mass_exact,
                     res.num_blocks)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_psa_topk_dense_conform_with_bfloat16_kv(data):
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="seed"))
    hkv = data.draw(st.sampled_from([1, 2]), label="hkv")
    g = data.draw(st.sampled_from([1, 4, 8]), label="g")
    d = data.draw(st.sampled_from([64, 128, 256]), label="d")
    t = data.draw(st.integers(1, 600), label="t")
    s = data.draw(st.sampled_from([5, 16]), label="s")
    q_dtype = data.draw(st.sampled_from(["bfloat16", "float32"]), label="q dtype")
    method = data.draw(st.sampled_from(["psa", "topk", "dense"]), label="method")
    gqa = data.draw(st.sampled_from(["shared", "per_head"]), label="gqa")
    (q, k, v), (qt, kt, vt) = bf16_problem(rng, hq=hkv * g, hkv=hkv, t=t, d=d, q_dtype=q_dtype)
    blocks = psa_fast.KVBlocks.from_dense(kt, vt, block_size=s)
    assert blocks.cache.dtype == "bfloat16" and "bfloat16" in repr(blocks)
    opts = dict(gqa=gqa, sink_blocks=1, recent_blocks=1)
    if method == "psa":
        tau = data.draw(st.sampled_from([0.5, 0.9, 0.95, 0.99, 1.0]), label="tau")
        stop = data.draw(st.sampled_from(psa_fast.STOP_RULES), label="stop")
        step = data.draw(st.sampled_from([1, 4, 16]), label="step")
        res = psa_fast.attention(qt, blocks, tau, stop=stop, step=step, **opts)
        kw = dict(threshold=tau, stop=stop, step=step)
    else:
        n = -(-t // s)
        kk = n if method == "dense" else min(n, data.draw(st.integers(2, 20), label="k"))
        res = psa_fast.topk_attention(qt, blocks, kk, **opts)
        kw = dict(method="topk", k=kk)
    check_result(on_host(res), q, k, v, block_size=s, **opts, **kw)


def test_dense_attention_of_bfloat16_within_twice_naive_fp32():
    rng = np.random.default_rng(4)
    (q, k, v), (qt, kt, vt) = bf16_problem(rng, hq=8, hkv=2, t=5000, d=128, logit_scale=3.0)
    out = psa_fast.dense_attention(qt, kt, vt).cpu().numpy()
    ref = psa_ref.dense_attention(q, k, v)
    for h in range(8):
        k32, v32 = k[h // 4].astype(np.float32), v[h // 4].astype(np.float32)
        lg = (k32 @ q[h].astype(np.float32)) / np.float32(np.sqrt(128))
        w = np.exp(lg - lg.max())
        naive = np.abs((w @ v32) / w.sum() - ref[h]).max()
        assert_close(f"head {h}", out[h], ref[h], naive_err=naive, atol=1e-6 * np.abs(v32).max())


@pytest.mark.parametrize("hq, version", [(32, 3), (8, 2)])
def test_cuda_core_kernel_with_bfloat16(hq, version):
    """Groups of more than 8 query heads (decode v2, CUDA cores) read bfloat16 too."""
    rng = np.random.default_rng(hq)
    (q, k, v), (qt, kt, vt) = bf16_problem(rng, hq=hq, hkv=2, t=700, d=64)
    cache = psa_fast.PagedKVCache(num_layers=1, batch=1, num_kv_heads=2, head_dim=64, max_tokens=700, block_size=16,
                                  dtype="bfloat16")
    cache.prefill(0, 0, kt, vt)
    dec = psa_fast.plan(cache, num_q_heads=hq, threshold=0.9, step=4, stop="remaining",
                        version=version).run(qt[None].contiguous())
    used = [cupy.asnumpy(dec.order[0, gi, : int(dec.num_used[0, gi])]) for gi in range(2)]
    res = psa_ref.AttentionResult(cupy.asnumpy(dec.out[0]), used, cupy.asnumpy(dec.iterations[0]),
                                  [psa_fast.REASONS[r] for r in cupy.asnumpy(dec.reason[0])], None, None, 44)
    check_result(res, q, k, v, threshold=0.9, step=4, stop="remaining", block_size=16)


@pytest.mark.parametrize("metadata", ["cuboid_mean", "minmax", "mean"])
def test_paged_cache_equals_host_store_after_prefill_and_appends(metadata):
    """Issue 15, item 6: blocks and metadata of a bfloat16 PagedKVCache after a prefill and appends
    equal psa_ref's HostStore fed the same tokens (K, V bit for bit; metadata within float16 rounding)."""
    rng = np.random.default_rng(8)
    hkv, d, s, t0, t1 = 2, 96, 16, 37, 70
    k = to_bfloat16(rng.standard_normal((2, hkv, t1, d)) * 3)
    v = to_bfloat16(rng.standard_normal((2, hkv, t1, d)))
    cache = psa_fast.PagedKVCache(num_layers=1, batch=2, num_kv_heads=hkv, head_dim=d, max_tokens=t1, block_size=s,
                                  metadata=metadata, dtype="bfloat16")
    store = HostStore(num_layers=1, num_kv_heads=hkv, head_dim=d, block_size=s, metadata=metadata,
                                      dtype=np.float32)
    bf = lambda x: torch.tensor(np.ascontiguousarray(x), device="cuda").to(torch.bfloat16)  # noqa: E731
    for b in range(2):
        cache.prefill(0, b, bf(k[b, :, :t0]), bf(v[b, :, :t0]))
        store.extend(b, 0, k[b, :, :t0], v[b, :, :t0])
    for i in range(t0, t1):
        cache.append(0, bf(k[:, :, i]), bf(v[:, :, i]))
        for b in range(2):
            store.append(b, 0, k[b, :, i], v[b, :, i])
    n = -(-t1 // s)
    for b in range(2):
        kd = psa_fast._compat.kv_to_float32(cache._dense_view(cache.k_pool, 0, b), "bfloat16")
        np.testing.assert_array_equal(cupy.asnumpy(kd)[:, :t1, :d], store.kv_blocks(b, 0).keys)
        meta = store.block_meta(b, 0)
        lohi = cupy.asnumpy(cache.lohi[0, b, :, :n]).astype(np.float64)
        assert_close("lo", lohi[:, :, 0, :d], meta["lo"], rtol=FP16_META_REL)
        assert_close("hi", lohi[:, :, 1, :d], meta["hi"], rtol=FP16_META_REL)
        if metadata == "cuboid_mean":
            m = cupy.asnumpy(cache.meta[0, b, :, :n]).astype(np.float64)
            assert_close("centre", m[:, :, 0, :d], meta["center"], rtol=FP16_META_REL)
            assert_close("radius", m[:, :, 1, :d], meta["radius"], rtol=2 * FP16_META_REL)


def test_bfloat16_offload_equals_resident():
    from psa_fast.offload import OffloadDecoder, OffloadKVCache

    rng = np.random.default_rng(6)
    dims = dict(num_layers=1, batch=2, num_kv_heads=2, head_dim=128, max_tokens=900, block_size=16, dtype="bfloat16")
    res, off = psa_fast.PagedKVCache(**dims), OffloadKVCache(num_slots=96, **dims)
    qs = []
    for b, t in enumerate([900, 333]):
        _, (qt, kt, vt) = bf16_problem(rng, hq=8, hkv=2, t=t, d=128)
        for c in (res, off):
            c.prefill(0, b, kt, vt)
        qs.append(qt)
    q = torch.stack(qs)
    opts = dict(num_q_heads=8, threshold=0.9, step=4, sink_blocks=1, recent_blocks=1)
    a = psa_fast.plan(res, **opts).run(q)
    b = OffloadDecoder(off, **opts).run(q)
    for name in ("num_used", "iterations", "reason"):
        np.testing.assert_array_equal(cupy.asnumpy(getattr(b, name)), cupy.asnumpy(getattr(a, name)), err_msg=name)
    assert_close("output", cupy.asnumpy(b.out), cupy.asnumpy(a.out), rtol=1e-5)


def test_bfloat16_input_errors():
    cache = psa_fast.PagedKVCache(num_layers=1, batch=1, num_kv_heads=1, head_dim=16, max_tokens=32,
                                  dtype="bfloat16")
    with pytest.raises(TypeError, match="keys must be bfloat16"):
        cache.prefill(0, 0, cupy.zeros((1, 4, 16), cupy.float16), cupy.zeros((1, 4, 16), cupy.float16))
    big = torch.full((1, 4, 16), 1e5, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="beyond float16's range"):
        cache.prefill(0, 0, big, big)
    with pytest.raises(ValueError, match="dtype must be one of"):
        psa_fast.PagedKVCache(num_layers=1, batch=1, num_kv_heads=1, head_dim=16, max_tokens=32, dtype="float32")
