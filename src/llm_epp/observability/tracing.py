"""OpenTelemetry implementation of the tracing seam (`framework.tracing`), switched on by `--tracing`.

Configured as the reference EPP, through the standard environment variables:

- `OTEL_SERVICE_NAME` (default `gateway-api-inference-extension/epp`), `OTEL_RESOURCE_ATTRIBUTES`;
- `OTEL_TRACES_EXPORTER`: `console` (the default, as the reference: spans as JSON on stdout), `otlp`
  (OTLP over gRPC to `OTEL_EXPORTER_OTLP_ENDPOINT`, default `http://localhost:4317`; the other
  `OTEL_EXPORTER_OTLP_*` variables — headers, certificates, timeout — are honoured by the exporter) or
  `none` (nothing exported; trace context is still propagated upstream); a comma list combines them;
- `OTEL_TRACES_SAMPLER` (default `parentbased_traceidratio`) and `OTEL_TRACES_SAMPLER_ARG` (default 0.1):
  the standard samplers `always_on`, `always_off`, `traceidratio` and their `parentbased_` forms.
  An unknown exporter or sampler is logged and replaced by the default, as the reference does.

Each ext_proc stream gets one `gateway.request` server span continuing the W3C `traceparent`/`tracestate`
the gateway sent; the director's phases become its children; `inject` hands the trace context to the
model server. `PluginSpanRecorder` adds one child span per plugin call to the current request's span.
With `--tracing=false` none of this exists: the servicer gets `NULL_TRACER` and the recorder is not wrapped."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from typing import Any

from opentelemetry import trace as otel_trace
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.context import Context
from opentelemetry.propagators.composite import CompositePropagator
from opentelemetry.sdk.resources import SERVICE_NAME, SERVICE_VERSION, Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace import Tracer as SdkTracer
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    ParentBased,
    Sampler,
    TraceIdRatioBased,
)
from opentelemetry.trace import SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

import llm_epp
from llm_epp.framework.plugin import TypedName
from llm_epp.framework.recorder import Recorder
from llm_epp.framework.tracing import CURRENT_TRACE, NULL_TRACER, AttributeValue, RequestTrace, Tracer
from llm_epp.observability.span_json import SpanFormatter

log = logging.getLogger(__name__)

DEFAULT_SERVICE_NAME = "gateway-api-inference-extension/epp"
DEFAULT_OTLP_ENDPOINT = "http://localhost:4317"
DEFAULT_SAMPLER = "parentbased_traceidratio"
DEFAULT_SAMPLER_ARG = 0.1
REQUEST_SPAN = "gateway.request"
_TRACEPARENT = "traceparent"
_BAGGAGE = "baggage"
_RANDOM_TRACE_ID = getattr(TraceFlags, "RANDOM_TRACE_ID", 0)  # W3C trace context level 2 flag, newer SDKs set it
SCOPE = "llm-epp"


def _ratio(raw: str | None) -> float:
    if raw is None:
        return DEFAULT_SAMPLER_ARG
    try:
        ratio = float(raw)
    except ValueError:
        log.warning("tracing_sampler_arg_invalid OTEL_TRACES_SAMPLER_ARG=%r using=%s", raw, DEFAULT_SAMPLER_ARG)
        return DEFAULT_SAMPLER_ARG
    if not 0.0 <= ratio <= 1.0:
        log.warning("tracing_sampler_arg_invalid OTEL_TRACES_SAMPLER_ARG=%r using=%s", raw, DEFAULT_SAMPLER_ARG)
        return DEFAULT_SAMPLER_ARG
    return ratio


def sampler_from_env(env: Mapping[str, str]) -> Sampler:
    name = env.get("OTEL_TRACES_SAMPLER", DEFAULT_SAMPLER).strip().lower()
    arg = env.get("OTEL_TRACES_SAMPLER_ARG")
    fixed: dict[str, Sampler] = {
        "always_on": ALWAYS_ON,
        "always_off": ALWAYS_OFF,
        "parentbased_always_on": ParentBased(ALWAYS_ON),
        "parentbased_always_off": ParentBased(ALWAYS_OFF),
    }
    if name in fixed:
        return fixed[name]
    if name == "traceidratio":
        return TraceIdRatioBased(_ratio(arg))
    if name != DEFAULT_SAMPLER:
        log.warning(
            "tracing_sampler_unsupported OTEL_TRACES_SAMPLER=%r using=%s ratio=%s",
            name,
            DEFAULT_SAMPLER,
            DEFAULT_SAMPLER_ARG,
        )
        return ParentBased(TraceIdRatioBased(DEFAULT_SAMPLER_ARG))
    return ParentBased(TraceIdRatioBased(_ratio(arg)))


_TRACE_ID_LOW_BITS = (1 << 64) - 1


def root_sampling_bound(sampler: Sampler) -> int | None:
    """For a sampler whose decision on a request without a parent depends on the trace id alone (ratio,
    always-off, and their parent-based forms): the bound the trace id's low 64 bits must stay under to be
    sampled. None for any other sampler."""
    if isinstance(sampler, ParentBased):
        sampler = sampler._root  # the sampler ParentBased asks for spans without a parent
    if sampler is ALWAYS_OFF:
        return 0
    if type(sampler) is TraceIdRatioBased:
        return sampler.bound
    return None


class _PresetTraceIds(RandomIdGenerator):
    """The SDK's random ids, except that a trace id drawn ahead (to decide sampling before asking the SDK for a
    span) is the next one handed out, so the SDK's span carries it."""

    def __init__(self) -> None:
        self.preset = 0

    def generate_trace_id(self) -> int:
        trace_id = self.preset
        if trace_id:
            self.preset = 0
            return trace_id
        return super().generate_trace_id()


