"""Calibrate ``psa_fast.synthetic.long_context_profiles`` on the Gemma 3 32K captures, fit how the budget grows.

Measures, on the four Gemma 3 270M captures of docs/accuracy.md ("Long context", written by
``examples/capture_trace.py``; global layers 5, 11, 17, 4 query heads, a window end every 2K up to 32K, 32 query
positions 4 apart before each), every head-query's block masses (blocks of 16 keys, keys ``0..p``) and from them:
the ideal budget (the fewest blocks, heaviest first, holding 90/95/99% of the mass), block 0's share of the mass (the
sink: the ``<bos>`` token and its block), and the shares of the last two blocks (the recent window). Then:

1. fits ``n_ideal = a * N ** b`` by least squares on ``log``: ``N`` the mean blocks of a context, ``n_ideal`` the
   mean τ 0.95 budget in blocks over its head-queries, one point per window end 2K, 4K, ..., 32K (16 points),
   pooled over the three layers and per layer; and the same fit on 8K..32K only, to show how much the exponent
   depends on the range;
2. writes ``psa_fast/data/long_context_profiles.json``: the fits, and the per-head samples the generator draws
   from (every 4th query position, the phase turning with text and layer so that all four positions of a block
   appear: 384 head-queries per window end, their measured mean share within 1.5% of all 1536);
3. draws ``long_context_profiles`` at every window end and at 64K, 96K and 128K and prints them beside the trace
   (a markdown table, as docs/performance.md shows it);
4. draws ``docs/img/psa_long_budget_fit.png``: the measured points per layer, the fits, and the extrapolation to
   128K, marked as such.

Regenerate (about 2 minutes of measuring on 2 cores, kept by ``--rows`` for a second run, and 3 of drawing)::

    python examples/fit_long_budget.py --rows /tmp/psa_long/fit_rows.npz

The captures: ``W32=$(seq -s, 2048 2048 32768)`` and ``python examples/capture_trace.py --model gemma3 --text
stdlib --tokens 32768 --windows $W32 --positions 32 --stride 4 --out /tmp/psa_long/gemma3_stdlib_32k.npz``, and the
three rotations of ``examples/plot_long_context.py``'s docstring (``unittest``, ``xml``, ``multiprocessing``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from psa_ref import _plotting
from psa_ref.analysis import blocks_for_mass
from psa_ref.trace import Trace, load_trace

ROOT = Path(__file__).resolve().parents[1]
BLOCK = 16
TAU = 0.95
FRACTIONS = (0.9, 0.95, 0.99)
RECENT = 2  # recent blocks measured (the last, possibly partial, block and the one before)
TEXTS = ("stdlib", "unittest", "xml", "multiprocessing")
LONGER = (65536, 98304, 131072)  # lengths drawn beyond the captures, by the fit
FIELDS = ("text", "layer", "position", "context", "head", "n_blocks", "n90", "n95", "n99", "sink", "last", "prev")
SAMPLE_COLUMNS = ("layer", "n_blocks", "n95", "sink", "last", "prev", "n90", "n99")
STYLE = {"font.size": 11, "axes.titlesize": 12, "axes.labelsize": 11, "legend.fontsize": 9}


def context_of(trace: Trace) -> np.ndarray:
    """``[P]``: the window end (context length) each query position belongs to: the first end above it."""
    ends = np.asarray(sorted(trace.meta.get("windows", [trace.k.shape[2]])))
    return ends[np.searchsorted(ends, trace.positions, side="right")]


def measure(trace: Trace, text: int) -> np.ndarray:
    """``[rows, len(FIELDS)]`` float64, one row per (layer, query position, query head) of ``trace``."""
    hq, hkv = trace.q.shape[2], trace.k.shape[1]
    group = hq // hkv
    contexts = context_of(trace)
    rows = []
    for li, layer in enumerate(trace.layers):
        for g in range(hkv):
            keys = trace.k[li, g].astype(np.float64)
            for i, p in enumerate(trace.positions):
                q = trace.q[li, i, g * group : (g + 1) * group].astype(np.float64)  # [G, D]
                logits = trace.scale * (keys[: p + 1] @ q.T)  # [p + 1, G]
                w = np.exp(logits - logits.max(axis=0))
                mass = np.add.reduceat(w, np.arange(0, p + 1, BLOCK), axis=0)  # [N, G]
                share = mass / mass.sum(axis=0)
                need = [blocks_for_mass(mass, f) for f in FRACTIONS]
                for h in range(group):
                    rows.append((text, layer, p, contexts[i], g * group + h, mass.shape[0], *(n[h] for n in need),
                                 share[0, h], share[-1, h], share[-2, h]))
    return np.asarray(rows, dtype=np.float64)


def column(rows: np.ndarray, name: str) -> np.ndarray:
    return rows[:, FIELDS.index(name)]


def points(rows: np.ndarray, layer=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(contexts, mean blocks N, mean τ 0.95 budget in blocks)`` per window end, of one layer or pooled."""
    keep = np.ones(len(rows), bool) if layer is None else column(rows, "layer") == layer
    ctx = column(rows, "context")
    contexts = np.unique(ctx[keep])
    n = np.array([column(rows, "n_blocks")[keep & (ctx == c)].mean() for c in contexts])
    need = np.array([column(rows, "n95")[keep & (ctx == c)].mean() for c in contexts])
    return contexts, n, need


