"""One request's top-k step against its blocks, with PSA beside it, from `bench_decode.py`'s rows (``.jsonl``): per
context size a panel of µs against the blocks a group reads; top-k's rows (every ``k`` of the runs, on
``cuboid_mean``) with their least-squares line, and each PSA τ 0.95 row (the loop, shared and per head) joined to the
top-k row at its error. At one request top-k's step is a fixed part (estimate, order, launches, merge) plus its blocks
at the copy ceiling, so a PSA row beats top-k of equal error only below that line at top-k's blocks; the gap
between a PSA point and the line at its own blocks is what PSA adds to top-k's step (benchmarks/NOTES.md, sixtieth
session).

    python benchmarks/plot_topk_line.py benchmarks/results_h100_s61_per_head_32k.jsonl \\
        benchmarks/results_h100_s61_per_head_128k.jsonl benchmarks/results_h100_s60_llama8b.jsonl \\
        --out docs/img/psa_topk_line_h100.png

(the per-head files of the sixty-first session: top-k at its exact equal-error ``k``; the sixtieth's took it from
a grid that could overshoot by a quarter)

``--table`` prints instead, for every batch size in the files, each PSA row beside top-k at its error and their
ratio (issue 14's per-head line: PSA faster than top-k at equal error, so a ratio below 1):

    python benchmarks/plot_topk_line.py benchmarks/results_h100_s72_per_head.jsonl --table
"""

from __future__ import annotations

import argparse
import json
import re

import numpy as np

TOPK = re.compile(r"^top-k k=(\d+) \((?:error ≤ )?(.+?)(?: budget)?\)$")  # cuboid_mean rows only (no "(quant3)")
PSA_ROWS = ("PSA τ=0.95", "PSA τ=0.95 per_head", "PSA τ=0.95 first chunk estimated_stop",
            "PSA τ=0.95 first chunk estimated_stop, speculated")
LABELS = {"PSA τ=0.95": "PSA (shared)", "PSA τ=0.95 per_head": "PSA gqa=per_head",
          "PSA τ=0.95 first chunk estimated_stop": "PSA, first chunk estimated_stop",
          "PSA τ=0.95 first chunk estimated_stop, speculated": "PSA, first chunk estimated_stop, speculated"}


def load(paths: list[str], batch: int | None = 1) -> list[dict]:
    """Rows of ``batch`` requests (None: every batch) with a method and a time, each tagged with its file's
    ``profile`` (and ``share``)."""
    rows = []
    for path in paths:
        with open(path) as f:
            for line in f:
                r = json.loads(line)
                if (batch is None or r.get("B") == batch) and "method" in r and "us" in r:
                    rows.append(r)
    if not rows:
        which = "any B" if batch is None else f"B = {batch}"
        raise ValueError(f"no rows of {which} with a method and a time in {', '.join(paths)}")
    return rows


def blocks(r: dict) -> float:
    """Blocks a group read: the row's share of the blocks times the blocks of its context (16 tokens a block)."""
    return r["frac"] * r["T"] / 16


def fit_topk_line(rows: list[dict]) -> dict[int, tuple[float, float, float]]:
    """Per context size ``T``: ``(µs a block, fixed µs, largest residual µs)`` of the least-squares line through
    top-k's rows (each ``k`` once, the median where several rows ran it). Needs two distinct ``k`` a size."""
    by_t: dict[int, dict[int, list[float]]] = {}
    for r in rows:
        m = TOPK.match(r["method"])
        if m:
            by_t.setdefault(r["T"], {}).setdefault(int(m.group(1)), []).append(r["us"])
    out = {}
    for t, ks in sorted(by_t.items()):
        if len(ks) < 2:
            raise ValueError(f"T = {t}: top-k ran at {len(ks)} k, a line needs two")
        k = np.array(sorted(ks), dtype=float)
        us = np.array([float(np.median(ks[int(x)])) for x in k])
        slope, fixed = np.polyfit(k, us, 1)
        out[t] = (float(slope), float(fixed), float(np.abs(slope * k + fixed - us).max()))
    return out


