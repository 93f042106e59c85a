"""The director: decisions as values, in-flight accounting, shedding, objectives and rewrites, dry runs,
hook pairing, plugin headers and metadata, parsers, drop reasons, the injected clock, trace phases."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

import pytest

from llm_epp.config import load_config_text
from llm_epp.datalayer import Datastore
from llm_epp.datalayer.static import parse_endpoint_list
from llm_epp.framework import ApiKind, CycleState, Endpoint, EppError, InferenceRequest, TypedName
from llm_epp.framework.requestcontrol import (
    REQUEST_HEADERS_KEY,
    RESPONSE_HEADERS_KEY,
    RESPONSE_METADATA_KEY,
    ResponseInfo,
    Usage,
)
from llm_epp.framework.tracing import CURRENT_TRACE, AttributeValue, RequestTrace
from llm_epp.framework.types import EndpointKey, SchedulingResult
from llm_epp.plugins import builtin_registry
from llm_epp.plugins.parsers import default_parsers
from llm_epp.plugins.parsers.openai_parser import OpenaiParser
from llm_epp.requestcontrol.decision import (
    DROPPED_NO_ENDPOINTS,
    DROPPED_SATURATED,
    Outcome,
    RequestDropped,
    RequestInput,
    ResponseSeen,
)
from llm_epp.requestcontrol.director import Director, DirectorOptions, RequestPlugins, estimate_tokens, filter_by_list
from tests.unit.builders import FakeRecorder

BODY = json.dumps({"model": "m", "prompt": "hello world"}).encode()


class Hooks:
    """Records every request-control hook call; writes plugin headers and metadata like real plugins do."""

    typed_name = TypedName("hooks", "hooks")

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.infos: list[ResponseInfo] = []
        self.first_bodies: list[ResponseInfo] = []

    def pre_request(self, cycle: CycleState, request: InferenceRequest, result: SchedulingResult) -> None:
        self.calls.append("pre_request")
        cycle.write(REQUEST_HEADERS_KEY, {"X-Prefiller-Host-Port": "10.9.9.9:8000"})

    def response_received(
        self, cycle: CycleState, request: InferenceRequest, response: ResponseInfo, endpoint: Endpoint | None
    ) -> None:
        self.calls.append("received")
        cycle.write(RESPONSE_HEADERS_KEY, {"x-plugin": "yes"})

    def response_first_body(
        self, cycle: CycleState, request: InferenceRequest, response: ResponseInfo, endpoint: Endpoint | None
    ) -> None:
        self.first_bodies.append(response)

    def response_complete(
        self, cycle: CycleState, request: InferenceRequest, response: ResponseInfo, endpoint: Endpoint | None
    ) -> None:
        self.calls.append(f"complete:{response.complete}")
        self.infos.append(response)
        cycle.write(RESPONSE_METADATA_KEY, {"envoy.lb": {"x-gateway-inference-request-cost": 7}})


class Saturated:
    typed_name = TypedName("fake-detector", "fake-detector")

    def __init__(self, level: float) -> None:
        self.level = level

    def saturation(self, endpoints: Sequence[Endpoint]) -> float:
        return self.level


class StaticObjectives:
    def priority(self, objective: str) -> int | None:
        return {"batch": -1, "critical": 10, "new-name": 3}.get(objective)

    def rewrite(self, model: str) -> tuple[str, str] | None:
        return ("m-v2", "canary") if model == "m" else None


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make(
    endpoints: str = "10.0.0.1:8000,10.0.0.2:8000",
    saturation: float | None = None,
    parsers: Sequence[object] | None = None,
    config: str | None = None,
    **opts: object,
):
    ds = Datastore()
    ds.replace_all(parse_endpoint_list(endpoints))
    rec = FakeRecorder()
    hooks = Hooks()
    loaded = load_config_text(config, builtin_registry(), rec)
    clock = Clock()
    director = Director(
        ds.snapshot,
        loaded.scheduler,
        RequestPlugins(
            pre_request=[hooks], response_received=[hooks], response_first_body=[hooks], response_complete=[hooks]
        ),
        rec,
        DirectorOptions(**opts),  # type: ignore[arg-type]
        saturation=Saturated(saturation) if saturation is not None else None,
        parsers=default_parsers() if parsers is None else parsers,  # type: ignore[arg-type]
        clock=clock,
    )
    return ds, director, rec, hooks, clock


def inp(body: bytes | None = BODY, path: str = "/v1/completions", subset=None, **headers: str) -> RequestInput:
    return RequestInput("req-1", {":path": path, **headers}, body, subset)


def total_load(ds: Datastore) -> tuple[int, int]:
    snap = ds.snapshot()
    return sum(e.load.requests for e in snap), sum(e.load.tokens for e in snap)


async def test_route_reserves_and_finish_releases_exactly_once() -> None:
    ds, director, rec, hooks, clock = make()
    decision = await director.route(inp())
    assert decision.endpoint.load.requests == 1
    assert decision.destination == decision.endpoint.hostport
    assert decision.body is None and not decision.model_rewritten
    assert total_load(ds) == (1, estimate_tokens(len(BODY)))
    clock.now += 2.5
    metadata = director.finish(
        decision.handle, Outcome(complete=True, status=200, usage=Usage(3, 4, 7), response_bytes=9)
    )
    assert director.finish(decision.handle, Outcome(complete=False)) == {}  # a second end changes nothing
    assert total_load(ds) == (0, 0)
    assert hooks.calls == ["pre_request", "complete:True"]
    assert rec.running == [("m", 1), ("m", -1)]
    # durations come from the injected clock
    assert rec.completed == [("m", "m", 2.5, len(BODY), 9, 3, 4, 0)]
    assert metadata == {"envoy.lb": {"x-gateway-inference-request-cost": 7}}


async def test_decision_carries_plugin_request_headers() -> None:
    _, director, _, _, _ = make()
    decision = await director.route(inp())
    assert dict(decision.upstream_headers) == {"x-prefiller-host-port": "10.9.9.9:8000"}


async def test_response_received_returns_plugin_headers_and_a_reader() -> None:
    _, director, _, hooks, _ = make()
    decision = await director.route(inp())
    plan = director.response_received(
        decision.handle,
        ResponseSeen(status=200, served_endpoint="10.0.0.2:8000", headers={"content-type": "application/json"}),
    )
    assert dict(plan.headers) == {"x-plugin": "yes"}
    assert plan.reader is not None
    plan.reader.feed(b'{"usage": {"prompt_tokens": 1, "completion_tokens": 2}}', True)
    director.finish(decision.handle, Outcome(complete=True, usage=plan.reader.usage))
    assert hooks.infos[0].served_endpoint == "10.0.0.2:8000"
    assert hooks.infos[0].status == 200 and hooks.infos[0].usage == Usage(1, 2, 3)


@pytest.mark.parametrize("content_type", ["text/event-stream", "application/json"])
async def test_first_body_bytes_are_timed_for_the_completion_hooks(content_type: str) -> None:
    _, director, _, hooks, clock = make()
    decision = await director.route(inp())
    clock.now += 0.05
    plan = director.response_received(
        decision.handle, ResponseSeen(status=200, streaming=content_type == "text/event-stream",
                                      headers={"content-type": content_type})
    )  # fmt: skip
    assert plan.reader is not None
    clock.now += 0.2
    plan.reader.feed(b"", False)  # an empty chunk is no first token
    clock.now += 0.1
    plan.reader.feed(b'data: {"choices": [{"text": "a"}]}\n\n', False)
    first = clock.now
    clock.now += 1.0
    plan.reader.feed(b'data: {"usage": {"prompt_tokens": 1, "completion_tokens": 2}}\n\ndata: [DONE]\n\n', True)
    director.finish(decision.handle, Outcome(complete=True, usage=plan.reader.usage))
    assert hooks.infos[0].first_body_at == first
    if content_type == "text/event-stream":
        assert hooks.infos[0].usage == Usage(1, 2, 3)  # the parser's reader still reads the usage


async def test_the_first_body_hooks_run_once_at_the_first_body_bytes() -> None:
    _, director, _, hooks, clock = make()
    decision = await director.route(inp())
    plan = director.response_received(
        decision.handle, ResponseSeen(status=200, streaming=True, headers={"content-type": "text/event-stream"})
    )
    assert plan.reader is not None
    clock.now += 2.0  # the headers came on admission: prefill, then the first token
    plan.reader.feed(b"", False)
    assert hooks.first_bodies == [], "an empty chunk is no first token"
    plan.reader.feed(b'data: {"choices": [{"text": "a"}]}\n\n', False)
    first = clock.now
    clock.now += 0.5
    plan.reader.feed(b'data: {"choices": [{"text": "b"}]}\n\n', False)
    assert [(i.first_body_at, i.status, i.streaming) for i in hooks.first_bodies] == [(first, 200, True)]
    director.finish(decision.handle, Outcome(complete=True))
    assert len(hooks.first_bodies) == 1


async def test_a_failing_first_body_hook_is_isolated() -> None:
    class Exploding:
        typed_name = TypedName("exploding", "exploding")

        def response_first_body(self, *_: object) -> None:
            raise RuntimeError("boom")

    _, director, rec, hooks, _ = make()
    director.plugins.response_first_body = [Exploding(), hooks]
    decision = await director.route(inp())
    plan = director.response_received(decision.handle, ResponseSeen(status=200, streaming=True))
    assert plan.reader is not None
    plan.reader.feed(b"{}", True)
    assert len(hooks.first_bodies) == 1, "the next plugin still runs"
    assert ("ResponseFirstBody", TypedName("exploding", "exploding")) in rec.plugin_errors


async def test_without_a_body_first_body_at_stays_unknown() -> None:
    _, director, _, hooks, _ = make()
    decision = await director.route(inp())
    director.response_received(decision.handle, ResponseSeen(status=200, streaming=True))
    director.finish(decision.handle, Outcome(complete=True))
    assert hooks.infos[0].first_body_at is None


async def test_load_is_a_fresh_signal_for_the_next_pick() -> None:
    ds, director, _, _, _ = make()
    decisions = [await director.route(inp()) for _ in range(6)]
    assert sorted(e.load.requests for e in ds.snapshot()) == sorted(
        [sum(1 for d in decisions if d.endpoint.key == e.key) for e in ds.snapshot()]
    )
    assert total_load(ds)[0] == 6


async def test_release_never_goes_negative_when_the_endpoint_leaves_mid_request() -> None:
    ds, director, _, _, _ = make("10.0.0.1:8000")
    decision = await director.route(inp())
    ds.clear()
    ds.replace_all(parse_endpoint_list("10.0.0.1:8000"))  # same endpoint comes back: a fresh counter
    director.finish(decision.handle, Outcome(complete=False))
    assert total_load(ds) == (0, 0)
    assert decision.endpoint.load.requests == 0  # the detached counter, released once


async def test_dry_run_reserves_nothing_and_runs_no_hooks() -> None:
    ds, director, rec, hooks, _ = make()
    decision = await director.route(inp(), dry_run=True)
    assert decision.destination
    assert total_load(ds) == (0, 0)
    assert hooks.calls == [] and rec.running == []
    assert director.finish(decision.handle, Outcome(complete=True)) == {}
    assert hooks.calls == []


@pytest.mark.parametrize(
    ("objective", "saturation", "shed"),
    [
        ("batch", 1.0, True),
        ("batch", 0.99, False),
        ("critical", 5.0, False),
        ("", 5.0, False),
        ("unknown-objective", 5.0, False),
    ],
    ids=["sheddable-saturated", "sheddable-not-saturated", "priority-10", "no-objective", "unknown-objective"],
)
async def test_legacy_admission_sheds_only_sheddable_requests(objective: str, saturation: float, shed: bool) -> None:
    ds, director, rec, _, _ = make(saturation=saturation, objectives=StaticObjectives())
    request = inp(**({"x-gateway-inference-objective": objective} if objective else {}))
    if shed:
        with pytest.raises(EppError) as err:
            await director.route(request)
        assert err.value.code.http_status == 429
        assert "sheddable" in err.value.message
        assert total_load(ds) == (0, 0)
        assert rec.request_errors[-1][2] == "ResourceExhausted"
    else:
        assert (await director.route(request)).destination


async def test_objective_priority_and_rewrite_rule() -> None:
    _, director, rec, _, _ = make(objectives=StaticObjectives())
    decision = await director.route(inp(**{"x-gateway-inference-objective": "critical"}))
    assert decision.request.priority == 10
    assert (decision.request.incoming_model, decision.request.target_model) == ("m", "m-v2")
    assert decision.body is not None and json.loads(decision.body)["model"] == "m-v2"
    assert decision.model_rewritten
    assert rec.rewrites == [("canary", "m", "m-v2")]
    assert rec.scheduled == [("m", "m-v2", 10)]


async def test_rewrite_rules_win_over_the_rewrite_header() -> None:
    _, director, _, _, _ = make(objectives=StaticObjectives())
    decision = await director.route(inp(**{"x-gateway-model-name-rewrite": "from-header"}))
    assert decision.request.target_model == "m-v2"


@pytest.mark.parametrize(
    ("headers", "objective", "fairness", "target"),
    [
        ({"x-llm-d-inference-objective": "new-name"}, "new-name", "default-flow", "m"),
        ({"x-gateway-inference-objective": "critical"}, "critical", "default-flow", "m"),
        (
            {"x-llm-d-inference-objective": "new-name", "x-gateway-inference-objective": "critical"},
            "new-name",
            "default-flow",
            "m",
        ),
        ({"x-llm-d-inference-fairness-id": "t1", "x-gateway-inference-fairness-id": "t2"}, "", "t1", "m"),
        ({"x-gateway-inference-fairness-id": "t2"}, "", "t2", "m"),
        ({"x-llm-d-model-name-rewrite": "a", "x-gateway-model-name-rewrite": "b"}, "", "default-flow", "a"),
        ({"x-gateway-model-name-rewrite": "b"}, "", "default-flow", "b"),
    ],
    ids=[
        "new-objective",
        "old-objective",
        "new-wins",
        "new-fairness-wins",
        "old-fairness",
        "new-rewrite-wins",
        "old-rewrite",
    ],
)
async def test_control_headers_new_names_first_then_aliases(
    headers: dict[str, str], objective: str, fairness: str, target: str
) -> None:
    _, director, _, _, _ = make()
    decision = await director.route(inp(**headers))
    req = decision.request
    assert (req.objective, req.fairness_id, req.target_model) == (objective, fairness, target)


async def test_finish_of_a_rejected_request_runs_no_hooks() -> None:
    ds, director, _, hooks, _ = make()
    with pytest.raises(EppError) as err:
        await director.route(inp(b"{"))
    assert err.value.code.http_status == 400
    assert hooks.calls == []
    assert total_load(ds) == (0, 0)


async def test_unclaimed_paths_go_through_the_passthrough_fallback() -> None:
    ds, director, _, _, _ = make()
    body = b'{"model": "reranker", "query": "q", "documents": ["a"]}'
    for path in ("/v1/rerank", "/v1/score", "/pooling", "/classify", "/detokenize"):
        decision = await director.route(inp(body, path=path))
        assert decision.request.body.api is ApiKind.OPAQUE
        assert decision.request.incoming_model == ""
        assert decision.body is None
        director.finish(decision.handle, Outcome(complete=True))
    assert total_load(ds) == (0, 0)


async def test_a_model_rewrite_header_never_changes_an_opaque_body() -> None:
    _, director, _, _, _ = make()
    decision = await director.route(inp(b"opaque", path="/v1/rerank", **{"x-llm-d-model-name-rewrite": "x"}))
    assert decision.body is None and not decision.model_rewritten


async def test_without_a_fallback_an_unclaimed_path_is_a_400_naming_it() -> None:
    _, director, rec, _, _ = make(parsers=[OpenaiParser()])
    with pytest.raises(EppError) as err:
        await director.route(inp(BODY, path="/v1/rerank"))
    assert err.value.code.http_status == 400 and "/v1/rerank" in err.value.message
    assert rec.request_errors == [("", "", "BadRequest")]


async def test_conformance_header_is_ignored_without_the_filter_plugin() -> None:
    _, director, _, _, _ = make("10.0.0.1:8000,10.0.0.2:8000")
    for _ in range(20):  # the default config balances load: both endpoints get picked
        decision = await director.route(inp(**{"test-epp-endpoint-selection": "10.0.0.2:8000"}))
    assert {e.hostport for e in director.candidates(None) if e.load.requests} == {"10.0.0.1:8000", "10.0.0.2:8000"}
    assert decision.destination


CONFORMANCE_CONFIG = """
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: header-based-testing-filter
- type: max-score-picker
- type: single-profile-handler
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: header-based-testing-filter
  - pluginRef: max-score-picker
