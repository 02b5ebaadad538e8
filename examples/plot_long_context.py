"""Figures and numbers of docs/accuracy.md, "Long context: real attention at 8K–32K".

The ideal budget of a head-query is the fewest blocks of 16 keys, heaviest first, that hold 90%, 95% or 99% of its
true attention mass ([`blocks_for_mass`][psa_ref.analysis.blocks_for_mass] of the block masses of
[`block_sums`][psa_ref.analysis.block_sums]), as a share of the blocks of its context (keys ``0..p``). The captures
come from ``examples/capture_trace.py``, four texts per model: CPython's ``logging``, ``unittest``, ``xml`` and
``multiprocessing`` sources, each order starting with a different package (about 2 minutes a Gemma capture and
1.3 a SmolLM2 one on 2 CPU cores)::

    W32=$(seq -s, 2048 2048 32768); W8=$(seq -s, 1024 1024 8192)
    python examples/capture_trace.py --model gemma3 --text stdlib --tokens 32768 --windows $W32 \\
        --positions 32 --stride 4 --out /tmp/psa_long/gemma3_stdlib_32k.npz
    python examples/capture_trace.py --model gemma3 --text stdlib:unittest,xml,multiprocessing,logging \\
        --tokens 32768 --windows $W32 --positions 32 --stride 4 --out /tmp/psa_long/gemma3_unittest_32k.npz
    #   ... stdlib:xml,multiprocessing,logging,unittest  -> gemma3_xml_32k.npz
    #   ... stdlib:multiprocessing,logging,unittest,xml  -> gemma3_multiprocessing_32k.npz
    python examples/capture_trace.py --model smollm2 --text stdlib --tokens 8192 --layers all --windows $W8 \\
        --positions 32 --stride 4 --out /tmp/psa_long/smollm2_stdlib_8k.npz
    #   ... and the same three rotations -> smollm2_{unittest,xml,multiprocessing}_8k.npz
    python examples/plot_long_context.py        # reads those eight paths, writes docs/img/ and the JSON below

The Gemma captures have a window end every 2K, the SmolLM2 ones every 1K; each query position counts at the context of
the window end just above it (the 32 positions before 32K are 32643 ... 32767: that context is 32K to within
0.4%). The tables keep the powers of two, the figure and the JSON every window. Writes:

* ``docs/img/psa_long_fig2_gemma3_32k.png``: the paper's Figure 2 at 32K, per global layer of Gemma 3 270M, the
  distribution over query positions, heads and texts of the share of blocks needed for 90/95/99% of the mass;
* ``docs/img/psa_long_budget_vs_context.png``: the mean ideal share against context length, per layer, both models;
* ``docs/long_context_tables.md``: the tables docs/accuracy.md includes (also printed last);
* ``benchmarks/results_long_context.json``: every summary number (mean, median, p90 of the share, mean blocks, the
  first token's and the first block's share of the mass, block 0's rank in the ``cuboid_mean`` order) per model,
  layer and context, and per text.

Runs in a few minutes on 2 cores (float64 products over up to 32K keys).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from psa_ref import _plotting
from psa_ref.analysis import block_sums, blocks_for_mass
from psa_ref.blocks import KVBlocks
from psa_ref.scoring import estimate
from psa_ref.trace import Trace, load_trace

ROOT = Path(__file__).resolve().parents[1]
BLOCK = 16
FRACTIONS = (0.9, 0.95, 0.99)
SMOLLM2_LAYERS = (0, 6, 12, 18, 24, 29)  # those of the shipped SmolLM2 trace
TEXTS = ("stdlib", "unittest", "xml", "multiprocessing")  # the captures' names: the package the text starts with
STYLE = {"font.size": 11, "axes.titlesize": 12, "axes.labelsize": 11, "legend.fontsize": 9.5}
LABELS = {"gemma3": "Gemma 3 270M", "smollm2": "SmolLM2-135M"}


def context_of(trace: Trace) -> np.ndarray:
    """``[P]``: the window end (context length) each query position belongs to: the first end above it."""
    ends = np.asarray(sorted(trace.meta.get("windows", [trace.k.shape[2]])))
    return ends[np.searchsorted(ends, trace.positions, side="right")]


def text_label(trace: Trace) -> str:
    """The capture's text: the first package of a ``stdlib`` text (the window starts there), else ``--text``."""
    packages = trace.meta.get("text_packages")
    return packages[0] if packages else str(trace.meta.get("text"))


