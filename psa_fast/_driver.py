"""Driver calls CuPy does not wrap: how many thread-block clusters of a kernel the GPU holds at once.

``cuOccupancyMaxActiveClusters`` takes a ``CUlaunchConfig`` with a cluster-dimension attribute; these are its
ctypes mirrors (``libcuda.so.1``). ``psa_fast._kernels.max_active_clusters`` asks it for the largest clusters, and
``benchmarks/exp_clusters.py`` for every decode build."""

from __future__ import annotations

import ctypes

CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION = 4


class LaunchAttribute(ctypes.Structure):
    """``CUlaunchAttribute``: an id, padding to 8 bytes, a 64-byte value (here the cluster's x, y, z)."""
    _fields_ = [("id", ctypes.c_uint), ("pad", ctypes.c_char * 4), ("value", ctypes.c_uint * 16)]


class LaunchConfig(ctypes.Structure):
    """``CUlaunchConfig`` (ctypes aligns the stream pointer to 8 bytes, as the C struct does)."""
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3), ("shared_mem", ctypes.c_uint),
                ("stream", ctypes.c_void_p), ("attrs", ctypes.POINTER(LaunchAttribute)), ("num_attrs", ctypes.c_uint)]


def launch_config(grid: tuple[int, int, int], block: int, smem: int, cluster: int | None) -> LaunchConfig:
    """A launch configuration of ``grid`` CTAs of ``block`` threads and ``smem`` dynamic bytes, with a cluster
    dimension attribute of ``cluster`` CTAs (none when None)."""
    cfg = LaunchConfig()
    cfg.grid[:] = grid
    cfg.block[:] = (block, 1, 1)
    cfg.shared_mem = smem
    if cluster is not None:
        attr = LaunchAttribute()
        attr.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        attr.value[0], attr.value[1], attr.value[2] = cluster, 1, 1
        cfg._attr = attr  # kept alive with the config
        cfg.attrs = ctypes.pointer(attr)
        cfg.num_attrs = 1
    return cfg


def max_active_clusters(function_ptr: int, cfg: LaunchConfig) -> int | None:
    """``cuOccupancyMaxActiveClusters`` for the CUfunction ``function_ptr``, or None where the driver refuses."""
    lib = ctypes.CDLL("libcuda.so.1")
    n = ctypes.c_int(0)
    err = lib.cuOccupancyMaxActiveClusters(ctypes.byref(n), ctypes.c_void_p(function_ptr), ctypes.byref(cfg))
    return n.value if err == 0 else None
