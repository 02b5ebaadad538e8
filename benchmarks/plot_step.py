"""The loop's step against the decode step's time, from `exp_step.py`'s tables: one panel per (tokens, batch), µs
against blocks an iteration for the plain loop and for a predicted first chunk (the median where a step was run in
several calls), psa_fast dense as a line, the plan's ``step="auto"`` marked.

    python benchmarks/plot_step.py benchmarks/results_h200_exp_step_llama8b.md --out docs/img/psa_step_sweep.png
"""

from __future__ import annotations

import argparse
import statistics


def parse(text: str) -> list[dict]:
    """The rows of every markdown table in ``text`` whose header starts ``| T | B | mode``: dicts with ``T``, ``B``,
    ``mode``, ``cluster`` (None where the table has no such column), ``step`` (None for dense), ``auto`` (the
    plan's pick) and ``us``. Rows that failed to run are left out."""
    rows, header = [], None
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("|") or len(cells) < 5:
            header = None if not line.startswith("|") else header
            continue
        if cells[:3] == ["T", "B", "mode"]:
            header = cells
            continue
        if header is None or set(cells[0]) <= set("-"):
            continue
        r = dict(zip(header, cells))
        if "µs" not in r or not r["µs"].replace(".", "", 1).isdigit():
            continue
        step = r["step"].replace("(auto)", "").strip()
        rows.append(dict(T=int(r["T"]), B=int(r["B"]), mode=r["mode"],
                         cluster=None if r.get("cluster", "-") in ("-", None) else int(r["cluster"]),
                         step=None if step == "-" else int(step), auto="(auto)" in r["step"], us=float(r["µs"])))
    return rows


def plot(rows: list[dict], out: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = sorted({(r["T"], r["B"]) for r in rows})
    if not sizes:
        raise ValueError("no rows to plot")
    fig, axes = plt.subplots(1, len(sizes), figsize=(4.2 * len(sizes), 3.6), squeeze=False)
    for ax, (t, b) in zip(axes[0], sizes):
        here = [r for r in rows if (r["T"], r["B"]) == (t, b)]
        # the plan's own cluster only: explicit clusters (16) are another experiment
        default_cluster = {r["cluster"] for r in here if r["auto"]} or {r["cluster"] for r in here}
        for mode, style, label in (("loop", "o-", "loop"), ("first", "s:", "predicted first chunk")):
            pts = {}
            for r in here:
                if r["mode"] == mode and r["step"] and (r["cluster"] is None or r["cluster"] in default_cluster):
                    pts.setdefault(r["step"], []).append(r["us"])
            if pts:
                xs = sorted(pts)
                ax.plot(xs, [statistics.median(pts[x]) for x in xs], style, label=label)
        for r in here:
            if r["auto"] and r["mode"] == "loop":
                ax.plot([r["step"]], [r["us"]], "*", ms=14, color="crimson", label=f'step="auto" ({r["step"]})')
        dense = [r["us"] for r in here if r["mode"] == "dense"]
        if dense:
            ax.axhline(statistics.median(dense), ls="--", color="gray", label="psa_fast dense")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("blocks an iteration (step)")
        ax.set_ylabel("µs a decode step")
        ax.set_title(f"{t // 1024}K tokens, B = {b}")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("tables", nargs="+", help="exp_step.py outputs (markdown)")
    ap.add_argument("--out", default="psa_step_sweep.png")
    args = ap.parse_args()
    rows = [r for path in args.tables for r in parse(open(path, encoding="utf-8").read())]
    plot(rows, args.out)
    print(f"{len(rows)} rows -> {args.out}")


if __name__ == "__main__":
    main()
