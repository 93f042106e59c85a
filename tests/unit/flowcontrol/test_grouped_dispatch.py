"""Grouped dispatch: while requests of a prefix group are in flight, the oldest queued request of that group
joins the dispatch window from anywhere in its flow's queue, so a group's requests reach their home close
together and share the prefix there."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Collection, Hashable

import pytest

from llm_epp.flowcontrol import FlowController
from llm_epp.flowcontrol.controller import FlowControlRejected
from llm_epp.framework.flowcontrol import DispatchGroups, Placement
from llm_epp.plugins.flowcontrol.round_robin_fairness_policy import RoundRobinFairnessPolicy
from llm_epp.plugins.scheduling.kv_cache_headroom_detector import Params, factory
from tests.unit.builders import FakeHandle, endpoint
from tests.unit.flowcontrol.support import Order, config, req, settle_loop
from tests.unit.flowcontrol.test_dispatch import Affine, Clock, _controller, _queue, _release
from tests.unit.plugins.test_kv_cache_headroom_detector import SYSTEM, _ep, _hold, _prompted

FITS, NONE, FULL = Placement.HOME_FITS, Placement.NO_HOME, Placement.HOME_FULL


class Grouped(Affine):
    """`Affine`, with each request's group named by its id up to the first '-' ("g1-a" is in group "g1"; an
    id without '-' has no group) and the groups in flight set by the test."""

    def __init__(self, value: float = 0.0, window: int = 2, max_wait: float = 3.0, on: bool = True) -> None:
        super().__init__(value, window, max_wait)
        self.hot: set[str] = set()
        self.on = on

    def group_key(self, key: object) -> Hashable | None:
        assert isinstance(key, str)
        return key.split("-")[0] if self.on and "-" in key else None

    def hot_groups(self) -> Collection[Hashable]:
        return self.hot


async def _finish(order: Order, tasks: list[asyncio.Task[None]]) -> None:
    await asyncio.gather(*tasks)
    for ticket in order.tickets.values():
        ticket.settle()


def test_the_protocol_is_recognised() -> None:
    assert isinstance(Grouped(), DispatchGroups)
    assert not isinstance(Affine(), DispatchGroups)


async def test_the_oldest_queued_request_of_a_group_in_flight_joins_the_window() -> None:
    det, clock = Grouped(1.0, window=2), Clock()
    fc = _controller(det, clock)
    order = Order(fc)
    tasks = await _queue(order, req("a"), req("b"), req("g1-x"), req("g2-y"), req("g1-z"))
    det.where = {"g1-x": FITS, "g1-z": FITS, "g2-y": FITS}
    await _release(fc, det, order)
    assert order.released == [], "no group in flight: only the window (a, b, both would copy) is looked at"
    assert set(det.asked) == {"a", "b"}
    det.hot = {"g1"}
    det.asked.clear()
    await _release(fc, det, order)
    assert order.released == ["g1-x"], "g1 is in flight: its oldest queued request goes to its home"
    assert set(det.asked) == {"a", "b", "g1-x"}, "only the group's oldest request is added, not g2's"
    det.asked.clear()
    await _release(fc, det, order)
    assert order.released == ["g1-x", "g1-z"], "then the next one of the group"
    det.where.update({"a": NONE, "b": NONE})
    det.hot = set()
    for _ in range(3):
        await _release(fc, det, order)
    assert order.released == ["g1-x", "g1-z", "a", "g2-y", "b"], "g2-y fits at home once in the window"
    await _finish(order, tasks)
    assert fc.length == 0 and not fc.bands[0].flows


async def test_a_group_mate_is_never_released_by_age_and_the_window_keeps_its_age_rule() -> None:
    det, clock = Grouped(1.0, window=1, max_wait=3.0), Clock()
    fc = _controller(det, clock)
    order = Order(fc)
    tasks = await _queue(order, req("a"), req("g1-x"))
    det.hot = {"g1"}
    await _release(fc, det, order)
    assert order.released == [], "both would copy their prefix"
    clock.t += 3.0
    await _release(fc, det, order)
    assert order.released == ["a"], "a has waited in the window past the bound; g1-x is only a mate"
    det.where = {"g1-x": FITS}
    await _release(fc, det, order)
    assert order.released == ["a", "g1-x"]
    await _finish(order, tasks)


async def test_a_saturated_pool_releases_a_group_mate_that_fits_at_home() -> None:
    det, clock = Grouped(1.0, window=1), Clock()
    fc = _controller(det, clock)
    order = Order(fc)
    tasks = await _queue(order, req("a"), req("b"), req("g1-x"))
    det.where = {"g1-x": FITS}
    det.hot = {"g1"}
    fc.notify()
    await settle_loop(10)
    assert order.released == ["g1-x"], "saturated for a typical request, but the mate shares its home's prefix"
    det.hot = set()
    det.value = 0.5
    det.where = {"a": NONE, "b": NONE}
    order.tickets["g1-x"].settle()
    await settle_loop(10)
    await _release(fc, det, order)
    await _finish(order, tasks)
    assert order.released == ["g1-x", "a", "b"]


async def test_mates_come_only_from_the_flow_the_fairness_policy_picked() -> None:
    det, clock = Grouped(1.0, window=1), Clock()
    fc = _controller(det, clock, fairness=RoundRobinFairnessPolicy())
    order = Order(fc)
    tasks = await _queue(order, req("0x", "x"), req("g1-x", "x"), req("0y", "y"), req("g1-y", "y"))
    det.hot = {"g1"}
    det.where = {"g1-x": FITS, "g1-y": FITS, "0x": NONE, "0y": NONE}
    for _ in range(4):
        await _release(fc, det, order)
    assert [r[-1] for r in order.released] == ["x", "y", "x", "y"], "flows still take turns"
    assert order.released[:2] == ["g1-x", "g1-y"]
    await _finish(order, tasks)


async def test_at_most_a_window_of_group_mates_is_looked_at_per_cycle() -> None:
    det, clock = Grouped(1.0, window=3), Clock()
    fc = _controller(det, clock)
    order = Order(fc)
    tasks = await _queue(order, req("a"), req("b"), req("c"), *(req(f"g{i}-x") for i in range(20)))
    det.hot = {f"g{i}" for i in range(20)}
    det.asked.clear()
    await _release(fc, det, order)
    assert order.released == [] and len(det.asked) == 3 + 3, "three in the window, three mates"
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    assert fc.length == 0 and not fc.bands[0].flows


async def test_the_group_index_forgets_every_request_that_leaves() -> None:
    det = Grouped(1.0, window=1, max_wait=60.0)
    pool = [endpoint("p0", address="10.0.0.1")]
    fc = FlowController(config(request_ttl=0.2), det, lambda: pool, poll_interval=0.01)
    order = Order(fc)
    det.hot = {"g1"}
    expired = asyncio.create_task(fc.enqueue_and_wait(req("g1-old")))
    await settle_loop()
    cancelled = asyncio.create_task(order.run(req("g1-gone"), settle=False))
    released = asyncio.create_task(order.run(req("g1-go"), settle=False))
    await settle_loop()
    q = fc.bands[0].flows["default-flow"]
    assert q.group_count == 1 and q.group_head("g1") is not None
    assert q.group_head("g1").request.request_id == "g1-old"  # type: ignore[union-attr]
    cancelled.cancel()
    await asyncio.gather(cancelled, return_exceptions=True)
    det.where = {"g1-go": FITS}
    fc.notify()
    await settle_loop(10)
    assert order.released == ["g1-go"]
    head = q.group_head("g1")
    assert head is not None and head.request.request_id == "g1-old", "the cancelled and released ones are gone"
    try:
        await asyncio.wait_for(expired, 1)
    except FlowControlRejected as err:
        assert "timed out in queue" in str(err)
    else:
        raise AssertionError("g1-old should have expired in the queue")
    assert q.group_head("g1") is None and q.group_count == 0
    assert fc.length == 0 and not fc.bands[0].flows
    await released
    order.tickets["g1-go"].settle()


async def test_a_detector_with_groups_off_indexes_nothing() -> None:
    det, clock = Grouped(1.0, window=2, on=False), Clock()
    fc = _controller(det, clock)
    order = Order(fc)
    tasks = await _queue(order, req("a"), req("b"), req("g1-x"))
    det.hot = {"g1"}
    det.where = {"g1-x": FITS}
    await _release(fc, det, order)
    assert order.released == [] and fc.bands[0].flows["default-flow"].group_count == 0
    assert "g1-x" not in det.asked
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


@pytest.mark.parametrize("groups", [True, False])
async def test_with_the_real_detector_a_saturated_pool_releases_a_request_whose_prompt_is_in_flight(
    groups: bool,
) -> None:
    det = factory("kv", Params(dispatchWindow=2, dispatchGroups=groups), FakeHandle())
    home = _ep("a", kv=0.1)
    fc = FlowController(config(), det, lambda: [home], poll_interval=0.01)
    _hold(det, _prompted(SYSTEM + "first question"), home)  # the system prompt is in flight on `a`
    det.typical_prompt = 20_000.0  # a typical request no longer fits anywhere: only a fit at home may go
    order = Order(fc)
    prompts = {
        "stranger-1": "Something else entirely. " * 100,
        "stranger-2": "Another topic altogether. " * 100,
        "mate": SYSTEM + "third question",
    }
    requests = [dataclasses.replace(_prompted(text), request_id=rid) for rid, text in prompts.items()]
    tasks = [asyncio.create_task(order.run(r, settle=False)) for r in requests]
    await settle_loop(10)
    if groups:
        assert order.released == ["mate"], "third in the queue, beyond the window, but its prompt is in flight"
    else:
        assert order.released == [], "the window holds two strangers, which would fill an endpoint anywhere"
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for ticket in order.tickets.values():
        ticket.settle()
    assert fc.length == 0 and not fc.bands[0].flows
