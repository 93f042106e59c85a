"""In-flight eviction (`flowControl.enableEviction`): when a band with queued requests is blocked by pool
saturation, dispatched requests of a strictly lower priority that the eviction filter accepts are ended
early so the queued work can run.

Two parts, both on the event loop:

- `RequestEvictor` knows every dispatched request (tracked when the director schedules it, untracked when
  it finishes) and keeps the evictable ones in the eviction ordering policy's order. Evicting a request
  resolves its `signal` future; the protocol adapter waiting on it ends the request (ext_proc: an immediate
  429 "request evicted by flow control", which makes Envoy reset the upstream request). The request then
  finishes as usual, and that finish confirms the eviction.
- `Reclamation` decides when to evict and how many, in the saturation detector's units: the deficit
  `saturation - ceiling` of the blocked band divided by the mean footprint of a dispatched request
  (`saturation / in_flight`), at least 1 and at most `max_per_decision`. Decisions are paced stop-and-wait:
  the next one may run only after every earlier eviction is confirmed (or `confirmation_timeout` passed)
  and a further `grace`, the time the saturation signal needs to show the freed capacity.

Requests are keyed by an object the caller owns (the director's handle), never by the client-chosen
request id, so two requests sharing an id cannot untrack or evict each other.
"""

from __future__ import annotations

import asyncio
import heapq
import math
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from llm_epp.framework.flowpolicy import EvictionFilterPolicy, EvictionItem, EvictionOrderingPolicy

MAX_REVOCATIONS_PER_DECISION = 2
CONFIRMATION_TIMEOUT_S = 10.0
ENGINE_RECLAIM_BUDGET_S = 0.25
"""The engine's abort and KV release between a stream's end and the freed blocks showing in its metrics."""
LEADING_SENSOR_GRACE_S = 0.01
"""For a detector whose signal drops the moment the request ends (concurrency-detector): dispatch jitter."""
LEADING_SENSORS = frozenset({"concurrency-detector"})

CONFIRMED = "confirmed"
TIMED_OUT = "timed_out"


def confirmation_grace(detector_type: str, metrics_lag: float) -> float:
    """How long freed capacity takes to show in the saturation signal: a scraped detector sees it after the
    engine released it and a fresh scrape landed (`metrics_lag` = refresh interval + staleness threshold)."""
    if detector_type in LEADING_SENSORS:
        return LEADING_SENSOR_GRACE_S
    return metrics_lag + ENGINE_RECLAIM_BUDGET_S


@runtime_checkable
class ReclamationObserver(Protocol):
    """Where eviction decisions are reported (metrics)."""

    def revocations_issued(self, priority: int, n: int) -> None: ...

    def revocation_ended(self, outcome: str, duration: float | None) -> None:
        """`outcome` CONFIRMED (with the issue-to-confirmation `duration`) or TIMED_OUT (None)."""
        ...

    def reclaim_target(self, value: float) -> None: ...

    def pending_reclaim(self, value: float) -> None: ...


class _Tracked:
    __slots__ = ("alive", "evicted", "item", "key", "order", "signal")

    def __init__(
        self, key: Hashable, item: EvictionItem, order: EvictionOrderingPolicy, signal: asyncio.Future[None] | None
    ) -> None:
        self.key = key
        self.item = item
        self.order = order
        self.signal = signal
        self.alive = True  # in the heap and not yet popped or untracked
        self.evicted = False

    def __lt__(self, other: _Tracked) -> bool:
        return self.order.evict_before(self.item, other.item)


