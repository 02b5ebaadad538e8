"""Stateful test of the KV pools: >= 10^5 random operations against plain models.

Four pools share one host store: unified and per-layer, each with LRU and FIFO. Rules
append tokens (one or many), access random blocks (a batch of accesses per rule, drawn
from a seed, so that the operation count is large), and finish requests. After every
rule, for every pool:

* the content of every resident block equals the host store's, and equals the tokens the
  test itself appended (the store is checked against a shadow kept here);
* no partition holds more blocks than its slots;
* ``hits + misses`` equals the accesses made, and hits, misses, evictions and bytes
  equal those of a plain model: an ``OrderedDict`` (LRU) or a ``deque`` (FIFO) per
  partition, with the rule that a block of the current access is never its victim;
* the pool's eviction order equals the model's.
"""

from collections import OrderedDict, deque

import numpy as np
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test

from psa_ref.testing.kvcache import assert_pool_consistent
from psa_ref.kvcache.pool import PerLayerPool, UnifiedPool
from psa_ref.kvcache.store import BlockKey, HostStore

L, HKV, D, S = 3, 2, 3, 4
REQUESTS = (0, 1, 2, 3)
ACCESSES_PER_RULE = 250
BYTES_PER_TOKEN = 2 * D * 4  # float32

COUNTS = {"operations": 0, "accesses": 0, "evictions": 0, "finished": 0, "write_through": 0}


class PlainModel:
    """What a pool should do, written the obvious way: one container per partition, next victim first."""

    def __init__(self, num_slots: int, partitions: int, lru: bool):
        self.capacity = num_slots // partitions
        self.partitions = partitions
        self.lru = lru
        self.parts = [OrderedDict() if lru else deque() for _ in range(partitions)]
        self.hits = self.misses = self.evictions = self.bytes = 0

    def part(self, layer):
        return self.parts[layer if self.partitions > 1 else 0]

    def access(self, layer, keys, tokens):
        part, pinned, hit, evicted = self.part(layer), set(keys), [], []
        for key, n in zip(keys, tokens):
            if key in part:
                hit.append(True)
                if self.lru:
                    part.move_to_end(key)
            else:
                hit.append(False)
                if len(part) == self.capacity:
                    victim = next(k for k in part if k not in pinned)
                    if self.lru:
                        del part[victim]
                    else:
                        part.remove(victim)
                    evicted.append(victim)
                if self.lru:
                    part[key] = None
                else:
                    part.append(key)
                self.bytes += n * BYTES_PER_TOKEN
        self.hits += sum(hit)
        self.misses += len(hit) - sum(hit)
        self.evictions += len(evicted)
        return hit, evicted

    def finish(self, request):
        for i, part in enumerate(self.parts):
            kept = [k for k in part if k.request != request]
            self.parts[i] = OrderedDict.fromkeys(kept) if self.lru else deque(kept)

    def order(self, layer):
        return list(self.part(layer))


class PoolMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.store = HostStore(num_layers=L, num_kv_heads=HKV, head_dim=D, block_size=S, dtype=np.float32)
        self.pools = [UnifiedPool(9, "lru", store=self.store), UnifiedPool(9, "fifo", store=self.store),
                      PerLayerPool(9, L, "lru", store=self.store), PerLayerPool(12, L, "fifo", store=self.store)]
        self.models = [PlainModel(9, 1, True), PlainModel(9, 1, False), PlainModel(9, L, True),
                       PlainModel(12, L, False)]
        self.shadow = {}  # (request, layer) -> (keys [Hkv, T, D], values) as the test appended them

    def tokens(self, request, layer):
        return self.shadow.get((request, layer), (np.zeros((HKV, 0, D), np.float32),) * 2)[0].shape[1]

    @rule(request=st.sampled_from(REQUESTS), layer=st.integers(0, L - 1), count=st.integers(1, 12),
          one_by_one=st.booleans(), seed=st.integers(0, 2**32 - 1))
    def append(self, request, layer, count, one_by_one, seed):
        k, v = np.random.default_rng(seed).standard_normal((2, HKV, count, D)).astype(np.float32)
        resident_last = any((request, layer, h, (self.tokens(request, layer) - 1) // S) in p
                            for p in self.pools for h in range(HKV)) and self.tokens(request, layer) % S != 0
        if one_by_one:
            for t in range(count):
                self.store.append(request, layer, k[:, t], v[:, t])
        else:
            self.store.extend(request, layer, k, v)
        old = self.shadow.get((request, layer), (np.zeros((HKV, 0, D), np.float32),) * 2)
        self.shadow[request, layer] = (np.concatenate([old[0], k], axis=1), np.concatenate([old[1], v], axis=1))
        COUNTS["operations"] += 1
        COUNTS["write_through"] += resident_last

    @precondition(lambda self: self.shadow)
    @rule(seed=st.integers(0, 2**32 - 1))
    def access_many(self, seed):
        rng = np.random.default_rng(seed)
        for _ in range(ACCESSES_PER_RULE):
            layer = int(rng.integers(L))
            candidates = [(r, h, j) for (r, lay), (k, _) in self.shadow.items() if lay == layer
                          for h in range(HKV) for j in range(-(-k.shape[1] // S))]
            if not candidates:
                continue
            size = int(rng.integers(1, 4))  # <= 3 distinct: fits every partition
            picks = [candidates[i] for i in rng.choice(len(candidates), size=size)]  # repeats allowed
            keys = [BlockKey(r, layer, h, j) for r, h, j in picks]
            tokens = [min(S, self.tokens(r, layer) - j * S) for r, _, j in picks]
            for pool, model in zip(self.pools, self.models):
                acc = pool.access(layer, picks)
                hit, evicted = model.access(layer, keys, tokens)
                assert acc.hit.tolist() == hit, f"{type(pool).__name__}({pool.policy}) hits differ"
                assert acc.evicted == evicted, f"{type(pool).__name__}({pool.policy}) evicted differ"
                assert list(acc.tokens) == tokens
                COUNTS["operations"] += 1
                COUNTS["accesses"] += len(keys)
                COUNTS["evictions"] += len(evicted)

    @precondition(lambda self: self.shadow)
    @rule(data=st.data())
    def finish(self, data):
        request = data.draw(st.sampled_from(sorted({r for r, _ in self.shadow})))
        self.store.remove(request)
        for model in self.models:
            model.finish(request)
        self.shadow = {key: kv for key, kv in self.shadow.items() if key[0] != request}
        COUNTS["operations"] += 1
        COUNTS["finished"] += 1

    @invariant()
    def pools_agree_with_store_and_models(self):
        for (request, layer), (k, v) in self.shadow.items():
            for j in range(0, k.shape[1], S):
                kj, vj = self.store.read(BlockKey(request, layer, HKV - 1, j // S))
                assert np.array_equal(kj, k[-1, j : j + S]) and np.array_equal(vj, v[-1, j : j + S])
        for pool, model in zip(self.pools, self.models):
            assert_pool_consistent(pool)  # content == store, capacity, slots
            assert len(pool) <= pool.num_slots
            assert pool.stats.hits + pool.stats.misses == model.hits + model.misses
            assert (pool.stats.hits, pool.stats.misses, pool.stats.evictions, pool.stats.bytes_loaded) == \
                (model.hits, model.misses, model.evictions, model.bytes)
            for layer in range(L):
                assert pool.eviction_order(layer) == model.order(layer)


def test_pools_against_plain_models_over_1e5_operations():
    for key in COUNTS:
        COUNTS[key] = 0
    run_state_machine_as_test(PoolMachine, settings=settings(settings.default, max_examples=50,
                                                             stateful_step_count=40))
    assert COUNTS["operations"] >= 100_000, COUNTS
    # every kind of event the invariants are about really happened
    assert COUNTS["evictions"] > 1000 and COUNTS["finished"] > 10 and COUNTS["write_through"] > 0, COUNTS
    print(COUNTS)
