"""anthropic-parser: Messages API bodies (system, content blocks, model, stream), count_tokens routed
unread, 400s naming the field, usage from JSON answers and from message_start / message_delta events."""

from __future__ import annotations

import json

import pytest

from llm_epp.framework import ApiKind, EppError
from llm_epp.framework.parsing import Parser
from llm_epp.framework.requestcontrol import Usage
from llm_epp.plugins.parsers import default_parsers
from llm_epp.plugins.parsers.anthropic_parser import TYPE, AnthropicParser, Params, SseMessagesUsageReader, factory
from llm_epp.requestcontrol.parsers import ParserTable
from tests.unit.builders import FakeHandle

PARSER = AnthropicParser()
PATH = "/v1/messages"

REQUEST = {
    "model": "claude-like",
    "max_tokens": 64,
    "system": [{"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}}],
    "messages": [
        {"role": "user", "content": "What is in this image?"},
        {
            "role": "user",
            "content": [
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}},
                {"type": "text", "text": "Describe it."},
            ],
        },
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t1", "name": "look", "input": {"x": 1}}],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "a cat"}]},
    ],
    "tools": [{"name": "look", "input_schema": {"type": "object"}}],
    "stream": True,
    "cache_salt": "tenant-a",
}


def _parse(body: object, path: str = PATH):
    return PARSER.parse_request(path, {":path": path}, json.dumps(body).encode())


def test_messages_request_gives_model_stream_salt_and_the_conversation() -> None:
    parsed = _parse(REQUEST)
    assert parsed.body.api is ApiKind.MESSAGES
    assert (parsed.model, parsed.body.stream, parsed.body.cache_salt) == ("claude-like", True, "tenant-a")
    assert parsed.body.payload["system"][0]["text"] == "You are terse."
    assert len(parsed.body.payload["messages"]) == 4
    assert not parsed.skip_response_processing


def test_a_request_without_model_is_routed_with_no_model() -> None:
    parsed = _parse({"messages": [{"role": "user", "content": "hi"}]})
    assert (parsed.model, parsed.body.stream) == ("", False)


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (b"{", "not valid JSON"),
        (b"[]", "JSON object"),
        (b'{"model": "m"}', "'messages'"),
        (b'{"model": "m", "messages": []}', "'messages'"),
        (b'{"messages": ["hi"]}', "messages[0] must be an object"),
        (b'{"messages": [{"role": 1, "content": "x"}]}', "messages[0].role"),
        (b'{"messages": [{"role": "user", "content": 5}]}', "messages[0].content"),
        (b'{"messages": [{"role": "user", "content": [{"text": "no type"}]}]}', "messages[0].content[0]"),
        (b'{"messages": [{"role": "user", "content": "x"}], "system": {"a": 1}}', "system"),
        (b'{"messages": [{"role": "user", "content": "x"}], "tools": {"a": 1}}', "'tools'"),
        (b'{"messages": [{"role": "user", "content": "x"}], "model": 3}', "'model'"),
    ],
)
def test_bad_bodies_are_400s_naming_the_field(body: bytes, fragment: str) -> None:
    with pytest.raises(EppError) as err:
        PARSER.parse_request(PATH, {}, body)
    assert err.value.code.http_status == 400
    assert fragment in err.value.message


def test_count_tokens_is_routed_unread() -> None:
    parsed = PARSER.parse_request("/v1/messages/count_tokens", {}, b"not even json")
    assert parsed.body.api is ApiKind.OPAQUE and parsed.model == "" and parsed.skip_response_processing
    assert PARSER.rewrite_model(parsed, b"not even json", "x") is None


def test_other_paths_ending_in_messages_are_refused() -> None:
    with pytest.raises(EppError, match="/v1/chatmessages"):
        PARSER.parse_request("/v1/chatmessages", {}, json.dumps(REQUEST).encode())


def test_rewrite_model_keeps_the_rest_of_the_body() -> None:
    body = json.dumps(REQUEST).encode()
    parsed = PARSER.parse_request(PATH, {}, body)
    out = PARSER.rewrite_model(parsed, body, "other")
    assert out is not None and json.loads(out) == {**REQUEST, "model": "other"}


def test_json_answer_usage() -> None:
    parsed = _parse(REQUEST)
    reader = PARSER.response_reader(parsed, {"content-type": "application/json"})
    assert reader is not None
    answer = {
        "type": "message",
        "content": [{"type": "text", "text": "A cat."}],
        "usage": {"input_tokens": 25, "output_tokens": 4, "cache_read_input_tokens": 16},
    }
    data = json.dumps(answer).encode()
    reader.feed(data[:20], False)
    reader.feed(data[20:], True)
    assert reader.usage == Usage(25, 4, 29, 16)


def _stream() -> bytes:
    events = [
        (
            "message_start",
            {
                "type": "message_start",
                "message": {"usage": {"input_tokens": 25, "output_tokens": 1, "cache_read_input_tokens": 8}},
            },
        ),
        (
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        ),
        (
            "content_block_delta",
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hi"}},
        ),
        (
            "message_delta",
            {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 15}},
        ),
        ("message_stop", {"type": "message_stop"}),
    ]
    return b"".join(b"event: %s\ndata: %s\n\n" % (name.encode(), json.dumps(e).encode()) for name, e in events)


@pytest.mark.parametrize("split", [1, 13, 100, 100_000])
def test_streamed_usage_from_message_start_and_message_delta_at_any_split(split: int) -> None:
    parsed = _parse(REQUEST)
    reader = PARSER.response_reader(parsed, {"content-type": "text/event-stream"})
    assert isinstance(reader, SseMessagesUsageReader)
    stream = _stream()
    for i in range(0, len(stream), split):
        reader.feed(stream[i : i + split], False)
    reader.feed(b"", True)
    assert reader.usage == Usage(25, 15, 40, 8)


def test_a_stream_without_usage_events_has_no_usage() -> None:
    reader = SseMessagesUsageReader()
    reader.feed(b'event: ping\ndata: {"type": "ping"}\n\n', True)
    assert reader.usage is None


def test_factory_claims_and_default_list() -> None:
    parser = factory("mine", Params(), FakeHandle())
    assert isinstance(parser, Parser) and (parser.typed_name.type, parser.typed_name.name) == (TYPE, "mine")
    assert set(parser.claims().paths) == {"messages", "messages/count_tokens"}
    table = ParserTable(default_parsers())
    assert table.resolve("/v1/messages").typed_name.type == TYPE
    assert table.resolve("/v1/messages/count_tokens").typed_name.type == TYPE