def fit_power_law(n: np.ndarray, need: np.ndarray) -> dict:
    """Least squares of ``log need = log a + b log n``: ``a``, ``b``, the rms and largest ``|log|`` residual and
    the largest relative error ``|fit / measured - 1|``."""
    b, log_a = np.polyfit(np.log(n), np.log(need), 1)
    resid = np.log(need) - (log_a + b * np.log(n))
    pred = np.exp(log_a) * n**b
    return {"a": float(np.exp(log_a)), "b": float(b), "rms_log_residual": float(np.sqrt(np.mean(resid**2))),
            "max_log_residual": float(np.abs(resid).max()),
            "max_relative_error": float(np.abs(pred / need - 1).max()), "points": int(len(n))}


def fits(rows: np.ndarray) -> dict:
    """The pooled and per-layer fits on every window end, and the pooled fit on 8K..32K only."""
    out = {"form": "n_ideal = a * N ** b", "N": "blocks of 16 tokens in the context (keys 0..p)",
           "n_ideal": "mean over head-queries of the fewest blocks, heaviest first, holding 95% of the mass",
           "points": {}}
    for layer in (None, *sorted({int(x) for x in column(rows, "layer")})):
        contexts, n, need = points(rows, layer)
        key = "pooled" if layer is None else str(layer)
        out[key if layer is None else f"layer_{layer}"] = {**fit_power_law(n, need), "contexts": [
            int(contexts[0]), int(contexts[-1])]}
        out["points"][key] = [[int(c), round(float(x), 2), round(float(y), 2)] for c, x, y in zip(contexts, n, need)]
    contexts, n, need = points(rows)
    late = contexts >= 8192
    out["pooled_from_8k"] = {**fit_power_law(n[late], need[late]), "contexts": [8192, int(contexts[-1])]}
    return out


def subsample(rows: np.ndarray) -> np.ndarray:
    """Every 4th query position of each window, the phase turning with text and layer (all four positions of a
    block's 16 appear in each window)."""
    index = ((column(rows, "position").astype(np.int64) + 1) % 128) // 4  # 0..31 within the window
    phase = column(rows, "text").astype(np.int64) + column(rows, "layer").astype(np.int64)
    return rows[(index + phase) % 4 == 0]


def sample_table(rows: np.ndarray) -> dict:
    """``{"columns": SAMPLE_COLUMNS, "by_context": {context: [[...], ...]}}``: integers as such, shares to three
    significant digits."""
    sub = subsample(rows)
    out = {}
    for c in np.unique(column(sub, "context")):
        rs = sub[column(sub, "context") == c]
        out[str(int(c))] = [[int(r[FIELDS.index("layer")]), int(r[FIELDS.index("n_blocks")]),
                             int(r[FIELDS.index("n95")]), *(float(f"{r[FIELDS.index(k)]:.3g}") for k in
                                                            ("sink", "last", "prev")),
                             int(r[FIELDS.index("n90")]), int(r[FIELDS.index("n99")])] for r in rs]
    return {"columns": list(SAMPLE_COLUMNS), "by_context": out}


