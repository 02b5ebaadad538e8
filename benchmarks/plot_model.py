"""Plot a bench_model JSONL: decode tokens/s against context, a panel per batch size, a line per method.

    python benchmarks/plot_model.py benchmarks/results_model_gemma3_h200.jsonl docs/img/psa_model_tokens_per_s.png
"""

from __future__ import annotations

import argparse
import json

METHODS = {"sdpa": "stock SDPA (captured)", "paged": "psa_fast dense (paged)", "psa0.95": "PSA τ 0.95 (default rule)",
           "psa0.99": "PSA τ 0.99", "topk": "top-k at PSA 0.95's budget"}


def load_rows(src: str) -> list[dict]:
    """The rows of a bench_model JSONL (one per context, batch and method)."""
    with open(src) as f:
        return [json.loads(line) for line in f if line.strip()]


def main(src: str, dst: str) -> None:
    """Tokens/s of every method against the context length, one panel per batch size (log y)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = load_rows(src)
    if not rows:
        raise ValueError(f"{src} holds no rows")
    batches = sorted({r["batch"] for r in rows})
    fig, axes = plt.subplots(1, len(batches), figsize=(4.2 * len(batches), 3.8), squeeze=False)
    for ax, b in zip(axes[0], batches):
        for method, label in METHODS.items():
            pts = sorted((r["context"], r["tokens_per_s"]) for r in rows if r["batch"] == b and r["method"] == method)
            if pts:
                ax.plot([t / 1024 for t, _ in pts], [y for _, y in pts], marker="o", label=label)
        ax.set_xscale("log", base=2)
        ticks = sorted({r["context"] / 1024 for r in rows})
        ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
        ax.set_xlabel("context (K tokens)")
        ax.set_ylabel("decode tokens/s")
        ax.set_title(f"B = {b}")
        ax.grid(alpha=0.3, which="both")
    axes[0, 0].legend(fontsize=7)
    model = rows[0].get("model", "")
    fig.suptitle(f"{model}: whole decode step captured in a CUDA graph, bfloat16, H200", fontsize=10)
    fig.tight_layout()
    fig.savefig(dst, dpi=130)
    print(f"wrote {dst}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("src", help="bench_model JSONL")
    ap.add_argument("dst", help="PNG to write")
    a = ap.parse_args()
    main(a.src, a.dst)
