"""sglanghttp-parser (SGLang /generate): token ids, salt and stream extraction, 400s naming the problem, usage
from meta_info in JSON and SSE answers, and resolution next to vllmhttp-parser and openai-parser."""

from __future__ import annotations

import json

import pytest

from llm_epp.framework import ApiKind, EppError
from llm_epp.framework.parsing import Parser
from llm_epp.framework.requestcontrol import Usage
from llm_epp.plugins.parsers import default_parsers
from llm_epp.plugins.parsers.openai_parser import OpenaiParser
from llm_epp.plugins.parsers.passthrough_parser import PassthroughParser
from llm_epp.plugins.parsers.sglanghttp_parser import TYPE as SGLANG
from llm_epp.plugins.parsers.sglanghttp_parser import Params as SglangParams
from llm_epp.plugins.parsers.sglanghttp_parser import SglanghttpParser, SseMetaUsageReader
from llm_epp.plugins.parsers.sglanghttp_parser import factory as sglang_factory
from llm_epp.plugins.parsers.vllmhttp_parser import TYPE as VLLM
from llm_epp.plugins.parsers.vllmhttp_parser import Params as VllmParams
from llm_epp.plugins.parsers.vllmhttp_parser import VllmhttpParser
from llm_epp.plugins.parsers.vllmhttp_parser import factory as vllm_factory
from llm_epp.requestcontrol.parsers import ParserTable
from tests.unit.builders import FakeHandle

SGLANG_PARSER = SglanghttpParser()
GEN = "/inference/v1/generate"


def _bad(parser: Parser, path: str, body: bytes) -> str:
    with pytest.raises(EppError) as err:
        parser.parse_request(path, {":path": path}, body)
    assert err.value.code.http_status == 400
    return err.value.message


# --- sglanghttp-parser ---------------------------------------------------------------------------------------
def test_sglang_generate_body_gives_token_ids_salt_and_stream_and_no_model() -> None:
    body = b'{"input_ids": [10, 20], "extra_key": "salt", "stream": true, "sampling_params": {"max_new_tokens": 4}}'
    parsed = SGLANG_PARSER.parse_request("/generate", {}, body)
    assert parsed.body.api is ApiKind.GENERATE
    assert (parsed.body.token_ids, parsed.body.cache_salt, parsed.body.stream, parsed.model) == (
        (10, 20),
        "salt",
        True,
        "",
    )
    assert SGLANG_PARSER.rewrite_model(parsed, body, "other") is None


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (b'{"sampling_params": {"temperature": 0.8}}', "'input_ids'"),
        (b'{"text": "hello"}', "text prompts are not supported"),
        (b'{"input_embeds": [[0.1, 0.2]]}', "text prompts are not supported"),
        (b'{"input_ids": []}', "must not be empty"),
        (b'{"input_ids": [1, 2, -1]}', "input_ids[2]"),
        (b'{"input_ids": [1, 2.5]}', "input_ids[1]"),
        (b'{"input_ids": [2.0]}', "input_ids[0]"),  # SGLang's ids are integers: no float spelling
        (b'{"input_ids": [4294967296]}', "input_ids[0]"),
        (b'{"input_ids": [[1, 2], [3, 4]]}', "batch"),
        (b'{"input_ids": [1, 2], "extra_key": ["a", "b"]}', "extra_key"),
        (b"{", "not valid JSON"),
    ],
)
def test_sglang_generate_bad_bodies_are_400s_naming_the_problem(body: bytes, fragment: str) -> None:
    assert fragment in _bad(SGLANG_PARSER, "/generate", body)


@pytest.mark.parametrize(
    "path", ["/regenerate", "/health_generate", "/vertex_generate", "/inference/v1/generate", "/prefix/generate"]
)
def test_sglang_parser_reads_only_the_generate_path(path: str) -> None:
    assert "sglanghttp-parser reads only /generate" in _bad(SGLANG_PARSER, path, b'{"input_ids": [1]}')


def test_sglang_generate_path_with_trailing_slash_is_read() -> None:
    assert SGLANG_PARSER.parse_request("/generate/", {}, b'{"input_ids": [1]}').body.token_ids == (1,)


def test_sglang_json_usage_from_meta_info() -> None:
    parsed = SGLANG_PARSER.parse_request("/generate", {}, b'{"input_ids": [1]}')
    reader = SGLANG_PARSER.response_reader(parsed, {"content-type": "application/json"})
    assert reader is not None
    body = b'{"text": "hi", "output_ids": [1, 2], "meta_info": {"prompt_tokens": 8, "completion_tokens": 3, '
    reader.feed(body, False)
    reader.feed(b'"cached_tokens": 2, "finish_reason": {"type": "stop"}}}', True)
    assert reader.usage == Usage(8, 3, 11, 2)
    empty = SGLANG_PARSER.response_reader(parsed, {})
    assert empty is not None
    empty.feed(b'{"text": "", "meta_info": {"prompt_tokens": 0, "completion_tokens": 0}}', True)
    assert empty.usage == Usage(0, 0, 0, 0)
    none = SGLANG_PARSER.response_reader(parsed, {})
    assert none is not None
    none.feed(b'{"meta_info":', True)
    assert none.usage is None


def _sglang_stream() -> bytes:
    events = [
        {"text": "he", "meta_info": {"prompt_tokens": 10, "completion_tokens": 1, "finish_reason": None}},
        {"text": "hel", "meta_info": {"prompt_tokens": 10, "completion_tokens": 2, "finish_reason": None}},
        {
            "text": "hello",
            "meta_info": {
                "prompt_tokens": 10,
                "completion_tokens": 5,
                "cached_tokens": 4,
                "finish_reason": {"type": "stop"},
            },
        },
    ]
    return b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"


@pytest.mark.parametrize("split", [1, 9, 50, 10_000])
def test_sglang_sse_usage_is_the_finished_event_at_any_split(split: int) -> None:
    stream = _sglang_stream()
    reader = SseMetaUsageReader()
    for i in range(0, len(stream), split):
        reader.feed(stream[i : i + split], False)
    reader.feed(b"", True)
    assert reader.usage == Usage(10, 5, 15, 4)


def test_sglang_sse_without_a_finished_event_has_no_usage() -> None:
    reader = SseMetaUsageReader()
    reader.feed(b'data: {"text": "he", "meta_info": {"prompt_tokens": 10, "completion_tokens": 2}}\n\n', True)
    assert reader.usage is None


# --- registration and resolution -----------------------------------------------------------------------------
def test_factories_build_named_parsers() -> None:
    for factory, params, kind in ((vllm_factory, VllmParams(), VLLM), (sglang_factory, SglangParams(), SGLANG)):
        parser = factory("mine", params, FakeHandle())  # type: ignore[operator]
        assert isinstance(parser, Parser)
        assert (parser.typed_name.type, parser.typed_name.name) == (kind, "mine")


def test_resolution_with_both_generate_parsers_and_openai() -> None:
    table = ParserTable([SglanghttpParser(), VllmhttpParser(), OpenaiParser(), PassthroughParser()])
    assert table.resolve("/inference/v1/generate").typed_name.type == VLLM  # the longer suffix wins
    assert table.resolve("/generate").typed_name.type == SGLANG
    assert table.resolve("/v1/completions").typed_name.type == "openai-parser"
    assert table.resolve("/v1/rerank").typed_name.type == "passthrough-parser"


def test_the_default_list_reads_vllm_generate_but_not_sglang_generate() -> None:
    table = ParserTable(default_parsers())
    assert table.resolve(GEN).typed_name.type == VLLM
    assert table.resolve("/generate").typed_name.type == "passthrough-parser"