def measure(trace: Trace, layers=None) -> list[dict]:
    """One row per (layer, query position, query head): the blocks needed for each of ``FRACTIONS`` of the true
    mass, the context's block count, the first token's (BOS where the tokenizer adds one) and the first block's
    share of the mass, and where ``p + 1`` is a whole number of blocks, the rank of block 0 in the order of the
    ``cuboid_mean`` estimates (0: first; None elsewhere)."""
    text = text_label(trace)
    hq, hkv = trace.q.shape[2], trace.k.shape[1]
    group = hq // hkv
    contexts = context_of(trace)
    rows = []
    for li, layer in enumerate(trace.layers):
        if layers is not None and int(layer) not in layers:
            continue
        for g in range(hkv):
            keys = trace.k[li, g].astype(np.float64)
            dummy = np.zeros((keys.shape[0], 1))  # only the masses are used: one value column keeps block_sums cheap
            # metadata of the whole window once; its first (p + 1) / S blocks are those of keys 0..p when S divides
            # p + 1 (the estimate does not read the values: the keys stand in for them)
            blocks = KVBlocks.from_dense(keys[None], keys[None], block_size=BLOCK, metadata="cuboid_mean")
            heads = slice(g * group, (g + 1) * group)
            for i, p in enumerate(trace.positions):
                q = trace.q[li, i, heads].astype(np.float64)  # [G, D]
                mass, _ = block_sums(q, keys[: p + 1], dummy[: p + 1], BLOCK, trace.scale)  # [N, G]
                logits = trace.scale * keys[: p + 1] @ q.T
                w = np.exp(logits - logits.max(axis=0))
                bos = w[0] / w.sum(axis=0)
                need = {f: blocks_for_mass(mass, f) for f in FRACTIONS}
                rank0 = [None] * group
                if (p + 1) % BLOCK == 0:
                    scores = estimate(q, blocks, trace.scale)[:, : mass.shape[0]]  # [G, N]
                    rank0 = (scores > scores[:, :1]).sum(axis=1).tolist()
                for h in range(group):
                    rows.append({"text": text, "layer": int(layer), "position": int(p), "context": int(contexts[i]),
                                 "head": g * group + h, "n_blocks": mass.shape[0],
                                 **{f"blocks_{f:g}": int(need[f][h]) for f in FRACTIONS},
                                 "bos": float(bos[h]), "block0": float(mass[0, h] / mass[:, h].sum()),
                                 "rank0": rank0[h]})
    return rows


def summarize(rows: list[dict]) -> list[dict]:
    """Mean, median and p90 of the ideal share per (layer, context) and fraction, mean blocks, BOS and block-0
    shares; plus an ``"all"`` layer pooling the layers of each context."""
    out = []
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["layer"], r["context"]), []).append(r)
        groups.setdefault(("all", r["context"]), []).append(r)
    for (layer, context), rs in sorted(groups.items(), key=lambda kv: (kv[0][0] == "all", str(kv[0][0]).zfill(3),
                                                                      kv[0][1])):
        entry = {"layer": layer, "context": context, "samples": len(rs),
                 "n_blocks_mean": float(np.mean([r["n_blocks"] for r in rs]))}
        for f in FRACTIONS:
            share = np.array([r[f"blocks_{f:g}"] / r["n_blocks"] for r in rs])
            entry[f"share_{f:g}"] = {"mean": float(share.mean()), "median": float(np.median(share)),
                                     "p90": float(np.percentile(share, 90))}
            entry[f"blocks_{f:g}_mean"] = float(np.mean([r[f"blocks_{f:g}"] for r in rs]))
        for key in ("bos", "block0"):
            values = np.array([r[key] for r in rs])
            entry[key] = {"mean": float(values.mean()), "median": float(np.median(values))}
        ranks = [r["rank0"] for r in rs if r["rank0"] is not None]
        entry["rank0_cuboid_mean"] = {"median": float(np.median(ranks)), "p90": float(np.percentile(ranks, 90)),
                                      "samples": len(ranks)} if ranks else None
        out.append(entry)
    return out


def by_text(rows: list[dict], fraction: float = 0.95) -> dict[str, dict[int, dict]]:
    """``{text: {context: {"mean": .., "median": .., "bos": ..}}}``: the ideal share at ``fraction`` pooled over
    layers and heads, and the first token's mean share of the mass, per text and context."""
    out: dict[str, dict[int, dict]] = {}
    for text in dict.fromkeys(r["text"] for r in rows):
        for context in sorted({r["context"] for r in rows}):
            rs = [r for r in rows if r["text"] == text and r["context"] == context]
            share = np.array([r[f"blocks_{fraction:g}"] / r["n_blocks"] for r in rs])
            out.setdefault(text, {})[context] = {"mean": float(share.mean()), "median": float(np.median(share)),
                                                 "bos": float(np.mean([r["bos"] for r in rs])), "samples": len(rs)}
    return out


