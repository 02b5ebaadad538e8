"""KV cache manager, part 2: GPU pools that cache blocks of the host store.

A pool is one array of ``num_slots`` equal slots (on a GPU, one device tensor); a slot
holds one block of one KV head, ``S`` tokens of K and V, ``2 * S * D * itemsize`` bytes.
[`SlotPool.access`][psa_ref.kvcache.pool.SlotPool.access] is what the attention loop calls before it reads a chunk of
blocks: the blocks already in a slot are *hits*; the others are *misses*, copied from
the host store (over PCIe on a GPU) into a free slot or into the slot of a block the
policy evicts. Block metadata never moves: it stays resident beside the store.

Two ways to share the slots between the layers of a model:

* [`UnifiedPool`][psa_ref.kvcache.pool.UnifiedPool] -- one set of slots for every layer (the paper's "unified GPU
  memory management"). A layer whose attention is flat and needs many blocks can use
  the slots that a peaked layer does not need.
* [`PerLayerPool`][psa_ref.kvcache.pool.PerLayerPool] -- the same slots split evenly between the layers (the
  vLLM-style baseline): each layer has ``num_slots / L`` slots, used or not.

Eviction policies (one small class each, chosen by name): ``"lru"`` evicts the block
least recently accessed, ``"fifo"`` the block loaded first. The blocks of one
[`access`][psa_ref.kvcache.pool.SlotPool.access] are never evicted by that same access, so every block it
names is resident when it returns; an access that names more distinct blocks than its
layer may hold raises ``ValueError`` (the batch controller keeps iterations smaller).

Pools stay consistent with the store without being told: a token appended to a block
that is resident is written through to its slot (on a GPU the token was computed there,
so this costs no PCIe traffic), and removing a finished request from the store frees
its slots. Evicting a slot never loses data: the host store keeps every block.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Iterable

import numpy as np

from .. import _validate
from .store import BlockKey, HostStore


class FIFO:
    """First in, first out: the next victim is the block loaded longest ago; hits change nothing."""

    def __init__(self):
        self._order: OrderedDict[BlockKey, None] = OrderedDict()  # next victim first

    def insert(self, key: BlockKey) -> None:
        """A block was loaded into a slot."""
        self._order[key] = None

    def touch(self, key: BlockKey) -> None:
        """A resident block was accessed (a hit)."""

    def remove(self, key: BlockKey) -> None:
        """A block left its slot (evicted or released)."""
        del self._order[key]

    def victim(self, pinned: set) -> BlockKey:
        """The block to evict: the first in eviction order that is not ``pinned``."""
        return next(key for key in self._order if key not in pinned)

    def order(self) -> list[BlockKey]:
        """Resident blocks, next victim first."""
        return list(self._order)


class LRU(FIFO):
    """Least recently used: a hit moves the block to the back of the eviction order."""

    def touch(self, key: BlockKey) -> None:
        self._order.move_to_end(key)


POLICIES = {"lru": LRU, "fifo": FIFO}


@dataclass
class PoolStats:
    """Counters of a pool since it was built.

    Attributes:
        hits: blocks accessed that were resident.
        misses: blocks accessed that had to be loaded from the host store.
        evictions: blocks dropped to make room (releases of finished requests are not evictions).
        bytes_loaded: bytes copied from the host store, ``bytes_per_token`` per token loaded.
    """

    hits: int = 0
    misses: int = 0
    evictions: int = 0
    bytes_loaded: int = 0

    @property
    def accesses(self) -> int:
        """``hits + misses``."""
        return self.hits + self.misses

    @property
    def hit_rate(self) -> float:
        """``hits / accesses`` (NaN before the first access)."""
        return self.hits / self.accesses if self.accesses else float("nan")


@dataclass(frozen=True)
class Access:
    """What one [`SlotPool.access`][psa_ref.kvcache.pool.SlotPool.access] did, one entry per block named, in the order
    given.

    Attributes:
        keys: the ``n`` blocks, as [`BlockKey`][psa_ref.kvcache.store.BlockKey].
        hit: ``[n]`` bool, True where the block was resident.
        slots: ``[n]`` int64, the slot that holds each block now.
        tokens: ``[n]`` int64, the tokens in each block.
        evicted: the blocks evicted to make room, in eviction order.
        bytes_loaded: bytes copied from the host store by this access.
    """

    keys: list[BlockKey]
    hit: np.ndarray
    slots: np.ndarray
    tokens: np.ndarray
    evicted: list[BlockKey] = field(default_factory=list)
    bytes_loaded: int = 0

    @property
    def hits(self) -> list[BlockKey]:
        """The blocks that were resident."""
        return [k for k, h in zip(self.keys, self.hit) if h]

    @property
    def loaded(self) -> list[BlockKey]:
        """The blocks loaded from the host store (the misses)."""
        return [k for k, h in zip(self.keys, self.hit) if not h]


@dataclass
class _Partition:
    """Slots that one set of layers shares: free ones and the policy's view of the rest."""

    capacity: int
    free: list[int]  # a stack: pop() gives the lowest free slot
    policy: FIFO


