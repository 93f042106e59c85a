"""PrepareData plugins run under a deadline: one that finishes without waiting gets no timer, one that waits
is resumed to the end (results, exceptions and cancellation pass through), one that waits too long is cut
off and the request is still routed."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence

import pytest

from llm_epp.config import load_config_text
from llm_epp.datalayer import Datastore
from llm_epp.datalayer.static import parse_endpoint_list
from llm_epp.framework import CycleState, Endpoint, InferenceRequest, TypedName
from llm_epp.framework.state import StateKey
from llm_epp.plugins import builtin_registry
from llm_epp.plugins.parsers import default_parsers
from llm_epp.requestcontrol import director as director_module
from llm_epp.requestcontrol.decision import RequestInput
from llm_epp.requestcontrol.director import Director, RequestPlugins
from tests.unit.builders import FakeRecorder

SEEN: StateKey[list[str]] = StateKey("test-prepare-seen")
BODY = json.dumps({"model": "m", "prompt": "hello"}).encode()


class Producer:
    typed_name = TypedName("producer", "p")

    def __init__(self, waits: int = 0, forever: bool = False, fail_after_wait: bool = False) -> None:
        self.waits = waits
        self.forever = forever
        self.fail_after_wait = fail_after_wait
        self.cancelled = False
        self.timers_at_start = -1

    async def prepare_data(self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> None:
        self.timers_at_start = len(asyncio.get_running_loop()._scheduled)  # type: ignore[attr-defined]
        try:
            for _ in range(self.waits):
                await asyncio.sleep(0.001)
            if self.fail_after_wait:
                raise ValueError("broken producer")
            if self.forever:
                await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        cycle.write(SEEN, [e.hostport for e in endpoints])


def make(producer: Producer) -> tuple[Director, FakeRecorder]:
    ds = Datastore()
    ds.replace_all(parse_endpoint_list("10.0.0.1:8000,10.0.0.2:8000"))
    rec = FakeRecorder()
    loaded = load_config_text(None, builtin_registry(), rec)
    director = Director(
        ds.snapshot, loaded.scheduler, RequestPlugins(prepare_data=[producer]), rec, parsers=default_parsers()
    )
    return director, rec


def request() -> RequestInput:
    return RequestInput("r-1", {":path": "/v1/completions"}, BODY)


async def test_a_producer_that_never_waits_runs_without_a_timer() -> None:
    producer = Producer()
    director, _ = make(producer)
    timers = len(asyncio.get_running_loop()._scheduled)  # type: ignore[attr-defined]
    decision = await director.route(request())
    assert producer.timers_at_start == timers  # no deadline timer was armed for it
    assert decision.handle.cycle.read(SEEN) == ["10.0.0.1:8000", "10.0.0.2:8000"]


async def test_a_producer_that_waits_is_resumed_to_its_end_under_a_deadline() -> None:
    producer = Producer(waits=3)
    director, rec = make(producer)
    decision = await director.route(request())
    assert decision.handle.cycle.read(SEEN) == ["10.0.0.1:8000", "10.0.0.2:8000"]
    assert rec.plugin_errors == []


async def test_an_error_after_waiting_is_isolated_and_counted() -> None:
    producer = Producer(waits=1, fail_after_wait=True)
    director, rec = make(producer)
    decision = await director.route(request())
    assert decision.destination in ("10.0.0.1:8000", "10.0.0.2:8000")
    assert decision.handle.cycle.read(SEEN) is None
    assert rec.plugin_errors == [("PrepareData", Producer.typed_name)]


async def test_a_producer_past_the_deadline_is_cancelled_and_the_request_routed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(director_module, "PREPARE_DATA_TIMEOUT_S", 0.02)
    producer = Producer(waits=1, forever=True)
    director, _ = make(producer)
    decision = await asyncio.wait_for(director.route(request()), 5)
    assert producer.cancelled
    assert decision.destination in ("10.0.0.1:8000", "10.0.0.2:8000")
    assert decision.handle.cycle.read(SEEN) is None


async def test_cancelling_the_request_cancels_a_waiting_producer() -> None:
    producer = Producer(forever=True)
    director, _ = make(producer)
    task = asyncio.create_task(director.route(request()))
    for _ in range(5):
        await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert producer.cancelled


async def test_a_plain_awaitable_gets_the_deadline_too() -> None:
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()
    loop.call_later(0.001, done.set_result, None)
    await director_module._within(1.0, done, loop.time)  # a Future, not a coroutine
    never: asyncio.Future[None] = loop.create_future()
    with pytest.raises(TimeoutError):
        await director_module._within(0.01, never, loop.time)
