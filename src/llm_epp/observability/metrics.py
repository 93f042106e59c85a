"""Prometheus metrics with the reference EPP's names, labels and buckets; implements `Recorder`.

Two name sets are served from one set of stored series:

- the Gateway API Inference Extension v1.5 names (`inference_objective_*`, `inference_pool_*`,
  `inference_extension_*`, `llm_d_inference_scheduler_*`), which existing dashboards query, and
- llm-d-router's canonical `llm_d_epp_*` names, which carry more labels (request metrics add
  `fairness_id` and `priority`; prefix-index metrics add `plugin_name` and `plugin_type`).

A request is recorded once, into the canonical series; the older names are views that sum canonical
series over the labels they lack, computed when `/metrics` is scraped. Dual emission therefore costs the
scrape, not the request.

Label values a client controls are bounded (see `KnownModels` and `PrometheusRecorder`): a model name is
a label value only when it is known (configured, reported by a pod, or seen served), the rest share the
value `other`; names longer than `max_label_length` are `other` too; fairness IDs are admitted up to a
cap; and series no request has touched for `series_ttl` seconds are dropped.

Every `PrometheusRecorder` owns its `CollectorRegistry` (never the global one). Histograms are
`_HistogramChild`, a lock-free child (a bisect and two adds per observation) whose `le` values are written
as the Go client writes them (`le="1"`, not `le="1.0"`). The recorder assumes a single writer thread, the
event loop; the scrape thread only reads (whole-tuple swaps and `list(dict.items())` copies).

`MetricsServer` serves `/metrics` from a daemon thread: the one documented exception to "no threads"."""

from __future__ import annotations

import os
import threading
import time
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from itertools import accumulate
from typing import TYPE_CHECKING, Protocol
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.metrics import disable_created_metrics
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

import llm_epp
from llm_epp.framework.latency import LatencyKind, SloKind
from llm_epp.framework.plugin import TypedName
from llm_epp.framework.recorder import Recorder
from llm_epp.observability.latency_metrics import LatencyMetrics

# --- buckets (GIE pkg/epp/metrics/metrics.go; llm-d-router pkg/epp/metrics/llm_d_router_metrics.go) -------
GENERAL_LATENCY_BUCKETS = (
    0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.25, 1.5, 2, 3, 4, 5, 6, 8, 10, 15, 20, 30, 45,
    60, 120, 180, 240, 300, 360, 480, 600, 900, 1200, 1800, 2700, 3600,
)  # fmt: skip
SCHEDULER_BUCKETS = (0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1)
REQUEST_SIZE_BUCKETS = tuple(float(2**i) for i in range(6, 31))  # 64 … 1073741824
# 32778 (not 32768) reproduces the reference's typo so dashboards see identical `le` values.
RESPONSE_SIZE_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32778, 65536)
TOKEN_BUCKETS = (*RESPONSE_SIZE_BUCKETS, 131072, 262144, 524288, 1048576)
OUTPUT_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
NTPOT_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)
HIT_RATIO_BUCKETS = tuple(i / 10 for i in range(11))
HIT_BYTES_BUCKETS = (0, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
TTFT_BUCKETS = GENERAL_LATENCY_BUCKETS[:24]  # 0.005 … 120
STREAMING_TPOT_BUCKETS = (
    0.0005, 0.00205, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.125, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1, 2,
)  # fmt: skip
ITL_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1, 2)
REQUEST_PROCESSING_BUCKETS = (
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.015, 0.025, 0.04, 0.06, 0.1, 0.25, 0.5, 1, 2.5, 5, 10,
)  # fmt: skip
RESPONSE_PROCESSING_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5,
)  # fmt: skip

OTHER = "other"  # the one label value every unknown or over-long client-supplied value becomes
DEFAULT_MAX_LABEL_LENGTH = 256
DEFAULT_SERIES_TTL = 600.0  # seconds
DEFAULT_MAX_SERVED_MODELS = 100
DEFAULT_MAX_FAIRNESS_IDS = 100
DEFAULT_PREFIX_PLUGIN = TypedName("approx-prefix-cache-producer", "approx-prefix-cache-producer")

_ALPHA = "[ALPHA] "  # the reference's HelpMsgWithStability prefix
_EPP = "llm_d_epp_"
_SWEEP_EVERY = 256  # record calls between two looks at the clock
_MEMO_SIZE = 4096  # raw label values remembered per memo (client-chosen: bounded, emptied when full)


class KnownModels(Protocol):
    """Which model names may appear as label values. Any `set` or `frozenset` of names qualifies; the app
    passes an object that answers from the configured rewrite rules and what the pods report. Membership is
    asked once per model name and sweep period, and for every request naming an unknown model, so it must
    be cheap."""

    def __contains__(self, model: object, /) -> bool: ...


def _generation_source(known: KnownModels) -> Callable[[], int | None] | None:
    """How to tell that `known` answers as before: a frozenset never changes; an object with a
    `generation()` method says so itself (a number that changes when any answer may have); anything else
    (a mutable set) cannot say, and answers about it are not remembered."""
    if isinstance(known, frozenset):
        return lambda: 0
    generation = getattr(known, "generation", None)
    return generation if callable(generation) else None


def _go_float(v: float) -> str:
    """`le` as Go's strconv.FormatFloat(v, 'g', -1, 64): prometheus_client's form minus a trailing `.0`."""
    s = str(floatToGoString(v))  # type: ignore[no-untyped-call]
    return s[:-2] if s.endswith(".0") else s


