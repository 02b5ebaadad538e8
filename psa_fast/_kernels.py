"""Compile and launch the CUDA C kernels of ``psa_fast/kernels`` through CuPy (NVRTC, sm_90 cubin).

Each kernel is compiled once per shape configuration (padded head dim, block size, heads per
group, cluster size, warps) and cached by CuPy on disk.
"""

from __future__ import annotations

import functools
import math
import re
from importlib import resources
from typing import NamedTuple

import numpy as np

STOP_CODES = {"remaining": 0, "seed": 1, "certified": 2, "none": 3, "budget": 4, "ema": 5, "sketch": 6,
              "sketch_avg": 7}
STOP_RULES = ("ema", "remaining", "seed", "certified", "sketch", "sketch_avg")  # every rule of the reference
REASONS = ("threshold", "exhausted", "budget")
KIND_CODES = {"cuboid_mean": 0, "minmax": 1, "mean": 2}  # quant3 has its own kernel (sketch.cu)
BOUND_CODES = {None: 0, "bounds": 1, "estimates": 2}  # what estimate() writes per head beside the group scores
ESTIMATE_WARPS = 8
ESTIMATE_MMA_LAUNCH = (4, 32, 16)  # estimate_mma: warps a CTA, blocks a warp (whole tiles of 16), fewest blocks a warp
# psa_estimate_mma's blocks a warp when not 0 (16, 32 or 64), in place of the rule in `estimate`: one request's
# estimate reads at ~68% of HBM at 128K, where 512 CTAs of ~3 resident an SM make 1.3 waves (a sweep, not a default)
ESTIMATE_MMA_WARP_BLOCKS = 0
# psa_estimate_mma's chunks of 32 channels whose loads a warp issues together (PSA_EST_KG; a tile has 2 D / 32 of them
# for cuboid_mean, so only D 256 sees a change from 8): 16 loads Gemma 3's whole tile at once where 8 left its second
# half one round trip behind the first (255 registers, two CTAs an SM instead of three). H200, the kernel alone, 8 ->
# 16: Gemma 3 5% 32K B = 32 23.2 -> 21.4 µs, 128K B = 8 23.2 -> 21.6, 128K B = 1 4.5 -> 4.2, 32K B = 8 7.5 -> 7.8
# (benchmarks/NOTES.md, s34f)
ESTIMATE_MMA_CHUNK_GROUP = 16


def estimate_chunk_group(heads: int) -> int:
    """The tensor cores' estimate's chunk group (``PSA_EST_KG``) for a launch of ``heads`` query heads a group, the
    same in psa_estimate_mma, psa_estimate_order and the fused step: ``ESTIMATE_MMA_CHUNK_GROUP`` at 4 heads, at most
    8 below (at D 256 a group of fewer than 4 heads spills ~100 bytes a thread with 16 chunks, ptxas; unmeasured)."""
    return ESTIMATE_MMA_CHUNK_GROUP if heads == 4 else min(8, ESTIMATE_MMA_CHUNK_GROUP)
ESTIMATE_ON_TENSOR_CORES = True  # cuboid_mean / mean groups of <= 4 heads on psa_estimate_mma (False: psa_estimate)
# 1: DecodePlan.run scales the query for the decode on a side stream beside the estimate and the order, which read the
# caller's query (psa_estimate_mma's PSA_QRAW builds); 0: psa_scale_query first, on the main stream
QUERY_BRANCH = 1
# 1: DecodePlan.run's split build (dense, top-k) reads the caller's query too (decode.cu's PSA_QRAW builds), so that no
# kernel scales it first (H100 s58c: dense -0.6 to -1.8 µs a step); 2: PSA's loop too (H100 s58c: level to +0.5 µs
# against QUERY_BRANCH's copy, one lease: to be A/B'd again); 0: the scaled copy everywhere
DECODE_RAW_QUERY = 1
QUANT3_WARPS = 4  # psa_estimate_quant3 v6 at D 256: up to 128 registers a thread, 4 CTAs an SM (ncu, NOTES.md)
# psa_estimate_quant3's blocks a warp forced (1-16; 0: the rule in `estimate`, which halves QUANT3_MAX_WARP_BLOCKS
# until the launch has two CTAs an SM). A switch for sweeps (device_pending.sh s48c).
QUANT3_WARP_BLOCKS = 0
# the rule's most blocks a warp: at Gemma 3's 32K, H100 (s48c), 4 against the earlier 16: B = 32 81.1 -> 76.5 µs (the
# rule took 16, two waves, ~83% of HBM), B = 8 24.1 -> 23.6 (it took 8, one wave), 128K B = 1 12.9 either way
QUANT3_MAX_WARP_BLOCKS = 4
ORDER_THREADS = 1024
SUFFIX_THREADS = 1024  # at most (psa_order_suffix's launch bound)
# psa_order_suffix's tiled build (suffix.cu's PSA_SUFFIX_TILED: coalesced tiles of SUFFIX_RUN blocks a thread) from
# this many blocks a group up (0: the plain build everywhere). Llama's shape on the H100, default rule, plain ->
# tiled (forty-eighth session, s42f): 128K B = 1 19.6 -> 8.4 µs, B = 8 52.7 -> 17.9; 32K (2,048 blocks) B = 1 and 8
# 4.4 -> 4.7, so it starts above 32K's blocks (between 2,048 and 8,192 unmeasured)
SUFFIX_TILED_MIN_BLOCKS = 4096
SUFFIX_RUN = 8  # suffix.cu's PSA_SUFFIX_RUN
MAX_SMEM_SORT = 16384  # largest padded block count sorted in shared memory (128 KiB of keys)


def _source(name: str) -> str:
    """Kernel source with its local headers (``#include "x.cuh"``) inlined, each once, for NVRTC."""
    folder = resources.files("psa_fast") / "kernels"
    seen: set[str] = set()

    def expand(text: str) -> str:
        out = []
        for line in text.splitlines():
            m = re.match(r'#include "(\w+\.cuh)"', line.strip())
            if m:
                if m.group(1) not in seen:
                    seen.add(m.group(1))
                    out.append(expand((folder / m.group(1)).read_text()))
            elif line.strip() != "#pragma once":
                out.append(line)
        return "\n".join(out)

    return expand((folder / name).read_text())


def kernel(name: str, *, d: int, s: int, g: int, cluster: int = 1, warps: int = 8, entry: str | None = None,
           cooperative: bool = False, **defines):
    """The kernel ``psa_<entry or name>`` of ``kernels/<name>.cu`` for one configuration (a
    ``cupy.RawKernel``, compiled at its first use, cached on disk by CuPy). ``defines`` become
    ``-DPSA_<NAME>=value``; ``cooperative`` launches it with ``cuLaunchCooperativeKernel`` (the driver refuses a grid
    whose CTAs cannot all be resident at once). Under the ``PREFERRED_CARVEOUT`` probe its carve-out is set each
    time."""
    fn = _build(name, d=d, s=s, g=g, cluster=cluster, warps=warps, entry=entry, cooperative=cooperative, **defines)
    if PREFERRED_CARVEOUT != -2:
        fn.preferred_shared_memory_carveout = PREFERRED_CARVEOUT
    return fn


@functools.lru_cache(maxsize=None)
def _build(name: str, *, d: int, s: int, g: int, cluster: int, warps: int, entry: str | None, cooperative: bool,
           **defines):
    """``kernel``'s build, compiled once a process."""
    import cupy

    options = ["-std=c++17", f"-DPSA_D={d}", f"-DPSA_S={s}", f"-DPSA_G={g}", f"-DPSA_CLUSTER={cluster}",
               f"-DPSA_WARPS={warps}"] + [f"-DPSA_{k.upper()}={int(v)}" for k, v in sorted(defines.items())]
    fn = cupy.RawKernel(_source(f"{name}.cu"), f"psa_{entry or name}", options=tuple(options),
                        **({"enable_cooperative_groups": True} if cooperative else {}))
    fn.compile()
    return fn


# Probe (s75): every kernel's preferred shared-memory carve-out (percent of the unified L1 / shared memory; -1 the
# driver's default, set explicitly), so that a step's small kernels (psa_estimate_order: ~9 KiB) ask for the
# configuration the loop's rings need (212 KiB at Llama's shape) and the SMs need not be reconfigured between them.
# -2: not set (the default; s32e-f set it on the decode kernel alone: 86 / 100 % slower at Gemma 3's small rings).
PREFERRED_CARVEOUT = -2


@functools.lru_cache(maxsize=None)
def num_sms() -> int:
    import cupy

    return int(cupy.cuda.Device().attributes["MultiProcessorCount"])


# the largest cluster pick_cluster takes: 16 (non-portable) where the GPU holds every group's cluster at once (the
# H200 holds 7 of 16 one-CTA-an-SM CTAs, 15 of 8: Gemma 3's one group runs its loop 40.2 -> 35.4 µs on 16 SMs, s27c)
MAX_CLUSTER = 16
_PROBE = 'extern "C" __global__ void psa_cluster_probe() {}'


@functools.lru_cache(maxsize=None)
def max_active_clusters(cluster: int) -> int:
    """How many clusters of ``cluster`` CTAs, one CTA an SM (the decode loop's builds take most of an SM's shared
    memory), the GPU holds at once: ``cuOccupancyMaxActiveClusters`` of an empty kernel given an SM's shared memory
    (0 where the driver refuses the size)."""
    import cupy

    from . import _driver

    fn = cupy.RawKernel(_PROBE, "psa_cluster_probe")
    fn.compile()
    smem = int(cupy.cuda.Device().attributes["MaxSharedMemoryPerBlockOptin"])
    _with_smem(fn, smem)
    allow_cluster(fn, cluster)
    n = _driver.max_active_clusters(fn.kernel.ptr, _driver.launch_config((cluster, 1, 1), 32, smem, cluster))
    return n or 0


def pick_cluster(num_groups: int) -> int:
    """CTAs per selection group: powers of two while the grid stays within the multiprocessors (1 for large
    batches, up to ``MAX_CLUSTER`` for one request), above 8 (a non-portable size) only where the GPU holds all
    ``num_groups`` clusters at once (``max_active_clusters``). Where it cannot hold them all at 8 or fewer (16
    groups of 8, 32 of 4 on the H200), the loop's plan takes the grid build instead (``pick_grid``)."""
    c = 1
    while c < MAX_CLUSTER and num_groups * c * 2 <= num_sms():
        c *= 2
    while c > 8 and max_active_clusters(c) < num_groups:
        c //= 2
    return c


# The plain loop's CTAs of a group spread over the grid instead of a cluster (decode.cu's PSA_GRID build): n > 0 up to
# n CTAs a group where pick_grid's rule holds, 0 never. Launched cooperatively (GRID_COOPERATIVE, CuPy's
# cuLaunchCooperativeKernel): the driver refuses a grid whose CTAs cannot all be resident at once, which the build's
# barrier needs (under MPS or green contexts with fewer SMs a plain launch would wait until its timer traps).
# Measured (H200, exp_step graph µs, 8 layers, both process orders; benchmarks/NOTES.md, thirtieth session, s30c and
# s30h), the grid build with its end spread over the group against clusters: Gemma 3 (one KV head, D 256) 16K B = 1
# 28.0 -> 25.1, 32K B = 1 34.8 -> 28.1, B = 2 38.6 -> 29.8, B = 4 44.3 -> 38.0, B = 8 56.9 -> 50.7, 128K B = 4 99.3 ->
# 80.4 (33 CTAs a group), B = 8 148.1 -> 109.8 (16); Llama-3.1-8B (8 KV heads, D 128, clusters of 8) one request 32K
# 33.4 -> 34.6 (slower), 64K 50.2 -> 48.8, 128K 75.9 -> 73.0; SmolLM2 (D 64) one request 32K 22.9 -> 26.2, 128K
# 39.6 -> 40.2 (slower: its 4 KiB blocks leave too little attention a CTA to pay for the barriers).
LOOP_GRID = 64
GRID_COOPERATIVE = 1
GRID_MIN_HEAD_DIM = 128  # the grid build for head dims from this up ...
GRID_MIN_CTAS = 16  # ... where a group gets at least this many CTAs ...
GRID_MIN_GAIN = 2  # ... and this many times its cluster's ...
GRID_MAX_BUSY = 0.25  # ... and either the groups' clusters would cover at most this share of the SMs and the
GRID_MIN_BLOCKS_IDLE = 1024  # cache holds this many blocks a group (16K tokens: the shortest measured) ...
GRID_MIN_GROUP_MIB = 32  # ... or a group's K and V fill this many MiB (Llama at 32K, 16 MiB: slower on the grid)
# 1: the grid build also wherever the GPU cannot hold every group's cluster at once (max_active_clusters: 30 of 4 and
# 15 of 8 on the H200, so 32 groups on clusters of 4 or 16 on clusters of 8 run their last clusters in a second wave,
# e.g. Gemma 3 32K B = 32, Llama B = 2 and 4): SMs // groups CTAs a group, every one resident
GRID_WHERE_CLUSTERS_WAIT = 1
def grid_exchange_shapes(batch: int, groups: int, ctas: int, warps: int, g: int, head_dim: int) -> tuple:
    """Shapes of the grid build's exchange buffers for ``batch`` x ``groups`` groups of ``ctas`` CTAs of ``warps``
    warps (``g`` query heads, padded head dim ``head_dim``): each iteration's CTA statistics ``xstats`` (4 a head,
    two iterations' buffers; each a 64-bit word, its float's bits under the iteration's tag, zero between launches:
    decode.cu's PSA_GRID_TAGS), the barrier's counters ``xcount`` (zero between launches: the arrivals and the CTAs
    out) and every warp's output terms ``xpart``, of the dtypes ``GRID_EXCHANGE_DTYPES``."""
    return ((batch, groups, 2, ctas, g, 4), (batch, groups, 2), (batch, groups, ctas * warps, g, head_dim + 4))


GRID_EXCHANGE_DTYPES = (np.uint64, np.uint32, np.float32)  # xstats, xcount, xpart (xstats and xcount zeroed once)


