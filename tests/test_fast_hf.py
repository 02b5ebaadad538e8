"""psa_fast.hf on the GPU: a paged transformers cache, batched decode, bfloat16, mixed layers, captured steps.

Tiny random models (a Llama, and a Gemma 3 with sliding-window layers around one global layer) in
bfloat16 on the GPU. Error budget: PSA at tau = 1 replaces the stock bfloat16 SDPA of the PSA layers,
so its logits must be as close to the same model run in float32 as the stock bfloat16 path is, with
a factor 2 (flash-attention's rule): ``|psa - fp32| <= 2 |stock - fp32|`` (max over logits). Greedy
tokens agree with stock's except where stock's two best logits lie within that budget.
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import psa_fast  # noqa: E402
from psa_ref.tools import hf  # noqa: E402

if psa_fast.gpu_available():
    import psa_fast.hf

pytestmark = pytest.mark.skipif(not psa_fast.gpu_available(), reason="needs a CUDA GPU (cupy.cuda.is_available())")

VOCAB = 97


def tiny(kind: str, seed: int = 0):
    torch.manual_seed(seed)
    if kind == "llama":
        cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                       num_attention_heads=8, num_key_value_heads=2, head_dim=16,
                                       max_position_embeddings=512)
        return transformers.LlamaForCausalLM(cfg).eval()
    cfg = transformers.Gemma3TextConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                                        num_attention_heads=4, num_key_value_heads=1, head_dim=32,
                                        query_pre_attn_scalar=32, sliding_window=8, max_position_embeddings=512,
                                        layer_types=["sliding_attention"] * 3 + ["full_attention"])
    return transformers.Gemma3ForCausalLM(cfg).eval()


@torch.no_grad()
def forced_logits(model, ids, prefill: int, cache=None):
    """Logits of a prefill of ``ids[:, :prefill]`` then one decode step per remaining token."""
    out = [model(ids[:, :prefill], past_key_values=cache, use_cache=True).logits[:, -1:]]
    for i in range(prefill, ids.shape[1] - 1):
        r = model(ids[:, i : i + 1], past_key_values=cache, use_cache=True)
        out.append(r.logits)
    return torch.cat(out, 1).float()


@torch.no_grad()
def captured_logits(dec, ids, prefill: int):
    """``forced_logits`` through a ``CapturedDecoder``: the prefill, then one replayed step per remaining token."""
    out = [dec.prefill(ids[:, :prefill])[:, None].float()]
    for i in range(prefill, ids.shape[1] - 1):
        out.append(dec.step(ids[:, i]).float()[:, None].clone())
    return torch.cat(out, 1)


def stock_and_reference(kind, ids, prefill):
    """(stock bfloat16 SDPA logits, float32 logits) of the same weights; dynamic caches."""
    m32 = tiny(kind).cuda()
    m32.set_attn_implementation("sdpa")
    ref = forced_logits(m32, ids, prefill, transformers.DynamicCache(config=m32.config))
    m16 = tiny(kind).cuda().to(torch.bfloat16)
    m16.set_attn_implementation("sdpa")
    stock = forced_logits(m16, ids, prefill, transformers.DynamicCache(config=m16.config))
    return m16, stock, ref


def assert_within_budget(psa, stock, ref, budget: float, what: str) -> None:
    """PSA's logits within ``budget`` of the float32 ones, and its greedy tokens stock's except at near-ties."""
    err = float((psa - ref).abs().max())
    assert err <= budget, f"{what}: PSA tau=1 logits differ from float32 by {err:.3g} > budget {budget:.3g}"
    top2 = stock.topk(2, dim=-1).values
    near_tie = (top2[..., 0] - top2[..., 1]) <= budget
    differ = psa.argmax(-1) != stock.argmax(-1)
    assert not (differ & ~near_tie).any(), f"{what}: greedy tokens differ where stock's top two logits are not tied"


@pytest.mark.parametrize("kind", ["llama", "gemma"])
def test_tau_one_gives_dense_logits_and_greedy_tokens(kind):
    ids = torch.randint(0, VOCAB, (2, 90), generator=torch.Generator().manual_seed(3)).cuda()
    model, stock, ref = stock_and_reference(kind, ids, 50)
    budget = 2 * float((stock - ref).abs().max())
    session = psa_fast.hf.enable(model, hf.PSAConfig(threshold=1.0, block_size=4, step=4))
    try:
        cache = psa_fast.hf.PagedCache(model, batch=2, max_tokens=128)
        psa = forced_logits(model, ids, 50, cache)
    finally:
        model.set_attn_implementation("sdpa")
    expect = 1 if kind == "gemma" else 2
    assert cache.psa_layers == ([3] if kind == "gemma" else [0, 1]) and len(cache.psa_layers) == expect
    assert_within_budget(psa, stock, ref, budget, kind)
    read = cache.blocks_read()
    assert cache.steps == 39 and read["mean_share"] == pytest.approx(1.0)  # tau = 1 reads every block
    assert session.cache is cache


def test_padded_batch_of_different_lengths_with_generate():
    """Left-padded prompts of 17 and 40 tokens through generate(): each request's logits are its own
    unpadded run's, within the budget; sampling runs too."""
    model = tiny("gemma", seed=1).cuda().to(torch.bfloat16)
    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(1, VOCAB, (n,), generator=gen) for n in (17, 40)]
    ids = torch.zeros((2, 40), dtype=torch.long)
    mask = torch.zeros((2, 40), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, 40 - len(p):], mask[i, 40 - len(p):] = p, 1
    ids, mask = ids.cuda(), mask.cuda()
    psa_fast.hf.enable(model, hf.PSAConfig(threshold=1.0, block_size=4, step=4))
    try:
        kw = dict(max_new_tokens=12, do_sample=False, output_logits=True, return_dict_in_generate=True,
                  pad_token_id=0)
        batch = model.generate(ids, attention_mask=mask, past_key_values=psa_fast.hf.PagedCache(
            model, batch=2, max_tokens=64), **kw)
        singles = [model.generate(p[None].cuda(), past_key_values=psa_fast.hf.PagedCache(model, batch=1, max_tokens=64),
                                  **kw) for p in prompts]
        lens = [int(x) for x in batch.past_key_values.kv.host_lens[0]]
        sampled = model.generate(ids, attention_mask=mask, do_sample=True, max_new_tokens=5, pad_token_id=0,
                                 past_key_values=psa_fast.hf.PagedCache(model, batch=2, max_tokens=64))
    finally:
        model.set_attn_implementation("sdpa")
    assert lens == [17 + 11, 40 + 11]  # padding was not stored: prompt + generated tokens fed back
    assert sampled.shape == (2, 45)
    m32 = tiny("gemma", seed=1).cuda()
    for i, single in enumerate(singles):
        ref = m32.generate(prompts[i][None].cuda(), **kw)
        got = torch.stack(batch.logits)[:, i].float()
        want = torch.stack(single.logits)[:, 0].float()
        mine, theirs = batch.sequences[i, 40:].cpu(), single.sequences[0, len(prompts[i]):].cpu()
        differ = np.flatnonzero((mine != theirs).numpy())
        k = int(differ[0]) if differ.size else len(mine) - 1  # logits agree up to the first differing token
        single_err = max(float((torch.stack(ref.logits)[: k + 1, 0] - want[: k + 1]).abs().max()), 1e-3)
        assert float((got[: k + 1] - want[: k + 1]).abs().max()) <= 2 * single_err
        if differ.size:  # a token may differ only where the two best logits are within the budget
            top2 = want[k].topk(2).values
            assert float(top2[0] - top2[1]) <= 4 * single_err


