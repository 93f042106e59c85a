"""Flow-control metric families, under GIE's names (`inference_extension_flow_control_*`) and
llm-d-router's (`llm_d_epp_flow_control_*`), each observation written to both.

Label values that come from clients (fairness id, model names) are bounded: the first
`MAX_LABEL_VALUES` distinct values of each label keep their own series, later ones share the value
`other`. Priorities come from InferenceObjectives (the operator's), the pool name from the flags."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from llm_epp.flowcontrol import QueueOutcome
from llm_epp.framework.types import InferenceRequest

MAX_LABEL_VALUES = 100
OTHER = "other"
GIE_PREFIX = "inference_extension_"
ROUTER_PREFIX = "llm_d_epp_"

QUEUE_DURATION_BUCKETS = (
    0.0001,
    0.0005,
    0.001,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)
CONFIRMATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
SHORT_BUCKETS = (0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1)
_MODEL = ("model_name", "target_model_name")


class BoundedLabel:
    """Maps client-chosen values to at most `limit` distinct label values plus `other`."""

    def __init__(self, limit: int = MAX_LABEL_VALUES) -> None:
        self._limit = limit
        self._seen: set[str] = set()

    def __call__(self, value: str) -> str:
        if value in self._seen:
            return value
        if len(self._seen) < self._limit:
            self._seen.add(value)
            return value
        return OTHER


class FlowControlMetrics:
    """The controller's observer: records queue durations, enqueue durations, queue sizes and bytes,
    dispatch-cycle durations and the pool saturation; with eviction on, llm-d-router's revocation
    families (`llm_d_epp_flow_control_revocation*`, `..._reclaim_target`, `..._pending_reclaim`)."""

    def __init__(self, registry: CollectorRegistry, pool: str = "", max_label_values: int = MAX_LABEL_VALUES) -> None:
        self.pool = pool
        self._fairness = BoundedLabel(max_label_values)
        self._model = BoundedLabel(max_label_values)
        self._queue_duration: list[Histogram] = []
        self._enqueue_duration: list[Histogram] = []
        self._cycle_duration: list[Histogram] = []
        self._size: list[Gauge] = []
        self._bytes: list[Gauge] = []
        self._saturation_gie: Gauge
        self._saturation_router: Gauge
        for prefix in (GIE_PREFIX, ROUTER_PREFIX):
            self._queue_duration.append(
                Histogram(
                    f"{prefix}flow_control_request_queue_duration_seconds",
                    "Time requests spend in flow control, from enqueue to their final outcome.",
                    ("fairness_id", "priority", "outcome", "inference_pool", *_MODEL),
                    buckets=QUEUE_DURATION_BUCKETS,
                    registry=registry,
                )
            )
            self._cycle_duration.append(
                Histogram(
                    f"{prefix}flow_control_dispatch_cycle_duration_seconds",
                    "Time each dispatch cycle of flow control takes.",
                    (),
                    buckets=SHORT_BUCKETS,
                    registry=registry,
                )
            )
            self._enqueue_duration.append(
                Histogram(
                    f"{prefix}flow_control_request_enqueue_duration_seconds",
                    "Time taken to enqueue a request into flow control.",
                    ("fairness_id", "priority", "outcome"),
                    buckets=SHORT_BUCKETS,
                    registry=registry,
                )
            )
            self._size.append(
                Gauge(
                    f"{prefix}flow_control_queue_size",
                    "Requests waiting in flow control.",
                    ("fairness_id", "priority", "inference_pool", *_MODEL),
                    registry=registry,
                )
            )
            self._bytes.append(
                Gauge(
                    f"{prefix}flow_control_queue_bytes",
                    "Bytes of the requests waiting in flow control.",
                    ("fairness_id", "priority", "inference_pool", *_MODEL),
                    registry=registry,
                )
            )
        self._saturation_gie = Gauge(
            f"{GIE_PREFIX}flow_control_pool_saturation",
            "Saturation of the inference pool as flow control sees it (0 = idle, 1 = saturated).",
            ("inference_pool",),
            registry=registry,
        )
        self._saturation_router = Gauge(
            f"{ROUTER_PREFIX}flow_control_pool_saturation",
            "Pool saturation gating flow-control dispatch; stage 'effective' is the value used.",
            ("inference_pool", "stage"),
            registry=registry,
        )
        self._revocations_issued = Counter(
            f"{ROUTER_PREFIX}flow_control_revocations_issued",
            "In-flight evictions issued, by the priority of the band they free capacity for.",
            ("priority", "inference_pool"),
            registry=registry,
        )
        self._revocations = Counter(
            f"{ROUTER_PREFIX}flow_control_revocations",
            "In-flight evictions by how they ended (confirmed: the request ended; timed_out).",
            ("outcome", "inference_pool"),
            registry=registry,
        )
        self._reclaim_target = Gauge(
            f"{ROUTER_PREFIX}flow_control_reclaim_target",
            "The last eviction deficit (saturation minus the blocked band's ceiling).",
            ("inference_pool",),
            registry=registry,
        )
        self._pending_reclaim = Gauge(
            f"{ROUTER_PREFIX}flow_control_pending_reclaim",
            "Saturation expected back from evictions not yet visible in the signal.",
            ("inference_pool",),
            registry=registry,
        )
        self._confirmation = Histogram(
            f"{ROUTER_PREFIX}flow_control_revocation_confirmation_seconds",
            "Time from an eviction to the end of the evicted request.",
            ("inference_pool",),
            buckets=CONFIRMATION_BUCKETS,
            registry=registry,
        )

    def _flow(self, request: InferenceRequest) -> tuple[str, str]:
        return self._fairness(request.fairness_id), str(request.priority)

    def _models(self, request: InferenceRequest) -> tuple[str, str]:
        return self._model(request.incoming_model), self._model(request.target_model)

    def enqueued(self, request: InferenceRequest, outcome: QueueOutcome | None, duration: float) -> None:
        fid, prio = self._flow(request)
        label = outcome.value if outcome is not None else "NotYetFinalized"
        for h in self._enqueue_duration:
            h.labels(fid, prio, label).observe(duration)

    def queue_changed(self, request: InferenceRequest, count: int, size_bytes: int) -> None:
        fid, prio = self._flow(request)
        model, target = self._models(request)
        for g in self._size:
            g.labels(fid, prio, self.pool, model, target).inc(count)
        for g in self._bytes:
            g.labels(fid, prio, self.pool, model, target).inc(count * size_bytes)

    def finished(self, request: InferenceRequest, outcome: QueueOutcome, waited: float) -> None:
        fid, prio = self._flow(request)
        model, target = self._models(request)
        for h in self._queue_duration:
            h.labels(fid, prio, outcome.value, self.pool, model, target).observe(waited)

    def dispatch_cycle(self, duration: float) -> None:
        for h in self._cycle_duration:
            h.observe(duration)

    def pool_saturation(self, saturation: float) -> None:
        self._saturation_gie.labels(self.pool).set(saturation)
        self._saturation_router.labels(self.pool, "effective").set(saturation)

    def revocations_issued(self, priority: int, n: int) -> None:
        self._revocations_issued.labels(str(priority), self.pool).inc(n)

    def revocation_ended(self, outcome: str, duration: float | None) -> None:
        self._revocations.labels(outcome, self.pool).inc()
        if duration is not None:
            self._confirmation.labels(self.pool).observe(duration)

    def reclaim_target(self, value: float) -> None:
        self._reclaim_target.labels(self.pool).set(value)

    def pending_reclaim(self, value: float) -> None:
        self._pending_reclaim.labels(self.pool).set(value)
