"""Real attention traces: q/k/v captured from a model (see ``examples/capture_trace.py``).

The package ships one: SmolLM2-135M-Instruct on CPython's ``pydoc_data.topics`` text,
6 layers, 2048 tokens, the queries of the last 32 positions (``SHIPPED_TRACE``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np

SHIPPED_TRACE = "smollm2_pydoc.npz"


@dataclass(frozen=True)
class Trace:
    """A captured trace. ``L`` layers, ``P`` query positions, ``T`` tokens.

    Attributes:
        q: ``[L, P, Hq, D]`` float16 post-RoPE queries at ``positions``.
        k, v: ``[L, Hkv, T, D]`` float16 post-RoPE keys and values (before the GQA repeat).
        layers: ``[L]`` model layer indices.
        positions: ``[P]`` token positions of the queries; the query at ``p`` attends
            keys ``0..p``.
        tokens: ``[T]`` token ids.
        scale: the model's logit scale.
        meta: provenance (model, text, versions, command, date).
    """

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    layers: np.ndarray
    positions: np.ndarray
    tokens: np.ndarray
    scale: float
    meta: dict

    def case(self, layer: int, position: int):
        """``(q [Hq, D], keys [Hkv, p+1, D], values [Hkv, p+1, D])`` of one decode step,
        by index into ``layers`` and ``positions``."""
        p = int(self.positions[position])
        return self.q[layer, position], self.k[layer, :, : p + 1], self.v[layer, :, : p + 1]

    @property
    def num_cases(self) -> int:
        return self.q.shape[0] * self.q.shape[1]


def load_trace(path: str | Path | None = None) -> Trace:
    """Load a trace ``.npz``; without ``path``, the one shipped with the package."""
    if path is None:
        with resources.as_file(resources.files("psa_ref") / "data" / SHIPPED_TRACE) as p:
            return load_trace(p)
    with np.load(path, allow_pickle=False) as f:
        return Trace(q=f["q"], k=f["k"], v=f["v"], layers=f["layers"], positions=f["positions"], tokens=f["tokens"],
                     scale=float(f["scale"]), meta=json.loads(str(f["meta"])))
