"""With `--workers`, a request's span is the front's: it is made and exported by the front that serves the
stream, the serving process passes the front's trace context to the model server and times the Director's
phases and plugin calls, and the front makes those its span's children. The serving process exports nothing."""

from __future__ import annotations

import asyncio
import json
import pickle
from pathlib import Path

from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from llm_epp.composition import build_request_path
from llm_epp.datalayer.static import parse_endpoint_list
from llm_epp.framework import NullRecorder
from llm_epp.framework.plugin import seeded_random
from llm_epp.framework.tracing import CURRENT_TRACE
from llm_epp.observability import HealthState
from llm_epp.observability.tracing import build_tracer, with_plugin_spans
from llm_epp.requestcontrol.decision import Outcome, RequestInput, RoutingDecision
from llm_epp.workers.hub import Hub, RelayedTrace
from llm_epp.workers.remote import RemoteDirector, _replay

TOKEN = b"t" * 32
BODY = json.dumps({"model": "m", "prompt": "Say hello.", "max_tokens": 4}).encode()


async def _route_through_a_hub(
    sock: str, ratio: str
) -> tuple[RoutingDecision, InMemorySpanExporter, InMemorySpanExporter]:
    serving_spans, front_spans = InMemorySpanExporter(), InMemorySpanExporter()
    env = {"OTEL_TRACES_SAMPLER_ARG": ratio}
    serving_tracer = build_tracer(True, env, processors=(SimpleSpanProcessor(serving_spans),))
    path = build_request_path(
        recorder=with_plugin_spans(NullRecorder(), serving_tracer),
        tracer=serving_tracer,
        random_source=seeded_random(1),
    )
    path.datastore.replace_all(parse_endpoint_list("10.0.0.1:8000,10.0.0.2:8000"))
    hub = Hub(
        path.director, HealthState(), TOKEN, with_scores=False, on_ready=lambda i, p: None, on_lost=lambda i: None
    )
    await hub.start(sock)
    front_tracer = build_tracer(True, env, processors=(SimpleSpanProcessor(front_spans),))
    remote = RemoteDirector(HealthState(), front_tracer)
    await asyncio.get_running_loop().create_unix_connection(lambda: remote.conn, sock)
    remote.conn.send_raw(TOKEN)
    try:
        headers = {":path": "/v1/completions", "content-type": "application/json"}
        trace = front_tracer.start_request("req-1", headers)
        CURRENT_TRACE.set(trace)  # as the servicer does for its stream (this test's own task context)
        decision = await remote.route(RequestInput("req-1", headers, BODY))
        await remote.finish_async(decision.handle, Outcome(complete=True, status=200))
        trace.end(200)
    finally:
        remote.conn.close()
        await hub.stop()
    return decision, serving_spans, front_spans


async def test_a_sampled_request_is_one_front_span_with_the_serving_processs_phases_as_children(tmp_path: Path) -> None:
    decision, serving_spans, front_spans = await _route_through_a_hub(str(tmp_path / "s.sock"), "1")
    assert serving_spans.get_finished_spans() == ()
    spans = front_spans.get_finished_spans()
    request = next(s for s in spans if s.name == "gateway.request")
    children = [s for s in spans if s is not request]
    names = {s.name for s in children}
    assert {"parse", "schedule", "plugin.Scorer", "plugin.Picker"} <= names, names
    assert all(s.parent is not None and s.parent.span_id == request.context.span_id for s in children)
    assert all(request.start_time <= s.start_time <= s.end_time <= request.end_time for s in children)
    parse = next(s for s in children if s.name == "parse")
    assert dict(parse.attributes or {})["model"] == "m"
    _, trace_id, span_id, flags = decision.upstream_headers["traceparent"].split("-")
    assert (trace_id, span_id) == (f"{request.context.trace_id:032x}", f"{request.context.span_id:016x}")
    assert int(flags, 16) & 1 == 1


async def test_a_sampled_out_request_makes_no_span_but_carries_the_fronts_context(tmp_path: Path) -> None:
    decision, serving_spans, front_spans = await _route_through_a_hub(str(tmp_path / "s.sock"), "0")
    assert serving_spans.get_finished_spans() == () and front_spans.get_finished_spans() == ()
    _, trace_id, span_id, flags = decision.upstream_headers["traceparent"].split("-")
    assert len(trace_id) == 32 and len(span_id) == 16 and int(flags, 16) & 1 == 0


def test_events_and_attributes_recorded_in_the_serving_process_reach_the_fronts_span() -> None:
    """A plugin may add events and attributes to the current trace: they cross the process boundary (pickled,
    as the frames are) and land on the front's request span; a sampled-out request sends nothing back."""
    exported = InMemorySpanExporter()
    front_tracer = build_tracer(True, {"OTEL_TRACES_SAMPLER_ARG": "1"}, processors=(SimpleSpanProcessor(exported),))
    trace = front_tracer.start_request("req-1", {})
    relayed = RelayedTrace(True, {})
    relayed.phase("schedule", 1_000, 2_000, {"profile": "default"})
    relayed.event("cache.hit", {"blocks": 3})
    relayed.set_attributes({"pool": "a"})
    recorded = pickle.loads(pickle.dumps(relayed.relayed()))
    _replay(trace, *recorded)
    trace.end(200)
    spans = {s.name: s for s in exported.get_finished_spans()}
    request = spans["gateway.request"]
    assert (spans["schedule"].start_time, spans["schedule"].end_time) == (1_000, 2_000)
    assert spans["schedule"].parent.span_id == request.context.span_id
    assert [(e.name, dict(e.attributes or {})) for e in request.events] == [("cache.hit", {"blocks": 3})]
    assert dict(request.attributes or {})["pool"] == "a"

    unsampled = RelayedTrace(False, {"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-00"})
    unsampled.phase("schedule", 1, 2)
    unsampled.event("x")
    unsampled.set_attributes({"pool": "a"})
    assert unsampled.relayed() is None
    headers: dict[str, str] = {}
    unsampled.inject(headers)
    assert headers == {"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-00"}
