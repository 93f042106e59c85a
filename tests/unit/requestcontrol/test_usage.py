from __future__ import annotations

import json

import pytest

from llm_epp.framework.requestcontrol import Usage
from llm_epp.requestcontrol.usage import SseUsageReader, usage_from_json, usage_from_object


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        (
            {
                "object": "text_completion",
                "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7},
            },
            Usage(3, 4, 7, 0),
        ),
        (
            {
                "usage": {
                    "prompt_tokens": 3,
                    "completion_tokens": 4,
                    "prompt_tokens_details": {"cached_tokens": 2},
                }
            },
            Usage(3, 4, 7, 2),
        ),
        (
            {
                "object": "response",
                "usage": {
                    "input_tokens": 5,
                    "output_tokens": 6,
                    "input_tokens_details": {"cached_tokens": 1},
                },
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


def sse(*events: object) -> bytes:
    return b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"


@pytest.mark.parametrize("split", [1, 7, 20, 33, 64, 1000])
def test_sse_reader_finds_usage_at_any_split(split: int) -> None:
    stream = sse({"choices": [{"text": "a"}]}, {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 2}})
    reader = SseUsageReader()
    for i in range(0, len(stream), split):
        reader.feed(stream[i : i + split])
    reader.finish()
    assert reader.usage == Usage(9, 2, 11, 0)


def test_sse_reader_keeps_the_last_usage_and_reads_an_unterminated_last_line() -> None:
    reader = SseUsageReader()
    reader.feed(b'data: {"usage": {"prompt_tokens": 1, "completion_tokens": 1}}\n\n')
    reader.feed(b'data: {"usage": {"prompt_tokens": 1, "completion_tokens": 5}}')
    assert reader.usage == Usage(1, 1, 2, 0)
    reader.finish()
    assert reader.usage == Usage(1, 5, 6, 0)


def test_sse_reader_without_usage() -> None:
    reader = SseUsageReader()
    reader.feed(sse({"choices": [{"text": "a"}]}))
    reader.finish()
    assert reader.usage is None
