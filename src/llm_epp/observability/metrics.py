"""Prometheus metrics with the reference EPP's names, labels and buckets; implements `Recorder`.

Every `PrometheusRecorder` owns its `CollectorRegistry` (never the global one). Labelled children are
cached in plain dicts keyed by the label values, so a hot-path call costs one dict lookup plus the
observations, not prometheus_client's `.labels()` validation. Histograms are `_Histogram`, a lock-free
collector (a bisect and two adds per observation, ~6x cheaper than `prometheus_client.Histogram`, which
takes a lock per increment) that writes `le` exactly as the Go client does (`le="1"`, not `le="1.0"`).
It assumes a single writer thread, the event loop; the scrape thread only reads.

`MetricsServer` serves `/metrics` from a daemon thread: the one documented exception to "no threads"."""

from __future__ import annotations

import os
import threading
from bisect import bisect_left
from collections.abc import Iterable, Mapping
from itertools import accumulate
from typing import TYPE_CHECKING
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.metrics import disable_created_metrics
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

import llm_epp
from llm_epp.framework.plugin import TypedName
from llm_epp.framework.recorder import Recorder

# --- buckets (pkg/epp/metrics/metrics.go) ------------------------------------------------------------
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

_ALPHA = "[ALPHA] "  # the reference's HelpMsgWithStability prefix
_MODEL = ("model_name", "target_model_name")
_PLUGIN = ("extension_point", "plugin_type", "plugin_name")


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


class _Histogram(Collector):
    """A histogram family: `labels(...)` returns a child whose `observe` is a bisect and two adds."""

    def __init__(
        self,
        name: str,
        doc: str,
        labelnames: tuple[str, ...],
        buckets: Iterable[float],
        registry: CollectorRegistry,
    ) -> None:
        self.name, self._doc, self._labelnames = name, doc, labelnames
        self._bounds = tuple(sorted(float(b) for b in buckets))
        self._le = tuple(_go_float(b) for b in self._bounds)
        self._children: dict[tuple[str, ...], _HistogramChild] = {}
        registry.register(self)

    def labels(self, *values: str) -> _HistogramChild:
        if len(values) != len(self._labelnames):
            raise ValueError(f"{self.name}: expected labels {self._labelnames}, got {values}")
        child = self._children.get(values)
        if child is None:
            child = self._children.setdefault(values, _HistogramChild(self._bounds))
        return child

    def describe(self) -> Iterable[Metric]:
        yield HistogramMetricFamily(self.name, self._doc, labels=self._labelnames)

    def collect(self) -> Iterable[Metric]:
        fam = HistogramMetricFamily(self.name, self._doc, labels=self._labelnames)
        for values, child in list(self._children.items()):
            cumulative = list(accumulate(list(child.counts)))  # copy first: the loop thread keeps writing
            buckets = [*zip(self._le, cumulative[:-1], strict=True), ("+Inf", cumulative[-1])]
            fam.add_metric(values, buckets, child.sum)
        yield fam


class _PerPodQueueCollector(Collector):
    """`inference_pool_per_pod_queue_size{name,model_server_pod}`: the last snapshot per pool, so pods
    that left the pool disappear at the next refresh (the reference uses a custom collector too)."""

    def __init__(self) -> None:
        self._pools: dict[str, tuple[tuple[str, float], ...]] = {}

    def set(self, pool: str, per_pod: Mapping[str, float]) -> None:
        self._pools[pool] = tuple(per_pod.items())  # atomic swap; the scrape thread reads a whole tuple

    def collect(self) -> Iterable[Metric]:
        fam = GaugeMetricFamily(
            "inference_pool_per_pod_queue_size",
            _ALPHA + "The total number of requests pending in the model server queue for each underlying pod.",
            labels=("name", "model_server_pod"),
        )
        for pool, pods in list(self._pools.items()):
            for pod, value in pods:
                fam.add_metric((pool, pod), value)
        yield fam


