"""Test helpers for the KV cache manager (``psa_ref.kvcache.store``, ``psa_ref.kvcache.pool``).

Kept apart from ``psa_ref.testing`` so that the attention helpers and these evolve
independently; nothing in the package itself uses them.
"""

from __future__ import annotations

import numpy as np

from ..kvcache.pool import SlotPool


def assert_pool_consistent(pool: SlotPool) -> None:
    """Check a pool against its host store and its own bookkeeping.

    * every resident block's slot holds exactly the store's tokens (K and V, same dtype);
    * no two resident blocks share a slot, and no layer's partition is over capacity;
    * free slots hold no tokens.

    Raises ``AssertionError`` naming the block or slot at fault.
    """
    store = pool.store
    slots = {}
    for layer in range(store.num_layers):
        resident = pool.eviction_order(layer)
        if len(resident) > pool.capacity_per_layer:
            raise AssertionError(f"layer {layer}: {len(resident)} resident blocks in {pool.capacity_per_layer} slots")
        for key in resident:
            slots[key] = pool.slot_of(key)
    if len(slots) != len(pool) or len(set(slots.values())) != len(slots):
        raise AssertionError(f"{len(pool)} resident blocks but {len(set(slots.values()))} distinct slots listed")
    for key, slot in slots.items():
        k_pool, v_pool = pool.read(key)
        k_host, v_host = store.read(key)
        if k_pool.dtype != k_host.dtype or not (np.array_equal(k_pool, k_host) and np.array_equal(v_pool, v_host)):
            raise AssertionError(f"slot {slot} holds {tuple(key)} but its content differs from the host store "
                                 f"({k_pool.shape[0]} tokens in the slot, {k_host.shape[0]} in the store)")
    free = np.setdiff1d(np.arange(pool.num_slots), list(slots.values()))
    if np.any(pool.lengths[free] != 0):
        raise AssertionError(f"free slot(s) {free[pool.lengths[free] != 0].tolist()} still claim tokens")


def random_tokens(rng: np.random.Generator, num_kv_heads: int, num_tokens: int, head_dim: int, dtype=np.float32):
    """``(keys, values)``, each ``[Hkv, T, D]`` standard normal in ``dtype``, with a few repeated
    tokens so that block minima and maxima tie."""
    k, v = rng.standard_normal((2, num_kv_heads, num_tokens, head_dim))
    if num_tokens >= 2:
        k[:, -1] = k[:, 0]
    return k.astype(dtype), v.astype(dtype)
