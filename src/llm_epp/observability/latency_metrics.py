"""The latency-prediction metric families of the reference EPP (GIE v1.5.0 `pkg/epp/metrics`), recorded
by `predicted-latency-producer` through the `LatencyRecorder` protocol:

- `inference_objective_request_ttft_seconds`, `..._request_predicted_ttft_seconds` (general latency
  buckets), `..._request_tpot_seconds`, `..._request_predicted_tpot_seconds` (TPOT buckets),
  `..._request_ttft_prediction_duration_seconds`, `..._request_tpot_prediction_duration_seconds`
  (prediction-duration buckets): histograms labelled model_name, target_model_name;
- `inference_objective_request_slo_violation_total{model_name, target_model_name, type}`;
- `inference_objective_inference_request_metric{model_name, target_model_name, type}`: the last value of
  each (type = ttft, tpot, predicted_ttft, predicted_tpot, ttft_prediction_duration,
  tpot_prediction_duration, ttft_slo_violation, tpot_slo_violation; violations are 1 or 0).

llm-d-router's twins, labelled plugin_name, plugin_type, model_name, target_model_name (the recording
plugin first): `llm_d_epp_request_predicted_ttft_seconds`, `llm_d_epp_request_predicted_tpot_seconds`,
`llm_d_epp_request_ttft_prediction_duration_seconds`, `llm_d_epp_request_tpot_prediction_duration_seconds`
(same buckets), `llm_d_epp_request_slo_violation_total{..., type}` and `llm_d_epp_inference_request_metric{...,
type}`. Observed TTFT/TPOT have no `llm_d_epp_` histogram here (the router's are the request-level
`llm_d_epp_request_ttft_seconds` family); their last values are in the gauge, as upstream.

Model labels go through the owner's bounding function (known models shown, others `other`), so the
number of series is bounded. Written from the event loop only; a scrape reads copies."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable
from itertools import accumulate

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from llm_epp.framework.latency import LatencyKind, SloKind
from llm_epp.framework.plugin import TypedName

GENERAL_LATENCY_BUCKETS = (
    0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.25, 1.5, 2, 3, 4, 5, 6, 8, 10, 15, 20, 30, 45,
    60, 120, 180, 240, 300, 360, 480, 600, 900, 1200, 1800, 2700, 3600,
)  # fmt: skip
TPOT_BUCKETS = (
    0.0005, 0.00205, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.125, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1,
    1.5, 2, 3, 4.5, 6, 12, 18, 24, 30, 36, 48, 60, 90, 120, 180, 270, 360,
)  # fmt: skip
PREDICTION_DURATION_BUCKETS = (0.0001, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5)

_HISTOGRAMS: dict[str, tuple[str, tuple[float, ...], str]] = {
    "ttft": (
        "inference_objective_request_ttft_seconds",
        GENERAL_LATENCY_BUCKETS,
        "[ALPHA] Observed time to first token.",
    ),
    "predicted_ttft": (
        "inference_objective_request_predicted_ttft_seconds",
        GENERAL_LATENCY_BUCKETS,
        "[ALPHA] Predicted time to first token of the chosen endpoint.",
    ),
    "tpot": (
        "inference_objective_request_tpot_seconds",
        TPOT_BUCKETS,
        "[ALPHA] Observed average time per output token.",
    ),
    "predicted_tpot": (
        "inference_objective_request_predicted_tpot_seconds",
        TPOT_BUCKETS,
        "[ALPHA] Predicted time per output token of the chosen endpoint.",
    ),
    "ttft_prediction_duration": (
        "inference_objective_request_ttft_prediction_duration_seconds",
        PREDICTION_DURATION_BUCKETS,
        "[ALPHA] Time spent predicting TTFT for the candidates.",
    ),
    "tpot_prediction_duration": (
        "inference_objective_request_tpot_prediction_duration_seconds",
        PREDICTION_DURATION_BUCKETS,
        "[ALPHA] Time spent predicting TPOT for the candidates.",
    ),
}
_LABELS = ["model_name", "target_model_name"]
_ROUTER_LABELS = ["plugin_name", "plugin_type", "model_name", "target_model_name"]
_ROUTER_PREFIX = "llm_d_epp_"
_ROUTER_HISTOGRAMS = frozenset(
    {"predicted_ttft", "predicted_tpot", "ttft_prediction_duration", "tpot_prediction_duration"}
)


def _router_name(gie_name: str) -> str:
    return _ROUTER_PREFIX + gie_name.removeprefix("inference_objective_")


def _le(bound: float) -> str:
    return "+Inf" if bound == float("inf") else f"{bound:g}"


class _Hist:
    __slots__ = ("buckets", "counts", "total")

    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.buckets, value)] += 1
        self.total += value


class LatencyMetrics:
    """A collector of the families above; implements `LatencyRecorder`. `model_label` bounds model names."""

    def __init__(self, model_label: Callable[[str], str] = lambda m: m) -> None:
        self._label = model_label
        self._hists: dict[tuple[str, str, str], _Hist] = {}
        self._violations: dict[tuple[str, str, str], int] = {}
        self._gauges: dict[tuple[str, str, str], float] = {}
        # llm-d-router twins: (plugin name, plugin type, model, target model, kind)
        self._r_hists: dict[tuple[str, str, str, str, str], _Hist] = {}
        self._r_violations: dict[tuple[str, str, str, str, str], int] = {}
        self._r_gauges: dict[tuple[str, str, str, str, str], float] = {}

    def latency_observed(
        self, model: str, target_model: str, kind: LatencyKind, seconds: float, plugin: TypedName | None = None
    ) -> None:
        if kind not in _HISTOGRAMS or not seconds >= 0:
            return
        key = (self._label(model), self._label(target_model), kind)
        hist = self._hists.get(key)
        if hist is None:
            hist = self._hists[key] = _Hist(_HISTOGRAMS[kind][1])
        hist.observe(seconds)
        self._gauges[key] = seconds
        rkey = (plugin.name if plugin else "", plugin.type if plugin else "", *key)
        if kind in _ROUTER_HISTOGRAMS:
            rhist = self._r_hists.get(rkey)
            if rhist is None:
                rhist = self._r_hists[rkey] = _Hist(_HISTOGRAMS[kind][1])
            rhist.observe(seconds)
        self._r_gauges[rkey] = seconds

    def latency_slo_checked(
        self, model: str, target_model: str, kind: SloKind, violated: bool, plugin: TypedName | None = None
    ) -> None:
        m, t = self._label(model), self._label(target_model)
        pn, pt = (plugin.name, plugin.type) if plugin else ("", "")
        self._gauges[(m, t, f"{kind}_slo_violation")] = 1.0 if violated else 0.0
        self._r_gauges[(pn, pt, m, t, f"{kind}_slo_violation")] = 1.0 if violated else 0.0
        if violated:
            self._violations[(m, t, kind)] = self._violations.get((m, t, kind), 0) + 1
            self._r_violations[(pn, pt, m, t, kind)] = self._r_violations.get((pn, pt, m, t, kind), 0) + 1

    def collect(self) -> Iterable[Metric]:
        out: list[Metric] = []
        hists = list(self._hists.items())
        for kind, (name, buckets, doc) in _HISTOGRAMS.items():
            family = HistogramMetricFamily(name, doc, labels=_LABELS)
            for (m, t, k), h in hists:
                if k != kind:
                    continue
                cumulative = list(accumulate(h.counts))
                pairs = [(_le(b), float(c)) for b, c in zip((*buckets, float("inf")), cumulative, strict=True)]
                family.add_metric([m, t], pairs, h.total)
            if family.samples:  # as the Go client: a vector without children is not exported
                out.append(family)
        violations = CounterMetricFamily(
            "inference_objective_request_slo_violation",
            "[ALPHA] Requests whose observed TTFT or TPOT exceeded their SLO.",
            labels=[*_LABELS, "type"],
        )
        for (m, t, k), n in list(self._violations.items()):
            violations.add_metric([m, t, k], float(n))
        if violations.samples:
            out.append(violations)
        gauge = GaugeMetricFamily(
            "inference_objective_inference_request_metric",
            "[ALPHA] Last observed or predicted latency value (seconds) or SLO violation (1/0), by type.",
            labels=[*_LABELS, "type"],
        )
        for (m, t, k), v in list(self._gauges.items()):
            gauge.add_metric([m, t, k], v)
        if gauge.samples:
            out.append(gauge)
        out.extend(self._collect_router())
        return out

    def _collect_router(self) -> list[Metric]:
        out: list[Metric] = []
        hists = list(self._r_hists.items())
        for kind, (name, buckets, doc) in _HISTOGRAMS.items():
            if kind not in _ROUTER_HISTOGRAMS:
                continue
            family = HistogramMetricFamily(_router_name(name), doc, labels=_ROUTER_LABELS)
            for (pn, pt, m, t, k), h in hists:
                if k != kind:
                    continue
                cumulative = list(accumulate(h.counts))
                pairs = [(_le(b), float(c)) for b, c in zip((*buckets, float("inf")), cumulative, strict=True)]
                family.add_metric([pn, pt, m, t], pairs, h.total)
            if family.samples:
                out.append(family)
        violations = CounterMetricFamily(
            _ROUTER_PREFIX + "request_slo_violation",
            "[ALPHA] Requests whose observed TTFT or TPOT exceeded their SLO.",
            labels=[*_ROUTER_LABELS, "type"],
        )
        for (pn, pt, m, t, k), n in list(self._r_violations.items()):
            violations.add_metric([pn, pt, m, t, k], float(n))
        if violations.samples:
            out.append(violations)
        gauge = GaugeMetricFamily(
            _ROUTER_PREFIX + "inference_request_metric",
            "[ALPHA] Last observed or predicted latency value (seconds) or SLO violation (1/0), by type.",
            labels=[*_ROUTER_LABELS, "type"],
        )
        for (pn, pt, m, t, k), v in list(self._r_gauges.items()):
            gauge.add_metric([pn, pt, m, t, k], v)
        if gauge.samples:
            out.append(gauge)
        return out
