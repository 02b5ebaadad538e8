"""KV cache manager, part 4: a trace-driven decode simulator (``psa sim``).

It replays decode steps of several requests through block selection and a pool and
counts what moves. Three stages, each usable on its own:

1. **Workload** (``Workload``): per request, the prompt's K/V, then for each decode
   step the new token's K/V and the queries of every layer. [`trace_workload`][psa_ref.kvcache.sim.trace_workload] turns
   the shipped SmolLM2 trace into one request of 6 layers;
   [`synthetic_workload`][psa_ref.kvcache.sim.synthetic_workload] makes many requests whose layers differ in how flat
   their attention is.
2. **Selection** ([`select`][psa_ref.kvcache.sim.select]): the blocks each (request, step, layer, KV head) reads,
   in processing order, from [`psa_ref.attention`][psa_ref.attention] (``gqa="shared"``) or
   [`psa_ref.topk_attention`][psa_ref.topk_attention] called on the [`HostStore`][psa_ref.kvcache.store.HostStore]'s
   view of the cache as it grows token by token. The selection does not depend on the pool.
3. **Replay** ([`replay`][psa_ref.kvcache.sim.replay]): requests are admitted by the
   [`BatchController`][psa_ref.kvcache.batch.BatchController], prefilled into a host store, and decoded step
   by step; every layer runs its attention loop one iteration at a time (``step`` blocks
   per KV head), and each iteration of the whole batch is one
   [`access`][psa_ref.kvcache.pool.SlotPool.access] of the pool.

Modelled time of a decode step ([`CostModel`][psa_ref.kvcache.sim.CostModel]), summed over the layers because a
layer cannot start before the previous one is done::

    t_layer = max(bytes_attended / HBM, bytes_missed / PCIe) + iterations * overhead

Attention reads the blocks from the pool in HBM while the loader copies the misses of
the next iteration over PCIe, so within a layer the two overlap and the slower one
counts; ``iterations`` is the longest loop of the batch at that layer (iterations run in
lock step). Top-k is streamed through the same loop, ``step`` blocks per iteration, so
that it fits the same pools. The defaults are the H200 figures of the design brief.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .. import _plotting, _validate
from .batch import BatchController
from .pool import PerLayerPool, PoolStats, SlotPool, UnifiedPool
from ..progressive import DEFAULT_STOP, attention, resolve_stop
from .store import HostStore
from ..testing import skewed_like_trace
from ..topk import topk_attention
from ..trace import Trace, load_trace

METHODS = ("psa", "topk")
POOL_KINDS = ("unified", "per_layer")
FRACTIONS = (0.10, 0.25, 0.50)


@dataclass(frozen=True)
class CostModel:
    """Bandwidths and overhead of the modelled step time (defaults: the H200 of DESIGN.md).

    Attributes:
        hbm_bytes_per_s: HBM read bandwidth for attention over resident blocks (measured HBM copy, 4229 GB/s).
        pcie_bytes_per_s: host-to-GPU bandwidth for misses: the zero-copy gather of blocks from
            mapped pinned memory, measured at 43-51 GB/s (47 GB/s, the middle).
        iteration_overhead_s: fixed cost of one iteration of the loop (kernel launch, the
            verifier's flag, the loader's poll): an assumption, not a measurement.
    """

    hbm_bytes_per_s: float = 4229e9
    pcie_bytes_per_s: float = 47e9
    iteration_overhead_s: float = 3e-6

    def layer_seconds(self, bytes_attended: float, bytes_missed: float, iterations: int) -> float:
        """``max(bytes_attended / HBM, bytes_missed / PCIe) + iterations * overhead``."""
        return (max(bytes_attended / self.hbm_bytes_per_s, bytes_missed / self.pcie_bytes_per_s)
                + iterations * self.iteration_overhead_s)


# --- 1. workloads -------------------------------------------------------------------------------


@dataclass
class Request:
    """One request: a prompt, then ``n`` decode steps.

    Attributes:
        prompt_keys: ``[L, Hkv, P, D]``, the prompt's K (written by prefill).
        prompt_values: ``[L, Hkv, P, D]``.
        keys: ``[L, Hkv, n, D]``, the K of the token each decode step appends.
        values: ``[L, Hkv, n, D]``.
        queries: ``[n, L, Hq, D]``; step ``s`` attends the prompt and decode tokens ``0..s``.
    """

    prompt_keys: np.ndarray
    prompt_values: np.ndarray
    keys: np.ndarray
    values: np.ndarray
    queries: np.ndarray

    @property
    def num_steps(self) -> int:
        return self.queries.shape[0]


@dataclass
class Workload:
    """Requests to decode, served first come first served, all of one model shape.

    Attributes:
        name: for tables.
        requests: the ``Request`` list, in arrival order.
        block_size: ``S``.
        scale: the logit scale.
        layer_names: one label per layer (the model's layer numbers for a trace).
    """

    name: str
    requests: list[Request]
    block_size: int
    scale: float
    layer_names: list[str]

    @property
    def num_layers(self) -> int:
        return self.requests[0].keys.shape[0]

    @property
    def num_kv_heads(self) -> int:
        return self.requests[0].keys.shape[1]

    @property
    def head_dim(self) -> int:
        return self.requests[0].keys.shape[3]

    @property
    def dtype(self) -> np.dtype:
        return self.requests[0].keys.dtype

    def final_blocks(self) -> int:
        """Blocks of every request at its last step, summed: an upper bound on the live cache."""
        s = self.block_size
        return self.num_kv_heads * self.num_layers * sum(
            -(-(r.prompt_keys.shape[2] + r.num_steps) // s) for r in self.requests)


def trace_workload(trace: Trace | None = None, *, block_size: int = 16) -> Workload:
    """One request from a captured trace (default: the shipped one).

    The trace's queries sit at consecutive positions ``p0 .. p0+n-1``; tokens ``0..p0-1``
    are the prompt and each decode step appends token ``p`` before its query attends
    ``0..p``.
    """
    trace = trace or load_trace()
    pos = np.asarray(trace.positions)
    if pos.size == 0 or np.any(np.diff(pos) != 1) or pos[-1] >= trace.k.shape[2]:
        raise ValueError(f"trace positions must be consecutive and within the captured tokens, got {pos.tolist()}")
    p0, p1 = int(pos[0]), int(pos[-1]) + 1
    req = Request(prompt_keys=trace.k[:, :, :p0], prompt_values=trace.v[:, :, :p0],
                  keys=trace.k[:, :, p0:p1], values=trace.v[:, :, p0:p1], queries=np.swapaxes(trace.q, 0, 1))
    return Workload(name="trace", requests=[req], block_size=block_size, scale=trace.scale,
                    layer_names=[str(int(x)) for x in trace.layers])


# (query temperature, hot-block fraction) per layer, cycled: flat, mixed, peaked, medium.
SYNTHETIC_LAYERS = ((0.2, 0.1), (0.6, 0.3), (1.0, 0.02), (0.35, 0.1))


def synthetic_workload(seed: int = 0, *, num_requests: int = 16, num_layers: int = 4, num_kv_heads: int = 2,
                       group: int = 3, head_dim: int = 64, block_size: int = 16,
                       prompt_tokens: tuple[int, int] = (512, 1536), decode_steps: tuple[int, int] = (16, 32),
                       query_drift: float = 0.3) -> Workload:
    """Many requests with skewed attention (``psa_ref.testing.skewed_like_trace``).

    Layers differ as in real models (the paper's Observation 2): layer ``l`` scales its
    queries by a temperature and has a share of hot blocks from ``SYNTHETIC_LAYERS``,
    so some layers need most of their blocks and others a few. Consecutive decode
    queries of a layer are one base query plus ``query_drift`` noise, which keeps the hot
    blocks hot from step to step, as in real decoding.

    Args:
        seed: everything is drawn from ``np.random.default_rng(seed)``.
        num_requests: requests, all submitted at step 0 in this order.
        num_layers: ``L``.
        num_kv_heads: ``Hkv``.
        group: query heads per KV head (``Hq = Hkv * group``).
        head_dim: ``D``.
        block_size: ``S``.
        prompt_tokens: ``(low, high)``: prompt lengths are drawn uniformly in between.
        decode_steps: ``(low, high)``: decode lengths, likewise.
        query_drift: standard deviation of the per-step query noise.
    """
    rng = np.random.default_rng(seed)
    hq = num_kv_heads * group
    requests = []
    for _ in range(num_requests):
        p = int(rng.integers(prompt_tokens[0], prompt_tokens[1] + 1))
        n = int(rng.integers(decode_steps[0], decode_steps[1] + 1))
        ks, vs, qs = [], [], []
        for layer in range(num_layers):
            temp, hot = SYNTHETIC_LAYERS[layer % len(SYNTHETIC_LAYERS)]
            q, k, v = skewed_like_trace(rng, num_q_heads=hq, num_kv_heads=num_kv_heads, num_tokens=p + n,
                                        head_dim=head_dim, block_size=block_size, hot_fraction=hot)
            ks.append(k)
            vs.append(v)
            drift = query_drift * rng.standard_normal((n, hq, head_dim))
            qs.append((temp * (q.astype(np.float64) + drift)).astype(np.float16))
        k, v = np.stack(ks), np.stack(vs)  # [L, Hkv, p+n, D]
        requests.append(Request(prompt_keys=k[:, :, :p], prompt_values=v[:, :, :p], keys=k[:, :, p:],
                                values=v[:, :, p:], queries=np.stack(qs, axis=1)))
    return Workload(name="synthetic", requests=requests, block_size=block_size, scale=1.0 / np.sqrt(head_dim),
                    layer_names=[str(i) for i in range(num_layers)])


# --- 2. selection -------------------------------------------------------------------------------


@dataclass
class Selections:
    """The blocks every decode step of every request reads.

    Attributes:
        method: ``"psa"`` or ``"topk"``.
        step: blocks per KV head per iteration of the loop.
        k: the top-k budget (None for PSA).
        blocks: ``blocks[r][s][l][h]``: ``[n]`` int64 block indices that KV head ``h``
            of layer ``l`` reads at decode step ``s`` of request ``r``, in processing order.
        num_blocks: ``num_blocks[r][s]``: blocks in the cache at that step (every layer alike).
    """

    method: str
    step: int
    k: int | None
    blocks: list[list[list[list[np.ndarray]]]]
    num_blocks: list[list[int]]

    def chunks(self, request: int, step: int, layer: int) -> list[list[tuple[int, int]]]:
        """The iterations of one (request, step, layer): ``(kv_head, block)`` pairs, ``self.step``
        blocks per head; a head whose loop stopped earlier has no pair in later iterations."""
        heads = self.blocks[request][step][layer]
        n_it = max(-(-b.size // self.step) for b in heads)
        return [[(h, int(j)) for h, b in enumerate(heads) for j in b[i * self.step : (i + 1) * self.step]]
                for i in range(n_it)]

    def per_layer(self) -> list[np.ndarray]:
        """For each layer, the blocks read per KV head at every (request, step, head)."""
        n_layers = len(self.blocks[0][0])
        return [np.array([b.size for req in self.blocks for st in req for b in st[layer]]) for layer in range(n_layers)]

    def mean_blocks(self) -> float:
        """Mean blocks read per KV head per layer per step."""
        return float(np.concatenate(self.per_layer()).mean())


def select(workload: Workload, method: str = "psa", *, threshold: float = 0.95, stop: str = DEFAULT_STOP,
           k: int | None = None, step: int = 1, metadata: str = "cuboid_mean", progress: bool = False) -> Selections:
    """Run the reference selection on every decode step of ``workload``.

    Each request's tokens are written into a [`HostStore`][psa_ref.kvcache.store.HostStore] as decoding
    would (prefill, then one token per step and layer); at every step the store's
    [`kv_blocks`][psa_ref.kvcache.store.HostStore.kv_blocks] view goes through [`psa_ref.attention`][psa_ref.attention]
    (``method="psa"``, GQA shared, no sink/recent blocks) or
    [`psa_ref.topk_attention`][psa_ref.topk_attention] (``method="topk"``, budget ``k``).
    """
    from tqdm.auto import tqdm

    method = _validate.choice(method, "method", METHODS)
    step = _validate.integer(step, "step", minimum=1)
    if method == "topk":
        k = _validate.integer(k, "k", minimum=1)
    total = sum(r.num_steps for r in workload.requests) * workload.num_layers
    bar = tqdm(total=total, desc=f"select {workload.name} {method}", unit="step", disable=not progress, leave=False)
    blocks, num_blocks = [], []
    for req in workload.requests:
        store = HostStore(num_layers=workload.num_layers, num_kv_heads=workload.num_kv_heads,
                          head_dim=workload.head_dim, block_size=workload.block_size, metadata=metadata,
                          dtype=workload.dtype)
        for layer in range(workload.num_layers):
            store.extend(0, layer, req.prompt_keys[layer], req.prompt_values[layer])
        per_step, sizes = [], []
        for s in range(req.num_steps):
            per_layer = []
            for layer in range(workload.num_layers):
                store.append(0, layer, req.keys[layer, :, s], req.values[layer, :, s])
                kv = store.kv_blocks(0, layer)
                q = req.queries[s, layer]
                if method == "psa":
                    res = attention(q, kv, threshold, stop=stop, step=step, scale=workload.scale, gqa="shared",
                                    sink_blocks=0, recent_blocks=0)
                else:
                    res = topk_attention(q, kv, k, scale=workload.scale, gqa="shared", sink_blocks=0,
                                         recent_blocks=0)
                per_layer.append([np.asarray(b, dtype=np.int64) for b in res.blocks_used])
                bar.update()
            per_step.append(per_layer)
            sizes.append(store.num_blocks(0, 0))
        blocks.append(per_step)
        num_blocks.append(sizes)
    bar.close()
    return Selections(method=method, step=step, k=k if method == "topk" else None, blocks=blocks,
                      num_blocks=num_blocks)


# --- 3. replay ----------------------------------------------------------------------------------


@dataclass
class StepRecord:
    """What one decode step of the whole batch did (every layer).

    Attributes:
        batch: requests decoded in this step.
        blocks: block reads (pool accesses), summed over layers, requests and KV heads.
        hits, misses: of those reads.
        bytes_attended: bytes of K and V the attention read from the pool.
        bytes_pcie: bytes loaded from the host store (the misses).
        iterations: loop iterations, summed over layers.
        seconds: the modelled step time ([`CostModel`][psa_ref.kvcache.sim.CostModel]).
        live_blocks: blocks in the host store after the step's appends.
    """

    batch: int
    blocks: int
    hits: int
    misses: int
    bytes_attended: int
    bytes_pcie: int
    iterations: int
    seconds: float
    live_blocks: int


@dataclass
class Replay:
    """The result of [`replay`][psa_ref.kvcache.sim.replay].

    Attributes:
        pool, policy, num_slots: the pool replayed.
        records: one ``StepRecord`` per decode step.
        stats: the pool's [`PoolStats`][psa_ref.kvcache.pool.PoolStats] at the end.
        layer_hits, layer_accesses: ``[L]`` int64, per layer.
        admitted: request indices in admission order.
    """

    pool: str
    policy: str
    num_slots: int
    records: list[StepRecord]
    stats: PoolStats
    layer_hits: np.ndarray
    layer_accesses: np.ndarray
    admitted: list[int]

    @property
    def hit_rate(self) -> float:
        return self.stats.hit_rate

    @property
    def pcie_bytes_per_step(self) -> float:
        return float(np.mean([r.bytes_pcie for r in self.records]))

    @property
    def seconds_per_step(self) -> float:
        return float(np.mean([r.seconds for r in self.records]))

    @property
    def peak_live_blocks(self) -> int:
        return max(r.live_blocks for r in self.records)


def make_pool(kind: str, num_slots: int, store: HostStore, policy: str = "lru") -> SlotPool:
    """A [`UnifiedPool`][psa_ref.kvcache.pool.UnifiedPool] (``kind="unified"``) or
    [`PerLayerPool`][psa_ref.kvcache.pool.PerLayerPool]."""
    kind = _validate.choice(kind, "pool", POOL_KINDS)
    if kind == "unified":
        return UnifiedPool(num_slots, policy, store=store)
    return PerLayerPool(num_slots, store.num_layers, policy, store=store)


def replay(workload: Workload, selections: Selections, *, pool: str = "unified", num_slots: int,
           policy: str = "lru", max_batch: int | None = None, cost: CostModel | None = None) -> Replay:
    """Decode every request of ``workload`` through a pool; count hits, misses, bytes and time.

    Requests are submitted in order to a [`BatchController`][psa_ref.kvcache.batch.BatchController] (demand
    ``Hkv * step`` slots); admitted ones are prefilled into a fresh host store (the pool
    starts cold for them), decode one token per step, and leave when done, freeing their
    blocks. A pool too small for one iteration raises ``ValueError`` from the controller.
    """
    cost = cost or CostModel()
    n_layers, hkv = workload.num_layers, workload.num_kv_heads
    store = HostStore(num_layers=n_layers, num_kv_heads=hkv, head_dim=workload.head_dim,
                      block_size=workload.block_size, metadata="minmax", dtype=workload.dtype)
    kv_pool = make_pool(pool, num_slots, store, policy)
    ctl = BatchController(kv_pool.capacity_per_layer, max_batch=max_batch)
    for r in range(len(workload.requests)):
        ctl.submit(r, hkv * selections.step)

    records: list[StepRecord] = []
    layer_hits, layer_accesses = np.zeros(n_layers, np.int64), np.zeros(n_layers, np.int64)
    next_step: dict[int, int] = {}
    while not ctl.idle:
        for r in ctl.admit():
            req = workload.requests[r]
            for layer in range(n_layers):
                store.extend(r, layer, req.prompt_keys[layer], req.prompt_values[layer])
            next_step[r] = 0
        running = ctl.running  # never empty: the head of the queue fits an idle controller
        blocks = hits = bytes_attended = bytes_pcie = iterations = 0
        seconds = 0.0
        for layer in range(n_layers):
            for r in running:
                req, s = workload.requests[r], next_step[r]
                store.append(r, layer, req.keys[layer, :, s], req.values[layer, :, s])
            chunks = {r: selections.chunks(r, next_step[r], layer) for r in running}
            n_it = max(len(c) for c in chunks.values())
            att = pcie = 0
            for it in range(n_it):
                acc = kv_pool.access(layer, [(r, h, j) for r in running if it < len(chunks[r])
                                             for h, j in chunks[r][it]])
                att += int(acc.tokens.sum()) * store.bytes_per_token
                pcie += acc.bytes_loaded
                layer_hits[layer] += int(acc.hit.sum())
                layer_accesses[layer] += len(acc.keys)
                blocks += len(acc.keys)
                hits += int(acc.hit.sum())
            seconds += cost.layer_seconds(att, pcie, n_it)
            bytes_attended += att
            bytes_pcie += pcie
            iterations += n_it
        records.append(StepRecord(batch=len(running), blocks=blocks, hits=hits, misses=blocks - hits,
                                  bytes_attended=bytes_attended, bytes_pcie=bytes_pcie, iterations=iterations,
                                  seconds=seconds, live_blocks=store.total_blocks()))
        for r in running:
            next_step[r] += 1
            if next_step[r] == workload.requests[r].num_steps:
                ctl.finish(r)
                store.remove(r)  # the pool frees its slots
    return Replay(pool=pool, policy=policy, num_slots=num_slots, records=records, stats=kv_pool.stats,
                  layer_hits=layer_hits, layer_accesses=layer_accesses, admitted=list(ctl.admitted))


# --- 4. the sweep behind `psa sim` --------------------------------------------------------------


@dataclass
class SimRow:
    """Unified and per-layer pools of one size, for one workload and method."""

    workload: str
    method: str
    k: int | None
    fraction: float  # pool size as a share of the peak live KV cache
    num_slots: int
    unified: Replay
    per_layer: Replay


@dataclass
class SimResult:
    rows: list[SimRow]
    selections: dict[tuple[str, str], Selections]  # (workload, method) -> selections
    workloads: dict[str, Workload]
    peak_blocks: dict[str, int]  # workload -> peak live blocks (the 100% of the pool sizes)
    seconds: float
    meta: dict = field(default_factory=dict)


def pool_slots(fraction: float, peak_blocks: int, num_layers: int, min_per_layer: int) -> int:
    """``fraction`` of ``peak_blocks``, rounded to a multiple of ``num_layers`` (so both pools
    get the same slots) and at least ``min_per_layer`` per layer."""
    per_layer = max(min_per_layer, int(round(fraction * peak_blocks / num_layers)))
    return per_layer * num_layers


def run_sim(workloads: list[Workload] | None = None, *, fractions=FRACTIONS, threshold: float = 0.95,
            stop: str = DEFAULT_STOP, step: int = 1, policy: str = "lru", max_batch: int | None = 4,
            cost: CostModel | None = None, progress: bool = True) -> SimResult:
    """Sweep pool sizes for PSA and top-k (at PSA's mean budget), unified against per-layer.

    ``workloads`` defaults to the shipped trace and [`synthetic_workload`][psa_ref.kvcache.sim.synthetic_workload]. Pool
    sizes are ``fractions`` of the peak live KV cache of each workload, measured by a replay
    through a pool that holds everything.
    """
    from tqdm.auto import tqdm

    start = time.perf_counter()
    workloads = workloads if workloads is not None else [trace_workload(), synthetic_workload()]
    cost = cost or CostModel()
    rows, selections, peaks = [], {}, {}
    for wl in workloads:
        psa = select(wl, "psa", threshold=threshold, stop=stop, step=step, progress=progress)
        k = max(1, int(round(psa.mean_blocks())))
        selections[wl.name, "psa"] = psa
        selections[wl.name, "topk"] = select(wl, "topk", k=k, step=step, progress=progress)
        everything = pool_slots(1.0, wl.final_blocks(), wl.num_layers, 1)
        peaks[wl.name] = replay(wl, psa, num_slots=everything, max_batch=max_batch, cost=cost).peak_live_blocks
        jobs = [(m, f) for m in METHODS for f in fractions]
        for method, frac in tqdm(jobs, desc=f"replay {wl.name}", disable=not progress, leave=False):
            sel = selections[wl.name, method]
            slots = pool_slots(frac, peaks[wl.name], wl.num_layers, wl.num_kv_heads * step)
            uni, per = (replay(wl, sel, pool=kind, num_slots=slots, policy=policy, max_batch=max_batch, cost=cost)
                        for kind in POOL_KINDS)
            rows.append(SimRow(wl.name, method, sel.k, frac, slots, uni, per))
    return SimResult(rows=rows, selections=selections, workloads={w.name: w for w in workloads}, peak_blocks=peaks,
                     seconds=time.perf_counter() - start,
                     meta={"threshold": threshold, "step": step, "policy": policy, "max_batch": max_batch,
                           "cost": cost.__dict__})


def format_table(result: SimResult) -> str:
    """The sweep as Markdown: hit rate, PCIe traffic and modelled step time, unified vs per-layer."""
    lines = ["| workload | method | pool (% of KV) | slots | hit rate unified | hit rate per-layer "
             "| PCIe MB/step unified | PCIe MB/step per-layer | step µs unified | step µs per-layer |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in result.rows:
        method = "psa" if r.method == "psa" else f"top-{r.k}"
        lines.append(f"| {r.workload} | {method} | {100 * r.fraction:.0f}% | {r.num_slots} | "
                     f"{r.unified.hit_rate:.3f} | {r.per_layer.hit_rate:.3f} | "
                     f"{r.unified.pcie_bytes_per_step / 1e6:.3f} | {r.per_layer.pcie_bytes_per_step / 1e6:.3f} | "
                     f"{1e6 * r.unified.seconds_per_step:.1f} | {1e6 * r.per_layer.seconds_per_step:.1f} |")
    return "\n".join(lines)


def format_layers(result: SimResult, workload: str = "trace", fraction: float = 0.25) -> str:
    """Per-layer budgets of PSA (the paper's Observation 2) and per-layer hit rates at one pool size."""
    sel = result.selections[workload, "psa"]
    wl = result.workloads[workload]
    row = next(r for r in result.rows if r.workload == workload and r.method == "psa" and r.fraction == fraction)
    per_layer = sel.per_layer()
    total = sum(int(n.sum()) for n in per_layer)
    pct = f"{100 * fraction:.0f}%"
    lines = [f"| layer | PSA blocks per KV head: mean | p10 | p90 | share of all reads | hit rate unified @ {pct} "
             f"| hit rate per-layer @ {pct} |", "|---|---|---|---|---|---|---|"]
    for layer, n in enumerate(per_layer):
        uni = row.unified.layer_hits[layer] / row.unified.layer_accesses[layer]
        per = row.per_layer.layer_hits[layer] / row.per_layer.layer_accesses[layer]
        lines.append(f"| {wl.layer_names[layer]} | {n.mean():.1f} | {np.percentile(n, 10):.0f} | "
                     f"{np.percentile(n, 90):.0f} | {100 * n.sum() / total:.1f}% | {uni:.3f} | {per:.3f} |")
    return "\n".join(lines)


def plot(result: SimResult, out_dir: Path) -> list[Path]:
    """Write ``psa_sim_pools.png`` and ``psa_sim_layers.png`` into ``out_dir``; return their paths."""
    plt = _plotting.pyplot()

    out_dir.mkdir(parents=True, exist_ok=True)
    names = list(result.workloads)
    fig, axes = plt.subplots(2, len(names), figsize=(5.2 * len(names), 7.0), squeeze=False)
    for col, name in enumerate(names):
        for method, color in zip(METHODS, ("C0", "C1")):
            rows = [r for r in result.rows if r.workload == name and r.method == method]
            x = [100 * r.fraction for r in rows]
            label = "psa" if method == "psa" else f"top-{rows[0].k}"
            for kind, style in (("unified", "-o"), ("per_layer", "--s")):
                axes[0, col].plot(x, [getattr(r, kind).hit_rate for r in rows], style, color=color,
                                  label=f"{label}, {kind.replace('_', '-')}")
                axes[1, col].plot(x, [1e6 * getattr(r, kind).seconds_per_step for r in rows], style, color=color,
                                  label=f"{label}, {kind.replace('_', '-')}")
            # one decode step's blocks: an LRU pool smaller than this sees the same cyclic scan every step
            working_set = np.mean([rec.blocks for rec in rows[0].unified.records]) / result.peak_blocks[name]
            axes[0, col].axvline(100 * working_set, color=color, ls=":", lw=1,
                                 label=f"{label}: blocks of one decode step")
        axes[0, col].set_title(f"{name}: pool hit rate")
        axes[1, col].set_title(f"{name}: modelled decode step")
        axes[0, col].set_ylabel("hit rate")
        axes[1, col].set_ylabel("µs per step")
        for ax in axes[:, col]:
            ax.set_xlabel("pool size (% of the KV cache)")
            ax.set_xticks([100 * f for f in sorted({r.fraction for r in result.rows})])
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
    paths = [_plotting.save(fig, out_dir / "psa_sim_pools.png", dpi=110)]

    name = names[0]
    sel = result.selections[name, "psa"]
    wl = result.workloads[name]
    per_layer = sel.per_layer()
    fracs = sorted({r.fraction for r in result.rows if r.workload == name})
    frac = fracs[len(fracs) // 2]
    row = next(r for r in result.rows if r.workload == name and r.method == "psa" and r.fraction == frac)
    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(10.4, 3.8))
    ax0.boxplot(per_layer, whis=(10, 90), showfliers=False)
    ax0.set_xticks(range(1, len(per_layer) + 1), wl.layer_names)
    k = result.selections[name, "topk"].k
    ax0.axhline(k, color="C1", ls="--", label=f"top-k at PSA's mean budget (k = {k})")
    ax0.set_xlabel("layer")
    ax0.set_ylabel(f"blocks read per KV head (of {sel.num_blocks[0][-1]})")
    ax0.set_title(f"{name}: PSA budget per layer (τ = {result.meta.get('threshold')})")
    ax0.legend(fontsize=8)
    x = np.arange(len(per_layer))
    for off, kind in ((-0.2, "unified"), (0.2, "per_layer")):
        rep = getattr(row, kind)
        ax1.bar(x + off, rep.layer_hits / rep.layer_accesses, width=0.4, label=kind.replace("_", "-"))
    ax1.set_xticks(x, wl.layer_names)
    ax1.set_xlabel("layer")
    ax1.set_ylabel("hit rate")
    ax1.set_title(f"{name}: PSA hit rate per layer, pool {100 * frac:.0f}% of the KV cache")
    ax1.legend(fontsize=8)
    paths.append(_plotting.save(fig, out_dir / "psa_sim_layers.png", dpi=110))
    return paths


def main(out_dir: str = ".", trace_path: str | None = None, plots: bool = True, progress: bool = True,
         threshold: float = 0.95, step: int = 1, policy: str = "lru", synthetic: bool = True,
         stop: str = DEFAULT_STOP) -> SimResult:
    """Run the sweep on the trace (and the synthetic workload), print the tables, write the figures."""
    workloads = [trace_workload(load_trace(trace_path))]
    if synthetic:
        workloads.append(synthetic_workload())
    result = run_sim(workloads, threshold=threshold, stop=stop, step=step, policy=policy, progress=progress)
    cost = CostModel(**result.meta["cost"])
    print(f"PSA τ = {threshold} (stop '{resolve_stop(stop, 'cuboid_mean')}', GQA shared) vs top-k at PSA's mean "
          f"budget; {policy.upper()} pools; {step} block(s) per KV head per iteration; at most "
          f"{result.meta['max_batch']} requests per batch")
    for wl in workloads:
        r0 = wl.requests[0]
        print(f"  {wl.name}: {len(wl.requests)} request(s), {wl.num_layers} layers, {r0.queries.shape[2]} query / "
              f"{wl.num_kv_heads} KV heads, D {wl.head_dim}, blocks of {wl.block_size} "
              f"({2 * wl.block_size * wl.head_dim * wl.dtype.itemsize} B per slot), "
              f"peak KV cache {result.peak_blocks[wl.name]} blocks")
    print(f"Step time model: sum over layers of max(bytes attended / {cost.hbm_bytes_per_s / 1e9:g} GB/s, "
          f"bytes missed / {cost.pcie_bytes_per_s / 1e9:g} GB/s) + {1e6 * cost.iteration_overhead_s:g} µs "
          f"per iteration")
    print()
    print(format_table(result))
    print()
    print("Per-layer budgets on the trace (Observation 2) and where the hits go:")
    print(format_layers(result))
    out = Path(out_dir)
    if plots:
        for p in plot(result, out):
            print(f"wrote {p}")
    out.mkdir(parents=True, exist_ok=True)
    summary = out / "psa_sim.json"
    summary.write_text(json.dumps({
        "meta": result.meta, "peak_blocks": result.peak_blocks, "seconds": result.seconds,
        "rows": [{"workload": r.workload, "method": r.method, "k": r.k, "fraction": r.fraction,
                  "num_slots": r.num_slots,
                  **{f"{kind}_{q}": v for kind in POOL_KINDS
                     for q, v in (("hit_rate", getattr(r, kind).hit_rate),
                                  ("pcie_bytes_per_step", getattr(r, kind).pcie_bytes_per_step),
                                  ("seconds_per_step", getattr(r, kind).seconds_per_step))}}
                 for r in result.rows]}, indent=1))
    print(f"wrote {summary}  ({result.seconds:.1f} s)")
    return result

