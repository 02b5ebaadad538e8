"""Decode tokens/s of a whole model on the GPU: stock dense vs psa_fast (dense paged, PSA, top-k), every
step captured in a CUDA graph.

Methods (all bfloat16, the same weights, the same teacher-forced tokens, one captured decode step per
token through [`psa_fast.hf.CapturedDecoder`][psa_fast.hf.CapturedDecoder]):

* ``sdpa``: stock SDPA over static K/V buffers (``PagedCache(mode="sdpa", static=True)``: transformers'
  own ``StaticCache`` cannot be replayed from a plain CUDA graph, its sliding windows keep their length
  on the host);
* ``paged``: [`psa_fast.hf.PagedCache`][psa_fast.hf.PagedCache] with ``mode="dense"`` (every block through the
  paged kernels);
* ``psa0.95``, ``psa0.99``: PSA at those thresholds (``--step``, default 16 blocks an iteration, or ``auto``:
  the plan's pick, ``DecodePlan(step="auto")``);
  ``psa0.95s``, ``psa0.95s1.5``: the same with ``DecodePlan(speculate=SPECULATE)`` or that margin (the
  predicted chunks at once, verified after); ``psa0.95s1.0x4``: four chunks speculated past the margin
  (``speculate_extra``; one by default);
* ``topk``: top-k with k = the mean blocks read by the run's first ``psa0.95...`` method (listed before it);
* a ``+share`` suffix (``psa0.95s1.0+share``): that method with ``rank="share"`` whatever ``--rank`` says, so
  both ranks are measured in one run; a ``+first`` suffix (``psa0.95+first``): with
  ``PSAConfig(first_chunk="predicted")`` (the first ranked chunk from the estimates); both may be given.

``--compile``: every method's decoder layers compiled by ``torch.compile`` around eager attention
([`psa_fast.hf.compile_layers`][psa_fast.hf.compile_layers]); the first step of each shape compiles.

Each row: median ms per step over ``--steps`` replays (CUDA events), tokens/s (``B`` / step), next-token
agreement with ``sdpa`` (argmax, teacher-forced; and with ``paged``, our dense step, when it ran) and perplexity
of the forced tokens, the share of blocks
the PSA layers read, GPU memory of the PSA layers' KV and metadata, and the step's **byte floor**
(weights + window-layer KV + the KV and metadata the method reads in its global layers) over the copy
ceiling measured in the run.

Weights: ``--weights random`` (the model's config from ``benchmarks/configs/<model>.json``; attention of
random weights is not sparse, so only dense timings mean anything) or a GGUF path (real weights: see
benchmarks/NOTES.md for how the Gemma 3 GGUF reaches the device). Text: ``--text`` a file (real
weights), else random token ids.

    python benchmarks/bench_model.py --model gemma3 --contexts 8192,32768 --batches 1,8,32
    python benchmarks/bench_model.py --model gemma3 --weights /tmp/gemma.gguf --text held_out.txt
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from psa_ref.scoring import RANKS

HERE = Path(__file__).resolve().parent
SPECULATE = 2.0  # the margin of the psa...s methods (DecodePlan(speculate=...))


def load_model(args):
    import torch
    import transformers

    if args.weights == "random":
        cfg = json.loads((HERE / "configs" / f"{args.model}.json").read_text())
        config = transformers.AutoConfig.for_model(**cfg)
        config.max_position_embeddings = max(config.max_position_embeddings, max(args.contexts) + args.steps + 8)
        torch.manual_seed(0)
        with torch.device("cuda"):
            model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
        return model.eval(), None
    path = Path(args.weights)
    tok = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.bfloat16)
    return model.cuda().eval(), tok


def token_ids(args, tok, n: int, batch: int):
    import torch

    if tok is None or not args.text:
        g = torch.Generator().manual_seed(1)
        return torch.randint(10, 1000, (batch, n), generator=g)
    ids = tok(Path(args.text).read_text(errors="replace"), return_tensors="pt").input_ids[0]
    if ids.numel() < n + batch * 64:
        raise SystemExit(f"--text has {ids.numel()} tokens; {n} per request are needed")
    starts = np.linspace(0, ids.numel() - n, batch).astype(int)  # requests from different parts of the text
    return torch.stack([ids[s : s + n] for s in starts])


def copy_ceiling_gbs() -> float:
    import torch

    a = torch.empty(2**31, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    b.copy_(a)
    ts = []
    for _ in range(10):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        b.copy_(a)
        e1.record()
        e1.synchronize()
        ts.append(e0.elapsed_time(e1))
    return 2 * a.numel() / (np.median(ts) * 1e-3) / 1e9


def floor_bytes(model, context: int, batch: int, share: float, method: str, metadata: str = "quant3") -> float:
    """Bytes a decode step must move: weights once, window layers' KV, global layers' KV (x share) and
    for the estimating methods the metadata their estimate reads per block: ``cuboid_mean``/``minmax``/``mean``
    4 D halves (centre and radius or mean, and lo/hi), ``quant3`` lo/hi (2 D halves) and 4-bit codes of its
    16 keys (16 D / 2 bytes)."""
    text = model.config.get_text_config()
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    hkv, d = text.num_key_value_heads, getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    types = list(getattr(text, "layer_types", None) or ["full_attention"] * text.num_hidden_layers)
    window = getattr(text, "sliding_window", None) or context
    per_token = 2 * hkv * d * 2  # K and V, bfloat16
    n_global = types.count("full_attention")
    window_kv = (len(types) - n_global) * min(window, context) * per_token
    global_kv = n_global * context * per_token * (1.0 if method in ("sdpa", "paged") else share)
    per_block = 2 * d * 2 + 16 * d // 2 if metadata == "quant3" else 4 * d * 2
    meta = 0 if method in ("sdpa", "paged") else n_global * -(-context // 16) * hkv * per_block
    return weights + batch * (window_kv + global_kv + meta)


def wilson_interval(agree: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval (95% by default) of an agreement rate ``agree / n``: with 16·B tokens a row,
    one flipped token moves agreement by 1/(16B), so a rate near 99% is read with its interval."""
    if n <= 0 or not 0 <= agree <= n:
        raise ValueError(f"need 0 <= agree <= n and n > 0; got agree={agree}, n={n}")
    p = agree / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return float(max(0.0, centre - half)), float(min(1.0, centre + half))


