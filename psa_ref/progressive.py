"""Stage 3: progressive sparse attention (PSA, arXiv 2503.00392, Algorithm 1).

The loop walks the blocks in criticality order, ``step`` blocks per iteration, attends to
each chunk exactly, and stops at the first chunk boundary where the stop rule estimates
that the attended mass ``AS_acc`` is at least ``threshold`` of the total. The rules
differ only in how they bound the mass of the blocks not yet seen:

==============  ==============================================  ===========================
``stop``        estimated attended fraction                     unseen mass assumed to be
==============  ==============================================  ===========================
``ema``         ``AS_acc / (AS_acc + N_left * AS_ema)``         ``N_left`` blocks, each as
                                                                heavy as a moving average
                                                                of the newest blocks seen
``remaining``   ``AS_acc / (AS_acc + N_left * AS_min)``         ``N_left`` blocks, each no
                                                                heavier than the lightest
                                                                block seen
``seed``        ``AS_acc / (AS_acc + AS_min)``                  one lightest block (the
                                                                formula as printed in the
                                                                paper's listing)
``certified``   ``AS_acc / (AS_acc + sum_unseen n_j e^(ub_j-M))``  at most its min/max bound:
                                                                a guarantee, not a guess
``sketch``      ``AS_acc / (AS_acc + kappa sum_unseen p_j)``    its sketch mass ``p_j``,
                and ``p_next < lambda (AS_acc + rest)``         calibrated by ``kappa`` on
                                                                the newest ranked blocks
``sketch_avg``  as ``sketch``, with ``lambda = c / N``          as ``sketch``
==============  ==============================================  ===========================

The default, ``stop="auto"``, picks the rule by the blocks' metadata (``resolve_stop``):
``sketch_avg`` for ``metadata="quant3"``, ``ema`` for every other kind. On real attention at 32K
(Gemma 3 270M, held-out text) ``quant3`` + ``sketch_avg`` is the only pairing that keeps the tail
(worst 1% of head-queries >= 90% of the mass), reads <= 1.5x the ideal budget and beats top-k's
output error at the same budget; ``sketch_avg`` on per-block metadata reads nearly every block,
where ``ema`` is the best rule those kinds have (docs/accuracy.md, "The stop rules at 32K").

``AS_ema`` is an exponential moving average of the masses of the blocks attended, in the
order processed (forced sink/recent blocks included): it starts at the first block's mass
and each later block ``b`` moves it to ``(1 - w) AS_ema + w m_b`` with ``w = EMA_WEIGHT``
(1/8, so roughly the last eight blocks count). Unlike ``AS_min`` it forgets: one light,
mis-ranked block no longer convinces the verifier that everything unseen is negligible,
which is how ``remaining`` fails on real attention (docs/accuracy.md has the evidence).
Being a convex combination of seen masses, ``AS_ema >= AS_min``, so ``ema`` never stops
before ``remaining`` on the same order.

``stop="sketch"`` is meant for ``metadata="quant3"``, whose per-token 3-bit keys give every
block a *sketch mass* ``p_j = n_j exp(s_j - M) = sum_t exp(l~_t - M)``, with ``s_j`` the block's
estimate and ``l~_t`` the logits of the dequantised keys. After each chunk it estimates the
unseen mass as ``rest = kappa * sum_{j unseen} p_j``, where ``kappa = sum_W m_j / sum_W p_j`` is
the ratio of true to sketch mass over ``W``, the last ``SKETCH_WINDOW`` (16) *ranked* blocks
attended (forced sink/recent blocks, chosen by position, are left out of ``W``). It stops when
``AS_acc / (AS_acc + rest) >= threshold`` **and** the next block's sketch mass, not scaled by
``kappa``, is below ``SKETCH_NEXT_SHARE`` (1e-3) of ``AS_acc + rest``; never before the first
ranked block (``rest = inf`` while ``W`` is empty). Log-sum-exp-safe form:
``rest = (sum_W m_j) * exp(lse_unseen(s_j + log n_j) - lse_W(s_j + log n_j))``: the sketch
masses enter only as a ratio, so they need no running maximum and cannot overflow. With
``step > 1`` the rule is checked at chunk boundaries like the others: ``W`` counts blocks (the
chunk's blocks are folded in processing order) and ``p_next`` is the sketch mass of the first
block of the next chunk, so the estimate after a prefix does not depend on ``step``. With other
metadata kinds ``s_j`` is that kind's estimate and ``p_j = n_j exp(s_j - M)`` its implied mass:
near a block's largest logit for ``minmax`` and ``cuboid_mean``, so the share test rarely passes
and the rule reads nearly every block; for ``mean`` (the logit of the block's mean key) below the
block's true mass, so the rule stops short of ``threshold``. On the shipped trace at tau 0.95:
98-100% of the blocks read on ``cuboid_mean`` and ``minmax``, a true mass of 0.23 for the worst
1% of heads on ``mean``, where ``quant3`` reads 38-40% of the blocks for 0.95. Either way
``SketchMetadataWarning`` says so; use ``quant3``.

``stop="sketch_avg"`` is ``sketch`` with a share test relative to the *average* block: it stops
only once ``p_next < (c / N) (AS_acc + rest)``, i.e. once the next block's sketch mass is below
``c = SKETCH_AVG_SHARE`` (1/4) of the estimated mass of an average block, ``N`` the context's
blocks; the mass test, ``kappa`` and ``rest`` are those of ``sketch``. A fixed ``lambda`` binds less
and less as the context grows (at 32K an average block holds 1/2048 of the mass, half of
``lambda = 1e-3``), so ``sketch`` stops where the mass test alone says, about the oracle's
budget, and loses to top-k on output error; ``c / N`` keeps the test equally strict at every
length (``lambda`` about ``1e-3`` at 8K blocks of 16, ``1.2e-4`` at 32K). Evidence in
docs/accuracy.md ("The stop rules at 32K"). Since it only adds to the test of ``sketch``,
``sketch_avg`` never stops before ``sketch`` where ``c / N <= lambda`` (``N >= 250``).

``threshold = 1`` attends every block whatever the rule.

Schedule. The forced sink/recent blocks form the first iteration, then ``step`` ranked blocks
per iteration. ``first_chunk`` changes only where the boundaries lie, never the order or the
rule: an integer ``c`` makes the first ranked iteration ``c`` blocks long; ``"predicted"``
sizes it from the estimates, as the shortest prefix of the order whose *estimated* masses
``n_j exp(s_j)`` (forced blocks included) hold ``threshold`` of every head's estimated total
(``predicted_first_chunk``). Where the estimates predict the true masses well, most groups then
stop right after that iteration, and a GPU pays one verifier decision instead of one per
``step`` blocks; where they do not, the rule still decides at the next boundaries.
``"estimated_stop"`` (``stop="ema"`` and ``"remaining"``) sizes it from the rule itself: the
rule run on the estimated masses, block by block in processing order, first holds for every
head after some prefix; the first ranked iteration is ``ESTIMATED_STOP_MARGIN`` times that
prefix's ranked blocks, rounded up (``estimated_stop_first_chunk``). The mass-share prediction
lands well short of where ``ema`` stops (it ignores the ``N_left * AS_ema`` term): on the drawn
profiles of ``benchmarks/bench_decode.py`` at 32K it ended no group at its first decision, where
this one at a margin of 1.25 ended every group there, reading fewer blocks than the plain step
(``benchmarks/exp_first_decisions.py``, benchmarks/NOTES.md, sixtieth session).

Across decode steps (``psa_fast.DecodePlan(first_chunk="previous")``) a layer's group can size
each call's first chunk from where the same layer's group stopped at its previous call, with no
pass over the estimates: ``previous_first_chunk`` is the integer ``first_chunk`` of that call
(the previous call's ranked blocks less one ``step``, so that where nothing changed the rule
decides one step early, then where it stopped before). ``attention`` itself stays one call.
"""

