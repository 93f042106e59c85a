"""The latency-predictor metric families: reference names, labels, buckets, SLO violations, bounded
model labels, and the producer recording through a real PrometheusRecorder."""

from __future__ import annotations

import random

from prometheus_client import generate_latest

from llm_epp.framework import CycleState, ProfileResult, SchedulingResult
from llm_epp.framework.latency import LatencyRecorder
from llm_epp.framework.requestcontrol import ResponseInfo, Usage
from llm_epp.latency import Features, LatencyPredictor, Prediction, PredictorSettings
from llm_epp.observability.metrics import PrometheusRecorder
from llm_epp.plugins.requestcontrol.predicted_latency_producer import Params, PredictedLatencyProducer
from llm_epp.plugins.scheduling.predicted_latency_scorer import Params as ScorerParams
from llm_epp.plugins.scheduling.predicted_latency_scorer import PredictedLatencyScorer
from tests.unit.builders import endpoint, request


class Fixed(LatencyPredictor):
    def __init__(self) -> None:
        super().__init__(PredictorSettings())

    def predict(self, features: Features) -> Prediction:
        return Prediction(250.0, 12.0, True, True)


def test_nothing_is_exported_before_a_latency_is_recorded() -> None:
    text = generate_latest(PrometheusRecorder().registry).decode()
    assert "inference_objective_request_ttft_seconds" not in text


async def test_producer_records_observed_predicted_and_violations() -> None:
    rec = PrometheusRecorder(known_models=frozenset({"m"}))
    assert isinstance(rec, LatencyRecorder)

    class Handle:
        recorder = rec
        clock = 0.0

        def now(self) -> float:
            return self.clock

    handle = Handle()
    p = PredictedLatencyProducer(params=Params(streamingMode=True), handle=handle, predictor=Fixed())  # type: ignore[arg-type]
    cycle = CycleState()
    req = request(model="m", headers={"x-llm-d-slo-ttft-ms": "100", "x-llm-d-slo-tpot-ms": "50"}, stream=True)
    await p.prepare_data(cycle, req, [endpoint("a")])
    p.pre_request(cycle, req, SchedulingResult({"default": ProfileResult((endpoint("a"),))}, "default"))
    handle.clock = 0.3  # TTFT 300 ms > 100 ms SLO
    p.response_received(cycle, req, ResponseInfo(status=200, streaming=True), None)
    handle.clock = 0.5  # 10 more tokens in 200 ms: TPOT 20 ms < 50 ms
    p.response_complete(cycle, req, ResponseInfo(200, streaming=True, complete=True, usage=Usage(5, 11, 16)), None)
    text = generate_latest(rec.registry).decode()
    assert 'inference_objective_request_ttft_seconds_bucket{le="0.4",model_name="m",target_model_name="m"} 1.0' in text
    assert 'inference_objective_request_ttft_seconds_bucket{le="0.2",model_name="m",target_model_name="m"} 0.0' in text
    assert 'inference_objective_request_predicted_ttft_seconds_sum{model_name="m",target_model_name="m"} 0.25' in text
    assert (
        'inference_objective_request_tpot_seconds_bucket{le="0.00205",model_name="m",target_model_name="m"} 0.0' in text
    )
    assert 'inference_objective_request_predicted_tpot_seconds_count{model_name="m",target_model_name="m"} 1.0' in text
    assert "inference_objective_request_ttft_prediction_duration_seconds_count" in text
    assert (
        'inference_objective_request_slo_violation_total{model_name="m",target_model_name="m",type="ttft"} 1.0' in text
    )
    assert 'type="tpot"} 1.0' not in text.split("slo_violation_total")[1].split("#")[0]
    gauge = 'inference_objective_inference_request_metric{model_name="m",target_model_name="m",type='
    assert gauge + '"ttft_slo_violation"} 1.0' in text
    assert gauge + '"tpot_slo_violation"} 0.0' in text
    assert "# HELP inference_objective_request_ttft_seconds [ALPHA]" in text


def test_unknown_models_share_one_label() -> None:
    rec = PrometheusRecorder(known_models=frozenset({"m"}))
    for i in range(50):
        rec.latency_observed(f"client-model-{i}", "m", "ttft", 0.1)
    text = generate_latest(rec.registry).decode()
    assert text.count("inference_objective_request_ttft_seconds_count{") == 1
    assert 'model_name="other"' in text


async def test_llm_d_twins_carry_the_recording_plugin() -> None:
    """llm-d-router's `llm_d_epp_*` names, labelled plugin_name/plugin_type first; the single-plugin scorer
    records under its own type."""
    rec = PrometheusRecorder(known_models=frozenset({"m"}))

    class Handle:
        recorder = rec
        clock = 0.0

        def now(self) -> float:
            return self.clock

        def rng(self, name: str) -> random.Random:
            return random.Random(name)

    handle = Handle()
    scorer = PredictedLatencyScorer("slo", ScorerParams(), handle, Fixed())  # type: ignore[arg-type]
    cycle = CycleState()
    req = request(model="m", headers={"x-llm-d-slo-ttft-ms": "100", "x-llm-d-slo-tpot-ms": "50"}, stream=True)
    await scorer.prepare_data(cycle, req, [endpoint("a")])
    scorer.pre_request(cycle, req, SchedulingResult({"default": ProfileResult((endpoint("a"),))}, "default"))
    handle.clock = 0.3
    scorer.response_received(cycle, req, ResponseInfo(status=200, streaming=True), None)
    handle.clock = 0.5
    done = ResponseInfo(200, streaming=True, complete=True, usage=Usage(5, 11, 16), first_body_at=0.3)
    scorer.response_complete(cycle, req, done, None)
    text = generate_latest(rec.registry).decode()
    labels = 'model_name="m",plugin_name="slo",plugin_type="predicted-latency-scorer",target_model_name="m"'
    assert f"llm_d_epp_request_predicted_ttft_seconds_sum{{{labels}}} 0.25" in text
    assert f"llm_d_epp_request_predicted_tpot_seconds_count{{{labels}}} 1.0" in text
    assert f"llm_d_epp_request_ttft_prediction_duration_seconds_count{{{labels}}} 1.0" in text
    assert f"llm_d_epp_request_tpot_prediction_duration_seconds_count{{{labels}}} 1.0" in text
    assert f'llm_d_epp_request_slo_violation_total{{{labels},type="ttft"}} 1.0' in text
    assert f'llm_d_epp_inference_request_metric{{{labels},type="ttft"}} 0.3' in text
    assert f'llm_d_epp_inference_request_metric{{{labels},type="tpot_slo_violation"}} 0.0' in text
    # observed TTFT/TPOT keep their GIE histograms only (llm-d's request TTFT family is request-level)
    assert "llm_d_epp_request_ttft_seconds_bucket{plugin_name" not in text
    assert 'inference_objective_request_ttft_seconds_count{model_name="m",target_model_name="m"} 1.0' in text
    scorer.close()