@pytest.mark.parametrize("kind", ["llama", "gemma"])
@pytest.mark.parametrize("mode", ["psa", "dense"])
def test_captured_step_equals_the_eager_step(kind, mode):
    ids = torch.randint(0, VOCAB, (3, 70), generator=torch.Generator().manual_seed(7)).cuda()
    model = tiny(kind, seed=2).cuda().to(torch.bfloat16)
    psa_fast.hf.enable(model, hf.PSAConfig(threshold=0.9, block_size=4, step=4))
    try:
        eager = forced_logits(model, ids, 40, psa_fast.hf.PagedCache(model, batch=3, max_tokens=80, mode=mode))
        cache = psa_fast.hf.PagedCache(model, batch=3, max_tokens=80, static=True, mode=mode)
        dec = psa_fast.hf.CapturedDecoder(model, cache, batch=3)
        captured = captured_logits(dec, ids, 40)
    finally:
        model.set_attn_implementation("sdpa")
    assert dec.graph is not None and cache.steps == 29
    assert int(cache.kv.host_lens[0, 0]) == 69 and int(cache.kv.seq_lens[0, 0]) == 69
    # the PSA layers run the same kernels eagerly and replayed; the window layers' static cache masks
    # differently shaped (bfloat16 SDPA over 80 positions instead of the live ones): a few bf16 roundings
    tol = 0.0 if kind == "llama" else 0.05 * float(eager.abs().max())
    assert float((captured - eager).abs().max()) <= tol


