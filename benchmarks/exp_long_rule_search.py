"""Stop-rule search at 32K (issue 16, item 4): cache every head-query's block masses once, then score rules fast.

``benchmarks/exp_long_rules.py`` runs the library's rules through [`psa_ref.sweep.attention`][psa_ref.sweep.attention]
(about 15 s a query on 2 cores for every rule). Searching for a new rule needs many candidates on many more queries,
so this script splits the work like ``examples/stop_rule_research.py``:

1. ``cache``: for every query (all 32 before the window's end by default) of every capture and global layer, the
   true block masses under one maximum per head, the ``cuboid_mean`` and ``quant3`` estimates (the same formulas as
   [`psa_ref.scoring.estimate`][psa_ref.scoring.estimate], vectorised; checked against it on the first case), the
   ideal per-head budget, and, for every processing order (metadata x GQA mode x forced blocks), the relative output
   error after every prefix of the order. One ``.npz`` per query (and KV head) in ``--cache`` (1.5-2 s a Gemma 32K
   query per core; 11 minutes for the four captures on 2 cores).
2. ``score``: every candidate rule's stop at every prefix from the cached arrays (cumulative sums), per split
   (tuned-on / held-out; ``--by layer|text`` breaks them down), with top-k's error at the same mean budget read off
   the same prefix curves (top-k with ``k`` blocks attends the first ``k`` of the same processing order).

Rules (``--rules``, comma-separated ``name[:key=value;...]``): ``oracle`` (stops exactly at tau on the true
masses), ``ema[:w=..;gamma=..]``, ``remaining``, ``sketch[:lam=..;W=..;gamma=..]`` (a fixed share ``lam``),
``sketchn:c=..`` (share ``c / N``) and ``sketch_avg`` (``sketchn`` with psa_ref's ``SKETCH_AVG_SHARE``).

What ``psa_ref`` implements was then confirmed through [`psa_ref.sweep.attention`][psa_ref.sweep.attention] and
[`psa_ref.topk_attention`][psa_ref.topk_attention] (``exp_long_rules.py --quant3 --quant3-rules sketch,sketch_avg
--positions 8``): on the same head-queries both give the same mean blocks, mass, error and top-k error to every digit.

    python benchmarks/exp_long_rule_search.py cache --jobs 2          # the four Gemma 32K captures, 32 queries each
    python benchmarks/exp_long_rule_search.py score --rules oracle,ema,sketch,sketch_avg \
        --configs quant3/per_head/1+1,cuboid_mean/per_head/1+1 --out /tmp/scores.json
    python benchmarks/exp_long_rule_search.py reads [--by layer]    # KV blocks read: shared, per head, union
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from psa_ref import analysis
from psa_ref.scoring import forced_blocks, group_rank_key, processing_order
from psa_ref.trace import load_trace

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from stop_rule_research import suffix_sum, window_sum  # noqa: E402  (the 2K research's prefix sums)

TEXTS = ("stdlib", "unittest", "xml", "multiprocessing")
DEFAULT_TRACES = [f"/tmp/psa_long/gemma3_{t}_32k.npz" for t in TEXTS]
BLOCK = 16
TAU = 0.95
QUANT_LEVELS = 8
# processing orders cached: (metadata, gqa, sink, recent); "share" is shared selection ranked by the largest
# estimated share of a head's mass (psa_ref.attention(..., rank="share"))
CONFIGS = [(m, g, s, s) for m in ("cuboid_mean", "quant3") for g in ("per_head", "shared", "share") for s in (0, 1)]


def config_name(c) -> str:
    return f"{c[0]}/{c[1]}/{c[2]}+{c[3]}"


def estimates(q: np.ndarray, keys: np.ndarray, scale: float) -> dict[str, np.ndarray]:
    """``cuboid_mean`` and ``quant3`` estimates ``[N, G]`` of query heads ``q [G, D]`` over one KV head ``[T, D]``."""
    t, d = keys.shape
    n = -(-t // BLOCK)
    pad = np.full((n * BLOCK, d), np.nan)
    pad[:t] = keys
    kb = pad.reshape(n, BLOCK, d)
    valid = ~np.isnan(kb[..., 0])  # [N, S]
    lo, hi = np.nanmin(kb, axis=1), np.nanmax(kb, axis=1)
    center = (lo + hi) / 2
    radius = np.nanmean(np.abs(kb - center[:, None]), axis=1)
    cuboid = scale * (center @ q.T + radius @ np.abs(q).T)
    span = (hi - lo)[:, None]
    flat = span == 0
    kz = np.where(valid[..., None], kb, lo[:, None])
    with np.errstate(divide="ignore", invalid="ignore"):
        code = np.floor((kz - lo[:, None]) / np.where(flat, 1.0, span) * QUANT_LEVELS)
    code = np.clip(np.where(flat, 0.0, code), 0, QUANT_LEVELS - 1)
    k_hat = lo[:, None] + (code + 0.5) / QUANT_LEVELS * span
    sk = scale * np.einsum("nsd,gd->ngs", k_hat, q)
    sk = np.where(valid[:, None, :], sk, -np.inf)
    top = sk.max(axis=2, keepdims=True)
    lengths = valid.sum(axis=1)
    quant3 = (top[..., 0] + np.log(np.exp(sk - top).sum(axis=2))) - np.log(lengths)[:, None]
    return {"cuboid_mean": cuboid, "quant3": quant3}


def build_case(q, keys, values, scale) -> dict[str, np.ndarray]:
    """Every cached array of one query (one KV head: Gemma 3 has one)."""
    q, keys, values = (np.asarray(a, dtype=np.float64) for a in (q, keys, values))
    g = q.shape[0]
    mass, weighted = analysis.block_sums(q, keys, values, BLOCK, scale)  # [N, G], [N, G, D]
    n = mass.shape[0]
    dense = weighted.sum(0) / mass.sum(0)[:, None]
    est = estimates(q, keys, scale)
    lengths = np.full(n, BLOCK)
    lengths[-1] = keys.shape[0] - (n - 1) * BLOCK
    logits = scale * keys @ q.T
    gmax = logits.max(axis=0)
    starts = np.arange(0, keys.shape[0], BLOCK)
    out = {"mass": mass, "lengths": lengths, "ideal": analysis.blocks_for_mass(mass, TAU),
           "bmax": np.maximum.reduceat(logits, starts, axis=0) - gmax}
    for m, e in est.items():
        out[f"est/{m}"] = e - gmax  # relative to the head's maximum logit, like the masses
    heads = np.arange(g)
    for c in CONFIGS:
        m, gqa, sink, recent = c
        e = est[m]
        forced = forced_blocks(n, sink, recent)
        if gqa == "per_head":
            order = np.stack([processing_order(e[:, h], forced) for h in range(g)], axis=1)
        else:  # one order for the group, ranked as psa_ref.attention(rank=...) ranks it
            key = group_rank_key(e.T, lengths, "share" if gqa == "share" else "estimate")
            order = np.repeat(processing_order(key, forced)[:, None], g, axis=1)
        cw = np.cumsum(weighted[order, heads], axis=0)
        cm = np.cumsum(mass[order, heads], axis=0)
        err = analysis.relative_error(cw / cm[..., None], dense)
        out[f"order/{config_name(c)}"] = order.astype(np.int16)
        out[f"err/{config_name(c)}"] = err.astype(np.float32)
    return out


@functools.lru_cache(maxsize=1)
def _trace(path):
    return load_trace(path)


def _cache_one(job):
    path, li, pi, kv, dst = job
    if Path(dst).exists():
        return dst
    tr = _trace(path)
    q, keys, values = tr.case(li, pi)
    g = q.shape[0] // keys.shape[0]
    arrays = build_case(q[kv * g : (kv + 1) * g], keys[kv], values[kv], tr.scale)
    tmp = dst + ".tmp.npz"
    np.savez(tmp, **arrays)
    os.replace(tmp, dst)
    return dst


def cache_main(args) -> None:
    jobs = []
    for path in args.traces:
        tr = _trace(path)
        text = (tr.meta.get("text_packages") or [Path(path).stem])[0]
        for w in [int(x) for x in args.windows.split(",")]:
            idx = [i for i, p in enumerate(tr.positions) if w - 2048 <= p < w]
            if args.positions is not None and args.positions < len(idx):
                idx = [idx[i] for i in np.linspace(0, len(idx) - 1, args.positions).round().astype(int)]
            layers = range(len(tr.layers))
            if args.layers:
                layers = [i for i, layer in enumerate(tr.layers) if str(layer) in args.layers.split(",")]
            for li in layers:
                for pi in idx:
                    for kv in range(tr.k.shape[1]):
                        head = f"_kv{kv}" if tr.k.shape[1] > 1 else ""
                        dst = Path(args.cache) / f"{text}_w{w}_L{tr.layers[li]}_p{tr.positions[pi]}{head}.npz"
                        jobs.append((path, li, pi, kv, str(dst)))
    Path(args.cache).mkdir(parents=True, exist_ok=True)
    # check the vectorised estimates against psa_ref once
    from psa_ref import KVBlocks
    from psa_ref.scoring import estimate
    tr = load_trace(args.traces[0])
    q, keys, values = tr.case(0, 0)
    q64 = np.asarray(q, dtype=np.float64)
    g = q.shape[0] // keys.shape[0]
    mine = estimates(q64[:g], np.asarray(keys[0], dtype=np.float64), tr.scale)
    for m in ("cuboid_mean", "quant3"):
        blocks = KVBlocks.from_dense(keys[:1], values[:1], block_size=BLOCK, metadata=m)
        ref = estimate(q64[:g], blocks, tr.scale)
        assert np.allclose(mine[m].T, ref, rtol=1e-9, atol=1e-9), m
    t0 = time.time()
    with ProcessPoolExecutor(args.jobs) as ex:
        for i, _ in enumerate(ex.map(_cache_one, jobs), 1):
            if i % 16 == 0 or i == len(jobs):
                print(f"{i}/{len(jobs)} cached, {time.time() - t0:.0f} s", flush=True)


# --- scoring ---------------------------------------------------------------------------------------------------------


class View:
    """One cached query under one processing order: ``[N, G]`` arrays in processing order (column ``h`` in head
    ``h``'s own order with ``per_head``), masses and log estimates relative to each head's maximum logit."""

    def __init__(self, arrays, config):
        name = config_name(config)
        order = arrays[f"order/{name}"].astype(np.int64)
        heads = np.arange(order.shape[1])
        self.mass = arrays["mass"][order, heads]
        self.total = arrays["mass"].sum(axis=0)
        self.est = arrays[f"est/{config[0]}"][order, heads]
        self.length = arrays["lengths"][order].astype(np.float64)
        self.bmax = arrays["bmax"][order, heads]
        self.err = arrays[f"err/{name}"].astype(np.float64)
        self.ideal = arrays["ideal"]
        self.forced = config[2] + config[3]
        self.shared = config[1] != "per_head"
        self.order = order
        self.acc = np.cumsum(self.mass, axis=0)
        n = self.mass.shape[0]
        self.left = (n - np.arange(1, n + 1))[:, None].astype(np.float64)
        self.ranked = (np.arange(n) >= self.forced)[:, None] & np.ones(self.mass.shape, dtype=bool)


def _kw(spec: str) -> tuple[str, dict]:
    name, _, rest = spec.partition(":")
    kw = {}
    for part in filter(None, rest.split(";")):
        k, v = part.split("=")
        kw[k] = float(v)
    return name, kw


def holds_of(v: View, spec: str, tau: float) -> np.ndarray:
    """``[N, G]`` bool: whether rule ``spec`` (``name:k=v;k=v``) holds after each prefix."""
    from psa_ref.sweep import ema_prefix

    name, kw = _kw(spec)
    if name == "sketch_avg":  # the rule psa_ref implements: sketchn with c = SKETCH_AVG_SHARE
        from psa_ref.progressive import SKETCH_AVG_SHARE
        name, kw = "sketchn", {"c": SKETCH_AVG_SHARE, **kw}
    acc = v.acc
    if name == "oracle":
        return acc / v.total >= tau - 1e-12
    if name == "ema":
        rest = v.left * ema_prefix(v.mass, kw.get("w", 0.125))
        return acc / (acc + kw.get("gamma", 1.0) * rest) >= tau
    if name == "remaining":
        return acc / (acc + v.left * np.minimum.accumulate(v.mass, axis=0)) >= tau
    if name in ("sketch", "sketchn"):
        # kappa over the last W ranked blocks, rest = gamma kappa sum_unseen p_j; next-share test with lam
        # (sketchn: lam = c / N, a share of the average block)
        w = int(kw.get("W", 16))
        lp = v.est + np.log(v.length)  # log p_j (relative to the head's max logit)
        p = np.exp(lp)
        m_r = np.where(v.ranked, v.mass, 0.0)
        p_r = np.where(v.ranked, p, 0.0)
        with np.errstate(divide="ignore", invalid="ignore"):
            kappa = window_sum(m_r, w) / window_sum(p_r, w)
        none_yet = np.cumsum(v.ranked, axis=0) == 0
        rest = kw.get("gamma", 1.0) * kappa * suffix_sum(p)
        rest = np.where(none_yet & (v.left > 0), np.inf, np.nan_to_num(rest, nan=np.inf))
        rest = np.where(v.left == 0, 0.0, rest)
        lam = kw.get("lam", 1e-3) if name == "sketch" else kw["c"] / v.mass.shape[0]
        nxt = np.concatenate([p[1:], np.zeros_like(p[:1])], axis=0)
        with np.errstate(invalid="ignore"):
            ok = (acc / (acc + rest) >= tau) & (nxt < lam * (acc + rest))
        return ok
    raise ValueError(spec)


def stops(v: View, spec: str, tau: float) -> np.ndarray:
    """``[G]`` blocks read (prefix length) at the first boundary where the rule holds (step 1)."""
    h = holds_of(v, spec, tau)
    h[: max(v.forced, 1) - 1] = False  # the first boundary follows the forced chunk
    h[-1] = True
    if v.shared:
        return np.full(h.shape[1], int(np.argmax(h.all(axis=1))) + 1)
    return np.argmax(h, axis=0) + 1


def load_cases(cache: str, tuned: set[str], window: int, by: str | None = None):
    out = []
    for f in sorted(Path(cache).glob(f"*_w{window}_*.npz")):
        text = f.name.split("_w")[0]
        layer = f.name.split("_L")[1].split("_")[0]
        with np.load(f) as z:
            arrays = {k: z[k] for k in z.files}
        split = "tuned-on" if text in tuned else "held-out"
        if by == "text":
            split = f"{split} {text}"
        elif by == "layer":
            split = f"{split} layer {layer}"
        out.append((split, text, f.name, arrays))
    return out


def score(cases, config, specs, tau=TAU):
    """Per split and rule: the item's three criteria and the numbers behind them."""
    rows = []
    views = [(split, text, View(a, config)) for split, text, _, a in cases]
    for spec in specs:
        per = {}
        for split, text, v in views:
            k = stops(v, spec, tau)
            heads = np.arange(k.size)
            d = per.setdefault(split, {"blocks": [], "mass": [], "err": [], "ideal": [], "n": [], "views": [],
                                       "text": []})
            d["blocks"].extend(k)
            d["mass"].extend(v.acc[k - 1, heads] / v.total)
            d["err"].extend(v.err[k - 1, heads])
            d["ideal"].extend(v.ideal)
            d["n"].extend([v.mass.shape[0]] * k.size)
            d["text"].extend([text] * k.size)
            d["views"].append(v)
        for split, d in sorted(per.items(), key=lambda x: (not x[0].startswith("tuned-on"), x[0])):
            blocks, mass, err, ideal = (np.array(d[c], dtype=float) for c in ("blocks", "mass", "err", "ideal"))
            kk = max(int(round(blocks.mean())), config[2] + config[3], 1)
            terr = np.concatenate([v.err[min(kk, v.err.shape[0]) - 1] for v in d["views"]])
            ratio = blocks.mean() / ideal.mean()
            row = {"config": config_name(config), "rule": spec, "split": split, "head_queries": int(blocks.size),
                   "mass_mean": float(mass.mean()), "mass_p1": float(np.percentile(mass, 1)),
                   "share_mean": float(np.mean(blocks / np.array(d["n"]))), "blocks_mean": float(blocks.mean()),
                   "ideal_mean": float(ideal.mean()), "budget_ratio": float(ratio), "err_mean": float(err.mean()),
                   "err_p99": float(np.percentile(err, 99)), "topk_k": kk, "topk_err_mean": float(terr.mean())}
            row["pass"] = {"mass_p1>=0.90": row["mass_p1"] >= 0.90, "budget<=1.5x": ratio <= 1.5,
                           "err<=topk": row["err_mean"] <= row["topk_err_mean"]}
            rows.append(row)
    return rows


def print_rows(rows) -> None:
    print("| config | rule | split | n | mass mean | mass p1 | share | x ideal | err | top-k k | top-k err | meets |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        met = "".join("✓" if x else "✗" for x in r["pass"].values())
        print(f"| {r['config']} | `{r['rule']}` | {r['split']} | {r['head_queries']} | {r['mass_mean']:.3f} "
              f"| {r['mass_p1']:.3f} | {100 * r['share_mean']:.1f}% | {r['budget_ratio']:.2f} | {r['err_mean']:.4f} "
              f"| {r['topk_k']} | {r['topk_err_mean']:.4f} | {met} |")


def score_main(args) -> None:
    cases = load_cases(args.cache, set(args.tuned.split(",")), args.window, args.by)
    print(f"{len(cases)} cached queries x layers")
    rows = []
    for cfg in args.configs.split(","):
        m, g, f = cfg.split("/")
        s, r = (int(x) for x in f.split("+"))
        rows += score(cases, (m, g, s, r), args.rules.split(","), args.tau)
    print_rows(rows)
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1, default=float))


