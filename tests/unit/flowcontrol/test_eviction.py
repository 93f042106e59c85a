"""In-flight eviction: the evictor's order and bound, the reclamation's sizing and pacing, and the
controller evicting a dispatched sheddable request for a blocked higher band (real asyncio loop)."""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from llm_epp.flowcontrol import FlowController
from llm_epp.flowcontrol.config import EvictionPolicies
from llm_epp.flowcontrol.eviction import (
    CONFIRMED,
    LEADING_SENSOR_GRACE_S,
    TIMED_OUT,
    Reclamation,
    ReclamationConfig,
    RequestEvictor,
    confirmation_grace,
)
from llm_epp.framework.flowpolicy import EvictionItem
from llm_epp.plugins.flowcontrol.priority_then_time_eviction_order_policy import PriorityThenTimeEvictionOrderPolicy
from llm_epp.plugins.flowcontrol.sheddable_eviction_filter import SheddableEvictionFilter
from tests.unit.flowcontrol.support import Saturation, config, controller, req, settle_loop


def _item(rid: str, priority: int, at: float) -> EvictionItem:
    return EvictionItem(rid, priority, at, "10.0.0.1:8000", req(rid, priority=priority))


def _evictor() -> RequestEvictor:
    return RequestEvictor(PriorityThenTimeEvictionOrderPolicy(), SheddableEvictionFilter())


class Observed:
    def __init__(self) -> None:
        self.issued: list[tuple[int, int]] = []
        self.ended: list[str] = []
        self.pending: list[float] = []
        self.targets: list[float] = []

    def revocations_issued(self, priority: int, n: int) -> None:
        self.issued.append((priority, n))

    def revocation_ended(self, outcome: str, duration: float | None) -> None:
        self.ended.append(outcome)

    def reclaim_target(self, value: float) -> None:
        self.targets.append(value)

    def pending_reclaim(self, value: float) -> None:
        self.pending.append(value)


async def test_only_sheddable_requests_get_a_signal_and_untrack_is_idempotent() -> None:
    ev = _evictor()
    assert ev.track("k0", _item("a", 0, 1.0)) is None
    signal = ev.track("k1", _item("b", -1, 2.0))
    assert signal is not None and not signal.done()
    assert ev.stats() == (2, 1) and ev.peek_victim_priority() == -1
    ev.untrack("k1")
    ev.untrack("k1")
    assert ev.stats() == (1, 0) and ev.peek_victim_priority() is None
    assert ev.evict_n(5, 10) == [] and not signal.done()


async def test_requests_sharing_a_request_id_are_tracked_apart() -> None:
    ev = _evictor()
    s1 = ev.track("handle-1", _item("same", -1, 1.0))
    s2 = ev.track("handle-2", _item("same", -1, 2.0))
    assert ev.stats() == (2, 2)
    ev.untrack("handle-2")
    assert ev.evict_n(2, 0) == ["handle-1"]
    assert s1 is not None and s1.done() and s2 is not None and not s2.done()


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(-4, 2), st.floats(0, 100, allow_nan=False)), min_size=1, max_size=30),
    st.integers(0, 10),
    st.integers(-4, 3),
)
def test_evict_n_takes_victims_in_order_and_never_at_or_above_the_bound(
    entries: list[tuple[int, float]], n: int, bound: int
) -> None:
    async def run() -> None:
        ev = _evictor()
        for i, (p, at) in enumerate(entries):
            ev.track(i, _item(str(i), p, at))
        evicted = ev.evict_n(n, bound)
        eligible = sorted(
            (i for i, (p, _) in enumerate(entries) if p < 0 and p < bound),
            key=lambda i: (entries[i][0], -entries[i][1]),
        )
        assert len(evicted) == min(n, len(eligible))
        got = [(entries[i][0], -entries[i][1]) for i in evicted]
        assert got == sorted(got), "lowest priority first, then newest dispatch"
        assert all(entries[i][0] < min(bound, 0) for i in evicted)
        # the ones left over come after every evicted one
        left = [(entries[i][0], -entries[i][1]) for i in eligible if i not in evicted]
        assert not got or not left or max(got) <= min(left)

    asyncio.run(run())


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


