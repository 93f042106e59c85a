"""Tests for session-id-producer: the session id from a header or a cookie becomes a request attribute
that the session_id strategy of session affinity can use."""

from __future__ import annotations

import asyncio

import pytest

from llm_epp.framework import CycleState, ProfileResult, SchedulingResult, TypedName
from llm_epp.framework.registry import PluginParamsError
from llm_epp.plugins import builtin_registry
from llm_epp.plugins.requestcontrol import session_id_producer as mod
from llm_epp.plugins.requestcontrol.session_id_producer import Params, SessionIdProducer, cookie_value, read_session_id
from llm_epp.plugins.scheduling.session_affinity_scorer import Params as ScorerParams
from llm_epp.plugins.scheduling.session_affinity_scorer import SessionAffinityScorer
from tests.unit.builders import FakeHandle, endpoints, request


def _produce(producer: SessionIdProducer, headers: dict[str, str]) -> CycleState:
    cycle = CycleState()
    asyncio.run(producer.prepare_data(cycle, request(headers=headers), []))
    return cycle


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"x-session-id": "abc"}, "abc"),
        ({"x-session-id": "  abc  "}, "abc"),
        ({"x-session-id": "   "}, None),
        ({}, None),
    ],
    ids=["value", "trimmed", "blank", "absent"],
)
def test_header_source(headers: dict[str, str], expected: str | None) -> None:
    producer = SessionIdProducer("sid", Params(header_name="X-Session-ID"))
    assert read_session_id(_produce(producer, headers), "sid") == expected


@pytest.mark.parametrize(
    ("cookie", "expected"),
    [
        ("llm-d-session=s1", "s1"),
        ("a=1; llm-d-session=s2; b=3", "s2"),
        ("llm-d-session2=x; a=1", ""),
        ("garbage", ""),
        ("", ""),
    ],
    ids=["only", "among-others", "prefix-is-not-a-match", "malformed", "empty"],
)
def test_cookie_value(cookie: str, expected: str) -> None:
    assert cookie_value(cookie, "llm-d-session") == expected


def test_cookie_source_publishes_under_the_instance_name() -> None:
    producer = SessionIdProducer("cookie-sid", Params(cookie_name="llm-d-session"))
    cycle = _produce(producer, {"cookie": "x=1; llm-d-session=conv-9"})
    assert read_session_id(cycle, "cookie-sid") == "conv-9"
    assert read_session_id(cycle) is None


@pytest.mark.parametrize(
    ("raw", "problem"),
    [({}, "exactly one of headerName or cookieName"), ({"headerName": "a", "cookieName": "b"}, "not both")],
    ids=["neither", "both"],
)
def test_exactly_one_source_is_required(raw: dict[str, str], problem: str) -> None:
    with pytest.raises(PluginParamsError, match=problem):
        builtin_registry().parse_params(mod.TYPE, raw)


def test_session_affinity_reads_the_published_id() -> None:
    pool = endpoints("a", "b")
    handle = FakeHandle(pool=pool)
    producer = builtin_registry().build(mod.TYPE, "sid", {"headerName": "x-conv"}, handle)
    assert producer.typed_name == TypedName(mod.TYPE, "sid")
    assert isinstance(producer, SessionIdProducer)
    scorer = SessionAffinityScorer(
        handle=handle,
        params=ScorerParams.model_validate(
            {
                "strategy": "session_id",
                "sessionIdConfig": {"sources": [{"attribute": "SessionIDDataKey", "producer": "sid"}]},
            }
        ),
    )
    for expected_b in (0.0, 1.0):
        req = request(headers={"x-conv": "c1"})
        cycle = CycleState()
        asyncio.run(producer.prepare_data(cycle, req, pool))
        assert scorer.score(cycle, req, pool)[pool[1].key] == expected_b
        scorer.pre_request(cycle, req, SchedulingResult({"p": ProfileResult((pool[1],))}, "p"))