def step_arg(text: str) -> int | str:
    """``--step``: a positive integer or ``auto`` (``psa_ref._validate.integer_or_auto`` of the parsed text)."""
    from psa_ref import _validate

    try:
        return _validate.integer_or_auto(text if text == "auto" else int(text), "--step", minimum=1)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(f"expected a positive integer or 'auto', got {text!r}") from None


def psa_method(method: str, step: int) -> tuple[float, dict | None]:
    """``(tau, DecodePlan options)`` of a ``psa...`` method name: ``psa<tau>``; ``psa<tau>s[<margin>]``
    speculates (default margin ``SPECULATE``); ``psa<tau>s<margin>x<chunks>`` speculates ``chunks`` chunks of
    ``step`` blocks past the margin (``speculate_extra``; default one chunk)."""
    tau_txt, s, rest = method[3:].partition("s")
    try:
        tau = float(tau_txt)
        if not s:
            return tau, None
        margin, x, chunks = rest.partition("x")
        spec = {"speculate": float(margin or SPECULATE)}
        if x:
            spec["speculate_extra"] = int(chunks) * step
    except ValueError:
        raise ValueError(f"method {method!r}: expected psa<tau>, psa<tau>s[<margin>] or psa<tau>s<margin>x<chunks>, "
                         "e.g. psa0.95s1.0x4") from None
    return tau, spec


def method_options(method: str, rank: str) -> tuple[str, str, str | None]:
    """``(method, rank, first_chunk)`` of a ``--methods`` entry: ``+share`` sets ``rank="share"`` (else ``rank``),
    ``+first`` sets ``first_chunk="predicted"`` (PSA methods only)."""
    method, *flags = method.split("+")
    if not set(flags) <= {"share", "first"}:
        raise ValueError(f"method suffixes are +share and +first, got {'+'.join(flags)!r} in {method!r}")
    if "first" in flags and not method.startswith("psa"):
        raise ValueError(f"+first sizes PSA's first ranked chunk; {method!r} has none")
    return method, "share" if "share" in flags else rank, "predicted" if "first" in flags else None


