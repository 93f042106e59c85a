"""Tests for the session-affinity-scorer plugin (llm-d): the endpoint named by `x-session-token` scores 1.0,
and the response-headers hook puts the serving endpoint's token into the request's CycleState."""

from __future__ import annotations

import base64

import pytest

from llm_epp.framework import CycleState, EndpointKey, ScorerCategory, TypedName
from llm_epp.framework.requestcontrol import ResponseInfo, ResponseReceived
from llm_epp.plugins.scheduling import session_affinity_scorer as mod
from llm_epp.plugins.scheduling.session_affinity_scorer import (
    HEADER,
    RESPONSE_HEADERS_KEY,
    Params,
    SessionAffinityScorer,
    decode_token,
    encode_token,
)
from tests.unit.builders import FakeHandle, endpoint, endpoints, key, request


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


POOL = endpoints("a", "b", "c")


@pytest.mark.parametrize(
    ("token", "expected"),
    [
        (None, {"a": 0.0, "b": 0.0, "c": 0.0}),
        ("", {"a": 0.0, "b": 0.0, "c": 0.0}),
        (_b64("default/b"), {"a": 0.0, "b": 1.0, "c": 0.0}),
        (_b64("default/gone"), {"a": 0.0, "b": 0.0, "c": 0.0}),
        (_b64("other/b"), {"a": 0.0, "b": 0.0, "c": 0.0}),
        (_b64("b"), {"a": 0.0, "b": 0.0, "c": 0.0}),
        ("default/b", {"a": 0.0, "b": 0.0, "c": 0.0}),
        ("%%%not-base64", {"a": 0.0, "b": 0.0, "c": 0.0}),
        (base64.b64encode(b"\xff\xfe/b").decode(), {"a": 0.0, "b": 0.0, "c": 0.0}),
    ],
    ids=[
        "no-header",
        "empty-header",
        "names-a-candidate",
        "names-no-candidate",
        "other-namespace",
        "no-namespace-separator",
        "not-encoded",
        "invalid-base64",
        "not-utf8",
    ],
)
def test_score(token: str | None, expected: dict[str, float]) -> None:
    headers = {} if token is None else {HEADER: token}
    scores = SessionAffinityScorer().score(CycleState(), request(headers=headers), POOL)
    assert scores == {key(n): v for n, v in expected.items()}


def test_no_candidates() -> None:
    assert SessionAffinityScorer().score(CycleState(), request(headers={HEADER: _b64("default/a")}), []) == {}


def test_one_candidate() -> None:
    scores = SessionAffinityScorer().score(CycleState(), request(headers={HEADER: _b64("default/a")}), POOL[:1])
    assert scores == {key("a"): 1.0}


@pytest.mark.parametrize(
    ("k", "token"),
    [
        (EndpointKey("default", "vllm-0"), "ZGVmYXVsdC92bGxtLTA="),
        (EndpointKey("", "10.0.0.1:8000"), _b64("/10.0.0.1:8000")),
        (EndpointKey("ns", "pod-rank-1"), _b64("ns/pod-rank-1")),
    ],
    ids=["namespaced", "no-namespace", "rank"],
)
def test_token_round_trip(k: EndpointKey, token: str) -> None:
    assert encode_token(k) == token
    assert decode_token(token) == k


def test_a_token_without_namespace_matches_an_endpoint_without_namespace() -> None:
    ep = endpoint("10.0.0.9:8000", namespace="")
    scores = SessionAffinityScorer().score(CycleState(), request(headers={HEADER: encode_token(ep.key)}), [ep])
    assert scores == {ep.key: 1.0}


def test_response_hook_sets_the_token_of_the_picked_endpoint() -> None:
    scorer = SessionAffinityScorer(handle=FakeHandle(pool=POOL))
    assert isinstance(scorer, ResponseReceived)
    cycle = CycleState()
    picked = POOL[1]
    scorer.response_received(cycle, request(), ResponseInfo(status=200, served_endpoint=picked.hostport), picked)
    assert cycle.read(RESPONSE_HEADERS_KEY) == {HEADER: encode_token(picked.key)}


def test_response_hook_prefers_the_endpoint_that_actually_served() -> None:
    """Envoy may fall back to another endpoint of the target list; the token names the one that served."""
    scorer = SessionAffinityScorer(handle=FakeHandle(pool=POOL))
    cycle = CycleState()
    scorer.response_received(cycle, request(), ResponseInfo(served_endpoint=POOL[2].hostport), POOL[0])
    assert cycle.read(RESPONSE_HEADERS_KEY) == {HEADER: encode_token(POOL[2].key)}


