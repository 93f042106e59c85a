"""Property-based fuzzing of the request parser and the ext_proc stream handler: whatever a client or a
misbehaving proxy sends (random message orders, truncated or oversized bodies, garbage JSON, cancelled
streams), nothing crashes with an unexpected error and no in-flight count leaks."""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llm_epp.framework import EppError, ErrorCode
from llm_epp.plugins.parsers import default_parsers
from tests.unit.extproc.fake_envoy import (
    BUFFERED,
    FDS,
    NONE,
    Harness,
    body_msg,
    headers_msg,
    request_trailers_msg,
    response_body_msg,
    response_headers_msg,
    response_trailers_msg,
)

PATHS = ["/v1/completions", "/v1/chat/completions", "/v1/responses", "/v1/embeddings", "/generate", "/", "/x?y=1"]
# `make bench-chaos` raises the example count (LLM_EPP_FUZZ_EXAMPLES); `make test` keeps it to seconds.
FUZZ = settings(
    max_examples=int(os.environ.get("LLM_EPP_FUZZ_EXAMPLES", "80")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def harness_for(max_body: int) -> Harness:
    """A fresh harness per example, so a leak is reported with the script that caused it. Its streams end with
    an EOF and are never reset: the wait for a reset after a finished response is cut to nothing."""
    return Harness("10.0.0.1:8000,10.0.0.2:8000", max_body=max_body, servicer_opts={"close_wait_s": 0.0})


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=20,
)
openai_like = st.fixed_dictionaries(
    {},
    optional={
        "model": st.one_of(st.text(max_size=20), json_values),
        "prompt": st.one_of(st.text(max_size=200), st.lists(st.text(max_size=20), max_size=3), json_values),
        "messages": st.one_of(
            st.lists(st.fixed_dictionaries({"role": st.text(max_size=10), "content": json_values}), max_size=3),
            json_values,
        ),
        "stream": json_values,
        "max_tokens": json_values,
        "input": json_values,
    },
)


def _bodies() -> st.SearchStrategy[bytes]:
    valid = openai_like.map(lambda d: json.dumps(d).encode())
    truncated = st.tuples(valid, st.integers(min_value=0, max_value=400)).map(lambda t: t[0][: t[1]])
    return st.one_of(valid, truncated, st.binary(max_size=300))


@FUZZ
@given(path=st.sampled_from(PATHS), body=_bodies())
def test_the_parser_answers_every_body_with_a_result_or_a_bad_request(path: str, body: bytes) -> None:
    for parser in default_parsers():  # openai-parser, then the passthrough fallback
        try:
            parsed = parser.parse_request(path, {":path": path}, body)
        except EppError as e:
            assert e.code in (ErrorCode.BAD_REQUEST, ErrorCode.NOT_FOUND), e
            assert e.message  # says what was wrong
        else:
            assert isinstance(parsed.model, str)
            assert parsed.body is not None


def _message(kind: str, data: bytes, eos: bool, mode: int) -> Any:
    if kind == "headers":
        return headers_msg(
            {":method": "POST", ":path": "/v1/completions", "content-type": "application/json"}, eos, req_mode=mode
        )
    if kind == "body":
        return body_msg(data, eos)
    if kind == "trailers":
        return request_trailers_msg()
    if kind == "response_headers":
        return response_headers_msg({":status": "200", "content-type": "text/event-stream"}, eos)
    if kind == "response_body":
        return response_body_msg(data, eos)
    return response_trailers_msg()


# Envoy sends request_headers once per stream, first; a second one is tested on its own below.
KINDS = ["body", "trailers", "response_headers", "response_body", "response_trailers"]
VALID = json.dumps({"model": "m", "prompt": "hello"}).encode()
chunks = st.one_of(
    st.just(VALID),
    st.just(VALID[:7]),
    st.binary(max_size=64),
    st.just(b'data: {"usage": {"prompt_tokens": 3, "completion_tokens": 2}}\n\ndata: [DONE]\n\n'),
)
streams = st.lists(st.tuples(st.sampled_from(KINDS), chunks, st.booleans()), min_size=0, max_size=8)


def _well_ordered(data: st.DataObject) -> list[tuple[str, bytes, bool]]:
    """A valid request, with random splits of its body, then a random response."""
    cut = data.draw(st.integers(min_value=0, max_value=len(VALID)))
    script = [("headers", b"", False), ("body", VALID[:cut], False), ("body", VALID[cut:], True)]
    script += data.draw(st.lists(st.tuples(st.sampled_from(KINDS[2:]), chunks, st.booleans()), max_size=4))
    return script


async def _run(harness: Harness, script: list[tuple[str, bytes, bool]], mode: int, cancel: bool) -> None:
    messages = [_message(kind, data, eos, mode) for kind, data, eos in script]
    try:
        await harness.run(messages, cancel_at_end=cancel)
    except asyncio.CancelledError:
        assert cancel
    except RuntimeError as e:  # grpc.aio turns it into a stream error; only protocol violations may do this
        assert "unexpected" in str(e).lower() or "protocol" in str(e).lower() or "phase" in str(e).lower(), e


def _assert_nothing_leaked(harness: Harness) -> None:
    assert harness.recorder.running == 0
    assert all(e.load.requests == 0 and e.load.tokens == 0 for e in harness.datastore.snapshot())


@FUZZ
@given(
    script=streams,
    mode=st.sampled_from([FDS, BUFFERED, NONE]),
    cancel=st.booleans(),
    max_body=st.sampled_from([16, 1024, 16 << 20]),
)
def test_random_message_orders_never_crash_or_leak(
    script: list[tuple[str, bytes, bool]], mode: int, cancel: bool, max_body: int
) -> None:
    harness = harness_for(max_body)
    asyncio.run(_run(harness, [("headers", b"", False), *script], mode, cancel))
    _assert_nothing_leaked(harness)


@FUZZ
@given(data=st.data(), cancel=st.booleans())
def test_valid_requests_with_random_responses_release_exactly_once(data: st.DataObject, cancel: bool) -> None:
    harness = harness_for(16 << 20)
    asyncio.run(_run(harness, _well_ordered(data), FDS, cancel))
    _assert_nothing_leaked(harness)
    assert len(harness.recorder.completed) <= 1


def test_a_second_request_headers_message_releases_the_first_request() -> None:
    harness = harness_for(1024)
    script = [("headers", b"", False), ("body", VALID, True), ("headers", b"", False)]
    asyncio.run(_run(harness, script, FDS, cancel=False))
    _assert_nothing_leaked(harness)


def test_a_second_end_of_request_body_neither_routes_again_nor_leaks() -> None:
    for mode in (FDS, BUFFERED):
        harness = harness_for(1024)
        script = [("headers", b"", False), ("body", VALID, True), ("body", VALID, True)]
        asyncio.run(_run(harness, script, mode, cancel=False))
        _assert_nothing_leaked(harness)
        assert len(harness.recorder.completed) <= 1
