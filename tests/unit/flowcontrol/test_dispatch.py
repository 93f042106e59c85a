"""Affinity-aware dispatch: the pure choice among a flow's first requests, and the flow controller using it
with a saturation detector that says where each queued request's prefix is."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from llm_epp.flowcontrol import FlowController
from llm_epp.flowcontrol.controller import FlowControlRejected
from llm_epp.flowcontrol.dispatch import choose
from llm_epp.framework.flowcontrol import DispatchAffinity, Placement
from llm_epp.framework.types import Endpoint, InferenceRequest
from llm_epp.plugins.flowcontrol.round_robin_fairness_policy import RoundRobinFairnessPolicy
from llm_epp.plugins.flowcontrol.static_usage_limit_policy import StaticUsageLimitPolicy
from tests.unit.builders import endpoint
from tests.unit.flowcontrol.support import Order, Saturation, config, req, settle_loop

FITS, NONE, FULL = Placement.HOME_FITS, Placement.NO_HOME, Placement.HOME_FULL


# --- the choice ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("placements", "expected"),
    [
        ([FULL, NONE, FITS], 2),  # a request that shares blocks where it fits goes first
        ([FULL, NONE, FULL], 1),  # else one that costs the same anywhere
        ([NONE, FITS], 1),
        ([FITS, FITS], 0),  # among equals, the order of the queue
        ([FULL, FULL], None),  # every one would copy its prefix: hold
        ([], None),
    ],
)
def test_the_choice_prefers_a_fit_at_home_then_no_home(placements: list[Placement], expected: int | None) -> None:
    assert choose(placements, [10.0] * len(placements), now=10.5, max_wait=3.0) == expected


def test_age_beats_affinity_past_the_bound() -> None:
    # the second has waited 3 s in the window: it goes before the first one's fit, and before the holding
    assert choose([FITS, FULL, FULL], [9.0, 7.0, 6.0], now=10.0, max_wait=3.0) == 1
    assert choose([FULL, FULL], [7.0, 9.0], now=10.0, max_wait=3.0) == 0


# --- the controller -----------------------------------------------------------------------------------------
class Affine(Saturation):
    """A saturation the test sets, and each request's placement by request id (FULL when not given)."""

    def __init__(self, value: float = 0.0, window: int = 2, max_wait: float = 3.0) -> None:
        super().__init__(value)
        self.window = window
        self.max_wait = max_wait
        self.where: dict[str, Placement] = {}
        self.cost: dict[str, float] = {}
        self.asked: list[str] = []
        self.fail = False

    @property
    def dispatch_window(self) -> int:
        return self.window

    @property
    def dispatch_max_wait(self) -> float:
        return self.max_wait

    def affinity_key(self, request: InferenceRequest) -> object:
        return request.request_id

    def placement(self, key: object, endpoints: Sequence[Endpoint]) -> tuple[Placement, float]:
        if self.fail:
            raise RuntimeError("broken detector")
        assert isinstance(key, str) and endpoints
        self.asked.append(key)
        return self.where.get(key, FULL), self.cost.get(key, 1000.0)


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _controller(det: Affine, clock: Clock, **cfg: object) -> FlowController:
    pool = [endpoint("p0", address="10.0.0.1")]
    return FlowController(config(**cfg), det, lambda: pool, poll_interval=0.01, clock=clock)


async def _queue(order: Order, *requests: InferenceRequest) -> list[asyncio.Task[None]]:
    tasks = [asyncio.create_task(order.run(r, settle=False)) for r in requests]
    await settle_loop()
    return tasks


async def _release(fc: FlowController, det: Affine, order: Order) -> None:
    """One dispatch cycle with room: the tickets released so far are settled while the pool is saturated,
    then the pool has room until the next released request is being scheduled (its ticket unsettled)."""
    det.value = 1.0
    for ticket in order.tickets.values():
        ticket.settle()
    await settle_loop()
    det.value = 0.5
    fc.notify()
    await settle_loop(10)


def test_the_detector_protocol_is_recognised() -> None:
    assert isinstance(Affine(), DispatchAffinity)
    assert not isinstance(Saturation(), DispatchAffinity)