def plot_figure2(rows: list[dict], context: int, out: Path) -> Path:
    """One panel per layer: the CDF over query positions and heads of the ideal share at each fraction."""
    plt = _plotting.pyplot()
    layers = sorted({r["layer"] for r in rows})
    with plt.rc_context(STYLE):
        fig, axes = plt.subplots(1, len(layers), figsize=(11, 4.2), sharey=True)
        for ax, layer in zip(np.atleast_1d(axes), layers):
            rs = [r for r in rows if r["layer"] == layer and r["context"] == context]
            means = []
            for f, color in zip(FRACTIONS, ("tab:green", "tab:blue", "tab:red")):
                share = np.sort([100 * r[f"blocks_{f:g}"] / r["n_blocks"] for r in rs])
                ax.step(share, np.arange(1, len(share) + 1) / len(share), where="post", color=color, lw=2,
                        label=f"{100 * f:g}% of the mass")
                means.append(f"{100 * f:g}%: {share.mean():.0f}%")
            ax.text(0.97, 0.04, "mean share\n" + "\n".join(means), transform=ax.transAxes, ha="right", va="bottom",
                    bbox={"facecolor": "white", "edgecolor": "0.7", "alpha": 0.9})
            ax.set_xlim(0, 100)
            ax.set_xlabel("share of blocks needed (%)")
            ax.set_title(f"layer {layer} (global), {len(rs)} head-queries")
            ax.grid(alpha=0.3)
        np.atleast_1d(axes)[0].set_ylabel("fraction of head-queries")
        handles, labels = np.atleast_1d(axes)[0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="upper center", ncol=len(FRACTIONS), bbox_to_anchor=(0.5, 1.0))
        fig.tight_layout(rect=(0, 0, 1, 0.91))  # room for the figure legend (_plotting.save would lay it over)
        fig.savefig(out, dpi=120)
        plt.close(fig)
        return out


def plot_budget_vs_context(models: dict[str, list[dict]], out: Path) -> Path:
    """Rows: models; columns: fractions; one line per layer, the mean ideal share against the context length."""
    plt = _plotting.pyplot()
    with plt.rc_context(STYLE):
        fig, axes = plt.subplots(len(models), len(FRACTIONS), figsize=(11, 3.4 * len(models)), sharex=True,
                                 squeeze=False)
        contexts = sorted({s["context"] for summary in models.values() for s in summary})
        for row, (model, summary) in enumerate(models.items()):
            layers = [layer for layer in dict.fromkeys(s["layer"] for s in summary) if layer != "all"]
            cmap = plt.get_cmap("viridis")
            for col, f in enumerate(FRACTIONS):
                ax = axes[row, col]
                for j, layer in enumerate(layers):
                    pts = sorted((s["context"], 100 * s[f"share_{f:g}"]["mean"]) for s in summary
                                 if s["layer"] == layer)
                    ax.plot(*zip(*pts), marker="o", color=cmap(j / max(len(layers) - 1, 1)), label=f"layer {layer}")
                pooled = sorted((s["context"], 100 * s[f"share_{f:g}"]["median"]) for s in summary
                                if s["layer"] == "all")
                ax.plot(*zip(*pooled), color="black", ls="--", lw=1.2, label="median, all layers")
                ax.set_xscale("log", base=2)
                ticks = [c for c in contexts if is_power_of_two(c)]
                ax.set_xticks(ticks, [f"{c // 1024}K" for c in ticks])
                ax.set_ylim(0, None)
                ax.grid(alpha=0.3)
                ax.set_title(f"{LABELS.get(model, model)}: {100 * f:g}% of the mass")
                if col == 0:
                    ax.set_ylabel("mean share of blocks (%)")
                if row == len(models) - 1:
                    ax.set_xlabel("context (tokens)")
            axes[row, -1].legend(loc="upper left", bbox_to_anchor=(1.02, 1.0))
        return _plotting.save(fig, out)