class SlotPool:
    """``num_slots`` equal slots caching blocks of ``store``, split into partitions of layers.

    Use [`UnifiedPool`][psa_ref.kvcache.pool.UnifiedPool] or [`PerLayerPool`][psa_ref.kvcache.pool.PerLayerPool]. Slot
    content:

    Attributes:
        keys: ``[num_slots, S, D]`` in the store's dtype; slot ``i`` holds ``lengths[i]`` tokens.
        values: ``[num_slots, S, D]``.
        lengths: ``[num_slots]`` int64 (0 for a free slot).
        stats: [`PoolStats`][psa_ref.kvcache.pool.PoolStats].
    """

    def __init__(self, store: HostStore, num_slots: int, policy: str, num_partitions: int):
        if not isinstance(store, HostStore):
            raise TypeError(f"store must be a psa_ref.kvcache.store.HostStore, got {type(store).__name__}")
        self.store = store
        self.num_slots = num_slots
        self.policy = _validate.choice(policy, "policy", tuple(POLICIES))
        shape = (num_slots, store.block_size, store.head_dim)
        self.keys = np.zeros(shape, store.dtype)
        self.values = np.zeros(shape, store.dtype)
        self.lengths = np.zeros(num_slots, np.int64)
        per = num_slots // num_partitions
        self._parts = [_Partition(per, list(range((p + 1) * per - 1, p * per - 1, -1)), POLICIES[policy]())
                       for p in range(num_partitions)]
        self._slot: dict[BlockKey, int] = {}  # resident block -> its slot
        self.stats = PoolStats()
        store._attach(self)

    def _partition_index(self, layer: int) -> int:
        raise NotImplementedError

    # --- the one operation the attention loop needs ------------------------------------------

    def access(self, layer: int, blocks: Iterable) -> Access:
        """Make the named blocks of ``layer`` resident; load the missing ones.

        Args:
            layer: ``0 <= layer < L``.
            blocks: ``(request, kv_head, block)`` triples, e.g. the blocks of one
                iteration of the attention loop for every request of a batch. A block
                named twice counts as two accesses (the second one a hit).

        Returns:
            [`Access`][psa_ref.kvcache.pool.Access]: hit or loaded, and the slot of each block.

        Raises:
            ValueError: a block the store does not hold, or more distinct blocks than
                the slots ``layer`` may use ([`capacity_per_layer`][psa_ref.kvcache.pool.SlotPool.capacity_per_layer]).
                Nothing changes then.
        """
        layer = self.store._check_layer(layer)
        keys, tokens = self._keys(layer, blocks)
        part = self._parts[self._partition_index(layer)]
        distinct = len(set(keys))
        if distinct > part.capacity:
            raise ValueError(f"blocks: an access of {distinct} distinct blocks cannot fit in the {part.capacity} slots "
                             f"that layer {layer} may use; access fewer blocks at a time")

        hit = np.zeros(len(keys), dtype=bool)
        slots = np.zeros(len(keys), dtype=np.int64)
        evicted: list[BlockKey] = []
        loaded_bytes = 0
        pinned = set(keys)  # every block this access names: none of them is evicted by it
        for i, key in enumerate(keys):
            slot = self._slot.get(key)
            if slot is not None:
                hit[i] = True
                part.policy.touch(key)
            else:
                if part.free:
                    slot = part.free.pop()
                else:
                    victim = part.policy.victim(pinned)
                    slot = self._slot.pop(victim)
                    part.policy.remove(victim)
                    evicted.append(victim)
                loaded_bytes += self._load(key, slot)
                self._slot[key] = slot
                part.policy.insert(key)
            slots[i] = slot

        self.stats.hits += int(hit.sum())
        self.stats.misses += int((~hit).sum())
        self.stats.evictions += len(evicted)
        self.stats.bytes_loaded += loaded_bytes
        return Access(keys, hit, slots, tokens, evicted, loaded_bytes)

    # --- inspection ---------------------------------------------------------------------------

    @property
    def capacity_per_layer(self) -> int:
        """Slots one layer may use: ``num_slots`` (unified) or ``num_slots / L`` (per layer)."""
        return self._parts[0].capacity

    def __contains__(self, key) -> bool:
        return BlockKey(*key) in self._slot

    def __len__(self) -> int:
        """Resident blocks."""
        return len(self._slot)

    def slot_of(self, key) -> int | None:
        """The slot of a resident block, None when it is not resident."""
        return self._slot.get(BlockKey(*key))

    def read(self, key) -> tuple[np.ndarray, np.ndarray]:
        """The content of a resident block, from its slot: ``(keys [n, D], values [n, D])``.

        Raises:
            KeyError: the block is not resident (access it first).
        """
        key = BlockKey(*key)
        if key not in self._slot:
            raise KeyError(f"{tuple(key)} is not resident in the pool")
        slot = self._slot[key]
        n = self.lengths[slot]
        return self.keys[slot, :n], self.values[slot, :n]

    def eviction_order(self, layer: int) -> list[BlockKey]:
        """Resident blocks that ``layer`` competes with, next victim first."""
        return self._parts[self._partition_index(self.store._check_layer(layer))].policy.order()

    def release(self, request) -> int:
        """Free every slot holding a block of ``request`` (not counted as evictions);
        the blocks stay in the host store. Returns the number of slots freed."""
        gone = [key for key in self._slot if key.request == request]
        for key in gone:
            part = self._parts[self._partition_index(key.layer)]
            slot = self._slot.pop(key)
            part.policy.remove(key)
            part.free.append(slot)
            self.lengths[slot] = 0
        return len(gone)

    # --- internals -----------------------------------------------------------------------------

    def _keys(self, layer: int, blocks) -> tuple[list[BlockKey], np.ndarray]:
        """Check the ``(request, kv_head, block)`` triples; return their keys and token counts."""
        keys, tokens = [], []
        num_tokens: dict = {}  # request -> T of this layer, looked up once per request
        s, hkv = self.store.block_size, self.store.num_kv_heads
        for item in blocks:
            try:
                request, kv_head, block = item
                kv_head, block = int(kv_head), int(block)
            except (TypeError, ValueError):
                raise TypeError(f"blocks must hold (request, kv_head, block) triples, got {item!r}") from None
            if request not in num_tokens:
                if request not in self.store:
                    raise ValueError(f"blocks: request {request!r} is not in the host store")
                num_tokens[request] = self.store.num_tokens(request, layer)
            n = min(num_tokens[request] - block * s, s)
            if not (0 <= kv_head < hkv and block >= 0 and n > 0):
                raise ValueError(f"blocks: {(request, layer, kv_head, block)} is not in the host store (request "
                                 f"{request!r} layer {layer}: {hkv} KV heads, {-(-num_tokens[request] // s)} blocks)")
            keys.append(BlockKey(request, layer, kv_head, block))
            tokens.append(n)
        return keys, np.array(tokens, dtype=np.int64)

    def _load(self, key: BlockKey, slot: int) -> int:
        """Copy a block from the host store into ``slot``; return the bytes moved."""
        k, v = self.store.read(key)
        n = k.shape[0]
        self.keys[slot, :n] = k
        self.values[slot, :n] = v
        self.lengths[slot] = n
        return n * self.store.bytes_per_token

    def _written(self, request, layer: int, first: int, last: int) -> None:
        """The store wrote tokens into blocks ``first..last`` of (request, layer): write them
        through to the slots of those that are resident."""
        for kv_head in range(self.store.num_kv_heads):
            for block in range(first, last + 1):
                key = BlockKey(request, layer, kv_head, block)
                if key in self._slot:
                    self._load(key, self._slot[key])

    def _removed(self, request) -> None:
        self.release(request)


