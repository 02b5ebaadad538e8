"""Plot a bench_decode JSONL.

    python benchmarks/plot_decode.py bench_decode.jsonl docs/img/psa_decode_speedup.png
        # bars: time per decode step relative to torch SDPA, per size and batch
    python benchmarks/plot_decode.py --vs-blocks bench_decode_sparsity_llama8b.jsonl docs/img/psa_speedup_vs_blocks.png
        # lines: speedup over SDPA against the share of blocks read, one per batch and method, a panel per size
    python benchmarks/plot_decode.py --dense results_h100_s54_dense.jsonl docs/img/psa_dense_vs_sdpa.png
        # lines: the dense step's speed over SDPA's against the batch, one per shape and size (exp_dense_tune.py
        # rows with --default-only), the target 0.95x drawn
"""

from __future__ import annotations

import argparse
import json

TOPK_AT_ERROR = "(error ≤ PSA τ=0.95)"
VS_BLOCKS_METHODS = ("PSA τ=0.95", "PSA τ=0.95 per_head", f"top-k {TOPK_AT_ERROR}", "psa_fast dense")


def load_rows(src: str) -> list[dict]:
    """The timed rows of a bench_decode JSONL (not its stage breakdowns, skips or ideal-share lines)."""
    with open(src) as f:
        return [r for r in (json.loads(line) for line in f if line.strip()) if "method" in r and "us" in r]


def _method(name: str) -> str:
    """Row method -> plotted method: every 'top-k k=.. (error ≤ PSA τ=0.95)' is one method."""
    return f"top-k {TOPK_AT_ERROR}" if name.startswith("top-k") and name.endswith(TOPK_AT_ERROR) else name


