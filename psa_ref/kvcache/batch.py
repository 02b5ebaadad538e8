"""KV cache manager, part 3: the batch controller, which decides which requests decode together.

PSA reads a request's blocks one iteration at a time, so a request does not need its
whole KV cache on the GPU to decode: it needs the blocks of **one iteration** -- ``step``
blocks per KV head, ``Hkv * step`` slots -- while the pool caches whatever else fits.
The controller admits requests on that basis:

* **FCFS**: requests wait in the order they were submitted, and only the head of the
  queue may be admitted. A request that does not fit blocks the ones behind it even if
  they would fit (head-of-line blocking): this is what guarantees that no request waits
  forever, since slots are released only as requests finish.
* **Reservation**: each running request reserves its per-iteration demand; a request is
  admitted when its demand fits in the slots not reserved (``capacity - reserved``) and,
  when ``max_batch`` is given, the batch is not full. Slots that are not reserved still
  cache blocks; they are just evictable.
* **Leaving**: [`BatchController.finish`][psa_ref.kvcache.batch.BatchController.finish] releases a finished request's
reservation.

A request whose demand exceeds the whole capacity could never run; ``submit``
refuses it at once rather than let it wait forever.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from typing import Hashable

from .. import _validate


class BatchController:
    """FCFS admission of requests by the pool slots one iteration needs.

    Args:
        capacity: the slots one layer's iteration may use: ``pool.capacity_per_layer``
            of a [`UnifiedPool`][psa_ref.kvcache.pool.UnifiedPool] or
            [`PerLayerPool`][psa_ref.kvcache.pool.PerLayerPool] (the attention loop accesses one layer at a time).
        max_batch: at most this many requests run together (None: no limit but capacity).

    Attributes:
        admitted: every request ever admitted, in admission order.
    """

    def __init__(self, capacity: int, *, max_batch: int | None = None):
        self.capacity = _validate.integer(capacity, "capacity", minimum=1)
        self.max_batch = None if max_batch is None else _validate.integer(max_batch, "max_batch", minimum=1)
        self._waiting: deque[tuple[Hashable, int]] = deque()
        self._running: OrderedDict[Hashable, int] = OrderedDict()  # request -> slots reserved
        self._seen: set = set()
        self.admitted: list = []

    @property
    def waiting(self) -> tuple:
        """Requests not yet admitted, first in line first."""
        return tuple(r for r, _ in self._waiting)

    @property
    def running(self) -> tuple:
        """Requests admitted and not finished, in admission order."""
        return tuple(self._running)

    @property
    def reserved(self) -> int:
        """Slots reserved by the running requests; never more than ``capacity``."""
        return sum(self._running.values())

    @property
    def idle(self) -> bool:
        """True when no request waits or runs."""
        return not self._waiting and not self._running

    def submit(self, request: Hashable, blocks_per_iteration: int) -> None:
        """Queue a request behind those already submitted.

        Args:
            request: any hashable not submitted before.
            blocks_per_iteration: the slots one iteration of this request needs at one
                layer, ``Hkv * step`` for PSA's loop (``>= 1``).

        Raises:
            ValueError: a request submitted twice, or a demand larger than ``capacity``
                (such a request could never be admitted).
        """
        demand = _validate.integer(blocks_per_iteration, "blocks_per_iteration", minimum=1)
        if request in self._seen:
            raise ValueError(f"request {request!r} was already submitted")
        if demand > self.capacity:
            raise ValueError(f"blocks_per_iteration ({demand}) exceeds the pool's capacity ({self.capacity} slots "
                             f"per layer): request {request!r} could never run; use a larger pool or a smaller step")
        self._seen.add(request)
        self._waiting.append((request, demand))

    def admit(self) -> list:
        """Admit waiting requests in FCFS order while the head of the queue fits; return them."""
        new = []
        while self._waiting:
            request, demand = self._waiting[0]
            if self.reserved + demand > self.capacity:
                break
            if self.max_batch is not None and len(self._running) >= self.max_batch:
                break
            self._waiting.popleft()
            self._running[request] = demand
            self.admitted.append(request)
            new.append(request)
        return new

    def finish(self, request: Hashable) -> None:
        """A running request finished: release its reservation.

        Raises:
            ValueError: ``request`` is not running.
        """
        if request not in self._running:
            raise ValueError(f"request {request!r} is not running")
        del self._running[request]