class UnifiedPool(SlotPool):
    """One set of ``num_slots`` slots shared by every layer, with one eviction order.

    Args:
        num_slots: ``>= 1`` slots of one block of one KV head each.
        policy: ``"lru"`` (default) or ``"fifo"``.
        store: the [`HostStore`][psa_ref.kvcache.store.HostStore] the blocks come from.
    """

    def __init__(self, num_slots: int, policy: str = "lru", *, store: HostStore):
        num_slots = _validate.integer(num_slots, "num_slots", minimum=1)
        super().__init__(store, num_slots, policy, 1)

    def _partition_index(self, layer: int) -> int:
        return 0


class PerLayerPool(SlotPool):
    """``num_slots`` slots split evenly between the ``L`` layers, each with its own eviction order.

    Args:
        num_slots: a multiple of ``num_layers`` (each layer gets ``num_slots / L``
            slots; an uneven split would favour some layers, which is not the baseline).
        num_layers: ``L``; must equal ``store.num_layers``.
        policy: ``"lru"`` (default) or ``"fifo"``.
        store: the [`HostStore`][psa_ref.kvcache.store.HostStore] the blocks come from.
    """

    def __init__(self, num_slots: int, num_layers: int, policy: str = "lru", *, store: HostStore):
        num_slots = _validate.integer(num_slots, "num_slots", minimum=1)
        num_layers = _validate.integer(num_layers, "num_layers", minimum=1)
        if isinstance(store, HostStore) and num_layers != store.num_layers:
            raise ValueError(f"num_layers ({num_layers}) must equal the store's num_layers ({store.num_layers})")
        if num_slots % num_layers:
            raise ValueError(f"num_slots ({num_slots}) must be a multiple of num_layers ({num_layers}) so that "
                             "every layer gets the same share")
        super().__init__(store, num_slots, policy, num_layers)

    def _partition_index(self, layer: int) -> int:
        return layer
