"""vllmhttp-parser (vLLM /inference/v1/generate): token ids, model, salt and stream extraction, 400s naming
the problem, the model rewrite and usage from JSON and SSE answers."""

from __future__ import annotations

import json

import pytest

from llm_epp.framework import ApiKind, EppError
from llm_epp.framework.parsing import Parser
from llm_epp.framework.requestcontrol import Usage
from llm_epp.plugins.parsers.vllmhttp_parser import VllmhttpParser

VLLM_PARSER = VllmhttpParser()
GEN = "/inference/v1/generate"


def _bad(parser: Parser, path: str, body: bytes) -> str:
    with pytest.raises(EppError) as err:
        parser.parse_request(path, {":path": path}, body)
    assert err.value.code.http_status == 400
    return err.value.message


# --- vllmhttp-parser -----------------------------------------------------------------------------------------
def test_vllm_generate_body_gives_token_ids_model_salt_and_stream() -> None:
    body = {
        "model": "m",
        "token_ids": [1, 2, 3.0],
        "sampling_params": {"max_tokens": 8},
        "stream": True,
        "cache_salt": "s",
        "features": {"mm_hashes": {"image": ["h"]}},
    }
    parsed = VLLM_PARSER.parse_request(GEN, {}, json.dumps(body).encode())
    assert parsed.body.api is ApiKind.GENERATE
    assert parsed.body.token_ids == (1, 2, 3)
    assert (parsed.model, parsed.body.stream, parsed.body.cache_salt) == ("m", True, "s")
    assert not parsed.skip_response_processing


def test_vllm_generate_without_model_is_routed_with_no_model() -> None:
    parsed = VLLM_PARSER.parse_request(GEN, {}, b'{"token_ids": [7]}')
    assert (parsed.model, parsed.body.token_ids, parsed.body.stream) == ("", (7,), False)


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (b"not json", "not valid JSON"),
        (b"[1, 2]", "JSON object"),
        (b'{"model": "m"}', "'token_ids'"),
        (b'{"token_ids": []}', "must not be empty"),
        (b'{"token_ids": "1 2"}', "list of token ids"),
        (b'{"token_ids": [1, -2]}', "token_ids[1]"),
        (b'{"token_ids": [1, 2.5]}', "token_ids[1]"),
        (b'{"token_ids": [4294967296]}', "token_ids[0]"),
        (b'{"token_ids": [true]}', "token_ids[0]"),
    ],
)
def test_vllm_generate_bad_bodies_are_400s_naming_the_problem(body: bytes, fragment: str) -> None:
    assert fragment in _bad(VLLM_PARSER, GEN, body)


def test_vllm_generate_rewrites_the_model_and_keeps_the_rest() -> None:
    body = b'{"model": "a", "token_ids": [1, 2], "sampling_params": {"n": 1}}'
    parsed = VLLM_PARSER.parse_request(GEN, {}, body)
    out = VLLM_PARSER.rewrite_model(parsed, body, "b")
    assert out is not None and json.loads(out) == {"model": "b", "token_ids": [1, 2], "sampling_params": {"n": 1}}


def test_vllm_generate_usage_from_json_and_sse() -> None:
    parsed = VLLM_PARSER.parse_request(GEN, {}, b'{"token_ids": [1]}')
    reader = VLLM_PARSER.response_reader(parsed, {"content-type": "application/json"})
    assert reader is not None
    reader.feed(b'{"choices": [{"token_ids": [5]}], "usage": {"prompt_tokens": 1, "completion_tokens": 1}}', True)
    assert reader.usage == Usage(1, 1, 2, 0)
    sse = VLLM_PARSER.response_reader(parsed, {"content-type": "text/event-stream"})
    assert sse is not None
    sse.feed(b'data: {"choices": []}\n\ndata: {"usage": {"prompt_tokens": 4, "completion_tokens": 2}}\n\n', True)
    assert sse.usage == Usage(4, 2, 6, 0)


def test_vllm_parser_claims_only_the_generate_path_and_refuses_others() -> None:
    assert VLLM_PARSER.claims().paths == ("inference/v1/generate",)
    assert "/v1/completions" in _bad(VLLM_PARSER, "/v1/completions", b'{"token_ids": [1]}')
