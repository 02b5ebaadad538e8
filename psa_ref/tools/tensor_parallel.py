"""Head-parallel (tensor-parallel) decode attention over ``torch.distributed``: the reference decomposition.

Serving engines shard attention by heads. With ``W`` ranks, rank ``r`` owns KV heads
``[r * Hkv / W, (r + 1) * Hkv / W)`` and the query heads that read them (``Hq / W`` contiguous
heads: a GQA group is never split). PSA's estimate, order, loop and verifier are per KV head, so
each rank runs [`psa_ref.attention`][psa_ref.attention] (or top-k / dense) on its own heads with
no traffic between ranks. The output projection ``W_o [Hq * D, d_model]`` is split by rows
(row-parallel): rank ``r`` multiplies its heads' outputs ``[Hq / W * D]`` by its rows of ``W_o``
and one all-reduce (sum) of the ``[d_model]`` partials gives every rank the layer's output::

    y = concat_h(o_h) @ W_o = sum_r concat_{h in rank r}(o_h) @ W_o[rows of r]

Each rank reads only its heads' blocks, and PSA's budgets differ per head, so the busiest rank
(the most blocks read) sets the step time: [`RankBudgets`][psa_ref.tools.tensor_parallel.RankBudgets]
reports it.

The reference math is NumPy in float64 (as everywhere in ``psa_ref``); torch is used for the
collectives only (gloo on CPUs) and imported when a step runs. One process's result
(``world_size = 1``) and ``W`` processes' differ only in the order of the final sum: see
``docs/gpu.md`` ("Several GPUs") for the error budget. [`spawn`][psa_ref.tools.tensor_parallel.spawn]
runs a function on ``W`` local CPU processes joined by gloo (tests, examples). The GPU twin is
``psa_fast.distributed``.
"""

from __future__ import annotations

import numbers
import os
import queue as _queue
import socket
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable

import numpy as np
from numpy.typing import ArrayLike

from .. import _validate
from ..blocks import KVBlocks
from ..dense import dense_attention
from ..progressive import attention
from ..result import AttentionResult
from ..topk import topk_attention

MODES = ("psa", "topk", "dense")


# --- which heads each rank owns (pure arithmetic) ----------------------------------------------------

@dataclass(frozen=True)
class HeadShard:
    """The heads one rank owns, and its rows of the output projection.

    Attributes:
        rank: ``r`` in ``[0, W)``.
        world_size: ``W``.
        kv_heads: KV heads ``[r * Hkv / W, (r + 1) * Hkv / W)``.
        q_heads: query heads ``[r * Hq / W, (r + 1) * Hq / W)``: the ones that read ``kv_heads``.
    """

    rank: int
    world_size: int
    kv_heads: range
    q_heads: range

    def wo_rows(self, head_dim: int) -> slice:
        """Rows of ``W_o [Hq * D, d_model]`` that multiply this rank's heads: ``[q0 * D, q1 * D)``."""
        d = _validate.integer(head_dim, "head_dim", minimum=1)
        return slice(self.q_heads.start * d, self.q_heads.stop * d)

    def take(self, q: Any, keys: Any, values: Any, w_o: Any) -> tuple:
        """This rank's part of one step's full-model inputs (basic slicing: views, any array type).

        Args:
            q: ``[Hq, D]`` (or ``[B, Hq, D]``).
            keys: ``[Hkv, T, D]``.
            values: ``[Hkv, T, D]``.
            w_o: ``[Hq * D, d_model]``.

        Returns:
            ``(q [.., Hq / W, D], keys [Hkv / W, T, D], values [Hkv / W, T, D], w_o [Hq / W * D, d_model])``.
        """
        hq = len(self.q_heads) * self.world_size
        hkv = len(self.kv_heads) * self.world_size
        if len(q.shape) not in (2, 3) or q.shape[-2] != hq:
            raise ValueError(f"q must have shape [Hq={hq}, D] (or [B, Hq, D]), got {tuple(q.shape)}")
        d = q.shape[-1]
        if len(keys.shape) != 3 or keys.shape[0] != hkv or keys.shape[2] != d:
            raise ValueError(f"keys must have shape [Hkv={hkv}, T, D={d}], got {tuple(keys.shape)}")
        if tuple(values.shape) != tuple(keys.shape):
            raise ValueError(f"values must have the shape of keys {tuple(keys.shape)}, got {tuple(values.shape)}")
        if len(w_o.shape) != 2 or w_o.shape[0] != hq * d:
            raise ValueError(f"w_o must have shape [Hq * D = {hq * d}, d_model], got {tuple(w_o.shape)}")
        qs, ks = slice(self.q_heads.start, self.q_heads.stop), slice(self.kv_heads.start, self.kv_heads.stop)
        return q[..., qs, :], keys[ks], values[ks], w_o[self.wo_rows(d)]


