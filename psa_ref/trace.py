"""Real attention traces: q/k/v captured from a model (see ``examples/capture_trace.py``).

The package ships two (``SHIPPED_TRACES``, loaded by name):

* ``"smollm2_pydoc"``, the default: SmolLM2-135M-Instruct on CPython's ``pydoc_data.topics`` text,
  6 layers, 2048 tokens, the queries of the last 32 positions (``SHIPPED_TRACE``);
* ``"gemma3_8k"``: Gemma 3 270M (bfloat16 compute) on CPython's ``logging`` sources, its global
  layer 17 (the one whose BOS sink ``cuboid_mean`` ranks late), 8192 tokens from ``<bos>``, 32 queries
  4 apart before each of 2K, 4K, 6K and 8K, with the model's attention output at each; 7.0 MB.
  The 32K captures of docs/accuracy.md ("Long context") come from the script.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np

SHIPPED_TRACE = "smollm2_pydoc.npz"
SHIPPED_TRACES = {"smollm2_pydoc": SHIPPED_TRACE, "gemma3_8k": "gemma3_stdlib_8k.npz"}


@dataclass(frozen=True)
class Trace:
    """A captured trace. ``L`` layers, ``P`` query positions, ``T`` tokens.

    Attributes:
        q: ``[L, P, Hq, D]`` float16 post-RoPE queries at ``positions`` (float32 where a
            capture's values overflow float16; ``meta["stored_dtype"]`` says which).
        k, v: ``[L, Hkv, T, D]`` float16 post-RoPE keys and values (before the GQA repeat).
        layers: ``[L]`` model layer indices.
        positions: ``[P]`` token positions of the queries, increasing; the query at ``p``
            attends keys ``0..p``.
        tokens: ``[T]`` token ids.
        scale: the model's logit scale.
        meta: provenance (model, text, versions, command, date).
        o: ``[L, P, Hq, D]`` the model's attention output at ``positions``, where the capture
            recorded it (None in the SmolLM2 trace).
    """

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    layers: np.ndarray
    positions: np.ndarray
    tokens: np.ndarray
    scale: float
    meta: dict
    o: np.ndarray | None = None

    def case(self, layer: int, position: int):
        """``(q [Hq, D], keys [Hkv, p+1, D], values [Hkv, p+1, D])`` of one decode step,
        by index into ``layers`` and ``positions``."""
        p = int(self.positions[position])
        return self.q[layer, position], self.k[layer, :, : p + 1], self.v[layer, :, : p + 1]

    @property
    def num_cases(self) -> int:
        return self.q.shape[0] * self.q.shape[1]


def load_trace(path: str | Path | None = None) -> Trace:
    """Load a trace ``.npz``: a file, the name of a shipped one (a key of ``SHIPPED_TRACES``,
    e.g. ``"gemma3_8k"``), or, without ``path``, the default shipped trace (``"smollm2_pydoc"``)."""
    if path is None or (isinstance(path, str) and path in SHIPPED_TRACES and not Path(path).exists()):
        name = SHIPPED_TRACES[path] if path is not None else SHIPPED_TRACE
        with resources.as_file(resources.files("psa_ref") / "data" / name) as p:
            return load_trace(p)
    with np.load(path, allow_pickle=False) as f:
        return Trace(q=f["q"], k=f["k"], v=f["v"], layers=f["layers"], positions=f["positions"], tokens=f["tokens"],
                     scale=float(f["scale"]), meta=json.loads(str(f["meta"])), o=f["o"] if "o" in f.files else None)