def compare(rows: np.ndarray, *, num_profiles: int, seed: int) -> list[dict]:
    """Per window end (and the longer lengths): the trace's ideal shares and sink against profiles drawn there."""
    from psa_fast.synthetic import ideal_share, long_context_budget, long_context_profiles

    out = []
    ctx = column(rows, "context")
    for c in [*np.unique(ctx).astype(int), *LONGER]:
        n_blocks = c // BLOCK
        prof = long_context_profiles(n_blocks, num_profiles=num_profiles, seed=seed)
        mass = np.exp(prof)
        synth = {f: ideal_share(prof, f) for f in FRACTIONS}
        entry = {"context": int(c), "n_blocks": n_blocks, "fit_share": long_context_budget(n_blocks) / n_blocks,
                 "synthetic": {"mean": float(synth[TAU].mean()), "median": float(np.median(synth[TAU])),
                               "p90": float(np.percentile(synth[TAU], 90)),
                               "n90_over_n95": float(np.median(synth[0.9] / synth[TAU])),
                               "n99_over_n95": float(np.median(synth[0.99] / synth[TAU])),
                               "sink": float((mass[:, 0] / mass.sum(axis=1)).mean())}}
        keep = ctx == c
        if keep.any():
            share = column(rows, "n95")[keep] / column(rows, "n_blocks")[keep]
            entry["trace"] = {"mean": float(share.mean()), "median": float(np.median(share)),
                              "p90": float(np.percentile(share, 90)),
                              "n90_over_n95": float(np.median(column(rows, "n90")[keep] / column(rows, "n95")[keep])),
                              "n99_over_n95": float(np.median(column(rows, "n99")[keep] / column(rows, "n95")[keep])),
                              "sink": float(column(rows, "sink")[keep].mean())}
        out.append(entry)
    return out


def markdown(comparison: list[dict]) -> str:
    """The comparison as a markdown table (powers of two and the longer lengths)."""
    lines = ["| context | source | mean share | median | p90 | n90 / n95 | n99 / n95 | block 0's mass | "
             "the fit's share |",
             "|---|---|---|---|---|---|---|---|---|"]
    for e in comparison:
        c = e["context"]
        if c & (c - 1) and c not in LONGER:
            continue
        label = f"{c // 1024}K"
        for source in ("trace", "synthetic"):
            if source not in e:
                continue
            s = e[source]
            name = source if source == "trace" else ("synthetic (fit)" if "trace" not in e else source)
            lines.append(f"| {label} | {name} | {s['mean']:.1%} | {s['median']:.1%} | {s['p90']:.1%} | "
                         f"{s['n90_over_n95']:.2f} | {s['n99_over_n95']:.2f} | {s['sink']:.1%} | "
                         f"{e['fit_share']:.1%} |")
    return "\n".join(lines)