def pick_grid(num_groups: int, cluster: int, nmax: int, head_dim: int, block_bytes: int) -> int:
    """CTAs a group of the loop's grid build for ``num_groups`` groups of ``nmax`` blocks of ``block_bytes`` (K and V)
    at head dim ``head_dim`` whose clusters would be of ``cluster`` CTAs: ``min(LOOP_GRID, SMs // num_groups)`` (every
    group's CTAs resident at once, one an SM: its groups wait for all their CTAs each iteration) where that is at
    least ``GRID_MIN_CTAS`` and ``GRID_MIN_GAIN`` times the cluster, the head dim at least ``GRID_MIN_HEAD_DIM``, and
    the cache holds at least ``GRID_MIN_BLOCKS_IDLE`` blocks a group where the clusters would leave three quarters of
    the SMs idle (``GRID_MAX_BUSY``), ``GRID_MIN_GROUP_MIB`` MiB a group elsewhere; else 0 (the cluster build).
    Also, whatever the head dim and size, wherever the GPU cannot hold all ``num_groups`` clusters at once
    (``GRID_WHERE_CLUSTERS_WAIT``): there the last clusters would wait for a second wave."""
    if LOOP_GRID <= 0:
        return 0
    if GRID_WHERE_CLUSTERS_WAIT and cluster > 1 and max_active_clusters(cluster) < num_groups:
        c = min(LOOP_GRID, num_sms() // max(1, num_groups))
        return c if c > 1 else 0
    if head_dim < GRID_MIN_HEAD_DIM:
        return 0
    idle = num_groups * cluster <= GRID_MAX_BUSY * num_sms()
    if (nmax < GRID_MIN_BLOCKS_IDLE) if idle else (nmax * block_bytes < GRID_MIN_GROUP_MIB * 2**20):
        return 0
    c = min(LOOP_GRID, num_sms() // max(1, num_groups))
    return c if c >= max(GRID_MIN_CTAS, GRID_MIN_GAIN * cluster) else 0


# The loop's step (DecodePlan(step="auto")): constants from the loop clock and exp_step.py's sweeps of ema's plain loop
# on Llama-3.1-8B's shape, ideal 5%, one request (benchmarks/NOTES.md, nineteenth and twenty-fourth sessions; H200)
LOOP_ITERATION_US = 2.6  # an iteration's cost beyond its blocks (the cluster barrier, the decision, the refill) ...
LOOP_ITERATION_US_PAIRS = 3.5  # ... and with two blocks a warp, where the chunk's last pair is its tail
LOOP_SM_GBS = 45.0  # what one CTA of a group's cluster attends, GB/s (one iteration of 512 blocks over 8 CTAs)
# the copy ceiling pick_step shares over a batch's groups, GB/s: the H200's, on which the step's constants were fitted;
# 0: the card's (copy_ceiling_gbs). On the H100 the card's 3,017 moved the step at 14 batch shapes: ema level as a whole
# (geometric mean 0.999) but the default rule on Gemma 3's real layer 17 +13% / +7% at B = 8 / 32 (reading 37.5%
# where 31.2% did: fifty-fifth session, benchmarks/results_h100_s55.md), so the default stays the H200's.
COPY_CEILING_GBS = 4300.0
# ... measured device-to-device copy over the card's peak (2 x memory clock x bus width): H100 SXM 3,044 GB/s of
# 3,352 (bench_decode, fifty-third session; the card reports 2,619 MHz and 5,120 bits), H200 4,229-4,274 of ~4,800
COPY_CEILING_OF_PEAK = 0.9
STEP_SHARE = 0.25  # the share of a group's blocks the step is sized for (the busier groups' PSA budgets)
# ... and after a predicted first chunk (sketch rules), the blocks a busier group still needs: on the real Gemma 3
# layers at 32K (psa_ref, sketch_avg on quant3, step 1 after the prediction; exp_first_chunk.py --residual, fortieth
# session, CPU) 0.81% of the blocks on average and 2.72% at the 90th percentile on layer 17, 0.31% / 0.91% on layer 11,
# 0.06% / 0.19% on layer 5
PREDICTED_SHARE = 0.03


@functools.lru_cache(maxsize=None)
def card_copy_ceiling_gbs(device: int) -> float:
    """GB/s a device-to-device copy reaches on CUDA device ``device``, from its attributes: ``COPY_CEILING_OF_PEAK``
    of the peak, two transfers a memory clock over the bus (``cudaDevAttrMemoryClockRate`` in kHz,
    ``cudaDevAttrGlobalMemoryBusWidth`` in bits): ~3,020 on the H100 SXM, ~4,400 on the H200. A ValueError if the
    card does not report them (set ``COPY_CEILING_GBS`` to its measured ceiling instead)."""
    from cupy.cuda import runtime

    clock_khz = runtime.deviceGetAttribute(36, device)  # cudaDevAttrMemoryClockRate
    bus_bits = runtime.deviceGetAttribute(37, device)  # cudaDevAttrGlobalMemoryBusWidth
    if clock_khz <= 0 or bus_bits <= 0:
        raise ValueError(f"CUDA device {device} reports memory clock {clock_khz} kHz and bus width {bus_bits} bits: "
                         "set psa_fast._kernels.COPY_CEILING_GBS to its copy ceiling (GB/s)")
    return COPY_CEILING_OF_PEAK * 2 * clock_khz * 1e3 * bus_bits / 8 / 1e9


def copy_ceiling_gbs() -> float:
    """The copy ceiling ``pick_step`` divides over a batch's groups, GB/s: ``COPY_CEILING_GBS`` where it is above 0,
    else the current device's (``card_copy_ceiling_gbs``)."""
    if COPY_CEILING_GBS > 0:
        return COPY_CEILING_GBS
    from cupy.cuda import runtime

    return card_copy_ceiling_gbs(runtime.getDevice())


def spec_step(nmax: int) -> int:
    """The speculative schedule's chunk for ``nmax`` blocks a group: ``max(16, nmax / 256)``, a few blocks a warp (one
    CTA a chunk, no barrier to amortise); the runs of record's and ``DecodePlan(speculate=..., step="auto")``'s."""
    return max(16, nmax // 256)


def loop_launch(*, d: int, s: int, g: int, version: int, warps: int, stages: int | None = None) -> tuple[int, bool]:
    """The loop's decode build for a plan of ``warps`` a CTA: the warps that fit (``decode_config``) and whether
    each attends two blocks at once (``PSA_PAIR_ON`` in decode.cu: version 3, ``DECODE_PAIR``, three stages or
    more). Gemma 3's head dim 256 asks 8 warps and runs 4 of 2 stages, unpaired; Llama's 128 runs 8 of 3, paired."""
    version, warps, stages, _ = decode_config(d=d, s=s, g=g, version=version, warps=warps, stages=stages)
    return warps, bool(DECODE_PAIR) and version == 3 and stages >= 3


def pick_step(batch: int, groups: int, nmax: int, *, cluster: int, warps: int, block_bytes: int,
              speculate: bool = False, pairs: bool = False, predicted: bool = False,
              ceiling_gbs: float | None = None) -> int:
    """Blocks an iteration for ``DecodePlan(step="auto")``. The loop's step decides on the slowest group: each
    iteration costs ``LOOP_ITERATION_US`` beyond its blocks, and the last one reads up to a step past the stop,
    each block at the group's share of the bandwidth (its cluster's SMs for one request, the copy ceiling
    ``ceiling_gbs`` over every group for a batch; by default ``copy_ceiling_gbs()``: ``COPY_CEILING_GBS``, the
    H200's, or the card's where that is 0). For a group that needs ``need`` blocks the total is about ``need /
    step`` iterations plus ``step / 2`` blocks too many, least at ``step* = sqrt(2 need iteration / block)``, with
    ``need = STEP_SHARE * nmax``. The step is a whole number of blocks for every warp (two with ``pairs``, where a
    warp attends two blocks at once and an iteration costs ``LOOP_ITERATION_US_PAIRS``), the multiple below or
    above ``step*`` whose modelled cost is less, at most ``nmax`` rounded up likewise. The cost is ragged in the
    step where a rule stops at chunk boundaries: on Gemma 3's real layer 17 at B = 8 the default rule holds after
    two chunks of 320 (31.2% of the blocks, 83 µs on the H100) but needs three of 256 (37.5%, 95 µs).

    Llama's shape at an ideal 5% (exp_step.py, H200, two blocks a warp): 384 / 768 / 352 / 176 at 32K B = 1, 128K
    B = 1, 8 and 32, measured 33.6 / 88.5 / 308.4 / 1019.9 µs where the rule fitted one block a warp picked 384 /
    704 (106.7: three iterations for the busiest group where 768 takes two) / 304 (319.3) / 152 (1027.5). The
    busiest group's need, which the plan cannot see, decides between neighbours: at 128K B = 1 and ideal 2% / 10% /
    20%, 768 took 77.1 / 121.2 / 184.6 µs and 704 75.8 / 118.1 / 178.4.

    With ``predicted`` (``first_chunk="predicted"`` under a sketch rule) the first ranked chunk holds the blocks the
    estimates predict, and the step sizes only what a group needs past it, ``need = PREDICTED_SHARE * nmax``
    (from psa_ref on real layers: benchmarks/NOTES.md, fortieth session). The sketch rules stop on the same per-head
    estimates the prediction sums, so little is left; ``ema`` reads far past the prediction (Gemma 3's layer 17: 56%
    of the blocks where the prediction holds ~17%) and keeps ``STEP_SHARE``. On the H200 (forty-first session, a
    batch of different decode steps of that layer) this smaller step reads fewer blocks at a larger error than the
    plain step after the prediction: 79.5 µs, 35% of the blocks, error 0.017 at B = 8, against 95.5 µs, 43%, 0.013
    (the plain loop: 99.3 µs, 45%, 0.011); pass the plain step explicitly to keep the plain loop's error.
    With ``speculate`` the step is one speculative CTA's chunk, ``spec_step(nmax)``."""
    if speculate:
        return spec_step(nmax)
    unit = cluster * warps * (2 if pairs else 1)
    iteration_us = LOOP_ITERATION_US_PAIRS if pairs else LOOP_ITERATION_US
    ceiling = copy_ceiling_gbs() if ceiling_gbs is None else ceiling_gbs
    per_group_gbs = min(cluster * LOOP_SM_GBS, ceiling / max(1, batch * groups))
    block_us = block_bytes / per_group_gbs / 1e3
    need = max(1.0, (PREDICTED_SHARE if predicted else STEP_SHARE) * nmax)
    best = math.sqrt(2.0 * need * iteration_us / block_us)

    def cost(step: int) -> float:
        return need / step * iteration_us + step / 2 * block_us

    below = max(1, math.floor(best / unit)) * unit
    step = min((below, below + unit), key=cost)
    return min(-(-nmax // unit) * unit, step)


def resume_cluster(cluster: int, step: int, warps: int) -> int:
    """CTAs per group for the loop resumed after the speculative chunks: no more than give each warp a block
    of a chunk of ``step`` (a power of two, at most ``cluster``). Its iterations are latency-bound, one block a
    warp at most, so idle CTAs only lengthen the cluster barrier: on Gemma 3 (step 16, 4 warps at D 256) the
    resumed iteration took 7.0 µs with 4 CTAs and 10.1 with 8 (benchmarks/NOTES.md)."""
    c = 1
    while c * 2 <= cluster and c * 2 * warps <= step:
        c *= 2
    return c


def _with_smem(fn, smem: int):
    """``fn`` allowed ``smem`` bytes of dynamic shared memory (beyond the default 48 KiB when asked). A CTA's
    dynamic and static shared memory together may not pass ``SMEM_LIMIT``: the driver would refuse the setting with
    CUDA_ERROR_INVALID_VALUE (the decode kernel's grid build at D 256 holds ~6.5 KiB of static shared memory beside its
    rings: 7 warps x 2 stages, 224 KiB, fit ``decode_config``'s count but not the GPU); that is a ValueError here."""
    if fn.max_dynamic_shared_size_bytes < smem:
        static = int(fn.shared_size_bytes)
        if smem + static > SMEM_LIMIT:
            raise ValueError(f"{fn.name} needs {smem} bytes of dynamic shared memory beside its {static} static ones, "
                             f"more than the {SMEM_LIMIT} a CTA may hold: ask for fewer warps or stages")
        fn.max_dynamic_shared_size_bytes = smem
    return fn


def allow_cluster(fn, cluster: int) -> None:
    """Clusters above 8 CTAs are 'non-portable' on Hopper and must be enabled per kernel."""
    if cluster > 8:
        from cupy.cuda import driver

        driver.funcSetAttribute(fn.kernel.ptr, 14, 1)  # CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED


def estimate_on_tensor_cores(kind: str, per_head, g: int, hq: int, hkv: int, d: int, fused: bool) -> bool:
    """Whether ``estimate`` runs ``psa_estimate_mma`` for these arguments (``fused``: per-head scores of a KV
    head's query heads in one launch)."""
    launch_g = hq // hkv if fused else g
    return (ESTIMATE_ON_TENSOR_CORES and kind in ("cuboid_mean", "mean") and per_head != "bounds" and launch_g <= 4
            and (2 * d if kind == "cuboid_mean" else d) % 32 == 0)


def _fuses_heads(g: int, hq: int, hkv: int, per_head, group_scores) -> bool:
    """``estimate`` scores every query head of a KV head in one launch (per-head selection, g == 1)."""
    return g == 1 and 1 < hq // hkv <= 8 and per_head != "bounds" and group_scores is not None


def estimate_reads_raw_query(kind: str, per_head, g: int, hq: int, hkv: int, d: int, group_scores=None) -> bool:
    """Whether ``estimate(..., q_scale=...)`` takes the caller's query (the tensor cores' kernel scales it)."""
    return estimate_on_tensor_cores(kind, per_head, g, hq, hkv, d, _fuses_heads(g, hq, hkv, per_head, group_scores))


# estimate(q_scale=...), decode(q_raw=...): the caller's query's dtype -> common.cuh's PSA_QRAW
_QRAW_CODES = {np.dtype(np.float16): 1, np.dtype(np.int16): 2, np.dtype(np.float32): 3}


def _raw_query_code(q, shape: tuple, what: str) -> int:
    """PSA_QRAW for the caller's query ``q`` read by a kernel (``what``, for the message): C-contiguous ``shape``,
    float16, float32 or int16 (bfloat16 bits), starting on a pair of elements (the kernels load two at once)."""
    if (q.dtype not in _QRAW_CODES or tuple(q.shape) != tuple(shape) or not q.flags.c_contiguous
            or q.data.ptr % (2 * q.itemsize)):
        raise ValueError(f"{what} needs q as a C-contiguous {list(shape)} float16, float32 or int16 array aligned "
                         f"to two elements, got {q.dtype} {tuple(q.shape)}")
    return _QRAW_CODES[q.dtype]


def estimate(q, meta, lohi, seq_lens, scores, bounds, *, d, s, g, hq, hkv, nmax, kind, per_head=None,
             codes=None, group_scores=None, q_scale: float | None = None) -> None:
    """Launch ``psa_estimate`` (``psa_estimate_quant3`` for ``kind="quant3"``, which reads ``codes``
    where the others read ``meta``): ``scores [B, Hq/g, Nmax]`` and, if ``per_head`` is ``"bounds"``
    (min/max bounds, certified) or ``"estimates"`` (each head's estimate, sketch), ``bounds [B, Hq, Nmax]``.

    Selection per query head (``g == 1``) with several query heads per KV head: given ``group_scores``
    (``[B, Hkv, Nmax]`` float32 scratch), one launch per KV head scores all its query heads from one read of
    the summaries (the kernel's per-head output is ``scores``, the same bits as one launch per head, which
    re-read the ``quant3`` codes once per head); not for ``per_head="bounds"``.

    ``cuboid_mean`` and ``mean`` groups of at most 4 heads run on the tensor cores (``psa_estimate_mma``),
    larger groups, ``minmax`` and the certified bounds on the CUDA cores (``psa_estimate``).

    Each warp scores up to 32 (quant3: ``QUANT3_MAX_WARP_BLOCKS``) consecutive blocks (fewer when that would leave
    SMs idle; the tensor cores' version whole tiles of 16).

    ``q_scale``: ``q`` is the caller's query (``[B, Hq, d]`` C-contiguous float16, float32 or int16 bfloat16 bits),
    which ``psa_estimate_mma`` multiplies by ``q_scale`` itself (the same float32 product as ``scale_query``), so
    that the scaled copies can be written beside the estimate; only where ``estimate_reads_raw_query``."""
    b = q.shape[0]
    kv_group = hq // hkv
    fused = _fuses_heads(g, hq, hkv, per_head, group_scores)
    launch_g = kv_group if fused else g
    raw = ()
    if q_scale is not None:
        if not estimate_on_tensor_cores(kind, per_head, g, hq, hkv, d, fused):
            raise ValueError(f"estimate(q_scale=...) needs the tensor cores' estimate (cuboid_mean or mean, groups "
                             f"of at most 4 heads), got kind={kind!r}, per_head={per_head!r}, g={g}")
        raw = (np.float32(q_scale),)
        qraw = _raw_query_code(q, (b, hq, d), "estimate(q_scale=...)")
    if kind == "quant3":
        warps, per_warp, least = QUANT3_WARPS, QUANT3_MAX_WARP_BLOCKS, 1
        if QUANT3_WARP_BLOCKS:  # forced: the rule below keeps it
            if QUANT3_WARP_BLOCKS not in (1, 2, 4, 8, 16):
                raise ValueError(f"_kernels.QUANT3_WARP_BLOCKS must be 0, 1, 2, 4, 8 or 16, got {QUANT3_WARP_BLOCKS!r}")
            per_warp = least = QUANT3_WARP_BLOCKS
        make = functools.partial(kernel, "sketch", entry="estimate_quant3")
        summary = codes
    elif estimate_on_tensor_cores(kind, per_head, g, hq, hkv, d, fused):
        warps, per_warp, least = ESTIMATE_MMA_LAUNCH
        if ESTIMATE_MMA_WARP_BLOCKS:  # forced: the rule below keeps it
            if ESTIMATE_MMA_WARP_BLOCKS not in (16, 32, 64):
                raise ValueError(f"_kernels.ESTIMATE_MMA_WARP_BLOCKS must be 0, 16, 32 or 64, got "
                                 f"{ESTIMATE_MMA_WARP_BLOCKS!r}")
            per_warp = least = ESTIMATE_MMA_WARP_BLOCKS
        if ESTIMATE_MMA_CHUNK_GROUP not in (1, 2, 4, 8, 16):
            raise ValueError(f"_kernels.ESTIMATE_MMA_CHUNK_GROUP must be 1, 2, 4, 8 or 16, got "
                             f"{ESTIMATE_MMA_CHUNK_GROUP!r}")
        chunks = estimate_chunk_group(launch_g)
        make = functools.partial(kernel, "estimate_mma", kind=KIND_CODES[kind], est_kg=chunks,
                                 **({"qraw": qraw} if raw else {}))
        summary = meta
    else:
        warps, per_warp, least = ESTIMATE_WARPS, 32, 4
        make = functools.partial(kernel, "estimate", kind=KIND_CODES[kind])
        summary = meta
    while per_warp > least and b * (hq // launch_g) * -(-nmax // (warps * per_warp)) < 2 * num_sms():
        per_warp //= 2
    per_cta = warps * per_warp
    grid = ((nmax + per_cta - 1) // per_cta, hq // launch_g, b)
    if fused:  # per-head estimates into scores (the groups of per-head selection), the group maxima unused
        fn = make(d=d, s=s, g=kv_group, warps=warps, bounds=BOUND_CODES["estimates"], est_warp_blocks=per_warp)
        fn(grid, (warps * 32,), (q, summary, lohi, seq_lens, group_scores, scores, np.int32(hq), np.int32(hkv),
                                 np.int32(nmax)) + raw)
        if per_head == "estimates":
            bounds[...] = scores
        return
    fn = make(d=d, s=s, g=g, warps=warps, bounds=BOUND_CODES[per_head], est_warp_blocks=per_warp)
    fn(grid, (warps * 32,),
       (q, summary, lohi, seq_lens, scores, scores if per_head is None else bounds, np.int32(hq), np.int32(hkv),
        np.int32(nmax)) + raw)


# psa_estimate_order (estimate_order.cu): the estimate and the order in one launch where fuses_estimate_order, with this
# many warps a CTA (8: two tiles of 16 blocks a warp, 16: one); 0: off (psa_estimate_mma, then psa_order_runs). The
# same bits either way. H100, seventy-third session (s73a; benchmarks/NOTES.md), Llama 5% 32K B = 1, off / 8 / 16:
# estimate + order 11.0 / 10.9 / 10.5 µs of kernels; steps (graphs) PSA 31.6 / 31.4 / 31.1, top-k at PSA's error
# 28.35 / 27.9 / 27.4. B = 4 (32 groups) loses: 23.0 / 25.1 / 30.7 µs of kernels. Per-head 32K B = 1 level (10.1 /
# 10.2 / 10.0). On (16) since the seventy-fourth session: every GPU suite passed with it on (H100: s73's 183 and
# s74b's 217 tests, s74a's bit test 19), and s74a again: PSA's kernels 31.7 -> 31.0 µs, estimate + order 11.1 -> 10.5
ESTIMATE_ORDER = 16
ESTIMATE_ORDER_MAX_GROUPS = 8  # at most this many groups of a batch (one Llama request; 32 lost, s73a)
# 1: psa_estimate_order requests each warp's metadata rows before the request's length arrives (PSA_EO_EARLY: the CTAs
# past a request's runs score their rows too, then leave). H100, s74c: the length's read is 0.5-0.6 µs but not on
# the scoring's path (CTAs scored at 4.44 / 4.63 µs off, 4.43 / 4.41 on); the kernel -0.1 to -0.2 µs, the step
# within its spread. 0: off (the bits are the same either way)
ESTIMATE_ORDER_EARLY = 0
# 1: fuse the estimate and the order wherever psa_estimate_order applies, even where order_method prefers another
# kernel than psa_order_runs (one request of Gemma 3: one group of 2,048 blocks, psa_order_rank 3.6 µs after an
# estimate of ~5.8 on the H100, s70; the fused kernel saves that launch's gap and asks the first chunk into L2);
# 0: only where order_method picks psa_order_runs (the bits are the same either way)
ESTIMATE_ORDER_ANY_ORDER = 0
EO_CLOCK = 0  # 1: psa_estimate_order's PSA_EO_CLOCK build, each CTA's phases in eo_clocks (benchmarks/exp_eo_clock.py)
eo_clocks = None  # [B, Gn / H, R, 10] int64 of the last estimate_order launch under EO_CLOCK (estimate_order.cu)


def fuses_estimate_order(b: int, gn: int, nmax: int, *, kind: str, per_head, g: int, hq: int, hkv: int, d: int,
                         group_scores=None, workspace: bool = True) -> bool:
    """Whether a plan's estimate and order run as one launch (``estimate_order``): ``ESTIMATE_ORDER`` on, no per-head
    values beside the scores (``per_head`` None) on the tensor cores' estimate (shared groups of at most 4 heads, or
    per-head selection with at most 4 query heads a KV head), an order that ``order_method`` gives to
    ``psa_order_runs`` (at most ``RUNS_MAX_BLOCKS`` a group; any order where ``ESTIMATE_ORDER_ANY_ORDER``), and at
    most ``ESTIMATE_ORDER_MAX_GROUPS`` groups."""
    return (ESTIMATE_ORDER != 0 and per_head is None and b * gn <= ESTIMATE_ORDER_MAX_GROUPS
            and estimate_on_tensor_cores(kind, per_head, g, hq, hkv, d, _fuses_heads(g, hq, hkv, per_head,
                                                                                      group_scores))
            and nmax <= RUNS_MAX_BLOCKS
            and (ESTIMATE_ORDER_ANY_ORDER or order_method(b, gn, nmax, workspace=workspace) == "runs"))


def estimate_order(q, meta, seq_lens, scores, out_order, *, d, s, g, hq, hkv, nmax, kind, sink_blocks, recent_blocks,
                   q_scale: float | None = None, l2_first=None) -> None:
    """``psa_estimate_order``: ``estimate`` (the scores ``[B, Gn, Nmax]``) and ``order`` (``out_order [B, Gn, Nmax]``,
    method ``runs``) in one launch, the same bits as the two: a group a cluster of one CTA a run of ``RUN_BLOCKS``
    blocks (``ESTIMATE_ORDER`` warps a CTA), scoring its run, sorting it and pushing it into the cluster's other CTAs,
    each then placing its own run's blocks. Per-head selection (``g`` 1) with several query heads a KV head: a cluster
    a KV head scores all of them (as ``estimate``'s one launch a KV head) and makes each its own order. ``q_scale`` and
    ``l2_first`` as in ``estimate`` and ``order``."""
    if ESTIMATE_ORDER not in (8, 16):
        raise ValueError(f"_kernels.ESTIMATE_ORDER must be 0 (off), 8 or 16 warps a CTA, got {ESTIMATE_ORDER!r}")
    heads = hq // hkv if g == 1 else 1  # orders a cluster makes: each query head's of a KV head, or the group's
    launch_g = heads if heads > 1 else g
    if kind not in ("cuboid_mean", "mean") or launch_g > 4 or (2 * d if kind == "cuboid_mean" else d) % 32:
        raise ValueError(f"estimate_order scores on the tensor cores: cuboid_mean or mean metadata, at most 4 heads "
                         f"a launch; got kind={kind!r}, {launch_g} heads, d={d}")
    if nmax > RUNS_MAX_BLOCKS:
        raise ValueError(f"estimate_order orders up to {RUNS_MAX_BLOCKS} blocks a group (got nmax={nmax})")
    b, gn = q.shape[0], hq // g
    raw, defines = (), {}
    if q_scale is not None:
        defines["qraw"] = _raw_query_code(q, (b, hq, d), "estimate_order(q_scale=...)")
        raw = (np.float32(q_scale),)
    asks, asked = _l2_first_launch(l2_first, b, gn, nmax)  # (per-head orders: Gn = Hq, not the table's Hkv)
    defines.update(asks)
    runs = -(-nmax // RUN_BLOCKS)
    chunks = estimate_chunk_group(launch_g)
    warps = ESTIMATE_ORDER if d <= 128 else 8  # (ptxas: 16 warps' 128 registers a thread spill at D 256)
    switches = {"eo_clock": EO_CLOCK, "eo_early": ESTIMATE_ORDER_EARLY}
    defines.update({name: 1 for name, on in switches.items() if on}, **_run_swizzle())  # (off: the builds of before)
    fn = kernel("estimate_order", d=d, s=s, g=launch_g, cluster=runs, warps=warps, kind=KIND_CODES[kind],
                est_kg=chunks, bounds=BOUND_CODES["estimates" if heads > 1 else None], eo_heads=heads, **defines)
    fn((runs, hq // launch_g, b), (warps * 32,),
       (q, meta, seq_lens, scores, out_order, np.int32(hq), np.int32(hkv), np.int32(nmax), np.int32(sink_blocks),
        np.int32(recent_blocks)) + raw + asked + _clock_args("eo_clocks", EO_CLOCK, b, hq // launch_g, runs, 10))


# psa_share_key: threads a CTA (one CTA per group and request)
SHARE_THREADS = 512


def share_key(ests, seq_lens, scores, *, s, g, hq, nmax) -> None:
    """rank="share": overwrite the group scores ``[B, Hq/g, Nmax]`` with the largest estimated share of one
    head's mass (``psa_share_key``, one CTA per group and request) from each head's estimates ``ests
    [B, Hq, Nmax]`` (psa_ref.scoring.group_rank_key)."""
    b = ests.shape[0]
    fn = kernel("share", d=16, s=s, g=g, entry="share_key", share_threads=SHARE_THREADS)
    fn((hq // g, b), (SHARE_THREADS,), (ests, seq_lens, scores, np.int32(hq), np.int32(nmax)))


def _run_swizzle() -> dict:
    """The sorted runs' PSA_RUN_SWIZZLE define where ``RUN_SWIZZLE`` is on (none otherwise: the builds of before)."""
    return {"run_swizzle": 1} if RUN_SWIZZLE else {}


def _pow2(x: int, least: int) -> int:
    """The smallest power of two >= ``x``, at least ``least`` (the sorts' padded key counts)."""
    return max(least, 1 << max(0, int(x - 1).bit_length()))


# psa_merge_splits: the splits a warp loads at once (PSA_MERGE_BATCH), at most MERGE_BATCH and, where MERGE_BATCH_FIT,
# no more than the warp's share of the splits. Each slot of the batch is unrolled code: at Llama's 16 splits for one
# request a batch of 32 ran 1,290 instructions a warp for its 2 splits (ncu, s36d); fitted, the merge 3.4 -> 2.2 µs
# (s37)
MERGE_BATCH = 32
MERGE_BATCH_FIT = 1
SLICE = 1024  # keys per CTA in the two-kernel sort ...
# ... or this many (0: never) when a grid of such slices fits in one wave over the SMs (one request of long caches):
# twice the CTAs, each sorting half as long (H200, s27g: 1 x 8 x 4,096 blocks 15.7 -> 10.4 µs, 1 x 8 x 8,192 18.6
# -> 16.4; the loop's step at 64K, B = 1 54.4 -> 49.9, s27h)
SLICE_ONE_WAVE = 512
ORDER_MERGE_THREADS = 256  # psa_order_merge's CTA (<= 256), each CTA copying its group's keys to shared memory
RANK_WARPS = 8  # psa_order_rank's CTA
RANK_OWN = 1  # blocks a lane of psa_order_rank owns (PSA_RANK_OWN; 4 only in exp_order_rank.py and a test so far)
RANK_CHAIN_US = 0.0021  # order_cost_us("rank")'s latency floor a block of the group (few groups: few warps an SM)
RANK_SHORT_CHAIN = (0.0009, 1.15)  # ... and for short groups: a block's µs, less a constant (H100, s57c)
RANK_MAX_BLOCKS = 8192  # psa_order_rank holds a group's score words in shared memory (32 KiB)
RADIX_MAX_BLOCKS = 8192  # psa_order_radix keeps a group's keys in shared memory (8 bytes a block, one CTA)
RUN_BLOCKS = 256  # psa_order_runs' run (PSA_RUN): the blocks one warp sorts, and one CTA places
# 1: the sorted runs' rows swizzled in shared memory (runs.cuh PSA_RUN_SWIZZLE, psa_order_runs and
# psa_estimate_order): a warp's binary searches 4.7 -> 1.34 shared-memory wavefronts a load (CPU model). H100, s74c
# (one process, off / on): the fused kernel's placement 1.74 -> 0.95 µs (clock), psa_estimate_order 10.5 -> 9.7,
# psa_order_runs at B = 4 8.2 -> 7.2, Llama 5% 32K B = 1 PSA step 31.1 -> 30.4, top-k 27.5 -> 26.7; the bit tests
# pass; every GPU suite with it on (s75, H100, device_pending.sh s74d): 194 passed, 3 skipped and 217 passed, 6
# skipped. On since s75 (0: the layout of before)
RUN_SWIZZLE = 1
RUNS_MAX_BLOCKS = 8 * RUN_BLOCKS  # psa_order_runs: a group's words in at most 8 runs, one a warp of each CTA
# order_method weighs psa_order_runs (1) or leaves it to callers who name it (0: the methods before the fifty-seventh
# session; a switch for A/Bs)
ORDER_RUNS = 1
ORDER_METHODS = ("rank", "sort", "slices", "radix", "runs")


def order_cost_us(method: str, b: int, gn: int, nmax: int) -> float:
    """In-graph µs of ordering ``b x gn`` groups of ``nmax`` blocks, fitted to ``exp_order_rank.py`` on the H200
    (benchmarks/NOTES.md, eighteenth and nineteenth sessions): counting (``rank``) ~3 µs plus 7.5 M comparisons a
    µs (the integer ALU pipe's rate), or where few groups leave the SMs with few warps, the chain of one CTA's count
    over a group's words (convex: ``RANK_SHORT_CHAIN``, 0.0009 µs a block less 1.15, or ``RANK_CHAIN_US`` a block
    less 3.9 where more; 3.7 µs for one group of 2,048 on the H100 since its scores load in batches, fifty-seventh
    session; 7.5 and 16.3 for one of 4,096 and 8,192 on the H200, twenty-ninth and thirty-first);
    one CTA's bitonic sort ~0.0095 µs a padded block, a wave of CTAs at a time; its radix passes ~5 µs plus 0.0027
    a padded block, as many rounds as groups an SM; slices + merge ~12.8 µs plus 0.00068 a padded block
    (twenty-sixth session's merge: 15.6 µs at 4,096, 18.4 at 8,192), its ``npad / SLICE`` CTAs a group in waves;
    with slices of ``SLICE_ONE_WAVE`` keys (one wave by construction; the merge searching in shared memory, fitted
    to twelve shapes of the thirty-first session within 0.62 µs: one group 6.8, 7.9, 10.7 and 15.9 µs at 2,048 to
    16,384 blocks, eight groups 7.1, 8.0 and 12.6 at 2,048 to 8,192) ~5.5 µs plus 0.00052 a padded block of a
    group, ~0.53 µs for each further batch of eight slices the merge searches, and 0.000025 a padded block of all
    groups. ``runs`` (``psa_order_runs``, a CTA for each run of ``RUN_BLOCKS`` blocks, each sorting all of its
    group's runs), fitted to sixteen shapes of the fifty-seventh session's H100 (within 0.3 µs at eleven, 0.5-1.3 at
    the others): ~2.7 µs plus 0.0008 a block of a group and 0.004 a CTA up to one an SM, and 2.5 for each further
    wave of one CTA an SM (4.3, 4.7 and 7.5 µs for 1, 8 and 32 groups of 2,048)."""
    npad = _pow2(nmax, 2)
    waves = -(-b * gn // num_sms())
    if method == "runs":
        ctas = b * gn * -(-nmax // RUN_BLOCKS)
        return 2.7 + 0.0008 * nmax + 0.004 * min(ctas, num_sms()) + 2.5 * (-(-ctas // num_sms()) - 1)
    if method == "rank":  # (a CTA's count over every word is a latency chain: one group of 8,192 takes 16.3 µs)
        slope, less = RANK_SHORT_CHAIN
        return 3.0 + max(b * gn * nmax * nmax / 7.5e6, slope * nmax - less, RANK_CHAIN_US * nmax - 3.9)
    if method == "sort":
        return 0.0095 * max(npad, 32) * waves
    if method == "radix":
        return (5.0 + 0.0027 * max(npad, 32)) * waves
    sl = slice_keys(b, gn, npad)
    if sl != SLICE:
        return 5.53 + 0.00052 * npad + 0.53 * (-(-npad // (8 * sl)) - 1) + 2.5e-5 * b * gn * npad
    return (12.8 + 0.00068 * npad) * -(-b * gn * max(1, npad // SLICE) // num_sms())


def slice_keys(b: int, gn: int, npad: int) -> int:
    """Keys a CTA sorts in the two-kernel sort of ``b x gn`` groups of ``npad`` padded blocks: ``SLICE_ONE_WAVE``
    where its slices of all groups fit in one wave over the SMs and split a group, else ``SLICE``."""
    one = SLICE_ONE_WAVE
    if one and npad > one and b * gn * (npad // one) <= num_sms():
        return one
    return SLICE


def order_method(b: int, gn: int, nmax: int, *, workspace: bool = True) -> str:
    """How ``order`` orders ``b x gn`` groups of up to ``nmax`` blocks: the method ``order_cost_us`` says is
    fastest among those that apply. ``"rank"`` (``psa_order_rank``: each block's position counted over many
    CTAs) up to ``RANK_MAX_BLOCKS`` a group: one request, or a few at 32K; ``"radix"`` (``psa_order_radix``, one
    CTA a group, up to ``RADIX_MAX_BLOCKS``): batches, and long caches once there are a few groups an SM;
    ``"runs"`` (``psa_order_runs``: runs of 256 sorted by warps and merged by binary search in one launch, up to
    ``RUNS_MAX_BLOCKS`` a group, where ``ORDER_RUNS``): a few to some tens of groups of up to 2,048 blocks;
    ``"slices"`` (``psa_order_slice`` + ``psa_order_merge``, given a ``workspace`` and more blocks than a slice):
    one or few requests of long caches; ``"sort"`` (``psa_order``, one CTA's bitonic sort): short groups,
    many of them."""
    npad = _pow2(nmax, 2)
    methods = ["sort"]
    if npad > slice_keys(b, gn, npad) and workspace:
        methods.append("slices")
    if npad <= RADIX_MAX_BLOCKS:
        methods.append("radix")
    if nmax <= RANK_MAX_BLOCKS:
        methods.append("rank")
    if ORDER_RUNS and nmax <= RUNS_MAX_BLOCKS:
        methods.append("runs")
    return min(methods, key=lambda m: order_cost_us(m, b, gn, nmax))


# MiB of K/V that psa_order_runs asks into L2 as it places the blocks of each group's first chunk (the step's first
# blocks to be attended: forced + the first ranked chunk, or top-k's k), all groups together, where a batch has at
# most ORDER_L2_FIRST_MAX_GROUPS groups; 0: none (order_runs.cu's PSA_L2_FIRST, l2_first_blocks). The decode's first
# copies then find their tiles in L2. H200, seventieth session (benchmarks/NOTES.md), Llama 5% 32K B = 1: psa_decode
# 17.5 -> 16.7 µs and psa_order_runs 5.3 -> 5.4 at 2 MiB (at 16 MiB 16.3 and 6.1: the order kernel pays for every
# tile asked, the decode gains little past each warp's first blocks); steps (graphs) 29.4 -> 29.0, top-k at PSA's
# error 26.0 -> 25.8, B = 4 62.3 -> 61.5; B = 8 (64 groups) 90.2 -> 91.1, hence the limit.
ORDER_L2_FIRST_MIB = 2
ORDER_L2_FIRST_MAX_GROUPS = 32
# 1: psa_order_rank and psa_order_merge ask too (one request of Gemma 3, Llama at 128K); 0: psa_order_runs only. H100,
# seventieth session (kernels, 0 -> 1): Gemma 3 5% 32K B = 1 decode 14.85 -> 14.4 but psa_order_rank 3.6 -> 4.2 (sum
# level), Llama 5% 128K B = 1 decode 51.9 -> 51.4 and psa_order_merge 8.8 -> 9.1 (sum -0.45): off.
ORDER_L2_FIRST_ALL = 0


def l2_first_blocks(groups: int, first: int, tile_bytes: int) -> int:
    """Positions of each of ``groups`` groups' orders whose K and V tiles (``tile_bytes`` each) psa_order_runs asks
    into L2: the first chunk's ``first`` blocks, at most ``ORDER_L2_FIRST_MIB`` MiB for all groups; 0: none, or more
    than ``ORDER_L2_FIRST_MAX_GROUPS`` groups."""
    if groups > ORDER_L2_FIRST_MAX_GROUPS:
        return 0
    cap = int(ORDER_L2_FIRST_MIB * 2**20) // max(1, 2 * tile_bytes * groups)
    return max(0, min(first, cap))


def _l2_first_launch(l2_first, b: int, gn: int, nmax: int) -> tuple[dict, tuple]:
    """A placing kernel's PSA_L2_FIRST define and its arguments after the kernel's own for ``l2_first`` =
    ``(block_table, k_pool, v_pool, blocks)`` (``({}, ())`` where None or no blocks). The kernels find a block's slot as
    ``table[b, group, block]``, so a table that is not ``[B, Gn, Nmax]`` (per-head groups over a KV head's table) is a
    ValueError."""
    if l2_first is None or l2_first[3] <= 0:
        return {}, ()
    table, k_pool, v_pool, blocks = l2_first
    if tuple(table.shape) != (b, gn, nmax):
        raise ValueError(f"l2_first's block table must have shape [B, Gn, Nmax] = {(b, gn, nmax)}, a group a KV "
                         f"head (gqa='shared'), got {tuple(table.shape)}")
    return {"l2_first": 1}, (table, k_pool, v_pool, np.uint32(k_pool.strides[0]), np.int32(blocks))


def order(scores, seq_lens, out_order, bounds, log_suffix, *, s, g, hq, nmax, sink_blocks, recent_blocks,
          want_suffix, workspace=None, ordered=None, method=None, l2_first=None) -> None:
    """The processing order ``[B, Gn, Nmax]`` and, if ``want_suffix``, the suffix log-sum-exp of the
    per-head ``bounds`` along it (``log_suffix [B, Hq, Nmax + 1]``, ``psa_order_suffix``), and with ``ordered``
    (``[B, Hq, Nmax]``) the summed terms themselves by position, ``log n_j + bounds_j`` (the sketch rules' window
    sums read them).

    Five kernels give the same order (``order_method`` picks the fastest when ``method`` is None): short
    orders count each block's position (``psa_order_rank``) or sort runs of 256 blocks and place each block by
    binary search in them (``psa_order_runs``); one CTA a group sorts its keys by radix passes
    (``psa_order_radix``) or by bitonic merges (``psa_order``); or a group is split: ``psa_order_slice`` sorts
    slices of ``slice_keys`` blocks on many CTAs into ``workspace`` (``[B, Gn, npad]`` uint64) and
    ``psa_order_merge`` places every key at its rank.

    ``l2_first`` = ``(block_table, k_pool, v_pool, blocks)``: the kernel that places the blocks (``psa_order_runs``,
    ``psa_order_rank``, ``psa_order_merge``; the one-CTA sorts ignore it) asks the K and V tiles of those at positions
    below ``blocks`` into L2 (the decode's first chunk)."""
    b, gn, _ = scores.shape
    npad = _pow2(nmax, 2)
    method = method or order_method(b, gn, nmax, workspace=workspace is not None)
    if method not in ORDER_METHODS:
        raise ValueError(f"method must be one of {ORDER_METHODS} or None, got {method!r}")
    if method == "slices":
        if workspace is None:
            raise ValueError(f"method='slices' needs a workspace (order_workspace_shape) for nmax={nmax}")
        sl = slice_keys(b, gn, npad)
        if npad <= sl:
            raise ValueError(f"method='slices' needs more than {sl} blocks a group (got nmax={nmax})")
    if method == "rank" and nmax > RANK_MAX_BLOCKS:
        raise ValueError(f"method='rank' orders up to {RANK_MAX_BLOCKS} blocks a group (got nmax={nmax})")
    if method == "radix" and npad > RADIX_MAX_BLOCKS:
        raise ValueError(f"method='radix' orders up to {RADIX_MAX_BLOCKS} blocks a group (got nmax={nmax})")
    if method == "runs" and nmax > RUNS_MAX_BLOCKS:
        raise ValueError(f"method='runs' orders up to {RUNS_MAX_BLOCKS} blocks a group (got nmax={nmax})")
    if method != "rank" and npad > MAX_SMEM_SORT:
        raise NotImplementedError(f"ordering more than {MAX_SMEM_SORT} blocks per head is not implemented yet "
                                  f"(got {nmax}); use a larger block_size")
    # the placing kernels' PSA_L2_FIRST: its define and its arguments after theirs
    placing = ("runs", "rank", "slices") if ORDER_L2_FIRST_ALL else ("runs",)
    asks, asked = _l2_first_launch(l2_first, b, gn, nmax) if method in placing else ({}, ())
    if method == "rank":
        tiles = -(-nmax // 32)
        kernel("order_rank", d=16, s=s, g=g, warps=RANK_WARPS, rank_own=RANK_OWN, **asks)(
            (-(-tiles // RANK_OWN), gn, b), (RANK_WARPS * 32,),
            (scores, seq_lens, out_order, np.int32(nmax), np.int32(sink_blocks), np.int32(recent_blocks)) + asked,
            shared_mem=tiles * 128)
    elif method == "runs":  # a CTA a run of the longest group, each of its warps sorting one of the group's runs
        kernel("order_runs", d=16, s=s, g=g, warps=RUN_BLOCKS // 32, **asks, **_run_swizzle())(
            (-(-nmax // RUN_BLOCKS), gn, b), (RUN_BLOCKS,),
            (scores, seq_lens, out_order, np.int32(nmax), np.int32(sink_blocks), np.int32(recent_blocks)) + asked)
    elif method == "radix":
        sn = max(npad, 32)
        threads = min(ORDER_THREADS, sn)
        fn = kernel("order_radix", d=16, s=s, g=g, npad=npad)
        smem = sn * 8 + 1024 * (threads // 32 + 1)  # the keys, then a count for every (digit, warp), padded
        _with_smem(fn, smem)
        fn((gn, b), (threads,), (scores, seq_lens, out_order, np.int32(nmax), np.int32(sink_blocks),
                                 np.int32(recent_blocks)), shared_mem=smem)
    elif method == "slices":
        p = npad // sl
        fn = kernel("order_slice", d=16, s=s, g=g, npad=sl)
        fn((p, gn, b), (sl,), (scores, seq_lens, workspace, np.int32(nmax), np.int32(sink_blocks),
                               np.int32(recent_blocks)), shared_mem=sl * 8)
        merge = _with_smem(kernel("order_merge", d=16, s=s, g=g, **asks), npad * 8)  # the group's keys
        t = ORDER_MERGE_THREADS
        # a thread a padded key (npad >= nmax, so they also write the -1s past each group's blocks)
        merge((-(-npad // t), gn, b), (t,), (workspace, seq_lens, out_order, np.int32(nmax), np.int32(p),
                                             np.int32(sl)) + asked, shared_mem=npad * 8)
    else:
        sn = max(npad, 32)
        threads = min(ORDER_THREADS, sn)
        fn = kernel("order", d=16, s=s, g=g, npad=npad)
        smem = sn * 8
        _with_smem(fn, smem)
        fn((gn, b), (threads,), (scores, seq_lens, out_order, np.int32(nmax), np.int32(sink_blocks),
                                 np.int32(recent_blocks)), shared_mem=smem)
    if want_suffix:
        suffix(out_order, seq_lens, bounds, log_suffix, s=s, g=g, hq=hq, nmax=nmax, ordered=ordered)


def suffix(order_arr, seq_lens, vals, log_suffix, *, s, g, hq, nmax, ordered=None) -> None:
    """``psa_order_suffix``: for every (request, query head) the suffix log-sum-exp along the group's processing order
    ``order_arr [B, Hq / g, Nmax]`` of ``x_i = vals[b, h, j] + log n_j`` (``j = order[i]``, ``n_j`` the block's tokens
    of ``seq_lens [B]``): ``log_suffix [B, Hq, Nmax + 1]`` float32, ``-inf`` from each request's block count on; with
    ``ordered`` (``[B, Hq, Nmax]``) the terms ``x_i`` themselves by position."""
    b = seq_lens.shape[0]
    tiled = 0 < SUFFIX_TILED_MIN_BLOCKS <= nmax
    per = SUFFIX_RUN if tiled else 1  # blocks a thread (of a tile, tiled)
    threads = min(SUFFIX_THREADS, max(32, -(-nmax // (32 * per)) * 32))
    kernel("suffix", d=16, s=s, g=g, entry="order_suffix", suffix_tiled=int(tiled))((hq, b), (threads,), (
        order_arr, seq_lens, vals, log_suffix, np.int32(hq), np.int32(nmax),
        np.uint64(0) if ordered is None else ordered))


SELECT_THREADS = 1024  # psa_order_head's CTA
SELECT_RANK_MAX = 512  # psa_order_head orders heads up to this many keys by counting, larger ones by a bitonic sort


def head_cost_us(b: int, gn: int, nmax: int, head: int) -> float:
    """In-graph µs of ``order_head`` (``psa_order_head``, one CTA a group, a wave of them at a time) for the first
    ``head`` positions of ``b x gn`` groups of ``nmax`` blocks, fitted to exp_topk_order.py on the H100 (fifty-ninth
    session, ``results_h100_s59c_topk_*.md``): ~4.9 µs plus 0.00093 a padded block of the group (its radix passes
    over every key), plus the head's order: counted, ~2.9e-5 µs times the head's keys squared (each thread counts
    ``head^2 / 1024`` comparisons), up to ``SELECT_RANK_MAX`` keys; one CTA's bitonic sort, ~0.0075 µs a padded key,
    above. At 2,048 blocks: 6.8-6.9 µs at k = 64, 11.7 at 410, 13.4-14.4 at 640, 21.8-23.0 at 1,280; at 8,192: 17.4 at
    410, 28.8 at 1,638, 35.9 for two waves (the model: 6.9, 11.7, 14.5, 22.2; 17.4, 27.9, 34.8). The H200's times it
    was first fitted to (exp_select.py's v3) are within 11% of it."""
    k = min(head, nmax)
    order = 2.9e-5 * k * k if k <= SELECT_RANK_MAX else 0.0075 * _pow2(k, SELECT_THREADS)
    return (4.9 + 0.00093 * _pow2(nmax, SELECT_THREADS) + order) * -(-b * gn // num_sms())


def topk_uses_head(b: int, gn: int, nmax: int, head: int, *, workspace: bool = True) -> bool:
    """Whether top-k's order stage takes ``order_head`` (select the head, sort only it) rather than the full
    processing order (``order``, whose first ``head`` positions are the same): whichever the cost models say is
    faster. The full order's methods got faster than the select (one group of 2,048 counted in 3.7 µs on the H100,
    where the select takes ~7), and the select's bitonic sort of a head over 512 keys runs on one CTA a group. On the
    H100 (fifty-ninth session, random K/V and scores, top-k's whole step with the select / the full order): Gemma 3
    at 32K k = 1,280 44.9 / 26.2 µs at B = 1, 98.8 / 80.6 at B = 8; Llama at 32K B = 1 k = 410 34.0 / 26.8. The
    select stays where it pays: many groups and a short head (Llama 32K B = 8 k = 102 59.6 / 62.5, 128K B = 8 k = 410:
    the order 17.5 / 27.2), where the full order is a radix sort a group; the models chose the faster of the two at
    all 24 shapes measured (tests/test_bench_decode.py)."""
    if _pow2(nmax, SELECT_THREADS) > MAX_SMEM_SORT:
        return False
    full = order_method(b, gn, nmax, workspace=workspace)
    return head_cost_us(b, gn, nmax, head) < order_cost_us(full, b, gn, nmax)


def order_head(scores, seq_lens, out_order, *, s, g, nmax, sink_blocks, recent_blocks, head) -> None:
    """The first ``min(head, n)`` positions of the processing order ``[B, Gn, Nmax]`` (what
    ``order`` writes there), by a radix select of the head and a sort of only its keys
    (``psa_order_head``, one CTA per group). Positions past the head are left untouched."""
    b, gn, _ = scores.shape
    npad_n = _pow2(nmax, SELECT_THREADS)
    if npad_n > MAX_SMEM_SORT:
        raise NotImplementedError(f"selecting among more than {MAX_SMEM_SORT} blocks per head is not implemented "
                                  f"yet (got {nmax}); use a larger block_size")
    npad = _pow2(min(head, nmax), SELECT_THREADS)
    fn = kernel("select", d=16, s=s, g=g, npad=npad, npad_n=npad_n, entry="order_head")
    smem = npad * 8
    _with_smem(fn, smem)
    fn((gn, b), (SELECT_THREADS,), (scores, seq_lens, out_order, np.int32(nmax), np.int32(sink_blocks),
                                    np.int32(recent_blocks), np.int32(head)), shared_mem=smem)


def order_workspace_shape(batch: int, groups: int, nmax: int) -> tuple[int, int, int] | None:
    """Shape of the uint64 workspace the two-kernel sort needs, or None when one CTA per group sorts."""
    npad = _pow2(nmax, 2)
    return (batch, groups, npad) if npad > slice_keys(batch, groups, npad) else None


DECODE_STAGES = 3  # cp.async ring depth per warp (decode v2, v3)
SMEM_LIMIT = 227 * 1024
DECODE_VERSION = 3
DECODE_PAIR = 1  # 1: a decode warp attends two blocks of a chunk at once where it has two (PSA_PAIR, decode.cu)
# 1: the loop builds on clusters exchange each decision's CTA totals, and the finish's terms where they fit 16 KiB of
# rank 0's shared memory, by st.async pushes counted on mbarriers instead of cluster barriers and remote reads
# (PSA_PUSH, decode.cu; no MEMBAR.ALL.GPU in those builds). The same bits. Only where the receiving buffers fit beside
# the build's rings (push_fits). H100, sixty-ninth session (psa_decode µs, off -> on): Llama 5% 32K B = 1 21.6 -> 20.0,
# per-head 32K B = 1 32.1 -> 30.6, SmolLM2 32K B = 1 14.0 -> 12.5, Llama 128K B = 8 234.7 -> 231.5; the grid build
# (Llama 128K B = 1) has no cluster barrier and is unchanged (benchmarks/NOTES.md, sixty-ninth session). On since the
# seventieth, after every GPU suite ran with it; 0: cluster_sync and remote reads, as before.
DECODE_PUSH = 1
PUSH_FINISH_BYTES = 16384  # decode.cu's PSA_PUSH_FINISH_BYTES: rank 0's finish buffers, at most
STATIC_SMEM_RESERVE = 4096  # the loop builds' other static shared memory (3,072 bytes at Llama's shape), rounded up


def push_fits(*, cluster: int, g: int, d: int, smem: int) -> bool:
    """Whether a loop build on clusters of ``cluster`` CTAs (``g`` query heads a group, head dim ``d``, ``smem`` bytes
    of rings) can take the push exchanges (``DECODE_PUSH``): its static buffers (each decision's CTA totals by parity
    and rank, and rank 0's finish buffers where they fit ``PUSH_FINISH_BYTES``) beside the rings and the build's other
    static shared memory within ``SMEM_LIMIT``. Llama-3.1-8B's shape (clusters of 8, G 4, D 128, 192 KiB of rings):
    17.5 KiB more, 212 KiB in all."""
    if cluster < 2:
        return False
    finish = cluster * g * d * 4
    pushed = 2 * cluster * g * 16 + (finish + cluster * g * 8 if finish <= PUSH_FINISH_BYTES else 0)
    return smem + pushed + STATIC_SMEM_RESERVE <= SMEM_LIMIT
# The largest (padded) head dimension whose decode builds load each warp's order and block-table entries a window
# of 32 ahead by its lanes (PSA_STREAM_WINDOW, decode.cu); 0: none. On the H200 the window took Llama's one-request
# loop at 128K from 81.5 to 78.6 µs but made Gemma 3's D 256 builds (4 warps, more registers) 1-2 µs slower
# (benchmarks/NOTES.md, twenty-sixth session).
DECODE_STREAM_WINDOW = 128
SPEC_VERIFY_THREADS = 1024  # psa_spec_verify's CTA (PSA_VERIFY_THREADS in spec.cu)


def decode_config(*, d: int, s: int, g: int, version: int, warps: int = 8,
                  stages: int | None = None) -> tuple[int, int, int, int]:
    """``(version, warps, stages, dynamic shared memory)`` that fit the GPU for this shape.

    Version 3 (tensor cores) takes at most 8 query heads per group; larger groups use version 2
    (CUDA cores, any group size; stop rules remaining, seed and certified)."""
    if version == 3 and g > 8:
        version = 2
    sp = -(-s // 16) * 16 if version == 3 else s
    stages = stages or DECODE_STAGES
    while True:
        smem = max(warps * stages * 2 * sp * d * 2, warps * g * d * 4)
        if smem <= SMEM_LIMIT or (stages == 2 and warps == 1):
            break
        if stages > 2:
            stages -= 1
        else:
            warps //= 2
    if smem > SMEM_LIMIT:
        raise NotImplementedError(f"decode needs {smem} bytes of shared memory at S={s}, D={d}")
    return version, warps, stages, smem


@functools.lru_cache(maxsize=None)
def _scale_query_kernel():
    import cupy

    return cupy.ElementwiseKernel("T x, float32 s, float32 p", "float32 a, float32 b",
                                  "a = (float)x * s; b = (float)x * p;", "psa_scale_query")


@functools.lru_cache(maxsize=None)
def _scale_query_bf16_kernel():
    import cupy

    return cupy.ElementwiseKernel("int16 x, float32 s, float32 p", "float32 a, float32 b",
                                  "const float f = __int_as_float(((int)(unsigned short)x) << 16); "
                                  "a = f * s; b = f * p;",
                                  "psa_scale_query_bf16")


def scale_query(q, scale: float, pow2: float, out_scaled, out_pow2, *, bf16_bits: bool = False) -> None:
    """One launch: ``out_scaled = q * scale`` (float32 products) and ``out_pow2 = q * pow2`` (exact).
    ``bf16_bits``: ``q`` is int16 holding bfloat16 bits."""
    fn = _scale_query_bf16_kernel() if bf16_bits else _scale_query_kernel()
    fn(q, np.float32(scale), np.float32(pow2), out_scaled, out_pow2)


VERIFY_CLOCK = 0  # 1: psa_spec_verify's PSA_VERIFY_CLOCK build, its phases' cycles in verify_clocks (exp_verify_clock)
verify_clocks = None  # [B, Gn, 8] int64 of the last speculative step under VERIFY_CLOCK (spec.cu)
LOOP_CLOCK = 0  # 1: the loop builds (plain, resumed, grid) with PSA_LOOP_CLOCK, their phases' cycles in loop_clocks
loop_clocks = None  # [B, Gn, 18] int64 of the last loop launch under LOOP_CLOCK (decode.cu)


def _clock_args(name: str, enabled: int, *shape: int) -> tuple:
    """Under a clock flag (``LOOP_CLOCK``, ``VERIFY_CLOCK``, ``EO_CLOCK``): an int64 array of ``shape`` (``[B, Gn,
    words]``, ``eo_clocks``' ``[B, Gn / H, R, 10]``), kept as the module's ``name`` (``loop_clocks``,
    ``verify_clocks``, ``eo_clocks``) for the caller to read, as the kernel's last argument. The module's array again
    where it has that shape, zeroed first unless the current stream is capturing (a CUDA graph captured after an
    eager call then writes where the caller reads, and its capture allocates nothing); else a fresh one of zeros."""
    if not enabled:
        return ()
    import cupy

    clocks = globals()[name]
    if clocks is not None and clocks.shape == tuple(shape):
        if not cupy.cuda.get_current_stream().is_capturing():
            clocks.fill(0)
    else:
        globals()[name] = clocks = cupy.zeros(shape, np.int64)
    return (clocks,)


SPEC_ONE_WARP_WAVES = 4  # speculative CTAs of one warp from this many speculated chunks an SM on (spec_shapes)
SPEC_PIECES_MAX = 64  # most CTAs a speculated chunk (spec_pieces; the grid build's LOOP_GRID for a group's loop)


def spec_pieces(groups: int) -> int:
    """CTAs a chunk for ``DecodePlan(speculate="first_chunk")`` over ``groups`` groups (B x Gn): the power of two at
    or below ``num_sms() / groups``, from 1 to ``SPEC_PIECES_MAX``, so that each group's first ranked chunk (all of its
    speculated blocks but the forced ones) takes about one wave of CTAs between them, as the split build's splits do
    for top-k. One Llama request (8 groups, 132 SMs) takes 16 a chunk; a batch of 32 takes 1 (the loop's own share).
    H100 (benchmarks/NOTES.md, sixty-fourth session): one Llama request's per-head step at 16 a chunk is level with the
    loop (58.0 against 56.4 µs of kernels)."""
    per_group = num_sms() // max(1, groups)
    return 1 if per_group < 2 else min(SPEC_PIECES_MAX, 1 << (per_group.bit_length() - 1))


# speculate="first_chunk": the groups share the attend's CTAs by the blocks of their first ranked chunks (1), or each
# takes spec_pieces (0: the sixty-fourth session's share-out, for A/Bs)
SPEC_BALANCE = 1


class SpecShare(NamedTuple):
    """The speculative attend's CTAs for ``DecodePlan(speculate="first_chunk")`` (``spec_share``)."""

    ctas: int   # the 1-D grid: a CTA for each group's forced chunk (where there are forced blocks), then the pieces
    pmax: int   # the most pieces of a chunk (PSA_SPEC_PIECES): the partials' entries a chunk and head
    extra: int  # CTAs past one a group that the groups share by blocks (spec_extra), or -1: each takes pmax


def spec_share(groups: int, forced: bool) -> SpecShare:
    """How ``DecodePlan(speculate="first_chunk")`` attends ``groups`` groups' (B x Gn) first chunks. With
    ``SPEC_BALANCE`` one wave of CTAs (an SM each, ``num_sms()``, less a CTA a group for the forced chunks, at least
    one a group) is shared out by the ranked blocks of each group's first chunk (verifier.cuh's spec_pieces_of on the
    device, ``spec_ranked_pieces`` its host mirror), so that the busiest group, whose pieces set the launch's time,
    has as many blocks a piece as the rest (per-head Llama 32K B = 1: its first chunk ~1.8x the mean,
    benchmarks/NOTES.md, sixty-seventh session); else each group's chunk takes ``spec_pieces(groups)``. ``pmax`` 1 (as
    many groups as SMs) runs a CTA a chunk on the grid (chunks, Gn, B) instead."""
    f = groups if forced else 0
    if not SPEC_BALANCE:
        p = spec_pieces(groups)
        return SpecShare(f + groups * p, p, -1)
    first = max(groups, num_sms() - f)
    return SpecShare(f + first, max(1, min(SPEC_PIECES_MAX, 1 + first - groups)), first - groups)


def spec_ranked_pieces(blocks, extra: int, pmax: int) -> np.ndarray:
    """Each group's pieces of its first ranked chunk, ``blocks`` the ranked blocks of each (verifier.cuh's
    spec_pieces_of, on the host for tests): ``1 + extra * w // sum(w)`` with ``extra`` >= 0, else ``pmax``; at most
    ``pmax`` and the group's blocks, at least 1."""
    w = np.asarray(blocks, np.int64)
    total = int(w.sum())
    p = np.full(w.shape, pmax, np.int64) if extra < 0 else 1 + (extra * w // total if total > 0 else 0 * w)
    return np.maximum(1, np.minimum(np.minimum(p, pmax), w))


def spec_one_warp_from() -> int:
    """Speculated chunks (over the batch) from which the speculative attend runs CTAs of one warp."""
    return SPEC_ONE_WARP_WAVES * num_sms()


def spec_shapes(chunk_slots: int, warps: int) -> tuple[int, ...]:
    """The CTA shapes (warps) of the speculative attend's builds for a plan of ``warps`` warps and
    ``chunk_slots`` chunks of the schedule over the batch (B x groups x chunks). One CTA attends one chunk:
    with ``warps`` of them while the chunks actually speculated (counted on the device by ``psa_spec_len``)
    stay under ``spec_one_warp_from()``, else with one warp, so that several chunks share an SM and one
    chunk's start (its first loads) and end (its partial written) hide behind the others' streams. Two
    shapes: both builds are launched and the count picks on the device (decode.cu); one: the count cannot
    reach the line (or the plan has one warp), so one build. The count decides, not the slots: Gemma 3
    layer 5 at 32K (80% of the blocks speculated) 342 -> 286 µs at B = 32 with one warp, but one Llama
    request at 13% (the same number of chunk slots) 70 -> 84 µs (benchmarks/NOTES.md)."""
    frm = spec_one_warp_from()
    if warps == 1 or frm <= 0:
        return (1,)
    return (warps,) if chunk_slots < frm else (warps, 1)


def decode(q, k_pool, v_pool, block_table, seq_lens, order_arr, log_suffix, out, num_used, iterations, reason,
           mass_est, *, d, s, g, hq, hkv, nmax, stop, threshold, step, forced, cluster, warps=8,
           version=DECODE_VERSION, stages=None, offload: tuple | None = None, sketch: tuple | None = None,
           q_mma=None, qk_scale: float = 1.0, split: tuple | None = None, first_len=None,
           q_exact: bool = False, spec: tuple | None = None, grid_group: tuple | None = None,
           first_prev: bool = False, q_raw: tuple | None = None, spec_pieces: SpecShare | None = None,
           fused: tuple | None = None) -> None:
    """Launch the decode kernel (``version`` 3, tensor cores; 2 is the CUDA-core kernel that groups of
    more than 8 query heads fall back to)
    over ``[B, Hq/g]`` groups, ``cluster`` CTAs each.

    ``offload = (slot_map, istate, vstate, groups_left, done_ptr, token)`` launches the ``PSA_OFFLOAD``
    build instead (version 3, psa_fast.offload): one iteration, the loop state read from and written
    back to ``istate``/``vstate``, blocks found as ``slot_map[block_table[...]]``.

    ``sketch = (ordered, lmass)`` (stop = sketch): each head's log sketch mass ``log n_j + s_j`` of the block
    at each position of the order ``[B, Hq, Nmax]`` (``order(..., ordered=)``) and a scratch buffer of the
    same shape for the attended blocks' log masses, also by position.

    ``split = (splits, split_len, partial)`` (dense and top-k, version 3, ``cluster`` 1) launches the
    ``PSA_SPLIT`` build: ``splits`` CTAs per group each attend ``split_len`` consecutive positions and
    write their partial outputs to ``partial [B, Hq, splits, Dp + 2]``; ``psa_merge_splits`` then writes
    ``out`` and the diagnostics.

    ``spec = (spec_len, partial, istate, vstate, chunks, spec_total, spec_warps, spec_items)`` (psa, version 3)
    runs the speculative schedule in three launches: the ``PSA_SPEC`` build (grid ``(chunks, Gn, B)``: one CTA
    of ``spec_warps`` warps per chunk of the loop's schedule that starts below ``spec_len [B, Gn]``, partials
    into ``partial [B, Hq, chunks, Dp + 4]``; with ``spec_items`` (``psa_spec_len``'s list of the speculated
    chunks, ``spec_one_warp_from()`` long) that build on a compact grid and one of one warp on the full grid,
    the chunks counted in ``spec_total [1]`` picking one of them on the device, ``spec_shapes``),
    ``psa_spec_verify`` (the verifier over those chunks in order; groups that stop get their outputs and
    diagnostics, the others their loop state in ``istate [B, Gn, 4]`` int / ``vstate [B, Hq, 7 + Dp]``), and
    the ``PSA_RESUME`` build (the loop from there, ``cluster`` CTAs per group; done groups leave at once).
    ``spec_pieces`` (``DecodePlan(speculate="first_chunk")``, a ``SpecShare``): each group's forced and first ranked
    chunks are speculated (``spec_len`` None, no list), the first ranked ones in pieces on a 1-D grid of
    ``spec_pieces.ctas`` where its ``pmax`` > 1 (``partial [B, Hq, chunks * pmax, Dp + 4]``; decode.cu).

    ``grid_group = (ctas, xstats, xcount, xpart)`` (psa's plain loop, version 3, ``cluster`` 1) launches the
    ``PSA_GRID`` build: ``ctas`` CTAs a group that are not a cluster, exchanging each iteration's statistics through
    ``xstats [B, Gn, 2, ctas, g, 4]`` uint64 (each statistic's float bits tagged with its iteration; the builds
    without tags, the sketch rules', use its first half as float32) and a barrier on ``xcount [B, Gn, 2]`` uint32 (both
    zero before the first launch; each launch leaves them zero), and every warp's output terms through
    ``xpart [B, Gn, ctas * warps, g, Dp + 4]`` float32 (``Dp`` outputs, max, mass, 2 unused; ``warps`` the build's,
    after ``decode_config``). Every CTA of the grid must be resident at once (``pick_grid``).

    ``first_len`` (``[B, Gn]`` int, version 3): the ranked blocks of each group's first ranked chunk
    (``first_chunk``; psa_first_chunk writes the predicted ones); None: chunks of ``step`` after the forced.
    ``first_prev`` (``first_chunk="previous"``, the plain loop): ``first_len`` holds the blocks each group attended
    at the previous call (the plan passes ``num_used`` itself; benchmarks/exp_previous_steps.py ``--unaliased`` a
    frozen copy); the first ranked chunk ends one ``step`` short of there (``psa_ref.progressive.
    previous_first_chunk``; 0, or too few to leave a ranked block: chunks of ``step``), and the launch writes this
    call's to ``num_used``.

    ``q`` is the scaled query ``[B, Hq, Dp]`` float32. Given ``q_mma`` (the query scaled by a power of
    two only), version 3 reads it instead and multiplies its logits by ``qk_scale``; version 2 reads
    ``q``. ``q_exact``: ``q_mma`` holds numbers of the KV's type (a query of that type), so the tensor
    cores take it in one part (``PSA_QPARTS`` 1); otherwise in 2 (float16) or 3 (bfloat16) parts.
    ``q_raw = (query, mul)``: version 3's loop, grid and split builds read the caller's query (``[B, Hq, d]``
    C-contiguous float16, float32 or int16 bfloat16 bits) and multiply it by ``mul`` themselves (the power of two
    of ``q_mma``: the same float32 product, so the same bits), so that no kernel has to copy it first.

    ``fused = (meta, scores, sink_blocks, recent_blocks, q_scale, kind)`` (``FUSED_STEP``; not yet run on a GPU):
    the loop's build first does ``estimate_order``'s work for its group (decode.cu ``PSA_FUSED_EO``: the scores into
    ``scores``, the order into ``order_arr``), reading ``q_raw``'s query times ``q_scale``; the plain loop on clusters
    of 2 to 8 CTAs, at least one a run of ``RUN_BLOCKS`` blocks, 8 warps, float16 KV, tensor-core metadata.

    The KV dtype follows the pools: float16, or int16 holding bfloat16 (the ``PSA_BF16`` build)."""
    version, warps, stages, smem = decode_config(d=d, s=s, g=g, version=version, warps=warps, stages=stages)
    if version == 3 and q_mma is not None:
        q = q_mma
    else:
        qk_scale = 1.0
    raw_args, raw_define = (), {}
    if q_raw is not None:
        if version != 3 or q_mma is None or spec is not None or offload is not None:
            raise ValueError("q_raw is read by decode version 3's loop, grid and split builds (given q_mma's scale "
                             "as qk_scale), not by the speculative or offload builds")
        raw_define = {"qraw": _raw_query_code(q_raw[0], (q.shape[0], hq, d), "decode(q_raw=...)")}
        q, raw_args = q_raw[0], (np.float32(q_raw[1]),)
    b = q.shape[0]
    null = np.uint64(0)
    args = (q, k_pool, v_pool, block_table, seq_lens, null if order_arr is None else order_arr,
            null if log_suffix is None else log_suffix, out, num_used, iterations, reason, mass_est,
            np.int32(hq), np.int32(hkv), np.int32(nmax), np.int32(STOP_CODES[stop]), np.float32(threshold),
            np.int32(step), np.int32(forced))
    grid = (cluster, hq // g, b)
    if version < 3 and (stop in ("ema", "sketch", "sketch_avg") or offload is not None or first_len is not None):
        raise NotImplementedError("stop='ema', 'sketch', 'sketch_avg', first_chunk and offload need decode version 3")
    if stop in ("sketch", "sketch_avg") and sketch is None:
        raise ValueError(f"stop={stop!r} needs sketch=(ordered, lmass)")
    if first_prev and (version < 3 or first_len is None or offload is not None or split is not None
                       or spec is not None):
        raise ValueError("first_prev runs the plain loop (decode version 3, no offload, splits or speculation) "
                         "with first_len the previous call's num_used")
    bf16 = k_pool.dtype == np.int16
    defines = {"bf16": 1} if bf16 else {}
    if version == 3:
        defines["qparts"] = 1 if q_exact and q_mma is not None else (3 if bf16 else 2)
        defines["pair"] = DECODE_PAIR
        if DECODE_PUSH and push_fits(cluster=cluster, g=g, d=d, smem=smem):
            defines["push"] = 1
        defines["stream_window"] = int(d <= DECODE_STREAM_WINDOW)
        from psa_ref.progressive import EMA_WEIGHT, SKETCH_AVG_SHARE, SKETCH_NEXT_SHARE, SKETCH_WINDOW

        assert SKETCH_WINDOW <= 32, "the verifier gives each window position one lane"
        ordered, lmass = sketch if sketch is not None else (null, null)
        share = SKETCH_AVG_SHARE if stop == "sketch_avg" else SKETCH_NEXT_SHARE
        rule_args = (np.float32(EMA_WEIGHT), ordered, lmass, np.float32(share), np.int32(SKETCH_WINDOW))
        args = args + rule_args + (np.float32(qk_scale), null if first_len is None else first_len)
    if first_prev:
        defines["first_prev"] = 1
    if version == 3 and stop in ("sketch", "sketch_avg") and offload is None and spec is None and split is None:
        defines["sketch_rule"] = 1  # (decode.cu: the decision's loads early, PSA_DECIDE_PREFETCH / PSA_DECIDE_OVERLAP)
    if offload is not None:
        slot_map, istate, vstate, groups_left, done_ptr, token = offload
        args = args + (slot_map, istate, vstate, groups_left, np.uint64(done_ptr), token)
        defines["offload"] = 1
    if split is not None:
        if version != 3 or offload is not None or cluster != 1 or stop not in ("none", "budget"):
            raise ValueError("the split build runs dense or top-k attention on decode version 3, one CTA per split")
        splits, split_len, partial = split
        args = args + (np.int32(split_len), partial)
        defines["split"] = 1
        grid = (splits, hq // g, b)
    if spec is not None:
        if version != 3 or offload is not None or split is not None or stop in ("none", "budget"):
            raise ValueError("the speculative schedule runs PSA on decode version 3, without offload or splits")
        # every speculated chunk at once; the verifier over them; the loop resumed where they fell short
        spec_len_arr, partial, istate, vstate, chunks, spec_total, spec_warps, spec_items = spec
        gn = hq // g
        cut = spec_pieces or SpecShare(0, 1, 0)  # (one CTA a chunk: the margin's schedule)
        pieces = int(cut.pmax)
        if pieces < 1:
            raise ValueError(f"spec_pieces.pmax must be >= 1, got {spec_pieces}")
        if (spec_pieces is not None and spec_items is not None) or (spec_len_arr is None) != (spec_pieces is not None):
            raise ValueError("spec_pieces (speculate='first_chunk') runs the speculative build with no spec_len and no "
                             f"list of chunks, and only it has no spec_len (got spec_pieces={spec_pieces}, spec_len "
                             f"given: {spec_len_arr is not None}, spec_items given: {spec_items is not None})")
        if partial.shape[2] != chunks * pieces:
            raise ValueError(f"spec's partial holds {partial.shape[2]} chunk entries a head; {chunks} chunks of "
                             f"{pieces} pieces need {chunks * pieces}")
        piece_define = {"spec_pieces": pieces} if pieces > 1 else {}
        build = functools.partial(_decode_build, d=d, s=s, g=g, warps=warps, stages=stages, smem=smem, **defines)
        # (warps, grid, items, one_warp_from) of each build launched: alone, a build never leaves; as a pair, the
        # several-warp build on the compact grid leaves from `one_warp_from` speculated chunks on, the one-warp
        # build below it (decode.cu)
        if pieces > 1:  # the pieces' 1-D grid (decode.cu)
            launches = [(spec_warps, (int(cut.ctas), 1, 1), null, 0 if spec_warps == 1 else 2**31 - 1)]
        elif spec_items is None:
            launches = [(spec_warps, (chunks, gn, b), null, 0 if spec_warps == 1 else 2**31 - 1)]
        else:
            frm = int(spec_items.size)
            launches = [(spec_warps, (frm, 1, 1), spec_items, frm), (1, (chunks, gn, b), null, frm)]
        spec_len_ptr = null if spec_len_arr is None else spec_len_arr
        for w, grid_w, items, one_warp_from in launches:
            _, sw, s_stages, s_smem = decode_config(d=d, s=s, g=g, version=3, warps=w, stages=stages)
            speculated = _decode_build(entry="decode_spec", cluster=1, spec=1, d=d, s=s, g=g, warps=sw,
                                       stages=s_stages, smem=s_smem, **defines, **piece_define)
            speculated(grid_w, (sw * 32,), args + (spec_len_ptr, partial, spec_total, np.int32(one_warp_from), items,
                                                   np.int32(chunks), np.int32(b * gn), np.int32(cut.extra)),
                       shared_mem=s_smem)
        ema_w, ordered, lmass, share, window = rule_args
        verify = kernel("spec", d=d, s=s, g=g, entry="spec_verify", **piece_define,
                        **({"verify_clock": 1} if VERIFY_CLOCK else {}))
        verify((gn, b), (SPEC_VERIFY_THREADS,), (
            partial, spec_len_ptr, seq_lens, null if log_suffix is None else log_suffix, ordered, lmass,
            null if first_len is None else first_len, out, num_used, iterations, reason, mass_est, istate, vstate,
            np.int32(hq), np.int32(nmax), np.int32(chunks), np.int32(STOP_CODES[stop]), np.float32(threshold),
            np.int32(step), np.int32(forced), ema_w, share, window, spec_total, np.int32(cut.extra))
           + _clock_args("verify_clocks", VERIFY_CLOCK, b, gn, 8))
        rc = resume_cluster(cluster, step, warps)
        resumed = build(entry="decode_resume", cluster=rc, resume=1, **({"loop_clock": 1} if LOOP_CLOCK else {}))
        resumed((rc, gn, b), (warps * 32,), args + (null, istate, vstate, null, null, null)
                + _clock_args("loop_clocks", LOOP_CLOCK, b, gn, 18), shared_mem=smem)
        return
    launch = {}  # how the build is launched (the grid build: cooperatively)
    if grid_group is not None:
        if version != 3 or offload is not None or split is not None or cluster != 1 or stop in ("none", "budget"):
            raise ValueError("the grid build runs PSA's plain loop on decode version 3, cluster 1")
        ctas, xstats, xcount, xpart = grid_group
        want = grid_exchange_shapes(b, hq // g, ctas, warps, g, d)
        for name, buf, shape, dtype in zip(("xstats", "xcount", "xpart"), (xstats, xcount, xpart), want,
                                           GRID_EXCHANGE_DTYPES):
            if tuple(buf.shape) != shape:
                raise ValueError(f"grid_group's {name}: expected {list(shape)} (grid_exchange_shapes for {ctas} CTAs "
                                 f"of the build's {warps} warps), got {list(buf.shape)}")
            if buf.dtype != dtype:
                raise TypeError(f"grid_group's {name}: expected {np.dtype(dtype).name}, got {buf.dtype}")
        args = args + (xstats, xcount, xpart)
        defines["grid"] = ctas
        grid = (ctas, hq // g, b)
        launch = {"cooperative": True} if GRID_COOPERATIVE else {}
    clocked = LOOP_CLOCK and version == 3 and split is None and offload is None
    if clocked:
        defines["loop_clock"] = 1
    fused_args, fused_defines = _fused_step_launch(fused, version=version, q_raw=q_raw, split=split, offload=offload,
                                                   grid_group=grid_group, cluster=cluster, warps=warps, g=g, bf16=bf16,
                                                   nmax=nmax, stop=stop, first_len=first_len)
    fn = _decode_build(name="decode" if version == 3 else "decode_v2", entry=None, d=d, s=s, g=g, cluster=cluster,
                       warps=warps, stages=stages, smem=smem, **defines, **raw_define, **fused_defines, **launch)
    fn(grid, (warps * 32,), args + _clock_args("loop_clocks", clocked, b, hq // g, 18) + raw_args + fused_args,
       shared_mem=smem)
    if split is not None:
        merge_warps = min(8, splits)
        batch = min(MERGE_BATCH, -(-splits // merge_warps)) if MERGE_BATCH_FIT else MERGE_BATCH
        merge = kernel("decode", d=d, s=s, g=g, cluster=1, warps=warps, stages=stages, entry="merge_splits",
                       merge_batch=batch, **defines)
        why = REASONS.index("budget" if stop == "budget" else "exhausted")
        per_cta = 32 if d % 32 == 0 else 16  # channels a CTA merges (PSA_MC); its warps take the splits round-robin
        merge((hq, b, d // per_cta), (32 * merge_warps,), (partial, seq_lens, out, num_used, iterations, reason,
                                                              mass_est, np.int32(splits), np.int32(step),
                                                              np.int32(why)))


# 1: a PSA step at one request in one launch where a plan allows it (DecodePlan's _fused_step: decode.cu PSA_FUSED_EO,
# the loop's clusters doing psa_estimate_order's work first; the step's query read as the caller gives it). Predicted
# (H100, s75's timeline): Llama 5% 32K B = 1 -1.5 to -3 µs a step (the 1.5-2 µs between the two kernels and the
# query's side branch gone, the 8-warp scoring +0.5). 0: off (not yet run on a GPU)
FUSED_STEP = 0
FUSED_STEP_RULES = ("ema", "remaining", "seed")  # the loop's rules that read no per-head values beside the order
# 1 (with FUSED_STEP): the placing threads of the fused step also write each block and its slot into the shared memory
# of the warp whose stream's first window holds its position (decode.cu PSA_FUSED_FIRST, stream_entry), so the loop's
# first copies wait on no order or block-table load. Predicted (H100, Llama 5% 32K B = 1): the fused step -1 to
# -1.5 µs (two dependent L2 loads off the loop's start). 0: off (not yet run on a GPU)
FUSED_FIRST = 0


def _fused_step_launch(fused, *, version, q_raw, split, offload, grid_group, cluster, warps, g, bf16, nmax, stop,
                       first_len) -> tuple[tuple, dict]:
    """``decode(fused=...)``'s arguments after the kernel's own and its defines (``((), {})`` where None), or a
    ValueError where the build cannot run the step in one launch."""
    if fused is None:
        return (), {}
    meta, scores, sink_blocks, recent_blocks, q_scale, kind = fused
    runs = -(-nmax // RUN_BLOCKS)
    if (version != 3 or q_raw is None or split is not None or offload is not None or grid_group is not None
            or first_len is not None or not 2 <= cluster <= 8 or runs > cluster or warps != 8 or g > 4 or bf16
            or kind not in ("cuboid_mean", "mean") or stop not in FUSED_STEP_RULES):
        raise ValueError(f"fused: the plain loop on clusters of 2 to 8 CTAs (at least one a run of {RUN_BLOCKS} "
                         "blocks), 8 warps, the caller's query, float16 KV, cuboid_mean or mean metadata, a loop rule without "
                         f"per-head values and no first chunk; got version {version}, cluster {cluster} for {runs} "
                         f"runs, {warps} warps, g {g}, kind {kind!r}, stop {stop!r}, q_raw given: {q_raw is not None}")
    defines = {"fused_eo": 1, "kind": KIND_CODES[kind], "est_kg": estimate_chunk_group(g), "bounds": 0, "eo_heads": 1,
               **_run_swizzle(), **({"eo_early": 1} if ESTIMATE_ORDER_EARLY else {}),
               **({"fused_first": 1} if FUSED_FIRST else {})}
    return (meta, scores, np.int32(sink_blocks), np.int32(recent_blocks), np.float32(q_scale)), defines


def _decode_build(*, entry, cluster, smem, name="decode", **options):
    """A build of the decode kernel (``kernel(name, ...)``) allowed ``smem`` bytes and its cluster size."""
    fn = _with_smem(kernel(name, cluster=cluster, entry=entry, **options), smem)
    allow_cluster(fn, cluster)
    return fn


def spec_len(log_suffix, seq_lens, out, spec_total, *, s, g, hq, nmax, forced, threshold, margin, extra,
             step, first_len=None, spec_items=None, chunks: int = 0) -> None:
    """``DecodePlan(speculate=margin)``: each group's speculated positions ``out [B, Gn]`` = the forced
    blocks + ``margin`` x the ranked blocks its estimates predict for ``threshold`` + ``extra``, at most n
    (``psa_spec_len``; every position at ``threshold >= 1``); their chunks of the schedule (the forced, the
    ranked chunk of ``first_len [B, Gn]`` if given, then ``step`` positions) over all groups added to
    ``spec_total [1]`` (0 before; ``psa_spec_verify`` sets it back to 0) and, with ``spec_items``, listed
    there as ``group * chunks + chunk`` while they fit (``decode``'s ``spec``)."""
    b, gn = out.shape
    log_rest = np.float32(np.log1p(-threshold) if threshold < 1 else -np.inf)
    fn = kernel("first_chunk", d=16, s=s, g=g, entry="spec_len")
    null = np.uint64(0)
    fn((gn, b), (32,), (log_suffix, seq_lens, out, np.int32(hq), np.int32(nmax), np.int32(forced), log_rest,
                        np.float32(margin), np.int32(extra), np.int32(step), null if first_len is None else first_len,
                        spec_total, null if spec_items is None else spec_items,
                        np.int32(0 if spec_items is None else spec_items.size), np.int32(chunks)))


def first_chunk(log_suffix, seq_lens, first_len, *, s, g, hq, nmax, forced, threshold) -> None:
    """``first_chunk="predicted"``: each group's ranked blocks of its first ranked chunk, ``first_len
    [B, Gn]``, from the per-head suffix sums of the estimates along the order (``psa_first_chunk``)."""
    b, gn = first_len.shape
    fn = kernel("first_chunk", d=16, s=s, g=g)
    fn((gn, b), (32,), (log_suffix, seq_lens, first_len, np.int32(hq), np.int32(nmax), np.int32(forced),
                        np.float32(np.log1p(-threshold))))


ESTIMATED_STOP_THREADS = 512  # psa_estimated_stop's CTA (PSA_ES_THREADS)
ESTIMATED_STOP_CODES = {"ema": 0, "remaining": 1}
# > 1: psa_estimated_stop v6, a group's order in slices over a cluster of this many CTAs (a power of two <= 8) of
# ESTIMATED_STOP_CLUSTER_THREADS, where the groups' clusters fit the SMs and the longest request has at least
# ESTIMATED_STOP_CLUSTER_MIN_BLOCKS blocks (estimated_stop_cluster); elsewhere v2, one CTA a group. v2's time is its
# work on one SM a group; v6 spreads it and pays ~3 µs for its two cluster barriers. H100 s66 (sorted order, one
# request of 8 groups, v2 on 512 threads, v6 on 8 CTAs of 256, both with the cached rewalk): 64 blocks 4.5 / 7.8 µs,
# 2,048 7.2 / 8.3, 4,096 12.0 / 9.0, 8,192 20.7 / 10.2; per-head step at 128K B = 1 the estimated stop 10.3 µs (v2
# 23.9 in s65) and the "first chunk estimated_stop" row 127.5 against top-k at its error 132.1; clusters of 2 at B = 8
# lost (s65, 2,048: 8.6 -> 11.0). 1: v2 everywhere.
ESTIMATED_STOP_CLUSTER = 8
ESTIMATED_STOP_CLUSTER_THREADS = 256
ESTIMATED_STOP_CLUSTER_MIN_BLOCKS = 4096


def estimated_stop_cluster(groups: int, blocks: int) -> int:
    """CTAs a group of psa_estimated_stop for ``groups`` (B x Gn) groups whose longest request has ``blocks`` blocks:
    ``ESTIMATED_STOP_CLUSTER`` (v6) where ``blocks >= ESTIMATED_STOP_CLUSTER_MIN_BLOCKS`` and ``groups x`` that many
    CTAs fit the SMs (one Llama request of 8 groups from 64K tokens at block size 16; Gemma 3's one group), else 1
    (v2)."""
    if groups < 1 or blocks < 1:
        raise ValueError(f"groups and blocks must be >= 1, got groups={groups}, blocks={blocks}")
    cl = ESTIMATED_STOP_CLUSTER
    if cl > 1 and blocks >= ESTIMATED_STOP_CLUSTER_MIN_BLOCKS and groups * cl <= num_sms():
        return cl
    return 1


def estimated_stop_chunk(vals, order_arr, seq_lens, first_len, *, s, g, hq, nmax, forced, threshold, stop,
                         margin, blocks=None) -> None:
    """``first_chunk="estimated_stop"``: each group's ranked blocks of its first ranked chunk, ``first_len [B, Gn]``,
    where ``stop`` ("ema" or "remaining") run on the estimated masses along the order first holds for every head,
    times ``margin`` (``psa_estimated_stop``; psa_ref.progressive.estimated_stop_first_chunk), from each head's
    estimates ``vals [B, Hq, Nmax]`` and the order ``order_arr [B, Gn, Nmax]`` (no suffix pass). ``blocks``: the
    longest request's blocks as the host knows them (the version's rule, estimated_stop_cluster, reads it; ``nmax``
    when None). Either version gives the same first chunks up to float32 rounding; a CUDA graph keeps the one chosen
    when it was captured."""
    from psa_ref.progressive import EMA_WEIGHT

    b, gn = first_len.shape
    cl = estimated_stop_cluster(b * gn, nmax if blocks is None else max(1, min(int(blocks), nmax)))
    if cl > 1:
        threads = ESTIMATED_STOP_CLUSTER_THREADS
        fn = kernel("estimated_stop", d=16, s=s, g=g, cluster=cl, es_threads=threads)
    else:
        threads = ESTIMATED_STOP_THREADS
        fn = kernel("estimated_stop", d=16, s=s, g=g)
    fn((gn * cl, b), (threads,), (vals, order_arr, seq_lens, first_len, np.int32(hq), np.int32(nmax), np.int32(forced),
                                  np.float32(threshold), np.float32(EMA_WEIGHT), np.int32(ESTIMATED_STOP_CODES[stop]),
                                  np.float32(margin)))


# Dense decoding at head dim <= 64 takes CTAs of 8 warps (not 4) when the batch has at most this many groups
# (B x Hkv): one request's few groups then fill the GPU with splits either way and fewer, wider CTAs leave fewer
# partials to merge. s52 A/B (H100, SmolLM2, off / on / on / off): 128K B = 1 43.6 / 44.6 -> 42.7 / 42.8 µs, B = 2
# 32K 26.3 / 27.2 -> 26.1 / 25.9 and 128K 76.2 / 77.3 -> 75.3 / 75.8, 32K B = 1 and B = 4 level; at B = 8 (24
# groups) 8 warps lose (s49 sweep). 0: never. On since s53, after the dense and split GPU tests passed with it
# (device_pending.sh s52c: 37 passed with test_dense_wide_ctas_at_small_head_dims; the other suites' dense tests: 30).
# 12 -> 15 in s62 (SmolLM2 B = 5, the last dense row under 0.95x SDPA on the H200: A/B in one process, both orders,
# 32K 36.9 / 37.4 -> 36.4 / 36.4 µs against SDPA 33.8-34.6, 128K 121.1 / 121.8 -> 119.2 / 119.6; H100 s61e level at
# 32K, 128K 175.2 / 173.4 -> 176.0 / 176.5; the H200's dense tests, 80, passed with it).
DENSE_WIDE_MAX_GROUPS = 15


# > 0: dense CTAs of 8 warps at head dim <= 64 (DENSE_WIDE_MAX_GROUPS) take this many prefetch stages when the batch
# has more than DENSE_WIDE_STAGES_MIN_GROUPS groups (twice the CTAs an SM at 2, so pick_splits gives about twice the
# splits). The sweeps, which set the stages themselves, had 8 warps x 2 stages the best shape at SmolLM2 B = 3 and 5
# (H100 s61e). The A/B in one process (H100 s65, device_pending.sh s63b, 0 / 2 / 2 / 0, µs): 32K B = 3 32.2 / 32.2 /
# 32.2 / 32.8, B = 5 49.2 / 49.0 / 48.9 / 50.0; 128K B = 3 106.4 / 106.2 / 105.8 / 107.0, B = 5 175.9 / 170.2 / 170.9 /
# 178.7 (0.93-0.94x -> 0.97x SDPA); B = 4 level (32K 39.9 / 40.4 / 40.4 / 40.4, 128K 137.8 / 137.7 / 137.8 / 138.6).
# 0: off.
DENSE_WIDE_STAGES = 2
DENSE_WIDE_STAGES_MIN_GROUPS = 6


def default_stages(d: int, mode: str, warps: int, groups: int | None = None) -> int | None:
    """Prefetch stages a decode CTA takes when the caller gives none: None (decode_config's DECODE_STAGES, fewer where
    shared memory is short), or ``DENSE_WIDE_STAGES`` for the dense build's 8-warp CTAs at head dim <= 64 with more
    than ``DENSE_WIDE_STAGES_MIN_GROUPS`` and at most ``DENSE_WIDE_MAX_GROUPS`` groups (``groups`` = B x Hkv, when
    given) where that switch is on."""
    if (DENSE_WIDE_STAGES and mode == "dense" and d <= 64 and warps == 8 and groups is not None
            and DENSE_WIDE_STAGES_MIN_GROUPS < groups <= DENSE_WIDE_MAX_GROUPS):
        return DENSE_WIDE_STAGES
    return None


def default_warps(d: int, mode: str, groups: int | None = None) -> int:
    """Warps per decode CTA when the caller gives none: 4 for dense and top-k at head dim <= 64 (small CTAs, several
    an SM: SmolLM2's shape 331 -> 198 µs at 32K, B = 32, benchmarks/NOTES.md), else 8; dense at D <= 64 with at
    most ``DENSE_WIDE_MAX_GROUPS`` groups (``groups`` = B x Hkv, when given) 8 again."""
    if mode == "dense" and d <= 64 and groups is not None and groups <= DENSE_WIDE_MAX_GROUPS:
        return 8
    return 4 if mode != "psa" and d <= 64 else 8


# 1: pick_splits rounds the splits down, so that a batch's CTAs never exceed one wave; 0: to the nearest, which at
# some batch sizes puts a few CTAs in a second wave (Llama B = 3, 6, 9-11: 144-176 CTAs of one an SM on 132 SMs;
# Gemma 3 B = 7: 133), streaming their splits alone after the rest. s52 A/B (H100, dense, 32K, off / on / on / off):
# Llama B = 3 163.5 -> 146.0 µs, B = 6 311.7 -> 289.5, B = 9 461.1 -> 402.3; Gemma 3 B = 7 121.6 -> 91.2, B = 9
# 152.1 -> 113.4, B = 20 312.6 -> 236.9, B = 24 363.9 -> 277.5; SmolLM2 B = 7 / 9 -1.2 / -2.5; B = 8 (the same splits)
# and Llama B = 11 level.
SPLITS_WITHIN_WAVE = 1

# > 0: where the splits within one wave leave more than 1 - SPLITS_MIN_FILL of it idle (Llama B = 6: 48 groups x 2 =
# 96 CTAs on 132 SMs; B = 11: 88 x 1), CTAs of 8 warps take enough splits for two waves instead (6 and 3: 288 and 264
# CTAs). s53 (H100, dense Llama, off / on / on / off): 32K B = 6 290.4 -> 268.6 µs, B = 11 509.4 -> 474.6, B = 12
# 553.5 -> 519.2, 128K B = 6 1133.1 -> 1017.6, B = 11 2027.1 -> 1847.0; at 0.9, B = 13 lost 578 -> 599, hence 0.75.
# Not for 4-warp CTAs: Gemma 3 (D 256) B = 45 lost 492 -> 581 with it (2 splits of 90 CTAs already at its floor).
# benchmarks/NOTES.md (fifty-third session). 0: off.
SPLITS_MIN_FILL = 0.75


def pick_splits(groups: int, positions: int, warps: int, smem: int = SMEM_LIMIT) -> int:
    """CTAs per group for the split build (dense, top-k): about one wave over the SMs (at most one with
    ``SPLITS_WITHIN_WAVE``; two where one would leave a quarter of it idle, ``SPLITS_MIN_FILL``, CTAs of 8 warps
    only), each split at least two positions (blocks) per warp, since every split adds a partial
    output to merge; 1 when the groups alone fill the GPU. A wave counts as many CTAs an SM as fit in two thirds of
    its shared memory at ``smem`` bytes a CTA (the cp.async data in flight) and in its 64 warps: one at head dims 128
    and 256, three for D 64's CTAs of 4 warps (swept in benchmarks/exp_dense_tune.py, benchmarks/NOTES.md)."""
    per_sm = max(1, min(64 // max(1, warps), (2 * SMEM_LIMIT // 3) // max(1, smem)))
    wave = per_sm * num_sms()
    splits = max(1, wave // groups if SPLITS_WITHIN_WAVE else round(wave / groups))
    if warps >= 8 and groups * splits < SPLITS_MIN_FILL * wave:  # (never when the groups alone fill a wave)
        splits = -(-2 * wave // groups)
    return max(1, min(splits, positions // max(1, 2 * warps)))