"""


async def test_conformance_header_works_through_the_filter_plugin() -> None:
    _, director, _, _, _ = make(config=CONFORMANCE_CONFIG)
    for _ in range(5):
        decision = await director.route(inp(**{"test-epp-endpoint-selection": "10.0.0.2:8000"}))
        assert decision.destination == "10.0.0.2:8000"


async def test_no_candidates_is_a_drop_with_a_reason() -> None:
    _, director, _, _, _ = make()
    with pytest.raises(RequestDropped) as err:
        await director.route(inp(subset=["10.9.9.9:1"]))
    assert (err.value.code.http_status, err.value.reason) == (503, DROPPED_NO_ENDPOINTS)


async def test_scheduler_failure_is_a_saturated_drop() -> None:
    _, director, _, _, _ = make(config=CONFORMANCE_CONFIG)
    with pytest.raises(RequestDropped) as err:
        await director.route(inp())  # the filter drains every endpoint without the header
    assert (err.value.code.http_status, err.value.reason) == (429, DROPPED_SATURATED)


async def test_bodyless_requests_go_to_a_random_candidate_without_scheduling() -> None:
    ds, director, _, hooks, _ = make()
    decision = await director.route(inp(None, subset=["10.0.0.2"]))
    assert decision.destination == "10.0.0.2:8000" and decision.result is None
    assert director.finish(decision.handle, Outcome(complete=True)) == {}
    assert hooks.calls == [] and total_load(ds) == (0, 0)


def _eps(spec: str) -> list[Endpoint]:
    return [Endpoint(md) for md in parse_endpoint_list(spec)]


@pytest.mark.parametrize(
    ("entries", "expected"),
    [
        (["10.0.0.1"], ["10.0.0.1:8000", "10.0.0.1:8001"]),
        (["10.0.0.1:8001"], ["10.0.0.1:8001"]),
        (["10.0.0.2:8000, 10.0.0.1:8000"], ["10.0.0.1:8000", "10.0.0.2:8000"]),
        (["[fd00::1]:9000"], ["[fd00::1]:9000"]),
        (["fd00::1"], ["[fd00::1]:9000"]),
        (["10.0.0.1:bad", ""], []),
        ([], []),
    ],
    ids=["bare-ip-all-ports", "ip-port", "comma-list", "ipv6-port", "ipv6-bare", "invalid", "empty"],
)
def test_filter_by_list(entries: list[str], expected: list[str]) -> None:
    eps = _eps("10.0.0.1:8000,10.0.0.1:8001,10.0.0.2:8000,[fd00::1]:9000")
    assert [e.hostport for e in filter_by_list(eps, entries)] == expected


class Trace:
    def __init__(self) -> None:
        self.phases: list[str] = []

    def phase(
        self, name: str, start_ns: int, end_ns: int, attributes: Mapping[str, AttributeValue] | None = None
    ) -> None:
        assert end_ns >= start_ns
        self.phases.append(name)

    def event(self, name: str, attributes: Mapping[str, AttributeValue] | None = None) -> None:
        pass

    def set_attributes(self, attributes: Mapping[str, AttributeValue]) -> None:
        pass

    def inject(self, headers: dict[str, str]) -> None:
        headers["traceparent"] = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

    def end(self, status: int = 0, error: str = "") -> None:
        pass


class Tracer:
    enabled = True

    def start_request(self, request_id: str, headers: Mapping[str, str]) -> RequestTrace:
        return Trace()


async def test_phases_are_reported_to_the_current_trace_when_tracing_is_on() -> None:
    _, director, _, _, _ = make()
    director.tracer = Tracer()
    trace = Trace()
    token = CURRENT_TRACE.set(trace)
    try:
        decision = await director.route(inp())
    finally:
        CURRENT_TRACE.reset(token)
    assert trace.phases == ["parse", "admission", "prepare_data", "schedule", "pre_request"]
    assert decision.upstream_headers["traceparent"].startswith("00-")


def test_estimate_tokens_matches_the_reference_formula() -> None:
    assert estimate_tokens(0) == 1 + 2  # max(0/4, 1) = 1, plus round(1.5)
    assert estimate_tokens(400) == 100 + 150
    assert estimate_tokens(12) == 3 + 5  # 4.5 rounds half away from zero, as in Go
    assert EndpointKey("ns", "a") < EndpointKey("ns", "b")


PEER = {"do_remote_prefill": True, "remote_host": "203.0.113.9", "remote_port": 5600, "remote_block_ids": [1]}


@pytest.mark.parametrize(
    "fields",
    [
        {"kv_transfer_params": PEER},
        {"kv_transfer_params": {"do_remote_decode": True}},
        {"bootstrap_host": "203.0.113.9", "bootstrap_port": 8998, "bootstrap_room": 7},
    ],
    ids=["nixl-pull", "nixl-hold", "sglang-bootstrap"],
)
async def test_a_clients_kv_transfer_fields_never_reach_the_model_server(fields: dict[str, object]) -> None:
    body = json.dumps({"model": "m", "prompt": "hello", "max_tokens": 3, **fields}).encode()
    _, director, _, _, _ = make()
    decision = await director.route(inp(body))
    assert decision.body is not None
    assert json.loads(decision.body) == {"model": "m", "prompt": "hello", "max_tokens": 3}
    assert not decision.model_rewritten
    # with a model rewrite as well, both changes are in the forwarded body
    _, director, _, _, _ = make(objectives=StaticObjectives())
    decision = await director.route(inp(body))
    assert decision.body is not None
    assert json.loads(decision.body) == {"model": "m-v2", "prompt": "hello", "max_tokens": 3}
    assert decision.model_rewritten


async def test_a_body_without_transfer_fields_is_forwarded_as_received() -> None:
    _, director, _, _, _ = make()
    assert (await director.route(inp())).body is None