@pytest.mark.parametrize("first", ["predicted", "estimated_stop"])
@pytest.mark.parametrize("kind", ["llama", "gemma"])
def test_the_config_s_first_chunk_reaches_every_plan_and_is_captured(kind, first):
    """PSAConfig(first_chunk=...) sizes every PSA layer's first ranked chunk from the estimates (DecodePlan's
    first_chunk: "predicted" with the default rule, "estimated_stop" with ema on cuboid_mean), eagerly and in a
    captured step, which replays the eager one as above."""
    ids = torch.randint(0, VOCAB, (3, 70), generator=torch.Generator().manual_seed(13)).cuda()
    model = tiny(kind, seed=4).cuda().to(torch.bfloat16)
    rule = {} if first == "predicted" else dict(stop="ema", metadata="cuboid_mean")
    psa_fast.hf.enable(model, hf.PSAConfig(threshold=0.9, block_size=4, step=4, first_chunk=first, **rule))
    try:
        eager_cache = psa_fast.hf.PagedCache(model, batch=3, max_tokens=80)
        eager = forced_logits(model, ids, 40, eager_cache)
        cache = psa_fast.hf.PagedCache(model, batch=3, max_tokens=80, static=True)
        dec = psa_fast.hf.CapturedDecoder(model, cache, batch=3)
        captured = captured_logits(dec, ids, 40)
    finally:
        model.set_attn_implementation("sdpa")
    assert eager_cache._plans and all(p.first_chunk == first for p in eager_cache._plans.values())
    tol = 0.0 if kind == "llama" else 0.05 * float(eager.abs().max())  # window layers: as the test above
    assert float((captured - eager).abs().max()) <= tol


@pytest.mark.parametrize("kind", ["llama", "gemma"])
def test_the_sdpa_baseline_is_captured_the_same_way(kind):
    """mode="sdpa": stock SDPA over static buffers (windows as rings), replayed: within the budget."""
    ids = torch.randint(0, VOCAB, (2, 60), generator=torch.Generator().manual_seed(9)).cuda()
    model, stock, ref = stock_and_reference(kind, ids, 30)
    psa_fast.hf.enable(model, hf.PSAConfig())
    cache = psa_fast.hf.PagedCache(model, batch=2, max_tokens=64, static=True, mode="sdpa")
    dec = psa_fast.hf.CapturedDecoder(model, cache, batch=2)
    captured = captured_logits(dec, ids, 30)
    model.set_attn_implementation("sdpa")
    budget = 2 * float((stock - ref).abs().max())
    assert dec.graph is not None
    assert float((captured - ref).abs().max()) <= budget


@pytest.mark.parametrize("kind", ["llama", "gemma"])
def test_speculate_in_the_model_matches_the_loop_and_is_captured(kind):
    """plan_options={"speculate": 1.0}: the same stops as the loop (logits within a few bfloat16 roundings of
    the attention outputs, merged in another order), at least the loop's blocks read (speculated blocks count),
    and a captured step replays the eager one exactly."""
    ids = torch.randint(0, VOCAB, (3, 70), generator=torch.Generator().manual_seed(11)).cuda()
    model = tiny(kind, seed=3).cuda().to(torch.bfloat16)
    psa_fast.hf.enable(model, hf.PSAConfig(threshold=0.9, block_size=4, step=4))
    try:
        loop_cache = psa_fast.hf.PagedCache(model, batch=3, max_tokens=80)
        loop = forced_logits(model, ids, 40, loop_cache)
        spec_cache = psa_fast.hf.PagedCache(model, batch=3, max_tokens=80, plan_options={"speculate": 1.0})
        spec = forced_logits(model, ids, 40, spec_cache)
        cache = psa_fast.hf.PagedCache(model, batch=3, max_tokens=80, static=True, plan_options={"speculate": 1.0})
        dec = psa_fast.hf.CapturedDecoder(model, cache, batch=3)
        captured = captured_logits(dec, ids, 40)
    finally:
        model.set_attn_implementation("sdpa")
    assert all(p.speculate == 1.0 for p in spec_cache._plans.values())
    assert float((spec - loop).abs().max()) <= 0.05 * float(loop.abs().max())
    assert spec_cache.blocks_read()["mean_share"] >= loop_cache.blocks_read()["mean_share"] - 1e-9
    tol = 0.0 if kind == "llama" else 0.05 * float(spec.abs().max())  # window layers: as the test above
    assert float((captured - spec).abs().max()) <= tol