def main(src: str, dst: str, *, title: str = "") -> None:
    """Bars: speedup over SDPA per (size, batch) for the main methods (``title``: the plot's, which should name the
    card; the rows do not)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    rows = load_rows(src)
    sizes = sorted({(r["T"], r["B"]) for r in rows}, key=lambda tb: (tb[1], tb[0]))
    methods = ["psa_fast dense", "PSA τ=0.9", "PSA τ=0.95", "PSA τ=0.95 remaining"]
    labels = [f"{t // 1024}K, B={b}" for t, b in sizes]
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / (len(methods) + 1)
    x = np.arange(len(sizes))
    for i, m in enumerate(methods + [f"top-k {TOPK_AT_ERROR}"]):
        vals = []
        for t, b in sizes:
            match = [r for r in rows if r["T"] == t and r["B"] == b and _method(r["method"]) == m]
            vals.append(match[0]["speedup"] if match else np.nan)
        ax.bar(x + (i - len(methods) / 2) * width, vals, width, label=m)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks(x, labels, rotation=30, ha="right")
    ax.set_ylabel("speedup over torch SDPA (same run)")
    ax.set_title(title or "Decode step, Llama-3.1-8B attention shapes (higher is better)")
    ax.legend(fontsize=7, ncol=2)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(dst, dpi=120)
    print(f"wrote {dst}")


def speedup_vs_blocks(rows: list[dict], *, methods=VS_BLOCKS_METHODS, batches=(1, 8, 32)) -> dict:
    """The lines of ``plot_vs_blocks``: ``{(T, B, method): [(share of blocks read, speedup over SDPA), ...]}``
    sorted by share, for the ``methods`` and ``batches`` present; ``(T, B, "PSA τ=0.95 at its floor")`` is
    the speedup PSA τ=0.95 would have at its floor (``speedup * step_floor``) where rows carry it."""
    lines: dict = {}
    for r in rows:
        m = _method(r["method"])
        if m not in methods or r["B"] not in batches:
            continue
        lines.setdefault((r["T"], r["B"], m), []).append((r["frac"], r["speedup"]))
        if m == "PSA τ=0.95" and "step_floor" in r:
            lines.setdefault((r["T"], r["B"], "PSA τ=0.95 at its floor"), []).append(
                (r["frac"], r["speedup"] * r["step_floor"]))
    return {k: sorted(v) for k, v in sorted(lines.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2]))}


def merged_legend(per_axis: list[tuple[list, list[str]]]) -> tuple[list, list[str]]:
    """One legend for every panel: the ``(handles, labels)`` of each axis (``ax.get_legend_handles_labels()``)
    joined in order, each label once (a batch drawn in one panel only, e.g. B = 32 at 32K, is still listed)."""
    seen: dict = {}
    for handles, labels in per_axis:
        for h, label in zip(handles, labels):
            seen.setdefault(label, h)
    return list(seen.values()), list(seen)


def plot_vs_blocks(src: str, dst: str, *, methods=VS_BLOCKS_METHODS, batches=(1, 8, 32)) -> dict:
    """Speedup over SDPA (same run) against the share of blocks read, one line per batch and method and a
    panel per size, from a bench_decode JSONL (best: ``--profile sparsity``, whose shares spread the
    points). Colour is the method, line style and marker the batch; a dotted line is PSA τ=0.95 at its
    floor. Writes ``dst`` (PNG) and returns the lines (``speedup_vs_blocks``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = load_rows(src)
    lines = speedup_vs_blocks(rows, methods=methods, batches=batches)
    if not lines:
        raise ValueError(f"{src} has no rows of {', '.join(methods)} at B in {batches}")
    sizes = sorted({t for t, _, _ in lines})
    shapes = sorted({r.get("shape", "llama8b") for r in rows})
    colors = {m: f"C{i}" for i, m in enumerate(list(methods) + ["PSA τ=0.95 at its floor"])}
    colors["PSA τ=0.95 at its floor"] = colors["PSA τ=0.95"]
    styles = {b: (ls, mk) for b, ls, mk in zip(sorted(batches), ("-", "--", "-.", ":"), ("o", "s", "^", "D"))}
    from matplotlib.ticker import FuncFormatter

    fig, axes = plt.subplots(1, len(sizes), figsize=(max(7.0, 5.5 * len(sizes)), 5.6), sharey=True, squeeze=False)
    for ax, t in zip(axes[0], sizes):
        for (tt, b, m), pts in lines.items():
            if tt != t:
                continue
            xs, ys = [100 * x for x, _ in pts], [y for _, y in pts]
            ls, mk = styles.get(b, ("-", "o"))
            if m == "PSA τ=0.95 at its floor":
                ax.plot(xs, ys, ls=":", color=colors[m], lw=1, alpha=0.8, label=f"{m}, B={b}")
            else:
                ax.plot(xs, ys, ls=ls, marker=mk, color=colors[m], ms=4, label=f"{m}, B={b}")
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xscale("log")
        ax.set_yscale("log")
        for axis, unit in ((ax.xaxis, "%"), (ax.yaxis, "×")):  # plain numbers on log axes, minor ticks too
            axis.set_major_formatter(FuncFormatter(lambda v, _, u=unit: f"{v:g}{u}"))
            axis.set_minor_formatter(FuncFormatter(lambda v, _, u=unit: f"{v:g}{u}" if f"{v:.0e}"[0] in "235" else ""))
        ax.set_xlabel("blocks read (% of the cache)")
        ax.set_title(f"{t // 1024}K tokens")
        ax.grid(alpha=0.3, which="both")
    axes[0][0].set_ylabel("speedup over torch SDPA (same run)")
    handles, labels = merged_legend([ax.get_legend_handles_labels() for ax in axes[0]])
    ncol = 4
    fig.legend(handles, labels, fontsize=7, ncol=ncol, loc="lower center", frameon=False)
    fig.suptitle(f"Decode step against the share of blocks read ({', '.join(shapes)}; higher is better)", fontsize=10)
    fig.tight_layout(rect=(0, 0.035 * -(-len(labels) // ncol) + 0.01, 1, 1))  # room for the legend's rows below
    fig.savefig(dst, dpi=120)
    plt.close(fig)
    print(f"wrote {dst}")
    return lines


DENSE_TARGET = 0.95  # issue 14: the dense paged kernel at >= 0.95x SDPA at every size


def dense_vs_sdpa(rows: list[dict]) -> dict:
    """The lines of ``plot_dense``: ``{(shape, T): [(B, SDPA µs / dense µs), ...]}`` sorted by B, from
    exp_dense_tune.py rows of the plan's own launch shape (``splits`` None; a row per (shape, T, B), the first if
    repeated)."""
    lines: dict = {}
    for r in rows:
        if r.get("splits") is None and "sdpa_us" in r:
            pts = lines.setdefault((r["shape"], r["T"]), {})
            pts.setdefault(r["B"], r["sdpa_us"] / r["us"])
    return {k: sorted(v.items()) for k, v in sorted(lines.items())}


def plot_dense(src: str, dst: str, *, title: str = "") -> dict:
    """The dense step's speed over SDPA's (same process) against the batch, one line per shape and size, from an
    exp_dense_tune.py JSONL; the target (0.95x) dashed, each point below it circled. Writes ``dst`` (PNG) and returns
    the lines (``dense_vs_sdpa``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(src) as f:
        lines = dense_vs_sdpa([json.loads(line) for line in f if line.strip()])
    if not lines:
        raise ValueError(f"{src} has no exp_dense_tune.py rows of the plan's launch shape (splits None, sdpa_us)")
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for i, ((shape, t), pts) in enumerate(lines.items()):
        bs, ys = [b for b, _ in pts], [y for _, y in pts]
        ax.plot(bs, ys, marker="o", ms=4, color=f"C{i}", label=f"{shape}, {t // 1024}K")
        low = [(b, y) for b, y in pts if y < DENSE_TARGET]
        if low:
            ax.scatter(*zip(*low), s=90, facecolors="none", edgecolors=f"C{i}", lw=1.2)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.axhline(DENSE_TARGET, color="k", lw=0.8, ls="--", label=f"target {DENSE_TARGET}x")
    ax.set_xscale("log", base=2)
    batches = sorted({b for pts in lines.values() for b, _ in pts})
    ax.set_xticks([b for b in batches if b & (b - 1) == 0] or batches)  # powers of two labelled, the rest ticked
    ax.set_xticks(batches, minor=True)
    ax.get_xaxis().set_major_formatter(plt.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.get_xaxis().set_minor_formatter(plt.NullFormatter())
    ax.set_xlabel("batch (requests)")
    ax.set_ylabel("SDPA time ÷ psa_fast dense time")
    ax.set_title(title or "Dense paged decode against torch SDPA (higher is better; circled: below the target)",
                 fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(dst, dpi=120)
    plt.close(fig)
    print(f"wrote {dst}")
    return lines


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--vs-blocks", action="store_true", help="speedup against the share of blocks read")
    mode.add_argument("--dense", action="store_true", help="exp_dense_tune.py rows: dense over SDPA against the batch")
    ap.add_argument("--title", default="", help="the plot's title (bars and --dense; name the card)")
    ap.add_argument("src")
    ap.add_argument("dst")
    a = ap.parse_args()
    if a.dense:
        plot_dense(a.src, a.dst, title=a.title)
    elif a.vs_blocks:
        plot_vs_blocks(a.src, a.dst)
    else:
        main(a.src, a.dst, title=a.title)
