"""The console trace exporter's text for a span, character for character what the OpenTelemetry SDK's
`ReadableSpan.to_json()` writes (a JSON object indented by four spaces), built at a fraction of its cost.

The SDK formats every span by running Python's pure-Python indenting JSON encoder over the whole span,
resource included (the resource is even serialised, parsed and serialised again). Here the resource's text is
made once per resource, the fixed fields are formatted directly, and only the free-form parts (attributes
that are not all strings, events, links) go through the standard encoder, indented one level."""

from __future__ import annotations

import json
import os
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.util import ns_to_iso_str

_NEST = "\n    "
_str = json.encoder.encode_basestring_ascii  # type: ignore[attr-defined]  # what json.dumps uses for a str


def _nested(value: Any) -> str:
    """`json.dumps(value, indent=4)` as it reads one level inside an object (every line after the first
    indented by four more spaces; JSON strings never hold a raw newline)."""
    return json.dumps(value, indent=4).replace("\n", _NEST)


def _attributes(attributes: Any) -> str:
    if attributes is None:
        return "null"
    if not isinstance(attributes, dict):
        attributes = dict(attributes)
    if not attributes:
        return "{}"
    parts = []
    for key, value in attributes.items():
        if type(key) is not str or type(value) is not str:
            return _nested(attributes)  # other values (numbers, lists) as the encoder writes them
        parts.append(f"\n        {_str(key)}: {_str(value)}")
    return "{" + ",".join(parts) + "\n    }"


class SpanFormatter:
    """Callable `span -> text` for `ConsoleSpanExporter(formatter=...)`: `span.to_json() + os.linesep`."""

    __slots__ = ("_resource",)

    def __init__(self) -> None:
        self._resource: tuple[Resource, str] | None = None

    def _resource_text(self, resource: Resource) -> str:
        cached = self._resource
        if cached is None or cached[0] is not resource:
            cached = self._resource = (resource, _nested(json.loads(resource.to_json())))
        return cached[1]

    def __call__(self, span: ReadableSpan) -> str:
        context = span.context
        if context:
            context_text = (
                f'{{\n        "trace_id": "0x{context.trace_id:032x}",\n        "span_id": "0x{context.span_id:016x}",'
                f'\n        "trace_state": {_str(repr(context.trace_state))}\n    }}'
            )
        else:
            context_text = "null"
        parent = span.parent
        parent_text = f'"0x{parent.span_id:016x}"' if parent is not None else "null"
        start, end = span.start_time, span.end_time
        status = span.status
        status_text = f'{{\n        "status_code": {_str(str(status.status_code.name))}'
        if status.description:
            status_text += f',\n        "description": {_str(status.description)}'
        status_text += "\n    }"
        events = ReadableSpan._format_events(span.events)
        links = ReadableSpan._format_links(span.links)
        return (
            f'{{\n    "name": {_str(span.name)},\n    "context": {context_text},\n    "kind": {_str(str(span.kind))},'
            f'\n    "parent_id": {parent_text},'
            f'\n    "start_time": {_str(ns_to_iso_str(start)) if start else "null"},'
            f'\n    "end_time": {_str(ns_to_iso_str(end)) if end else "null"},'
            f'\n    "status": {status_text},'
            f'\n    "attributes": {_attributes(span._attributes)},'
            f'\n    "events": {_nested(events) if events else "[]"},'
            f'\n    "links": {_nested(links) if links else "[]"},'
            f'\n    "resource": {self._resource_text(span.resource)}\n}}{os.linesep}'
        )
