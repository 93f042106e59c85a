"""OpenAI-style request parsing (the reference `openai-parser`): API detection from the path, shape
validation, model extraction. Errors are 400s that say what was wrong."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from llm_epp.framework import ApiKind, EppError, ErrorCode, RequestBody

DEFAULT_PATH = "/v1/completions"
_PATH_HEADERS = (":path", "x-original-path", "x-forwarded-path")

# Suffix order matters: /chat/completions must be tested before /completions.
_SUFFIXES = (
    ("/conversations", ApiKind.CONVERSATIONS),
    ("/responses", ApiKind.RESPONSES),
    ("/chat/completions", ApiKind.CHAT_COMPLETIONS),
    ("/completions", ApiKind.COMPLETIONS),
    ("/embeddings", ApiKind.EMBEDDINGS),
)


def request_path(headers: Mapping[str, str]) -> str:
    for name in _PATH_HEADERS:
        value = headers.get(name)
        if value:
            return value.split("?", 1)[0]
    return DEFAULT_PATH


def detect_api(path: str) -> ApiKind:
    path = path.rstrip("/")
    for suffix, kind in _SUFFIXES:
        if path.endswith(suffix):
            return kind
    return ApiKind.COMPLETIONS


def _bad(message: str) -> EppError:
    return EppError(ErrorCode.BAD_REQUEST, message)


def _check_shape(api: ApiKind, payload: Mapping[str, Any], path: str) -> None:
    if api is ApiKind.COMPLETIONS:
        prompt = payload.get("prompt")
        if isinstance(prompt, str) and prompt:
            return
        if isinstance(prompt, list) and prompt:
            return
        raise _bad(f"{path} expects a non-empty 'prompt' (a string or a list of strings)")
    if api is ApiKind.CHAT_COMPLETIONS:
        messages = payload.get("messages")
        if not isinstance(messages, list) or not messages:
            raise _bad(f"{path} expects 'messages': a non-empty list of {{role, content}} objects")
        for i, m in enumerate(messages):
            if not isinstance(m, dict):
                raise _bad(f"messages[{i}] must be an object with 'role' and 'content'")
        return
    if api is ApiKind.RESPONSES:
        if payload.get("input") in (None, "", []):
            raise _bad(f"{path} expects 'input'")
        return
    if api is ApiKind.CONVERSATIONS:
        items = payload.get("items")
        if not isinstance(items, list) or not items:
            raise _bad(f"{path} expects 'items': a non-empty list")
        return
    if api is ApiKind.EMBEDDINGS and payload.get("input") in (None, "", []):
        raise _bad(f"{path} expects a non-empty 'input'")


def parse_request(path: str, body: bytes) -> tuple[RequestBody, str]:
    """Returns the parsed body and the incoming model name. Raises EppError(BadRequest)."""
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise _bad(f"the request body is not valid JSON: {e}") from None
    if not isinstance(payload, dict):
        raise _bad("the request body must be a JSON object")
    model = payload.get("model")
    if not isinstance(model, str) or not model:
        raise _bad('model not found in request body: set "model" to the name of the model to use')
    api = detect_api(path)
    _check_shape(api, payload, path)
    salt = payload.get("cache_salt")
    return (
        RequestBody(
            api=api,
            payload=payload,
            stream=payload.get("stream") is True,
            cache_salt=salt if isinstance(salt, str) else "",
        ),
        model,
    )


def rewrite_model(payload: Mapping[str, Any], target_model: str) -> bytes:
    """The body with `model` replaced, re-serialised (only called when the model actually changes)."""
    out = dict(payload)
    out["model"] = target_model
    return orjson.dumps(out)
