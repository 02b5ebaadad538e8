"""What would a perfect stop rule buy inside the model? The oracle selection of PSA at
``tau``, decoded through SmolLM2 like ``psa eval``'s PSA runs.

For every decode step, layer and KV group, each query head's *true* block masses are
computed from every logit; each head takes the sink and recent blocks, then its heaviest
blocks until ``tau`` of its own mass is attended (the ideal budget of docs/accuracy.md), and
every head of the group attends the union of the group's choices — what a shared selection
reads, and at least as accurate for each head as its own set. No rule that estimates
masses can stop earlier at the same ``tau`` without attending less than ``tau`` of some
head's mass, so this bounds what any stop rule on the mass criterion can reach against top-k
at equal KL. Research only: it needs every logit, which is what PSA avoids computing.

Each process evaluates a range of the windows of ``psa eval --contexts 4096 --windows W``
and writes its runs; ``--pool`` pools the files (``psa_ref.tools.evaluate.pool_windows``) and
prints ``psa eval``'s table with a top-k ladder run alongside::

    for i in 0 1; do python examples/oracle_in_model.py --windows 8 --part $i/2 --out /tmp/oracle_$i.pkl & done; wait
    python examples/oracle_in_model.py --pool /tmp/oracle_0.pkl /tmp/oracle_1.pkl

(docs/accuracy.md: ``--taus 0.8,0.9,0.95 --topk 64,96,128``, and ``--criterion output --taus 0.9,0.95,0.98``,
where each head stops once its output is within ``1 - tau`` of dense, relative L2 error.)
"""

from __future__ import annotations

import argparse
import pickle
from types import SimpleNamespace

import numpy as np

from psa_ref import analysis
from psa_ref.tools import evaluate, hf

_original_decode = hf._decode_ref


def oracle_selection(mass: np.ndarray, tau: float, forced: np.ndarray) -> np.ndarray:
    """Blocks of one KV group: the union over its heads of (forced blocks, then the head's
    heaviest blocks until ``tau`` of its mass). ``mass`` is ``[N, G]``; sorted block ids."""
    chosen = np.zeros(mass.shape[0], dtype=bool)
    chosen[forced] = True
    for h in range(mass.shape[1]):
        m = mass[:, h]
        need = tau * m.sum() - m[forced].sum()
        rest = np.setdiff1d(np.argsort(-m, kind="stable"), forced, assume_unique=True)
        if need > 0:
            count = int(np.searchsorted(np.cumsum(m[rest]), need * (1 - 1e-12))) + 1
            chosen[rest[:count]] = True
    return np.flatnonzero(chosen)


def output_oracle_selection(mass: np.ndarray, weighted: np.ndarray, delta: float, forced: np.ndarray) -> np.ndarray:
    """Blocks of one KV group under a criterion on the *output*, not the mass: each head takes
    the forced blocks, then its heaviest blocks until its output over them is within
    ``delta`` of its dense output (relative L2 error); union over the heads. ``mass``
    ``[N, G]`` and ``weighted`` ``[N, G, D]`` come from :func:`psa_ref.analysis.block_sums`."""
    n, g = mass.shape
    rest = [np.setdiff1d(np.argsort(-mass[:, h], kind="stable"), forced, assume_unique=True) for h in range(g)]
    order = np.stack([np.r_[forced, r] for r in rest], axis=1)  # [N, G]: forced, then heaviest first
    outputs, _ = analysis.prefix_attention(mass, weighted, order)  # [N, G, D]
    dense = weighted.sum(axis=0) / mass.sum(axis=0)[:, None]
    ok = analysis.relative_error(outputs, dense) <= delta  # [N, G]
    ok[: max(forced.size - 1, 0)] = False  # the forced blocks always come whole
    ok[-1] = True  # every block: the dense output itself (the error is rounding there)
    chosen = np.zeros(n, dtype=bool)
    for h in range(g):
        chosen[order[: int(np.argmax(ok[:, h])) + 1, h]] = True
    return np.flatnonzero(chosen)


CRITERION = "mass"  # or "output": the threshold's 1 - tau is the relative output error allowed


def oracle_decode(session, layer, b, q, key, value, scaling):
    """``hf._decode_ref`` with the oracle selection in place of the stop rule (top-k and
    ``threshold = 1`` runs go through the original)."""
    cfg = session.config
    if cfg.topk is not None or cfg.threshold >= 1.0:
        return _original_decode(session, layer, b, q, key, value, scaling)
    state = session.layers.setdefault((layer, b), hf.LayerBlocks(cfg.block_size, cfg.metadata))
    blocks = state.sync(key, value)
    q64 = q.double().cpu().numpy()
    hq, hkv, n = q64.shape[0], blocks.num_heads, blocks.num_blocks
    g = hq // hkv
    forced = np.unique(np.r_[np.arange(min(cfg.sink_blocks, n)), np.arange(max(n - cfg.recent_blocks, 0), n)])
    out = np.empty_like(q64)
    used = []
    for kv in range(hkv):
        heads = slice(kv * g, (kv + 1) * g)
        mass, weighted = analysis.block_sums(q64[heads], blocks.keys[kv], blocks.values[kv], blocks.block_size,
                                             scaling)
        if CRITERION == "mass":
            chosen = oracle_selection(mass, cfg.threshold, forced)
        else:
            chosen = output_oracle_selection(mass, weighted, 1.0 - cfg.threshold, forced)
        # softmax attention over the chosen blocks, from the same block sums
        out[heads] = weighted[chosen].sum(axis=0) / mass[chosen].sum(axis=0)[:, None]
        used.append(chosen)
    if cfg.record:
        hf._record(session, layer, blocks, q64, SimpleNamespace(blocks_used=used), scaling)
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--windows", type=int, default=8)
    parser.add_argument("--part", default="0/1", help="I/P: this process evaluates windows i with i %% P == I")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--taus", default="0.8,0.9,0.95")
    parser.add_argument("--topk", default="64,96,128")
    parser.add_argument("--text", default="pydoc")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--criterion", choices=("mass", "output"), default="mass",
                        help="stop at tau of each head's mass, or at relative output error 1 - tau")
    parser.add_argument("--out", help="pickle of this part's per-window runs")
    parser.add_argument("--pool", nargs="+", help="pool these parts and print the table")
    args = parser.parse_args(argv)
    if args.pool:
        per_window = sorted((w for path in args.pool for w in pickle.load(open(path, "rb"))), key=lambda w: w[0])
        runs = evaluate.pool_windows([w[1] for w in per_window])
        for r in runs:
            if r.method == "psa" and r.tau < 1:
                r.label = f"oracle τ={r.tau:g}"  # with --criterion output: relative output error 1 - τ
        print(evaluate.format_table(runs))
        return
    import torch

    torch.set_num_threads(args.threads)
    global CRITERION
    CRITERION = args.criterion
    hf._decode_ref = oracle_decode
    model, tokenizer = evaluate.load_smollm2()
    index, parts = (int(x) for x in args.part.split("/"))
    results = []
    for i in range(index, args.windows, parts):
        runs = evaluate.evaluate(model, tokenizer, text=args.text, offset=evaluate.TEXT_OFFSET + i * 4097, windows=1,
                                 contexts=(4096,), tokens=args.tokens, rules=("ema",),
                                 taus=tuple(float(t) for t in args.taus.split(",")),
                                 topk=tuple(int(k) for k in args.topk.split(",")), topk_at_budget=False, ideal=False,
                                 progress=False)
        results.append((i, runs))
        print(f"window {i} done", flush=True)
        pickle.dump(results, open(args.out, "wb"))


if __name__ == "__main__":
    main()