@pytest.mark.parametrize("served", ["", "192.168.9.9:8000"], ids=["not-reported", "not-in-pool"])
def test_response_hook_falls_back_to_the_picked_endpoint(served: str) -> None:
    scorer = SessionAffinityScorer(handle=FakeHandle(pool=POOL))
    cycle = CycleState()
    scorer.response_received(cycle, request(), ResponseInfo(served_endpoint=served), POOL[0])
    assert cycle.read(RESPONSE_HEADERS_KEY) == {HEADER: encode_token(POOL[0].key)}


def test_response_hook_without_an_endpoint_sets_nothing() -> None:
    cycle = CycleState()
    SessionAffinityScorer(handle=FakeHandle()).response_received(cycle, request(), ResponseInfo(), None)
    assert cycle.read(RESPONSE_HEADERS_KEY) is None


def test_response_hook_keeps_headers_other_plugins_set() -> None:
    cycle = CycleState()
    cycle.write(RESPONSE_HEADERS_KEY, {"x-other": "1"})
    SessionAffinityScorer().response_received(cycle, request(), ResponseInfo(), POOL[0])
    assert cycle.read(RESPONSE_HEADERS_KEY) == {"x-other": "1", HEADER: encode_token(POOL[0].key)}


def test_the_token_set_on_a_response_routes_the_next_request_back() -> None:
    scorer = SessionAffinityScorer(handle=FakeHandle(pool=POOL))
    cycle = CycleState()
    scorer.response_received(cycle, request(), ResponseInfo(served_endpoint=POOL[2].hostport), POOL[2])
    token = (cycle.read(RESPONSE_HEADERS_KEY) or {})[HEADER]
    scores = scorer.score(CycleState(), request(headers={HEADER: token}), POOL)
    assert scores == {key("a"): 0.0, key("b"): 0.0, key("c"): 1.0}


def test_identity_and_category() -> None:
    scorer = mod.factory("sa", Params(), FakeHandle())
    assert scorer.typed_name == TypedName("session-affinity-scorer", "sa")
    assert scorer.category is ScorerCategory.AFFINITY


# --- newer parameters: header name, profileName, the session_id strategy --------------------------------
def _result(picks: dict[str, int], primary: str = "decode"):
    from llm_epp.framework import ProfileResult, SchedulingResult

    return SchedulingResult({p: ProfileResult((POOL[i],)) for p, i in picks.items()}, primary)


def test_a_configured_header_is_read_and_written_lowercased() -> None:
    params = Params.model_validate({"encodedEndpointHeaderConfig": {"header": "X-Session-Token-Prefill"}})
    scorer = SessionAffinityScorer(handle=FakeHandle(pool=POOL), params=params)
    scores = scorer.score(CycleState(), request(headers={"x-session-token-prefill": _b64("default/b")}), POOL)
    assert scores[key("b")] == 1.0
    assert scorer.score(CycleState(), request(headers={HEADER: _b64("default/b")}), POOL)[key("b")] == 0.0
    cycle = CycleState()
    scorer.response_received(cycle, request(), ResponseInfo(), POOL[0])
    assert cycle.read(RESPONSE_HEADERS_KEY) == {"x-session-token-prefill": encode_token(POOL[0].key)}


def test_profile_name_writes_the_token_of_that_profiles_pick() -> None:
    params = Params.model_validate({"profileName": "prefill", "encodedEndpointHeaderConfig": {"header": "x-p"}})
    scorer = SessionAffinityScorer(handle=FakeHandle(pool=POOL), params=params)
    cycle = CycleState()
    scorer.pre_request(cycle, request(), _result({"decode": 0, "prefill": 2}))
    scorer.response_received(cycle, request(), ResponseInfo(served_endpoint=POOL[0].hostport), POOL[0])
    assert cycle.read(RESPONSE_HEADERS_KEY) == {"x-p": encode_token(POOL[2].key)}


def test_profile_name_without_that_profile_writes_nothing() -> None:
    scorer = SessionAffinityScorer(handle=FakeHandle(pool=POOL), params=Params(profile_name="prefill"))
    cycle = CycleState()
    scorer.pre_request(cycle, request(), _result({"decode": 0}))
    scorer.response_received(cycle, request(), ResponseInfo(), POOL[0])
    assert cycle.read(RESPONSE_HEADERS_KEY) is None


def _session_scorer(handle: FakeHandle, **config: object) -> SessionAffinityScorer:
    params = Params.model_validate({"strategy": "session_id", "sessionIdConfig": config})
    return SessionAffinityScorer(handle=handle, params=params)


