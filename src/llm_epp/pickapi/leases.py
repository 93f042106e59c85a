"""Leases of the direct-routing API: a real Pick reserves in-flight load on an endpoint and hands the
caller a lease; the reservation ends exactly once, when the caller releases the lease, when the lease
expires (the sweeper finishes it as incomplete) or when the server shuts down.

Leases are bounded: in total (`max_leases`) and per authenticated caller (`max_leases_per_caller`). A
Pick first takes a slot (`reserve`, done by the API's guard before the pipeline runs, so concurrent
Picks cannot overshoot a cap), the grant turns the slot into the lease, and a Pick that fails gives the
slot back. A lease keeps only what finishing the request needs: the request body, the parsed payload
and the request headers are dropped when the lease is granted, so an outstanding lease costs a few
kilobytes whatever the request carried."""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import heapq
import logging
import math
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from llm_epp.framework import RequestBody
from llm_epp.requestcontrol.lifecycle import RequestRecord

log = logging.getLogger(__name__)

DEFAULT_TTL_S = 60.0
MAX_TTL_S = 600.0
SWEEP_INTERVAL_S = 1.0
DEFAULT_MAX_LEASES = 10_000
DEFAULT_MAX_LEASES_PER_CALLER = 1_000
ANONYMOUS = ""  # the caller of leases granted without a reservation (tests, in-process use)
_KEPT_HEADERS = ("x-request-id",)


class LeaseLimitError(Exception):
    """A Pick that would exceed a lease cap; the message names the cap and how to get under it."""


@dataclass(slots=True)
class Reservation:
    """A slot taken for one Pick of `caller`; `used` once the grant turned it into a lease."""

    caller: str
    used: bool = False


# The authenticated caller of the API call running in this context (None outside the guard: no check).
CURRENT_CALLER: contextvars.ContextVar[str | None] = contextvars.ContextVar("llm_epp_pick_caller", default=None)
# The reservation of the Pick running in this context (set by the API's guard around the servicer call).
CURRENT_RESERVATION: contextvars.ContextVar[Reservation | None] = contextvars.ContextVar(
    "llm_epp_pick_reservation", default=None
)


class Finisher(Protocol):
    """What ends a request; the Director is one (its `finish` is idempotent)."""

    def finish(self, record: RequestRecord, complete: bool) -> None: ...


@dataclass(slots=True)
class Lease:
    lease_id: str
    record: RequestRecord
    expires_at: float  # on the table's clock
    caller: str = ANONYMOUS