from __future__ import annotations

import sys
import warnings

import numpy as np
from numpy.typing import ArrayLike

from . import _validate
from ._problem import assemble, prepare
from .blocks import KVBlocks
from .scoring import RANKS, group_rank_key, processing_order, upper_bound
from .result import AttentionResult

BLOCK_STOP_RULES = ("ema", "remaining", "seed", "certified")  # per-block metadata suffices; psa demo/eval defaults
SKETCH_RULES = ("sketch", "sketch_avg")  # meant for metadata="quant3"
STOP_RULES = BLOCK_STOP_RULES + SKETCH_RULES
AUTO_STOP = "auto"  # the default: the rule for the blocks' metadata (resolve_stop)
DEFAULT_STOP = AUTO_STOP
EMA_WEIGHT = 0.125  # weight of the newest block in AS_ema (stop="ema"); chosen in docs/accuracy.md
# first_chunk="estimated_stop": the first ranked iteration is this many times the ranked blocks after which the stop
# rule, run on the estimated block masses, first holds. 1.25 ended every group of bench_decode's drawn profiles
# (Llama 5% at 32K and 128K, per-head at 32K) at its first decision, 1.0 only 44-50% (exp_first_decisions.py); 1.1
# ends 97-100% at a slightly larger error, and at a batch's small steps reads fewer blocks than the plain loop at its
# error (benchmarks/NOTES.md, sixty-first session). Read when the first chunk is sized (estimated_stop_first_chunk
# without a margin) and when a psa_fast plan is made, so an experiment may set it for both.
ESTIMATED_STOP_MARGIN = 1.25
FIRST_CHUNK_MODES = ("predicted", "estimated_stop")
ESTIMATED_STOP_RULES = ("ema", "remaining")  # the rules that need only block masses (and their count)
SKETCH_WINDOW = 16  # ranked blocks over which stop="sketch" calibrates kappa; chosen in docs/accuracy.md
SKETCH_NEXT_SHARE = 1e-3  # stop="sketch": the next block's sketch mass must be below this share of the total
SKETCH_AVG_SHARE = 0.25  # stop="sketch_avg": ... below this share of an average block's (total / N); docs/accuracy.md


