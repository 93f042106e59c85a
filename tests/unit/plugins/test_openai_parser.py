"""openai-parser: API detection, shape checks, model extraction and rewrite, usage from JSON and SSE."""

from __future__ import annotations

import json

import pytest

from llm_epp.framework import ApiKind, EppError
from llm_epp.framework.parsing import Parser
from llm_epp.framework.requestcontrol import Usage
from llm_epp.plugins.parsers.openai_parser import (
    TYPE,
    JsonUsageReader,
    OpenaiParser,
    Params,
    SseUsageReader,
    detect_api,
    factory,
    usage_from_json,
    usage_from_object,
)
from tests.unit.builders import FakeHandle

PARSER = OpenaiParser()


def parse(path: str, body: bytes):
    return PARSER.parse_request(path, {":path": path}, body)


@pytest.mark.parametrize(
    ("path", "api"),
    [
        ("/v1/completions", ApiKind.COMPLETIONS),
        ("/v1/chat/completions", ApiKind.CHAT_COMPLETIONS),
        ("/v1/projects/p/locations/l/chat/completions", ApiKind.CHAT_COMPLETIONS),
        ("/v1/responses", ApiKind.RESPONSES),
        ("/v1/conversations", ApiKind.CONVERSATIONS),
        ("/v1/embeddings", ApiKind.EMBEDDINGS),
        ("/v1/chat/completions/render", ApiKind.CHAT_COMPLETIONS),
        ("/v1/completions/render", ApiKind.COMPLETIONS),
        ("/v1/images/generations", ApiKind.COMPLETIONS),
        ("/generate", ApiKind.COMPLETIONS),
        ("/v1/chat/completions/", ApiKind.CHAT_COMPLETIONS),
    ],
)
def test_detect_api(path: str, api: ApiKind) -> None:
    assert detect_api(path)[0] is api


def test_claims_the_reference_paths() -> None:
    claims = PARSER.claims()
    assert set(claims.paths) == {
        "chat/completions",
        "completions",
        "embeddings",
        "responses",
        "conversations",
        "chat/completions/render",
        "completions/render",
        "images/generations",
    }
    assert "http" in claims.protocols


def test_parse_chat_request() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True, "cache_salt": "s"}
    parsed = parse("/v1/chat/completions", json.dumps(body).encode())
    assert parsed.model == "m"
    assert parsed.body.api is ApiKind.CHAT_COMPLETIONS
    assert parsed.body.stream and parsed.body.cache_salt == "s"
    assert not parsed.skip_response_processing


def test_image_generation_is_scheduled_on_its_prompt() -> None:
    parsed = parse("/v1/images/generations", b'{"model": "img", "prompt": "a cat"}')
    assert (parsed.model, parsed.body.payload["prompt"]) == ("img", "a cat")


@pytest.mark.parametrize(
    ("path", "body", "fragment"),
    [
        ("/v1/completions", b"", "not valid JSON"),
        ("/v1/completions", b'"just a string"', "JSON object"),
        ("/v1/completions", b'{"model": 5, "prompt": "x"}', "model not found"),
        ("/v1/completions", b'{"model": "m", "prompt": ""}', "prompt"),
        ("/v1/chat/completions", b'{"model": "m", "messages": ["x"]}', "messages[0]"),
        ("/v1/chat/completions", b'{"model": "m", "messages": []}', "messages"),
        ("/v1/responses", b'{"model": "m"}', "input"),
        ("/v1/conversations", b'{"model": "m", "items": []}', "items"),
        ("/v1/embeddings", b'{"model": "m", "input": ""}', "input"),
        ("/v1/images/generations", b'{"model": "m", "prompt": ["x"]}', "prompt"),
    ],
)
def test_parse_errors_are_bad_requests(path: str, body: bytes, fragment: str) -> None:
    with pytest.raises(EppError) as exc:
        parse(path, body)
    assert exc.value.code.http_status == 400
    assert fragment in exc.value.message


def test_rewrite_model_keeps_other_fields() -> None:
    body = json.dumps({"model": "a", "prompt": "p", "n": 12345678901234567890}).encode()
    parsed = parse("/v1/completions", body)
    out = PARSER.rewrite_model(parsed, body, "b")
    assert out is not None and json.loads(out) == {"model": "b", "prompt": "p", "n": 12345678901234567890}


