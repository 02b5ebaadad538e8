"""Hypothesis strategies for PSA problems with awkward shapes (needs ``hypothesis``,
installed by the ``test`` extra).

Shapes are drawn on purpose where kernels break: ``T`` not a multiple of ``S``, ``T < S``,
a single block, odd ``D``, GQA groups of 1, 3, 4 and 8, ties in the estimates, attention
sinks, and logit spreads from flat to extremely peaked.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from hypothesis import strategies as st

from . import random_problem


@dataclass
class Problem:
    """One drawn decode problem: arrays plus the options of a sparse attention call."""

    q: np.ndarray  # [Hq, D]
    keys: np.ndarray  # [Hkv, T, D]
    values: np.ndarray
    block_size: int
    metadata: str
    gqa: str
    sink_blocks: int
    recent_blocks: int

    @property
    def num_blocks(self) -> int:
        return -(-self.keys.shape[1] // self.block_size)


PORTABLE_METADATA = ("cuboid_mean", "minmax", "mean")  # the kinds every backend implements (host stores: no quant3)


@st.composite
def problems(draw, *, max_tokens: int = 70, max_dim: int = 12, groups=(1, 3, 4, 8), dtypes=("float64",),
             max_forced: int = 2, metadata=PORTABLE_METADATA) -> Problem:
    """Draw a ``Problem`` (multi-head layout; take ``q[0]``, ``keys[0]`` for one head).

    ``metadata``: the kinds to draw from (default: those every backend implements); pass
    ``psa_ref.METADATA_KINDS`` for all of them.
    """
    hkv = draw(st.integers(1, 2))
    g = draw(st.sampled_from(groups))
    block_size = draw(st.integers(1, 9))
    shape_kind = draw(st.sampled_from(["any", "one_block", "short", "multiple"]))
    if shape_kind == "one_block":
        t = draw(st.integers(1, block_size))
    elif shape_kind == "short":
        t = draw(st.integers(1, 2 * block_size))
    elif shape_kind == "multiple":
        t = block_size * draw(st.integers(1, max(1, max_tokens // block_size)))
    else:
        t = draw(st.integers(1, max_tokens))
    d = draw(st.integers(1, max_dim))
    q, k, v = random_problem(
        np.random.default_rng(draw(st.integers(0, 2**32 - 1))),
        num_q_heads=hkv * g, num_kv_heads=hkv, num_tokens=t, head_dim=d,
        logit_scale=draw(st.sampled_from([0.0, 0.1, 1.0, 3.0, 30.0])),
        sink_strength=draw(st.sampled_from([0.0, 0.0, 4.0])),
        ties=draw(st.booleans()),
        dtype=np.dtype(draw(st.sampled_from(dtypes))),
    )
    return Problem(
        q=q, keys=k, values=v, block_size=block_size,
        metadata=draw(st.sampled_from(metadata)),
        gqa=draw(st.sampled_from(["shared", "per_head"])),
        sink_blocks=draw(st.integers(0, max_forced)),
        recent_blocks=draw(st.integers(0, max_forced)),
    )


thresholds = st.one_of(st.sampled_from([0.5, 0.8, 0.9, 0.95, 0.99, 1.0]), st.floats(0.01, 1.0))