class SketchMetadataWarning(UserWarning):
    """``stop="sketch"`` or ``"sketch_avg"`` on blocks whose metadata is not ``"quant3"`` (see the module doc)."""


def warn_sketch_metadata(stop: str, metadata: str | None) -> None:
    """Warn (``SketchMetadataWarning``) where a sketch rule runs on metadata other than ``"quant3"``: its unseen
    mass then comes from per-block estimates that are not masses, and it reads nearly every block
    (``cuboid_mean``, ``minmax``) or stops short of the threshold (``mean``). The warning names the first caller
    outside ``psa_ref`` and ``psa_fast``, however deep the call that checks."""
    if stop in SKETCH_RULES and metadata is not None and metadata != "quant3":
        effect = "stops short of the threshold" if metadata == "mean" else "reads nearly every block"
        warnings.warn(f"stop={stop!r} sums quant3's per-token sketch masses; on metadata={metadata!r} it {effect}. "
                      "Build the blocks with metadata='quant3', or use stop='auto' (ema on this metadata).",
                      SketchMetadataWarning, stacklevel=_outside_stacklevel())


def _outside_stacklevel() -> int:
    """``warnings.warn``'s ``stacklevel``, called from a function of these packages, that points at the first frame
    outside them (``skip_file_prefixes`` needs Python 3.12)."""
    frame, level = sys._getframe(2), 2  # the caller of the function that warns
    while frame is not None and frame.f_globals.get("__name__", "").split(".")[0] in ("psa_ref", "psa_fast"):
        frame, level = frame.f_back, level + 1
    return level


def resolve_stop(stop: str, metadata: str) -> str:
    """The stop rule that ``stop`` names for blocks of ``metadata``.

    ``"auto"`` (the default everywhere) is ``"sketch_avg"`` for ``metadata="quant3"`` and ``"ema"``
    for the per-block kinds (see the module doc for the evidence); any rule of ``STOP_RULES`` is
    returned as given.

    Raises:
        ValueError: ``stop`` is neither ``"auto"`` nor a rule of ``STOP_RULES``.
    """
    stop = _validate.choice(stop, "stop", (AUTO_STOP,) + STOP_RULES)
    if stop != AUTO_STOP:
        return stop
    return "sketch_avg" if metadata == "quant3" else "ema"