def test_response_reader_follows_the_content_type() -> None:
    parsed = parse("/v1/completions", b'{"model": "m", "prompt": "p"}')
    assert isinstance(
        PARSER.response_reader(parsed, {"content-type": "text/event-stream; charset=utf-8"}), SseUsageReader
    )
    assert isinstance(PARSER.response_reader(parsed, {"content-type": "application/json"}), JsonUsageReader)


def test_factory_builds_a_named_parser() -> None:
    parser = factory("mine", Params(), FakeHandle())
    assert isinstance(parser, Parser)
    assert (parser.typed_name.type, parser.typed_name.name) == (TYPE, "mine")


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        (
            {"object": "text_completion", "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}},
            Usage(3, 4, 7, 0),
        ),
        (
            {"usage": {"prompt_tokens": 3, "completion_tokens": 4, "prompt_tokens_details": {"cached_tokens": 2}}},
            Usage(3, 4, 7, 2),
        ),
        (
            {
                "object": "response",
                "usage": {"input_tokens": 5, "output_tokens": 6, "input_tokens_details": {"cached_tokens": 1}},
            },
            Usage(5, 6, 11, 1),
        ),
        (
            {"type": "response.completed", "response": {"usage": {"input_tokens": 1, "output_tokens": 2}}},
            Usage(1, 2, 3, 0),
        ),
        ({"usage": None}, None),
        ({"choices": []}, None),
        ([1, 2], None),
        ({"usage": {"prompt_tokens": -1, "completion_tokens": "x"}}, Usage(0, 0, 0, 0)),
    ],
    ids=["completion", "cached", "responses-api", "responses-sse", "null", "absent", "not-object", "garbage"],
)
def test_usage_from_object(obj: object, expected: Usage | None) -> None:
    assert usage_from_object(obj) == expected


def test_usage_from_json_ignores_bodies_without_usage_and_bad_json() -> None:
    assert usage_from_json(b'{"choices": []}') is None
    assert usage_from_json(b'{"usage": {') is None
    assert usage_from_json(json.dumps({"usage": {"prompt_tokens": 1}}).encode()) == Usage(1, 0, 1, 0)


def test_json_reader_decodes_at_end_of_stream_and_skips_oversized_bodies() -> None:
    body = json.dumps({"usage": {"prompt_tokens": 2, "completion_tokens": 3}}).encode()
    reader = JsonUsageReader()
    reader.feed(body[:10], False)
    assert reader.usage is None
    reader.feed(body[10:], True)
    assert reader.usage == Usage(2, 3, 5, 0)
    small = JsonUsageReader(limit=len(body) - 1)
    small.feed(body, True)
    assert small.usage is None


def sse(*events: object) -> bytes:
    return b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"


@pytest.mark.parametrize("split", [1, 7, 20, 33, 64, 1000])
def test_sse_reader_finds_usage_at_any_split(split: int) -> None:
    stream = sse({"choices": [{"text": "a"}]}, {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 2}})
    reader = SseUsageReader()
    for i in range(0, len(stream), split):
        reader.feed(stream[i : i + split], False)
    reader.feed(b"", True)
    assert reader.usage == Usage(9, 2, 11, 0)


def test_sse_reader_keeps_the_last_usage_and_reads_an_unterminated_last_line() -> None:
    reader = SseUsageReader()
    reader.feed(b'data: {"usage": {"prompt_tokens": 1, "completion_tokens": 1}}\n\n', False)
    reader.feed(b'data: {"usage": {"prompt_tokens": 1, "completion_tokens": 5}}', False)
    assert reader.usage == Usage(1, 1, 2, 0)
    reader.feed(b"", True)
    assert reader.usage == Usage(1, 5, 6, 0)


def test_sse_reader_without_usage() -> None:
    reader = SseUsageReader()
    reader.feed(sse({"choices": [{"text": "a"}]}), True)
    assert reader.usage is None


def test_sse_reader_drops_an_overlong_line_instead_of_holding_it() -> None:
    from llm_epp.plugins.parsers import sse

    reader = SseUsageReader()
    junk = b"data: " + b"x" * 4096
    for _ in range(sse.MAX_LINE_BYTES // 4096 + 2):
        reader.feed(junk, False)
        assert len(reader._partial) <= sse.MAX_LINE_BYTES
    reader.feed(b'\ndata: {"usage": {"prompt_tokens": 2, "completion_tokens": 1}}\n\n', True)
    assert reader.usage == Usage(2, 1, 3, 0)