def shard_heads(*, num_q_heads: int, num_kv_heads: int, world_size: int) -> list[HeadShard]:
    """Split ``Hkv`` KV heads and their ``Hq`` query heads evenly over ``world_size`` ranks.

    Args:
        num_q_heads: ``Hq``, a multiple of ``Hkv``.
        num_kv_heads: ``Hkv``, a multiple of ``world_size``.
        world_size: ``W >= 1``.

    Returns:
        One [`HeadShard`][psa_ref.tools.tensor_parallel.HeadShard] per rank, in rank order.

    Raises:
        ValueError: ``Hkv % W != 0`` (a rank would hold part of a KV head's group), or
            ``Hq % Hkv != 0``.
    """
    hq = _validate.integer(num_q_heads, "num_q_heads", minimum=1)
    hkv = _validate.integer(num_kv_heads, "num_kv_heads", minimum=1)
    w = _validate.integer(world_size, "world_size", minimum=1)
    if hq % hkv:
        raise ValueError(f"the number of query heads ({hq}) must be a multiple of the number of KV heads ({hkv})")
    if hkv % w:
        raise ValueError(f"{hkv} KV heads do not split evenly over world_size {w}: head parallelism gives each rank "
                         f"whole KV heads (with their query heads), so num_kv_heads ({hkv}) must be a multiple of "
                         f"world_size ({w})")
    kv_per, q_per = hkv // w, hq // w
    return [HeadShard(r, w, range(r * kv_per, (r + 1) * kv_per), range(r * q_per, (r + 1) * q_per))
            for r in range(w)]


# --- budgets per rank ---------------------------------------------------------------------------------

