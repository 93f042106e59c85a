"""The director with the flowControl gate: requests wait in the flow controller, a finished request lets
the next one through, rejections come back as drop reasons, dry runs do not queue, legacy shedding is off."""

from __future__ import annotations

import asyncio
import json

import pytest

from llm_epp.config import load_config_text
from llm_epp.datalayer import Datastore
from llm_epp.datalayer.static import parse_endpoint_list
from llm_epp.flowcontrol import FlowController
from llm_epp.plugins import builtin_registry
from llm_epp.plugins.parsers import default_parsers
from llm_epp.requestcontrol.decision import Outcome, RequestDropped, RequestInput
from llm_epp.requestcontrol.director import Director, RequestPlugins
from tests.unit.builders import FakeRecorder

CONFIG = """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
featureGates: [flowControl]
plugins:
- type: queue-scorer
- {name: one, type: concurrency-detector, parameters: {maxConcurrency: 1}}
flowControl:
  saturationDetector: {pluginRef: one}
  maxRequests: 2
  defaultRequestTTL: %s
schedulingProfiles:
- {name: default, plugins: [{pluginRef: queue-scorer}]}
"""


def make(ttl: str = "30s") -> tuple[Datastore, Director, FlowController]:
    ds = Datastore()
    ds.replace_all(parse_endpoint_list("10.0.0.1:8000"))
    rec = FakeRecorder()
    loaded = load_config_text(CONFIG % ttl, builtin_registry(), rec, ds.snapshot)
    assert loaded.flow_control is not None and loaded.saturation is not None
    fc = FlowController(loaded.flow_control, loaded.saturation, ds.snapshot)
    director = Director(
        ds.snapshot, loaded.scheduler, RequestPlugins(), rec, parsers=default_parsers(), flow_control=fc
    )
    return ds, director, fc


def inp(rid: str, subset: list[str] | None = None) -> RequestInput:
    body = json.dumps({"model": "m", "prompt": rid}).encode()
    return RequestInput(rid, {":path": "/v1/completions"}, body, subset)


async def test_a_finished_request_lets_the_next_queued_one_through() -> None:
    ds, director, fc = make()
    first = await director.route(inp("a"))
    second = asyncio.create_task(director.route(inp("b")))
    await asyncio.sleep(0.05)
    assert not second.done() and fc.length == 1, "the pod is at its concurrency: b waits"
    director.finish(first.handle, Outcome(complete=True, status=200))
    decision = await asyncio.wait_for(second, 1)
    assert decision.request.request_id == "b"
    assert ds.snapshot()[0].load.requests == 1 and fc.unsettled == 0


async def test_rejections_carry_their_status_and_drop_reason() -> None:
    _, director, fc = make(ttl="50ms")
    first = await director.route(inp("a"))
    with pytest.raises(RequestDropped) as ttl:
        await director.route(inp("late"))
    assert ttl.value.code.http_status == 503 and "timed out in queue" in ttl.value.message
    waiting = [asyncio.create_task(director.route(inp(f"w{i}"))) for i in range(2)]
    await asyncio.sleep(0.01)
    with pytest.raises(RequestDropped) as full:
        await director.route(inp("full"))
    assert full.value.code.http_status == 429 and full.value.reason == "rejected-saturated"
    for t in waiting:
        t.cancel()
    await asyncio.gather(*waiting, return_exceptions=True)
    director.finish(first.handle, Outcome(complete=True, status=200))
    assert fc.length == 0


async def test_dry_runs_and_bodyless_requests_do_not_queue() -> None:
    _, director, fc = make()
    first = await director.route(inp("a"))
    dry = await asyncio.wait_for(director.route(inp("probe"), dry_run=True), 1)
    assert dry.endpoint is first.endpoint and fc.length == 0


async def test_a_scheduling_failure_after_release_does_not_stall_the_queue() -> None:
    _, director, fc = make()
    with pytest.raises(RequestDropped):  # released, then the gateway's subset matches no endpoint
        await asyncio.wait_for(director.route(inp("a", subset=["10.9.9.9:1"])), 1)
    assert fc.unsettled == 0
    decision = await asyncio.wait_for(director.route(inp("b")), 1)  # the next one is not held up
    assert decision.request.request_id == "b"
