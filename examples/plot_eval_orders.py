"""Plot several ``psa eval`` runs of the same windows on one figure: each run's PSA rules
and its top-k ladder (top-k ranks by that run's metadata), KV read against next-token
agreement and against KL to dense. Also writes each run trimmed for the repository (no
per-head budgets or ideal-budget lists, which make up most of ``psa_eval.json``).

The trimmed 4K results in ``benchmarks/`` were written with::

    python examples/plot_eval_orders.py cuboid_mean=/tmp/eval/cuboid/psa_eval.json \\
        quant3=/tmp/eval/quant3/psa_eval.json --out /tmp/psa_eval_4k.png \\
        --trim benchmarks/results_eval_4k_{name}.json

and the 8K ones likewise (``results_eval_8k_{name}.json``). The figure written here is a quick look; the
docs' figures are drawn from the trimmed files by ``examples/plot_docs_figures.py``, at page size.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from psa_ref import _plotting

MARKERS = {"ema": "o", "sketch": "D", "remaining": "s", "seed": "v", "certified": "^"}


def load(path: str) -> dict:
    data = json.loads(Path(path).read_text())
    if "runs" not in data:
        raise ValueError(f"{path} is not a psa eval JSON file (no 'runs')")
    return data


def trim(data: dict) -> dict:
    """The eval JSON without per-head budgets and ideal-budget lists; per-layer means stay."""
    runs = []
    for r in data["runs"]:
        r = dict(r)
        r["layers"] = {layer: {k: v for k, v in row.items() if k not in ("blocks_per_head_by_head", "needed95")}
                       for layer, row in r["layers"].items()}
        runs.append(r)
    return dict(data, runs=runs)


def plot(named: dict[str, dict], out: Path) -> Path:
    plt = _plotting.pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    colors = plt.get_cmap("tab10")
    for i, (name, data) in enumerate(named.items()):
        runs = data["runs"]
        top = sorted((r for r in runs if r["method"] == "topk"), key=lambda r: r["kv_share"])
        for ax, attr, scale in ((axes[0], "agreement", 100.0), (axes[1], "kl_mean", 1.0)):
            ax.plot([100 * r["kv_share"] for r in top], [scale * r[attr] for r in top], color=colors(i), ls="--",
                    marker=".", label=f"top-k, {name} order")
            for stop in dict.fromkeys(r["stop"] for r in runs if r["method"] == "psa" and r["tau"] < 1):
                pts = sorted((r for r in runs if r["method"] == "psa" and r["stop"] == stop and r["tau"] < 1),
                             key=lambda r: r["tau"])
                taus = ", ".join(f"{r['tau']:g}" for r in pts)
                ax.plot([100 * r["kv_share"] for r in pts], [scale * r[attr] for r in pts], color=colors(i),
                        marker=MARKERS.get(stop, "P"), ms=7, label=f"psa {stop}, {name} (τ {taus})")
                for r in pts:
                    ax.annotate(f"{r['tau']:g}", (100 * r["kv_share"], scale * r[attr]), fontsize=7,
                                xytext=(4, 4), textcoords="offset points")
    tokens = len(next(iter(named.values()))["runs"][0]["argmax"])
    axes[0].set_ylabel(f"next-token agreement with dense (%, {tokens} tokens)")
    axes[1].set_ylabel("KL(dense ‖ sparse), nats per token")
    axes[1].set_yscale("log")
    for ax in axes:
        ax.set_xlabel("KV read per decode token (% of dense)")
        ax.set_xlim(0, 100)
        ax.grid(alpha=0.3, which="both")
    axes[0].legend(fontsize=7)
    contexts = sorted({r["context"] for data in named.values() for r in data["runs"]})
    fig.suptitle(f"SmolLM2-135M, context {', '.join(map(str, contexts))}: KV read against accuracy, PSA and top-k "
                 f"on {len(named)} block order(s)", fontsize=10)
    return _plotting.save(fig, out)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="NAME=PATH of a psa_eval.json")
    parser.add_argument("--out", required=True, help="the PNG to write")
    parser.add_argument("--trim", help="also write each run trimmed to this path ('{name}' is replaced)")
    args = parser.parse_args(argv)
    named = {}
    for item in args.runs:
        name, sep, path = item.partition("=")
        if not sep:
            raise SystemExit(f"expected NAME=PATH, got {item!r}")
        named[name] = load(path)
    print(f"wrote {plot(named, Path(args.out))}")
    if args.trim:
        for name, data in named.items():
            path = Path(args.trim.replace("{name}", name))
            path.write_text(json.dumps(trim(data), indent=None, separators=(",", ":")))
            print(f"wrote {path} ({path.stat().st_size / 1e3:.0f} kB)")


if __name__ == "__main__":
    main()