class PrometheusRecorder:
    """The Prometheus `Recorder`. `created_series=False` (default) turns off prometheus_client's
    `*_created` samples, which the Go reference does not export; that switch is process-wide."""

    def __init__(self, registry: CollectorRegistry | None = None, *, created_series: bool = False) -> None:
        if not created_series:
            disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = reg = registry if registry is not None else CollectorRegistry(auto_describe=True)

        def hist(name: str, doc: str, labels: tuple[str, ...], buckets: Iterable[float]) -> _Histogram:
            return _Histogram(name, doc, labels, buckets, reg)

        # inference_objective_*
        self._request_total = Counter(
            "inference_objective_request_total",
            _ALPHA + "Counter of inference objective requests broken out for each model and target model.",
            (*_MODEL, "priority"),
            registry=reg,
        )
        self._request_error_total = Counter(
            "inference_objective_request_error_total",
            _ALPHA + "Counter of inference objective requests errors broken out for each model and target model.",
            (*_MODEL, "error_code"),
            registry=reg,
        )
        self._duration = hist(
            "inference_objective_request_duration_seconds",
            _ALPHA + "Inference objective response latency distribution in seconds for each model and target model.",
            _MODEL,
            GENERAL_LATENCY_BUCKETS,
        )
        self._request_sizes = hist(
            "inference_objective_request_sizes",
            _ALPHA + "Inference objective requests size distribution in bytes for each model and target model.",
            _MODEL,
            REQUEST_SIZE_BUCKETS,
        )
        self._response_sizes = hist(
            "inference_objective_response_sizes",
            _ALPHA + "Inference objective responses size distribution in bytes for each model and target model.",
            _MODEL,
            RESPONSE_SIZE_BUCKETS,
        )
        self._input_tokens = hist(
            "inference_objective_input_tokens",
            _ALPHA + "Inference objective input token count distribution for requests in each model.",
            _MODEL,
            TOKEN_BUCKETS,
        )
        self._output_tokens = hist(
            "inference_objective_output_tokens",
            _ALPHA + "Inference objective output token count distribution for requests in each model.",
            _MODEL,
            OUTPUT_TOKEN_BUCKETS,
        )
        self._cached_tokens = hist(
            "inference_objective_prompt_cached_tokens",
            _ALPHA + "Inference objective prompt cached token count distribution for requests in each model.",
            _MODEL,
            TOKEN_BUCKETS,
        )
        self._ntpot = hist(
            "inference_objective_normalized_time_per_output_token_seconds",
            _ALPHA + "Inference objective latency divided by number of output tokens in seconds for each model and "
            "target model.",
            _MODEL,
            NTPOT_BUCKETS,
        )
        self._disagg_decisions = Counter(
            "llm_d_epp_disagg_decision_total",
            _ALPHA + "Total number of disaggregation routing decisions made",
            ("plugin_name", "plugin_type", "model_name", "decision_type"),
            registry=reg,
        )
        self._pd_decisions = Counter(
            "llm_d_epp_pd_decision_total",
            _ALPHA + "Total number of P/D disaggregation decisions made",
            ("plugin_name", "plugin_type", "model_name", "decision_type"),
            registry=reg,
        )
        self._running = Gauge(
            "inference_objective_running_requests",
            _ALPHA + "Inference objective number of running requests in each model.",
            ("model_name",),
            registry=reg,
        )
        # inference_pool_*
        self._pool_kv = Gauge(
            "inference_pool_average_kv_cache_utilization",
            _ALPHA + "The average kv cache utilization for an inference server pool.",
            ("name",),
            registry=reg,
        )
        self._pool_queue = Gauge(
            "inference_pool_average_queue_size",
            _ALPHA + "The average number of requests pending in the model server queue.",
            ("name",),
            registry=reg,
        )
        self._pool_running = Gauge(
            "inference_pool_average_running_requests",
            _ALPHA + "The average number of running requests across model servers in the pool.",
            ("name",),
            registry=reg,
        )
        self._pool_ready = Gauge(
            "inference_pool_ready_pods",
            _ALPHA + "The number of ready pods in the inference server pool.",
            ("name",),
            registry=reg,
        )
        self._per_pod_queue = _PerPodQueueCollector()
        reg.register(self._per_pod_queue)
        # inference_extension_*
        self._scheduler_e2e = hist(
            "inference_extension_scheduler_e2e_duration_seconds",
            _ALPHA + "End-to-end scheduling latency distribution in seconds.",
            (),
            SCHEDULER_BUCKETS,
        )
        self._attempts = Counter(
            "inference_extension_scheduler_attempts_total",
            _ALPHA + "Total number of scheduling attempts.",
            ("status", "target_model_name", "pod_name", "namespace", "port"),
            registry=reg,
        )
        self._plugin_duration = hist(
            "inference_extension_plugin_duration_seconds",
            _ALPHA + "Plugin processing latency distribution in seconds for each extension point, plugin type and "
            "plugin name.",
            _PLUGIN,
            SCHEDULER_BUCKETS,
        )
        self._prefix_size = Gauge(
            "inference_extension_prefix_indexer_size",
            _ALPHA + "Size of the prefix indexer.",
            registry=reg,
        )
        self._prefix_hit_ratio = hist(
            "inference_extension_prefix_indexer_hit_ratio",
            _ALPHA + "Ratio of prefix length matched to total prefix length in the cache lookup.",
            (),
            tuple(i / 10 for i in range(11)),
        )
        self._prefix_hit_bytes = hist(
            "inference_extension_prefix_indexer_hit_bytes",
            _ALPHA + "Length of the prefix match in number of bytes in the cache lookup.",
            (),
            (0, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536),
        )
        self._rewrites = Counter(
            "inference_extension_model_rewrite_decisions_total",
            _ALPHA + "Total number of model rewrite decisions.",
            ("model_rewrite_name", "model_name", "target_model"),
            registry=reg,
        )
        info = Gauge(
            "inference_extension_info",
            _ALPHA + "General information of the current build of Inference Extension.",
            ("commit", "build_ref"),
            registry=reg,
        )
        info.labels(os.environ.get("LLM_EPP_COMMIT") or "unknown", llm_epp.__version__).set(1)
        # llm_epp_* (beyond the reference)
        self._plugin_errors = Counter(
            "llm_epp_plugin_errors_total",
            "Plugin calls that raised; the plugin's contribution was skipped.",
            _PLUGIN,
            registry=reg,
        )
        self._scores_out_of_range = Counter(
            "llm_epp_scores_out_of_range_total",
            "Scores outside [0, 1] returned by a scorer (clamped before weighting).",
            ("plugin_type", "plugin_name"),
            registry=reg,
        )

        # Child caches: label values -> child (or tuple of children).
        self._c_plugin_duration: dict[tuple[str, str, str], _HistogramChild] = {}
        self._c_plugin_errors: dict[tuple[str, str, str], Counter] = {}
        self._c_out_of_range: dict[tuple[str, str], Counter] = {}
        self._c_attempts: dict[tuple[bool, str, str, str, str], Counter] = {}
        self._c_request_total: dict[tuple[str, str, int], Counter] = {}
        self._c_request_error: dict[tuple[str, str, str], Counter] = {}
        self._c_running: dict[str, Gauge] = {}
        self._c_completed: dict[tuple[str, str], tuple[_HistogramChild, ...]] = {}
        self._scheduler_observe = self._scheduler_e2e.labels().observe

    # --- scheduling core ---------------------------------------------------------------------------
    def plugin_duration(self, extension_point: str, plugin: TypedName, seconds: float) -> None:
        key = (extension_point, plugin.type, plugin.name)  # str tuple: cached hashes, no dataclass __hash__
        child = self._c_plugin_duration.get(key)
        if child is None:
            child = self._c_plugin_duration[key] = self._plugin_duration.labels(*key)
        child.observe(seconds)

    def plugin_error(self, extension_point: str, plugin: TypedName) -> None:
        key = (extension_point, plugin.type, plugin.name)
        child = self._c_plugin_errors.get(key)
        if child is None:
            child = self._c_plugin_errors[key] = self._plugin_errors.labels(*key)
        child.inc()

    def scheduler_duration(self, seconds: float) -> None:
        self._scheduler_observe(seconds)

    def score_out_of_range(self, plugin: TypedName) -> None:
        key = (plugin.type, plugin.name)
        child = self._c_out_of_range.get(key)
        if child is None:
            child = self._c_out_of_range[key] = self._scores_out_of_range.labels(*key)
        child.inc()

    # --- per request -------------------------------------------------------------------------------
    def scheduler_attempt(self, success: bool, target_model: str, pod_name: str, namespace: str, port: str) -> None:
        key = (success, target_model, pod_name, namespace, port)
        child = self._c_attempts.get(key)
        if child is None:
            status = "success" if success else "failure"
            child = self._c_attempts[key] = self._attempts.labels(status, target_model, pod_name, namespace, port)
        child.inc()

    def prefix_index_size(self, entries: int) -> None:
        self._prefix_size.set(entries)

    def prefix_match(self, hit_ratio: float, hit_chars: int) -> None:
        self._prefix_hit_ratio.labels().observe(hit_ratio)
        self._prefix_hit_bytes.labels().observe(hit_chars)

    def model_rewrite(self, rule: str, model: str, target_model: str) -> None:
        self._rewrites.labels(rule, model, target_model).inc()

    def disagg_decision(self, plugin: TypedName, model: str, decision_type: str) -> None:
        self._disagg_decisions.labels(plugin.name, plugin.type, model or "unknown", decision_type).inc()

    def pd_decision(self, plugin: TypedName, model: str, decision_type: str) -> None:
        self._pd_decisions.labels(plugin.name, plugin.type, model or "unknown", decision_type).inc()

    def request_scheduled(self, model: str, target_model: str, priority: int) -> None:
        key = (model, target_model, priority)
        child = self._c_request_total.get(key)
        if child is None:
            child = self._c_request_total[key] = self._request_total.labels(model, target_model, str(priority))
        child.inc()

    def request_error(self, model: str, target_model: str, error_code: str) -> None:
        if not error_code:  # as the reference: an empty code is not counted
            return
        key = (model, target_model, error_code)
        child = self._c_request_error.get(key)
        if child is None:
            child = self._c_request_error[key] = self._request_error_total.labels(model, target_model, error_code)
        child.inc()

    def running_requests(self, model: str, delta: int) -> None:
        if not model:  # as the reference: no series for an empty model name
            return
        child = self._c_running.get(model)
        if child is None:
            child = self._c_running[model] = self._running.labels(model)
        child.inc(delta)

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
        key = (model, target_model)
        children = self._c_completed.get(key)
        if children is None:
            children = self._c_completed[key] = tuple(
                h.labels(model, target_model)
                for h in (
                    self._duration,
                    self._request_sizes,
                    self._response_sizes,
                    self._input_tokens,
                    self._output_tokens,
                    self._cached_tokens,
                    self._ntpot,
                )
            )
        duration, req_sizes, resp_sizes, input_tokens, output_tokens, cached, ntpot = children
        if duration_s > 0:  # the reference drops non-positive latencies (complete must be after received)
            duration.observe(duration_s)
        req_sizes.observe(request_bytes)
        resp_sizes.observe(response_bytes)
        # Token counts follow the reference: input/output only when > 0, cached whenever reported.
        if prompt_tokens is not None and prompt_tokens > 0:
            input_tokens.observe(prompt_tokens)
        if completion_tokens is not None and completion_tokens > 0:
            output_tokens.observe(completion_tokens)
            if duration_s > 0:
                ntpot.observe(duration_s / completion_tokens)
        if cached_tokens is not None:
            cached.observe(cached_tokens)

    # --- pool gauges (the data layer calls this every --refresh-prometheus-metrics-interval) -------
    def set_pool_gauges(
        self,
        pool_name: str,
        avg_kv: float,
        avg_queue: float,
        avg_running: float,
        ready_pods: int,
        per_pod_queue: Mapping[str, float],
    ) -> None:
        self._pool_kv.labels(pool_name).set(avg_kv)
        self._pool_queue.labels(pool_name).set(avg_queue)
        self._pool_running.labels(pool_name).set(avg_running)
        self._pool_ready.labels(pool_name).set(ready_pods)
        self._per_pod_queue.set(pool_name, per_pod_queue)


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
