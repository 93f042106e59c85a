"""The console exporter's span text is exactly the SDK's `ReadableSpan.to_json()` plus a line end."""

from __future__ import annotations

import io
import json
import os

from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry import trace as otel_trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState

from llm_epp.observability.span_json import SpanFormatter
from llm_epp.observability.tracing import exporters_from_env, resource_from_env

_text = st.text(max_size=12)  # any unicode, quotes, backslashes, control characters
_scalar = st.one_of(
    _text,
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
)
_value = st.one_of(
    _scalar,
    st.lists(_text, max_size=3),
    st.lists(st.integers(min_value=-1000, max_value=1000), max_size=3),
    st.lists(st.floats(allow_nan=False), max_size=3),
)
_attributes = st.dictionaries(st.text(min_size=1, max_size=8), _value, max_size=4)
_str_attributes = st.dictionaries(st.text(min_size=1, max_size=8), _text, max_size=4)


def _spans(
    resource: Resource,
    name: str,
    kind: SpanKind,
    attributes: dict[str, object],
    events: list[tuple[str, dict[str, object]]],
    links: int,
    status: tuple[StatusCode, str],
    with_parent: bool,
    trace_state: list[tuple[str, str]],
) -> list[ReadableSpan]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    parent_ctx = SpanContext(
        0x1234, 0x5678, is_remote=True, trace_flags=TraceFlags(1), trace_state=TraceState(trace_state)
    )
    context = otel_trace.set_span_in_context(otel_trace.NonRecordingSpan(parent_ctx)) if with_parent else None
    link_list = [Link(SpanContext(0xABC + i, 0xDEF + i, is_remote=False), {"i": i}) for i in range(links)]
    span = tracer.start_span(name, context=context, kind=kind, attributes=attributes, links=link_list)
    for event_name, event_attributes in events:
        span.add_event(event_name, event_attributes)
    code, description = status
    span.set_status(Status(code, description if code is StatusCode.ERROR else None))
    span.end()
    unended = tracer.start_span("open", attributes=None)  # no end time, no attributes
    provider.shutdown()
    return [*exporter.get_finished_spans(), unended]  # type: ignore[list-item]


@settings(max_examples=50, deadline=None)
@given(
    name=_text,
    kind=st.sampled_from(list(SpanKind)),
    attributes=st.one_of(_attributes, _str_attributes),
    events=st.lists(st.tuples(_text, _attributes), max_size=2),
    links=st.integers(min_value=0, max_value=2),
    status=st.tuples(st.sampled_from(list(StatusCode)), _text),
    with_parent=st.booleans(),
    trace_state=st.lists(
        st.tuples(st.sampled_from(["a", "vendor", "x1"]), st.sampled_from(["1", "v", "q9"])), max_size=2
    ),
    resource_attributes=st.dictionaries(st.text(min_size=1, max_size=6), st.one_of(_text, st.integers()), max_size=3),
)
def test_formatter_writes_what_the_sdk_writes(
    name: str,
    kind: SpanKind,
    attributes: dict[str, object],
    events: list[tuple[str, dict[str, object]]],
    links: int,
    status: tuple[StatusCode, str],
    with_parent: bool,
    trace_state: list[tuple[str, str]],
    resource_attributes: dict[str, object],
) -> None:
    resource = resource_from_env().merge(Resource(resource_attributes))
    formatter = SpanFormatter()
    for span in _spans(resource, name, kind, attributes, events, links, status, with_parent, trace_state):
        assert formatter(span) == span.to_json() + os.linesep


def test_the_console_exporter_uses_it_and_output_parses() -> None:
    (exporter,) = exporters_from_env({})
    assert isinstance(exporter, ConsoleSpanExporter)
    assert isinstance(exporter.formatter, SpanFormatter)
    out = io.StringIO()
    exporter.out = out
    spans = _spans(
        resource_from_env(), "gateway.request", SpanKind.SERVER, {"request.id": "r1"}, [], 0,
        (StatusCode.UNSET, ""), True, [],
    )  # fmt: skip
    exporter.export(spans[:1])
    assert out.getvalue() == spans[0].to_json() + os.linesep
    assert json.loads(out.getvalue())["attributes"] == {"request.id": "r1"}


def test_a_changed_resource_is_rendered_again() -> None:
    formatter = SpanFormatter()
    first = _spans(Resource({"a": "1"}), "s", SpanKind.INTERNAL, {}, [], 0, (StatusCode.OK, ""), False, [])[0]
    second = _spans(Resource({"a": "2"}), "s", SpanKind.INTERNAL, {}, [], 0, (StatusCode.OK, ""), False, [])[0]
    assert formatter(first) == first.to_json() + os.linesep
    assert formatter(second) == second.to_json() + os.linesep