class TracingSetupError(RuntimeError):
    """Tracing cannot start as configured; the message says how to fix it."""


def otlp_span_exporter_class() -> Any:
    """The OTLP/gRPC span exporter. xds-protos (the Envoy API the EPP speaks) ships an older copy of
    `opentelemetry/proto` that, depending on install order, overwrites opentelemetry-proto's and breaks the
    exporter; that is reported with the fix instead of failing on the first export."""
    try:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    except ImportError as e:
        raise TracingSetupError(
            f"the OTLP trace exporter cannot load ({e}): another package (xds-protos) overwrote opentelemetry-proto's "
            "files; reinstall it after llm-epp with `pip install --force-reinstall --no-deps "
            "opentelemetry-proto==<installed version>`, or set OTEL_TRACES_EXPORTER=console|none"
        ) from None
    return OTLPSpanExporter


def exporters_from_env(env: Mapping[str, str]) -> list[SpanExporter]:
    names = [n.strip().lower() for n in env.get("OTEL_TRACES_EXPORTER", "console").split(",") if n.strip()]
    exporters: list[SpanExporter] = []
    for name in names or ["console"]:
        if name == "none":
            continue
        if name == "otlp":
            OTLPSpanExporter = otlp_span_exporter_class()
            endpoint = (
                env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
                or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
                or DEFAULT_OTLP_ENDPOINT
            )
            exporters.append(OTLPSpanExporter(endpoint=endpoint))
        else:
            if name != "console":
                log.warning("tracing_exporter_unsupported OTEL_TRACES_EXPORTER=%r using=console", name)
            exporters.append(ConsoleSpanExporter(formatter=SpanFormatter()))  # the SDK's text, made faster
    return exporters


def resource_from_env() -> Resource:
    resource = Resource.create({SERVICE_VERSION: llm_epp.__version__})  # reads OTEL_SERVICE_NAME and friends
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: DEFAULT_SERVICE_NAME}))
    return resource


class OtelTracer:
    """`Tracer` on an OpenTelemetry SDK `TracerProvider` of its own (the global provider is left alone).

    A request that continues no trace (no `traceparent`, no `baggage`) is decided first when the provider's
    sampler decides on the trace id alone (`root_sampling_bound`) and the provider draws ids through
    `_PresetTraceIds` (as `build_tracer` sets it up): a sampled-out request then gets no SDK span, only its
    trace context for the model server (`traceparent` with a fresh trace and span id, the flags the SDK would
    set), which costs a few microseconds instead of the SDK's span machinery."""

    def __init__(self, provider: TracerProvider) -> None:
        self.provider = provider
        self._tracer = provider.get_tracer(SCOPE, llm_epp.__version__)
        self._propagator = CompositePropagator([TraceContextTextMapPropagator(), W3CBaggagePropagator()])
        ids = provider.id_generator
        bound = root_sampling_bound(provider.sampler)
        usable = isinstance(ids, _PresetTraceIds) and isinstance(self._tracer, SdkTracer)
        self._ids = ids if usable and isinstance(ids, _PresetTraceIds) else None
        self._root_bound = bound if self._ids is not None else None
        self._unsampled_flags = f"{TraceFlags.DEFAULT | _RANDOM_TRACE_ID if ids.is_trace_id_random() else 0:02x}"

    @property
    def enabled(self) -> bool:
        return True

    def start_request(self, request_id: str, headers: Mapping[str, str]) -> RequestTrace:
        bound = self._root_bound
        if bound is not None and _TRACEPARENT not in headers and _BAGGAGE not in headers:
            ids = self._ids
            assert ids is not None
            trace_id = ids.generate_trace_id()
            if trace_id & _TRACE_ID_LOW_BITS >= bound:  # the ratio sampler's rule: sampled out
                return UnsampledRequestTrace(trace_id, ids.generate_span_id(), self._unsampled_flags)
            ids.preset = trace_id  # sampled: the SDK's span gets this trace id
            parent = Context()
        else:
            parent = self._propagator.extract(headers)
        span = self._tracer.start_span(
            REQUEST_SPAN, context=parent, kind=SpanKind.SERVER, attributes={"request.id": request_id}
        )
        return OtelRequestTrace(self._tracer, self._propagator, span, otel_trace.set_span_in_context(span, parent))

    def shutdown(self) -> None:
        """Exports what is buffered and stops the exporters."""
        self.provider.shutdown()