@pytest.mark.parametrize("products", ["broadcast", "bmm"])
def test_compiled_window_attention_on_the_gpu(products):
    """window_decode_attention compiled, bfloat16 on the GPU, a wrapped ring of 64 slots with a window of 48,
    against float64. Budget: the output's rounding to bfloat16 and the weights' (bmm, as flash attention) each
    half an ulp, 2^-8 x (max |out| + max |v|)."""
    g = torch.Generator(device="cuda").manual_seed(3)
    b, hq, hkv, s, d, window = 8, 4, 1, 64, 64, 48
    q = torch.randn(b, hq, 1, d, device="cuda", generator=g).to(torch.bfloat16)
    k = (2 * torch.randn(b, hkv, s, d, device="cuda", generator=g)).to(torch.bfloat16)
    v = torch.randn(b, hkv, s, d, device="cuda", generator=g).to(torch.bfloat16)
    length = torch.tensor(100, device="cuda")
    positions = torch.arange(100 - s, 100, device="cuda")[(torch.arange(s, device="cuda") - 100) % s]
    allowed = psa_fast.hf.decode_allowed(positions, length, window)
    logits = (q.double().reshape(b, hkv, hq // hkv, d) @ k.double().transpose(-1, -2)) * 0.125
    ref = (torch.softmax(logits.masked_fill(~allowed, float("-inf")), -1) @ v.double()).reshape(b, 1, hq, d)
    fn = torch.compile(psa_fast.hf.window_decode_attention, dynamic=False)
    got = fn(q, k, v, positions, length, window, 0.125, products)
    assert got.dtype == torch.bfloat16 and got.shape == (b, 1, hq, d)
    budget = 2.0**-8 * (float(ref.abs().max()) + float(v.abs().max()))
    assert float((got.double() - ref).abs().max()) <= budget


@pytest.mark.parametrize("kind", ["llama", "gemma"])
@pytest.mark.parametrize("mode", ["psa", "sdpa"])
def test_compiled_capture_stays_within_the_budget(kind, mode):
    """CapturedDecoder(compile=True): inductor's fused norms, projections and MLP (other bfloat16 roundings)
    around eager attention, all in one graph; PSA at tau = 1 (and the SDPA baseline) within the module's budget
    of the float32 logits, greedy tokens stock's except at near-ties; the capture (step 2) compiles nothing."""
    ids = torch.randint(0, VOCAB, (2, 60), generator=torch.Generator().manual_seed(13)).cuda()
    model, stock, ref = stock_and_reference(kind, ids, 30)
    psa_fast.hf.enable(model, hf.PSAConfig(threshold=1.0, block_size=4, step=4))
    torch._dynamo.reset()
    try:
        cache = psa_fast.hf.PagedCache(model, batch=2, max_tokens=64, static=True, mode=mode)
        dec = psa_fast.hf.CapturedDecoder(model, cache, batch=2, compile=True)
        captured = captured_logits(dec, ids, 30)
    finally:
        model.set_attn_implementation("sdpa")
        torch._dynamo.reset()
    assert dec.graph is not None and (mode == "sdpa" or cache.steps == 29)
    assert all(layer._compiled_call_impl is not None for layer in psa_fast.hf.decoder_layers(model))
    assert_within_budget(captured, stock, ref, 2 * float((stock - ref).abs().max()), f"{kind} {mode} compiled")


def test_plan_options_may_not_override_the_config():
    model = tiny("llama").cuda().to(torch.bfloat16)
    psa_fast.hf.enable(model, hf.PSAConfig())
    with pytest.raises(ValueError, match="threshold"):
        psa_fast.hf.PagedCache(model, batch=1, max_tokens=8, plan_options={"threshold": 0.5})


def test_configuration_errors():
    model = tiny("gemma").cuda().to(torch.bfloat16)
    with pytest.raises(TypeError, match="psa_fast.hf.enable"):
        psa_fast.hf.PagedCache(tiny("llama").cuda().to(torch.bfloat16), batch=1, max_tokens=8)
    psa_fast.hf.enable(model, hf.PSAConfig(layers="all"))
    with pytest.raises(ValueError, match="sliding-window layer"):
        psa_fast.hf.PagedCache(model, batch=1, max_tokens=8)
    psa_fast.hf.enable(model, hf.PSAConfig(layers=(7,)))
    with pytest.raises(ValueError, match="leaves no layer"):
        psa_fast.hf.PagedCache(model, batch=1, max_tokens=8)
    fp32 = tiny("llama").cuda()
    psa_fast.hf.enable(fp32, hf.PSAConfig())
    with pytest.raises(ValueError, match="bfloat16 and float16"):
        psa_fast.hf.PagedCache(fp32, batch=1, max_tokens=8)


# --- real models (issue 15, item 6): skipped where the GGUF packages are not installed ---------------------------

def real_models(name: str, dtype: str):
    """``(model in dtype, float32 twin, tokenizer)`` of ``psa eval``'s model ``name`` on the GPU, or a skip."""
    from psa_ref.tools import evaluate

    try:
        evaluate.gguf_path(name)
    except (ModuleNotFoundError, FileNotFoundError) as exc:
        pytest.skip(str(exc))
    ref, tok = evaluate.load_model(name, dtype="float32")
    model, _ = evaluate.load_model(name, dtype="float32")
    return model.to(getattr(torch, dtype)).cuda(), ref.cuda(), tok


@pytest.mark.parametrize("name, dtype", [("smollm2", "bfloat16"), ("smollm2", "float16"), ("gemma3", "bfloat16")])
def test_real_model_tau_one_gives_dense_logits_and_greedy_tokens_over_32_steps(name, dtype):
    """SmolLM2-135M and Gemma 3 270M with their real weights on held-out text (CPython's ``xml`` sources): two
    requests of 1024 prompt tokens, then 32 teacher-forced decode steps. PSA at tau = 1 (the defaults otherwise)
    is within twice the stock path's distance to the float32 model, and its greedy tokens equal stock's except
    where stock's two best logits are within that budget."""
    from psa_ref.tools import evaluate

    model, ref_model, tok = real_models(name, dtype)
    ids = tok(evaluate.load_text("stdlib:xml"), add_special_tokens=False, verbose=False)["input_ids"]
    bos = evaluate.bos_prefix(tok)
    prompt, steps = 1024, 32
    rows = [bos + ids[o : o + prompt + steps + 1 - len(bos)] for o in (0, 20000)]
    batch = torch.tensor(rows).cuda()
    ref = forced_logits(ref_model, batch, prompt, transformers.DynamicCache(config=ref_model.config))
    model.set_attn_implementation("sdpa")
    stock = forced_logits(model, batch, prompt, transformers.DynamicCache(config=model.config))
    budget = 2 * float((stock - ref).abs().max())
    psa_fast.hf.enable(model, hf.PSAConfig(threshold=1.0, step=16))
    try:
        cache = psa_fast.hf.PagedCache(model, batch=2, max_tokens=prompt + steps + 8)
        psa = forced_logits(model, batch, prompt, cache)
    finally:
        model.set_attn_implementation("sdpa")
    assert psa.shape == stock.shape == (2, steps + 1, stock.shape[-1])
    assert_within_budget(psa, stock, ref, budget, f"{name} {dtype}")
    assert cache.blocks_read()["mean_share"] == pytest.approx(1.0)


@pytest.mark.parametrize("kind", ["llama", "gemma"])
def test_the_config_can_leave_the_step_to_the_plan(kind):
    """PSAConfig(step="auto"): every plan of the cache resolves it to an integer (DecodePlan's pick), and the
    logits are those of that integer given explicitly, bit for bit. The default step of 1 warns."""
    ids = torch.randint(0, VOCAB, (2, 60), generator=torch.Generator().manual_seed(13)).cuda()
    model = tiny(kind, seed=4).cuda().to(torch.bfloat16)
    with pytest.warns(UserWarning, match="step='auto'"):
        psa_fast.hf.enable(model, hf.PSAConfig(threshold=0.9, block_size=4))
    try:
        psa_fast.hf.enable(model, hf.PSAConfig(threshold=0.9, block_size=4, step="auto"))
        auto_cache = psa_fast.hf.PagedCache(model, batch=2, max_tokens=64)
        auto = forced_logits(model, ids, 30, auto_cache)
        steps = {p.step for p in auto_cache._plans.values()}
        assert len(steps) == 1 and isinstance(next(iter(steps)), int) and next(iter(steps)) >= 1
        psa_fast.hf.enable(model, hf.PSAConfig(threshold=0.9, block_size=4, step=next(iter(steps))))
        fixed = forced_logits(model, ids, 30, psa_fast.hf.PagedCache(model, batch=2, max_tokens=64))
    finally:
        model.set_attn_implementation("sdpa")
    assert torch.equal(auto, fixed)
