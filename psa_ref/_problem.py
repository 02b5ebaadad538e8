"""Set-up shared by the sparse attention stages: argument checks, GQA groups, packing results."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import _validate
from .blocks import KVBlocks
from .scoring import estimate, forced_blocks, kv_head_of
from .result import AttentionResult

GQA_MODES = ("shared", "per_head")


@dataclass(frozen=True)
class Group:
    """Query heads that share one block order: a KV head's group (``gqa="shared"``) or
    a single query head (``gqa="per_head"``)."""

    kv_head: int
    q_heads: np.ndarray


def make_groups(num_q_heads: int, num_kv_heads: int, gqa: str) -> list[Group]:
    """The selection groups for ``gqa`` in ``("shared", "per_head")``."""
    g = num_q_heads // num_kv_heads
    if gqa == "shared":
        return [Group(kv, np.arange(kv * g, (kv + 1) * g)) for kv in range(num_kv_heads)]
    return [Group(h // g, np.array([h])) for h in range(num_q_heads)]


@dataclass(frozen=True)
class Problem:
    """Checked inputs of one sparse attention call."""

    q: np.ndarray  # [Hq, D] float64
    blocks: KVBlocks
    scale: float
    single: bool  # q was [D]
    groups: list[Group]
    scores: np.ndarray  # [Hq, N] criticality estimates
    forced: np.ndarray  # blocks attended before the ranked ones


def prepare(q, blocks, *, scale, gqa, sink_blocks, recent_blocks, exact_mass=False) -> Problem:
    """Validate the arguments common to every sparse attention call."""
    if not isinstance(blocks, KVBlocks):
        raise TypeError(f"blocks must be a psa_ref.KVBlocks (see KVBlocks.from_dense), got {type(blocks).__name__}")
    _validate.flag(exact_mass, "exact_mass")
    gqa = _validate.choice(gqa, "gqa", GQA_MODES)
    sink_blocks = _validate.integer(sink_blocks, "sink_blocks", minimum=0)
    recent_blocks = _validate.integer(recent_blocks, "recent_blocks", minimum=0)
    qq = _validate.query(q, blocks.head_dim, blocks.num_heads, blocks.single_head)
    s = _validate.scale(scale, blocks.head_dim)
    return Problem(
        q=qq,
        blocks=blocks,
        scale=s,
        single=np.ndim(q) == 1,
        groups=make_groups(qq.shape[0], blocks.num_heads, gqa),
        scores=estimate(qq, blocks, s),
        forced=forced_blocks(blocks.num_blocks, sink_blocks, recent_blocks),
    )


def exact_mass_fraction(q: np.ndarray, blocks, used_per_head: list[np.ndarray], scale: float) -> np.ndarray:
    """``[Hq]``: the share of each query head's softmax mass that lies in its used blocks."""
    kv = kv_head_of(q.shape[0], blocks.num_heads)
    out = np.empty(q.shape[0])
    for h in range(q.shape[0]):
        logits = scale * (blocks.keys[kv[h]] @ q[h])
        w = np.exp(logits - logits.max())
        out[h] = w[blocks.token_indices(used_per_head[h])].sum() / w.sum()
    return out


def assemble(p: Problem, out: np.ndarray, used: list[np.ndarray], iterations: list[int], reasons: list[str],
             mass_estimate: np.ndarray, exact_mass: bool) -> AttentionResult:
    """Pack the per-group results of a sparse attention call into an [`AttentionResult`][psa_ref.AttentionResult].

    ``out`` is ``[Hq, D]`` and ``mass_estimate`` ``[Hq]``; the lists have one entry per group.
    """
    used_per_head: list[np.ndarray] = [np.zeros(0, np.int64)] * p.q.shape[0]
    for grp, u in zip(p.groups, used):
        for h in grp.q_heads:
            used_per_head[h] = u
    exact = exact_mass_fraction(p.q, p.blocks, used_per_head, p.scale) if exact_mass else None
    if p.single:
        return AttentionResult(out[0], used[0], int(iterations[0]), reasons[0], float(mass_estimate[0]),
                               None if exact is None else float(exact[0]), p.blocks.num_blocks)
    return AttentionResult(out, list(used), np.asarray(iterations, dtype=np.int64), list(reasons),
                           np.asarray(mass_estimate, dtype=np.float64), exact, p.blocks.num_blocks)
