"""The public API of psa_fast: the reference's functions on GPU arrays, and a batched decode plan.

* [`attention`][psa_fast.attention], [`topk_attention`][psa_fast.topk_attention],
  [`dense_attention`][psa_fast.dense_attention] and [`KVBlocks`][psa_fast.KVBlocks] take the
  same arguments and return the same [`psa_ref.AttentionResult`][psa_ref.AttentionResult] as their ``psa_ref`` twins,
  with ``output`` on the GPU (a CuPy array or torch tensor, like ``q``). They check every input
  (including NaN/Inf, which costs a device synchronisation) and copy the small diagnostics back.
* [`DecodePlan`][psa_fast.DecodePlan] is the hot path: buffers and kernels chosen once for a
  [`PagedKVCache`][psa_fast.PagedKVCache], then [`DecodePlan.run`][psa_fast.DecodePlan.run] per decode step, with no
  host synchronisation and fixed buffers, so a step can be captured in a CUDA graph.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from psa_ref import _validate, progressive
from psa_ref.blocks import METADATA_KINDS, to_hnd
from psa_ref.progressive import DEFAULT_STOP, SKETCH_RULES, check_first_chunk, resolve_stop, warn_sketch_metadata
from psa_ref.result import AttentionResult
from psa_ref.scoring import RANKS

from . import _kernels
from ._compat import (BF16_BITS, KV_DTYPES, array_kind, as_cupy, as_cupy_kv, is_torch_bf16, kv_to_float32, like,
                      requires_gpu)
from .cache import PagedKVCache

MODES = ("psa", "topk", "dense")


GQA_MODES = ("shared", "per_head")


@dataclass
class DecodeOutput:
    """Device results of one decode step (views of the plan's buffers: the next run overwrites them).

    Attributes:
        out: ``[B, Hq, D]`` float32 attention outputs.
        order: ``[B, Gn, Nmax]`` int32 processing order per selection group (None for dense).
        num_used: ``[B, Gn]`` int32: the first ``num_used`` entries of ``order`` were attended.
        iterations: ``[B, Gn]`` int32 chunks processed.
        reason: ``[B, Gn]`` int32 index into ``psa_fast.REASONS``.
        mass_estimate: ``[B, Hq]`` float32: the stop rule's estimate of the attended mass fraction.
        num_speculated: ``[B, Gn]`` int32 (``speculate`` plans, else None): the first ``num_speculated`` entries of
            ``order`` were read in parallel before the verifier ran; the blocks read are the first
            ``max(num_used, num_speculated)``.
    """

    out: Any
    order: Any
    num_used: Any
    iterations: Any
    reason: Any
    mass_estimate: Any
    num_speculated: Any = None

    @property
    def num_read(self) -> Any:
        """``[B, Gn]`` blocks read per group: ``num_used``, or with speculation ``max(num_used, num_speculated)``
        (speculated blocks are read whether or not the verifier attends them; a new array then)."""
        if self.num_speculated is None:
            return self.num_used
        if isinstance(self.num_used, np.ndarray):
            return np.maximum(self.num_used, self.num_speculated)
        import cupy

        return cupy.maximum(self.num_used, self.num_speculated)


class DecodePlan:
    """One decode configuration over a [`PagedKVCache`][psa_fast.PagedKVCache]: plan once,
    [`run`][psa_fast.DecodePlan.run] every step.

    Args:
        cache: the KV cache.
        num_q_heads: ``Hq``, a multiple of the cache's ``Hkv``.
        mode: ``"psa"`` (Algorithm 1), ``"topk"`` or ``"dense"``.
        threshold: ``tau`` in (0, 1] (psa).
        stop: ``"auto"`` (the reference's default: ``"sketch_avg"`` on a ``quant3`` cache, ``"ema"`` on the
            others) or a rule of ``psa_fast.STOP_RULES`` (psa).
        step: blocks per iteration (psa), or ``"auto"`` (default): the plan picks it
            (`_kernels.pick_step`) from the batch, the blocks and the launch
            shape, so fewer iterations where the GPU has bandwidth to spare (one request on Llama-3.1-8B's
            shape: 384 blocks at 32K, 768 at 128K; a whole number of blocks, or of pairs, for every warp;
            benchmarks/NOTES.md; after a ``first_chunk="predicted"`` under a sketch rule, a step for what the
            prediction leaves: 128 blocks on Gemma 3's real layer at 32K, B = 8, where the plain loop takes
            320, fewer blocks at a larger error; give the plain step to keep its error). The step decides which
            blocks are attended past the stop, so ``"auto"`` makes them depend on the batch and the GPU; give an
            integer for results that do not, and ``plan.step`` to [`psa_ref.attention`][psa_ref.attention] to
            check a run. On the GPU an iteration's blocks are spread over ``cluster * warps`` warps, so a step
            below that leaves warps idle.
        k: block budget (topk).
        gqa: ``"shared"`` or ``"per_head"``.
        sink_blocks: first blocks attended before the ranked ones (psa, topk).
        recent_blocks: last blocks attended likewise.
        scale: logit scale, default ``1/sqrt(D)``.
        cluster: CTAs per selection group (default: the largest power of two with groups x cluster <= SMs, up
            to 8, or 16 where the GPU holds all the groups' clusters of 16 at once: ``_kernels.pick_cluster``; a
            cluster above 8 is a non-portable size, enabled per kernel).
        warps: warps per CTA (default: 4 for dense and top-k at head dim <= 64, else 8; with ``speculate``, the
            speculative attend's CTAs take one warp when the chunks speculated (counted on the GPU) fill several
            CTAs an SM, to hide each chunk's start and end, ``_kernels.spec_shapes``).
        version: decode kernel: 3 (tensor cores, at most 8 query heads per KV head) or 2 (CUDA cores,
            any group size, stop rules remaining/seed/certified; groups of more than 8 heads use it).
        stages: depth of each warp's prefetch ring (default: 3, fewer where shared memory is short).
        first_chunk: psa: the ranked blocks of the first ranked iteration, as in
            [`psa_ref.attention`][psa_ref.attention]: None (``step``), an integer, ``"predicted"``
            (from each head's estimates along the order, on the GPU; not with ``stop="certified"``,
            whose per-head buffer holds the bounds), ``"estimated_stop"`` (``stop`` "ema" or "remaining":
            ``psa_estimated_stop`` runs the rule on each head's estimated masses along the order, times
            ``psa_ref.progressive.ESTIMATED_STOP_MARGIN`` as it is when the plan is made), or
            ``"previous"``: one ``step`` short of where the same
            layer's group stopped at its previous call
            ([`previous_first_chunk`][psa_ref.progressive.previous_first_chunk]; the plain schedule at the
            first call and after [`forget_previous`][psa_fast.DecodePlan.forget_previous]). A layer's need
            changes little between decode steps, so a group takes about two decisions where the step alone
            takes one every ``step`` blocks, with no pass over the estimates; not with ``speculate``. Each
            call is still the reference's with an integer ``first_chunk`` (the previous ``num_used``). On the
            H200 it halves the decisions but not yet the time (a real Gemma 3 layer's decode steps in order:
            +12% at B = 1, +3% at B = 8, -0.5% at B = 32; its build costs ~5 µs a call not yet explained,
            benchmarks/NOTES.md): an option to measure, not a default.
        splits: CTAs per group for dense and top-k (split-KV: each attends a slice of the positions,
            partial outputs merged by log-sum-exp). Default: about one wave over the SMs when the groups
            alone leave SMs idle (one request, few KV heads), else 1. PSA's loop runs one cluster per group.
        speculate: psa: None (the loop, one cluster per group, a barrier per chunk), or a margin ``m > 0``:
            every chunk of the loop's schedule that starts within the forced blocks + ``m`` x the ranked
            blocks the estimates predict for ``threshold`` (the prediction of ``first_chunk="predicted"``)
            + ``speculate_extra`` blocks (one ``step`` by default) is attended at once, one CTA per chunk over
            the whole GPU; the verifier then runs over those chunks in order on the device and the loop
            resumes after them for groups
            whose rule has not held. The same rule on the same chunk statistics, summed in another order:
            the blocks attended and the stop are the loop's except where rounding straddles ``threshold``,
            the output differs by float rounding. Blocks speculated past the stop are read and not attended
            (``DecodeOutput.num_speculated``). Pays with one or few KV heads and many chunks (docs/gpu.md);
            memory: ``[B, Hq, chunks, D + 4]`` float32 partials. Not with ``stop="certified"``.
            ``"first_chunk"`` (with ``first_chunk`` an integer, ``"predicted"`` or ``"estimated_stop"``):
            exactly the forced chunk and the first ranked chunk are speculated, the latter in pieces (one wave
            of CTAs over the SMs, shared out by the groups' first chunks' blocks: ``_kernels.spec_share``; as the
            split build's splits for top-k), with no pass over the estimates to size them; the verifier decides
            after each, and groups whose rule has not held go on in the loop at the plan's own ``step``. The
            plain loop's blocks and stop with that ``first_chunk``, up to float rounding. Made so that one
            request's large first chunk (``"estimated_stop"``: a group's usual stop) is read over every SM, not
            its cluster's. On an H100 it pays on the per-head profile at 128K (one request -5% against the
            loop) and loses at 32K one request and on the real Gemma 3 layer (docs/gpu.md).
        speculate_extra: with a margin ``speculate``, the blocks speculated past ``m`` x the predicted ones (default
            ``step``: one chunk). A group the speculation leaves short resumes chunk by chunk, a barrier
            each; a few more chunks cost little and leave fewer groups short (benchmarks/NOTES.md,
            ``exp_spec_coverage.py``).
        rank: psa: how a shared group ranks its blocks, as [`psa_ref.attention`][psa_ref.attention]'s:
            ``"estimate"`` (the largest estimate over its heads) or ``"share"`` (the largest estimated share of
            one head's mass: a small kernel normalises each head's estimates by their log-sum-exp between
            the estimate and the order). Not with ``stop="certified"``.
    """

    # whether the plain loop runs whole in one launch, so it may take the grid build (_kernels.pick_grid); the
    # offload decoder's runs an iteration a launch
    _whole_loop = True

    @requires_gpu
    def __init__(self, cache: PagedKVCache, *, num_q_heads: int, mode: str = "psa", threshold: float = 0.95,
                 stop: str = DEFAULT_STOP, step: int | str = "auto", k: int = 8, gqa: str = "shared",
                 sink_blocks: int = 0, recent_blocks: int = 0, scale: float | None = None, cluster: int | None = None,
                 warps: int | None = None, version: int = 3, stages: int | None = None, splits: int | None = None,
                 first_chunk: int | str | None = None, speculate: float | str | None = None,
                 speculate_extra: int | None = None, rank: str = "estimate"):
        import cupy

        if not isinstance(cache, PagedKVCache):
            raise TypeError(f"cache must be a psa_fast.PagedKVCache, got {type(cache).__name__}")
        self.cache = cache
        self.mode = _validate.choice(mode, "mode", MODES)
        self.threshold = _validate.threshold(threshold)
        if cache.metadata is None and self.mode != "dense":
            raise ValueError(f"mode={self.mode!r} ranks blocks by their metadata, and this cache keeps none "
                             "(PagedKVCache(metadata=None)); use mode='dense' or a cache with metadata")
        self.stop = resolve_stop(stop, cache.metadata)  # every rule of the reference runs on the GPU
        if self.mode == "psa":
            warn_sketch_metadata(self.stop, cache.metadata)  # at the caller of DecodePlan()
        step = _validate.integer_or_auto(step, "step", minimum=1)
        self.k = _validate.integer(k, "k", minimum=1)
        self.gqa = _validate.choice(gqa, "gqa", GQA_MODES)
        self.sink_blocks = _validate.integer(sink_blocks, "sink_blocks", minimum=0)
        self.recent_blocks = _validate.integer(recent_blocks, "recent_blocks", minimum=0)
        self.hq = _validate.integer(num_q_heads, "num_q_heads", minimum=1)
        if self.hq % cache.num_kv_heads:
            raise ValueError(f"the number of query heads ({self.hq}) must be a multiple of the number of KV heads "
                             f"({cache.num_kv_heads})")
        if self.mode == "topk" and self.k < self.sink_blocks + self.recent_blocks:
            raise ValueError(f"k ({self.k}) must be at least the number of sink and recent blocks "
                             f"({self.sink_blocks + self.recent_blocks})")
        self.scale = _validate.scale(scale, cache.head_dim)
        self.g = self.hq // cache.num_kv_heads if self.gqa == "shared" else 1
        if self.g * cache.dp > 2048:
            raise NotImplementedError(f"{self.g} query heads per group at head dim {cache.dp} exceed the kernel's "
                                      "shared-memory layout; use gqa='per_head'")
        self.gn = self.hq // self.g
        self.cluster = (_kernels.pick_cluster(cache.batch * self.gn) if cluster is None
                        else _validate.integer(cluster, "cluster", minimum=1))
        self.warps = (_kernels.default_warps(cache.dp, self.mode, cache.batch * cache.num_kv_heads) if warps is None
                      else _validate.integer(warps, "warps", minimum=1))
        self._auto_warps = warps is None  # speculate: the speculative attend's CTAs sized by _kernels.spec_shapes
        self.version = int(_validate.choice(str(version), "version", ("2", "3")))
        self.stages = (_kernels.default_stages(cache.dp, self.mode, self.warps, cache.batch * cache.num_kv_heads)
                       if stages is None else _validate.integer(stages, "stages", minimum=2))
        self.splits, self.split_len, self.partial = self._plan_splits(splits, cluster)
        self.first_chunk = "previous" if first_chunk == "previous" else check_first_chunk(first_chunk, self.stop)
        if self.first_chunk is not None and self.mode != "psa":
            raise ValueError(f"first_chunk sizes PSA's first ranked iteration; mode={self.mode!r} has none")
        if self.first_chunk == "predicted" and self.stop == "certified":
            raise NotImplementedError("first_chunk='predicted' with stop='certified' is not implemented on the GPU "
                                      "(its per-head buffer holds the min/max bounds, not the estimates)")
        if self.first_chunk is not None and self.version != 3:
            raise ValueError("first_chunk needs decode version 3")
        self.speculate = self._check_speculate(speculate)
        if self.first_chunk == "previous" and self.speculate is not None:
            raise ValueError("first_chunk='previous' sizes the plain loop's first chunk; speculate runs another "
                             "schedule (leave one of them None)")
        # speculate="first_chunk": the forced and first ranked chunks speculated in pieces, no psa_spec_len
        self._spec_first = self.speculate == "first_chunk"
        if self._spec_first and self.first_chunk is None:
            raise ValueError("speculate='first_chunk' speculates the first ranked chunk: give first_chunk too (an "
                             "integer, 'predicted' or 'estimated_stop')")
        # the plain loop on more CTAs a group than a cluster holds, or where the GPU cannot hold every group's cluster
        # at once (decode.cu's grid build, _kernels.pick_grid)
        block_bytes = 2 * cache.block_size * cache.dp * 2  # a block's K and V
        self.grid_ctas = (_kernels.pick_grid(cache.batch * self.gn, self.cluster, cache.nmax, cache.dp, block_bytes)
                          if self.mode == "psa"
                          and self.version == 3 and self.speculate is None and cluster is None and self._whole_loop
                          else 0)
        if self.grid_ctas:
            self.cluster = 1
        # the loop's warps a CTA as its build fits them (the step's unit; the grid build's entries, one a warp)
        loop_warps, pairs = _kernels.loop_launch(d=cache.dp, s=cache.block_size, g=self.g, version=self.version,
                                                 warps=self.warps, stages=self.stages)
        if step == "auto":
            step = _kernels.pick_step(cache.batch, self.gn, cache.nmax, cluster=self.grid_ctas or self.cluster,
                                      warps=loop_warps, block_bytes=block_bytes,
                                      speculate=self.speculate is not None and not self._spec_first, pairs=pairs,
                                      predicted=self.first_chunk == "predicted" and self.stop in SKETCH_RULES)
        self.step = step
        if speculate_extra is not None and (self.speculate is None or self._spec_first):
            raise ValueError("speculate_extra needs speculate (a margin), not None or 'first_chunk'")
        self.speculate_extra = (self.step if speculate_extra is None
                                else _validate.integer(speculate_extra, "speculate_extra", minimum=0))
        self.rank = _validate.choice(rank, "rank", RANKS)
        if self.rank == "share" and self.mode != "psa":
            raise ValueError(f"rank='share' orders PSA's shared groups; mode={self.mode!r} ranks by the estimate")
        if self.rank == "share" and self.stop == "certified" and self.g > 1:
            raise NotImplementedError("rank='share' with stop='certified' is not implemented on the GPU (its "
                                      "per-head buffer holds the min/max bounds, not the estimates the key needs)")
        b, nmax, dp = cache.batch, cache.nmax, cache.dp
        f32, i32 = cupy.float32, cupy.int32
        self.q = cupy.zeros((b, self.hq, dp), f32)
        # Decode v3 multiplies Q K^T on the tensor cores with Q split into parts of the KV's type. Q scaled
        # by a power of two only (q_mma) keeps a query of that type exact, with no lo part to multiply
        # (a bfloat16 query: one part; a float16 one: the kernel skips an all-zero lo part); the rest of
        # the scale (qk_scale, in [0.7, 1.42]) is applied to the float32 logits.
        self._pow2 = float(2.0 ** np.round(np.log2(self.scale)))
        self.qk_scale = self.scale / self._pow2
        self.q_mma = cupy.zeros((b, self.hq, dp), f32)
        self._q_exact = False  # the last query loaded was bfloat16 for a bfloat16 cache (see load_query)
        self.scores = cupy.empty((b, self.gn, nmax), f32)
        # per-head selection: one estimate launch per KV head scores its query heads (scratch for the group maxima)
        kv_group = self.hq // cache.num_kv_heads
        self._group_scores = (cupy.empty((b, cache.num_kv_heads, nmax), f32)
                              if self.g == 1 and 1 < kv_group <= 8 and self.mode != "dense" else None)
        self.order_buf = cupy.empty((b, self.gn, nmax), i32)
        ws = _kernels.order_workspace_shape(b, self.gn, nmax)
        self.sort_workspace = None if ws is None else cupy.empty(ws, cupy.uint64)
        self._topk_head = self.mode == "topk" and _kernels.topk_uses_head(b, self.gn, nmax, self.k,
                                                                           workspace=ws is not None)
        # per head beside the group scores: min/max bounds (certified) or each head's estimates (sketch),
        # and their suffix log-sum-exp along the order
        per_head = {"certified": "bounds", "sketch": "estimates", "sketch_avg": "estimates"}
        self._per_head = per_head.get(self.stop) if self.mode == "psa" else None
        # each head's estimates for the predicted first chunk and speculation (summed along the order by the suffix
        # pass), the share key (normalised per head) and the estimated stop (walked along the order by its own
        # kernel, which needs no suffix pass)
        spec_margin = self.speculate is not None and not self._spec_first  # psa_spec_len sums the suffix
        estimates_with_suffix = (self.first_chunk == "predicted" or spec_margin
                                 or (self.rank == "share" and self.g > 1))
        if estimates_with_suffix or self.first_chunk == "estimated_stop":
            self._per_head = "estimates"
        self._suffix = self._per_head is not None and (estimates_with_suffix or per_head.get(self.stop) is not None)
        self.bounds = cupy.empty((b, self.hq, nmax), f32) if self._per_head else None
        self.log_suffix = cupy.empty((b, self.hq, nmax + 1), f32) if self._per_head else None
        self.lmass = cupy.empty((b, self.hq, nmax), f32) if self._per_head == "estimates" else None
        # ... and each head's log sketch mass by position of the order (psa_order_suffix writes it beside the sums)
        self.sketch_ordered = cupy.empty((b, self.hq, nmax), f32) if self._per_head == "estimates" else None
        self.out = cupy.empty((b, self.hq, dp), f32)
        self._grid_group = None  # the grid build's exchange buffers (its counters zero between launches)
        if self.grid_ctas:
            c = self.grid_ctas
            shapes = _kernels.grid_exchange_shapes(b, self.gn, c, loop_warps, self.g, dp)
            self._grid_group = (c,) + tuple(cupy.zeros(shape, dtype) for shape, dtype
                                            in zip(shapes, _kernels.GRID_EXCHANGE_DTYPES))
        # run() and the caller's query: dense and top-k plans' split build reads it (times the power of two), and so
        # does a top-k plan's estimate where it runs on the tensor cores (psa_estimate_mma scales it itself): no kernel
        # copies it (_raw_query). PSA's estimate reads it too, and the scaled copies for its loop are written on a side
        # stream beside the estimate and the order (_query_branch: fork event, join event, side stream; the loop
        # reading the caller's query measured level to +0.5 µs against it, benchmarks/NOTES.md, s58c; with
        # DECODE_RAW_QUERY 2 it reads it, for that A/B).
        estimate_raw = (self.mode != "dense" and dp == cache.head_dim
                        and _kernels.estimate_reads_raw_query(cache.metadata, self._per_head, self.g, self.hq,
                                                              cache.num_kv_heads, dp, self._group_scores))
        raw_modes = {0: (), 1: ("dense", "topk"), 2: ("dense", "topk", "psa")}.get(_kernels.DECODE_RAW_QUERY)
        if raw_modes is None:
            raise ValueError(f"_kernels.DECODE_RAW_QUERY must be 0, 1 or 2, got {_kernels.DECODE_RAW_QUERY!r}")
        self._raw_query = (self.mode in raw_modes and self.version == 3 and self.g <= 8 and dp == cache.head_dim
                           and self.speculate is None and (estimate_raw or self.mode == "dense"))
        self._query_branch = None
        if _kernels.QUERY_BRANCH and estimate_raw and not self._raw_query:
            fork, join = (cupy.cuda.Event(block=False, disable_timing=True) for _ in range(2))
            self._query_branch = (fork, join, cupy.cuda.Stream(non_blocking=True))
        self.num_used = cupy.empty((b, self.gn), i32)
        self.iterations = cupy.empty((b, self.gn), i32)
        self.reason = cupy.empty((b, self.gn), i32)
        self.mass_estimate = cupy.empty((b, self.hq), f32)
        # first_chunk: per group, the ranked blocks of the first ranked iteration (constant, or predicted per step)
        self.first_len = None
        if self.first_chunk == "previous":
            # each layer's num_used, kept from one call to the next: the decode kernel reads the previous call's
            # as its first chunk's end and writes this call's over it (decode.cu's PSA_FIRST_PREV)
            self.num_used_layers = cupy.zeros((cache.num_layers, b, self.gn), i32)
        elif self.first_chunk is not None:
            fixed = 0 if self.first_chunk in ("predicted", "estimated_stop") else self.first_chunk
            self.first_len = cupy.full((b, self.gn), fixed, i32)
        # first_chunk="predicted" each step by psa_first_chunk, "estimated_stop" by psa_estimated_stop (below tau 1:
        # at tau 1 every block is read anyway)
        self._predicts_first = self.first_chunk == "predicted" and self.threshold < 1
        self._estimates_stop = self.first_chunk == "estimated_stop" and self.threshold < 1
        self._estimated_stop_margin = progressive.ESTIMATED_STOP_MARGIN  # as it is when the plan is made
        self._l2_first = self._l2_first_blocks()  # (the order kernel's L2 first chunk, fixed by the plan)
        # stages 1 and 2 in one launch (psa_estimate_order) where _kernels.fuses_estimate_order: estimate() launches it
        # and order() has nothing of its own left to launch
        self._estimate_order = (self.mode != "dense" and not self._topk_head and _kernels.fuses_estimate_order(
            b, self.gn, nmax, kind=cache.metadata, per_head=self._per_head, g=self.g, hq=self.hq,
            hkv=cache.num_kv_heads, d=dp, group_scores=self._group_scores, workspace=ws is not None))
        # the whole step in one launch (_kernels.FUSED_STEP, off): the loop's clusters do psa_estimate_order's work
        # first (decode.cu PSA_FUSED_EO), both parts reading the caller's query; run() then launches nothing else
        self._fused_step = bool(
            _kernels.FUSED_STEP and self._estimate_order and self.mode == "psa" and self.version == 3 and estimate_raw
            and not self.grid_ctas and self.speculate is None and self.first_chunk is None and self.partial is None
            and self.stop in _kernels.FUSED_STEP_RULES and 2 <= self.cluster <= 8 and loop_warps == 8
            and -(-nmax // _kernels.RUN_BLOCKS) <= self.cluster and self.g <= 4 and cache.dtype == "float16")
        # speculate: per group the speculated positions, per chunk of the schedule the partial outputs, and
        # the loop's state after the speculated chunks (for the resumed loop)
        self.spec_len = self.spec_partial = self.istate = self.vstate = self.spec_total = self.spec_items = None
        self.spec_pieces = 1
        self._spec_share = None
        if self.speculate is not None:
            forced = self.sink_blocks + self.recent_blocks
            if self._spec_first:  # the forced chunk and the first ranked one, each in pieces; no list, no spec_len
                self.spec_chunks = (forced > 0) + 1
                self._spec_share = _kernels.spec_share(b * self.gn, forced > 0)
                self.spec_pieces = self._spec_share.pmax
                self.spec_warps = self.warps
            else:
                self.spec_chunks = (forced > 0) + (self.first_chunk is not None) + -(-nmax // self.step)
                self.spec_len = cupy.empty((b, self.gn), i32)
                # the speculative attend's CTA shapes; with two, psa_spec_len lists the chunks for the compact grid
                shapes = (_kernels.spec_shapes(b * self.gn * self.spec_chunks, self.warps) if self._auto_warps
                          else (self.warps,))
                self.spec_warps = shapes[0]
                if len(shapes) > 1:
                    self.spec_items = cupy.empty(_kernels.spec_one_warp_from(), i32)
            # chunks speculated this step (psa_spec_len; 0 between steps; read by the attend, reset by the verifier)
            self.spec_total = cupy.zeros(1, i32)
            self.spec_partial = cupy.empty((b, self.hq, self.spec_chunks * self.spec_pieces, dp + 4), f32)
            self.istate = cupy.empty((b, self.gn, 4), i32)
            self.vstate = cupy.empty((b, self.hq, 7 + dp), f32)

    def _check_speculate(self, speculate):
        """``speculate`` checked against the mode, rule and kernel version."""
        if speculate is None:
            return None
        if speculate != "first_chunk" and (isinstance(speculate, bool) or not isinstance(speculate, (int, float))
                                           or not speculate > 0):
            raise ValueError(f"speculate must be None, a margin > 0 (e.g. 1.25) or 'first_chunk', got {speculate!r}")
        if self.mode != "psa":
            raise ValueError(f"speculate runs PSA's loop; mode={self.mode!r} has none")
        if self.stop == "certified":
            raise NotImplementedError("speculate with stop='certified' is not implemented on the GPU (its per-head "
                                      "buffer holds the min/max bounds, not the estimates the prediction needs)")
        if self.version != 3:
            raise ValueError("speculate needs decode version 3")
        return speculate if speculate == "first_chunk" else float(speculate)

    def _plan_splits(self, splits, cluster) -> tuple:
        """``(splits, positions per split, partial-output buffer or None)``; sets ``cluster`` to 1 when split."""
        import cupy

        c = self.cache
        if splits is not None:
            splits = _validate.integer(splits, "splits", minimum=1)
            if splits > 1 and self.mode == "psa":
                raise ValueError("splits > 1 runs dense and top-k attention only; PSA's loop runs one cluster "
                                 "per group (leave splits=None)")
        version, warps, _, smem = _kernels.decode_config(d=c.dp, s=c.block_size, g=self.g, version=self.version,
                                                         warps=self.warps, stages=self.stages)
        positions = c.nmax if self.mode == "dense" else min(self.k, c.nmax)
        if splits is None:
            splits = (1 if self.mode == "psa" or version != 3 or cluster is not None
                      else _kernels.pick_splits(c.batch * self.gn, positions, warps, smem))
        if splits == 1:
            return 1, positions, None
        if version != 3:
            raise ValueError(f"splits > 1 needs decode version 3 (at most 8 query heads per group, got {self.g})")
        self.cluster = 1
        split_len = -(-positions // splits)
        return splits, split_len, cupy.empty((c.batch, self.hq, splits, c.dp + 2), cupy.float32)

    def run(self, q, layer: int = 0) -> DecodeOutput:
        """Attend ``q`` (``[B, Hq, D]`` float16, bfloat16 or float32 on the GPU) to layer ``layer`` of the cache.

        Launches the stages on the current stream (query scaling, then estimate and order unless
        dense, then the decode kernel) and returns without synchronising. Shapes and dtypes are
        checked; values are not (no NaN scan). No kernel copies the query where the kernels read the
        caller's (``_kernels.DECODE_RAW_QUERY``: dense and top-k's split build, and top-k's estimate on
        the tensor cores); PSA's tensor-core estimate reads it too, while the scaled copy for the loop is
        written on a side stream beside the estimate and the order (``_kernels.QUERY_BRANCH``: one more
        branch of a captured graph, a fork and a join event). Where the plan runs the step in one launch
        (``_kernels.FUSED_STEP``, off), the loop's build estimates and orders first, reading the caller's query.
        The same bits either way.
        """
        if self._query_branch is None and not self._raw_query and not self._fused_step:
            layer = self.load_query(q, layer)
        else:
            layer, qa = self._check_query(q, layer)
            if qa.data.ptr % (2 * qa.itemsize) == 0:  # (the kernels load two channels at once)
                return self._run_reading_query(qa, layer)
            self._scale_query(qa)
        if self.mode != "dense":
            self.estimate(layer)
            self.order(layer)
        return self.attend(layer)

    def _run_reading_query(self, qa, layer: int) -> DecodeOutput:
        """run() with the checked query ``qa`` read by the kernels: the estimate (unless dense) reads it; with
        ``_raw_query`` the decode too, with ``_query_branch`` the decode's scaled copy is written on the side stream
        (forked after the previous call's decode, which read ``q_mma``; joined before this call's) while the current
        stream estimates and orders."""
        import cupy

        if self._fused_step:  # the step in one launch: the estimate, the order and the loop
            self._note_query(qa)
            return self.attend(layer, q_raw=qa)
        if self._query_branch is None:
            self._note_query(qa)
        else:
            fork, join, side = self._query_branch
            main = cupy.cuda.get_current_stream()
            fork.record(main)
            side.wait_event(fork)
            with side:
                self._scale_query(qa)
            join.record(side)
        if self.mode != "dense":
            self.estimate(layer, q_raw=qa)
            self.order(layer)
        if self._query_branch is not None:
            main.wait_event(join)
        return self.attend(layer, q_raw=qa if self._raw_query else None)

    def forget_previous(self, requests=None) -> None:
        """``first_chunk="previous"``: forget where the groups stopped, in every layer, for every request or for
        ``requests`` (batch indices), so that their next call runs the plain schedule, e.g. for a batch slot that
        now holds another request. (A stale stop never changes the rule, only where it is first tested: more or
        fewer blocks read, one call long.)

        Raises:
            ValueError: the plan's ``first_chunk`` is not ``"previous"``, or a request is out of range."""
        if self.first_chunk != "previous":
            raise ValueError(f"forget_previous needs first_chunk='previous', this plan has {self.first_chunk!r}")
        if requests is None:
            self.num_used_layers[...] = 0
            return
        for r in np.atleast_1d(np.asarray(requests)).tolist():
            self.num_used_layers[:, PagedKVCache._index(r, "request", self.cache.batch)] = 0

    def load_query(self, q, layer: int) -> int:
        """Stage 0: copy ``q`` into the plan's buffers, zero-padded: scaled (``q``, for the estimates) and
        scaled by a power of two (``q_mma``, for the decode kernel). Returns the checked layer."""
        layer, qa = self._check_query(q, layer)
        self._scale_query(qa)
        return layer

    def _check_query(self, q, layer: int) -> tuple:
        """``(layer, q)``: the checked layer and ``q`` as a CuPy array (bfloat16 as its int16 bits)."""
        c = self.cache
        qa = as_cupy_kv(q, "q", "bfloat16") if is_torch_bf16(q) else as_cupy(q, "q", dtypes=("float16", "float32"))
        if qa.shape != (c.batch, self.hq, c.head_dim):
            raise ValueError(f"q must have shape [B, Hq, D] = {(c.batch, self.hq, c.head_dim)}, got {qa.shape}")
        layer = PagedKVCache._index(layer, "layer", c.num_layers)
        empty = np.flatnonzero(c.host_lens[layer] == 0)
        if empty.size:
            raise ValueError(f"requests {empty.tolist()} have no tokens in layer {layer}; prefill them first")
        return layer, qa

    def _scale_query(self, qa) -> None:
        """``psa_scale_query`` of the checked query into ``q`` and ``q_mma`` on the current stream."""
        c = self.cache
        _kernels.scale_query(qa, self.scale, self._pow2, self.q[..., : c.head_dim], self.q_mma[..., : c.head_dim],
                             bf16_bits=qa.dtype == np.dtype(BF16_BITS))
        self._note_query(qa)

    def _note_query(self, qa) -> None:
        """The decode's view of the query's type: a bfloat16 query for a bfloat16 cache is exact once scaled by a
        power of two (one part on the tensor cores); float16 can underflow once scaled: not claimed."""
        self._q_exact = qa.dtype == np.dtype(BF16_BITS) and self.cache.dtype == "bfloat16"

    def _shape(self) -> dict:
        c = self.cache
        return dict(s=c.block_size, g=self.g, hq=self.hq, nmax=c.nmax)

    def estimate(self, layer: int, q_raw=None) -> None:
        """Stage 1: every block's estimate (and per head: min/max bounds for ``certified``, the
        estimates for ``sketch``), of the scaled ``q``, or of the caller's ``q_raw`` (checked, C-contiguous; the
        tensor cores' estimate scales it by the same float32 product). Where the plan runs stages 1 and 2 as one
        launch (``_kernels.fuses_estimate_order``: one Llama request by default), this writes the order too."""
        c = self.cache
        if self._estimate_order:
            _kernels.estimate_order(self.q if q_raw is None else q_raw, c.meta[layer], c.seq_lens[layer], self.scores,
                                    self.order_buf, d=c.dp, hkv=c.num_kv_heads, kind=c.metadata,
                                    sink_blocks=self.sink_blocks, recent_blocks=self.recent_blocks,
                                    q_scale=None if q_raw is None else self.scale, l2_first=self._l2_first_args(layer),
                                    **self._shape())
            return
        _kernels.estimate(self.q if q_raw is None else q_raw, c.meta[layer], c.lohi[layer], c.seq_lens[layer],
                          self.scores, self.bounds, d=c.dp, hkv=c.num_kv_heads, kind=c.metadata,
                          per_head=self._per_head, codes=None if c.codes is None else c.codes[layer],
                          group_scores=self._group_scores, q_scale=None if q_raw is None else self.scale,
                          **self._shape())
        if self.rank == "share" and self.g > 1:
            _kernels.share_key(self.bounds, c.seq_lens[layer], self.scores, **self._shape())

    def order(self, layer: int) -> None:
        """Stage 2: the processing order (and, for ``certified`` and ``sketch``, the suffix sums of the
        per-head values along it). Top-k needs only the first ``k`` positions: where the cost models say it is
        faster (``_kernels.topk_uses_head``: many groups and a short head), a radix select finds them and only they are
        sorted, and the positions past ``k`` keep what they held; else the full order is written (the same first
        ``k``). Where the plan allows it (``_l2_first_blocks``, when it was made), the kernel that places the blocks
        also asks the K and V of the decode's first ones into L2."""
        if self._topk_head:
            _kernels.order_head(self.scores, self.cache.seq_lens[layer], self.order_buf, s=self.cache.block_size,
                                g=self.g, nmax=self.cache.nmax, sink_blocks=self.sink_blocks,
                                recent_blocks=self.recent_blocks, head=self.k)
            return
        c = self.cache
        if not self._estimate_order:  # (else estimate() wrote the order)
            _kernels.order(self.scores, c.seq_lens[layer], self.order_buf, self.bounds, self.log_suffix,
                           sink_blocks=self.sink_blocks, recent_blocks=self.recent_blocks,
                           want_suffix=self._suffix, workspace=self.sort_workspace,
                           ordered=self.sketch_ordered, l2_first=self._l2_first_args(layer), **self._shape())
        if self._predicts_first:
            _kernels.first_chunk(self.log_suffix, self.cache.seq_lens[layer], self.first_len, s=self.cache.block_size,
                                 g=self.g, hq=self.hq, nmax=self.cache.nmax,
                                 forced=self.sink_blocks + self.recent_blocks, threshold=self.threshold)
        if self._estimates_stop:
            longest = -(-int(self.cache.host_lens[layer].max()) // self.cache.block_size)
            _kernels.estimated_stop_chunk(self.bounds, self.order_buf, self.cache.seq_lens[layer], self.first_len,
                                          s=self.cache.block_size, g=self.g, hq=self.hq, nmax=self.cache.nmax,
                                          forced=self.sink_blocks + self.recent_blocks, threshold=self.threshold,
                                          stop=self.stop, margin=self._estimated_stop_margin, blocks=longest)
        if self.speculate is not None and not self._spec_first:
            _kernels.spec_len(self.log_suffix, self.cache.seq_lens[layer], self.spec_len, self.spec_total,
                              s=self.cache.block_size, g=self.g, hq=self.hq, nmax=self.cache.nmax,
                              forced=self.sink_blocks + self.recent_blocks, threshold=self.threshold,
                              margin=self.speculate, extra=self.speculate_extra, step=self.step,
                              first_len=self.first_len, spec_items=self.spec_items, chunks=self.spec_chunks)

    def _l2_first_args(self, layer: int):
        """The order kernels' ``l2_first`` for ``layer``: ``(block_table, k_pool, v_pool, blocks)``, or None."""
        c = self.cache
        return (c.block_table[layer], c.k_pool, c.v_pool, self._l2_first) if self._l2_first else None

    def _l2_first_blocks(self) -> int:
        """Positions of each group's order whose K/V the order kernel asks into L2 (``_kernels.ORDER_L2_FIRST_MIB``):
        the decode's first chunk where the plan knows it (top-k's k; PSA's forced blocks and its first ranked chunk,
        an integer ``first_chunk`` or the step), within the MiB; 0 where off or unknown, and where a group is not a
        KV head (``gqa="per_head"``: the order kernels look a block's slot up as ``block_table[b, group]``)."""
        if not _kernels.ORDER_L2_FIRST_MIB or self.gn != self.cache.num_kv_heads:
            return 0
        if self.mode == "topk":
            first = self.k
        elif self.first_chunk is None or isinstance(self.first_chunk, int):
            first = self.sink_blocks + self.recent_blocks + (self.first_chunk or self.step)
        else:
            return 0
        c = self.cache
        return _kernels.l2_first_blocks(c.batch * c.num_kv_heads, first, c.k_pool.strides[0])

    def attend(self, layer: int, q_raw=None) -> DecodeOutput:
        """Stage 3: the progressive loop with its verifier (or top-k / dense) in one kernel, of the scaled
        ``q_mma``, or of the caller's ``q_raw`` (checked, C-contiguous, of the plan's raw-query builds: the kernel
        multiplies it by the same power of two)."""
        c = self.cache
        if self.mode == "psa":
            stop, thr, step, forced = (self.stop, self.threshold if self.threshold < 1 else 2.0, self.step,
                                       self.sink_blocks + self.recent_blocks)
        elif self.mode == "topk":
            stop, thr, step, forced = "budget", 2.0, self.k, 0
        else:
            stop, thr, step, forced = "none", 2.0, c.nmax, 0
        order = None if self.mode == "dense" else self.order_buf
        previous = self.first_chunk == "previous"
        num_used = self.num_used_layers[layer] if previous else self.num_used
        first_len = num_used if previous else self.first_len
        # the step in one launch (run() with the caller's query): the scores and the order written by the loop's build
        fused = ((c.meta[layer], self.scores, self.sink_blocks, self.recent_blocks, self.scale, c.metadata)
                 if self._fused_step and q_raw is not None else None)
        _kernels.decode(self.q, c.k_pool, c.v_pool, c.block_table[layer], c.seq_lens[layer], order, self.log_suffix,
                        self.out, num_used, self.iterations, self.reason, self.mass_estimate, d=c.dp,
                        hkv=c.num_kv_heads, stop=stop, threshold=thr, step=step, forced=forced, cluster=self.cluster,
                        warps=self.warps, version=self.version, stages=self.stages,
                        sketch=(self.sketch_ordered, self.lmass) if self.lmass is not None else None,
                        q_mma=self.q_mma, qk_scale=self.qk_scale,
                        split=None if self.partial is None else (self.splits, self.split_len, self.partial),
                        first_len=first_len, first_prev=previous, q_exact=self._q_exact, grid_group=self._grid_group,
                        q_raw=None if q_raw is None else (q_raw, self._pow2),
                        spec=None if self.speculate is None else (self.spec_len, self.spec_partial, self.istate,
                                                                  self.vstate, self.spec_chunks, self.spec_total,
                                                                  self.spec_warps, self.spec_items),
                        spec_pieces=self._spec_share, fused=fused, **self._shape())
        return DecodeOutput(self.out[..., : c.head_dim], order, num_used, self.iterations, self.reason,
                            self.mass_estimate, None if self.istate is None else self.istate[..., 3])


@requires_gpu
def plan(cache: PagedKVCache, **options) -> DecodePlan:
    """Shorthand for [`DecodePlan`][psa_fast.DecodePlan] ``(cache, **options)``."""
    return DecodePlan(cache, **options)


# --- the reference's API on GPU arrays -------------------------------------------------------------


class KVBlocks:
    """GPU twin of [`psa_ref.KVBlocks`][psa_ref.KVBlocks]: one request's KV cache in a
    [`PagedKVCache`][psa_fast.PagedKVCache]."""

    def __init__(self, cache: PagedKVCache, single_head: bool):
        self.cache = cache
        self.single_head = single_head

    @classmethod
    @requires_gpu
    def from_dense(cls, keys: Any, values: Any, *, block_size: int = 16, metadata: str = "cuboid_mean",
                   kv_layout: str | None = None, dtype: str | None = None) -> "KVBlocks":
        """Split dense keys and values into blocks on the GPU and compute their metadata.

        Args:
            keys: ``[T, D]``, or ``[Hkv, T, D]`` (``kv_layout="HND"``, the default) or ``[T, Hkv, D]``
                (``"NHD"``); a CUDA torch tensor (float16 or bfloat16) or a CuPy array (float16, or int16
                holding bfloat16 bits with ``dtype="bfloat16"``).
            values: the same shape.
            block_size: ``S >= 1``.
            metadata: ``"cuboid_mean"``, ``"minmax"``, ``"mean"`` or ``"quant3"``.
            kv_layout: ``"HND"``, ``"NHD"`` (transposed into the paged cache) or None: HND, with a
                ``KVLayoutWarning`` when 3-D keys hold more heads than tokens; the same check as
                ``psa_ref.KVBlocks.from_dense`` (``psa_ref.blocks.to_hnd``).
            dtype: the KV dtype, ``"float16"`` or ``"bfloat16"``; default: that of ``keys``.

        Raises:
            RuntimeError: no GPU (CuPy missing or no CUDA device).
        """
        import cupy

        block_size = _validate.integer(block_size, "block_size", minimum=1)
        metadata = _validate.choice(metadata, "metadata", METADATA_KINDS)
        if dtype is None:
            dtype = "bfloat16" if is_torch_bf16(keys) else "float16"
        dtype = _validate.choice(str(dtype).replace("torch.", ""), "dtype", KV_DTYPES)
        k = as_cupy_kv(keys, "keys", dtype)
        v = as_cupy_kv(values, "values", dtype)
        _validate.kv_shapes(k.shape, v.shape)
        k, v = to_hnd(k, v, kv_layout, stacklevel=4)  # 4: past this method's GPU gate, at the caller
        for name, a in (("keys", k), ("values", v)):
            bad = int(a.size - cupy.count_nonzero(cupy.isfinite(a if dtype == "float16" else kv_to_float32(a, dtype))))
            if bad:
                raise ValueError(f"{name} contains {bad} NaN or Inf value(s); every element must be finite")
        single = k.ndim == 2
        if single:
            k, v = k[None], v[None]
        cache = PagedKVCache(num_layers=1, batch=1, num_kv_heads=k.shape[0], head_dim=k.shape[2],
                             max_tokens=k.shape[1], block_size=block_size, metadata=metadata, dtype=dtype)
        cache.prefill(0, 0, cupy.ascontiguousarray(k), cupy.ascontiguousarray(v))
        return cls(cache, single)

    def __repr__(self) -> str:
        """Shapes and settings only, like ``psa_ref.KVBlocks``; reads no device memory."""
        heads = "" if self.single_head else f"Hkv={self.num_heads}, "
        return (f"psa_fast.KVBlocks({heads}T={self.num_tokens}, D={self.head_dim}, block_size={self.block_size}, "
                f"num_blocks={self.num_blocks}, metadata={self.metadata!r}, dtype={self.cache.dtype})")

    @property
    def num_heads(self) -> int:
        return self.cache.num_kv_heads

    @property
    def num_tokens(self) -> int:
        return int(self.cache.host_lens[0, 0])

    @property
    def head_dim(self) -> int:
        return self.cache.head_dim

    @property
    def block_size(self) -> int:
        return self.cache.block_size

    @property
    def metadata(self) -> str:
        return self.cache.metadata

    @property
    def num_blocks(self) -> int:
        return -(-self.num_tokens // self.block_size)


def _query(q, blocks: KVBlocks):
    """Check ``q`` against ``blocks``; return ``([1, Hq, D] cupy, single, kind)``."""
    import cupy

    if not isinstance(blocks, KVBlocks):
        raise TypeError(f"blocks must be a psa_fast.KVBlocks (see KVBlocks.from_dense), got {type(blocks).__name__}")
    kind = array_kind(q)
    if is_torch_bf16(q):
        qa = kv_to_float32(as_cupy_kv(q, "q", "bfloat16"), "bfloat16")
    else:
        qa = as_cupy(q, "q", dtypes=("float16", "float32", "float64"))
    if qa.ndim == 1:
        if not blocks.single_head:
            raise ValueError(f"q has shape {qa.shape} (one head) but the KV blocks have {blocks.num_heads} heads; "
                             "pass q as [Hq, D] for several heads")
        q2 = qa[None]
    elif qa.ndim == 2:
        q2 = qa
    else:
        raise ValueError(f"q must have shape [D] or [Hq, D], got {qa.ndim} dimensions {qa.shape}")
    if q2.shape[1] != blocks.head_dim:
        raise ValueError(f"q has head dimension {q2.shape[1]} but keys have {blocks.head_dim}")
    if q2.shape[0] == 0 or q2.shape[0] % blocks.num_heads:
        raise ValueError(f"the number of query heads ({q2.shape[0]}) must be a multiple of the number of KV heads "
                         f"({blocks.num_heads})")
    bad = int(q2.size - cupy.count_nonzero(cupy.isfinite(q2)))
    if bad:
        raise ValueError(f"q contains {bad} NaN or Inf value(s); every element must be finite")
    return q2.astype(cupy.float32)[None], qa.ndim == 1, kind


def _forced(blocks: KVBlocks, sink_blocks, recent_blocks) -> tuple[int, int]:
    """Sink and recent counts that do not overlap on this cache (the reference attends their union)."""
    sink_blocks = _validate.integer(sink_blocks, "sink_blocks", minimum=0)
    recent_blocks = _validate.integer(recent_blocks, "recent_blocks", minimum=0)
    n = blocks.num_blocks
    sink = min(sink_blocks, n)
    return sink, min(recent_blocks, n - sink)


def _exact_mass(q3, blocks: KVBlocks, scale: float, used_per_head: list[np.ndarray]) -> np.ndarray:
    """``[Hq]`` true attended mass fractions, from all logits (float64 on the GPU)."""
    import cupy

    c = blocks.cache
    t = blocks.num_tokens
    keys = kv_to_float32(c._dense_view(c.k_pool, 0, 0)[:, :t, : c.head_dim], c.dtype).astype(cupy.float64)
    hq = q3.shape[1]
    kv = np.arange(hq) // (hq // c.num_kv_heads)
    token_block = cupy.arange(t) // c.block_size
    out = np.empty(hq)
    for h in range(hq):
        logits = scale * (keys[kv[h]] @ q3[0, h].astype(cupy.float64))
        w = cupy.exp(logits - logits.max())
        mask = cupy.isin(token_block, cupy.asarray(used_per_head[h]))
        out[h] = float((w * mask).sum() / w.sum())
    return out


def _result(dec: DecodeOutput, p: DecodePlan, blocks: KVBlocks, q3, single: bool, kind: str,
            exact_mass: bool) -> AttentionResult:
    """Copy the diagnostics of a one-request run to the host and build the reference's result type."""
    import cupy

    n_used = cupy.asnumpy(dec.num_used[0])
    used = ([np.arange(blocks.num_blocks, dtype=np.int64)] * p.gn if dec.order is None else
            [cupy.asnumpy(dec.order[0, g, : n_used[g]]).astype(np.int64) for g in range(p.gn)])
    iters = cupy.asnumpy(dec.iterations[0]).astype(np.int64)
    reasons = [_kernels.REASONS[r] for r in cupy.asnumpy(dec.reason[0])]
    est = cupy.asnumpy(dec.mass_estimate[0]).astype(np.float64)
    if p.mode == "topk":
        est[:] = np.nan
    out = cupy.ascontiguousarray(dec.out[0])
    used_per_head = [used[h // p.g] for h in range(p.hq)]
    exact = _exact_mass(q3, blocks, p.scale, used_per_head) if exact_mass else None
    nb = blocks.num_blocks
    if single:
        return AttentionResult(like(out[0], kind), used[0], int(iters[0]), reasons[0], float(est[0]),
                               None if exact is None else float(exact[0]), nb)
    return AttentionResult(like(out, kind), used, iters, reasons, est, exact, nb)


@requires_gpu
def attention(q, blocks: KVBlocks, threshold: float = 0.95, *, scale: float | None = None, stop: str = DEFAULT_STOP,
              step: int | str = 1, gqa: str = "shared", sink_blocks: int = 0, recent_blocks: int = 0,
              exact_mass: bool = False, first_chunk: int | str | None = None, rank: str = "estimate",
              speculate: float | str | None = None) -> AttentionResult:
    """Progressive sparse attention on the GPU; the arguments and result of [`psa_ref.attention`][psa_ref.attention].

    ``q`` is ``[D]`` or ``[Hq, D]`` (float16/32/64 or bfloat16, CuPy or CUDA torch); ``output`` is float32 on
    the GPU, of the same array type; the other fields are on the host. ``speculate`` (GPU only) is
    [`DecodePlan`][psa_fast.DecodePlan]'s: the same blocks and decision by another schedule of the kernels.
    ``rank="share"`` runs a small kernel between the estimate and the order (not with ``stop="certified"``).
    ``step="auto"`` (GPU only) is the plan's step ([`DecodePlan`][psa_fast.DecodePlan]): how many blocks are read
    past the stop then depends on the GPU and the cache.
    """
    threshold = _validate.threshold(threshold)
    step = _validate.integer_or_auto(step, "step", minimum=1)
    q3, single, kind = _query(q, blocks)
    stop = resolve_stop(stop, blocks.cache.metadata)
    sink_blocks, recent_blocks = _forced(blocks, sink_blocks, recent_blocks)
    p = DecodePlan(blocks.cache, num_q_heads=q3.shape[1], mode="psa", threshold=threshold, stop=stop, step=step,
                   gqa=gqa, sink_blocks=sink_blocks, recent_blocks=recent_blocks, scale=scale, first_chunk=first_chunk,
                   speculate=speculate, rank=rank)
    return _result(p.run(q3), p, blocks, q3, single, kind, exact_mass)


@requires_gpu
def topk_attention(q, blocks: KVBlocks, k: int = 8, *, scale: float | None = None, gqa: str = "shared",
                   sink_blocks: int = 0, recent_blocks: int = 0, exact_mass: bool = False) -> AttentionResult:
    """Top-k block attention on the GPU; the arguments and result of
    [`psa_ref.topk_attention`][psa_ref.topk_attention]."""
    k = _validate.integer(k, "k", minimum=1)
    q3, single, kind = _query(q, blocks)
    sink_blocks, recent_blocks = _forced(blocks, sink_blocks, recent_blocks)
    if k < sink_blocks + recent_blocks:
        raise ValueError(f"k ({k}) must be at least the number of sink and recent blocks "
                         f"({sink_blocks + recent_blocks})")
    p = DecodePlan(blocks.cache, num_q_heads=q3.shape[1], mode="topk", k=k, gqa=gqa, sink_blocks=sink_blocks,
                   recent_blocks=recent_blocks, scale=scale)
    return _result(p.run(q3), p, blocks, q3, single, kind, exact_mass)


@requires_gpu
def dense_attention(q, keys, values, *, scale: float | None = None, kv_layout: str | None = None):
    """Full attention on the GPU (the paged kernel over every block);
    [`psa_ref.dense_attention`][psa_ref.dense_attention]'s arguments, ``kv_layout`` included. Returns float32 on the
    GPU, the shape of ``q``."""
    import cupy

    blocks = KVBlocks.from_dense(keys, values, block_size=16, kv_layout=kv_layout)
    q3, single, kind = _query(q, blocks)
    p = DecodePlan(blocks.cache, num_q_heads=q3.shape[1], mode="dense", scale=scale)
    out = cupy.ascontiguousarray(p.run(q3).out[0])
    return like(out[0] if single else out, kind)
