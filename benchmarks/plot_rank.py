"""Plot `psa eval` runs: KL to dense against the KV read, PSA's two ranks of a shared group against top-k.

    python benchmarks/plot_rank.py docs/img/psa_rank_kl_vs_kv_gemma3_32k.png \
        benchmarks/results_eval_gemma3_32k_s40_plain320.json benchmarks/results_eval_gemma3_32k_s43_share320.json \
        benchmarks/results_eval_gemma3_32k_s44_est320_sweep.json \
        benchmarks/results_eval_gemma3_32k_s44_share320_sweep.json

Each PSA run is a point labelled by its tau, on one line per rank (`--rank estimate` / `share`); every top-k run of
the files is a point of one top-k line. All files must share the context, step, metadata, text and offset (else the
points would not be comparable): a mismatch raises ValueError naming the file.
"""

from __future__ import annotations

import argparse
import json

SAME = ("step", "metadata", "text", "offset", "gqa", "first_chunk", "model")


def load_points(paths: list[str]) -> tuple[dict[str, list[tuple[float, float, float]]], dict]:
    """{line: [(kv_share, kl_mean, tau or k)]} over the files' non-dense runs, sorted by kv_share; and the shared
    settings (SAME plus the context)."""
    lines: dict[str, dict[float, tuple[float, float, float]]] = {}
    common: dict | None = None
    for path in paths:
        with open(path) as f:
            d = json.load(f)
        runs = [r for r in d["runs"] if r["method"] != "dense" and (r["tau"] is None or r["tau"] < 1)]
        these = {k: d.get(k) for k in SAME} | {"context": sorted({r["context"] for r in d["runs"]})}
        if common is None:
            common = these
        elif these != common:
            diff = {k: (common[k], these[k]) for k in these if these[k] != common[k]}
            raise ValueError(f"{path}: its settings differ from the first file's: {diff}")
        for r in runs:
            if r["method"] == "psa":
                line, key = f"PSA rank={d['rank']}", r["tau"]
            else:
                line, key = "top-k", r["k"]
            lines.setdefault(line, {})[key] = (r["kv_share"], r["kl_mean"], key)
    if common is None:
        raise ValueError("paths: expected at least one psa_eval.json")
    return {line: sorted(pts.values()) for line, pts in lines.items()}, common


def main(dst: str, paths: list[str]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines, common = load_points(paths)
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    styles = {"PSA rank=share": ("C0", "o"), "PSA rank=estimate": ("C1", "s"), "top-k": ("C7", "^")}
    for line, pts in sorted(lines.items()):
        color, marker = styles.get(line, ("C3", "x"))
        xs, ys = [100 * p[0] for p in pts], [p[1] for p in pts]
        ax.plot(xs, ys, marker=marker, color=color, label=line)
        if line != "top-k":
            for x, y, p in zip(xs, ys, pts):
                ax.annotate(f"τ {p[2]:g}", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8, color=color)
    ax.set_yscale("log")
    ax.set_xlabel("KV read per decode token (% of dense)")
    ax.set_ylabel("KL to dense (nats, mean over tokens)")
    ctx = ",".join(f"{c // 1024}K" for c in common["context"])
    ax.set_title(f"{common['model']}, {ctx}, step {common['step']}, {common['metadata']}: lower-left is better",
                 fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(dst, dpi=120)
    print(f"wrote {dst}")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dst", help="the PNG to write")
    p.add_argument("paths", nargs="+", help="psa_eval.json files of one context, step and text")
    a = p.parse_args()
    main(a.dst, a.paths)
