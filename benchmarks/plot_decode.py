"""Plot a bench_decode.jsonl: time per decode step relative to torch SDPA, per size and batch.

    python benchmarks/plot_decode.py bench_decode.jsonl docs/img/psa_decode_speedup.png
"""

import json
import sys


def main(src: str, dst: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    rows = [json.loads(line) for line in open(src) if '"method"' in line]
    sizes = sorted({(r["T"], r["B"]) for r in rows}, key=lambda tb: (tb[1], tb[0]))
    methods = ["psa_fast dense", "PSA τ=0.9", "PSA τ=0.95", "PSA τ=0.95 remaining"]
    labels = [f"{t // 1024}K, B={b}" for t, b in sizes]
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / (len(methods) + 1)
    x = np.arange(len(sizes))
    for i, m in enumerate(methods + ["top-k (error ≤ PSA τ=0.95)"]):
        vals = []
        for t, b in sizes:
            match = [r for r in rows if r["T"] == t and r["B"] == b and
                     (r["method"] == m or (m.startswith("top-k") and r["method"].endswith("(error ≤ PSA τ=0.95)")))]
            vals.append(match[0]["speedup"] if match else np.nan)
        ax.bar(x + (i - len(methods) / 2) * width, vals, width, label=m)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks(x, labels, rotation=30, ha="right")
    ax.set_ylabel("speedup over torch SDPA (same run)")
    ax.set_title("Decode step, Llama-3.1-8B attention shapes, H200 (higher is better)")
    ax.legend(fontsize=7, ncol=2)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(dst, dpi=120)
    print(f"wrote {dst}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
