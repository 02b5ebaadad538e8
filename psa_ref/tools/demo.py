"""``psa demo``: Algorithm 1 against top-k and the ideal budget on real attention.

Every decode step of the shipped SmolLM2 trace (6 layers x 32 positions, 9 query heads,
3 KV heads, about 2K tokens in blocks of 16) is run through Algorithm 1 for each stop rule and threshold (by default
its vectorised twin [`psa_ref.sweep.attention`][psa_ref.sweep.attention], which attends the same blocks as the
readable loop [`psa_ref.attention`][psa_ref.attention] and gives this table digit for digit in a quarter of the
time; ``backend="ref"`` runs the loop itself), and compared with dense attention and with top-k at every
budget. The table says, per rule and threshold, how many blocks PSA attended, how much
of the true attention mass that covered, the output error, and the top-k budget that
reaches the same mean error.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .. import _plotting, _validate, analysis, sweep
from ..blocks import KVBlocks
from ..dense import dense_attention
from ..scoring import estimate, rank
from ..progressive import BLOCK_STOP_RULES, attention
from ..trace import Trace, load_trace

TAUS = (0.8, 0.9, 0.95, 0.99)


@dataclass
class Row:
    """One line of the demo table: a rule at a threshold, aggregated over all cases."""

    rule: str
    tau: float
    blocks: float  # mean blocks attended per selection group
    blocks_pct: float  # ... as a share of the blocks in the cache
    mass_mean: float  # true attended mass fraction, mean over query heads and cases
    mass_p1: float  # ... its 1st percentile
    err_mean: float  # relative output error vs dense, mean
    err_p99: float  # ... its 99th percentile
    topk_k: int | None = None  # smallest top-k budget with mean error <= err_mean
    topk_pct: float | None = None


@dataclass
class DemoResult:
    rows: list[Row]
    needed95: dict[int, np.ndarray]  # layer -> blocks needed for 95% of the mass, per (position, head)
    num_blocks: int
    topk_err: np.ndarray  # [Nmax] mean error of top-k at k = 1..Nmax
    seconds: float
    meta: dict = field(default_factory=dict)


def _pad(curve: np.ndarray, length: int) -> np.ndarray:
    """Extend a per-budget curve to ``length`` entries by repeating its last (full-cache) value."""
    return np.concatenate([curve, np.repeat(curve[-1:], length - curve.shape[0], axis=0)])


BACKENDS = ("sweep", "ref")  # psa_ref.sweep.attention (the default) or psa_ref.attention, the readable loop


def run_demo(trace: Trace | None = None, *, taus=TAUS, rules=BLOCK_STOP_RULES, block_size: int = 16,
             metadata: str = "cuboid_mean", progress: bool = True, backend: str = "sweep") -> DemoResult:
    """Run every case of ``trace`` (default: the shipped one) and aggregate the table; ``backend`` is
    ``"sweep"`` (Algorithm 1 vectorised, the default) or ``"ref"`` (the readable loop): the same blocks."""
    from tqdm.auto import tqdm

    run = {"sweep": sweep.attention, "ref": attention}[_validate.choice(backend, "backend", BACKENDS)]

    start = time.perf_counter()
    trace = trace or load_trace()
    n_layers, n_pos, hq, _ = trace.q.shape
    hkv = trace.k.shape[1]
    g = hq // hkv
    n_max = -(-int(trace.positions.max() + 1) // block_size)

    used = {(r, t): [] for r in rules for t in taus}  # blocks per group
    share = {(r, t): [] for r in rules for t in taus}  # ... as a share of the cache's blocks
    mass = {(r, t): [] for r in rules for t in taus}  # true mass per query head
    err = {(r, t): [] for r in rules for t in taus}
    ideal_blocks = {t: [] for t in taus}
    ideal_share = {t: [] for t in taus}
    ideal_err = {t: [] for t in taus}
    topk_err_sum, topk_count = np.zeros(n_max), 0
    needed95 = {int(layer): [] for layer in trace.layers}

    cases = [(li, pi) for li in range(n_layers) for pi in range(n_pos)]
    for li, pi in tqdm(cases, desc="psa demo", unit="step", disable=not progress):
        q, keys, values = (a.astype(np.float64) for a in trace.case(li, pi))
        blocks = KVBlocks.from_dense(keys, values, block_size=block_size, metadata=metadata, kv_layout="HND")
        dense = dense_attention(q, keys, values, scale=trace.scale)
        scores = estimate(q, blocks, trace.scale)
        for kv in range(hkv):
            heads = slice(kv * g, (kv + 1) * g)
            m, w = analysis.block_sums(q[heads], keys[kv], values[kv], block_size, trace.scale)
            needed95[int(trace.layers[li])].extend(analysis.blocks_for_mass(m, 0.95))
            # top-k at every budget: prefixes of the shared estimate order
            outs, _ = analysis.prefix_attention(m, w, rank(scores[heads].max(axis=0)))
            topk_err_sum += _pad(analysis.relative_error(outs, dense[heads]).sum(axis=1), n_max)
            topk_count += g
            # ideal adaptive budget: each head's own heaviest blocks until tau of its mass
            outs, _ = analysis.prefix_attention(m, w, np.argsort(-m, axis=0, kind="stable"))
            for t in taus:
                n = analysis.blocks_for_mass(m, t)
                ideal_blocks[t].extend(n)
                ideal_share[t].extend(n / blocks.num_blocks)
                ideal_err[t].extend(analysis.relative_error(outs[n - 1, np.arange(g)], dense[heads]))
        for r in rules:
            for t in taus:
                res = run(q, blocks, t, stop=r, scale=trace.scale, exact_mass=True)
                used[r, t].extend(res.num_used)
                share[r, t].extend(res.num_used / blocks.num_blocks)
                mass[r, t].extend(res.mass_exact)
                err[r, t].extend(analysis.relative_error(res.output, dense))

    topk_err = topk_err_sum / topk_count
    rows = []

    def topk_match(e: float) -> tuple[int, float]:
        k = int(np.argmax(topk_err <= e + 1e-15)) + 1 if (topk_err <= e + 1e-15).any() else n_max
        return k, 100.0 * k / n_max

    for t in taus:
        e = np.array(ideal_err[t])
        rows.append(Row("ideal", t, float(np.mean(ideal_blocks[t])), 100 * float(np.mean(ideal_share[t])),
                        float("nan"), float("nan"), float(e.mean()), float(np.percentile(e, 99)),
                        *topk_match(float(e.mean()))))
    for r in rules:
        for t in taus:
            u, ms, e = np.array(used[r, t]), np.array(mass[r, t]), np.array(err[r, t])
            rows.append(Row(r, t, float(u.mean()), 100 * float(np.mean(share[r, t])), float(ms.mean()),
                            float(np.percentile(ms, 1)), float(e.mean()), float(np.percentile(e, 99)),
                            *topk_match(float(e.mean()))))
    return DemoResult(rows=rows, needed95={k: np.array(v) for k, v in needed95.items()}, num_blocks=n_max,
                      topk_err=topk_err, seconds=time.perf_counter() - start,
                      meta={"trace": trace.meta.get("model", "?"), "cases": len(cases), "block_size": block_size,
                            "metadata": metadata, "gqa": "shared", "backend": backend})


def format_table(result: DemoResult) -> str:
    """The demo table as Markdown."""
    lines = [
        "| rule | τ | blocks attended | % of blocks | true mass mean | true mass p1 | error mean | error p99 "
        "| top-k k at same mean error (% of blocks) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result.rows:
        mass = "≥ τ" if np.isnan(r.mass_mean) else f"{r.mass_mean:.3f}"
        p1 = "≥ τ" if np.isnan(r.mass_p1) else f"{r.mass_p1:.3f}"
        lines.append(f"| {r.rule} | {r.tau:g} | {r.blocks:.1f} | {r.blocks_pct:.1f}% | {mass} | {p1} | "
                     f"{r.err_mean:.4f} | {r.err_p99:.4f} | {r.topk_k} ({r.topk_pct:.1f}%) |")
    return "\n".join(lines)


def format_layers(result: DemoResult) -> str:
    """Blocks needed for 95% of the mass, per layer (the paper's Observation 2)."""
    lines = ["| layer | blocks for 95% of mass: mean | median | p10 | p90 |", "|---|---|---|---|---|"]
    for layer, n in result.needed95.items():
        lines.append(f"| {layer} | {n.mean():.1f} | {np.median(n):.0f} | {np.percentile(n, 10):.0f} | "
                     f"{np.percentile(n, 90):.0f} |")
    return "\n".join(lines)


def plot(result: DemoResult, out_dir: Path) -> list[Path]:
    """Write the two demo figures into ``out_dir``; return their paths."""
    plt = _plotting.pyplot()

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for layer, n in result.needed95.items():
        x = np.sort(n)
        ax.step(x, np.arange(1, x.size + 1) / x.size, where="post", label=f"layer {layer}")
    ax.set_xscale("log")
    ax.set_xlabel(f"blocks needed for 95% of the attention mass (of {result.num_blocks})")
    ax.set_ylabel("fraction of (position, query head)")
    ax.set_title("Budget needed varies by layer and head (SmolLM2-135M, real text)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    paths.append(_plotting.save(fig, out_dir / "psa_demo_blocks_cdf.png"))

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    k = np.arange(1, result.topk_err.size + 1)
    ax.plot(100 * k / result.num_blocks, result.topk_err, color="0.4", label="top-k (k = 1..N)")
    # 'ideal' counts blocks per query head (each head's own heaviest blocks); the rest per KV head
    markers = {"ideal": "*", "remaining": "o", "seed": "s", "certified": "^"}
    for rule in dict.fromkeys(r.rule for r in result.rows):
        rows = [r for r in result.rows if r.rule == rule]
        ax.plot([r.blocks_pct for r in rows], [r.err_mean for r in rows], marker=markers.get(rule, "D"),
                label=f"{rule} (τ = {', '.join(f'{r.tau:g}' for r in rows)})")
    ax.set_yscale("log")
    ax.set_ylim(1e-7, 3)
    ax.set_xlabel("blocks attended (% of the cache)")
    ax.set_ylabel("mean relative output error vs dense")
    ax.set_title("Budget vs error: PSA stop rules and top-k")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    paths.append(_plotting.save(fig, out_dir / "psa_demo_budget_error.png"))
    return paths


def strict_json(x):
    """``x`` with every NaN or infinite float replaced by None, so that ``json.dumps`` writes ``null``
    (strict JSON has no ``NaN``): the ``ideal`` rows have no measured mass, by construction."""
    if isinstance(x, dict):
        return {k: strict_json(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [strict_json(v) for v in x]
    if isinstance(x, (float, np.floating)):
        return float(x) if np.isfinite(x) else None
    if isinstance(x, np.integer):
        return int(x)
    return x


def main(out_dir: str = ".", trace_path: str | None = None, plots: bool = True, progress: bool = True,
         backend: str = "sweep") -> DemoResult:
    """Run the demo, print the tables, write the figures and a JSON summary into ``out_dir``."""
    trace = load_trace(trace_path)
    print(f"Trace: {trace.meta.get('model')} on {trace.meta.get('text')!r}, layers {trace.layers.tolist()}, "
          f"{trace.q.shape[1]} decode positions, {trace.q.shape[2]} query / {trace.k.shape[1]} KV heads, "
          f"{trace.k.shape[2]} tokens, head dim {trace.q.shape[3]}")
    result = run_demo(trace, progress=progress, backend=backend)
    out = Path(out_dir)
    print()
    print(format_layers(result))
    print()
    print(f"Blocks of 16 tokens ({result.num_blocks} in the cache), cuboid_mean metadata, GQA shared; "
          f"errors are ||o - o_dense|| / ||o_dense|| per query head; 'ideal' attends each head's heaviest blocks")
    print(format_table(result))
    if plots:
        for p in plot(result, out):
            print(f"wrote {p}")
    summary = out / "psa_demo.json"
    out.mkdir(parents=True, exist_ok=True)
    summary.write_text(json.dumps(strict_json({
        "rows": [r.__dict__ for r in result.rows], "meta": result.meta,
        "needed95_mean": {str(k): float(v.mean()) for k, v in result.needed95.items()},
        "seconds": result.seconds}), indent=1, allow_nan=False))
    print(f"wrote {summary}  ({result.seconds:.1f} s)")
    return result
