"""The flow controller on a real asyncio loop, with a saturation the test controls."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from llm_epp.flowcontrol import FlowController, QueueOutcome
from llm_epp.flowcontrol.controller import FlowControlRejected
from llm_epp.framework import ErrorCode, TypedName
from tests.unit.flowcontrol.support import Order, Saturation, config, controller, req, settle_loop


async def test_an_idle_pool_releases_at_once() -> None:
    fc = controller(Saturation(0.0))
    ticket = await asyncio.wait_for(fc.enqueue_and_wait(req("a")), 1)
    ticket.settle()
    assert fc.length == 0 and fc.unsettled == 0


async def test_a_saturated_pool_holds_requests_until_capacity_frees() -> None:
    sat = Saturation(1.0)
    fc = controller(sat)
    order = Order(fc)
    tasks = [asyncio.create_task(order.run(req(r))) for r in ("a", "b", "c")]
    await asyncio.sleep(0.05)
    assert order.released == [] and fc.length == 3
    sat.value = 0.5
    fc.notify()
    await asyncio.wait_for(asyncio.gather(*tasks), 1)
    assert order.released == ["a", "b", "c"]  # FCFS
    assert fc.length == 0 and fc.bytes == 0


async def test_one_request_is_released_per_settled_ticket() -> None:
    fc = controller(Saturation(0.0))
    order = Order(fc)
    tasks = [asyncio.create_task(order.run(req(r), settle=False)) for r in ("a", "b")]
    await settle_loop(10)
    assert order.released == ["a"], "the second waits until the first one's load is counted"
    order.tickets["a"].settle()
    await asyncio.wait_for(asyncio.gather(*tasks), 1)
    assert order.released == ["a", "b"]


async def test_capacity_rejects_with_429() -> None:
    fc = controller(Saturation(1.0), config(max_requests=2))
    tasks = [asyncio.create_task(fc.enqueue_and_wait(req(r))) for r in ("a", "b")]
    await settle_loop()
    with pytest.raises(FlowControlRejected) as e:
        await fc.enqueue_and_wait(req("c"))
    assert e.value.code is ErrorCode.RESOURCE_EXHAUSTED and e.value.code.http_status == 429
    assert e.value.outcome is QueueOutcome.REJECTED_CAPACITY
    assert "maxRequests 2" in e.value.message
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    assert fc.length == 0


async def test_band_byte_limit_rejects() -> None:
    fc = controller(Saturation(1.0), config(band_max_bytes=25))
    t = asyncio.create_task(fc.enqueue_and_wait(req("a", size=20)))
    await settle_loop()
    with pytest.raises(FlowControlRejected, match="maxBytes 25"):
        await fc.enqueue_and_wait(req("b", size=10))
    t.cancel()
    await asyncio.gather(t, return_exceptions=True)


async def test_ttl_expiry_answers_503_and_frees_the_place() -> None:
    fc = controller(Saturation(1.0), config(request_ttl=0.05, no_endpoint_request_ttl=0.05))
    with pytest.raises(FlowControlRejected) as e:
        await asyncio.wait_for(fc.enqueue_and_wait(req("a")), 2)
    assert e.value.code.http_status == 503
    assert e.value.outcome is QueueOutcome.EVICTED_TTL
    assert "request timed out in queue" in e.value.message
    assert e.value.reason == "rejected-ttl-expired"  # the x-llm-d-request-dropped-reason value
    assert fc.length == 0 and fc.bytes == 0 and fc.bands[0].length == 0


async def test_no_endpoints_uses_the_no_endpoint_ttl() -> None:
    fc = controller(Saturation(1.0), config(request_ttl=None, no_endpoint_request_ttl=0.02), eps=0)
    with pytest.raises(FlowControlRejected, match="no endpoints are available") as e:
        await asyncio.wait_for(fc.enqueue_and_wait(req("a")), 2)
    assert e.value.reason == "rejected-no-endpoints"


async def test_a_cancelled_waiter_leaves_its_queue_and_is_never_released() -> None:
    sat = Saturation(1.0)
    fc = controller(sat, config(max_requests=1))
    order = Order(fc)
    gone = asyncio.create_task(order.run(req("gone")))
    await settle_loop()
    assert fc.length == 1
    gone.cancel()
    await asyncio.gather(gone, return_exceptions=True)
    assert fc.length == 0 and fc.bytes == 0, "the place is free"
    sat.value = 0.0
    stays = asyncio.create_task(order.run(req("stays")))  # fits: the limit of 1 is free again
    await asyncio.wait_for(stays, 1)
    assert order.released == ["stays"]
    assert fc.unsettled == 0


async def test_a_waiter_cancelled_after_its_release_does_not_block_dispatch() -> None:
    fc = controller(Saturation(0.0))
    order = Order(fc)
    first = asyncio.create_task(order.run(req("a")))
    first.cancel()  # cancelled before it ever ran: never enqueued
    await asyncio.gather(first, return_exceptions=True)
    sat_fc = controller(Saturation(1.0))
    waiter = asyncio.create_task(sat_fc.enqueue_and_wait(req("x")))
    await settle_loop()
    sat_fc.saturation.value = 0.0  # type: ignore[attr-defined]
    sat_fc._cycle()  # released now; the task has not resumed yet
    waiter.cancel()
    await asyncio.gather(waiter, return_exceptions=True)
    assert sat_fc.unsettled == 0, "a released-then-cancelled request does not hold the dispatch slot"
    ticket = await asyncio.wait_for(sat_fc.enqueue_and_wait(req("y")), 1)
    ticket.settle()


async def test_higher_priority_overtakes_queued_lower_priority() -> None:
    sat = Saturation(1.0)
    fc = controller(sat)
    order = Order(fc)
    low = [asyncio.create_task(order.run(req(f"low{i}", priority=0))) for i in range(3)]
    await settle_loop()
    high = asyncio.create_task(order.run(req("high", priority=10)))
    await settle_loop()
    sat.value = 0.0
    fc.notify()
    await asyncio.wait_for(asyncio.gather(*low, high), 1)
    assert order.released[0] == "high"
    assert order.released[1:] == ["low0", "low1", "low2"]


class Ceilings:
    """A usage-limit policy with fixed ceilings, highest priority first."""

    def __init__(self, *values: float) -> None:
        self.values = values

    @property
    def typed_name(self) -> TypedName:
        return TypedName("fixed", "fixed")

    def compute_limit(self, saturation: float, priorities: Sequence[int], ceilings: list[float]) -> None:
        for i in range(len(ceilings)):
            ceilings[i] = self.values[i]


async def test_saturation_at_a_bands_ceiling_stops_the_whole_cycle() -> None:
    sat = Saturation(0.7)
    fc = controller(sat, config(usage_limit=Ceilings(0.5, 1.0)))
    order = Order(fc)
    tasks = [asyncio.create_task(order.run(req(r, priority=p))) for r, p in (("low", 0), ("high", 5))]
    await asyncio.sleep(0.05)
    # the high band is gated at 0.7 >= 0.5; the low band's ceiling (1.0) would allow it, but it must not
    # overtake a blocked higher band
    assert order.released == []
    sat.value = 0.2
    await asyncio.wait_for(asyncio.gather(*tasks), 1)
    assert order.released == ["high", "low"]


async def test_priority_holdback_keeps_headroom_for_higher_bands() -> None:
    from llm_epp.plugins.flowcontrol.priority_holdback_policy import PriorityHoldbackPolicy

    sat = Saturation(0.7)
    fc = controller(sat, config(usage_limit=PriorityHoldbackPolicy("h", min_ceiling=0.5, max_ceiling=1.0)))
    order = Order(fc)
    high = asyncio.create_task(order.run(req("high", priority=5)))
    await asyncio.wait_for(high, 1)  # bands 5 and 0 now exist: ceilings 1.0 and 0.5
    low = asyncio.create_task(order.run(req("low", priority=0)))
    await asyncio.sleep(0.05)
    assert order.released == ["high"], "0.7 is above priority 0's ceiling of 0.5"
    sat.value = 0.45
    await asyncio.wait_for(low, 1)
    assert order.released == ["high", "low"]


async def test_unknown_priorities_get_bands_from_the_templates() -> None:
    from llm_epp.flowcontrol import BandConfig
    from llm_epp.plugins.flowcontrol.fcfs_ordering_policy import FcfsOrderingPolicy
    from llm_epp.plugins.flowcontrol.global_strict_fairness_policy import GlobalStrictFairnessPolicy

    negative = BandConfig(-1, GlobalStrictFairnessPolicy(), FcfsOrderingPolicy(), max_requests=1)
    fc = controller(Saturation(1.0), config(default_negative_band=negative))
    t = asyncio.create_task(fc.enqueue_and_wait(req("a", priority=-3)))
    await settle_loop()
    assert fc.bands[-3].config.max_requests == 1
    with pytest.raises(FlowControlRejected, match="priority band -3"):
        await fc.enqueue_and_wait(req("b", priority=-3))
    ok = asyncio.create_task(fc.enqueue_and_wait(req("c", priority=7)))  # default template: no request limit
    await settle_loop()
    assert fc.bands[7].length == 1
    for task in (t, ok):
        task.cancel()
    await asyncio.gather(t, ok, return_exceptions=True)
    assert fc.length == 0


async def test_a_pool_that_gains_endpoints_moves_waiting_requests_onto_the_request_ttl() -> None:
    from tests.unit.builders import endpoint

    pool: list = []
    cfg = config(request_ttl=0.1, no_endpoint_request_ttl=30.0)
    fc = FlowController(cfg, Saturation(1.0), lambda: pool, poll_interval=0.01)
    waiter = asyncio.create_task(fc.enqueue_and_wait(req("a")))
    await asyncio.sleep(0.05)
    assert not waiter.done() and fc.bands[0].length == 1
    pool.append(endpoint("p"))  # scaled up: the 30 s budget no longer applies
    with pytest.raises(FlowControlRejected) as e:
        await asyncio.wait_for(waiter, 2)
    assert e.value.reason == "rejected-ttl-expired" and "no endpoints" not in e.value.message
    assert fc.length == 0
