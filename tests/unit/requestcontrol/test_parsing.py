from __future__ import annotations

import json

import pytest

from llm_epp.framework import ApiKind, EppError
from llm_epp.requestcontrol.parsing import detect_api, parse_request, request_path, rewrite_model


@pytest.mark.parametrize(
    ("path", "api"),
    [
        ("/v1/completions", ApiKind.COMPLETIONS),
        ("/v1/chat/completions", ApiKind.CHAT_COMPLETIONS),
        ("/v1/projects/p/locations/l/chat/completions", ApiKind.CHAT_COMPLETIONS),
        ("/v1/responses", ApiKind.RESPONSES),
        ("/v1/conversations", ApiKind.CONVERSATIONS),
        ("/v1/embeddings", ApiKind.EMBEDDINGS),
        ("/generate", ApiKind.COMPLETIONS),
        ("/v1/chat/completions/", ApiKind.CHAT_COMPLETIONS),
    ],
)
def test_detect_api(path: str, api: ApiKind) -> None:
    assert detect_api(path) is api


def test_request_path_precedence_and_query_stripped() -> None:
    assert request_path({":path": "/v1/chat/completions?x=1", "x-original-path": "/a"}) == "/v1/chat/completions"
    assert request_path({"x-original-path": "/v1/embeddings"}) == "/v1/embeddings"
    assert request_path({"x-forwarded-path": "/v1/responses"}) == "/v1/responses"
    assert request_path({}) == "/v1/completions"


def test_parse_chat_request() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True, "cache_salt": "s"}
    parsed, model = parse_request("/v1/chat/completions", json.dumps(body).encode())
    assert model == "m"
    assert parsed.api is ApiKind.CHAT_COMPLETIONS
    assert parsed.stream and parsed.cache_salt == "s"


@pytest.mark.parametrize(
    ("path", "body", "fragment"),
    [
        ("/v1/completions", b"", "not valid JSON"),
        ("/v1/completions", b'"just a string"', "JSON object"),
        ("/v1/completions", b'{"model": 5, "prompt": "x"}', "model not found"),
        ("/v1/completions", b'{"model": "m", "prompt": ""}', "prompt"),
        ("/v1/chat/completions", b'{"model": "m", "messages": ["x"]}', "messages[0]"),
        ("/v1/responses", b'{"model": "m"}', "input"),
        ("/v1/conversations", b'{"model": "m", "items": []}', "items"),
    ],
)
def test_parse_errors_are_bad_requests(path: str, body: bytes, fragment: str) -> None:
    with pytest.raises(EppError) as exc:
        parse_request(path, body)
    assert exc.value.code.http_status == 400
    assert fragment in exc.value.message


def test_rewrite_model_keeps_other_fields() -> None:
    out = json.loads(rewrite_model({"model": "a", "prompt": "p", "n": 12345678901234567890}, "b"))
    assert out == {"model": "b", "prompt": "p", "n": 12345678901234567890}