def pairs(rows: list[dict]) -> list[tuple[dict, dict | None]]:
    """Each PSA row (``PSA_ROWS``) with the top-k row at its error from the same file, size and batch (None if
    absent)."""
    out = []
    for r in rows:
        if r["method"] not in PSA_ROWS:
            continue
        want = f"(error ≤ {r['method']})"
        match = [x for x in rows if x["T"] == r["T"] and x.get("B") == r.get("B")
                 and x.get("profile") == r.get("profile")
                 and x.get("share") == r.get("share") and x["method"].startswith("top-k k=")
                 and x["method"].endswith(want)]
        out.append((r, match[0] if match else None))
    return out


def ratio_table(rows: list[dict]) -> str:
    """A markdown table: per context size and batch, each PSA row's µs beside top-k's at its error (``k``), their
    ratio, and the least ratio of that size and batch in bold. PSA rows without a top-k row at their error are left
    out."""
    lines = ["| T | B | PSA row | µs | top-k at its error | µs | PSA ÷ top-k |", "|---|---|---|---|---|---|---|"]
    cells: dict[tuple[int, int], list[tuple[dict, dict, float]]] = {}
    for p, q in pairs(rows):
        if q is not None:
            cells.setdefault((p["T"], p["B"]), []).append((p, q, p["us"] / q["us"]))
    for (t, b), found in sorted(cells.items()):
        best = min(ratio for _, _, ratio in found)
        for p, q, ratio in found:
            k = TOPK.match(q["method"]).group(1)
            shown = f"**{ratio:.2f}**" if ratio == best else f"{ratio:.2f}"
            lines.append(f"| {t // 1024}K | {b} | {LABELS[p['method']]} | {p['us']:.1f} | k = {k} | {q['us']:.1f} "
                         f"| {shown} |")
    return "\n".join(lines)


def plot(rows: list[dict], out: str) -> dict[int, tuple[float, float, float]]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines = fit_topk_line(rows)
    fig, axes = plt.subplots(1, len(lines), figsize=(5.2 * len(lines), 4.2), squeeze=False)
    for ax, (t, (slope, fixed, resid)) in zip(axes[0], lines.items()):
        tk = [r for r in rows if r["T"] == t and TOPK.match(r["method"])]
        ks = np.array([blocks(r) for r in tk])
        xs = np.linspace(0, max(ks.max(), max((blocks(r) for r in rows if r["T"] == t), default=0)) * 1.05, 50)
        ax.plot(xs, slope * xs + fixed, color="0.55", lw=1.2,
                label=f"top-k: {fixed:.1f} µs + {slope * 1000:.1f} ns a block (residual ≤ {resid:.1f})")
        ax.scatter(ks, [r["us"] for r in tk], s=14, color="0.35", zorder=3)
        for i, (p, q) in enumerate(pr for pr in pairs(rows) if pr[0]["T"] == t):
            color = f"C{i}"
            profile = (f"{p['share']:.0%} profile" if p.get("share") is not None else f"{p.get('profile')} profile")
            label = f"{LABELS[p['method']]}, {profile}"
            ax.scatter([blocks(p)], [p["us"]], s=40, color=color, marker="o", zorder=4, label=label)
            if q is not None:
                ax.annotate("", xy=(blocks(q), q["us"]), xytext=(blocks(p), p["us"]),
                            arrowprops=dict(arrowstyle="->", color=color, lw=1.0))
        ax.set_title(f"{t // 1024}K tokens, one request")
        ax.set_xlabel("blocks a group reads")
        ax.set_ylabel("µs a decode step")
        ax.set_xlim(0, xs[-1])
        ax.set_ylim(0, None)
        ax.legend(fontsize=7, loc="lower right")
        ax.grid(alpha=0.3)
    fig.suptitle("PSA (arrow: to top-k at PSA's error) against top-k's line", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=130)
    plt.close(fig)
    return lines


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+", help="bench_decode .jsonl files")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--out", default="psa_topk_line.png")
    ap.add_argument("--table", action="store_true",
                    help="print PSA ÷ top-k at equal error for every batch in the files instead of the plot")
    args = ap.parse_args(argv)
    if args.table:
        print(ratio_table(load(args.files, batch=None)))
        return
    for t, (slope, fixed, resid) in plot(load(args.files, args.batch), args.out).items():
        print(f"T={t}: top-k {fixed:.1f} µs + {slope:.4f} µs a block (largest residual {resid:.1f} µs)")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
