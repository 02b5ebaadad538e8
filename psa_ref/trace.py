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

    def select(self, layers=None, positions=None) -> "Trace":
        """A smaller trace: the layers and query positions at these indices (into ``layers`` and
        ``positions``; None keeps all), keys and values cut to the last selected position's ``p + 1``
        tokens. ``meta["selected"]`` records what was kept.

        Raises:
            ValueError: an index out of range, none selected, or positions not increasing.
        """
        li = np.arange(self.q.shape[0]) if layers is None else np.asarray(layers, dtype=np.int64).reshape(-1)
        pi = np.arange(self.q.shape[1]) if positions is None else np.asarray(positions, dtype=np.int64).reshape(-1)
        for name, idx, n in (("layers", li, self.q.shape[0]), ("positions", pi, self.q.shape[1])):
            if idx.size == 0 or idx.min() < 0 or idx.max() >= n:
                raise ValueError(f"{name} must be indices in [0, {n}), at least one; got {idx.tolist()}")
        if np.any(np.diff(pi) <= 0):
            raise ValueError(f"positions must be increasing indices; got {pi.tolist()}")
        t = int(self.positions[pi[-1]]) + 1
        meta = dict(self.meta, selected={"layers": self.layers[li].tolist(), "positions": self.positions[pi].tolist(),
                                         "tokens": t})
        return Trace(q=self.q[li][:, pi], k=self.k[li, :, :t], v=self.v[li, :, :t], layers=self.layers[li],
                     positions=self.positions[pi], tokens=self.tokens[:t], scale=self.scale, meta=meta,
                     o=None if self.o is None else self.o[li][:, pi])


def save_trace(trace: Trace, path: str | Path) -> int:
    """Write ``trace`` as a compressed ``.npz`` that [`load_trace`][psa_ref.trace.load_trace] reads back
    (the format ``examples/capture_trace.py`` writes); returns its size in bytes."""
    arrays = dict(q=trace.q, k=trace.k, v=trace.v, layers=np.asarray(trace.layers, dtype=np.int32),
                  positions=np.asarray(trace.positions, dtype=np.int32),
                  tokens=np.asarray(trace.tokens, dtype=np.int32), scale=np.float64(trace.scale),
                  meta=np.array(json.dumps(trace.meta)))
    if trace.o is not None:
        arrays["o"] = trace.o
    path = Path(path)
    with open(path, "wb") as f:
        np.savez_compressed(f, **arrays)
    return path.stat().st_size


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