def logsumexp(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """``log sum exp(x)`` along ``axis``; ``-inf`` for an empty or all ``-inf`` slice."""
    if x.shape[axis] == 0:
        return np.full(np.delete(x.shape, axis), -np.inf)
    top = np.max(x, axis=axis, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    with np.errstate(divide="ignore"):
        return np.squeeze(top, axis) + np.log(np.exp(x - top).sum(axis=axis))


def sketch_rest(window_mass, log_window_sketch, log_unseen_sketch) -> np.ndarray:
    """``rest = kappa * sum_unseen p_j`` of ``stop="sketch"``, elementwise, in its log-sum-exp-safe form.

    ``window_mass`` is ``sum_W m_j`` (true masses of the calibration window, relative to the
    running maximum like ``AS_acc``); ``log_window_sketch`` and ``log_unseen_sketch`` are
    ``log sum p_j`` over the window and over the unseen blocks, in any common unit (only their
    difference is used). An empty window (no ranked block attended yet) gives ``inf`` while
    blocks remain unseen, so the rule cannot hold; with nothing unseen ``rest = 0``.
    """
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        rest = np.exp(np.log(window_mass) + log_unseen_sketch - log_window_sketch)
    empty = np.isneginf(log_window_sketch)
    return np.where(empty, np.where(np.isneginf(log_unseen_sketch), 0.0, np.inf), rest)


def sketch_share(stop: str, num_blocks: int) -> float:
    """``lambda`` of the share test: ``SKETCH_NEXT_SHARE`` (``stop="sketch"``) or ``SKETCH_AVG_SHARE / N``
    (``stop="sketch_avg"``, ``N = num_blocks``, the context's blocks)."""
    return SKETCH_AVG_SHARE / num_blocks if stop == "sketch_avg" else SKETCH_NEXT_SHARE


def sketch_next_small(as_acc, rest, next_mass, share: float = SKETCH_NEXT_SHARE) -> np.ndarray:
    """The share condition of the sketch rules: ``p_next < share * (AS_acc + rest)``.

    ``next_mass`` is the next block's sketch mass relative to the same maximum as ``as_acc``
    (0 when no block is left); ``share`` is ``lambda`` ([`sketch_share`][psa_ref.progressive.sketch_share]).
    """
    with np.errstate(invalid="ignore"):
        return next_mass < share * (as_acc + rest)


def update_ema(as_ema, block_mass: np.ndarray):
    """``AS_ema`` after folding in a chunk's blocks in processing order: O(chunk) work.

    ``as_ema`` is ``[G]`` (already rescaled to the current running maximum), or None before
    the first block; ``block_mass`` is ``[G, chunk]``. Each block moves the average to
    ``(1 - w) AS_ema + w m_b``; the first block seen sets it to its own mass.
    """
    for m_b in block_mass.T:
        as_ema = m_b if as_ema is None else (1.0 - EMA_WEIGHT) * as_ema + EMA_WEIGHT * m_b
    return as_ema


def estimated_fraction(stop: str, as_acc, as_min, n_left, unseen_bound, as_ema=None) -> np.ndarray:
    """The stop rule's estimate of the attended share of the total mass, per query head.

    All masses are relative to the same running maximum, so their ratios are exact.
    ``unseen_bound`` is the estimated unseen mass for the rules that need a sum over the
    unseen blocks: ``sum_{j unseen} n_j exp(ub_j - M)`` (``certified``) or ``rest`` of
    ``sketch_rest`` (``sketch``, ``sketch_avg``, whose stop also needs ``sketch_next_small``);
    ``as_ema`` (``ema`` only) is the moving average of ``update_ema``. Works elementwise,
    so the arguments may also be arrays over many boundaries at once.
    """
    if stop == "ema":
        rest = n_left * as_ema
    elif stop == "remaining":
        rest = n_left * as_min
    elif stop == "seed":
        rest = as_min
    else:  # "certified", "sketch", "sketch_avg"
        rest = unseen_bound
    return as_acc / (as_acc + rest)


def progressive_loop(q, keys, values, blocks: KVBlocks, chunks, bound, threshold: float, stop: str, scale: float,
                     num_forced: int = 0):
    """Algorithm 1 for the query heads of one group, which share one block order.

    Args:
        q: ``[G, D]`` float64, the group's query heads.
        keys: ``[T, D]`` float64, the group's KV head.
        values: ``[T, D]`` float64.
        blocks: the [`KVBlocks`][psa_ref.KVBlocks] (for block spans and lengths).
        chunks: the processing order split into iterations (lists of block indices).
        bound: ``[G, N]`` per-token logit level of each block, scaled by its token count ``n_j``
            by the rule: the min/max bound (``stop="certified"``) or the estimate ``s_j``
            (``stop="sketch"``, ``"sketch_avg"``); else None.
        num_forced: blocks in the first chunk chosen by position (sink/recent), which
            ``stop="sketch"`` leaves out of its calibration window.

    Returns:
        ``(output [G, D], blocks_used [n], iterations, stop_reason, fraction [G])``.
    """
    # Log-sum-exp bookkeeping. Every mass is kept relative to a running maximum logit M
    # (one per query head): a block's mass is sum_t exp(l_t - M). When a chunk raises M
    # to m_new, every stored mass is multiplied by alpha = exp(M - m_new) <= 1. Nothing
    # overflows, and the ratios that the stop rules test do not depend on M.
    n_heads = q.shape[0]
    lengths = blocks.block_lengths
    m = np.full(n_heads, -np.inf)  # running maximum logit, M
    as_acc = np.zeros(n_heads)  # attended mass, AS_acc
    as_min = np.full(n_heads, np.inf)  # mass of the lightest block attended, AS_min
    as_ema = None  # moving average of the block masses attended, AS_ema (stop="ema")
    out = np.zeros((n_heads, values.shape[1]))  # attention output over the blocks attended
    seen = np.zeros(blocks.num_blocks, dtype=bool)
    if stop in SKETCH_RULES:
        share = sketch_share(stop, blocks.num_blocks)
        log_sketch = bound + np.log(lengths)  # [G, N] log p_j + M: the sketch masses up to a common factor
        window: list[tuple[int, np.ndarray]] = []  # (block, true mass [G]) of the last SKETCH_WINDOW ranked blocks

    for it, chunk in enumerate(chunks, start=1):
        # Attend to the chunk exactly: its logits, its new maximum, its per-block masses.
        logits = [scale * keys[blocks.block_slice(j)] @ q.T for j in chunk]  # each [n_j, G]
        m_new = np.maximum(m, np.max([lg.max(axis=0) for lg in logits], axis=0))
        alpha = np.exp(m - m_new)  # 0 in the first iteration, when M = -inf
        weights = [np.exp(lg - m_new) for lg in logits]
        block_mass = np.stack([w.sum(axis=0) for w in weights], axis=1)  # [G, len(chunk)]
        chunk_mass = block_mass.sum(axis=1)
        # The chunk's output times its mass, sum_t exp(l_t - m_new) v_t. It is kept
        # unnormalised: a chunk far below the running maximum may have mass 0.
        chunk_weighted = sum(w.T @ values[blocks.block_slice(j)] for w, j in zip(weights, chunk))

        # Flash-decoding merge: the two normalised outputs, each weighted by its mass.
        old_mass = as_acc * alpha
        as_acc = old_mass + chunk_mass  # > 0: the first chunk holds a logit equal to M
        out = (out * old_mass[:, None] + chunk_weighted) / as_acc[:, None]
        as_min = block_mass.min(axis=1) if it == 1 else np.minimum(as_min * alpha, block_mass.min(axis=1))
        as_ema = update_ema(None if it == 1 else as_ema * alpha, block_mass)
        m = m_new
        seen[chunk] = True
        n_left = int((~seen).sum())

        # Verifier: estimate the attended fraction and stop at the first boundary where
        # it reaches the threshold for every head of the group.
        unseen_bound = None
        if stop == "certified":
            with np.errstate(over="ignore"):  # a bound far above M makes the fraction 0, correctly
                unseen_bound = (lengths[~seen] * np.exp(bound[:, ~seen] - m[:, None])).sum(axis=1)
        next_small = True
        if stop in SKETCH_RULES:
            # kappa's window: the newest SKETCH_WINDOW ranked blocks, their masses rescaled to M like AS_acc
            window = [(j, w_mass * alpha) for j, w_mass in window]
            if it > 1 or num_forced == 0:
                window = (window + list(zip(chunk, block_mass.T)))[-SKETCH_WINDOW:]
            ids = [j for j, _ in window]
            unseen_bound = sketch_rest(sum(w_mass for _, w_mass in window) if window else np.zeros(n_heads),
                                       logsumexp(log_sketch[:, ids]), logsumexp(log_sketch[:, ~seen]))
            next_mass = 0.0
            if it < len(chunks):  # the first block of the next chunk, relative to M like AS_acc
                with np.errstate(over="ignore"):
                    next_mass = np.exp(log_sketch[:, chunks[it][0]] - m)
            next_small = sketch_next_small(as_acc, unseen_bound, next_mass, share)
        fraction = estimated_fraction(stop, as_acc, as_min, n_left, unseen_bound, as_ema)
        if n_left == 0:
            return out, np.concatenate(chunks[:it]).astype(np.int64), it, "exhausted", fraction
        if threshold < 1.0 and np.all((fraction >= threshold) & next_small):
            return out, np.concatenate(chunks[:it]).astype(np.int64), it, "threshold", fraction
    raise AssertionError("the chunks must cover every block")


def split_chunks(order: np.ndarray, num_forced: int, step: int, first: int = 0) -> list[np.ndarray]:
    """Iterations of the loop: the forced (sink/recent) blocks together first, then the first ``first``
    ranked blocks (none when 0), then ``step`` at a time."""
    head = [order[:num_forced]] if num_forced else []
    rest = order[num_forced:]
    if first and rest.size:
        head.append(rest[:first])
        rest = rest[first:]
    return head + [rest[i : i + step] for i in range(0, rest.size, step)]


def previous_first_chunk(blocks_attended: int | None, num_forced: int, step: int) -> int | None:
    """``first_chunk`` of a call whose layer's group attended ``blocks_attended`` blocks at its previous call
    (``psa_fast.DecodePlan(first_chunk="previous")``): its ranked blocks less one ``step``, or None (the plain
    schedule) before the first call or where that leaves no ranked block.

    On the real Gemma 3 layer 17 at 32K (32 captured decode steps in order, ``stop="ema"``), this takes the
    verifier's decisions per call from 4.1 to 2.1 at ``step`` 320 and from 8.7 to 2.2 at 144, for 1-4% more
    blocks read (``benchmarks/exp_previous_stop.py``). A first chunk of the previous call's full count would
    decide once, but could never shrink: the blocks read climb to the largest need seen (91% against 64%).

    Args:
        blocks_attended: the group's blocks at its previous call, forced ones included
            (``AttentionResult.blocks_used``' length; ``psa_fast.DecodeOutput.num_used``), or None.
        num_forced: the forced (sink and recent) blocks of this call, at most its blocks.
        step: the ranked blocks of every later iteration.

    Example:
        >>> previous_first_chunk(None, 2, 320) is None, previous_first_chunk(900, 2, 320)
        (True, 578)
    """
    step = _validate.integer(step, "step", minimum=1)
    num_forced = _validate.integer(num_forced, "num_forced", minimum=0)
    if blocks_attended is None:
        return None
    ranked = _validate.integer(blocks_attended, "blocks_attended", minimum=0) - num_forced - step
    return ranked if ranked >= 1 else None


def estimated_masses_in_order(scores: np.ndarray, order: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """``[G, N]``: each head's estimated block masses ``n_j exp(s_j)`` in processing order, relative to that head's
    largest (one common factor per head, so every ratio of them is exact and none overflows)."""
    log_mass = scores[:, order] + np.log(lengths[order])
    return np.exp(log_mass - log_mass.max(axis=1, keepdims=True))


def predicted_first_chunk(scores: np.ndarray, order: np.ndarray, num_forced: int, lengths: np.ndarray,
                          threshold: float) -> int:
    """``first_chunk="predicted"``: how many ranked blocks the estimates say reach ``threshold``.

    Each block's estimated mass is ``n_j exp(s_j)`` (its token count times the exponential of its
    estimate). Walking ``order`` (the forced blocks first), this is the fewest ranked blocks after
    which the prefix holds ``threshold`` of the estimated total, for every head of the group: the
    largest of the heads' counts. 0 when the forced blocks alone suffice (or ``threshold`` is 1:
    every block is read anyway, in the usual steps).

    Args:
        scores: ``[G, N]`` estimates ``s_j`` of the group's query heads.
        order: ``[N]`` the group's processing order.
        num_forced: its leading forced blocks.
        lengths: ``[N]`` tokens per block ``n_j``.
        threshold: ``tau``.
    """
    if threshold >= 1.0 or order.size == num_forced:
        return 0
    w = estimated_masses_in_order(scores, order, lengths)
    held = np.cumsum(w, axis=1) / w.sum(axis=1, keepdims=True)  # share held by each prefix
    reached = held >= threshold * (1 - 1e-12)  # tolerance: a prefix that holds exactly tau counts
    first_prefix = reached.argmax(axis=1) + 1  # prefix lengths, forced blocks included
    return int(max(0, (first_prefix - num_forced).max()))


def estimated_stop_first_chunk(scores: np.ndarray, order: np.ndarray, num_forced: int, lengths: np.ndarray,
                               threshold: float, stop: str, margin: float | None = None) -> int:
    """``first_chunk="estimated_stop"``: ``margin`` times the ranked blocks after which ``stop`` would stop if the
    estimated masses were the true ones.

    Each block's estimated mass is ``n_j exp(s_j)``. Walking ``order`` block by block (the forced blocks
    first), the rule's attended fraction is evaluated after every prefix with at least one ranked block,
    exactly as the loop evaluates it at a chunk boundary: ``AS_acc / (AS_acc + N_left * AS_ema)`` for
    ``"ema"`` (the moving average of ``update_ema`` over the prefix), with ``AS_min`` for ``"remaining"``.
    The shortest prefix where it reaches ``threshold`` for every head of the group gives ``r`` ranked
    blocks (at most all of them: the whole order always holds, ``N_left = 0``); the result is
    ``ceil(margin * r)``, at most the ranked blocks there are. 0 when ``threshold`` is 1 (every block is
    read anyway) or no block is ranked.

    Args:
        scores: ``[G, N]`` estimates ``s_j`` of the group's query heads.
        order: ``[N]`` the group's processing order.
        num_forced: its leading forced blocks.
        lengths: ``[N]`` tokens per block ``n_j``.
        threshold: ``tau``.
        stop: ``"ema"`` or ``"remaining"`` (``ESTIMATED_STOP_RULES``).
        margin: the factor on the estimated stop, ``> 0`` (``>= 1`` reads at least that prefix); the
            result is at least one ranked block. Default: ``ESTIMATED_STOP_MARGIN`` as it is at the call.

    Raises:
        ValueError: ``stop`` is another rule (they need bounds or sketches, not block masses).

    Example:
        >>> s = np.log(np.array([[8.0, 4.0, 2.0, 1.0, 0.5, 0.25, 0.125, 0.0625]]))  # one head, halving masses
        >>> # after 5 blocks: AS_acc 15.5, AS_min 0.5, 3 left: 15.5 / (15.5 + 1.5) = 0.91 (after 4: 15 / 19 = 0.79)
        >>> estimated_stop_first_chunk(s, np.arange(8), 0, np.ones(8), 0.9, "remaining", margin=1.0)
        5
    """
    stop = _validate.choice(stop, "stop", ESTIMATED_STOP_RULES)
    margin = ESTIMATED_STOP_MARGIN if margin is None else margin
    if not margin > 0:
        raise ValueError(f"margin must be > 0, got {margin!r}")
    n = order.size
    if threshold >= 1.0 or n == num_forced:
        return 0
    mass = estimated_masses_in_order(scores, order, lengths)
    acc = np.cumsum(mass, axis=1)
    if stop == "ema":
        rest_per_block = np.empty_like(mass)
        as_ema = None
        for j in range(n):
            as_ema = update_ema(as_ema, mass[:, j:j + 1])
            rest_per_block[:, j] = as_ema
    else:
        rest_per_block = np.minimum.accumulate(mass, axis=1)
    n_left = n - 1 - np.arange(n)  # after the prefix ending at position j
    fraction = acc / (acc + n_left * rest_per_block)
    holds = (fraction >= threshold).all(axis=0)
    holds[:num_forced] = False  # at least one ranked block: the first ranked iteration is never empty
    ranked = int(np.argmax(holds)) + 1 - num_forced  # holds[-1] is True: N_left = 0 there
    return min(n - num_forced, max(1, int(np.ceil(margin * ranked - 1e-9))))  # 0 would mean "step"


def attention(
    q: ArrayLike,
    blocks: KVBlocks,
    threshold: float = 0.95,
    *,
    scale: float | None = None,
    stop: str = DEFAULT_STOP,
    step: int = 1,
    gqa: str = "shared",
    sink_blocks: int = 0,
    recent_blocks: int = 0,
    exact_mass: bool = False,
    first_chunk: int | str | None = None,
    rank: str = "estimate",
) -> AttentionResult:
    """Progressive sparse attention of a decode query (Algorithm 1).

    Args:
        q: ``[D]`` for single-head ``blocks``, or ``[Hq, D]`` with ``Hq % Hkv == 0``;
            float16/32/64 (computed in float64).
        blocks: the KV cache, from [`KVBlocks.from_dense`][psa_ref.KVBlocks.from_dense].
        threshold: ``tau`` in (0, 1]: stop once the attended mass is estimated to be at
            least this share of the total. 1 attends every block.
        scale: logit scale, default ``1/sqrt(D)``.
        stop: ``"auto"`` (default: ``"sketch_avg"`` for ``quant3`` blocks, ``"ema"`` for the
            others), ``"ema"``, ``"remaining"``, ``"seed"``, ``"certified"``, ``"sketch"`` or
            ``"sketch_avg"`` (both for ``metadata="quant3"``; on other metadata they warn,
            ``SketchMetadataWarning``); see the module doc and ``docs/accuracy.md`` for the evidence
            behind the default.
        step: blocks attended per iteration (the stop rule is tested between iterations).
        gqa: ``"shared"`` (one order per KV head from the largest estimate over its query
            heads; stop when every head of the group may) or ``"per_head"``.
        sink_blocks: the first blocks, attended (with ``recent_blocks``) in a first
            iteration of their own, before any ranked block.
        recent_blocks: the last blocks, attended likewise.
        exact_mass: also compute the true attended mass fraction (``mass_exact``).
        first_chunk: the size of the first iteration of ranked blocks: None (``step``, the
            default), an integer ``>= 1``, ``"predicted"`` (the prefix whose estimated masses hold
            ``threshold``) or ``"estimated_stop"`` (``stop`` "ema" or "remaining": a margin over
            where the rule stops on the estimated masses); see the module doc. Changes where the
            rule is tested, not the order.
        rank: how a shared group ranks its blocks: ``"estimate"`` (default: the largest estimate
            over its query heads) or ``"share"`` (the largest estimated share of one head's mass,
            [`group_rank_key`][psa_ref.scoring.group_rank_key]; on Gemma 3's one KV head at 32K it
            reads ~1.3x fewer blocks for the same rule, docs/accuracy.md). No effect per head.

    Returns:
        [`AttentionResult`][psa_ref.AttentionResult]; ``output`` is softmax attention over exactly the blocks
            in ``blocks_used``.
    """
    return run_groups(progressive_loop, q, blocks, threshold, scale=scale, stop=stop, step=step, gqa=gqa,
                      sink_blocks=sink_blocks, recent_blocks=recent_blocks, exact_mass=exact_mass,
                      first_chunk=first_chunk, rank=rank)


def check_first_chunk(first_chunk, stop: str | None = None) -> int | str | None:
    """``first_chunk`` as given, after checking it: None, an integer ``>= 1``, ``"predicted"`` or
    ``"estimated_stop"``; with a resolved ``stop``, also that ``"estimated_stop"`` has a rule it can run
    on estimated masses (``ESTIMATED_STOP_RULES``)."""
    if first_chunk is None or isinstance(first_chunk, str):
        if first_chunk is None:
            return None
        first_chunk = _validate.choice(first_chunk, "first_chunk", FIRST_CHUNK_MODES)
        if first_chunk == "estimated_stop" and stop is not None and stop not in ESTIMATED_STOP_RULES:
            raise ValueError(f"first_chunk='estimated_stop' runs the stop rule on the estimated block masses: it needs "
                             f"stop in {ESTIMATED_STOP_RULES}, got stop={stop!r}")
        return first_chunk
    return _validate.integer(first_chunk, "first_chunk", minimum=1)


def first_chunk_size(first_chunk, scores: np.ndarray, order: np.ndarray, num_forced: int, lengths: np.ndarray,
                     threshold: float, stop: str) -> int:
    """The ranked blocks of the first ranked iteration for a checked ``first_chunk`` (0: ``step``) under the
    resolved rule ``stop``."""
    if first_chunk is None:
        return 0
    if first_chunk == "predicted":
        return predicted_first_chunk(scores, order, num_forced, lengths, threshold)
    if first_chunk == "estimated_stop":
        return estimated_stop_first_chunk(scores, order, num_forced, lengths, threshold, stop)
    return int(first_chunk)


def run_groups(group_fn, q, blocks: KVBlocks, threshold, *, scale, stop, step, gqa, sink_blocks, recent_blocks,
               exact_mass, first_chunk=None, rank="estimate") -> AttentionResult:
    """Check the arguments of [`attention`][psa_ref.attention], run ``group_fn`` on every selection group, pack the
    result.

    ``group_fn`` has the signature and return value of ``progressive_loop``; the
    vectorised twin [`psa_ref.sweep.attention`][psa_ref.sweep.attention] passes its own.
    """
    threshold = _validate.threshold(threshold)
    stop = resolve_stop(stop, getattr(blocks, "metadata", None))
    warn_sketch_metadata(stop, getattr(blocks, "metadata", None))
    step = _validate.integer(step, "step", minimum=1)
    first_chunk = check_first_chunk(first_chunk, stop)
    rank = _validate.choice(rank, "rank", RANKS)
    p = prepare(q, blocks, scale=scale, gqa=gqa, sink_blocks=sink_blocks, recent_blocks=recent_blocks,
                exact_mass=exact_mass)
    # the per-token logit level that "certified" and "sketch" scale by n_j (no other rule needs one)
    bound = upper_bound(p.q, blocks, p.scale) if stop == "certified" else p.scores if stop in SKETCH_RULES else None

    out = np.empty_like(p.q)
    fraction = np.empty(p.q.shape[0])
    used, iterations, reasons = [], [], []
    for grp in p.groups:
        order = processing_order(group_rank_key(p.scores[grp.q_heads], blocks.block_lengths, rank), p.forced)
        first = first_chunk_size(first_chunk, p.scores[grp.q_heads], order, p.forced.size, blocks.block_lengths,
                                 threshold, stop)
        o, u, it, why, frac = group_fn(
            p.q[grp.q_heads], blocks.keys[grp.kv_head], blocks.values[grp.kv_head], blocks,
            split_chunks(order, p.forced.size, step, first), None if bound is None else bound[grp.q_heads],
            threshold, stop, p.scale, p.forced.size,
        )
        out[grp.q_heads], fraction[grp.q_heads] = o, frac
        used.append(u)
        iterations.append(it)
        reasons.append(why)
    return assemble(p, out, used, iterations, reasons, fraction, exact_mass)