class UnsampledRequestTrace:
    """A request sampled out before any span was made: phases, events and attributes are dropped, `inject`
    writes the W3C `traceparent` the SDK's non-recording span would (version 00, trace id, span id, flags)."""

    __slots__ = ("_flags", "_span_id", "_trace_id")

    recording = False

    def __init__(self, trace_id: int, span_id: int, flags: str) -> None:
        self._trace_id = trace_id
        self._span_id = span_id
        self._flags = flags

    def phase(
        self, name: str, start_ns: int, end_ns: int, attributes: Mapping[str, AttributeValue] | None = None
    ) -> None:
        pass

    def event(self, name: str, attributes: Mapping[str, AttributeValue] | None = None) -> None:
        pass

    def set_attributes(self, attributes: Mapping[str, AttributeValue]) -> None:
        pass

    def inject(self, headers: dict[str, str]) -> None:
        headers[_TRACEPARENT] = f"00-{self._trace_id:032x}-{self._span_id:016x}-{self._flags}"

    def end(self, status: int = 0, error: str = "") -> None:
        pass


class OtelRequestTrace:
    """A sampled (or parent-decided) request's span. Its phases are kept as plain tuples and become SDK child
    spans, with the times they were given, when the request ends: a request's path to its answers then pays
    for one SDK span, not one per phase and plugin call."""

    __slots__ = ("_context", "_ended", "_phases", "_propagator", "_recording", "_span", "_tracer")

    def __init__(
        self,
        tracer: otel_trace.Tracer,
        propagator: CompositePropagator,
        span: otel_trace.Span,
        context: Context,
    ) -> None:
        self._tracer = tracer
        self._propagator = propagator
        self._span = span
        self._context = context
        self._recording = span.is_recording()  # False when sampled out: only the context is propagated
        self._ended = False
        self._phases: list[tuple[str, int, int, Mapping[str, AttributeValue] | None]] = []

    @property
    def recording(self) -> bool:
        """Whether phases and events are recorded (False when sampled out)."""
        return self._recording

    def phase(
        self, name: str, start_ns: int, end_ns: int, attributes: Mapping[str, AttributeValue] | None = None
    ) -> None:
        if self._recording and not self._ended:
            self._phases.append((name, start_ns, end_ns, attributes))

    def event(self, name: str, attributes: Mapping[str, AttributeValue] | None = None) -> None:
        if self._recording:
            self._span.add_event(name, attributes)

    def set_attributes(self, attributes: Mapping[str, AttributeValue]) -> None:
        if self._recording:
            self._span.set_attributes(attributes)

    def inject(self, headers: dict[str, str]) -> None:
        self._propagator.inject(headers, context=self._context)

    def end(self, status: int = 0, error: str = "") -> None:
        if self._ended:
            return
        self._ended = True
        if self._recording:
            tracer, context = self._tracer, self._context
            for name, start_ns, end_ns, attributes in self._phases:
                tracer.start_span(name, context=context, start_time=start_ns, attributes=attributes).end(
                    end_time=end_ns
                )
            self._phases.clear()
            if status:
                self._span.set_attribute("http.response.status_code", status)
            if error:
                self._span.set_status(Status(StatusCode.ERROR, error))
        self._span.end()