def plot(fit: dict, comparison: list[dict], out: Path) -> Path:
    """Left: mean budget in blocks against context (log-log), measured per layer and pooled, the fits and the
    extrapolation to 128K; right: the same as a share of the blocks, with the synthetic profiles' mean share."""
    plt = _plotting.pyplot()
    colors = {"5": "tab:purple", "11": "tab:green", "17": "tab:orange", "pooled": "black"}
    inside, beyond = np.geomspace(2048 / BLOCK, 32768 / BLOCK, 100), np.geomspace(32768 / BLOCK, 131072 / BLOCK, 50)
    grid = np.concatenate([inside, beyond])
    with plt.rc_context(STYLE):
        fig, axes = plt.subplots(1, 2, figsize=(12, 4.6))
        for ax, as_share in zip(axes, (False, True)):
            ax.axvspan(32768, 131072, color="0.92", zorder=0)
            ax.text(0.985, 0.97, "extrapolated\n(no capture)", transform=ax.transAxes, ha="right", va="top",
                    color="0.35")
            for key, pts in fit["points"].items():
                c, n, need = (np.array(v) for v in zip(*pts))
                y = need / n if as_share else need
                label = "measured, 3 layers pooled" if key == "pooled" else f"measured, layer {key}"
                ax.plot(c, 100 * y if as_share else y, "o" if key == "pooled" else ".", color=colors[key],
                        ms=6 if key == "pooled" else 5, label=label, zorder=3)
                params = fit["pooled" if key == "pooled" else f"layer_{key}"]
                labels = ("fit a N^b, pooled (thin: per layer)", "the fit extrapolated") if key == "pooled" else (
                    "", "")
                for part, ls, name in ((inside, "-", labels[0]), (beyond, "--", labels[1])):  # dashed: extrapolated
                    model = params["a"] * part**params["b"]
                    ax.plot(part * BLOCK, 100 * model / part if as_share else model, ls, color=colors[key],
                            lw=2 if key == "pooled" else 1, alpha=1 if key == "pooled" else 0.6, label=name or None)
            late = fit["pooled_from_8k"]
            model = late["a"] * grid**late["b"]
            ax.plot(grid * BLOCK, 100 * model / grid if as_share else model, ":", color="0.4", lw=1.5,
                    label=f"pooled fit on 8K-32K only (b = {late['b']:.3f})")
            synth = [(e["context"], e["synthetic"]["mean"], e["synthetic"]["mean"] * e["n_blocks"])
                     for e in comparison]
            c, share, blocks = zip(*synth)
            ax.plot(c, 100 * np.array(share) if as_share else blocks, "x", color="tab:red", ms=7,
                    label="long_context_profiles, mean", zorder=4)
            ax.set_xscale("log", base=2)
            ticks = [2048 * 2**i for i in range(7)]
            ax.set_xticks(ticks, [f"{t // 1024}K" for t in ticks])
            ax.set_xlabel("context (tokens)")
            ax.grid(alpha=0.3, which="both")
            if as_share:
                ax.set_ylabel("mean ideal budget (% of blocks)")
                ax.set_ylim(0, 50)
                ax.set_title("the same as a share of the blocks")
            else:
                ax.set_yscale("log")
                ax.set_ylabel("mean ideal τ 0.95 budget (blocks of 16)")
                p = fit["pooled"]
                ax.set_title(f"pooled fit: n = {p['a']:.3f} N^{p['b']:.3f}, rms log residual "
                             f"{p['rms_log_residual']:.3f}")
        axes[0].legend(loc="upper left")
        return _plotting.save(fig, out)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gemma", nargs="+", default=[f"/tmp/psa_long/gemma3_{t}_32k.npz" for t in TEXTS],
                        help="Gemma 3 captures (32K), pooled")
    parser.add_argument("--rows", default=None, help="keep the measurement here (.npz) and reuse it if present")
    parser.add_argument("--json", default=str(ROOT / "psa_fast" / "data" / "long_context_profiles.json"))
    parser.add_argument("--figure", default=str(ROOT / "docs" / "img" / "psa_long_budget_fit.png"))
    parser.add_argument("--profiles", type=int, default=512, help="profiles drawn per length for the comparison")
    args = parser.parse_args(argv)

    captures = []
    if args.rows and Path(args.rows).exists():
        with np.load(args.rows, allow_pickle=False) as f:
            rows, captures = f["rows"], json.loads(str(f["captures"]))
    else:
        parts = []
        for text, path in enumerate(args.gemma):
            trace = load_trace(path)
            parts.append(measure(trace, text))
            captures.append({"path": Path(path).name, **{k: trace.meta.get(k) for k in (
                "model", "gguf_file", "gguf_sha256", "text", "text_packages", "tokens", "windows", "layers",
                "positions_per_window", "stride", "compute_dtype")}})
            print(f"measured {path}: {len(parts[-1])} head-queries", flush=True)
            del trace
        rows = np.concatenate(parts)
        if args.rows:
            np.savez_compressed(args.rows, rows=rows, captures=json.dumps(captures))

    fit = fits(rows)
    data = {"about": "Per-head block-mass statistics of Gemma 3 270M's global layers on CPython sources (blocks of "
                     "16 tokens, τ 0.95) and the fit of the ideal budget against context; read by "
                     "psa_fast.synthetic.long_context_profiles.",
            "command": "python examples/fit_long_budget.py", "block_size": BLOCK, "tau": TAU, "recent_blocks": RECENT,
            "captures": captures, "fit": fit, "samples": sample_table(rows)}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(data, separators=(",", ":")) + "\n", encoding="utf-8")
    print(f"wrote {args.json}")

    from psa_fast import synthetic

    synthetic.load_long_context_data.cache_clear()  # the file just written
    comparison = compare(rows, num_profiles=args.profiles, seed=0)
    print(f"wrote {plot(fit, comparison, Path(args.figure))}\n")
    for key in ("pooled", "layer_5", "layer_11", "layer_17", "pooled_from_8k"):
        p = fit[key]
        print(f"{key:15s} a = {p['a']:.4f}  b = {p['b']:.4f}  rms log residual {p['rms_log_residual']:.3f}  "
              f"max relative error {p['max_relative_error']:.1%}  ({p['points']} points "
              f"{p['contexts'][0] // 1024}K-{p['contexts'][1] // 1024}K)")
    print()
    print(markdown(comparison))
    return {"fit": fit, "comparison": comparison}


if __name__ == "__main__":
    main()