def blocks_read_per_kv_head(num_used: ArrayLike, num_kv_heads: int) -> np.ndarray:
    """Blocks read per KV head from the budgets of the selection groups.

    Args:
        num_used: ``[..., Gn]`` blocks attended per selection group: ``Gn = Hkv`` (``gqa="shared"``:
            one group per KV head, each block read once for the group) or ``Gn = Hq`` (``"per_head"``:
            each query head reads its own blocks, so a KV head's reads are the sum over its heads).
        num_kv_heads: ``Hkv``.

    Returns:
        ``[..., Hkv]`` int64.
    """
    n = np.asarray(num_used, dtype=np.int64)
    hkv = _validate.integer(num_kv_heads, "num_kv_heads", minimum=1)
    if n.ndim == 0 or n.shape[-1] % hkv:
        raise ValueError(f"num_used must be [..., Gn] with Gn a multiple of num_kv_heads ({hkv}), got {n.shape}")
    return n.reshape(n.shape[:-1] + (hkv, n.shape[-1] // hkv)).sum(axis=-1)


@dataclass(frozen=True)
class RankBudgets:
    """Blocks read per KV head on every rank in one decode step (the same on every rank).

    Attributes:
        blocks_read: ``[W, B, Hkv / W]`` int64: blocks read by each rank's KV heads, per request
            (``B = 1`` in the reference).
        num_blocks: ``[B]`` int64: ``N`` of each request.
    """

    blocks_read: np.ndarray
    num_blocks: np.ndarray

    @property
    def world_size(self) -> int:
        return int(self.blocks_read.shape[0])

    @property
    def per_rank(self) -> np.ndarray:
        """``[W]`` int64: blocks each rank reads in the step (its KV bytes, in blocks)."""
        return self.blocks_read.sum(axis=(1, 2))

    @property
    def share(self) -> np.ndarray:
        """``[W]``: each rank's blocks read over its KV heads' blocks (1.0: each block once; above 1 with
        ``gqa="per_head"``, where every query head reads its own)."""
        heads = self.blocks_read.shape[2]
        return self.per_rank / max(1, int(self.num_blocks.sum()) * heads)

    @property
    def busiest(self) -> int:
        """The rank that reads the most blocks (the lowest such rank on ties): it sets the step time of
        a memory-bound step."""
        return int(np.argmax(self.per_rank))

    @property
    def imbalance(self) -> float:
        """``max / mean`` of ``per_rank``: 1.0 when every rank reads as much; the step takes about this
        factor longer than an even split of the same blocks would."""
        mean = float(self.per_rank.mean())
        return float(self.per_rank.max()) / mean if mean > 0 else 1.0

    def table(self) -> str:
        """A short text table: one line per rank, the busiest marked."""
        heads = [" ".join(f"{x:.1f}" for x in self.blocks_read[r].mean(axis=0)) for r in range(self.world_size)]
        title = "blocks read per KV head" + (f" (mean of {self.blocks_read.shape[1]} requests)"
                                             if self.blocks_read.shape[1] > 1 else "")
        width = max(len(title), *(len(h) for h in heads))
        lines = [f"rank  {title:<{width}}  total   share"]
        for r in range(self.world_size):
            mark = "  <- busiest" if r == self.busiest else ""
            lines.append(f"{r:>4}  {heads[r]:<{width}}  {int(self.per_rank[r]):>5}  {100 * self.share[r]:5.1f}%{mark}")
        lines.append(f"imbalance (max / mean blocks per rank): {self.imbalance:.2f}")
        return "\n".join(lines)


# --- one decode step ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class TPStep:
    """One rank's view of a head-parallel decode step.

    Attributes:
        output: ``[d_model]`` float64: the all-reduced output, the same on every rank.
        partial: ``[d_model]`` float64: this rank's term, ``concat(o_h) @ W_o[rows]``.
        attention: ``[Hq / W, D]`` float64: this rank's heads' attention outputs.
        blocks_used: one int64 array per local selection group (KV head, or query head with
            ``gqa="per_head"``), in the order processed; dense: every block.
        result: this rank's [`AttentionResult`][psa_ref.AttentionResult] (None for dense).
        shard: the heads this rank owns, in the model's numbering.
        budgets: every rank's blocks read (gathered after the loop).
    """

    output: np.ndarray
    partial: np.ndarray
    attention: np.ndarray
    blocks_used: list[np.ndarray]
    result: AttentionResult | None
    shard: HeadShard
    budgets: RankBudgets


def require_process_group(group: Any = None) -> Any:
    """``torch.distributed``, once checked to be initialised. Raises ``RuntimeError`` otherwise."""
    try:
        import torch.distributed as dist
    except ImportError as exc:
        raise RuntimeError(f"head-parallel decode needs torch.distributed (pip install torch): {exc}") from None
    if not dist.is_available():
        raise RuntimeError("this torch build has no torch.distributed support")
    if not dist.is_initialized():
        raise RuntimeError("torch.distributed is not initialised: call torch.distributed.init_process_group "
                           "(backend 'gloo' on CPUs, 'nccl' on GPUs) on every rank first, e.g. under torchrun, or "
                           "use psa_ref.tools.tensor_parallel.spawn")
    return dist


def decode_step(q: ArrayLike, blocks: KVBlocks, w_o: ArrayLike, *, mode: str = "psa", group: Any = None,
                **options: Any) -> TPStep:
    """One rank's part of a head-parallel decode step, and the all-reduced output.

    Every rank of ``group`` calls this with its own shard (see
    [`HeadShard.take`][psa_ref.tools.tensor_parallel.HeadShard.take]). The attention runs on the
    rank's heads alone; the ranks then exchange their shapes and budgets (one small all-gather, after
    the loop) and all-reduce the ``[d_model]`` partials (sum, float64). A rank whose inputs fail a
    check does not leave the others waiting: every rank raises (the failing rank its own error, the
    others a ``RuntimeError`` that names it).

    Args:
        q: ``[Hq / W, D]``: this rank's query heads (float16/32/64).
        blocks: this rank's KV heads, a [`psa_ref.KVBlocks`][psa_ref.KVBlocks] of ``[Hkv / W, T, D]``
            keys.
        w_o: ``[Hq / W * D, d_model]`` float16/32/64: this rank's rows of ``W_o``.
        mode: ``"psa"`` ([`psa_ref.attention`][psa_ref.attention]), ``"topk"``
            ([`psa_ref.topk_attention`][psa_ref.topk_attention]) or ``"dense"``
            ([`psa_ref.dense_attention`][psa_ref.dense_attention]).
        group: the ``torch.distributed`` process group (default: the world).
        **options: keyword options of that function (``threshold``, ``stop``, ``step``, ``k``,
            ``gqa``, ``scale``, ``sink_blocks``, ``recent_blocks``, ...), the same on every rank.

    Returns:
        [`TPStep`][psa_ref.tools.tensor_parallel.TPStep].

    Raises:
        RuntimeError: ``torch.distributed`` is not initialised, or another rank's inputs failed.
        TypeError: wrong types or dtypes (``blocks`` not a ``KVBlocks``, integer ``w_o``, ...).
        ValueError: wrong shapes (``q`` not ``[Hq / W, D]``, ``w_o`` rows not ``Hq / W * D``), or
            ranks that disagree (different ``Hkv / W``, ``Hq / W``, ``D``, ``d_model`` or ``N``).
    """
    dist = require_process_group(group)
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    error, header, local = None, None, None
    try:
        local = _local_step(q, blocks, w_o, mode, options)
        header = local["header"]
    except Exception as exc:  # every rank must reach the gather below, or the others would wait for it
        error = exc
    gathered: list = [None] * world
    dist.all_gather_object(gathered, (header, None if error is None else f"{type(error).__name__}: {error}"),
                           group=group)
    if error is not None:
        raise error
    failed = [(r, e) for r, (_, e) in enumerate(gathered) if e is not None]
    if failed:
        r, e = failed[0]
        raise RuntimeError(f"rank {r} of {world} failed its decode step ({e}); no rank reduced its output")
    headers = [h for h, _ in gathered]
    _check_ranks_agree(headers)
    h = headers[0]
    shard = shard_heads(num_q_heads=h["hq"] * world, num_kv_heads=h["hkv"] * world, world_size=world)[rank]

    import torch

    total = torch.from_numpy(local["partial"].copy())
    dist.all_reduce(total, op=dist.ReduceOp.SUM, group=group)
    budgets = RankBudgets(np.array([[hh["blocks_read"]] for hh in headers], dtype=np.int64),
                          np.array([h["n"]], dtype=np.int64))
    return TPStep(output=total.numpy(), partial=local["partial"], attention=local["attention"],
                  blocks_used=local["blocks_used"], result=local["result"], shard=shard, budgets=budgets)


def _local_step(q, blocks, w_o, mode: str, options: dict) -> dict:
    """The rank's own work: checks, attention on its heads, its rows of the projection. No traffic."""
    mode = _validate.choice(mode, "mode", MODES)
    if not isinstance(blocks, KVBlocks):
        raise TypeError(f"blocks must be a psa_ref.KVBlocks of this rank's KV heads, got {type(blocks).__name__}")
    if blocks.single_head:
        raise ValueError("blocks must be built from [Hkv / W, T, D] keys (several-head layout), not [T, D]")
    qq = _validate.float_array(q, "q")
    if qq.ndim != 2:
        raise ValueError(f"q must have shape [Hq / W, D] (this rank's query heads), got {qq.ndim} dimensions "
                         f"{qq.shape}")
    w = _validate.float_array(w_o, "w_o")
    hq, d = qq.shape
    if w.ndim != 2 or w.shape[0] != hq * d or w.shape[1] < 1:
        raise ValueError(f"w_o must have shape [Hq / W * D, d_model] = [{hq} * {d} = {hq * d}, d_model] (this rank's "
                         f"rows of W_o), got {w.shape}")
    if mode == "dense":
        out = dense_attention(qq, blocks.keys, blocks.values, **options)
        used = [np.arange(blocks.num_blocks, dtype=np.int64) for _ in range(blocks.num_heads)]
        result = None
    else:
        result = (attention if mode == "psa" else topk_attention)(qq, blocks, **options)
        out, used = result.output, list(result.blocks_used)
    partial = out.reshape(-1) @ w  # [Hq/W * D] @ [Hq/W * D, d_model]: this rank's rows of the projection
    header = dict(hq=hq, hkv=blocks.num_heads, d=d, d_model=int(w.shape[1]), n=blocks.num_blocks, mode=mode,
                  blocks_read=blocks_read_per_kv_head([u.size for u in used], blocks.num_heads).tolist())
    return dict(header=header, partial=partial, attention=out, blocks_used=used, result=result)


def _check_ranks_agree(headers: list[dict]) -> None:
    """Every rank must hold an equal shard of the same step: the same head counts, ``D``, ``d_model``,
    ``N`` and mode."""
    what = dict(hkv="KV heads (Hkv / W: an even split, see shard_heads)", hq="query heads (Hq / W)",
                d="head dimension D", d_model="d_model (columns of w_o)", n="blocks N (the same request)",
                mode="mode")
    for key, name in what.items():
        values = [h[key] for h in headers]
        if any(v != values[0] for v in values):
            per = ", ".join(f"rank {r}: {v}" for r, v in enumerate(values))
            raise ValueError(f"the ranks disagree on the number of {name}: {per}")
    if headers[0]["hq"] % headers[0]["hkv"]:
        raise ValueError(f"each rank's query heads ({headers[0]['hq']}) must be a multiple of its KV heads "
                         f"({headers[0]['hkv']})")


# --- W local processes joined by gloo (tests, examples) -----------------------------------------------

def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (a socket bound to port 0, then closed)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _entry(rank: int, fn: Callable, world_size: int, port: int, backend: str, timeout_s: float, args: tuple,
           results) -> None:
    """Body of each spawned process: join the group, run ``fn``, send its value back, leave the group."""
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size))
    dist.init_process_group(backend, rank=rank, world_size=world_size, timeout=timedelta(seconds=timeout_s))
    try:
        results.put((rank, fn(rank, world_size, *args)))
    finally:
        dist.destroy_process_group()


