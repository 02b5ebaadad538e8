"""The KV cache manager (layer 2, above the algorithm): where KV blocks live between decode steps.

* ``psa_ref.kvcache.store`` — [`HostStore`][psa_ref.kvcache.store.HostStore], the authoritative copy of every block
  (host memory) with its metadata, updated as tokens append;
* ``psa_ref.kvcache.pool`` — GPU slot pools that cache blocks of the store:
  [`UnifiedPool`][psa_ref.kvcache.pool.UnifiedPool] (one pool shared by all layers, the paper's design) and
  [`PerLayerPool`][psa_ref.kvcache.pool.PerLayerPool] (equal per-layer partitions, the vLLM-style baseline), LRU or
  FIFO;
* ``psa_ref.kvcache.batch`` — [`BatchController`][psa_ref.kvcache.batch.BatchController], FCFS admission by the blocks
of one
  iteration;
* ``psa_ref.kvcache.sim`` — the simulator behind ``psa sim`` (workloads, replays, tables).

Only NumPy: the GPU twins live in ``psa_fast`` (``PagedKVCache``, ``psa_fast.pool``).
"""

from .batch import BatchController
from .pool import FIFO, LRU, PerLayerPool, PoolStats, SlotPool, UnifiedPool
from .store import BlockKey, HostStore

__all__ = ["FIFO", "LRU", "BatchController", "BlockKey", "HostStore", "PerLayerPool", "PoolStats", "SlotPool",
           "UnifiedPool"]