def strip_record(record: RequestRecord) -> None:
    """Drops what a held request no longer needs: the parsed payload and the headers (both sized by the
    client; the handle keeps no body bytes). What finishing it needs stays: endpoint, reservation, model
    names, the parser and the cycle state of its plugins."""
    request = record.request
    if request is not None:
        body = request.body
        record.request = dataclasses.replace(
            request,
            body=RequestBody(body.api, stream=body.stream, cache_salt=body.cache_salt[:256]),
            headers={k: v for k, v in request.headers.items() if k in _KEPT_HEADERS},
        )
    parsed = record.parsed
    if parsed is not None:
        body = parsed.body
        record.parsed = dataclasses.replace(
            parsed, body=RequestBody(body.api, stream=body.stream, cache_salt=body.cache_salt[:256])
        )


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
        max_leases: int = DEFAULT_MAX_LEASES,
        max_leases_per_caller: int = DEFAULT_MAX_LEASES_PER_CALLER,
    ) -> None:
        if not 0 < default_ttl_s <= max_ttl_s:
            raise ValueError(f"lease TTLs must satisfy 0 < default ({default_ttl_s}) <= max ({max_ttl_s})")
        if sweep_interval_s <= 0:
            raise ValueError(f"the lease sweep interval must be positive, not {sweep_interval_s}")
        if not 0 < max_leases_per_caller <= max_leases:
            raise ValueError(
                f"lease caps must satisfy 0 < per caller ({max_leases_per_caller}) <= total ({max_leases})"
            )
        self._finisher = finisher
        self.default_ttl_s = default_ttl_s
        self.max_ttl_s = max_ttl_s
        self.sweep_interval_s = sweep_interval_s
        self.max_leases = max_leases
        self.max_leases_per_caller = max_leases_per_caller
        self._clock = clock
        self._leases: dict[str, Lease] = {}
        self._heap: list[tuple[float, str]] = []
        self._held = 0  # leases plus reservations not yet granted
        self._by_caller: dict[str, int] = {}  # the same, per caller (absent = 0)

    def __len__(self) -> int:
        return len(self._leases)

    def __contains__(self, lease_id: object) -> bool:
        return lease_id in self._leases

    def ttl(self, requested_s: float) -> float:
        """The TTL a lease gets: the default for 0, otherwise the request lowered to the maximum."""
        if requested_s <= 0:
            return self.default_ttl_s
        return min(float(requested_s), self.max_ttl_s)

    def held_by(self, caller: str) -> int:
        """Leases and pending reservations of `caller`."""
        return self._by_caller.get(caller, 0)

    def reserve(self, caller: str) -> Reservation:
        """Takes a slot for one Pick of `caller`; raises LeaseLimitError when a cap is reached."""
        held = self._by_caller.get(caller, 0)
        if held >= self.max_leases_per_caller:
            raise LeaseLimitError(
                f"caller {caller or 'anonymous'} holds {held} leases, the limit per caller "
                f"(--pick-api-max-leases-per-caller {self.max_leases_per_caller}): release leases first, "
                "or pick with dry_run"
            )
        if self._held >= self.max_leases:
            raise LeaseLimitError(
                f"{self._held} leases are outstanding, the server's limit (--pick-api-max-leases "
                f"{self.max_leases}): release leases or retry later"
            )
        self._count(caller, 1)
        return Reservation(caller)

    def unreserve(self, reservation: Reservation) -> None:
        """Gives back a slot the Pick did not use (it failed or was a dry run). Idempotent."""
        if not reservation.used:
            reservation.used = True
            self._count(reservation.caller, -1)

    def grant(self, record: RequestRecord, ttl_s: float = 0) -> Lease:
        """Holds `record` under a new lease id until it is taken, expires or the table is closed. Uses the
        reservation of the current Pick when there is one (its caller owns the lease)."""
        reservation = CURRENT_RESERVATION.get()
        if reservation is not None and not reservation.used:
            reservation.used = True  # the slot becomes the lease; the counts already include it
            caller = reservation.caller
        else:
            caller = ANONYMOUS
            self._count(caller, 1)
        strip_record(record)
        lease = Lease(str(uuid.uuid4()), record, self._clock() + self.ttl(ttl_s), caller)
        self._leases[lease.lease_id] = lease
        heapq.heappush(self._heap, (lease.expires_at, lease.lease_id))
        return lease

    def _count(self, caller: str, delta: int) -> None:
        self._held += delta
        n = self._by_caller.get(caller, 0) + delta
        if n > 0:
            self._by_caller[caller] = n
        else:
            self._by_caller.pop(caller, None)

    def expires_in(self, lease: Lease) -> int:
        """Whole seconds until `lease` expires (rounded up; 0 once due)."""
        return max(math.ceil(lease.expires_at - self._clock()), 0)

    def take(self, lease_id: str) -> RequestRecord | None:
        """Removes the lease and returns its record, for the caller to finish; None when the lease is
        unknown, already taken or expired, or belongs to another authenticated caller."""
        lease = self._leases.get(lease_id)
        if lease is None:
            return None
        caller = CURRENT_CALLER.get()
        if caller is not None and caller != lease.caller:
            return None
        del self._leases[lease_id]
        self._count(lease.caller, -1)
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
            self._count(lease.caller, -1)
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
            self._count(lease.caller, -1)
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
