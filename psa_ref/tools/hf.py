"""transformers integration: ``attn_implementation="psa"`` (transformers >= 5).

Prefill (several query tokens) runs stock dense SDPA. Every decode step (one query token)
runs Progressive Sparse Attention per layer, per sequence of the batch and per head, over
the layer's whole KV cache, with block metadata kept per layer and updated incrementally
as tokens append (only the last, partial block is recomputed). What each decode step
attended is recorded per layer and head for analysis::

    import psa_ref.tools.hf as psa_hf
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    session = psa_hf.enable(model, psa_hf.PSAConfig(threshold=0.95))   # switches to "psa"
    out = model.generate(ids, max_new_tokens=32)
    session.summary()            # blocks and KV bytes attended per decode token, per layer

or register the name first and pass it at load time (``psa_hf.register()`` then
``from_pretrained(..., attn_implementation="psa")``; configure with [`enable`][psa_ref.tools.hf.enable]).

Backends: ``"ref"`` calls [`psa_ref.attention`][psa_ref.attention] (the readable loop, the oracle);
``"sweep"`` calls [`psa_ref.sweep.attention`][psa_ref.sweep.attention], the same result from all logits at once
(faster in Python, used by ``psa eval``). The GPU backend ``"fast"`` belongs to ``psa_fast.hf``, which
registers it here (``psa_fast.hf.enable(model, config)``); this module never imports ``psa_fast``.
Needs ``torch`` and ``transformers`` (the ``hf`` extra); ``psa_ref`` itself does not.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from transformers import AttentionInterface, AttentionMaskInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import sdpa_mask

from .. import _validate
from .. import sweep as _sweep
from ..analysis import blocks_for_mass
from ..blocks import METADATA_KINDS, KVBlocks, block_metadata, quantize
from ..progressive import DEFAULT_STOP, check_first_chunk, resolve_stop
from ..progressive import attention as _ref_attention
from ..scoring import RANKS
from ..topk import topk_attention

ATTN_IMPLEMENTATION = "psa"
BACKENDS = ("ref", "sweep", "fast")  # "fast" is registered by psa_fast.hf (see register_backend)
_DECODERS: dict = {}  # backend name -> decode function(session, layer, q [Hq, D], key, value, scaling) -> [Hq, D]
IDEAL_TAUS = (0.9, 0.95, 0.99)  # thresholds of the ideal budgets recorded with ``record_ideal``


@dataclass(frozen=True)
class PSAConfig:
    """How decode attention runs. Every field is checked on construction.

    Attributes:
        threshold: ``tau`` in (0, 1]; 1 attends every block (dense).
        stop: ``"auto"`` (default: ``"sketch_avg"`` with ``quant3`` metadata, ``"ema"`` with the
            others; see [`resolve_stop`][psa_ref.progressive.resolve_stop]) or a rule of ``psa_ref.STOP_RULES``.
        block_size: ``S`` tokens per KV block.
        metadata: ranking metadata, one of ``psa_ref.METADATA_KINDS`` (default ``"quant3"``: on real
            long-context attention only its per-token sketch ranks the blocks near the ideal order;
            ``KVBlocks.from_dense`` keeps ``"cuboid_mean"`` as its default, see docs/accuracy.md).
        step: blocks per iteration of the loop (default 1, the reference's). ``"auto"``: the GPU plan's
            step ([`psa_fast.DecodePlan`][psa_fast.DecodePlan]: a cost model of the loop sizes it; it
            decides how many blocks are read past the stop), for ``backend="fast"`` only. On the GPU an
            integer step of 1 makes the loop iterate once a block: ``psa_fast.hf.enable`` warns about it.
        gqa: ``"shared"`` (one selection per KV head) or ``"per_head"``.
        first_chunk: the first ranked iteration's size, as for [`psa_ref.attention`][psa_ref.attention]: None
            (default: ``step``), an integer, ``"predicted"`` (the prefix the estimates say holds ``threshold``;
            with the default rule its suffix sums are computed anyway, so on the GPU it costs one small launch) or
            ``"estimated_stop"`` (``stop`` "ema" or "remaining"; on the GPU one more small launch,
            ``psa_estimated_stop``).
        rank: how a shared selection ranks its blocks: ``"estimate"`` (default) or ``"share"``
            (see [`psa_ref.attention`][psa_ref.attention]; every backend runs both).
        sink_blocks: first blocks attended before the ranked ones (default 1: real models
            park much of their attention on the first token, and metadata ranks it late).
        recent_blocks: newest blocks attended likewise (default 1).
        topk: when set, attend the ``topk`` highest-estimate blocks instead (the
            fixed-budget baseline; ``threshold``, ``stop`` and ``step`` are then unused).
        backend: ``"ref"``, ``"sweep"`` or ``"fast"`` (see the module doc).
        record: keep per-layer/head budgets of every decode step in the session.
        record_ideal: also record the ideal budgets (fewest blocks holding 0.9/0.95/0.99
            of each head's mass); needs every logit, for analysis only.
        layers: which layers run PSA at decode: ``"global"`` (default: every layer without a
            sliding window; Gemma 3's 1 in 6), ``"all"`` (a sliding-window layer then raises), or a
            tuple of layer indices. The other layers keep stock SDPA with their own mask and window.
    """

    threshold: float = 0.95
    stop: str = DEFAULT_STOP
    block_size: int = 16
    metadata: str = "quant3"
    step: int | str = 1
    gqa: str = "shared"
    first_chunk: int | str | None = None
    rank: str = "estimate"
    sink_blocks: int = 1
    recent_blocks: int = 1
    topk: int | None = None
    backend: str = "ref"
    record: bool = True
    record_ideal: bool = False
    layers: str | tuple = "global"

    def __post_init__(self):
        _validate.threshold(self.threshold)
        stop = resolve_stop(self.stop, self.metadata)
        _validate.integer(self.block_size, "block_size", minimum=1)
        _validate.choice(self.metadata, "metadata", METADATA_KINDS)
        _validate.integer_or_auto(self.step, "step", minimum=1)
        _validate.choice(self.gqa, "gqa", ("shared", "per_head"))
        check_first_chunk(self.first_chunk, stop)
        _validate.choice(self.rank, "rank", RANKS)
        _validate.integer(self.sink_blocks, "sink_blocks", minimum=0)
        _validate.integer(self.recent_blocks, "recent_blocks", minimum=0)
        if self.topk is not None:
            _validate.integer(self.topk, "topk", minimum=max(1, self.sink_blocks + self.recent_blocks))
        _validate.choice(self.backend, "backend", BACKENDS)
        for name in ("record", "record_ideal"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool, got {type(getattr(self, name)).__name__}")
        if isinstance(self.layers, str):
            _validate.choice(self.layers, "layers", ("global", "all"))
        elif isinstance(self.layers, (tuple, list)) and all(isinstance(i, int) and i >= 0 for i in self.layers):
            object.__setattr__(self, "layers", tuple(self.layers))
        else:
            raise TypeError(f"layers must be 'global', 'all' or a tuple of layer indices >= 0, got {self.layers!r}")

    def runs_psa(self, layer: int, sliding: bool) -> bool:
        """Whether decode attention of layer ``layer`` (``sliding``: it has a sliding window) runs PSA."""
        if self.layers == "global":
            return not sliding
        return self.layers == "all" or layer in self.layers

    @property
    def label(self) -> str:
        """A short name for tables: ``"ema τ=0.95"`` or ``"top-64"``."""
        if self.topk is not None:
            return f"top-{self.topk}"
        if self.threshold >= 1.0:
            return "dense (psa τ=1)"
        return f"{resolve_stop(self.stop, self.metadata)} τ={self.threshold:g}"


# --- KV blocks of one layer, kept in step with the model's cache ---------------------------------


def metadata_all(keys: np.ndarray, block_size: int, kind: str) -> dict[str, np.ndarray]:
    """Metadata of every block of ``keys [Hkv, T, D]`` at once: name -> ``[Hkv, N, D]``.

    The formulas of [`psa_ref.blocks.block_metadata`][psa_ref.blocks.block_metadata], vectorised over full blocks; the
    partial last block goes through [`block_metadata`][psa_ref.blocks.block_metadata] itself.
    """
    hkv, t, d = keys.shape
    full = t // block_size
    kb = keys[:, : full * block_size].reshape(hkv, full, block_size, d)
    lo, hi = kb.min(axis=2), kb.max(axis=2)
    meta = {"lo": lo, "hi": hi}
    if kind == "cuboid_mean":
        meta["center"] = (hi + lo) / 2.0
        meta["radius"] = np.abs(kb - meta["center"][:, :, None]).mean(axis=2)
    elif kind == "mean":
        meta["mean"] = kb.mean(axis=2)
    elif kind == "quant3":
        meta["codes"] = quantize(kb, lo, hi)  # [Hkv, N, S, D] uint8
    if full * block_size < t:
        last = [block_metadata(keys[h, full * block_size :], kind, block_size=block_size) for h in range(hkv)]
        meta = {name: np.concatenate([arr, np.stack([m[name] for m in last])[:, None]], axis=1)
                for name, arr in meta.items()}
    return meta


class LayerBlocks:
    """One sequence's KV cache of one layer as float64 blocks with metadata, grown in place.

    ``sync`` brings it in line with the model's cache: when the cache only grew, the new
    tokens are copied and the metadata of the blocks they touch recomputed (O(S D) per token
    and head); otherwise (a new sequence, a cropped cache) everything is rebuilt.
    """

    def __init__(self, block_size: int, metadata: str):
        self.block_size, self.metadata = block_size, metadata
        self.num_tokens = 0
        self.keys = self.values = None  # [Hkv, capacity, D] float64
        self.meta: dict[str, np.ndarray] = {}  # name -> [Hkv, capacity_blocks, D]

    def _reserve(self, hkv: int, t: int, d: int) -> None:
        if self.keys is not None and self.keys.shape[1] >= t and self.keys.shape[0] == hkv and self.keys.shape[2] == d:
            return
        cap = max(2 * t, 64)
        cap_blocks = -(-cap // self.block_size)
        keys, values = np.zeros((hkv, cap, d)), np.zeros((hkv, cap, d))
        meta = {name: np.zeros((hkv, cap_blocks) + arr.shape, dtype=arr.dtype)
                for name, arr in block_metadata(np.zeros((1, d)), self.metadata, block_size=self.block_size).items()}
        if self.keys is not None and self.keys.shape[0] == hkv and self.keys.shape[2] == d:
            keys[:, : self.num_tokens], values[:, : self.num_tokens] = (self.keys[:, : self.num_tokens],
                                                                        self.values[:, : self.num_tokens])
            n = -(-self.num_tokens // self.block_size)
            for name in meta:
                meta[name][:, :n] = self.meta[name][:, :n]
        else:
            self.num_tokens = 0
        self.keys, self.values, self.meta = keys, values, meta

    def sync(self, key: torch.Tensor, value: torch.Tensor) -> KVBlocks:
        """Update from the layer's cache ``key, value [Hkv, T, D]`` (one sequence); return its blocks."""
        hkv, t, d = key.shape
        s, old = self.block_size, self.num_tokens
        grew = (self.keys is not None and 0 < old <= t and self.keys.shape[0] == hkv and self.keys.shape[2] == d
                and np.array_equal(self.keys[:, old - 1], key[:, old - 1].double().cpu().numpy()))
        self._reserve(hkv, t, d)
        if grew and self.num_tokens == old:
            self.keys[:, old:t] = key[:, old:].double().cpu().numpy()
            self.values[:, old:t] = value[:, old:].double().cpu().numpy()
            for j in range(old // s, -(-t // s)):
                for h in range(hkv):
                    for name, arr in block_metadata(self.keys[h, j * s : min((j + 1) * s, t)], self.metadata,
                                                    block_size=s).items():
                        self.meta[name][h, j] = arr
        else:
            self.keys[:, :t] = key.double().cpu().numpy()
            self.values[:, :t] = value.double().cpu().numpy()
            for name, arr in metadata_all(self.keys[:, :t], s, self.metadata).items():
                self.meta[name][:, : arr.shape[1]] = arr
        self.num_tokens = t
        n = -(-t // s)
        return KVBlocks(keys=self.keys[:, :t], values=self.values[:, :t], block_size=s, metadata=self.metadata,
                        meta={name: arr[:, :n] for name, arr in self.meta.items()}, single_head=False)


# --- what the decode steps attended ----------------------------------------------------------------


@dataclass
class StepRecord:
    """One decode step of one layer and one sequence.

    Attributes:
        layer: the model layer.
        num_tokens: ``T``, the KV length attended over.
        num_blocks: ``N``.
        head_blocks: ``[Hq]`` blocks attended by each query head.
        kv_tokens: ``[Hkv]`` distinct KV tokens read per KV head (union over its query heads).
        kv_blocks: ``[Hkv]`` distinct KV blocks read per KV head.
        ideal: ``tau -> [Hq]`` fewest blocks holding ``tau`` of each head's mass
            (``record_ideal`` only).
    """

    layer: int
    num_tokens: int
    num_blocks: int
    head_blocks: np.ndarray
    kv_tokens: np.ndarray
    kv_blocks: np.ndarray
    ideal: dict = field(default_factory=dict)


@dataclass
class PSASession:
    """The configuration of one model's ``"psa"`` attention and what its decode steps attended."""

    config: PSAConfig
    records: list[StepRecord] = field(default_factory=list)
    layers: dict = field(default_factory=dict)  # (layer, batch index) -> LayerBlocks
    _head_dim: int = 0  # D, learnt from the first record
    # A package that runs a whole batch's step itself (psa_fast.hf) sets this to its attention function;
    # it is called with psa_attention_forward's arguments for every layer, prefill included.
    forward_hook: object = None
    cache: object = None  # psa_fast.hf.PagedCache: the paged cache the hook decodes on

    def reset(self) -> None:
        """Forget the records and the cached blocks (the next decode step rebuilds them)."""
        self.records.clear()
        self.layers.clear()

    def summary(self, *, bytes_per_element: int = 2) -> dict:
        """Aggregate the records: per layer, mean blocks per query head and KV bytes per decode step.

        ``bytes_per_element`` is the KV cache's element size (2 for float16). Returns
        ``{"layers": {layer: {...}}, "kv_bytes_per_token", "dense_kv_bytes_per_token",
        "blocks_per_head", "kv_blocks_per_token", "steps"}``; bytes count keys and values, and a
        KV block read by several query heads of a group counts once. With ``record_ideal`` a layer's
        ``"ideal"`` is ``tau ->`` the mean ideal budget of a query head, and ``"ideal_busiest"`` that of the
        busiest query head of each KV group (what a shared selection must read at least).
        """
        if not self.records:
            return {"layers": {}, "kv_bytes_per_token": 0.0, "dense_kv_bytes_per_token": 0.0, "blocks_per_head": 0.0,
                    "kv_blocks_per_token": 0.0, "steps": 0}
        d = self._head_dim
        per_layer: dict[int, list[StepRecord]] = {}
        for r in self.records:
            per_layer.setdefault(r.layer, []).append(r)
        steps = len(per_layer[next(iter(per_layer))])
        layers = {}
        for layer, recs in sorted(per_layer.items()):
            layers[layer] = {
                "blocks_per_head": float(np.mean([r.head_blocks.mean() for r in recs])),
                "blocks_per_head_by_head": np.mean([r.head_blocks for r in recs], axis=0).tolist(),
                "share_of_blocks": float(np.mean([r.head_blocks.mean() / r.num_blocks for r in recs])),
                "kv_tokens": float(np.mean([r.kv_tokens.sum() for r in recs])),
                "kv_blocks": float(np.mean([r.kv_blocks.sum() for r in recs])),
                "ideal": {t: float(np.mean([r.ideal[t].mean() for r in recs])) for t in recs[0].ideal},
                # the busiest query head of each KV group: a shared selection reads at least its ideal set
                "ideal_busiest": {t: float(np.mean([np.asarray(r.ideal[t]).reshape(r.kv_tokens.size, -1).max(1).mean()
                                                    for r in recs])) for t in recs[0].ideal},
            }
        per_step = 2 * d * bytes_per_element
        return {
            "layers": layers,
            "kv_bytes_per_token": float(sum(v["kv_tokens"] for v in layers.values()) * per_step),
            "dense_kv_bytes_per_token": float(sum(np.mean([r.num_tokens * r.kv_tokens.size for r in recs])
                                                  for recs in per_layer.values()) * per_step),
            "blocks_per_head": float(np.mean([r.head_blocks.mean() for r in self.records])),
            "kv_blocks_per_token": float(sum(v["kv_blocks"] for v in layers.values())),
            "steps": steps,
        }



_SESSION_ATTR = "_psa_session"
_DEFAULT_SESSION: PSASession | None = None


def register() -> None:
    """Register ``"psa"`` with transformers' ``AttentionInterface`` and, for its causal
    mask, ``AttentionMaskInterface`` (the SDPA mask). Idempotent."""
    AttentionInterface.register(ATTN_IMPLEMENTATION, psa_attention_forward)
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, sdpa_mask)


def cache_kwargs(model, cache) -> dict:
    """``{name: cache}`` for ``model(...)``: transformers 5.2x renamed the forward argument
    ``past_key_values`` to ``cache``; this passes whichever the installed version takes."""
    import inspect

    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    return {name: cache}


def attention_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's attention modules: those with a ``layer_idx`` and ``num_key_value_groups``."""
    return [m for m in model.modules() if hasattr(m, "layer_idx") and hasattr(m, "num_key_value_groups")]


def enable(model, config: PSAConfig | None = None) -> PSASession:
    """Switch ``model`` to ``"psa"`` attention with ``config`` (default [`PSAConfig`][psa_ref.tools.hf.PSAConfig]).

    Returns the session that holds the configuration and the records; calling again
    replaces both. Use ``model.set_attn_implementation("sdpa")`` to switch back.
    """
    if config is None:
        config = PSAConfig()
    if not isinstance(config, PSAConfig):
        raise TypeError(f"config must be a psa_ref.tools.hf.PSAConfig, got {type(config).__name__}")
    modules = attention_modules(model)
    if not modules:
        raise ValueError("model has no attention module with layer_idx and num_key_value_groups "
                         "(a transformers decoder using AttentionInterface, such as Llama, is expected)")
    if config.step == "auto" and config.backend != "fast":
        raise ValueError(f"step='auto' is the GPU plan's step (psa_fast.hf.enable); backend={config.backend!r} "
                         "iterates a whole number of blocks: give step an integer")
    if config.backend not in ("ref", "sweep") and config.backend not in _DECODERS:
        raise ValueError(f"backend={config.backend!r} is provided by psa_fast.hf: call psa_fast.hf.enable(model, "
                         "config) on a machine with a CUDA GPU, or use backend='ref' or 'sweep' on the CPU")
    register()
    session = PSASession(config)
    for m in modules:
        setattr(m, _SESSION_ATTR, session)
    model.set_attn_implementation(ATTN_IMPLEMENTATION)
    return session


def _session_of(module) -> PSASession:
    global _DEFAULT_SESSION
    session = getattr(module, _SESSION_ATTR, None)
    if session is None:  # loaded with attn_implementation="psa" but never configured
        if _DEFAULT_SESSION is None:
            _DEFAULT_SESSION = PSASession(PSAConfig())
        session = _DEFAULT_SESSION
    return session


def _decode_ref(session: PSASession, layer: int, b: int, q: torch.Tensor, key, value, scaling: float):
    """One sequence's decode step through ``psa_ref``: ``q [Hq, D]`` -> output ``[Hq, D]`` float64."""
    cfg = session.config
    state = session.layers.setdefault((layer, b), LayerBlocks(cfg.block_size, cfg.metadata))
    blocks = state.sync(key, value)
    q64 = q.double().cpu().numpy()
    common = dict(scale=scaling, gqa=cfg.gqa, sink_blocks=cfg.sink_blocks, recent_blocks=cfg.recent_blocks)
    if cfg.topk is not None:
        res = topk_attention(q64, blocks, cfg.topk, **common)
    else:
        fn = _ref_attention if cfg.backend == "ref" else _sweep.attention
        res = fn(q64, blocks, cfg.threshold, stop=cfg.stop, step=cfg.step, rank=cfg.rank, first_chunk=cfg.first_chunk,
                 **common)
    if cfg.record:
        _record(session, layer, blocks, q64, res, scaling)
    return res.output


def step_record(layer: int, num_tokens: int, block_size: int, per_head: list[np.ndarray], hkv: int) -> StepRecord:
    """A ``StepRecord`` from the blocks each query head attended."""
    n = -(-num_tokens // block_size)
    lengths = np.full(n, block_size)
    lengths[-1] = num_tokens - (n - 1) * block_size
    g = len(per_head) // hkv
    union = [np.unique(np.concatenate(per_head[kv * g : (kv + 1) * g])) for kv in range(hkv)]
    return StepRecord(layer=layer, num_tokens=num_tokens, num_blocks=n,
                      head_blocks=np.array([u.size for u in per_head]),
                      kv_tokens=np.array([lengths[u].sum() for u in union]),
                      kv_blocks=np.array([u.size for u in union]))


def _record(session: PSASession, layer: int, blocks: KVBlocks, q64: np.ndarray, res, scaling: float) -> None:
    hq, hkv = q64.shape[0], blocks.num_heads
    g = hq // hkv
    per_head = res.blocks_used if session.config.gqa == "per_head" else [res.blocks_used[h // g] for h in range(hq)]
    rec = step_record(layer, blocks.num_tokens, blocks.block_size, per_head, hkv)
    if session.config.record_ideal:
        starts = np.arange(0, blocks.num_tokens, blocks.block_size)
        mass = np.empty((blocks.num_blocks, hq))
        for kv in range(hkv):
            logits = scaling * blocks.keys[kv] @ q64[kv * g : (kv + 1) * g].T  # [T, G]
            mass[:, kv * g : (kv + 1) * g] = np.add.reduceat(np.exp(logits - logits.max(axis=0)), starts, axis=0)
        rec.ideal = {t: blocks_for_mass(mass, t) for t in IDEAL_TAUS}
    session._head_dim = blocks.head_dim
    session.records.append(rec)


def register_backend(name: str, decode) -> None:
    """Make ``PSAConfig(backend=name)`` call ``decode(session, layer, q, key, value, scaling)`` for each
    sequence's decode step (``q [Hq, D]``, ``key, value [Hkv, T, D]`` tensors; returns ``[Hq, D]``).
    ``psa_fast.hf`` registers ``"fast"`` this way, so the reference never imports the GPU package."""
    _validate.choice(name, "name", BACKENDS)
    if name in ("ref", "sweep"):
        raise ValueError(f"backend {name!r} is built in and cannot be replaced")
    if not callable(decode):
        raise TypeError(f"decode must be callable, got {type(decode).__name__}")
    _DECODERS[name] = decode


@torch.compiler.disable  # NumPy, CuPy and host counters inside: opaque to torch.compile (a graph break)
def psa_attention_forward(module, query, key, value, attention_mask, dropout: float = 0.0,
                          scaling: float | None = None, **kwargs):
    """The ``"psa"`` attention function, called by transformers for every attention layer.

    ``torch.compile`` does not trace it: a model compiled around it (e.g. its decoder layers) runs
    this call eagerly between compiled graphs.

    Args:
        query: ``[B, Hq, L, D]`` after RoPE.
        key, value: ``[B, Hkv, T, D]``, the whole cache including this step's tokens.
        attention_mask: the SDPA mask (None, or a boolean ``[B, 1, L, T]``).

    Returns:
        ``(output [B, L, Hq, D], None)``. ``L > 1`` (prefill) is dense SDPA; ``L == 1`` is PSA on the
            layers ``PSAConfig.layers`` names, stock SDPA on the others (sliding windows kept).
    """
    session = _session_of(module)
    if session.forward_hook is not None:
        return session.forward_hook(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                    **kwargs)
    return per_sequence_forward(session, module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                **kwargs)


def per_sequence_forward(session: PSASession, module, query, key, value, attention_mask, dropout: float = 0.0,
                         scaling: float | None = None, **kwargs):
    """[`psa_attention_forward`][psa_ref.tools.hf.psa_attention_forward] without the session's hook: stock SDPA at
    prefill and on the layers that do not run PSA, PSA one sequence at a time on the others."""
    sliding = kwargs.get("sliding_window") is not None
    if query.shape[2] != 1 or not session.config.runs_psa(module.layer_idx, sliding):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    for name in ("sliding_window", "softcap"):
        if kwargs.get(name) is not None:
            raise ValueError(f"psa decode attends the whole cache with plain softmax: {name}={kwargs[name]!r} "
                             "is not supported")
    if attention_mask is not None:
        ok = attention_mask.all() if attention_mask.dtype == torch.bool else (attention_mask == 0).all()
        if not bool(ok):
            raise ValueError("psa decode attends the whole cache of each sequence: padding or a masked key in "
                             "attention_mask is not supported (decode sequences of equal length, without padding)")
    scale = float(scaling if scaling is not None else query.shape[-1] ** -0.5)
    outs = []
    for b in range(query.shape[0]):
        decode = _DECODERS.get(session.config.backend)
        if decode is not None:
            o = decode(session, module.layer_idx, query[b, :, 0], key[b], value[b], scale)
        else:
            o = torch.from_numpy(_decode_ref(session, module.layer_idx, b, query[b, :, 0], key[b], value[b], scale))
        outs.append(o.to(device=query.device, dtype=query.dtype))
    return torch.stack(outs)[:, None], None  # [B, 1, Hq, D]