async def test_reclamation_sizes_by_the_deficit_and_waits_for_confirmation_and_grace() -> None:
    ev = _evictor()
    clock, seen = Clock(), Observed()
    rec = Reclamation(ev, ReclamationConfig(grace=1.0, max_per_decision=2), clock, seen)
    for i in range(4):  # four dispatched sheddable requests: mean footprint 1.2 / 4 = 0.3
        ev.track(i, _item(str(i), -1, float(i)))
    assert rec.gate_open(0.0)
    evicted = rec.reclaim(1.2, 1.0, 5, 0.0)  # deficit 0.2 -> one eviction
    assert evicted == [3], "the newest dispatched goes first"
    assert seen.issued == [(5, 1)] and rec.pending == 0.3
    assert not rec.gate_open(0.5), "outstanding until the request ends"
    clock.t = 0.6
    ev.untrack(3)  # the evicted request ended: confirmed
    assert seen.ended == [CONFIRMED]
    assert not rec.gate_open(1.0), "then the grace, for the signal to show it"
    assert rec.gate_open(1.7) and rec.pending == 0.0
    assert rec.reclaim(2.0, 1.0, 5, 2.0) == [2, 1], "deficit 1.0 / 0.3 -> 4, capped at 2"


async def test_an_unconfirmed_eviction_times_out() -> None:
    ev = _evictor()
    seen = Observed()
    rec = Reclamation(ev, ReclamationConfig(grace=0.5, confirmation_timeout=10.0), Clock(), seen)
    ev.track("a", _item("a", -1, 0.0))
    assert rec.reclaim(1.0, 0.9, 0, 0.0) == ["a"]
    assert not rec.gate_open(9.9)
    assert not rec.gate_open(10.0) and seen.ended == [TIMED_OUT]
    assert rec.gate_open(10.5)


def test_grace_follows_the_detector() -> None:
    assert confirmation_grace("concurrency-detector", 2.05) == LEADING_SENSOR_GRACE_S
    assert confirmation_grace("utilization-detector", 2.05) == 2.05 + 0.25


def _with_eviction(sat: Saturation) -> FlowController:
    cfg = config(eviction=EvictionPolicies(PriorityThenTimeEvictionOrderPolicy(), SheddableEvictionFilter()))
    return controller(sat, cfg)


async def test_a_blocked_higher_band_evicts_a_dispatched_sheddable_request() -> None:
    sat = Saturation(0.0)
    fc = _with_eviction(sat)
    assert fc.evictor is not None
    (await fc.enqueue_and_wait(req("low", priority=-1))).settle()
    (await fc.enqueue_and_wait(req("zero", priority=0))).settle()
    low = fc.evictor.track("low", _item("low", -1, fc.now()))
    fc.evictor.track("zero", _item("zero", 0, fc.now()))
    sat.value = 1.0
    urgent = asyncio.create_task(fc.enqueue_and_wait(req("urgent", priority=10)))
    assert low is not None
    await asyncio.wait_for(low, 1)  # the sheddable request is evicted for the blocked band
    assert not urgent.done(), "it still waits until capacity shows"
    fc.evictor.untrack("low")  # the evicted request ends
    sat.value = 0.5
    fc.notify()
    (await asyncio.wait_for(urgent, 1)).settle()
    assert fc.evictor.stats() == (1, 0), "priority 0 is never evicted"


async def test_no_eviction_for_demand_at_the_victims_priority_or_without_queued_demand() -> None:
    sat = Saturation(1.0)
    fc = _with_eviction(sat)
    assert fc.evictor is not None
    signal = fc.evictor.track("low", _item("low", -1, 0.0))
    same = asyncio.create_task(fc.enqueue_and_wait(req("same", priority=-1)))
    await asyncio.sleep(0.05)
    assert signal is not None and not signal.done(), "no churn inside one band"
    same.cancel()
    await settle_loop()
    assert fc.length == 0 and not signal.done()
