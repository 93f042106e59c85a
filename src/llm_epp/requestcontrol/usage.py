"""Reading token usage out of model-server responses: JSON bodies and Server-Sent Events, including
`data:` lines split across body chunks (which the reference misses)."""

from __future__ import annotations

from typing import Any

import orjson

from llm_epp.framework.requestcontrol import Usage

_USAGE = b'"usage"'


def usage_from_object(obj: Any) -> Usage | None:
    """Usage from a decoded response object (chat/text completion, responses API, or an SSE event)."""
    if not isinstance(obj, dict):
        return None
    if obj.get("type") == "response.completed" and isinstance(obj.get("response"), dict):
        obj = obj["response"]
    usage = obj.get("usage")
    if not isinstance(usage, dict):
        return None
    prompt = usage.get("prompt_tokens", usage.get("input_tokens"))
    completion = usage.get("completion_tokens", usage.get("output_tokens"))
    details = usage.get("prompt_tokens_details") or usage.get("input_tokens_details") or {}
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    total = usage.get("total_tokens")

    def _int(v: Any) -> int:
        return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else 0

    p, c = _int(prompt), _int(completion)
    return Usage(
        prompt_tokens=p,
        completion_tokens=c,
        total_tokens=_int(total) or p + c,
        cached_tokens=_int(cached),
    )


def usage_from_json(body: bytes) -> Usage | None:
    if _USAGE not in body:
        return None
    try:
        return usage_from_object(orjson.loads(body))
    except orjson.JSONDecodeError:
        return None


class SseUsageReader:
    """Feeds SSE bytes chunk by chunk; keeps the last usage seen. Only lines that mention "usage"
    are decoded, so ordinary token events cost a substring search."""

    __slots__ = ("_partial", "usage")

    def __init__(self) -> None:
        self._partial = b""
        self.usage: Usage | None = None

    def feed(self, chunk: bytes) -> None:
        data = self._partial + chunk if self._partial else chunk
        last_nl = data.rfind(b"\n")
        if last_nl < 0:
            self._partial = data
            return
        self._partial = data[last_nl + 1 :]
        complete = data[: last_nl + 1]
        if _USAGE not in complete:
            return
        for line in complete.split(b"\n"):
            if _USAGE in line and line.startswith(b"data:"):
                self._take(line[5:].strip())

    def finish(self) -> None:
        if self._partial.startswith(b"data:") and _USAGE in self._partial:
            self._take(self._partial[5:].strip())
        self._partial = b""

    def _take(self, payload: bytes) -> None:
        try:
            found = usage_from_object(orjson.loads(payload))
        except orjson.JSONDecodeError:
            return
        if found is not None:
            self.usage = found