def _route(scorer: SessionAffinityScorer, headers: dict[str, str], pick: int, pool=POOL) -> dict[str, float]:
    """One request: score, then route to `pick` (PreRequest) and run the response hook."""
    cycle = CycleState()
    req = request(headers=headers)
    scores = scorer.score(cycle, req, pool)
    scorer.pre_request(cycle, req, _result({"decode": pick}))
    scorer.response_received(cycle, req, ResponseInfo(), POOL[pick])
    assert cycle.read(RESPONSE_HEADERS_KEY) is None, "session_id writes nothing back"
    return {k.name: v for k, v in scores.items()}


def test_session_id_binds_the_session_to_where_it_was_routed() -> None:
    scorer = _session_scorer(FakeHandle(pool=POOL))
    assert _route(scorer, {"x-session-id": "s1"}, pick=1) == {"a": 0.0, "b": 0.0, "c": 0.0}
    assert _route(scorer, {"x-session-id": "s1"}, pick=1) == {"a": 0.0, "b": 1.0, "c": 0.0}
    assert _route(scorer, {"x-session-id": "s2"}, pick=2) == {"a": 0.0, "b": 0.0, "c": 0.0}
    assert _route(scorer, {}, pick=0) == {"a": 0.0, "b": 0.0, "c": 0.0}


def test_session_id_keeps_the_binding_when_other_scorers_won() -> None:
    """The bound endpoint was a candidate but the request went elsewhere: the binding stays."""
    scorer = _session_scorer(FakeHandle(pool=POOL))
    _route(scorer, {"x-session-id": "s"}, pick=1)
    _route(scorer, {"x-session-id": "s"}, pick=2)
    assert _route(scorer, {"x-session-id": "s"}, pick=1)["b"] == 1.0


def test_session_id_rebinds_when_the_bound_endpoint_is_gone() -> None:
    scorer = _session_scorer(FakeHandle(pool=POOL))
    _route(scorer, {"x-session-id": "s"}, pick=1)
    assert _route(scorer, {"x-session-id": "s"}, pick=2, pool=[POOL[0], POOL[2]]) == {"a": 0.0, "c": 0.0}
    assert _route(scorer, {"x-session-id": "s"}, pick=0)["c"] == 1.0


def test_session_id_bindings_expire_after_the_ttl() -> None:
    handle = FakeHandle(pool=POOL)
    scorer = _session_scorer(handle, evictionTtlSeconds=5, evictionSweepSeconds=1)
    _route(scorer, {"x-session-id": "s"}, pick=1)
    handle.clock = 4.0
    assert _route(scorer, {"x-session-id": "s"}, pick=1)["b"] == 1.0  # refreshed at t=4
    handle.clock = 8.5
    assert _route(scorer, {"x-session-id": "t"}, pick=0)["a"] == 0.0  # sweeps nothing yet: s seen at 4
    assert scorer.affinity.binding_count() == 2
    handle.clock = 20.0
    assert _route(scorer, {"x-session-id": "s"}, pick=2)["b"] == 0.0  # expired: no preference, rebound
    assert scorer.affinity.binding_count() == 1  # t was swept


def test_session_id_sources_are_tried_in_order_headers_and_attributes() -> None:
    from llm_epp.plugins.requestcontrol._attributes import put_attribute

    scorer = _session_scorer(
        FakeHandle(pool=POOL), sources=[{"header": "X-Session-ID"}, {"attribute": "agent-identity"}]
    )
    cycle = CycleState()
    put_attribute(cycle, "agent-identity", "", "agent-7")
    assert scorer.affinity.session_id(cycle, request(headers={"x-session-id": " h1 "})) == "h1"
    assert scorer.affinity.session_id(cycle, request(headers={"x-session-id": "  "})) == "agent-7"
    put_attribute(cycle, "agent-identity", "", 42)  # not a string: skipped
    assert scorer.affinity.session_id(cycle, request()) == ""


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        ({"strategy": "cookie"}, "strategy"),
        ({"strategy": "session_id", "sessionIdConfig": {"sources": [{}]}}, "exactly one of header or attribute"),
        (
            {"sessionIdConfig": {"sources": [{"header": "a", "attribute": "b"}]}},
            "exactly one of header or attribute",
        ),
        ({"sessionIdConfig": {"evictionTtlSeconds": -1}}, "evictionTtlSeconds must be > 0"),
        ({"encodedEndpointHeaderConfig": {"headr": "x"}}, "headr"),
    ],
    ids=["bad-strategy", "empty-source", "two-kinds", "negative-ttl", "unknown-key"],
)
def test_bad_parameters_are_rejected(raw: dict[str, object], problem: str) -> None:
    from llm_epp.plugins import builtin_registry

    with pytest.raises(ValueError, match=problem):
        builtin_registry().parse_params(mod.TYPE, raw)