def build_tracer(
    enabled: bool, env: Mapping[str, str] | None = None, processors: tuple[SpanProcessor, ...] = ()
) -> Tracer:
    """The tracer for `--tracing`: `NULL_TRACER` when off, else an `OtelTracer` exporting as `env` (default
    the process environment) says; `processors` replace the environment's exporters (tests)."""
    if not enabled:
        return NULL_TRACER
    env = os.environ if env is None else env
    provider = TracerProvider(
        sampler=sampler_from_env(env), resource=resource_from_env(), id_generator=_PresetTraceIds()
    )
    if processors:
        for processor in processors:
            provider.add_span_processor(processor)
    else:
        exporters = exporters_from_env(env)
        for exporter in exporters:
            provider.add_span_processor(BatchSpanProcessor(exporter))
        log.info(
            "tracing_enabled exporters=%s sampler=%s",
            ",".join(type(e).__name__ for e in exporters) or "none",
            provider.sampler.get_description(),
        )
    return OtelTracer(provider)


def shutdown_tracer(tracer: Tracer) -> None:
    if isinstance(tracer, OtelTracer):
        tracer.shutdown()


class PluginSpanRecorder:
    """A `Recorder` that adds a child span per plugin call (`plugin_duration`) to the current request's
    span (`CURRENT_TRACE`), then passes everything on to `inner` (the Prometheus recorder)."""

    def __init__(self, inner: Recorder) -> None:
        self.inner = inner
        # Every other call goes straight to the inner recorder's bound method (no hop through this class).
        for name in _PASSED_THROUGH:
            method = getattr(inner, name, None)
            if method is not None:
                setattr(self, name, method)

    def __getattr__(self, name: str) -> Any:  # methods beyond the protocol (e.g. Prometheus pool gauges)
        return getattr(self.inner, name)

    def plugin_duration(self, extension_point: str, plugin: TypedName, seconds: float) -> None:
        self.inner.plugin_duration(extension_point, plugin, seconds)
        trace = CURRENT_TRACE.get()
        if trace is not None and getattr(trace, "recording", True):
            end = time.time_ns()
            trace.phase(
                f"plugin.{extension_point}",
                end - int(seconds * 1e9),
                end,
                {"plugin.type": plugin.type, "plugin.name": plugin.name, "plugin.extension_point": extension_point},
            )

    def plugin_error(self, extension_point: str, plugin: TypedName) -> None:
        self.inner.plugin_error(extension_point, plugin)

    def scheduler_duration(self, seconds: float) -> None:
        self.inner.scheduler_duration(seconds)

    def score_out_of_range(self, plugin: TypedName) -> None:
        self.inner.score_out_of_range(plugin)

    def scheduler_attempt(self, success: bool, target_model: str, pod_name: str, namespace: str, port: str) -> None:
        self.inner.scheduler_attempt(success, target_model, pod_name, namespace, port)

    def request_scheduled(self, model: str, target_model: str, priority: int) -> None:
        self.inner.request_scheduled(model, target_model, priority)

    def prefix_index_size(self, entries: int) -> None:
        self.inner.prefix_index_size(entries)

    def prefix_match(self, hit_ratio: float, hit_chars: int) -> None:
        self.inner.prefix_match(hit_ratio, hit_chars)

    def model_rewrite(self, rule: str, model: str, target_model: str) -> None:
        self.inner.model_rewrite(rule, model, target_model)

    def request_error(self, model: str, target_model: str, error_code: str) -> None:
        self.inner.request_error(model, target_model, error_code)

    def running_requests(self, model: str, delta: int) -> None:
        self.inner.running_requests(model, delta)

    def request_completed(
        self,
        model: str,
        target_model: str,
        duration_s: float,
        request_bytes: int,
        response_bytes: int,
        prompt_tokens: int | None,
        completion_tokens: int | None,
        cached_tokens: int | None,
    ) -> None:
        self.inner.request_completed(
            model,
            target_model,
            duration_s,
            request_bytes,
            response_bytes,
            prompt_tokens,
            completion_tokens,
            cached_tokens,
        )


_PASSED_THROUGH = tuple(
    name
    for name, value in vars(PluginSpanRecorder).items()
    if callable(value) and not name.startswith("_") and name != "plugin_duration"
)


def with_plugin_spans(recorder: Recorder, tracer: Tracer) -> Recorder:
    """`recorder` itself when tracing is off (no cost), else wrapped in `PluginSpanRecorder`."""
    return PluginSpanRecorder(recorder) if tracer.enabled else recorder
