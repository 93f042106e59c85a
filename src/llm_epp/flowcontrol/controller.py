"""The flow controller: every request waits in `enqueue_and_wait` until the dispatch cycle lets it through,
its time to live runs out, the queues are full, or its caller goes away.

Dispatch cycle (synchronous, on the event loop): measure the whole pool's saturation with the saturation
detector, ask the usage-limit policy for one ceiling per band (configured bands and those provisioned for
priorities seen since, highest priority first), and walk
the bands from high to low; the cycle stops at the first band whose ceiling the saturation reaches (so a
lower band never overtakes a blocked higher one); otherwise the band's fairness policy picks a flow and the
flow's ordering policy its head, which is released. One request is released per cycle. The next cycle
runs once the released request has been scheduled and its load counted (`Ticket.settle`), when a request
ends (`notify`), on enqueue, and every `poll_interval` seconds while requests wait (metrics change).

With a saturation detector that implements `DispatchAffinity` (window > 0), the picked flow's request is
chosen among its first requests by where their prefixes are held (`dispatch.py`); otherwise, and always with
upstream's detectors, strictly the first. A detector that also implements `DispatchGroups` adds to that window
the oldest queued request of each prefix group it has in flight (grouped dispatch). With such a detector, a
band whose ceiling is 1.0 and which the saturation reaches may still release a request that fits where its
prefix is held (on its real size, not a typical request's); if none does it stops the cycle as any blocked
band (its fairness turn unchanged), and an empty one does not stop it.

With eviction on (`config.eviction`), a cycle stopped by a blocked band also asks the reclamation whether to
evict dispatched lower-priority requests for it (`eviction.py`).
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from llm_epp.flowcontrol.config import FlowControlConfig
from llm_epp.flowcontrol.dispatch import choose
from llm_epp.flowcontrol.eviction import (
    Reclamation,
    ReclamationConfig,
    ReclamationObserver,
    RequestEvictor,
    confirmation_grace,
)
from llm_epp.flowcontrol.queues import DISPATCHED, FINISHED, QUEUED, Band, FlowQueue, Item
from llm_epp.framework.errors import EppError, ErrorCode
from llm_epp.framework.flowcontrol import DispatchAffinity, DispatchGroups, SaturationDetector
from llm_epp.framework.flowpolicy import FlowKey
from llm_epp.framework.types import Endpoint, InferenceRequest

log = logging.getLogger(__name__)

POLL_INTERVAL_S = 0.05


class _Held:
    """A flow holding its requests for their prefixes' endpoints (nothing released, nothing overtakes)."""


_HELD = _Held()

METRICS_LAG_S = 0.05 + 2.0
"""Default refresh interval + staleness threshold of scraped metrics (`--refresh-metrics-interval`,
`--metrics-staleness-threshold`)."""


class QueueOutcome(enum.Enum):
    """The final state of a request in flow control (the `outcome` metric label, upstream's names)."""

    DISPATCHED = "Dispatched"
    REJECTED_CAPACITY = "RejectedCapacity"
    REJECTED_OTHER = "RejectedOther"
    EVICTED_TTL = "EvictedTTL"
    EVICTED_CONTEXT_CANCELLED = "EvictedContextCancelled"
    EVICTED_OTHER = "EvictedOther"


class FlowControlObserver(Protocol):
    """Where the controller reports what it does (metrics)."""

    def enqueued(self, request: InferenceRequest, outcome: QueueOutcome | None, duration: float) -> None:
        """The enqueue step took `duration` s; `outcome` None means the request was queued."""
        ...

    def queue_changed(self, request: InferenceRequest, count: int, size_bytes: int) -> None:
        """`count` requests (+1 queued, -1 left) of `size_bytes` each for the request's flow."""
        ...

    def finished(self, request: InferenceRequest, outcome: QueueOutcome, waited: float) -> None: ...

    def dispatch_cycle(self, duration: float) -> None: ...

    def pool_saturation(self, saturation: float) -> None: ...


class FlowControlRejected(EppError):
    """A request flow control did not let through; `outcome` says why."""

    def __init__(self, code: ErrorCode, message: str, outcome: QueueOutcome, reason: str) -> None:
        super().__init__(code, message)
        self.outcome = outcome
        self.reason = reason


class Ticket:
    """A released request. `settle()` once its load is counted (or it failed): the next cycle may run."""

    __slots__ = ("_controller", "_done")

    def __init__(self, controller: FlowController | None) -> None:
        self._controller = controller
        self._done = controller is None

    def settle(self) -> None:
        if self._done:
            return
        self._done = True
        assert self._controller is not None
        self._controller._settled()


