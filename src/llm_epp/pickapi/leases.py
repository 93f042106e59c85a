"""Leases of the direct-routing API: a real Pick reserves in-flight load on an endpoint and hands the
caller a lease; the reservation ends exactly once, when the caller releases the lease, when the lease
expires (the sweeper finishes it as incomplete) or when the server shuts down."""

from __future__ import annotations

import asyncio
import heapq
import logging
import math
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from llm_epp.requestcontrol.lifecycle import RequestRecord

log = logging.getLogger(__name__)

DEFAULT_TTL_S = 300.0
MAX_TTL_S = 3600.0
SWEEP_INTERVAL_S = 1.0


class Finisher(Protocol):
    """What ends a request; the Director is one (its `finish` is idempotent)."""

    def finish(self, record: RequestRecord, complete: bool) -> None: ...


@dataclass(slots=True)
class Lease:
    lease_id: str
    record: RequestRecord
    expires_at: float  # on the table's clock


class LeaseTable:
    """Outstanding leases by id. Lives on the event loop; no locks.

    Expiry uses a heap of (deadline, id) with lazy deletion: released leases leave their heap entry
    behind until it is popped, and the heap is rebuilt when dead entries outnumber live ones."""

    def __init__(
        self,
        finisher: Finisher,
        default_ttl_s: float = DEFAULT_TTL_S,
        max_ttl_s: float = MAX_TTL_S,
        sweep_interval_s: float = SWEEP_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not 0 < default_ttl_s <= max_ttl_s:
            raise ValueError(f"lease TTLs must satisfy 0 < default ({default_ttl_s}) <= max ({max_ttl_s})")
        if sweep_interval_s <= 0:
            raise ValueError(f"the lease sweep interval must be positive, not {sweep_interval_s}")
        self._finisher = finisher
        self.default_ttl_s = default_ttl_s
        self.max_ttl_s = max_ttl_s
        self.sweep_interval_s = sweep_interval_s
        self._clock = clock
        self._leases: dict[str, Lease] = {}
        self._heap: list[tuple[float, str]] = []

    def __len__(self) -> int:
        return len(self._leases)

    def __contains__(self, lease_id: object) -> bool:
        return lease_id in self._leases

    def ttl(self, requested_s: float) -> float:
        """The TTL a lease gets: the default for 0, otherwise the request lowered to the maximum."""
        if requested_s <= 0:
            return self.default_ttl_s
        return min(float(requested_s), self.max_ttl_s)

    def grant(self, record: RequestRecord, ttl_s: float = 0) -> Lease:
        """Holds `record` under a new lease id until it is taken, expires or the table is closed."""
        lease = Lease(str(uuid.uuid4()), record, self._clock() + self.ttl(ttl_s))
        self._leases[lease.lease_id] = lease
        heapq.heappush(self._heap, (lease.expires_at, lease.lease_id))
        return lease

    def expires_in(self, lease: Lease) -> int:
        """Whole seconds until `lease` expires (rounded up; 0 once due)."""
        return max(math.ceil(lease.expires_at - self._clock()), 0)

    def take(self, lease_id: str) -> RequestRecord | None:
        """Removes the lease and returns its record, for the caller to finish; None when the lease is
        unknown, already taken or expired."""
        lease = self._leases.pop(lease_id, None)
        if lease is None:
            return None
        if len(self._heap) > 2 * len(self._leases) + 64:
            self._compact()
        return lease.record

    def sweep(self) -> int:
        """Finishes every lease past its deadline as incomplete; returns how many."""
        now = self._clock()
        heap = self._heap
        expired = 0
        while heap and heap[0][0] <= now:
            _, lease_id = heapq.heappop(heap)
            lease = self._leases.get(lease_id)
            if lease is None:  # taken earlier: a dead heap entry
                continue
            del self._leases[lease_id]
            self._finish(lease)
            expired += 1
        if expired:
            log.info("leases_expired count=%d outstanding=%d", expired, len(self._leases))
        return expired

    def release_all(self) -> int:
        """Finishes every outstanding lease as incomplete (server shutdown); returns how many."""
        leases = list(self._leases.values())
        self._leases.clear()
        self._heap.clear()
        for lease in leases:
            self._finish(lease)
        if leases:
            log.info("leases_released_on_shutdown count=%d", len(leases))
        return len(leases)

    async def run(self) -> None:
        """The sweeper: expires leases until cancelled, then releases the ones still outstanding.
        Cancel it after the gRPC server has stopped, so Release calls in the grace period still land."""
        try:
            while True:
                await asyncio.sleep(self._next_sweep_in())
                self.sweep()
        finally:
            self.release_all()

    def _next_sweep_in(self) -> float:
        if not self._heap:
            return self.sweep_interval_s
        return min(max(self._heap[0][0] - self._clock(), 0.0), self.sweep_interval_s)

    def _finish(self, lease: Lease) -> None:
        # The director isolates plugin failures inside finish(); anything raised here is a bug.
        self._finisher.finish(lease.record, False)

    def _compact(self) -> None:
        self._heap = [(lease.expires_at, lease.lease_id) for lease in self._leases.values()]
        heapq.heapify(self._heap)