async def test_a_request_that_fits_at_home_goes_before_older_ones_inside_the_window_only() -> None:
    det, clock = Affine(1.0, window=2), Clock()
    fc = _controller(det, clock)
    order = Order(fc)
    tasks = await _queue(order, req("a"), req("b"), req("c"))
    det.where = {"b": FITS, "c": FITS}
    await _release(fc, det, order)
    assert order.released == ["b"], "b fits where its prefix is; c does too, but is outside the window of 2"
    det.where = {"c": FITS}
    await _release(fc, det, order)
    assert order.released == ["b", "c"], "c has entered the window"
    det.where = {"a": NONE}
    await _release(fc, det, order)
    assert order.released == ["b", "c", "a"]
    await asyncio.gather(*tasks)
    for ticket in order.tickets.values():
        ticket.settle()
    assert fc.length == 0 and fc.bytes == 0 and not fc.bands[0].flows


async def test_a_window_that_would_copy_every_prefix_holds_until_the_bound() -> None:
    det, clock = Affine(1.0, window=2, max_wait=3.0), Clock()
    fc = _controller(det, clock)
    order = Order(fc)
    tasks = await _queue(order, req("a"), req("b"))
    await _release(fc, det, order)
    assert order.released == [] and fc.length == 2, "both would copy their prefix: held"
    clock.t += 2.9
    await _release(fc, det, order)
    assert order.released == []
    clock.t += 0.1
    await _release(fc, det, order)
    assert order.released == ["a"], "a has waited 3 s in the window: released wherever its prefix is"
    await _release(fc, det, order)
    assert order.released == ["a", "b"]
    await asyncio.gather(*tasks)
    for ticket in order.tickets.values():
        ticket.settle()


async def test_a_held_band_is_not_overtaken_by_a_lower_one() -> None:
    det, clock = Affine(1.0, window=4), Clock()
    fc = _controller(det, clock)
    order = Order(fc)
    tasks = await _queue(order, req("low", priority=0), req("high", priority=10))
    det.where = {"low": NONE}  # the low one could go anywhere, the high one would copy its prefix
    await _release(fc, det, order)
    assert order.released == [], "strict priority: the lower band waits while the higher one holds"
    det.where = {"low": NONE, "high": FITS}
    await _release(fc, det, order)
    await _release(fc, det, order)
    assert order.released == ["high", "low"]
    await asyncio.gather(*tasks)
    for ticket in order.tickets.values():
        ticket.settle()


async def test_the_window_stays_inside_the_flow_the_fairness_policy_picked() -> None:
    det, clock = Affine(1.0, window=4), Clock()
    fc = _controller(det, clock, fairness=RoundRobinFairnessPolicy())
    order = Order(fc)
    tasks = await _queue(order, req("x1", "x"), req("x2", "x"), req("y1", "y"), req("y2", "y"))
    det.where = {r: NONE for r in ("x1", "x2", "y1", "y2")} | {"x2": FITS, "y2": FITS}
    for _ in range(4):
        await _release(fc, det, order)
    assert [r[0] for r in order.released] == ["x", "y", "x", "y"], "flows still take turns"
    assert order.released[:2] == ["x2", "y2"], "inside each flow, the one that fits at home"
    await asyncio.gather(*tasks)
    for ticket in order.tickets.values():
        ticket.settle()


async def test_window_zero_releases_strictly_in_order_and_never_asks() -> None:
    det, clock = Affine(1.0, window=0), Clock()
    fc = _controller(det, clock)
    assert fc.affinity is None
    order = Order(fc)
    tasks = await _queue(order, req("a"), req("b"), req("c"))
    det.where = {"c": FITS}
    for _ in range(3):
        await _release(fc, det, order)
    assert order.released == ["a", "b", "c"] and det.asked == []
    await asyncio.gather(*tasks)
    for ticket in order.tickets.values():
        ticket.settle()


async def test_a_failing_detector_loses_no_request() -> None:
    det, clock = Affine(1.0, window=2), Clock()
    fc = _controller(det, clock)
    order = Order(fc)
    tasks = await _queue(order, req("a"), req("b"))
    det.fail = True
    await _release(fc, det, order)
    assert order.released == [] and fc.length == 2 and len(fc.bands[0].flows["default-flow"]) == 2
    det.fail = False
    det.where = {"a": NONE, "b": NONE}
    await _release(fc, det, order)
    await _release(fc, det, order)
    assert order.released == ["a", "b"]
    await asyncio.gather(*tasks)
    for ticket in order.tickets.values():
        ticket.settle()