def kv_reads(cases, metadata: str = "quant3", spec: str = "sketch_avg", tau: float = TAU, forced: int = 1):
    """Per split: the share of a KV head's blocks that decode must read under each selection, with one KV head
    serving several query heads (Gemma 3: 4). ``shared``: one order and stop per KV head; per head: each query
    head's own stop, read once per head (``per_head_sum``, what a kernel that attends each head's blocks reads)
    or once per block of the heads' union (``per_head_union``, what a kernel attending every head of a block at
    once would read); and the same for the ideal per-head sets (the heaviest true blocks up to tau per head)."""
    per = {}
    for split, _, _, a in cases:
        n = a["mass"].shape[0]
        vp, vs = View(a, (metadata, "per_head", forced, forced)), View(a, (metadata, "shared", forced, forced))
        kp, ks = stops(vp, spec, tau), stops(vs, spec, tau)
        union = len(set().union(*(vp.order[: kp[h], h].tolist() for h in range(kp.size))))
        heaviest = np.argsort(-a["mass"], axis=0, kind="stable")
        ideal = len(set().union(*(heaviest[: a["ideal"][h], h].tolist() for h in range(kp.size))))
        per.setdefault(split, []).append((ks[0] / n, kp.mean() / n, kp.sum() / n, union / n,
                                          a["ideal"].mean() / n, ideal / n))
    keys = ("shared", "per_head_mean", "per_head_sum", "per_head_union", "ideal_per_head_mean", "ideal_union")
    return [{"split": split, "rule": spec, "metadata": metadata, "queries": len(rows),
             **dict(zip(keys, np.mean(rows, axis=0).tolist()))} for split, rows in sorted(per.items())]