def is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def table(model: str, summary: list[dict]) -> str:
    """Markdown, a column per context (powers of two): per layer and pooled, the ideal share at 95% (mean / median /
    p90), then the mean blocks it takes, the first token's mean share of the mass and block 0's median rank in the
    ``cuboid_mean`` order."""
    contexts = sorted({s["context"] for s in summary if is_power_of_two(s["context"])})
    cell = {(s["layer"], s["context"]): s for s in summary}
    layers = list(dict.fromkeys(s["layer"] for s in summary))
    head = "| " + " | ".join(f"{c // 1024}K" for c in contexts) + " |"
    rule = "|---|" + "---|" * len(contexts)
    lines = [f"**{LABELS.get(model, model)}**: share of blocks for 95% of the mass, mean / median / p90", "",
             "| layer " + head, rule]
    for layer in layers:
        lines.append(f"| {layer} | " + " | ".join(
            "{mean:.1%} / {median:.1%} / {p90:.1%}".format(**cell[layer, c]["share_0.95"]) for c in contexts) + " |")
    lines += ["", f"**{LABELS.get(model, model)}**: blocks for 95% (mean, of the context's blocks); the first token's "
              "share of the mass (mean); block 0's rank in the `cuboid_mean` order (median)", "",
              "| layer " + head, rule]
    for layer in layers:
        lines.append(f"| {layer} | " + " | ".join(
            f"{cell[layer, c]['blocks_0.95_mean']:.0f} of {cell[layer, c]['n_blocks_mean']:.0f}; "
            f"{cell[layer, c]['bos']['mean']:.0%}; {cell[layer, c]['rank0_cuboid_mean']['median']:.0f}"
            for c in contexts) + " |")
    return "\n".join(lines)


def text_table(model: str, texts: dict[str, dict[int, dict]]) -> str:
    """Markdown: per text (the package the window starts with), the mean ideal share at 95% over layers and heads,
    with the first token's mean share of the mass, per context."""
    contexts = sorted({c for per in texts.values() for c in per if is_power_of_two(c)})
    lines = [f"**{LABELS.get(model, model)}**, share at 95% (first token's mass) per text", "",
             "| text starts with | " + " | ".join(f"{c // 1024}K" for c in contexts) + " |",
             "|---|" + "---|" * len(contexts)]
    for text, per in texts.items():
        lines.append(f"| `{text}` | " + " | ".join(f"{100 * per[c]['mean']:.1f}% ({100 * per[c]['bos']:.0f}%)"
                                                   for c in contexts) + " |")
    return "\n".join(lines)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gemma", nargs="+", default=[f"/tmp/psa_long/gemma3_{t}_32k.npz" for t in TEXTS],
                        help="Gemma 3 captures (32K), pooled")
    parser.add_argument("--smollm2", nargs="+", default=[f"/tmp/psa_long/smollm2_{t}_8k.npz" for t in TEXTS],
                        help="SmolLM2 captures (8K), pooled")
    parser.add_argument("--smollm2-layers", default=",".join(map(str, SMOLLM2_LAYERS)))
    parser.add_argument("--out-dir", default=str(ROOT / "docs" / "img"))
    parser.add_argument("--json", default=str(ROOT / "benchmarks" / "results_long_context.json"))
    parser.add_argument("--tables", default=str(ROOT / "docs" / "long_context_tables.md"),
                        help="the tables, as docs/accuracy.md includes them")
    args = parser.parse_args(argv)

    results, rows_of = {}, {}
    for model, paths, layers in (("gemma3", args.gemma, None),
                                 ("smollm2", args.smollm2, {int(x) for x in args.smollm2_layers.split(",")})):
        rows_of[model], captures = [], []
        for path in paths:
            trace = load_trace(path)
            rows_of[model] += measure(trace, layers)
            captures.append({"path": str(path), **{key: trace.meta.get(key) for key in (
                "model", "gguf_file", "text", "text_packages", "python_version", "tokens", "windows", "stride",
                "positions_per_window", "compute_dtype", "stored_dtype", "seconds", "command")}})
            del trace
        results[model] = {"captures": captures, "layers": sorted({r["layer"] for r in rows_of[model]}),
                          "block_size": BLOCK, "summary": summarize(rows_of[model]),
                          "by_text_0.95": by_text(rows_of[model])}

    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    longest = max(r["context"] for r in rows_of["gemma3"])
    figures = [plot_figure2(rows_of["gemma3"], longest, out_dir / "psa_long_fig2_gemma3_32k.png"),
               plot_budget_vs_context({m: results[m]["summary"] for m in results},
                                      out_dir / "psa_long_budget_vs_context.png")]
    Path(args.json).write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    tables = "\n\n".join(f"{table(model, results[model]['summary'])}\n\n"
                         f"{text_table(model, results[model]['by_text_0.95'])}" for model in results)
    Path(args.tables).write_text(f"<!-- written by examples/plot_long_context.py -->\n\n{tables}\n", encoding="utf-8")
    for path in figures + [Path(args.json), Path(args.tables)]:
        print(f"wrote {path}")
    print()
    print(tables)
    return results


if __name__ == "__main__":
    main()