class _HistogramChild:
    __slots__ = ("_bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self._bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # last slot: above the highest bound (+Inf only)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self._bounds, value)] += 1  # first bucket with bound >= value
        self.sum += value


class _Buckets:
    """One bucket layout: sorted bounds and their Go-formatted `le` strings."""

    __slots__ = ("bounds", "le")

    def __init__(self, buckets: Iterable[float]) -> None:
        self.bounds = tuple(sorted(float(b) for b in buckets))
        self.le = tuple(_go_float(b) for b in self.bounds)

    def child(self) -> _HistogramChild:
        return _HistogramChild(self.bounds)


class _Cell:
    """A counter or gauge value plus the sweep epoch in which a request last touched it."""

    __slots__ = ("epoch", "value")

    def __init__(self, epoch: int) -> None:
        self.value = 0.0
        self.epoch = epoch


class _HistCell(_HistogramChild):
    __slots__ = ("epoch",)

    def __init__(self, bounds: tuple[float, ...], epoch: int) -> None:
        super().__init__(bounds)
        self.epoch = epoch


class _RequestSeries:
    """Everything recorded per canonical request key (model, target model, fairness ID, priority)."""

    __slots__ = (
        "cached_tokens",
        "duration",
        "epoch",
        "input_tokens",
        "ntpot",
        "output_tokens",
        "request_size",
        "response_size",
        "running",
        "total",
    )

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch
        self.total = 0.0
        self.running: float | None = None  # None: never touched (no series), as a Go GaugeVec child
        self.duration = _DURATION.child()
        self.request_size = _REQUEST_SIZE.child()
        self.response_size = _RESPONSE_SIZE.child()
        self.input_tokens = _TOKENS.child()
        self.output_tokens = _OUTPUT_TOKENS.child()
        self.cached_tokens = _TOKENS.child()
        self.ntpot = _NTPOT.child()


_DURATION = _Buckets(GENERAL_LATENCY_BUCKETS)
_REQUEST_SIZE = _Buckets(REQUEST_SIZE_BUCKETS)
_RESPONSE_SIZE = _Buckets(RESPONSE_SIZE_BUCKETS)
_TOKENS = _Buckets(TOKEN_BUCKETS)
_OUTPUT_TOKENS = _Buckets(OUTPUT_TOKEN_BUCKETS)
_NTPOT = _Buckets(NTPOT_BUCKETS)
_SCHED = _Buckets(SCHEDULER_BUCKETS)
_HIT_RATIO = _Buckets(HIT_RATIO_BUCKETS)
_HIT_BYTES = _Buckets(HIT_BYTES_BUCKETS)
_TTFT = _Buckets(TTFT_BUCKETS)
_STREAMING_TPOT = _Buckets(STREAMING_TPOT_BUCKETS)
_ITL = _Buckets(ITL_BUCKETS)
_REQ_PROCESSING = _Buckets(REQUEST_PROCESSING_BUCKETS)
_RESP_PROCESSING = _Buckets(RESPONSE_PROCESSING_BUCKETS)


@dataclass(frozen=True, slots=True)
class _View:
    """One exposed metric name over stored series: `keep` picks (and orders) the stored label values it
    shows; stored series that agree on those are summed. None keeps them all."""

    name: str
    doc: str
    labels: tuple[str, ...]
    keep: tuple[int, ...] | None = None


def _project(
    items: Iterable[tuple[tuple[str, ...], float]], keep: tuple[int, ...] | None
) -> dict[tuple[str, ...], float]:
    out: dict[tuple[str, ...], float] = {}
    for key, v in items:
        k = key if keep is None else tuple(key[i] for i in keep)
        out[k] = out.get(k, 0.0) + v
    return out


def _counter(view: _View, items: Iterable[tuple[tuple[str, ...], float]]) -> Metric:
    fam = CounterMetricFamily(view.name, view.doc, labels=view.labels)
    for key, v in _project(items, view.keep).items():
        fam.add_metric(key, v)
    return fam


def _gauge(view: _View, items: Iterable[tuple[tuple[str, ...], float]]) -> Metric:
    fam = GaugeMetricFamily(view.name, view.doc, labels=view.labels)
    for key, v in _project(items, view.keep).items():
        fam.add_metric(key, v)
    return fam


def _histogram(view: _View, buckets: _Buckets, items: Iterable[tuple[tuple[str, ...], _HistogramChild]]) -> Metric:
    merged: dict[tuple[str, ...], tuple[list[int], float]] = {}
    for key, child in items:
        counts = list(child.counts)  # copy first: the loop thread keeps writing
        if not sum(counts):
            continue  # never observed: no series (a Go HistogramVec child exists only once observed)
        k = key if view.keep is None else tuple(key[i] for i in view.keep)
        prev = merged.get(k)
        merged[k] = (
            (counts, child.sum)
            if prev is None
            else ([a + b for a, b in zip(prev[0], counts, strict=True)], prev[1] + child.sum)
        )
    fam = HistogramMetricFamily(view.name, view.doc, labels=view.labels)
    for key, (counts, total) in merged.items():
        cumulative = list(accumulate(counts))
        fam.add_metric(key, [*zip(buckets.le, cumulative[:-1], strict=True), ("+Inf", cumulative[-1])], total)
    return fam


# --- the exposed names ------------------------------------------------------------------------------------
_MODEL = ("model_name", "target_model_name")
_REQ = (*_MODEL, "fairness_id", "priority")  # canonical request key
_PLUGIN = ("extension_point", "plugin_type", "plugin_name")
_MT = (0, 1)  # keep model_name, target_model_name


def _pair(
    legacy: str,
    legacy_doc: str,
    canonical: str,
    canonical_doc: str,
    keep: tuple[int, ...] | None,
    legacy_labels: tuple[str, ...],
    labels: tuple[str, ...],
) -> tuple[_View, _View]:
    return (
        _View(legacy, _ALPHA + legacy_doc, legacy_labels, keep),
        _View(_EPP + canonical, _ALPHA + canonical_doc, labels),
    )


_V_REQUEST_TOTAL = _pair(
    "inference_objective_request_total",
    "Counter of inference objective requests broken out for each model and target model.",
    "request_total", "Total number of processed requests.", (0, 1, 3), (*_MODEL, "priority"), _REQ,
)  # fmt: skip
_V_REQUEST_ERROR = _pair(
    "inference_objective_request_error_total",
    "Counter of inference objective requests errors broken out for each model and target model.",
    "request_error_total", "Total number of request errors.", (0, 1, 4), (*_MODEL, "error_code"), (*_REQ, "error_code"),
)  # fmt: skip
_REQUEST_HISTOGRAMS: tuple[tuple[str, _Buckets, tuple[_View, _View]], ...] = (
    ("duration", _DURATION, _pair(
        "inference_objective_request_duration_seconds",
        "Inference objective response latency distribution in seconds for each model and target model.",
        "request_duration_seconds", "End-to-end request latency distribution in seconds.", _MT, _MODEL, _REQ)),
    ("request_size", _REQUEST_SIZE, _pair(
        "inference_objective_request_sizes",
        "Inference objective requests size distribution in bytes for each model and target model.",
        "request_size_bytes", "Incoming request body size distribution in bytes.", _MT, _MODEL, _REQ)),
    ("response_size", _RESPONSE_SIZE, _pair(
        "inference_objective_response_sizes",
        "Inference objective responses size distribution in bytes for each model and target model.",
        "response_size_bytes", "Outgoing response body size distribution in bytes.", _MT, _MODEL, _REQ)),
    ("input_tokens", _TOKENS, _pair(
        "inference_objective_input_tokens",
        "Inference objective input token count distribution for requests in each model.",
        "request_input_tokens", "Input token count distribution per request.", _MT, _MODEL, _REQ)),
    ("output_tokens", _OUTPUT_TOKENS, _pair(
        "inference_objective_output_tokens",
        "Inference objective output token count distribution for requests in each model.",
        "request_output_tokens", "Output token count distribution per request.", _MT, _MODEL, _REQ)),
    ("cached_tokens", _TOKENS, _pair(
        "inference_objective_prompt_cached_tokens",
        "Inference objective prompt cached token count distribution for requests in each model.",
        "request_cached_tokens",
        "Distribution of prompt tokens read from cache per request, as reported by the model server in the response.",
        _MT, _MODEL, _REQ)),
    ("ntpot", _NTPOT, _pair(
        "inference_objective_normalized_time_per_output_token_seconds",
        "Inference objective latency divided by number of output tokens in seconds for each model and target model.",
        "request_ntpot_seconds",
        "Normalized time per output token in seconds (end-to-end latency divided by output token count).",
        _MT, _MODEL, _REQ)),
)  # fmt: skip
_V_RUNNING = _pair(
    "inference_objective_running_requests", "Inference objective number of running requests in each model.",
    "request_running", "Current number of active running requests.", (0,), ("model_name",), _REQ,
)  # fmt: skip
_POOL_GAUGES = (  # (legacy name, legacy doc, canonical name, canonical doc)
    ("inference_pool_average_kv_cache_utilization", "The average kv cache utilization for an inference server pool.",
     "average_kv_cache_utilization", "The average kv cache utilization for an inference server pool."),
    ("inference_pool_average_queue_size", "The average number of requests pending in the model server queue.",
     "average_queue_size", "The average number of requests pending in the model server queue."),
    ("inference_pool_average_running_requests",
     "The average number of running requests across model servers in the pool.",
     "average_running_requests", "The average number of running requests across model servers in the pool."),
    ("inference_pool_ready_pods", "The number of ready pods in the inference server pool.",
     "ready_endpoints", "The number of ready endpoints in the inference server pool."),
)  # fmt: skip
_POOL_STD_DEV = (
    ("std_dev_kv_cache_utilization", "The standard deviation kv cache utilization for an inference server pool."),
    ("std_dev_queue_size", "The standard deviation number of requests pending in the model server queue."),
    ("std_dev_running_requests",
     "The standard deviation number of running requests across model servers in the pool."),
)  # fmt: skip
_V_E2E = _pair(
    "inference_extension_scheduler_e2e_duration_seconds", "End-to-end scheduling latency distribution in seconds.",
    "scheduler_e2e_duration_seconds", "End-to-end scheduling latency distribution in seconds.", None, (), (),
)  # fmt: skip
_V_ATTEMPTS = _pair(
    "inference_extension_scheduler_attempts_total", "Total number of scheduling attempts.",
    "scheduler_attempts_total", "Total number of scheduling attempts.", None,
    ("status", "target_model_name", "pod_name", "namespace", "port"),
    ("status", "target_model_name", "endpoint_name", "namespace", "port"),
)  # fmt: skip
_PLUGIN_DOC = "Plugin processing latency distribution in seconds for each extension point, plugin type and plugin name."
_V_PLUGIN = _pair(
    "inference_extension_plugin_duration_seconds", _PLUGIN_DOC, "plugin_duration_seconds", _PLUGIN_DOC,
    None, _PLUGIN, _PLUGIN,
)  # fmt: skip
_V_REWRITE = _pair(
    "inference_extension_model_rewrite_decisions_total", "Total number of model rewrite decisions.",
    "model_rewrite_decisions_total", "Total number of inference model rewrite decisions.", None,
    ("model_rewrite_name", "model_name", "target_model"), ("model_rewrite_name", "model_name", "target_model"),
)  # fmt: skip
_INFO_DOC = "General information of the current build of Inference Extension."
_V_INFO = _pair(
    "inference_extension_info", _INFO_DOC, "info", _INFO_DOC, None, ("commit", "build_ref"), ("commit", "build_ref")
)
_PREFIX_LABELS = ("plugin_name", "plugin_type")
_V_PREFIX_SIZE = _pair(
    "inference_extension_prefix_indexer_size", "Size of the prefix indexer.",
    "prefix_indexer_size", "Size of the prefix indexer.", (), (), _PREFIX_LABELS,
)  # fmt: skip
_V_HIT_RATIO = _pair(
    "inference_extension_prefix_indexer_hit_ratio",
    "Ratio of prefix length matched to total prefix length in the cache lookup.",
    "prefix_indexer_hit_ratio", "Ratio of prefix length matched to total prefix length in the cache lookup.",
    (), (), _PREFIX_LABELS,
)  # fmt: skip
_V_HIT_BYTES = _pair(
    "inference_extension_prefix_indexer_hit_bytes",
    "Length of the prefix match in number of bytes in the cache lookup.",
    "prefix_indexer_hit_bytes", "Length of the prefix match in number of bytes in the cache lookup.",
    (), (), _PREFIX_LABELS,
)  # fmt: skip
# Families llm-epp's request path does not feed yet: exposed once something records into them.
_V_POLL_ERRORS = _pair(
    "llm_d_inference_scheduler_datalayer_poll_errors_total", "Data-source poll errors per source type.",
    "datalayer_poll_errors_total", "Data-source poll errors per source type.", None, ("source_type",), ("source_type",),
)  # fmt: skip
_V_EXTRACT_ERRORS = _pair(
    "llm_d_inference_scheduler_datalayer_extract_errors_total", "Extract errors per source/extractor type.",
    "datalayer_extract_errors_total", "Extract errors per source/extractor type.", None,
    ("source_type", "extractor_type"), ("source_type", "extractor_type"),
)  # fmt: skip
_DECISION = ("plugin_name", "plugin_type", "model_name", "decision_type")
_V_DISAGG = _pair(
    "llm_d_inference_scheduler_disagg_decision_total", "Total number of disaggregation routing decisions made",
    "disagg_decision_total", "Total number of disaggregation routing decisions made", (2, 3),
    ("model_name", "decision_type"), _DECISION,
)  # fmt: skip
_V_PD = _pair(
    "llm_d_inference_scheduler_pd_decision_total", "Total number of P/D disaggregation decisions made",
    "pd_decision_total", "Total number of P/D disaggregation decisions made", (2, 3),
    ("model_name", "decision_type"), _DECISION,
)  # fmt: skip
_ROLLOUT_NO_MATCH = _View(
    _EPP + "disaggregatedset_strict_header_no_match_total",
    _ALPHA + "Strict header selections that matched no endpoint and failed closed.",
    ("plugin_type", "plugin_name", "selector"),
)
_ROLLOUT_SHARE = _View(
    _EPP + "disaggregatedset_revision_gating_share",
    _ALPHA + "Current weighted revision gating share from 0 to 1; incomplete revisions have share 0.",
    ("plugin_type", "plugin_name", "mode", "revision"),
)
_V_TTFT = _View(
    _EPP + "request_ttft_seconds",
    _ALPHA + "Time to first token in seconds, measured from request received to first response byte. For "
    "non-streaming requests, this equals total request duration.",
    (*_REQ, "streaming"),
)
_V_STREAMING_TPOT = _View(
    _EPP + "request_streaming_tpot_seconds",
    _ALPHA + "Average time per output token in seconds for streaming requests, computed as (e2e - TTFT) / "
    "(output_tokens - 1).",
    _REQ,
)
_V_ITL = _View(
    _EPP + "request_streaming_itl_seconds",
    _ALPHA + "Inter-token latency in seconds for streaming requests, measured as the time between consecutive "
    "response body chunks.",
    _REQ,
)
_V_REQ_PROCESSING = _View(
    _EPP + "request_processing_duration_seconds",
    _ALPHA + "EPP request processing latency distribution in seconds, from request receipt until the request body "
    "has been handled, including admission control.",
    (),
)
_V_RESP_PROCESSING = _View(
    _EPP + "response_processing_duration_seconds",
    _ALPHA + "EPP response processing latency distribution in seconds: the sum of per-chunk handler time for a "
    "streamed response, or the interval from response headers to completion for a non-streaming response.",
    (),
)
_PLUGIN_ERRORS = _View(
    "llm_epp_plugin_errors_total", "Plugin calls that raised; the plugin's contribution was skipped.", _PLUGIN
)
_OUT_OF_RANGE = _View(
    "llm_epp_scores_out_of_range_total",
    "Scores outside [0, 1] returned by a scorer (clamped before weighting).",
    ("plugin_type", "plugin_name"),
)


class _Exposition(Collector):
    """The recorder's one collector: renders every name from the recorder's stored series."""

    def __init__(self, render: Callable[[], Iterator[Metric]]) -> None:
        self._render = render

    def collect(self) -> Iterable[Metric]:
        return list(self._render())


class PrometheusRecorder:
    """The Prometheus `Recorder`.

    Bounds on client-controlled label values:

    - `known_models`: model names shown as they are (any `KnownModels`; settable at run time, e.g. by the
      app from its rewrite rules and pods). A name is also learnt when a response for it reported token
      usage (the model server served it), up to `max_served_models` such names. Every other name, and any
      name longer than `max_label_length`, is recorded as `other`. An empty name stays empty.
    - fairness IDs: the first `max_fairness_ids` distinct values (each at most `max_label_length`) are kept,
      later ones are `other` until a sweep frees room.
    - `series_ttl`: a series no request touched for between `series_ttl` and twice that is dropped (a
      running-requests gauge only once it is back to 0), and learnt names and fairness IDs are forgotten.
      Sweeps run on the recording thread, at most once per `series_ttl`.

    `created_series=False` (default) turns off prometheus_client's `*_created` samples, which the Go
    reference does not export; that switch is process-wide. `clock` is for tests."""

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        created_series: bool = False,
        known_models: KnownModels = frozenset(),
        max_label_length: int = DEFAULT_MAX_LABEL_LENGTH,
        series_ttl: float = DEFAULT_SERIES_TTL,
        max_served_models: int = DEFAULT_MAX_SERVED_MODELS,
        max_fairness_ids: int = DEFAULT_MAX_FAIRNESS_IDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not created_series:
            disable_created_metrics()  # type: ignore[no-untyped-call]
        if series_ttl <= 0 or max_label_length < 1:
            raise ValueError("series_ttl must be positive and max_label_length at least 1")
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        self._known_models: KnownModels = known_models
        self._known_generation = _generation_source(known_models)
        # Memos of label resolution within one sweep epoch: raw (model, target model, fairness ID, priority)
        # -> its request series, and names that resolved to `other`. Emptied by a sweep and by a newly learnt
        # served model. Only an `other` answer depends on the known models (an admitted name stays admitted
        # until the sweep): while the memos hold one, they are also emptied when the known models change.
        self._memo_generation: int | None = None
        self._memo_depends = False  # the memos hold an answer that depends on the known models
        self._series_memo: dict[tuple[str, str, str, int | str], _RequestSeries] = {}
        self._attempt_memo: dict[tuple[bool, str, str, str, str], _Cell] = {}  # raw attempt -> its counter
        self._other_models: set[str] = set()
        self.max_label_length = max_label_length
        self.series_ttl = series_ttl
        self.max_served_models = max_served_models
        self.max_fairness_ids = max_fairness_ids
        self._clock = clock
        self._epoch = 0
        self._next_sweep = clock() + series_ttl
        self._ops = 0
        # Label admission caches (value -> label); unknown values are never stored.
        self._model_labels: dict[str, str] = {}
        self._served: dict[str, int] = {}  # learnt model -> epoch last served
        self._fairness: dict[str, int] = {}  # admitted fairness ID -> epoch last seen
        self._priorities: dict[int, str] = {}
        # Stored series.
        self._requests: dict[tuple[str, str, str, str], _RequestSeries] = {}
        self._errors: dict[tuple[str, str, str, str, str], _Cell] = {}
        self._attempts: dict[tuple[str, str, str, str, str], _Cell] = {}
        self._rewrites: dict[tuple[str, str, str], _Cell] = {}
        self._plugin_duration: dict[tuple[str, str, str], _HistogramChild] = {}
        self._plugin_errors: dict[tuple[str, str, str], _Cell] = {}
        self._out_of_range: dict[tuple[str, str], _Cell] = {}
        self._scheduler = _SCHED.child()
        self._prefix_size: dict[tuple[str, str], float] = {}
        self._hit_ratio: dict[tuple[str, str], _HistogramChild] = {}
        self._hit_bytes: dict[tuple[str, str], _HistogramChild] = {}
        self._pools: dict[str, tuple[float, float, float, float]] = {}
        self._pool_std_dev: dict[str, tuple[float | None, float | None, float | None]] = {}
        self._per_pod: dict[str, tuple[tuple[str, float], ...]] = {}
        self._info = ((os.environ.get("LLM_EPP_COMMIT") or "unknown", llm_epp.__version__), 1.0)
        self._poll_errors: dict[tuple[str], _Cell] = {}
        self._extract_errors: dict[tuple[str, str], _Cell] = {}
        self._disagg: dict[tuple[str, str, str, str], _Cell] = {}
        self._pd: dict[tuple[str, str, str, str], _Cell] = {}
        self._rollout_no_match: dict[tuple[str, str, str], _Cell] = {}
        self._rollout_shares: dict[tuple[str, str, str], dict[str, float]] = {}
        self._ttft: dict[tuple[str, str, str, str, str], _HistCell] = {}
        self._streaming_tpot: dict[tuple[str, str, str, str], _HistCell] = {}
        self._itl: dict[tuple[str, str, str, str], _HistCell] = {}
        self._req_processing = _REQ_PROCESSING.child()
        self._resp_processing = _RESP_PROCESSING.child()
        self.registry.register(_Exposition(self._render))
        self.latency = LatencyMetrics(self._model)  # latency-predictor families (`LatencyRecorder`)
        self.registry.register(self.latency)

    def latency_observed(
        self, model: str, target_model: str, kind: LatencyKind, seconds: float, plugin: TypedName | None = None
    ) -> None:
        self.latency.latency_observed(model, target_model, kind, seconds, plugin)

    def latency_slo_checked(
        self, model: str, target_model: str, kind: SloKind, violated: bool, plugin: TypedName | None = None
    ) -> None:
        self.latency.latency_slo_checked(model, target_model, kind, violated, plugin)

    @property
    def known_models(self) -> KnownModels:
        return self._known_models

    @known_models.setter
    def known_models(self, known: KnownModels) -> None:
        self._known_models = known
        self._known_generation = _generation_source(known)
        self._forget_memos()

    # --- label bounds -------------------------------------------------------------------------------
    def _forget_memos(self) -> None:
        self._series_memo.clear()
        self._attempt_memo.clear()
        self._other_models.clear()
        self._memo_depends = False

    def _check_known(self) -> None:
        """Empties the memos when they hold an answer the known models no longer give."""
        if self._memo_depends:
            source = self._known_generation
            if source is None or source() != self._memo_generation:
                self._forget_memos()

    def _may_remember_other(self) -> bool:
        """Whether an answer that depends on the known models may be remembered (after `_check_known`): only
        when they can tell their generation."""
        source = self._known_generation
        generation = source() if source is not None else None
        if generation is None:
            return False
        if not self._memo_depends:
            self._memo_generation = generation
            self._memo_depends = True
        return generation == self._memo_generation

    def _model(self, model: str) -> str:
        label = self._model_labels.get(model)
        if label is not None:
            return label
        if not model:
            return ""
        other = self._other_models
        if model in other:
            self._check_known()
            if model in other:
                return OTHER
        if len(model) > self.max_label_length or not (model in self._known_models or model in self._served):
            if self._may_remember_other():
                if len(other) >= _MEMO_SIZE:
                    other.clear()
                other.add(model)
            return OTHER  # not in `_model_labels`: that holds admitted names only
        self._model_labels[model] = model
        return model

    def _fairness_id(self, fairness_id: str) -> str:
        seen = self._fairness.get(fairness_id)
        if seen is not None:
            if seen != self._epoch:
                self._fairness[fairness_id] = self._epoch
            return fairness_id
        if not fairness_id:
            return ""
        if len(fairness_id) > self.max_label_length or len(self._fairness) >= self.max_fairness_ids:
            return OTHER
        self._fairness[fairness_id] = self._epoch
        return fairness_id

    def _priority(self, priority: int | str) -> str:
        if isinstance(priority, str):
            return priority
        label = self._priorities.get(priority)
        if label is None:
            label = self._priorities[priority] = str(priority)
        return label

    def _learn_served(self, model: str) -> None:
        if not model or len(model) > self.max_label_length or model in self.known_models:
            return
        if model in self._served:
            self._served[model] = self._epoch
        elif len(self._served) < self.max_served_models and model not in self._model_labels:
            self._served[model] = self._epoch
            self._forget_memos()  # a name that was `other` is now shown

    def _series(self, model: str, target_model: str, fairness_id: str, priority: int | str) -> _RequestSeries:
        # Within a sweep epoch the same values resolve to the same labels (admitted names, fairness IDs
        # and `other` change only at a sweep, when a served model is learnt or, for `other`, when the known
        # models change, and each of these empties the memo), and the series found is already marked with
        # this epoch; so a repeated request finds its series in one lookup.
        raw = (model, target_model, fairness_id, priority)
        memo = self._series_memo
        self._check_known()
        series = memo.get(raw)
        if series is not None:
            return series
        m = self._model(model)
        t = m if target_model == model else self._model(target_model)
        key = (m, t, self._fairness_id(fairness_id), self._priority(priority))
        series = self._requests.get(key)
        if series is None:
            series = self._requests[key] = _RequestSeries(self._epoch)
        else:
            series.epoch = self._epoch
        if (m != OTHER and t != OTHER) or self._may_remember_other():
            if len(memo) >= _MEMO_SIZE:
                memo.clear()
            memo[raw] = series
        return series

    def _cell(self, table: dict, key: tuple[str, ...]) -> _Cell:  # type: ignore[type-arg]
        cell: _Cell | None = table.get(key)
        if cell is None:
            cell = table[key] = _Cell(self._epoch)
        else:
            cell.epoch = self._epoch
        return cell

    def _tick(self) -> None:
        self._ops += 1
        if self._ops >= _SWEEP_EVERY:
            self._ops = 0
            self.sweep()

    def sweep(self, now: float | None = None) -> bool:
        """Drops what no request touched since the previous sweep, if `series_ttl` has passed since then.
        Called from the recording paths; returns whether it swept."""
        now = self._clock() if now is None else now
        if now < self._next_sweep:
            return False
        self._next_sweep = now + self.series_ttl
        epoch = self._epoch
        self._requests = {k: s for k, s in self._requests.items() if s.epoch >= epoch or s.running}
        for name in ("_errors", "_attempts", "_rewrites", "_ttft", "_streaming_tpot", "_itl", "_disagg", "_pd"):
            table: dict = getattr(self, name)  # type: ignore[type-arg]
            setattr(self, name, {k: c for k, c in table.items() if c.epoch >= epoch})
        self._served = {m: e for m, e in self._served.items() if e >= epoch}
        self._fairness = {f: e for f, e in self._fairness.items() if e >= epoch}
        self._model_labels = {}  # re-admitted against the current known models on next use
        self._forget_memos()
        self._epoch = epoch + 1
        return True

    # --- scheduling core ---------------------------------------------------------------------------
    def plugin_duration(self, extension_point: str, plugin: TypedName, seconds: float) -> None:
        key = (extension_point, plugin.type, plugin.name)  # str tuple: cached hashes, no dataclass __hash__
        child = self._plugin_duration.get(key)
        if child is None:
            child = self._plugin_duration[key] = _SCHED.child()
        child.observe(seconds)

    def plugin_error(self, extension_point: str, plugin: TypedName) -> None:
        self._cell(self._plugin_errors, (extension_point, plugin.type, plugin.name)).value += 1

    def scheduler_duration(self, seconds: float) -> None:
        self._scheduler.observe(seconds)

    def score_out_of_range(self, plugin: TypedName) -> None:
        self._cell(self._out_of_range, (plugin.type, plugin.name)).value += 1

    # --- per request -------------------------------------------------------------------------------
    def scheduler_attempt(self, success: bool, target_model: str, pod_name: str, namespace: str, port: str) -> None:
        # Memoised like `_series`: the same raw values find the same counter until a memo is emptied.
        raw = (success, target_model, pod_name, namespace, port)
        memo = self._attempt_memo
        self._check_known()
        cell = memo.get(raw)
        if cell is None:
            model = self._model(target_model)
            cell = self._cell(self._attempts, ("success" if success else "failure", model, pod_name, namespace, port))
            if model != OTHER or self._may_remember_other():
                if len(memo) >= _MEMO_SIZE:
                    memo.clear()
                memo[raw] = cell
        cell.value += 1

    def prefix_index_size(self, entries: int, *, plugin: TypedName = DEFAULT_PREFIX_PLUGIN) -> None:
        self._prefix_size[(plugin.name, plugin.type)] = float(entries)

    def prefix_match(self, hit_ratio: float, hit_chars: int, *, plugin: TypedName = DEFAULT_PREFIX_PLUGIN) -> None:
        key = (plugin.name, plugin.type)
        ratio = self._hit_ratio.get(key)
        if ratio is None:
            ratio = self._hit_ratio[key] = _HIT_RATIO.child()
            self._hit_bytes[key] = _HIT_BYTES.child()
        ratio.observe(hit_ratio)
        self._hit_bytes[key].observe(hit_chars)

    def model_rewrite(self, rule: str, model: str, target_model: str) -> None:
        self._cell(self._rewrites, (rule, self._model(model), self._model(target_model))).value += 1

    def request_scheduled(self, model: str, target_model: str, priority: int, *, fairness_id: str = "") -> None:
        self._series(model, target_model, fairness_id, priority).total += 1

    def request_error(
        self, model: str, target_model: str, error_code: str, *, fairness_id: str = "", priority: int | str = ""
    ) -> None:
        if not error_code:  # as the reference: an empty code is not counted
            return
        key = (self._model(model), self._model(target_model), self._fairness_id(fairness_id), self._priority(priority))
        self._cell(self._errors, (*key, error_code)).value += 1

    def running_requests(
        self,
        model: str,
        delta: int,
        *,
        target_model: str = "",
        fairness_id: str = "",
        priority: int | str = "",
    ) -> None:
        if not model:  # as the reference: no series for an empty model name
            return
        series = self._series(model, target_model, fairness_id, priority)
        series.running = (series.running or 0.0) + delta

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
        *,
        fairness_id: str = "",
        priority: int | str = "",
    ) -> None:
        if prompt_tokens or completion_tokens:  # usage reported: a model server served these names
            if model not in self._model_labels:
                self._learn_served(model)
            if target_model not in self._model_labels:
                self._learn_served(target_model)
        s = self._series(model, target_model, fairness_id, priority)
        if duration_s > 0:  # the reference drops non-positive latencies (complete must be after received)
            s.duration.observe(duration_s)
        s.request_size.observe(request_bytes)
        s.response_size.observe(response_bytes)
        # Token counts follow the reference: input/output only when > 0, cached whenever reported.
        if prompt_tokens is not None and prompt_tokens > 0:
            s.input_tokens.observe(prompt_tokens)
        if completion_tokens is not None and completion_tokens > 0:
            s.output_tokens.observe(completion_tokens)
            if duration_s > 0:
                s.ntpot.observe(duration_s / completion_tokens)
        if cached_tokens is not None:
            s.cached_tokens.observe(cached_tokens)
        self._tick()

    # --- request timing llm-d-router records (exposed once recorded) ---------------------------------
    def request_ttft(
        self, model: str, target_model: str, seconds: float, *, streaming: bool, fairness_id: str = "",
        priority: int | str = "",
    ) -> None:  # fmt: skip
        key = (self._model(model), self._model(target_model), self._fairness_id(fairness_id), self._priority(priority))
        self._hist_cell(self._ttft, (*key, "true" if streaming else "false"), _TTFT).observe(seconds)

    def request_streaming_tpot(
        self, model: str, target_model: str, seconds: float, *, fairness_id: str = "", priority: int | str = ""
    ) -> None:
        key = (self._model(model), self._model(target_model), self._fairness_id(fairness_id), self._priority(priority))
        self._hist_cell(self._streaming_tpot, key, _STREAMING_TPOT).observe(seconds)

    def request_inter_token_latency(
        self, model: str, target_model: str, seconds: float, *, fairness_id: str = "", priority: int | str = ""
    ) -> None:
        if seconds < 0:
            return
        key = (self._model(model), self._model(target_model), self._fairness_id(fairness_id), self._priority(priority))
        self._hist_cell(self._itl, key, _ITL).observe(seconds)

    def request_processing_duration(self, seconds: float) -> None:
        self._req_processing.observe(seconds)

    def response_processing_duration(self, seconds: float) -> None:
        self._resp_processing.observe(seconds)

    def _hist_cell(self, table: dict, key: tuple[str, ...], buckets: _Buckets) -> _HistCell:  # type: ignore[type-arg]
        cell: _HistCell | None = table.get(key)
        if cell is None:
            cell = table[key] = _HistCell(buckets.bounds, self._epoch)
        else:
            cell.epoch = self._epoch
        return cell

    # --- data layer and disaggregation (llm_d_inference_scheduler_* and llm_d_epp_*) -----------------
    def datalayer_poll_error(self, source_type: str) -> None:
        self._cell(self._poll_errors, (source_type,)).value += 1

    def datalayer_extract_error(self, source_type: str, extractor_type: str) -> None:
        self._cell(self._extract_errors, (source_type, extractor_type)).value += 1

    def disagg_decision(self, plugin: TypedName, model: str, decision_type: str) -> None:
        """decision_type: decode-only, prefill-decode, encode-decode or encode-prefill-decode."""
        label = self._model(model) or "unknown"
        self._cell(self._disagg, (plugin.name, plugin.type, label, decision_type)).value += 1

    def pd_decision(self, plugin: TypedName, model: str, decision_type: str) -> None:
        """decision_type: decode-only or prefill-decode (the P/D-only handler's metric)."""
        label = self._model(model) or "unknown"
        self._cell(self._pd, (plugin.name, plugin.type, label, decision_type)).value += 1

    def rollout_strict_no_match(self, plugin: TypedName, selector: str) -> None:
        self._cell(self._rollout_no_match, (plugin.type, plugin.name, selector)).value += 1

    def rollout_revision_shares(self, plugin: TypedName, mode: str, shares: Mapping[str, float]) -> None:
        self._rollout_shares[(plugin.type, plugin.name, mode)] = dict(shares)

    # --- pool gauges (the data layer calls this every --refresh-prometheus-metrics-interval) -------
    def set_pool_gauges(
        self,
        pool_name: str,
        avg_kv: float,
        avg_queue: float,
        avg_running: float,
        ready_pods: int,
        per_pod_queue: Mapping[str, float],
        *,
        std_dev_kv: float | None = None,
        std_dev_queue: float | None = None,
        std_dev_running: float | None = None,
    ) -> None:
        # Whole-tuple swaps: the scrape thread reads one consistent tuple per pool.
        self._pools[pool_name] = (avg_kv, avg_queue, avg_running, float(ready_pods))
        if std_dev_kv is not None or std_dev_queue is not None or std_dev_running is not None:
            self._pool_std_dev[pool_name] = (std_dev_kv, std_dev_queue, std_dev_running)
        self._per_pod[pool_name] = tuple(per_pod_queue.items())
        self.sweep()

    # --- exposition ---------------------------------------------------------------------------------
    def _render(self) -> Iterator[Metric]:
        requests = list(self._requests.items())
        totals = [(k, s.total) for k, s in requests if s.total]
        errors = [(k, c.value) for k, c in list(self._errors.items())]
        for view in _V_REQUEST_TOTAL:
            yield _counter(view, totals)
        for view in _V_REQUEST_ERROR:
            yield _counter(view, errors)
        for attr, buckets, views in _REQUEST_HISTOGRAMS:
            items = [(k, getattr(s, attr)) for k, s in requests]
            for view in views:
                yield _histogram(view, buckets, items)
        running = [(k, s.running) for k, s in requests if s.running is not None]
        for view in _V_RUNNING:
            yield _gauge(view, running)

        pools = list(self._pools.items())
        for i, (legacy, legacy_doc, canonical, doc) in enumerate(_POOL_GAUGES):
            values = [((pool,), v[i]) for pool, v in pools]
            yield _gauge(_View(legacy, _ALPHA + legacy_doc, ("name",)), values)
            yield _gauge(_View(_EPP + canonical, _ALPHA + doc, ("name",)), values)
        std_devs = list(self._pool_std_dev.items())
        for i, (canonical, doc) in enumerate(_POOL_STD_DEV):
            values = [((pool,), v) for pool, sd in std_devs if (v := sd[i]) is not None]
            if values:
                yield _gauge(_View(_EPP + canonical, _ALPHA + doc, ("name",)), values)
        per_pod = [((pool, pod), q) for pool, pods in list(self._per_pod.items()) for pod, q in pods]
        yield _gauge(
            _View(
                "inference_pool_per_pod_queue_size",
                _ALPHA + "The total number of requests pending in the model server queue for each underlying pod.",
                ("name", "model_server_pod"),
            ),
            per_pod,
        )
        yield _gauge(
            _View(
                _EPP + "per_endpoint_queue_size",
                _ALPHA + "The total number of requests pending in the model server queue for each underlying endpoint.",
                ("name", "model_server_endpoint"),
            ),
            per_pod,
        )

        for view in _V_E2E:
            yield _histogram(view, _SCHED, [((), self._scheduler)])
        attempts = [(k, c.value) for k, c in list(self._attempts.items())]
        for view in _V_ATTEMPTS:
            yield _counter(view, attempts)
        plugin = list(self._plugin_duration.items())
        for view in _V_PLUGIN:
            yield _histogram(view, _SCHED, plugin)
        for view in _V_INFO:
            yield _gauge(view, [self._info])
        rewrites = [(k, c.value) for k, c in list(self._rewrites.items())]
        for view in _V_REWRITE:
            yield _counter(view, rewrites)
        sizes = list(self._prefix_size.items())
        for view in _V_PREFIX_SIZE:
            yield _gauge(view, sizes)
        for view in _V_HIT_RATIO:
            yield _histogram(view, _HIT_RATIO, list(self._hit_ratio.items()))
        for view in _V_HIT_BYTES:
            yield _histogram(view, _HIT_BYTES, list(self._hit_bytes.items()))

        yield _counter(_PLUGIN_ERRORS, [(k, c.value) for k, c in list(self._plugin_errors.items())])
        yield _counter(_OUT_OF_RANGE, [(k, c.value) for k, c in list(self._out_of_range.items())])

        # Fed only by features that record into them: no family until then.
        for table, views in (
            (self._poll_errors, _V_POLL_ERRORS),
            (self._extract_errors, _V_EXTRACT_ERRORS),
            (self._disagg, _V_DISAGG),
            (self._pd, _V_PD),
        ):
            cells = [(k, c.value) for k, c in list(table.items())]
            if cells:
                for view in views:
                    yield _counter(view, cells)
        no_match = [(k, c.value) for k, c in list(self._rollout_no_match.items())]
        if no_match:
            yield _counter(_ROLLOUT_NO_MATCH, no_match)
        shares = [((*k, rev), v) for k, table in list(self._rollout_shares.items()) for rev, v in table.items()]
        if shares:
            yield _gauge(_ROLLOUT_SHARE, shares)
        for hist_table, hist_view, buckets in (
            (self._ttft, _V_TTFT, _TTFT),
            (self._streaming_tpot, _V_STREAMING_TPOT, _STREAMING_TPOT),
            (self._itl, _V_ITL, _ITL),
        ):
            hists = list(hist_table.items())
            if hists:
                yield _histogram(hist_view, buckets, hists)
        for child, view, buckets in (
            (self._req_processing, _V_REQ_PROCESSING, _REQ_PROCESSING),
            (self._resp_processing, _V_RESP_PROCESSING, _RESP_PROCESSING),
        ):
            if sum(child.counts):
                yield _histogram(view, buckets, [((), child)])


if TYPE_CHECKING:  # mypy proves PrometheusRecorder satisfies Recorder; nothing runs at import
    _check: Recorder = PrometheusRecorder(CollectorRegistry())


class MetricsServer:
    """`/metrics` (text exposition of `registry`) on host:port from a daemon thread; port 0 picks a free
    port, read it back from `.port`. `stop()` shuts the server down and joins the thread."""

    def __init__(self, registry: CollectorRegistry, host: str = "0.0.0.0", port: int = 9090) -> None:
        self._registry = registry
        self._host = host
        self._requested_port = port
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> MetricsServer:
        if self._server is None:
            self._server, self._thread = start_http_server(
                self._requested_port, addr=self._host, registry=self._registry
            )
        return self

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("MetricsServer is not started")
        return int(self._server.server_address[1])

    def stop(self) -> None:
        server, thread = self._server, self._thread
        self._server = self._thread = None
        if server is not None:
            server.shutdown()
            server.server_close()
        if thread is not None:
            thread.join(timeout=5)

    def __enter__(self) -> MetricsServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