def run_method(model, method, ids, args, k=None):
    """Teacher-forced decode of ``ids[:, context:]`` after a prefill of ``ids[:, :context]``; returns timings,
    argmax tokens, forced-token log-probabilities and the blocks-read share."""
    import torch

    import psa_fast.hf
    from psa_ref.tools.hf import PSAConfig

    batch, total = ids.shape
    context = total - args.steps - 1
    method, rank, first_chunk = method_options(method, args.rank)
    chunk = args.step  # a speculated chunk: the plan's step ("auto": _kernels.spec_step of the cache's blocks)
    if chunk == "auto":
        from psa_fast import _kernels

        chunk = _kernels.spec_step(-(-(total + 8) // PSAConfig().block_size))
    tau, spec = psa_method(method, chunk) if method.startswith("psa") else (0.95, None)

    cfg = PSAConfig(threshold=tau, step=args.step, topk=k if method == "topk" else None, record=False, gqa=args.gqa,
                    rank=rank, first_chunk=first_chunk)
    psa_fast.hf.enable(model, cfg)
    cache = psa_fast.hf.PagedCache(model, batch=batch, max_tokens=total + 8, static=True,
                                   mode={"paged": "dense", "sdpa": "sdpa"}.get(method), plan_options=spec)
    dec = psa_fast.hf.CapturedDecoder(model, cache, batch, compile=args.compile)
    ids = ids.cuda()
    logits = dec.prefill(ids[:, :context])
    tokens, logp, times = [], [], []
    for i in range(context, total - 1):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        lp = torch.log_softmax(logits.float(), -1)
        tokens.append(lp.argmax(-1).cpu())
        logp.append(lp.gather(1, ids[:, i : i + 1])[:, 0].cpu())
        e0.record()
        logits = dec.step(ids[:, i])
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1))
    share = cache.blocks_read()["mean_share"] if method != "sdpa" else 1.0
    kv_bytes = 0
    if cache.kv is not None:
        kv = cache.kv
        kv_bytes = int(kv.k_pool.nbytes + kv.v_pool.nbytes)
        meta_bytes = sum(int(a.nbytes) for a in (kv.meta, kv.lohi) if a is not None)  # (none for mode="dense")
    else:
        meta_bytes = 0
    model.set_attn_implementation("sdpa")
    del dec, cache
    torch.cuda.empty_cache()
    return dict(ms=float(np.median(times[2:])), tokens=torch.stack(tokens), logp=torch.stack(logp), share=share,
                kv_bytes=kv_bytes, meta_bytes=meta_bytes, rank=cfg.rank if method.startswith("psa") else None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gemma3", choices=("gemma3", "smollm2"))
    ap.add_argument("--weights", default="random", help="'random' (config only) or a GGUF path")
    ap.add_argument("--text", default=None, help="a text file for real weights (held-out text)")
    ap.add_argument("--contexts", default="32768", help="comma-separated prompt lengths")
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--steps", type=int, default=32, help="decode steps timed (the first two are warm-up)")
    ap.add_argument("--step", type=step_arg, default=16, help="PSA blocks per iteration, or auto (the plan's)")
    ap.add_argument("--methods", default="sdpa,paged,psa0.95,psa0.99,topk")
    ap.add_argument("--gqa", default="shared", choices=("shared", "per_head"), help="PSA and top-k selection")
    ap.add_argument("--rank", default="estimate", choices=RANKS,
                    help="how PSA's shared groups rank their blocks (PSAConfig(rank=...), DecodePlan(rank=...))")
    ap.add_argument("--compile", action="store_true",
                    help="torch.compile the decoder layers (CapturedDecoder(compile=True)) for every method")
    ap.add_argument("--out", default="results_model.jsonl")
    args = ap.parse_args()
    args.contexts = [int(x) for x in args.contexts.split(",")]
    import torch

    from tqdm import tqdm

    model, tok = load_model(args)
    ceiling = copy_ceiling_gbs()
    print(f"# {args.model} ({args.weights}), copy ceiling {ceiling:.0f} GB/s, {torch.cuda.get_device_name()}, "
          f"layers {'compiled' if args.compile else 'eager'}")
    methods = args.methods.split(",")
    rows = []
    runs = [(c, int(b)) for c in args.contexts for b in args.batches.split(",")]
    for context, batch in tqdm(runs, desc="contexts x batches"):
        ids = token_ids(args, tok, context + args.steps + 1, batch)
        res = {}
        for m in methods:
            k = None
            if m == "topk":  # at the budget of the first PSA tau 0.95 method of the run
                budget = next((res[x]["share"] for x in methods if x.startswith("psa0.95") and x in res), None)
                if budget is None:
                    print(f"  topk T={context} B={batch}: skipped (no psa0.95... method ran before it)")
                    continue
                n = -(-context // 16)
                k = max(2, int(round(budget * n)))
            t0 = time.time()
            try:
                res[m] = run_method(model, m, ids, args, k=k)
            except torch.cuda.OutOfMemoryError as exc:
                print(f"  {m} T={context} B={batch}: out of memory ({exc})")
                continue
            r = res[m]
            base = res.get("sdpa")
            same = int((r["tokens"] == base["tokens"]).sum()) if base else 0
            agree = same / r["tokens"].numel() if base else float("nan")
            agree_lo, agree_hi = wilson_interval(same, r["tokens"].numel()) if base else (float("nan"),) * 2
            dense = res.get("paged") if m != "paged" else None  # our dense step: the same kernels' roundings
            agree_dense = float((r["tokens"] == dense["tokens"]).float().mean()) if dense else float("nan")
            ppl = float(torch.exp(-r["logp"].mean()))
            dppl = (ppl / float(torch.exp(-base["logp"].mean())) - 1) if base else float("nan")
            fb = floor_bytes(model, context, batch, r["share"], m)
            floor_ms = fb / (ceiling * 1e9) * 1e3
            row = dict(model=args.model, weights=args.weights, context=context, batch=batch, method=m, k=k,
                       gqa=args.gqa, compiled=args.compile, rank=r["rank"], ms=r["ms"],
                       tokens_per_s=batch / r["ms"] * 1e3, agreement=agree,
                       agreement_95=[agree_lo, agree_hi], agreement_paged=agree_dense,
                       tokens_scored=int(r["tokens"].numel()), ppl=ppl, dppl=dppl,
                       share=r["share"], kv_bytes=r["kv_bytes"], meta_bytes=r["meta_bytes"], floor_ms=floor_ms,
                       step_over_floor=r["ms"] / floor_ms, speedup=(base["ms"] / r["ms"]) if base else 1.0,
                       ceiling_gbs=ceiling, wall_s=time.time() - t0)
            rows.append(row)
            print(f"  T={context:6d} B={batch:3d} {m:8s} {r['ms']:7.3f} ms  {row['tokens_per_s']:8.0f} tok/s  "
                  f"x{row['speedup']:.2f}  floor {floor_ms:.3f} ms (x{row['step_over_floor']:.1f})  "
                  f"read {100 * r['share']:5.1f}%  agree {100 * agree:5.1f}% "
                  f"[{100 * agree_lo:.1f}, {100 * agree_hi:.1f}] (paged {100 * agree_dense:5.1f}%)  "
                  f"dppl {100 * dppl:+.2f}%", flush=True)
            with open(args.out, "a") as f:
                f.write(json.dumps(row) + "\n")
    print("\n| T | B | method | ms/step | tokens/s | × sdpa | floor ms | ÷ floor | read % | agree % (95% interval) | "
          "Δppl % |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['context']} | {r['batch']} | {r['method']} | {r['ms']:.3f} | {r['tokens_per_s']:.0f} | "
              f"{r['speedup']:.2f} | {r['floor_ms']:.3f} | {r['step_over_floor']:.1f} | {100 * r['share']:.1f} | "
              f"{100 * r['agreement']:.1f} ({100 * r['agreement_95'][0]:.1f}–{100 * r['agreement_95'][1]:.1f}) | "
              f"{100 * r['dppl']:+.2f} |")


if __name__ == "__main__":
    main()