class FlowController:
    def __init__(
        self,
        config: FlowControlConfig,
        saturation: SaturationDetector,
        endpoints: Callable[[], Sequence[Endpoint]],
        observer: FlowControlObserver | None = None,
        *,
        poll_interval: float = POLL_INTERVAL_S,
        metrics_lag: float = METRICS_LAG_S,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.config = config
        self.saturation = saturation
        self._endpoints = endpoints
        self._observer = observer
        self._poll_interval = poll_interval
        self.bands: dict[int, Band] = {}
        self._priorities: list[int] = []  # every band's priority, highest first
        for priority in config.bands:
            self._band(priority)
        self.length = 0
        self.bytes = 0
        self.unsettled = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._kick: asyncio.Handle | None = None
        self._poll: asyncio.TimerHandle | None = None
        self.last_saturation = 0.0
        self._regime: bool | None = None  # whether the pool had endpoints when last looked at
        self._clock = clock
        self.affinity: DispatchAffinity | None = None
        self.groups: DispatchGroups | None = None
        if isinstance(saturation, DispatchAffinity) and saturation.dispatch_window > 0:
            self.affinity = saturation
            if isinstance(saturation, DispatchGroups):
                self.groups = saturation
        self.evictor: RequestEvictor | None = None
        self.reclamation: Reclamation | None = None
        if config.eviction is not None:
            self.evictor = RequestEvictor(config.eviction.ordering, config.eviction.filter)
            grace = confirmation_grace(saturation.typed_name.type, metrics_lag)
            self.reclamation = Reclamation(
                self.evictor,
                ReclamationConfig(grace=grace),
                self.now,
                observer if isinstance(observer, ReclamationObserver) else None,
            )

    def now(self) -> float:
        """Event-loop seconds (the clock of dispatch and eviction times)."""
        if self._clock is not None:
            return self._clock()
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        return loop.time()

    # --- request side -----------------------------------------------------------------------------------
    async def enqueue_and_wait(self, request: InferenceRequest, received_at: float | None = None) -> Ticket:
        """Waits until the request may be scheduled. Raises FlowControlRejected (429 when the queues are
        full, 503 when its time to live ran out). When the calling task is cancelled the request leaves
        its queue and is never released."""
        loop = asyncio.get_running_loop()
        self._loop = loop
        t0 = time.perf_counter()
        now = loop.time()
        key = FlowKey(request.fairness_id, request.priority)
        band = self._band(key.priority)
        problem = self._capacity_problem(band, request.size_bytes)
        obs = self._observer
        if problem is not None:
            if obs is not None:
                obs.enqueued(request, QueueOutcome.REJECTED_CAPACITY, time.perf_counter() - t0)
                obs.finished(request, QueueOutcome.REJECTED_CAPACITY, 0.0)
            raise FlowControlRejected(
                ErrorCode.RESOURCE_EXHAUSTED,
                f"request rejected by flow control: queue at capacity ({problem}); retry later",
                QueueOutcome.REJECTED_CAPACITY,
                "rejected-saturated",
            )
        has_endpoints = bool(self._endpoints())
        if self._regime is None:
            self._regime = has_endpoints
        ttl = self.config.request_ttl if has_endpoints else self.config.no_endpoint_request_ttl
        future: asyncio.Future[None] = loop.create_future()
        item = Item(request, key, now, received_at if received_at is not None else now, ttl or None, future)
        if self.affinity is not None:
            item.affinity = self.affinity.affinity_key(request)
            if self.groups is not None:
                item.group = self.groups.group_key(item.affinity)
        band.add(item)
        self.length += 1
        self.bytes += item.size_bytes
        if item.ttl is not None:
            item.timer = loop.call_later(item.ttl, self._expire, item, has_endpoints)
        if obs is not None:
            obs.enqueued(request, None, time.perf_counter() - t0)
            obs.queue_changed(request, 1, item.size_bytes)
        self._cycle()
        try:
            await future
        except asyncio.CancelledError:
            if item.state == QUEUED:  # the client went away while waiting
                self._leave(item, band, QueueOutcome.EVICTED_CONTEXT_CANCELLED)
            elif item.state == DISPATCHED:  # released, but its caller is gone before using it
                item.state = FINISHED
                self._settled()
            raise
        item.state = FINISHED
        return Ticket(self)

    def notify(self) -> None:
        """Capacity may have freed (a request ended): run a dispatch cycle soon."""
        loop = self._loop
        if loop is None or self._kick is not None or not self.length:
            return
        self._kick = loop.call_soon(self._kicked)

    # --- internals ----------------------------------------------------------------------------------------
    def _band(self, priority: int) -> Band:
        band = self.bands.get(priority)
        if band is None:
            band = self.bands[priority] = Band(self.config.band_for(priority))
            self._priorities = sorted(self.bands, reverse=True)
        return band

    def _capacity_problem(self, band: Band, size: int) -> str | None:
        cfg, bcfg = self.config, band.config
        if cfg.max_requests and self.length + 1 > cfg.max_requests:
            return f"flowControl.maxRequests {cfg.max_requests} requests queued"
        if cfg.max_bytes and self.bytes + size > cfg.max_bytes:
            return f"flowControl.maxBytes {cfg.max_bytes} bytes queued"
        if bcfg.max_requests and band.length + 1 > bcfg.max_requests:
            return f"priority band {band.priority}: maxRequests {bcfg.max_requests} requests queued"
        if bcfg.max_bytes and band.bytes + size > bcfg.max_bytes:
            return f"priority band {band.priority}: maxBytes {bcfg.max_bytes} bytes queued"
        return None

    def _leave(self, item: Item, band: Band, outcome: QueueOutcome) -> None:
        """Takes a queued item out of its queue and accounts for it."""
        q = band.flows.get(item.key.id)
        if q is not None:
            q.remove(item)
        self._account_exit(item, band, outcome)
        item.state = FINISHED

    def _account_exit(self, item: Item, band: Band, outcome: QueueOutcome) -> None:
        band.take(item)
        self.length -= 1
        self.bytes -= item.size_bytes
        if item.timer is not None:
            item.timer.cancel()
            item.timer = None
        obs = self._observer
        if obs is not None:
            loop = self._loop
            waited = loop.time() - item.enqueued_at if loop is not None else 0.0
            obs.queue_changed(item.request, -1, item.size_bytes)
            obs.finished(item.request, outcome, waited)

    def _expire(self, item: Item, had_endpoints: bool) -> None:
        item.timer = None
        if item.state != QUEUED:
            return
        band = self.bands[item.key.priority]
        self._leave(item, band, QueueOutcome.EVICTED_TTL)
        if not item.future.done():
            message, reason = "request timed out in queue", "rejected-ttl-expired"
            if not had_endpoints or not self._endpoints():
                message, reason = message + " and no endpoints are available", "rejected-no-endpoints"
            item.future.set_exception(
                FlowControlRejected(
                    ErrorCode.SERVICE_UNAVAILABLE,
                    f"{message} (after {item.ttl:g}s); retry later",
                    QueueOutcome.EVICTED_TTL,
                    reason,
                )
            )

    def _settled(self) -> None:
        self.unsettled = max(self.unsettled - 1, 0)
        self.notify()

    def _kicked(self) -> None:
        self._kick = None
        self._cycle()

    def _polled(self) -> None:
        self._poll = None
        self._cycle()

    def _cycle(self) -> None:
        """One dispatch cycle; re-arms the poll timer while requests wait."""
        if self.unsettled or not self.length:
            return
        t0 = time.perf_counter()
        try:
            self._dispatch_one()
        except Exception:  # a policy failed: keep the loop alive, retry on the next cycle
            log.exception("flow_control_dispatch_failed")
        obs = self._observer
        if obs is not None:
            obs.dispatch_cycle(time.perf_counter() - t0)
        if self.length and self._poll is None and self._loop is not None:
            self._poll = self._loop.call_later(self._poll_interval, self._polled)

    def _rebudget(self, has_endpoints: bool) -> None:
        """The pool gained or lost all its endpoints: every waiting request gets the budget of the new
        regime from now on, but never waits longer in total than the longer of the two budgets."""
        loop = self._loop
        if loop is None:
            return
        now = loop.time()
        cfg = self.config
        ttl = cfg.request_ttl if has_endpoints else cfg.no_endpoint_request_ttl
        longest = cfg.longest_wait()
        for band in self.bands.values():
            for q in band.flows.values():
                for item in q.items():
                    if item.timer is not None:
                        item.timer.cancel()
                        item.timer = None
                    deadline = None if ttl is None else now + ttl
                    if longest is not None:
                        cap = item.enqueued_at + longest
                        deadline = cap if deadline is None else min(deadline, cap)
                    item.ttl = None if deadline is None else deadline - item.enqueued_at
                    if deadline is not None:
                        item.timer = loop.call_at(deadline, self._expire, item, has_endpoints)
                q.reorder()  # deadline orderings see the new budgets

    def _dispatch_one(self) -> None:
        endpoints = self._endpoints()
        has_endpoints = bool(endpoints)
        if self._regime is not None and has_endpoints != self._regime:
            self._rebudget(has_endpoints)
        self._regime = has_endpoints
        saturation = self.saturation.saturation(endpoints)
        self.last_saturation = saturation
        obs = self._observer
        if obs is not None:
            obs.pool_saturation(saturation)
        active = self._priorities
        ceilings = [1.0] * len(active)
        self.config.usage_limit.compute_limit(saturation, active, ceilings)
        affinity = self.affinity
        for i, (priority, ceiling) in enumerate(zip(active, ceilings, strict=True)):
            band = self.bands[priority]
            saturated = saturation >= ceiling
            if saturated and (affinity is None or ceiling < 1.0 or band.length):
                # with affinity and a full ceiling, a request that fits at home on its real size may still go;
                # a look that releases nothing leaves the fairness policy's turn where it was
                item: Item | _Held | None = None
                if affinity is not None and ceiling >= 1.0:
                    turn = band.save_state()
                    item = self._pick(band, endpoints, affinity, True)
                    if not isinstance(item, Item):
                        band.restore_state(turn)
                if not isinstance(item, Item):
                    if self.reclamation is not None:
                        self._maybe_reclaim(saturation, active, ceilings, i)
                    return  # head-of-line blocking keeps strict priority
                self._release(item, band)
                return
            if not band.length:
                continue  # (saturated only with affinity: an empty band holds nothing back)
            item = self._pick(band, endpoints, affinity, False)
            if isinstance(item, _Held):
                return  # the band holds its requests for their prefixes' endpoints: strict priority
            if item is None:
                continue
            self._release(item, band)
            return

    def _pick(
        self, band: Band, endpoints: Sequence[Endpoint], affinity: DispatchAffinity | None, saturated: bool
    ) -> Item | _Held | None:
        """The request the band releases now (its fairness policy's flow, then in order or by affinity); None
        when the band has nothing to release, `_HELD` when the flow holds its requests for their prefixes."""
        view = band.config.fairness.pick_flow(band)
        if view is None:
            return None
        q = band.flows.get(view.key.id)
        if q is None:
            return None
        if affinity is None:
            return q.pop()
        item = self._pick_by_affinity(q, endpoints, affinity, saturated)
        return _HELD if item is None and len(q) else item

    def _release(self, item: Item, band: Band) -> None:
        self._account_exit(item, band, QueueOutcome.DISPATCHED)
        item.state = DISPATCHED
        self.unsettled += 1
        item.future.set_result(None)

    def _pick_by_affinity(
        self, q: FlowQueue, endpoints: Sequence[Endpoint], affinity: DispatchAffinity, saturated: bool
    ) -> Item | None:
        """Takes the request to release out of `q` (see `dispatch.py`), or None to hold them all."""
        window = q.pop_window(affinity.dispatch_window)
        if not window:
            return None
        now = self.now()
        since: list[float] = []
        for item in window:
            if item.in_window_since is None:
                item.in_window_since = now
            since.append(item.in_window_since)
        candidates = window
        if self.groups is not None and q.group_count:
            try:
                mates = self._group_mates(q, window)
            except Exception:
                q.restore(window)
                raise
            if mates:
                candidates = window + mates
                since.extend([now] * len(mates))  # never released by age: they are not among the first
        try:
            fits = [affinity.placement(item.affinity, endpoints) for item in candidates]
        except Exception:
            q.restore(window)  # a failing detector loses no request; the cycle logs it and retries
            raise
        placements = [f[0] for f in fits]
        costs = [f[1] for f in fits]
        chosen = choose(placements, since, now, affinity.dispatch_max_wait, costs, saturated=saturated)
        picked: Item | None = None
        if chosen is not None and chosen >= len(window):
            picked = candidates[chosen]
            q.remove(picked)
        elif chosen is not None:
            picked = window.pop(chosen)
        q.restore(window)
        return picked

    def _group_mates(self, q: FlowQueue, window: list[Item]) -> list[Item]:
        """The oldest queued request of each prefix group in flight now, beyond the window (at most the
        window's size of them: grouped dispatch at most doubles the placements asked per cycle)."""
        groups = self.groups
        assert groups is not None
        hot, queued = groups.hot_groups(), q.groups()
        small, large = (hot, queued) if len(hot) <= len(queued) else (queued, hot)
        skip = {item.seq for item in window}
        most = len(window)  # the window is full when anything lies beyond it
        mates: list[Item] = []
        for group in small:
            if group in large:
                item = q.group_head(group, skip)
                if item is not None:
                    mates.append(item)
                    if len(mates) >= most:
                        break
        return mates

    def _maybe_reclaim(self, saturation: float, priorities: list[int], ceilings: list[float], first: int) -> None:
        """The cycle stopped at band `first`: evict for the highest blocked band that has queued requests of a
        priority strictly above the next victim's (never for a band of the victim's own priority)."""
        reclamation = self.reclamation
        assert reclamation is not None and self.evictor is not None
        now = self.now()
        if not reclamation.gate_open(now):
            return
        victim = self.evictor.peek_victim_priority()
        if victim is None:
            return
        for j in range(first, len(priorities)):
            priority = priorities[j]
            if priority <= victim:
                return
            ceiling = ceilings[j]
            if ceiling <= 0 or saturation < ceiling:
                continue  # a zero ceiling never dispatches; an open band dispatches on a later cycle
            if not self.bands[priority].length:
                continue
            reclamation.reclaim(saturation, ceiling, priority, now)
            return
