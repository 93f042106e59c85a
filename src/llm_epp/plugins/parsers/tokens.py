"""Token-id and JSON-body checks shared by the parsers of token-in APIs."""

from __future__ import annotations

from typing import Any

import orjson

from llm_epp.framework import EppError, ErrorCode

MAX_TOKEN_ID = (1 << 32) - 1  # token ids are uint32 on the wire of every server API read here


def bad_request(message: str) -> EppError:
    return EppError(ErrorCode.BAD_REQUEST, message)


def json_object(body: bytes, what: str) -> dict[str, Any]:
    """The body decoded as a JSON object. Raises EppError(BadRequest) naming `what` was expected."""
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise bad_request(f"the {what} body is not valid JSON: {e}") from None
    if not isinstance(payload, dict):
        raise bad_request(f"the {what} body must be a JSON object")
    return payload


def token_ids(value: Any, field: str, *, whole_floats: bool = False) -> tuple[int, ...]:
    """A non-empty JSON list of token ids (integers 0..2^32-1; with `whole_floats`, also numbers such as
    `7.0`). Raises EppError(BadRequest) naming `field` and the first offending entry."""
    if not isinstance(value, list):
        raise bad_request(f"'{field}' must be a non-empty list of token ids (integers), got {type(value).__name__}")
    if not value:
        raise bad_request(f"'{field}' must not be empty: send the prompt's token ids")
    out = value
    for i, v in enumerate(value):
        if whole_floats and isinstance(v, float) and v.is_integer():
            if out is value:
                out = list(value)
            v = out[i] = int(v)
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_TOKEN_ID:
            raise bad_request(f"{field}[{i}]: {v!r} is not a token id (an integer from 0 to {MAX_TOKEN_ID})")
    return tuple(out)