async def test_ttl_expiry_still_applies_to_a_held_request() -> None:
    det = Affine(1.0, window=2, max_wait=60.0)
    pool = [endpoint("p0", address="10.0.0.1")]
    fc = FlowController(config(request_ttl=0.05), det, lambda: pool, poll_interval=0.01)
    det.value = 0.5  # room, but the request would copy its prefix: held until its TTL runs out
    with pytest.raises(FlowControlRejected, match="timed out in queue"):
        await asyncio.wait_for(fc.enqueue_and_wait(req("a")), 1)
    assert fc.length == 0


# --- the cheapest fit, and a saturated pool ----------------------------------------------------------------
def test_the_fit_at_home_that_adds_the_fewest_tokens_goes_first() -> None:
    since = [10.0] * 4
    assert choose([FITS, NONE, FITS, FITS], since, 10.5, 3.0, [2200.0, 10.0, 1000.0, 1000.0]) == 2
    # a cheap request that would copy its prefix, or that nobody holds, does not compete with a fit at home
    assert choose([FULL, NONE, FITS], since[:3], 10.5, 3.0, [10.0, 10.0, 2200.0]) == 2


def test_a_saturated_pool_releases_only_a_fit_at_home_and_age_forces_nothing() -> None:
    old = [0.0, 0.0, 9.0]  # the first two have waited past the bound
    assert choose([NONE, FULL, FITS], old, 10.0, 3.0, [1.0, 1.0, 2000.0], saturated=True) == 2
    assert choose([NONE, FULL], old[:2], 10.0, 3.0, [1.0, 1.0], saturated=True) is None
    assert choose([NONE, FULL], old[:2], 10.0, 3.0, [1.0, 1.0]) == 0, "with room, age goes first"


async def test_a_saturated_pool_still_releases_a_request_that_fits_at_home() -> None:
    det, clock = Affine(1.0, window=4), Clock()
    fc = _controller(det, clock)
    order = Order(fc)
    tasks = await _queue(order, req("a"), req("b"), req("c"))
    assert order.released == [], "nothing fits at home yet"
    det.where = {"a": NONE, "b": FITS, "c": FITS}
    det.cost = {"b": 2200.0, "c": 1000.0}
    fc.notify()
    await settle_loop(10)
    assert order.released == ["c"], "saturated for a typical request, but c adds little where its prefix is"
    det.where = {"a": NONE}
    clock.t += 60.0  # far past the maximum wait: on a saturated pool a still waits
    order.tickets["c"].settle()
    await settle_loop(10)
    assert order.released == ["c"]
    det.value = 0.5
    fc.notify()
    await settle_loop(10)
    assert order.released == ["c", "a"], "with room, the oldest goes (age beats affinity)"
    det.where = {"b": FITS}
    for ticket in order.tickets.values():
        ticket.settle()
    await settle_loop(10)
    await asyncio.gather(*tasks)
    assert order.released == ["c", "a", "b"]
    for ticket in order.tickets.values():
        ticket.settle()


@pytest.mark.parametrize("window", [0, 4])
async def test_below_a_full_ceiling_or_without_the_window_a_saturated_pool_releases_nothing(window: int) -> None:
    det, clock = Affine(0.9, window=window), Clock()
    threshold = 0.8 if window else 1.0
    fc = _controller(det, clock, usage_limit=StaticUsageLimitPolicy(threshold=threshold))
    if not window:
        det.value = 1.0
    order = Order(fc)
    tasks = await _queue(order, req("a"), req("b"))
    det.where = {"a": FITS, "b": FITS}
    fc.notify()
    await settle_loop(10)
    assert order.released == [] and fc.length == 2
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    assert fc.length == 0


async def test_a_saturated_band_with_nothing_queued_does_not_hold_back_a_lower_one() -> None:
    det, clock = Affine(1.0, window=4), Clock()
    fc = _controller(det, clock)
    order = Order(fc)
    tasks = await _queue(order, req("high", priority=10))
    det.where = {"high": FITS}
    fc.notify()
    await settle_loop(10)
    assert order.released == ["high"]
    order.tickets["high"].settle()
    tasks += await _queue(order, req("low", priority=0))
    det.where = {"low": FITS}
    fc.notify()
    await settle_loop(10)
    assert order.released == ["high", "low"]
    await asyncio.gather(*tasks)
    for ticket in order.tickets.values():
        ticket.settle()