class RequestEvictor:
    def __init__(self, ordering: EvictionOrderingPolicy, filter: EvictionFilterPolicy) -> None:
        self.ordering = ordering
        self.filter = filter
        self._tracked: dict[Hashable, _Tracked] = {}
        self._heap: list[_Tracked] = []
        self._evictable = 0
        self.on_evicted_ended: Callable[[Hashable], None] | None = None
        """Called once for each evicted request when it ends (the eviction's confirmation)."""

    def track(self, key: Hashable, item: EvictionItem) -> asyncio.Future[None] | None:
        """Registers a dispatched request. Returns the future resolved when it is evicted, or None when the
        filter policy never lets it be evicted."""
        self.untrack(key)
        signal: asyncio.Future[None] | None = None
        accepted = self.filter.accept(item)
        if accepted:
            signal = asyncio.get_running_loop().create_future()
        t = _Tracked(key, item, self.ordering, signal)
        self._tracked[key] = t
        if accepted:
            heapq.heappush(self._heap, t)
            self._evictable += 1
        else:
            t.alive = False
        return signal

    def untrack(self, key: Hashable) -> None:
        """The request ended (idempotent). Confirms its eviction if it was evicted."""
        t = self._tracked.pop(key, None)
        if t is None:
            return
        if t.alive:
            t.alive = False
            self._evictable -= 1
            self._compact()
        if t.evicted and self.on_evicted_ended is not None:
            self.on_evicted_ended(key)

    def _compact(self) -> None:
        heap = self._heap
        while heap and not heap[0].alive:
            heapq.heappop(heap)
        if len(heap) > 2 * self._evictable + 16:  # many dead entries: rebuild
            self._heap = [t for t in heap if t.alive]
            heapq.heapify(self._heap)

    def peek_victim_priority(self) -> int | None:
        self._compact()
        return self._heap[0].item.priority if self._heap else None

    def stats(self) -> tuple[int, int]:
        """(dispatched requests tracked, of which evictable)."""
        return len(self._tracked), self._evictable

    def evict_n(self, n: int, priority_bound: int) -> list[Hashable]:
        """Evicts up to `n` requests in the ordering policy's order, stopping at the first whose priority is
        not strictly below `priority_bound`. Returns their keys."""
        out: list[Hashable] = []
        while len(out) < n:
            self._compact()
            if not self._heap:
                break
            head = self._heap[0]
            if head.item.priority >= priority_bound:
                break
            heapq.heappop(self._heap)
            head.alive = False
            self._evictable -= 1
            head.evicted = True
            if head.signal is not None and not head.signal.done():
                head.signal.set_result(None)
            out.append(head.key)
        return out


@dataclass(frozen=True, slots=True)
class ReclamationConfig:
    grace: float
    max_per_decision: int = MAX_REVOCATIONS_PER_DECISION
    confirmation_timeout: float = CONFIRMATION_TIMEOUT_S


class Reclamation:
    """Sizing and pacing of evictions (see the module docstring). `now` is event-loop seconds."""

    def __init__(
        self,
        evictor: RequestEvictor,
        config: ReclamationConfig,
        clock: Callable[[], float],
        observer: ReclamationObserver | None = None,
    ) -> None:
        self.evictor = evictor
        self.config = config
        self._clock = clock
        self._observer = observer
        self._outstanding: dict[Hashable, tuple[float, float]] = {}  # key -> (credit, issued at)
        self._cooling: list[tuple[float, float]] = []  # (credit, expires at)
        self.pending = 0.0
        evictor.on_evicted_ended = self.confirm

    def gate_open(self, now: float) -> bool:
        self._sweep_timeouts(now)
        self._expire_cooling(now)
        return not self._outstanding and not self._cooling

    def reclaim(self, saturation: float, ceiling: float, demand_priority: int, now: float) -> list[Hashable]:
        """One decision for a band at `demand_priority` blocked at `ceiling`; returns the evicted keys."""
        in_flight, evictable = self.evictor.stats()
        if in_flight <= 0 or evictable <= 0:
            return []
        credit = saturation / in_flight
        if not credit > 0 or math.isinf(credit):
            return []
        target = saturation - ceiling
        net = target - self.pending
        obs = self._observer
        if obs is not None:
            obs.reclaim_target(target)
        if net < 0 or (net == 0 and self.pending > 0):
            return []
        n = min(max(1, math.ceil(net / credit)), self.config.max_per_decision, evictable)
        evicted = self.evictor.evict_n(n, demand_priority)
        for key in evicted:
            self._outstanding[key] = (credit, now)
            self.pending += credit
        if obs is not None:
            if evicted:
                obs.revocations_issued(demand_priority, len(evicted))
            obs.pending_reclaim(self.pending)
        return evicted

    def confirm(self, key: Hashable) -> None:
        entry = self._outstanding.pop(key, None)
        if entry is None:
            return
        now = self._clock()
        credit, issued = entry
        self._cooling.append((credit, now + self.config.grace))
        if self._observer is not None:
            self._observer.revocation_ended(CONFIRMED, now - issued)

    def _sweep_timeouts(self, now: float) -> None:
        timeout = self.config.confirmation_timeout
        for key, (credit, issued) in list(self._outstanding.items()):
            if now - issued < timeout:
                continue
            del self._outstanding[key]
            self._cooling.append((credit, now + self.config.grace))
            if self._observer is not None:
                self._observer.revocation_ended(TIMED_OUT, None)

    def _expire_cooling(self, now: float) -> None:
        if not self._cooling:
            return
        kept = [(c, t) for c, t in self._cooling if now < t]
        if len(kept) == len(self._cooling):
            return
        self.pending -= sum(c for c, t in self._cooling if now >= t)
        self._cooling = kept
        # nothing left to wait for: zero, not the rounding residue of the sums
        self.pending = max(self.pending, 0.0) if kept or self._outstanding else 0.0
        if self._observer is not None:
            self._observer.pending_reclaim(self.pending)