def reads_main(args) -> None:
    cases = load_cases(args.cache, set(args.tuned.split(",")), args.window, args.by)
    rows = kv_reads(cases, args.metadata, args.rule, args.tau)
    print(f"share of a KV head's blocks read, {args.rule} on {args.metadata}, tau {args.tau}, 1 sink + 1 recent")
    print("| split | queries x layers | shared | per head: mean | per head: sum over heads | per head: union | "
          "ideal per head | ideal union |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['split']} | {r['queries']} | " + " | ".join(f"{100 * r[k]:.1f}%" for k in (
            "shared", "per_head_mean", "per_head_sum", "per_head_union", "ideal_per_head_mean", "ideal_union")) + " |")
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("cache")
    c.add_argument("traces", nargs="*", default=DEFAULT_TRACES)
    c.add_argument("--windows", default="32768")
    c.add_argument("--positions", type=int, default=None)
    c.add_argument("--cache", default="/tmp/psa_long/cache")
    c.add_argument("--jobs", type=int, default=2)
    c.add_argument("--layers", default=None, help="model layers to cache (default: every captured one)")
    sc = sub.add_parser("score")
    sc.add_argument("--cache", default="/tmp/psa_long/cache")
    sc.add_argument("--tuned", default="logging,unittest", help="captures (file name's text) counted as tuned-on")
    sc.add_argument("--window", type=int, default=32768)
    sc.add_argument("--tau", type=float, default=TAU)
    sc.add_argument("--configs", default="cuboid_mean/per_head/1+1,quant3/per_head/1+1")
    sc.add_argument("--rules", default="oracle,ema,sketch,sketch_avg")
    sc.add_argument("--out", default=None)
    sc.add_argument("--by", choices=("text", "layer"), default=None, help="break each split down")
    rd = sub.add_parser("reads", help="KV blocks read under shared / per-head selection and their union")
    rd.add_argument("--cache", default="/tmp/psa_long/cache")
    rd.add_argument("--tuned", default="logging,unittest")
    rd.add_argument("--window", type=int, default=32768)
    rd.add_argument("--tau", type=float, default=TAU)
    rd.add_argument("--metadata", default="quant3", choices=("quant3", "cuboid_mean"))
    rd.add_argument("--rule", default="sketch_avg")
    rd.add_argument("--by", choices=("text", "layer"), default=None)
    rd.add_argument("--out", default=None)
    args = ap.parse_args()
    {"cache": cache_main, "score": score_main, "reads": reads_main}[args.cmd](args)


if __name__ == "__main__":
    main()