def spawn(fn: Callable, world_size: int, *, args: tuple = (), timeout_s: float = 60.0,
          backend: str = "gloo") -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` fresh local processes joined by one
    process group (``MASTER_ADDR=127.0.0.1``, a free port), and return their values in rank order.

    ``fn`` must be importable by name (a module-level function) and its value picklable. The processes
    start with torch's ``spawn`` method. A process that raises ends the run with torch's
    ``ProcessRaisedException`` (the others are terminated); a run that is not done after
    ``timeout_s`` seconds (start-up included) is terminated and raises ``TimeoutError``, so a hung
    collective fails instead of blocking. The group's own timeout is ``timeout_s`` too.
    """
    import torch.multiprocessing as mp

    world_size = _validate.integer(world_size, "world_size", minimum=1)
    if not isinstance(timeout_s, numbers.Real) or not timeout_s > 0:
        raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
    results = mp.get_context("spawn").Queue()
    ctx = mp.start_processes(_entry, args=(fn, world_size, free_port(), backend, float(timeout_s), tuple(args),
                                           results), nprocs=world_size, join=False, start_method="spawn")
    values: dict[int, Any] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while not ctx.join(timeout=0.1):  # raises if a process failed
            _drain(results, values)
            if time.monotonic() > deadline:
                raise TimeoutError(f"spawn: {world_size} processes running {getattr(fn, '__name__', fn)} were not "
                                   f"done after {timeout_s} s (a hung collective?); they were terminated")
        while len(values) < world_size and time.monotonic() < deadline + 5.0:
            _drain(results, values, wait=0.1)
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.terminate()
                p.join(5.0)
                if p.is_alive():
                    p.kill()
    if len(values) < world_size:
        missing = sorted(set(range(world_size)) - set(values))
        raise RuntimeError(f"spawn: ranks {missing} exited without returning a value")
    return [values[r] for r in range(world_size)]


def _drain(results, values: dict, wait: float = 0.0) -> None:
    """Move every ``(rank, value)`` waiting in ``results`` into ``values``."""
    while True:
        try:
            rank, value = results.get(timeout=wait) if wait else results.get_nowait()
        except _queue.Empty:
            return
        values[rank] = value
