"""transformers on the GPU: a paged KV cache with resident metadata, batched PSA decode, captured steps.

``psa_ref.tools.hf`` is the integration's reference (every decode step through the NumPy
reference). This module runs it on the GPU::

    import psa_fast.hf
    from psa_ref.tools.hf import PSAConfig

    session = psa_fast.hf.enable(model, PSAConfig(threshold=0.95, step="auto"))  # a bf16/fp16 model on CUDA
    cache = psa_fast.hf.PagedCache(model, batch=len(prompts), max_tokens=8192)
    out = model.generate(ids, attention_mask=mask, past_key_values=cache, max_new_tokens=64)

How a step runs. The [`PagedCache`][psa_fast.hf.PagedCache] is a transformers ``Cache`` whose PSA layers
(``PSAConfig.layers``: by default every layer without a sliding window) live in one
[`psa_fast.PagedKVCache`][psa_fast.PagedKVCache] in the model's dtype (bfloat16 or float16); the other
layers keep transformers' own cache layers and stock SDPA with their sliding window. At prefill a PSA
layer's attention is stock SDPA over the prompt, then each request's real tokens (padding dropped, as
the attention mask says) are written into blocks and their metadata computed once. At each decode step
the layer appends one token per request (only the last block's metadata is recomputed: O(layers x
heads x S x D) per step, nothing grows with the cache) and runs one batched
[`psa_fast.DecodePlan`][psa_fast.DecodePlan] straight on the paged cache. Every launch goes to torch's current
stream, with no host synchronisation, so [`CapturedDecoder`][psa_fast.hf.CapturedDecoder] can capture a whole
decode step in a CUDA graph.

Without a ``PagedCache`` (transformers' default cache), the decode step falls back to rebuilding each
sequence's metadata from the dense cache ([`decode_step`][psa_fast.hf.decode_step], slow, kept for checks).
"""

from __future__ import annotations

import dataclasses
import functools
import warnings

import numpy as np
import torch
from transformers.cache_utils import Cache, CacheLayerMixin, DynamicLayer, DynamicSlidingWindowLayer
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from psa_ref import _validate
from psa_ref.tools import hf as _hf

from ._compat import INSTALL_GPU, gpu_available

MODEL_DTYPES = {torch.bfloat16: "bfloat16", torch.float16: "float16"}


# --- the fallback: one sequence at a time over transformers' dense cache ---------------------------


