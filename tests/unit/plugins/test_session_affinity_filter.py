"""Tests for session-affinity-filter: the session endpoint is the only candidate kept when it is a
candidate; otherwise every candidate passes; both strategies."""

from __future__ import annotations

import base64

import pytest

from llm_epp.framework import CycleState, ProfileResult, SchedulingResult, TypedName
from llm_epp.framework.requestcontrol import RESPONSE_HEADERS_KEY, ResponseInfo
from llm_epp.plugins import builtin_registry
from llm_epp.plugins.scheduling import session_affinity_filter as mod
from llm_epp.plugins.scheduling._session_affinity import encode_token
from llm_epp.plugins.scheduling.session_affinity_filter import Params, SessionAffinityFilter
from tests.unit.builders import FakeHandle, endpoints, names, request

POOL = endpoints("a", "b", "c")


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


@pytest.mark.parametrize(
    ("token", "kept"),
    [
        (None, ["a", "b", "c"]),
        (_b64("default/b"), ["b"]),
        (_b64("default/gone"), ["a", "b", "c"]),
        ("%%%", ["a", "b", "c"]),
    ],
    ids=["no-token", "session-endpoint", "not-a-candidate", "undecodable"],
)
def test_filter_by_token(token: str | None, kept: list[str]) -> None:
    headers = {} if token is None else {"x-session-token": token}
    assert names(SessionAffinityFilter().filter(CycleState(), request(headers=headers), POOL)) == kept


def test_no_candidates_stays_empty() -> None:
    assert list(SessionAffinityFilter().filter(CycleState(), request(headers={"x-session-token": "x"}), [])) == []


def test_response_writes_the_token_which_pins_the_next_request() -> None:
    f = SessionAffinityFilter(handle=FakeHandle(pool=POOL))
    cycle = CycleState()
    f.response_received(cycle, request(), ResponseInfo(served_endpoint=POOL[2].hostport), POOL[2])
    token = (cycle.read(RESPONSE_HEADERS_KEY) or {})["x-session-token"]
    assert token == encode_token(POOL[2].key)
    assert names(f.filter(CycleState(), request(headers={"x-session-token": token}), POOL)) == ["c"]


def test_session_id_strategy_pins_after_the_first_request() -> None:
    f = SessionAffinityFilter(handle=FakeHandle(pool=POOL), params=Params(strategy="session_id"))
    req = request(headers={"x-session-id": "conv-1"})
    cycle = CycleState()
    assert names(f.filter(cycle, req, POOL)) == ["a", "b", "c"]
    f.pre_request(cycle, req, SchedulingResult({"p": ProfileResult((POOL[0],))}, "p"))
    f.response_received(cycle, req, ResponseInfo(), POOL[0])
    assert cycle.read(RESPONSE_HEADERS_KEY) is None
    assert names(f.filter(CycleState(), req, POOL)) == ["a"]
    assert names(f.filter(CycleState(), request(headers={"x-session-id": "conv-2"}), POOL)) == ["a", "b", "c"]
    # the bound endpoint left: everyone passes
    assert names(f.filter(CycleState(), req, POOL[1:])) == ["b", "c"]


def test_identity_and_parameters_from_yaml() -> None:
    raw = {
        "strategy": "session_id",
        "profileName": "prefill",
        "sessionIdConfig": {
            "sources": [{"header": "x-session-id"}, {"attribute": "agent-identity"}],
            "evictionTtlSeconds": 300,
            "evictionSweepSeconds": 10,
        },
    }
    f = builtin_registry().build(mod.TYPE, "pin", raw, FakeHandle())
    assert isinstance(f, SessionAffinityFilter)
    assert f.typed_name == TypedName("session-affinity-filter", "pin")
    assert f.affinity.profile_name == "prefill"
    assert [s.attribute for s in f.affinity.sources] == ["", "agent-identity"]
