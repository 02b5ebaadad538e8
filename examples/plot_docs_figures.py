"""Draw the figures of the docs that no benchmark draws, at the size the site shows them.

    python examples/plot_docs_figures.py            # writes into docs/img/

* ``psa_architecture.png`` and ``psa_decode_step.png`` (docs/architecture.md): the layers of the two packages, and
  the data flow of one decode step. Drawn from the boxes listed below, no data.
* ``psa_eval_4k_accuracy.png``, ``psa_eval_8k_accuracy.png`` (docs/accuracy.md): KV read against next-token
  agreement and against KL to dense, PSA and top-k on two block orders, from the trimmed ``psa eval`` results in
  ``benchmarks/results_eval_{4k,8k}_{cuboid_mean,quant3}.json`` (what ``examples/plot_eval_orders.py`` plots, with
  type large enough to read at page width).
* ``psa_eval_full_agreement.png``, ``psa_eval_full_kl.png`` (docs/accuracy.md): the full run of ``psa eval`` (2K,
  4K and 8K, every rule), one figure per measure. Its JSON was not kept; the numbers are those of the table that run
  printed, which docs/accuracy.md shows under "The full run", and are read from there.

Runs on the CPU in a few seconds (matplotlib only).
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from psa_ref import _plotting

ROOT = Path(__file__).resolve().parents[1]
STYLE = {"font.size": 11, "axes.titlesize": 12, "axes.labelsize": 11, "legend.fontsize": 10}
MARKERS = {"ema": "o", "sketch": "D", "remaining": "s", "seed": "v", "certified": "^"}
COLORS = {"ema": "tab:blue", "remaining": "tab:orange", "seed": "tab:green", "certified": "tab:red",
          "sketch": "tab:purple"}


# --- KV read against accuracy --------------------------------------------------------------------------------------

def plot_orders(named: dict[str, dict], out: Path) -> Path:
    """Two panels (agreement, KL) for ``psa eval`` runs of the same windows on different block orders."""
    plt = _plotting.pyplot()
    with plt.rc_context(STYLE):
        fig, axes = plt.subplots(1, 2, figsize=(10, 4.3))
        for i, (name, data) in enumerate(named.items()):
            runs, color = data["runs"], plt.get_cmap("tab10")(i)
            top = sorted((r for r in runs if r["method"] == "topk"), key=lambda r: r["kv_share"])
            for ax, attr, scale in ((axes[0], "agreement", 100.0), (axes[1], "kl_mean", 1.0)):
                ax.plot([100 * r["kv_share"] for r in top], [scale * r[attr] for r in top], color=color, ls="--",
                        marker=".", label=f"top-k, {name} order")
                for stop in dict.fromkeys(r["stop"] for r in runs if r["method"] == "psa" and r["tau"] < 1):
                    pts = sorted((r for r in runs if r["method"] == "psa" and r["stop"] == stop and r["tau"] < 1),
                                 key=lambda r: r["tau"])
                    ax.plot([100 * r["kv_share"] for r in pts], [scale * r[attr] for r in pts], color=color,
                            marker=MARKERS.get(stop, "P"), ms=8, label=f"PSA {stop}, {name}")
                    for r in pts:
                        ax.annotate(f"τ {r['tau']:g}", (100 * r["kv_share"], scale * r[attr]), fontsize=10,
                                    xytext=(6, 4), textcoords="offset points")
        tokens = len(next(iter(named.values()))["runs"][0]["argmax"])
        context = next(iter(named.values()))["runs"][0]["context"]
        axes[0].set_ylabel("next-token agreement (%)")
        axes[0].set_title(f"agreement with dense ({tokens} tokens, higher is better)")
        axes[1].set_ylabel("KL(dense ‖ sparse), nats")
        axes[1].set_title("KL to dense (lower is better)")
        axes[1].set_yscale("log")
        for ax in axes:
            ax.set_xlabel("KV read per decode token (% of dense)")
            ax.set_xlim(0, 100)
            ax.grid(alpha=0.3, which="both")
        axes[0].legend(loc="lower right")
        fig.suptitle(f"SmolLM2-135M at {context} tokens: KV read against accuracy", fontsize=12)
        return _plotting.save(fig, out)


def full_run_rows(page: Path) -> list[dict]:
    """The rows of the full-run table of docs/accuracy.md (its three per-context tables)."""
    text = page.read_text(encoding="utf-8")
    section = text.split("### The full run", 1)[1].split("\n### ", 1)[0].split("\n## ", 1)[0]
    rows = []
    for heading, table in re.findall(r"\*\*(\d+) tokens\*\*\n\n((?:\|[^\n]*\n)+)", section):
        for line in table.splitlines()[2:]:
            cells = [c.strip() for c in line.strip("|").split("|")]
            kv = re.search(r"\(([\d.]+)%\)", cells[5])
            rows.append({"context": int(heading), "label": cells[0].replace("**", ""),
                         "agreement": float(cells[1].rstrip("%")), "kl": float(cells[3]),
                         "kv_share": float(kv.group(1))})
    if not rows:
        raise ValueError(f"no full-run table found in {page}")
    return rows


def plot_full_run(rows: list[dict], out_dir: Path) -> list[Path]:
    """One figure per measure, one panel per context: every stop rule across τ, and the top-k ladder."""
    plt = _plotting.pyplot()
    contexts = sorted({r["context"] for r in rows})
    paths = []
    for attr, name, fname in (("agreement", "next-token agreement (%)", "psa_eval_full_agreement.png"),
                              ("kl", "KL(dense ‖ sparse), nats", "psa_eval_full_kl.png")):
        with plt.rc_context({**STYLE, "font.size": 13, "axes.titlesize": 14, "axes.labelsize": 13,
                             "legend.fontsize": 12}):  # three panels across the page: larger type
            fig, axes = plt.subplots(1, len(contexts), figsize=(12, 4.3), sharey=True)
            for ax, ctx in zip(axes, contexts):
                here = [r for r in rows if r["context"] == ctx]
                top = sorted((r for r in here if r["label"].startswith("top-")), key=lambda r: r["kv_share"])
                if attr == "kl":  # KL 0 at k = N has no place on a log axis
                    top = [r for r in top if r["kv_share"] < 100]
                ax.plot([r["kv_share"] for r in top], [r[attr] for r in top], color="0.35", marker=".", ms=8,
                        label="top-k, k = 8 … 256")
                for stop in ("ema", "remaining", "seed", "certified"):
                    pts = [r for r in here if r["label"].startswith(f"psa {stop} ")]
                    ax.plot([r["kv_share"] for r in pts], [r[attr] for r in pts], color=COLORS[stop],
                            marker=MARKERS[stop], ms=8, label=f"PSA {stop}")
                ax.set_title(f"{ctx} tokens")
                ax.set_xlim(-2, 102)
                ax.set_xlabel("KV read per token (% of dense)")
                ax.grid(alpha=0.3, which="both")
                if attr == "kl":
                    ax.set_yscale("log")
                    ax.set_ylim(1e-5, 5)
            axes[0].set_ylabel(name)
            handles, labels = axes[0].get_legend_handles_labels()
            fig.legend(handles, labels, loc="upper center", ncol=5, frameon=False, bbox_to_anchor=(0.5, 1.0),
                       title="each stop rule at τ 0.9, 0.95 and 0.99", title_fontsize=12)
            fig.tight_layout(rect=(0, 0, 1, 0.86))
            fig.savefig(out_dir / fname, dpi=120)
            plt.close(fig)
            paths.append(out_dir / fname)
    return paths


# --- architecture ----------------------------------------------------------------------------------------------------

def _box(ax, x, y, w, h, title, lines=(), *, face="#eef2fb", edge="#3f51b5", size=10.5):
    from matplotlib.patches import FancyBboxPatch

    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.02,rounding_size=0.12", fc=face, ec=edge,
                                lw=1.4))
    ax.text(x + 0.15, y + h - 0.14, title, ha="left", va="top", fontsize=size + 0.5, weight="bold",
            family="DejaVu Sans Mono")
    if lines:
        ax.text(x + 0.15, y + h - 0.52, "\n".join(lines), ha="left", va="top", fontsize=size - 0.5, linespacing=1.35)


def _arrow(ax, a, b, *, text=None, style="-|>", color="0.25", ls="-", lw=1.4, rad=0.0, text_at=0.5, offset=(0, 0),
           size=9.5):
    ax.annotate("", xy=b, xytext=a, arrowprops=dict(arrowstyle=style, color=color, lw=lw, ls=ls,
                                                     connectionstyle=f"arc3,rad={rad}", shrinkA=2, shrinkB=2))
    if text:
        x = a[0] + (b[0] - a[0]) * text_at + offset[0]
        y = a[1] + (b[1] - a[1]) * text_at + offset[1]
        ax.text(x, y, text, ha="center", va="center", fontsize=size, color=color,
                bbox=dict(fc="white", ec="none", pad=1.0))


def plot_architecture(out: Path) -> Path:
    """The layers of psa_ref and psa_fast, lowest first, and who imports whom."""
    plt = _plotting.pyplot()
    fig, ax = plt.subplots(figsize=(12.5, 7.0))
    ax.set_xlim(0, 12.5)
    ax.set_ylim(-0.55, 6.85)
    ax.axis("off")

    ax.text(4.65, 6.65, "psa_ref — NumPy reference, the oracle", ha="center", fontsize=13, weight="bold")
    ax.text(9.85, 6.65, "psa_fast — GPU backend", ha="center", fontsize=13, weight="bold")
    for y, name in ((5.35, "tools and integrations"), (3.1, "KV cache manager"), (0.9, "algorithm")):
        ax.text(0.12, y, name, ha="center", va="center", rotation=90, fontsize=11, style="italic", color="0.3")

    ref = dict(face="#eef2fb", edge="#3f51b5")
    gpu = dict(face="#eaf6ec", edge="#2e7d32")
    _box(ax, 2.55, 4.5, 4.2, 1.75, "psa_ref.tools", [
        "cli — the psa command (demo, sim, eval)", "demo — the shipped real-attention trace",
        "evaluate — psa eval inside SmolLM2", "hf — transformers, backends ref / sweep"], **ref)
    _box(ax, 2.55, 2.25, 4.2, 1.75, "psa_ref.kvcache", [
        "store — HostStore, every block, authoritative", "pool — UnifiedPool, PerLayerPool (LRU, FIFO)",
        "batch — BatchController (FCFS)", "sim — psa sim: hits, PCIe bytes, step time"], **ref)
    _box(ax, 2.55, 0.05, 4.2, 1.75, "psa_ref", [
        "blocks — KVBlocks, metadata", "scoring — estimate, rank, upper_bound",
        "progressive — attention (Algorithm 1), stop rules", "topk · dense · sweep · result · trace"], **ref)
    _box(ax, 0.4, 2.25, 1.8, 1.75, "psa_ref.testing", [
        "assert_close, budgets", "oracles of every rule", "hypothesis strategies", "conformance checks"],
        face="#fff8e1", edge="#b28704", size=9.5)
    ax.text(1.05, 2.1, "shared by tests/\nand benchmarks/", ha="center", va="top", fontsize=9.5, color="0.35")

    _box(ax, 7.75, 4.5, 4.2, 1.75, "psa_fast.hf", [
        "backend \"fast\": each decode step", "through psa_fast.attention on the",
        "model's CUDA tensors, registered", "into psa_ref.tools.hf"], **gpu)
    _box(ax, 7.75, 2.25, 4.2, 1.75, "psa_fast.offload, .pool", [
        "HostKVStore — mapped pinned host memory", "GPUSlotPool — LRU / FIFO decided on the GPU",
        "OffloadKVCache, OffloadDecoder", "psa_gather — zero-copy loads"], **gpu)
    _box(ax, 7.75, 0.05, 4.2, 1.75, "psa_fast", [
        "KVBlocks, attention, topk_attention, dense", "PagedKVCache + metadata (Numba CUDA)",
        "DecodePlan: estimate → order → decode", "kernels/*.cu (CuPy RawKernel, NVRTC)"], **gpu)

    for y0, y1 in ((4.5, 4.0), (2.25, 1.8)):
        _arrow(ax, (4.65, y0), (4.65, y1))
    ax.text(4.77, 4.25, "imports", ha="left", va="center", fontsize=9.5, color="0.3")
    _arrow(ax, (9.85, 2.25), (9.85, 1.8))
    _arrow(ax, (11.95, 5.2), (11.95, 0.9), rad=-0.18)  # psa_fast.hf needs only the algorithm layer
    ax.text(12.13, 3.1, "imports", ha="center", va="center", fontsize=9.5, color="0.3", rotation=90)
    for y in (5.375, 3.125, 0.925):
        _arrow(ax, (7.75, y), (6.75, y), color="#2e7d32")
    _arrow(ax, (1.95, 2.25), (2.55, 0.93), color="#b28704", ls="--", rad=0.2)
    ax.text(0.4, -0.35, "Arrows point from a module to what it imports: each layer uses only the layers below it. "
            "Green: psa_fast imports psa_ref,\nnever the reverse, and each psa_fast stage is tested against the "
            "psa_ref stage beside it.", ha="left", va="center", fontsize=10, color="0.2")
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def plot_decode_step(out: Path) -> Path:
    """One decode step: the reference's stages on top, the GPU's below (resident and offloaded KV cache)."""
    plt = _plotting.pyplot()
    fig, ax = plt.subplots(figsize=(12, 7.2))
    ax.set_xlim(0, 12)
    ax.set_ylim(-0.15, 7.05)
    ax.axis("off")
    ref = dict(face="#eef2fb", edge="#3f51b5", size=10)
    gpu = dict(face="#eaf6ec", edge="#2e7d32", size=10)
    host = dict(face="#fff8e1", edge="#b28704", size=10)

    ax.text(0.05, 6.8, "psa_ref.attention(q, blocks, threshold)", fontsize=12, weight="bold", va="center",
            family="DejaVu Sans Mono")
    _box(ax, 0.05, 4.55, 1.7, 1.9, "query", ["q [Hq, D]", "KV cache as", "N blocks of S", "tokens + metadata"], **ref)
    _box(ax, 2.15, 4.55, 2.1, 1.9, "1 estimate", ["one score per block", "from its metadata", "(cuboid_mean:",
                                                  "q·c + |q|·r)"], **ref)
    _box(ax, 4.65, 4.55, 1.9, 1.9, "2 order", ["sink, recent first,", "then by estimate,", "descending"], **ref)
    _box(ax, 6.95, 4.55, 3.0, 1.9, "3 progressive loop", ["attend the next step blocks", "exactly; merge outputs",
                                                          "(log-sum-exp); verifier adds", "AS_acc, AS_min, AS_ema"],
         **ref)
    _box(ax, 10.35, 4.55, 1.6, 1.9, "4 output", ["softmax over", "blocks_used", "(same shape", "as q)"], **ref)
    for a, b in (((1.75, 5.5), (2.15, 5.5)), ((4.25, 5.5), (4.65, 5.5)), ((6.55, 5.5), (6.95, 5.5))):
        _arrow(ax, a, b)
    _arrow(ax, (9.95, 5.5), (10.35, 5.5))
    ax.text(10.15, 6.62, "stop rule holds", ha="center", va="center", fontsize=9.5, color="0.25")
    _arrow(ax, (9.4, 4.55), (7.5, 4.55), rad=-0.5)
    ax.text(8.45, 3.92, "rule does not hold: next chunk", ha="center", va="center", fontsize=9.5, color="0.25")

    ax.text(0.05, 3.55, "psa_fast: the same stages as kernels on the GPU", fontsize=12, weight="bold", va="center")
    _box(ax, 0.05, 1.45, 1.7, 1.8, "PagedKVCache", ["K, V in slots;", "metadata", "always resident"], **gpu)
    _box(ax, 2.15, 1.45, 2.1, 1.8, "psa_estimate", ["reads 2·D halves", "per block", "(quant3: on the",
                                                    "tensor cores)"], **gpu)
    _box(ax, 4.65, 1.45, 1.9, 1.8, "psa_order", ["bitonic sort of", "64-bit keys,", "one CTA per group"], **gpu)
    _box(ax, 6.95, 1.45, 3.0, 1.8, "psa_decode", ["chunks over a cluster of CTAs;", "the verifier on the device",
                                                  "decides the stop: no host", "synchronisation in the loop"], **gpu)
    _box(ax, 10.35, 1.45, 1.6, 1.8, "out", ["fixed buffer:", "a step is", "CUDA-graph", "capturable"], **gpu)
    for a, b in (((1.75, 2.35), (2.15, 2.35)), ((4.25, 2.35), (4.65, 2.35)), ((6.55, 2.35), (6.95, 2.35)),
                 ((9.95, 2.35), (10.35, 2.35))):
        _arrow(ax, a, b)

    _box(ax, 0.05, 0.0, 4.2, 1.15, "host memory (offload)", ["HostKVStore: every block, mapped pinned,",
                                                             "authoritative"], **host)
    _box(ax, 4.65, 0.0, 3.9, 1.15, "loader stream, per iteration j + 1", [
        "iteration ids → GPUSlotPool access →", "psa_gather of the misses (zero-copy)"], **host)
    _box(ax, 8.95, 0.0, 3.0, 1.15, "done flag", ["in mapped pinned memory:", "the host polls, no sync call"],
         **host)
    _arrow(ax, (4.25, 0.58), (4.65, 0.58), color="#b28704")
    _arrow(ax, (7.4, 1.15), (7.9, 1.45), color="#b28704", text="into pool slots", offset=(-0.75, 0.05), size=9)
    _arrow(ax, (9.6, 1.45), (10.1, 1.15), color="#b28704", text="written by the last group", offset=(1.2, 0.06),
           size=9)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def main(argv=None) -> list[Path]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(ROOT / "docs" / "img"), help="folder to write the PNGs into")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    paths = [plot_architecture(out / "psa_architecture.png"), plot_decode_step(out / "psa_decode_step.png")]
    for ctx in ("4k", "8k"):
        named = {name: json.loads((ROOT / "benchmarks" / f"results_eval_{ctx}_{name}.json").read_text())
                 for name in ("cuboid_mean", "quant3")}
        paths.append(plot_orders(named, out / f"psa_eval_{ctx}_accuracy.png"))
    paths += plot_full_run(full_run_rows(ROOT / "docs" / "accuracy.md"), out)
    for p in paths:
        print(f"wrote {p}")
    return paths


if __name__ == "__main__":
    main()