def decode_step(session, layer: int, q: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                scaling: float) -> torch.Tensor:
    """One sequence's decode step over a dense cache: ``q [Hq, D]``, ``key, value [Hkv, T, D]`` CUDA
    tensors -> ``[Hq, D]``. Metadata is rebuilt from the whole cache (what a
    [`PagedCache`][psa_fast.hf.PagedCache] avoids); bfloat16 stays bfloat16, other dtypes are read as
    float16."""
    import psa_fast

    cfg = session.config
    if key.dtype != torch.bfloat16:
        key, value, q = key.half(), value.half(), q.half()
    blocks = psa_fast.KVBlocks.from_dense(key.contiguous(), value.contiguous(), block_size=cfg.block_size,
                                          metadata=cfg.metadata, kv_layout="HND")
    common = dict(scale=scaling, gqa=cfg.gqa, sink_blocks=cfg.sink_blocks, recent_blocks=cfg.recent_blocks)
    if cfg.topk is not None:
        res = psa_fast.topk_attention(q.contiguous(), blocks, cfg.topk, **common)
    else:
        res = psa_fast.attention(q.contiguous(), blocks, cfg.threshold, stop=cfg.stop, step=cfg.step, rank=cfg.rank,
                                 first_chunk=cfg.first_chunk, **common)
    if cfg.record:
        hq, hkv = q.shape[0], key.shape[0]
        g = hq // hkv
        used = [np.asarray(u) for u in (res.blocks_used if isinstance(res.blocks_used, list) else [res.blocks_used])]
        per_head = used if cfg.gqa == "per_head" else [used[h // g] for h in range(hq)]
        session._head_dim = key.shape[2]
        session.records.append(_hf.step_record(layer, key.shape[1], cfg.block_size, per_head, hkv))
    return torch.as_tensor(res.output, device=q.device)


# --- the paged cache --------------------------------------------------------------------------------


class _PagedLayer(CacheLayerMixin):
    """A PSA layer's place in the transformers ``Cache``: the tokens live in the owner's
    ``PagedKVCache``; ``update`` passes the new states through to the attention function, which
    writes them there (it knows the attention mask: padding is not stored)."""

    is_sliding = False
    is_compileable = False  # its attention calls CuPy and Numba: torch.compile must not trace it

    def __init__(self, owner: "PagedCache", layer: int):
        super().__init__()
        self.owner, self.layer = owner, layer
        self.seen = 0  # positions the model has fed this layer (padding included), as DynamicLayer counts

    def lazy_initialization(self, key_states, value_states) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        self.is_initialized = True

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.owner._pending[self.layer] = key_states.shape[-2]
        self.seen += key_states.shape[-2]
        return key_states, value_states

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.seen + query_length, 0  # the prompt's mask at prefill; unused at decode (PSA needs none)

    def get_seq_length(self) -> int:
        return self.seen

    def get_max_length(self) -> int:
        return self.owner.max_tokens

    def reset(self) -> None:
        raise NotImplementedError("a PagedCache is not reset in place: make a new one for new requests")

    def reorder_cache(self, beam_idx) -> None:
        raise NotImplementedError("beam search is not supported by psa_fast.hf.PagedCache")


class _StaticLayer(CacheLayerMixin):
    """A non-PSA layer for captured steps: K and V in fixed buffers of ``capacity`` slots, the write
    position and each slot's token position kept on the GPU, and the decode mask computed there, so a
    replayed step needs no host state (transformers' own static sliding layer keeps its length on the
    host, which a replay cannot advance).

    ``window`` None: a full-attention layer (slot = position). Else a sliding window of ``window``
    tokens kept as a ring (slot = position mod window); a query at position p attends positions
    > p - window, as transformers' sliding masks do."""

    is_compileable = False

    def __init__(self, owner: "PagedCache", layer: int, capacity: int, window: int | None):
        super().__init__()
        self.owner, self.layer, self.window = owner, layer, window
        self.is_sliding = window is not None
        self.capacity = min(capacity, window) if window else capacity
        self.seen = 0

    def lazy_initialization(self, key_states, value_states) -> None:
        b, h, _, d = key_states.shape
        self.dtype, self.device = key_states.dtype, key_states.device
        self.keys = torch.zeros((b, h, self.capacity, d), dtype=self.dtype, device=self.device)
        self.values = torch.zeros_like(self.keys)
        self.positions = torch.full((self.capacity,), -(2**40), dtype=torch.long, device=self.device)
        self.length = torch.zeros((), dtype=torch.long, device=self.device)
        self.is_initialized = True

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n = key_states.shape[-2]
        self.owner._pending[self.layer] = n
        if n > 1:  # prefill from empty (eager): keep the last `capacity` tokens; SDPA uses the prompt itself
            if self.seen:
                raise NotImplementedError("a static PagedCache takes one prefill (chunked prefill is not supported)")
            pos = torch.arange(max(0, n - self.capacity), n, device=self.device)
            slot = pos % self.capacity
            self.keys[:, :, slot] = key_states[:, :, pos]
            self.values[:, :, slot] = value_states[:, :, pos]
            self.positions[slot] = pos
            self.length.fill_(n)
            self.seen += n
            return key_states, value_states
        slot = (self.length % self.capacity).view(1)
        self.keys.index_copy_(2, slot, key_states)
        self.values.index_copy_(2, slot, value_states)
        self.positions.index_copy_(0, slot, self.length.view(1))
        self.length.add_(1)
        self.seen += 1
        return self.keys, self.values

    def decode_mask(self):
        """``[1, 1, 1, capacity]`` bool: the slots the newest token attends (device only)."""
        return decode_allowed(self.positions, self.length, self.window).view(1, 1, 1, -1)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return (query_length, 0) if self.seen == 0 else (self.capacity, 0)

    def get_seq_length(self) -> int:
        return self.seen

    def get_max_length(self) -> int:
        return self.capacity


def decode_allowed(positions: torch.Tensor, length: torch.Tensor, window: int | None) -> torch.Tensor:
    """``[S]`` bool: the slots a static layer's newest token attends: written (``positions >= 0``), not in
    its future, and within ``window`` tokens of it when the layer has a window (a query at position p
    attends positions > p - window, as transformers' sliding masks do)."""
    cur = length - 1
    ok = (positions >= 0) & (positions <= cur)
    if window is not None:
        ok = ok & (positions > cur - window)
    return ok


WINDOW_PRODUCTS = ("broadcast", "bmm")
# CapturedDecoder's choice (H200, Gemma 3 270M's window layers: Hkv 1, G 4, D 256, 512 slots, one layer in a
# CUDA graph, launch included, benchmarks/exp_window_attention.py): broadcast 12.5 / 17.9 / 44.4 µs at
# B = 1 / 8 / 32, bmm 18.4 / 17.3 / 16.9, stock SDPA with the mask 21.5 / 28.5 / 22.9. bmm from this many
# rows B x Hkv on.
WINDOW_BMM_ROWS = 8


def window_decode_attention(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor,
                            length: torch.Tensor, window: int, scaling: float,
                            products: str = "broadcast") -> torch.Tensor:
    """One decode step of a sliding-window layer over its ring of ``S`` slots, as SDPA computes it with
    [`decode_allowed`][psa_fast.hf.decode_allowed] as the mask, meant to be ``torch.compile``d: the mask, the
    scale and the softmax fuse into a few kernels.

    ``products="broadcast"``: both products as broadcast products and sums, which inductor fuses into
    reductions reading each key and value once (no float32 copy of the buffers; eagerly the products are
    materialised). ``"bmm"``: both as batched matrix products with float32 results (``torch.bmm(...,
    out_dtype=float32)`` on CUDA, on float32 copies elsewhere), the weights rounded to the values' dtype
    before the second, as flash attention's kernels do; faster for many rows (``WINDOW_BMM_ROWS``).

    Args:
        query: ``[B, Hq, 1, D]``.
        keys: ``[B, Hkv, S, D]`` (``Hq`` a multiple of ``Hkv``), the ring's keys.
        values: ``[B, Hkv, S, D]``, its values.
        positions: ``[S]`` int64, each slot's token position (negative: empty).
        length: ``[]`` int64, tokens written so far (the newest at position ``length - 1``).
        window: the window in tokens.
        scaling: the logits' scale.
        products: ``"broadcast"`` or ``"bmm"`` (above).

    Returns:
        ``[B, 1, Hq, D]`` in ``query``'s dtype (transformers' attention output layout); logits, softmax
            and weighted sum in float32.
    """
    b, hq, _, d = query.shape
    hkv, s = keys.shape[1], keys.shape[2]
    allowed = decode_allowed(positions, length, window)
    if products == "broadcast":
        q = query.reshape(b, hkv, hq // hkv, 1, d).float()
        logits = (q * keys[:, :, None].float()).sum(-1) * scaling  # [B, Hkv, G, S]
        weights = torch.softmax(logits.masked_fill(~allowed, float("-inf")), dim=-1)
        out = (weights[..., None] * values[:, :, None].float()).sum(-2)  # [B, Hkv, G, D]
        return out.reshape(b, 1, hq, d).to(query.dtype)
    if products != "bmm":
        raise ValueError(f"products must be one of {WINDOW_PRODUCTS}, got {products!r}")
    q = query.reshape(b * hkv, hq // hkv, d)
    k, v = keys.reshape(b * hkv, s, d), values.reshape(b * hkv, s, d)
    logits = _bmm32(q, k.transpose(1, 2)) * scaling  # [B Hkv, G, S]
    weights = torch.softmax(logits.masked_fill(~allowed, float("-inf")), dim=-1).to(values.dtype)
    return _bmm32(weights, v).reshape(b, 1, hq, d).to(query.dtype)


def _bmm32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` (batched) with a float32 result: cuBLAS's float32 output of 16-bit operands on CUDA."""
    if a.is_cuda and a.dtype in (torch.float16, torch.bfloat16):
        return torch.bmm(a, b, out_dtype=torch.float32)
    return torch.bmm(a.float(), b.float())


class PagedCache(Cache):
    """A transformers ``Cache`` for ``B`` requests whose PSA layers live in a
    [`psa_fast.PagedKVCache`][psa_fast.PagedKVCache] (see the module doc).

    Args:
        model: a transformers causal LM on a CUDA device, in bfloat16 or float16, enabled with
            [`enable`][psa_fast.hf.enable] (its session holds the ``PSAConfig``).
        batch: ``B``, the number of requests (the batch ``generate`` is given).
        max_tokens: capacity per request: prompt (without padding) plus generated tokens.
        static: give the non-PSA layers transformers' static layers (fixed shapes) and report fixed
            mask sizes, as a CUDA graph needs ([`CapturedDecoder`][psa_fast.hf.CapturedDecoder]);
            default dynamic layers.
        mode: ``"psa"`` (default; ``"topk"`` when the config sets ``topk``), ``"dense"`` (every
            block through the same paged kernels: the paged baseline; its cache keeps no block metadata) or
            ``"sdpa"`` (``static`` only: the PSA layers too keep K and V in static buffers and run stock SDPA, the
            dense baseline measured the same way).
        plan_options: further [`DecodePlan`][psa_fast.DecodePlan] options for the PSA layers, those
            ``PSAConfig`` does not hold (GPU-only), e.g. ``{"speculate": 1.25}`` or ``{"cluster": 4}``.

    Attributes:
        kv: the ``PagedKVCache`` (its layer ``i`` is the model layer ``psa_layers[i]``).
        psa_layers: the model layers that run PSA.
        reads: ``[len(psa_layers), B, groups]`` int64 on the GPU: blocks attended, summed over decode
            steps (each group's ``num_used``); ``blocks_seen`` ``[len(psa_layers), B]`` (host): the blocks
            each request had at those steps, summed; [`blocks_read`][psa_fast.hf.PagedCache.blocks_read] divides
            them.
        steps: decode steps run per PSA layer (host counter).

    Raises:
        RuntimeError: no CUDA GPU. ValueError: a model dtype other than bfloat16/float16, or no
        layer left to run PSA. TypeError: ``model`` was not enabled with ``psa_fast.hf.enable``.
    """

    def __init__(self, model: torch.nn.Module, *, batch: int, max_tokens: int, static: bool = False,
                 mode: str | None = None, plan_options: dict | None = None):
        import psa_fast

        if not gpu_available():
            raise RuntimeError(f"psa_fast.hf.PagedCache needs a CUDA GPU and CuPy ({INSTALL_GPU})")
        session = _session(model)
        cfg = session.config
        text = model.config.get_text_config()
        self.batch = _validate.integer(batch, "batch", minimum=1)
        self.max_tokens = _validate.integer(max_tokens, "max_tokens", minimum=1)
        self.static = bool(static)
        dtype = MODEL_DTYPES.get(model.dtype)
        if dtype is None:
            raise ValueError(f"psa_fast.hf runs bfloat16 and float16 models; this one is {model.dtype} "
                             "(load it with dtype=torch.bfloat16)")
        num_layers = text.num_hidden_layers
        layer_types = list(getattr(text, "layer_types", None) or ["full_attention"] * num_layers)
        sliding = [t == "sliding_attention" for t in layer_types]
        window = getattr(text, "sliding_window", None)
        self.psa_layers = [i for i in range(num_layers) if cfg.runs_psa(i, sliding[i])]
        if not self.psa_layers:
            raise ValueError(f"PSAConfig(layers={cfg.layers!r}) leaves no layer of this model to run PSA")
        if any(sliding[i] for i in self.psa_layers):
            raise ValueError("PSA attends the whole cache: a sliding-window layer cannot run it (use layers='global')")
        self.slot = {layer: i for i, layer in enumerate(self.psa_layers)}
        hq = text.num_attention_heads
        hkv = getattr(text, "num_key_value_heads", None) or hq
        head_dim = getattr(text, "head_dim", None) or text.hidden_size // hq
        self.mode = _validate.choice(mode or ("topk" if cfg.topk is not None else "psa"), "mode",
                                     ("psa", "topk", "dense", "sdpa"))
        if self.mode == "sdpa" and not self.static:
            raise ValueError("mode='sdpa' is the captured dense baseline: it needs static=True")
        # (mode="dense" reads no metadata: its cache keeps none, so an append only writes the token)
        self.kv = None if self.mode == "sdpa" else psa_fast.PagedKVCache(
            num_layers=len(self.psa_layers), batch=self.batch, num_kv_heads=hkv, head_dim=head_dim,
            max_tokens=self.max_tokens, block_size=cfg.block_size,
            metadata=None if self.mode == "dense" else cfg.metadata, dtype=dtype)
        self.num_q_heads, self.num_kv_heads = hq, hkv
        self.config = cfg
        self._plans: dict = {}
        self._plan_options = dict(plan_options or {})
        taken = {"num_q_heads", "mode", "gqa", "scale", "sink_blocks", "recent_blocks", "threshold", "stop", "step",
                 "k", "rank"} & set(self._plan_options)
        if taken:
            raise ValueError(f"plan_options {sorted(taken)} come from the PSAConfig and the cache; set them there")
        self._pending: dict = {}
        self._window_attention, self._window_products = None, "broadcast"  # see compile_windows()
        self.steps = 0
        layers = []
        for i in range(num_layers):
            if i in self.slot and self.kv is not None:
                layers.append(_PagedLayer(self, i))
            elif self.static:
                layers.append(_StaticLayer(self, i, self.max_tokens, window if sliding[i] else None))
            else:
                layers.append(DynamicSlidingWindowLayer(sliding_window=window) if sliding[i] else DynamicLayer())
        super().__init__(layers=layers)
        gn = hq if cfg.gqa == "per_head" else hkv
        import cupy

        self.reads = cupy.zeros((len(self.psa_layers), self.batch, gn), cupy.int64)
        self.blocks_seen = np.zeros((len(self.psa_layers), self.batch), np.int64)
        self._counted = [layer for layer in self.layers if isinstance(layer, (_PagedLayer, _StaticLayer))]
        session.cache = self

    @torch.compiler.disable  # host counters (``seen``, ``_pending``): never traced, so never guarded on
    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        """transformers' ``Cache.update`` (this layer's states in; what its attention reads out), kept
        out of ``torch.compile``'s graphs (see [`compile_layers`][psa_fast.hf.compile_layers])."""
        return super().update(key_states, value_states, layer_idx, *args, **kwargs)

    def plan(self, scale: float):
        """The batched ``DecodePlan`` of this cache for logit scale ``scale`` (made once per scale)."""
        import psa_fast

        p = self._plans.get(scale)
        if p is None:
            cfg = self.config
            opts = dict(num_q_heads=self.num_q_heads, mode=self.mode, gqa=cfg.gqa, scale=scale,
                        sink_blocks=cfg.sink_blocks if self.mode != "dense" else 0,
                        recent_blocks=cfg.recent_blocks if self.mode != "dense" else 0)
            if self.mode == "psa":
                opts.update(threshold=cfg.threshold, stop=cfg.stop, step=cfg.step, rank=cfg.rank,
                            first_chunk=cfg.first_chunk)
            elif self.mode == "topk":
                opts.update(k=cfg.topk)
            p = self._plans[scale] = psa_fast.DecodePlan(self.kv, **opts, **self._plan_options)
        return p

    def compile_windows(self, products: str | None = None) -> None:
        """Decode steps of the sliding-window layers through ``torch.compile``d
        [`window_decode_attention`][psa_fast.hf.window_decode_attention] instead of stock SDPA with a mask built
        op by op: a few fused kernels a layer. ``products``: its ``products`` argument; default ``"bmm"`` from
        ``WINDOW_BMM_ROWS`` rows (``B x Hkv``) on, else ``"broadcast"``. Called by
        [`CapturedDecoder`][psa_fast.hf.CapturedDecoder] with ``compile=True``."""
        if products is None:
            products = "bmm" if self.batch * self.num_kv_heads >= WINDOW_BMM_ROWS else "broadcast"
        self._window_products = _validate.choice(products, "products", WINDOW_PRODUCTS)
        self._window_attention = _compiled("window_decode_attention")

    def blocks_read(self) -> dict:
        """What the decode steps read: ``{"per_group": [L_psa, B, groups] mean blocks per step, "mean_share":
        blocks read / blocks there were, over every step, group, request and layer}`` (one host sync)."""
        import cupy

        if self.kv is None:
            return {"per_group": None, "mean_share": 1.0}
        reads = cupy.asnumpy(self.reads).astype(np.float64)
        seen = self.blocks_seen.astype(np.float64)
        return {"per_group": reads / max(self.steps, 1),
                "mean_share": float(reads.sum() / max(seen.sum() * reads.shape[2], 1))}

    def advance_host(self) -> None:
        """After a decode step replayed from a CUDA graph: advance the host-side counters that the
        captured step advanced on the device (lengths, positions seen, steps)."""
        if self.kv is not None:
            self.kv.host_lens += 1
            self.blocks_seen += -(-self.kv.host_lens // self.kv.block_size)
        for layer in self._counted:
            layer.seen += 1
        self.steps += 1


def _session(model) -> _hf.PSASession:
    mods = _hf.attention_modules(model)
    session = getattr(mods[0], _hf._SESSION_ATTR, None) if mods else None
    if session is None or session.forward_hook is None:
        raise TypeError("the model is not enabled for psa_fast: call psa_fast.hf.enable(model, config) first")
    return session


def _stream():
    """CuPy's view of torch's current stream: our kernels run in order with the model's (and are
    captured with them)."""
    import cupy

    return cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)


def _real_tokens(attention_mask, b: int, t: int):
    """``[T]`` bool: the keys request ``b``'s last query attends (its real tokens; padding is masked)."""
    if attention_mask is None:
        return None
    row = attention_mask[b, 0, -1, -t:]
    return row if row.dtype == torch.bool else row == 0


def attention_forward(session, module, query, key, value, attention_mask, dropout: float = 0.0,
                      scaling: float | None = None, **kwargs):
    """The ``"psa"`` attention function on the GPU (installed by [`enable`][psa_fast.hf.enable] as the session's
    hook): ``query [B, Hq, L, D]``, ``key, value [B, Hkv, L', D]`` -> ``([B, L, Hq, D], None)``.

    A layer that does not run PSA, or a model whose cache is not a ``PagedCache``, gets what
    ``psa_ref.tools.hf`` gives it (stock SDPA; the per-sequence fallback for PSA layers)."""
    cache = getattr(session, "cache", None)
    layer = module.layer_idx
    if cache is None or cache._pending.pop(layer, None) is None:  # not our cache: the reference's dispatch
        return _hf.per_sequence_forward(session, module, query, key, value, attention_mask, dropout=dropout,
                                        scaling=scaling, **kwargs)
    lay = cache.layers[layer]
    if isinstance(lay, _StaticLayer):  # stock SDPA over the static buffers, the mask made on the device
        if query.shape[2] == 1 and lay.window is not None and cache._window_attention is not None \
                and kwargs.get("softcap") is None:
            scale = float(scaling if scaling is not None else query.shape[-1] ** -0.5)
            return cache._window_attention(query, key, value, lay.positions, lay.length, lay.window, scale,
                                           cache._window_products), None
        mask = attention_mask if query.shape[2] > 1 else lay.decode_mask()
        kwargs.pop("sliding_window", None)
        return sdpa_attention_forward(module, query, key, value, mask, dropout=dropout, scaling=scaling, **kwargs)
    slot = cache.slot[layer]
    scale = float(scaling if scaling is not None else query.shape[-1] ** -0.5)
    b, hq, length, d = query.shape
    if length > 1:  # prefill: SDPA over the prompt, then its real tokens into blocks with their metadata
        if cache.kv.host_lens[slot].any():
            raise NotImplementedError("a PagedCache takes one prefill per request (chunked prefill is not "
                                      "supported yet)")
        out = sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                     **kwargs)
        with _stream():
            for i in range(b):
                real = _real_tokens(attention_mask, i, key.shape[2])
                k, v = (key[i], value[i]) if real is None else (key[i][:, real], value[i][:, real])
                cache.kv.prefill(slot, i, k.contiguous(), v.contiguous())
        return out
    with _stream():
        cache.kv.append(slot, key[:, :, 0].contiguous(), value[:, :, 0].contiguous())
        p = cache.plan(scale)
        dec = p.run(query[:, :, 0].contiguous(), layer=slot)
        cache.reads[slot] += dec.num_read  # speculated blocks are read whether or not the verifier attends them
        out = torch.from_dlpack(dec.out).to(query.dtype)
    cache.blocks_seen[slot] += -(-cache.kv.host_lens[slot] // cache.kv.block_size)  # host: lengths are known
    if layer == cache.psa_layers[0]:
        cache.steps += 1
    return out[:, None], None


# --- capture ---------------------------------------------------------------------------------------


class CapturedDecoder:
    """A model's decode step captured in a CUDA graph: static inputs, one replay per token.

    Takes a [`PagedCache`][psa_fast.hf.PagedCache] made with ``static=True`` (its window and, for
    ``mode="sdpa"``, full layers keep their positions on the GPU; transformers' ``StaticCache`` keeps a
    sliding window's length on the host, which a replay cannot advance). Requests of one batch have
    equal prompt lengths (no padding: transformers' padded masks synchronise with the host).

    A decode step needs no attention mask (the PSA layers attend each request's whole cache, the
    static layers build theirs on the device), so the model is given a constant 4-D mask, which
    transformers passes through as prepared: the step builds none (transformers' mask builders
    decide on host state, and differently while a CUDA graph is captured).

    Args:
        model: the causal LM.
        cache: the cache, empty.
        batch: ``B``.
        compile: ``torch.compile`` the model's decoder layers first
            ([`compile_layers`][psa_fast.hf.compile_layers]): their norms, projections, rotary
            embedding and MLP become a few fused kernels; attention and the cache stay eager. The
            first step compiles (seconds to a minute); the capture then refuses to recompile.
    """

    def __init__(self, model: torch.nn.Module, cache: PagedCache, batch: int, *, compile: bool = False):
        if not isinstance(compile, bool):
            raise TypeError(f"compile must be True or False, got {compile!r}")
        self.model, self.cache = model, cache
        self.batch = _validate.integer(batch, "batch", minimum=1)
        if compile:
            compile_layers(model)
            if isinstance(cache, PagedCache) and cache._window_attention is None:  # else: the caller's choice
                cache.compile_windows()
        dev = model.device
        self.ids = torch.zeros((batch, 1), dtype=torch.long, device=dev)
        self.position = torch.zeros((1,), dtype=torch.long, device=dev)
        self._no_mask = torch.ones((batch, 1, 1, 1), dtype=torch.bool, device=dev)  # passed, never read
        self.graph = None
        self.logits = None
        self.length = 0

    def _forward(self):
        return self.model(input_ids=self.ids, past_key_values=self.cache, cache_position=self.position,
                          position_ids=self.position[None].expand(self.batch, 1), attention_mask=self._no_mask,
                          use_cache=True).logits[:, -1]

    @torch.no_grad()
    def prefill(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Run the prompt ``[B, T]`` (eager, compiled layers included: a prompt length is not worth a
        compilation); returns the last position's logits ``[B, vocab]``."""
        t = input_ids.shape[1]
        with torch.compiler.set_stance("force_eager"):
            out = self.model(input_ids=input_ids, past_key_values=self.cache, use_cache=True,
                             cache_position=torch.arange(t, device=input_ids.device), logits_to_keep=1).logits[:, -1]
        self.length = t
        return out

    @torch.no_grad()
    def step(self, ids: torch.Tensor) -> torch.Tensor:
        """Decode one token per request (``ids [B]`` or ``[B, 1]``); returns logits ``[B, vocab]`` (a
        static buffer: the next step overwrites it). The first call runs eagerly (compiling every
        kernel), the second captures the step, every later one replays it."""
        self.ids.copy_(ids.reshape(self.batch, 1))
        self.position.fill_(self.length)
        if self.graph is None and getattr(self, "_warm", False):
            self.graph = torch.cuda.CUDAGraph()
            torch.cuda.synchronize()
            snapshot = _host_state(self.cache)
            with torch.compiler.set_stance("fail_on_recompile"), torch.cuda.graph(self.graph), \
                    _cupy_allocates_from_torch():
                self.logits = self._forward()
            _restore_host_state(self.cache, snapshot)  # capture recorded the step; nothing ran yet
        if self.graph is not None:
            self.graph.replay()
            if isinstance(self.cache, PagedCache):
                self.cache.advance_host()
            out = self.logits
        else:
            out = self._forward()
            self._warm = True
        self.length += 1
        return out


def decoder_layers(model: torch.nn.Module) -> torch.nn.ModuleList:
    """The decoder layers of a transformers causal LM (``model.get_decoder().layers``)."""
    dec = model.get_decoder() if hasattr(model, "get_decoder") else None
    layers = getattr(dec, "layers", None)
    if not isinstance(layers, torch.nn.ModuleList):
        raise TypeError(f"{type(model).__name__} has no decoder layers at model.get_decoder().layers")
    return layers


@functools.cache
def _compiled(name: str):
    """``torch.compile`` of this module's function ``name`` (static shapes), made once per process."""
    return torch.compile(globals()[name], dynamic=False)


def compile_layers(model: torch.nn.Module, **options) -> None:
    """``torch.compile`` each decoder layer of ``model`` in place (static shapes; inductor's default
    mode unless ``options``, passed on to ``torch.compile``, say otherwise; a layer already compiled
    is left as it is).

    What is compiled is what lies between the attention calls: norms, projections, the rotary
    embedding, residuals and the MLP, fused by inductor into a few kernels a layer (a decode step of
    Gemma 3 270M is otherwise ~1,500 kernels of 1-5 µs). The ``"psa"`` attention function and
    [`PagedCache.update`][psa_fast.hf.PagedCache] are opaque to ``torch.compile`` (graph breaks), so
    CuPy, NumPy and host counters never enter a graph and a new decode step never recompiles. Not
    inductor's ``"reduce-overhead"`` mode: [`CapturedDecoder`][psa_fast.hf.CapturedDecoder] captures the
    whole step in its own CUDA graph.
    """
    layers = decoder_layers(model)
    conf = torch._dynamo.config
    # one compiled entry per layer for the shared forward code (layer_idx is guarded on), per batch size
    # and per first-step guard failure: past the default limit (8) dynamo would run later layers eagerly
    # without an error, so the limit is set far above what a process of a few batch sizes needs
    conf.recompile_limit = max(conf.recompile_limit, 16 * len(layers) + 64)
    conf.accumulated_recompile_limit = max(conf.accumulated_recompile_limit, 64 * len(layers) + 256)
    for layer in layers:
        if getattr(layer, "_compiled_call_impl", None) is None:
            layer.compile(**{"dynamic": False, **options})


class _TorchBlock:
    """Owner of one allocation from torch's caching allocator, returned to it when CuPy lets go."""

    def __init__(self, ptr: int):
        self.ptr = ptr

    def __del__(self):
        torch.cuda.caching_allocator_delete(self.ptr)


def _torch_malloc(size: int):
    import cupy

    ptr = torch.cuda.caching_allocator_alloc(max(size, 1), stream=torch.cuda.current_stream())
    mem = cupy.cuda.UnownedMemory(ptr, size, _TorchBlock(ptr))
    return cupy.cuda.MemoryPointer(mem, 0)


class _cupy_allocates_from_torch:
    """While a step is captured, CuPy's temporaries come from torch's allocator, which serves a graph
    capture from the graph's private pool (CuPy's own pool would call cudaMalloc, which a capture
    forbids)."""

    def __enter__(self):
        import cupy

        self._old = cupy.cuda.get_allocator()
        cupy.cuda.set_allocator(_torch_malloc)

    def __exit__(self, *exc):
        import cupy

        cupy.cuda.set_allocator(self._old)


def _host_state(cache):
    if not isinstance(cache, PagedCache):
        return None
    lens = None if cache.kv is None else (cache.kv.host_lens.copy(), cache.blocks_seen.copy())
    return lens, [layer.seen for layer in cache._counted], cache.steps


def _restore_host_state(cache, snapshot) -> None:
    if snapshot is None:
        return
    lens, seen, steps = snapshot
    if lens is not None:
        cache.kv.host_lens[...], cache.blocks_seen[...] = lens
    for layer, s in zip(cache._counted, seen):
        layer.seen = s
    cache.steps = steps
    cache._pending.clear()


# --- switching a model over ------------------------------------------------------------------------


def register() -> None:
    """Register ``attn_implementation="psa"`` with transformers and the ``"fast"`` backend."""
    _hf.register()
    _hf.register_backend("fast", decode_step)


def step_warning(config: _hf.PSAConfig) -> str | None:
    """Why ``config`` would make the GPU loop slow, or None: PSA with ``step=1`` (``PSAConfig``'s default, the
    reference's) runs one iteration of barriers and decisions for every block it attends."""
    if config.topk is not None or config.threshold >= 1 or config.step != 1:
        return None
    return ("PSAConfig(step=1) makes the GPU loop iterate once a block (~4 µs each); pass step='auto' (the plan "
            "sizes it, psa_fast.DecodePlan) or an integer such as 16")


def enable(model, config: _hf.PSAConfig | None = None) -> _hf.PSASession:
    """[`psa_ref.tools.hf.enable`][psa_ref.tools.hf.enable] on the GPU: the model's ``"psa"`` attention runs
    batched on a [`PagedCache`][psa_fast.hf.PagedCache] when ``generate`` (or a forward) is given one, and
    falls back to per-sequence steps otherwise. Requires a CUDA GPU.

    Raises:
        RuntimeError: where there is no CUDA GPU (or CuPy is missing).
    """
    if not gpu_available():
        raise RuntimeError(f"psa_fast.hf needs a CUDA GPU and CuPy ({INSTALL_GPU}); on the CPU use "
                           "psa_ref.tools.hf.enable(model, PSAConfig(backend='ref' or 'sweep'))")
    config = _hf.PSAConfig(backend="fast") if config is None else dataclasses.replace(config, backend="fast")
    why = step_warning(config)
    if why:
        warnings.warn(why, stacklevel=2)
    register()
    session = _hf.enable(model, config)
    session.forward_hook = functools.partial(attention_forward, session)
    return session
