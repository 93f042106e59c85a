"""predicted-latency-producer: SLO headers, per-endpoint predictions and headroom, training from observed
TTFT/TPOT through the request lifecycle, and the parameters."""

from __future__ import annotations

import asyncio
import random

import pytest
from pydantic import ValidationError

from llm_epp.config.loader import load_config_text
from llm_epp.framework import ApiKind, CycleState, NullRecorder, ProfileResult, SchedulingResult
from llm_epp.framework.requestcontrol import ResponseInfo, Usage
from llm_epp.latency import Features, LatencyPredictor, PredictorSettings
from llm_epp.plugins import builtin_registry
from llm_epp.plugins.requestcontrol.predicted_latency_producer import (
    LATENCY_PREDICTIONS_KEY,
    Params,
    PredictedLatencyProducer,
    factory,
    slo_ms,
)
from tests.unit.builders import FakeHandle, endpoint, key, request


class Seeded(LatencyPredictor):
    """A predictor with a fixed answer per KV utilization, to test the plugin's arithmetic."""

    def __init__(self) -> None:
        super().__init__(PredictorSettings())

    def predict(self, features: Features):  # type: ignore[no-untyped-def]
        from llm_epp.latency import Prediction

        return Prediction(
            ttft_ms=1000 * features.kv_cache, tpot_ms=100 * features.kv_cache, ttft_trained=True, tpot_trained=True
        )


def result(name: str) -> SchedulingResult:
    return SchedulingResult({"default": ProfileResult((endpoint(name),))}, "default")


def test_slo_headers_new_names_win_over_the_old_ones() -> None:
    assert slo_ms({"x-llm-d-slo-ttft-ms": "200", "x-slo-ttft-ms": "900"}, "x-llm-d-slo-ttft-ms", "x-slo-ttft-ms") == 200
    assert slo_ms({"x-slo-ttft-ms": "900"}, "x-llm-d-slo-ttft-ms", "x-slo-ttft-ms") == 900
    for bad in ("abc", "-5", "nan", "inf", ""):
        assert slo_ms({"x-llm-d-slo-ttft-ms": bad}, "x-llm-d-slo-ttft-ms", "x-slo-ttft-ms") == 0


async def test_publishes_headroom_against_the_slos() -> None:
    p = PredictedLatencyProducer(params=Params(streamingMode=True), predictor=Seeded())
    eps = [endpoint("fast", kv=0.1), endpoint("slow", kv=0.5)]
    cycle = CycleState()
    req = request(headers={"x-llm-d-slo-ttft-ms": "300", "x-llm-d-slo-tpot-ms": "20"})
    await p.prepare_data(cycle, req, eps)
    infos = cycle.read(LATENCY_PREDICTIONS_KEY)
    assert infos is not None
    fast, slow = infos[key("fast")], infos[key("slow")]
    assert fast.ttft == pytest.approx(100) and fast.ttft_headroom == pytest.approx(200) and fast.valid
    assert slow.ttft_headroom == pytest.approx(-200) and not slow.ttft_valid
    assert slow.tpot_headroom == pytest.approx(-30) and not slow.tpot_valid


async def test_without_streaming_mode_tpot_is_not_checked() -> None:
    p = PredictedLatencyProducer(params=Params(), predictor=Seeded())
    cycle = CycleState()
    await p.prepare_data(
        cycle, request(headers={"x-slo-ttft-ms": "900", "x-slo-tpot-ms": "1"}), [endpoint("a", kv=0.5)]
    )
    info = (cycle.read(LATENCY_PREDICTIONS_KEY) or {})[key("a")]
    assert info.tpot_valid and info.tpot_headroom == 0 and info.valid


async def test_prefill_role_endpoints_skip_the_tpot_check() -> None:
    p = PredictedLatencyProducer(
        params=Params(streamingMode=True, endpointRoleLabel="llm-d.ai/role"), predictor=Seeded()
    )
    eps = [
        endpoint("p", kv=0.5, labels={"llm-d.ai/role": "prefill"}),
        endpoint("d", kv=0.5, labels={"llm-d.ai/role": "decode"}),
    ]
    cycle = CycleState()
    await p.prepare_data(cycle, request(headers={"x-slo-ttft-ms": "900", "x-slo-tpot-ms": "1"}), eps)
    infos = cycle.read(LATENCY_PREDICTIONS_KEY) or {}
    assert infos[key("p")].tpot_valid and not infos[key("d")].tpot_valid


async def test_buffer_factor_and_running_requests_tighten_the_tpot_slo() -> None:
    p = PredictedLatencyProducer(params=Params(streamingMode=True, sloBufferFactor=2.0), predictor=Seeded())
    eps = [endpoint("a", kv=0.3)]  # predicted TPOT 30 ms
    cycle = CycleState()
    await p.prepare_data(cycle, request(headers={"x-slo-tpot-ms": "20"}), eps)
    assert (cycle.read(LATENCY_PREDICTIONS_KEY) or {})[key("a")].tpot_headroom == pytest.approx(10)  # 40 - 30
    # a request already running on "a" with a 10 ms TPOT SLO bounds the next one's to 2 x 10 = 20
    first = CycleState()
    strict = request(request_id="strict", headers={"x-slo-tpot-ms": "10"})
    await p.prepare_data(first, strict, eps)
    p.pre_request(first, strict, result("a"))
    assert p.running_tpot_slos(key("a")) == {"strict": 10.0}
    second = CycleState()
    await p.prepare_data(second, request(request_id="next", headers={"x-slo-tpot-ms": "20"}), eps)
    assert (second.read(LATENCY_PREDICTIONS_KEY) or {})[key("a")].tpot_headroom == pytest.approx(-10)
    p.response_complete(first, strict, ResponseInfo(status=200, complete=True), None)
    p.response_complete(first, strict, ResponseInfo(status=200, complete=True), None)  # idempotent
    assert p.running_tpot_slos(key("a")) == {}


async def test_predict_in_prepare_data_false_trains_but_publishes_nothing() -> None:
    p = PredictedLatencyProducer(params=Params(predictInPrepareData=False), predictor=Seeded())
    cycle = CycleState()
    await p.prepare_data(cycle, request(), [endpoint("a")])
    assert cycle.read(LATENCY_PREDICTIONS_KEY) is None


async def test_untrained_predictor_publishes_nothing() -> None:
    p = PredictedLatencyProducer()
    cycle = CycleState()
    await p.prepare_data(cycle, request(headers={"x-slo-ttft-ms": "100"}), [endpoint("a"), endpoint("b")])
    assert cycle.read(LATENCY_PREDICTIONS_KEY) is None
    p.close()


async def test_learns_from_the_requests_it_routes() -> None:
    """Through the hooks only: two endpoints, one three times slower to first token; after some routed
    requests the predictions tell them apart."""
    handle = FakeHandle()
    predictor = LatencyPredictor(PredictorSettings(min_samples=5, min_interval_s=0.01))
    p = PredictedLatencyProducer(params=Params(streamingMode=True), handle=handle, predictor=predictor)
    eps = [endpoint("fast", kv=0.1, running=1), endpoint("slow", kv=0.8, running=12)]
    rnd = random.Random(2)
    for i in range(60):
        target = eps[i % 2]
        cycle = CycleState()
        req = request(request_id=f"r{i}", stream=True, payload={"model": "m", "prompt": "x" * rnd.randint(100, 4000)})
        await p.prepare_data(cycle, req, eps)
        p.pre_request(cycle, req, SchedulingResult({"default": ProfileResult((target,))}, "default"))
        slow = target.key.name == "slow"
        handle.clock += 0.3 if slow else 0.1
        p.response_received(cycle, req, ResponseInfo(status=200, streaming=True), target)
        handle.clock += 11 * (0.05 if slow else 0.02)
        p.response_complete(
            cycle, req, ResponseInfo(status=200, streaming=True, complete=True, usage=Usage(10, 12, 22)), target
        )
    assert await asyncio.to_thread(predictor.wait_fitted, 10.0)
    assert predictor.trained
    cycle = CycleState()
    await p.prepare_data(cycle, request(payload={"model": "m", "prompt": "x" * 2000}), eps)
    infos = cycle.read(LATENCY_PREDICTIONS_KEY) or {}
    fast, slow = infos[key("fast")], infos[key("slow")]
    assert 200 < slow.ttft < 400 and 50 < fast.ttft < 150
    assert slow.tpot > 40 and fast.tpot < 30
    p.close()


async def test_errors_and_late_requests_do_not_train() -> None:
    handle = FakeHandle()
    p = PredictedLatencyProducer(params=Params(streamingMode=True, contextTTL="1s"), handle=handle)
    eps = [endpoint("a")]
    cycle = CycleState()
    req = request()
    await p.prepare_data(cycle, req, eps)
    p.pre_request(cycle, req, result("a"))
    handle.clock += 0.1
    p.response_received(cycle, req, ResponseInfo(status=503), eps[0])
    cycle2 = CycleState()
    await p.prepare_data(cycle2, req, eps)
    p.pre_request(cycle2, req, result("a"))
    handle.clock += 2.0  # beyond contextTTL
    p.response_received(cycle2, req, ResponseInfo(status=200, streaming=True), eps[0])
    p.response_complete(
        cycle2, req, ResponseInfo(status=200, streaming=True, complete=True, usage=Usage(1, 5, 6)), eps[0]
    )
    assert p.predictor._offered == 0 and p.predictor.version == 0  # nothing observed, nothing fitted
    p.close()


def test_the_predictor_refits_on_the_handles_clock() -> None:
    """Virtual in the simulator, so refits happen at fixed virtual instants; with the scorer's factory too."""
    from llm_epp.plugins.scheduling import predicted_latency_scorer

    handle = FakeHandle()
    producer = factory("p", Params(), handle)
    scorer = predicted_latency_scorer.factory("s", predicted_latency_scorer.Params(), handle)
    default = PredictedLatencyProducer(handle=handle)
    handle.clock = 42.5
    assert producer.predictor.clock() == scorer.predictor.clock() == default.predictor.clock() == 42.5
    for plugin in (producer, scorer, default):
        plugin.close()


def test_parameters() -> None:
    assert Params.model_validate({"contextTTL": "2m"}).context_ttl == 120
    for bad, msg in (
        ({"samplingMean": 50}, "not supported yet"),
        ({"maxDecodeTokenSamplesForPrediction": 3}, "not supported yet"),
        ({"samplingMean": 0}, "samplingMean must be > 0"),
        ({"sloBufferFactor": 0}, "greater than 0"),
        ({"contextTTL": "soon"}, "duration"),
        ({"streamingModes": True}, "Extra inputs"),
    ):
        with pytest.raises(ValidationError, match=msg):
            Params.model_validate(bad)


def test_a_latency_scorer_alone_gets_the_default_producer() -> None:
    loaded = load_config_text(
        """
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: latency-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: latency-scorer
  - pluginRef: max-score-picker
""",
        builtin_registry(),
        NullRecorder(),
    )
    kinds = [type(p).__name__ for p in loaded.prepare_data]
    assert "PredictedLatencyProducer" in kinds
    assert kinds.index("ApproxPrefixCacheProducer") < kinds.index("PredictedLatencyProducer")
    assert [type(p).__name__ for p in loaded.response_complete] == ["PredictedLatencyProducer"]
    assert [type(p).__name__ for p in loaded.response_first_body] == ["PredictedLatencyProducer"]


class Recording(LatencyPredictor):
    def __init__(self) -> None:
        super().__init__(PredictorSettings())
        self.ttft: list[float] = []
        self.tpot: list[float] = []

    def observe_ttft(self, features: Features, ttft_ms: float) -> None:
        self.ttft.append(round(ttft_ms, 6))

    def observe_tpot(self, features: Features, tpot_ms: float) -> None:
        self.tpot.append(round(tpot_ms, 6))


async def _streamed(first_body_at: float | None) -> Recording:
    handle = FakeHandle()
    rec = Recording()
    p = PredictedLatencyProducer(params=Params(streamingMode=True), handle=handle, predictor=rec)
    cycle, req = CycleState(), request(stream=True)
    await p.prepare_data(cycle, req, [endpoint("a")])
    p.pre_request(cycle, req, result("a"))
    handle.clock = 0.05  # headers
    p.response_received(cycle, req, ResponseInfo(status=200, streaming=True), None)
    assert rec.ttft == []  # a streamed response's headers may precede its first token: wait for the body
    handle.clock = 1.25  # end: 11 tokens
    done = ResponseInfo(200, streaming=True, complete=True, usage=Usage(3, 11, 14), first_body_at=first_body_at)
    p.response_complete(cycle, req, done, None)
    return rec


async def test_streamed_ttft_is_measured_to_the_first_body_bytes_when_known() -> None:
    rec = await _streamed(first_body_at=0.25)
    assert rec.ttft == [250.0] and rec.tpot == [100.0]  # (1.25 - 0.25) / 10
    rec = await _streamed(first_body_at=None)
    assert rec.ttft == [50.0] and rec.tpot == [120.0]  # headers time stands in for the first token


async def test_non_streamed_ttft_is_the_headers_time() -> None:
    handle = FakeHandle()
    rec = Recording()
    p = PredictedLatencyProducer(params=Params(streamingMode=True), handle=handle, predictor=rec)
    cycle, req = CycleState(), request()
    await p.prepare_data(cycle, req, [endpoint("a")])
    p.pre_request(cycle, req, result("a"))
    handle.clock = 0.4
    p.response_received(cycle, req, ResponseInfo(status=200), None)
    p.response_complete(cycle, req, ResponseInfo(200, complete=True, usage=Usage(3, 11, 14)), None)
    assert rec.ttft == [400.0] and rec.tpot == []  # no per-token timing without a stream


async def test_prefill_tokens_in_flight_count_until_the_prefill_is_over() -> None:
    """Uncached prompt tokens dispatched to an endpoint are a feature of the next requests there until the
    prefill is over: a streamed response's first body bytes (its headers come on admission, before the
    prefill), a non-streamed response's headers; released once, and at the end if neither came."""
    rec = Recording()
    p = PredictedLatencyProducer(params=Params(), handle=FakeHandle(), predictor=rec)
    eps = [endpoint("a")]
    cycle, req = (
        CycleState(),
        request(request_id="r1", api=ApiKind.COMPLETIONS, payload={"model": "m", "prompt": "x" * 4000}),
    )
    await p.prepare_data(cycle, req, eps)
    p.pre_request(cycle, req, result("a"))
    assert p.prefill_tokens(key("a")) == 1000  # 4000 bytes / 4, nothing cached
    second, req2 = (
        CycleState(),
        request(request_id="r2", api=ApiKind.COMPLETIONS, payload={"model": "m", "prompt": "y" * 400}),
    )
    assert p.features(second, req2, eps)[key("a")].prefill_tokens == 1000
    await p.prepare_data(second, req2, eps)
    p.pre_request(second, req2, result("a"))
    assert p.prefill_tokens(key("a")) == 1100
    p.response_received(cycle, req, ResponseInfo(status=200, streaming=True), eps[0])
    assert p.prefill_tokens(key("a")) == 1100, "a streamed response's headers do not end its prefill"
    p.response_first_body(cycle, req, ResponseInfo(status=200, streaming=True, first_body_at=1.0), eps[0])
    assert p.prefill_tokens(key("a")) == 100
    p.response_complete(cycle, req, ResponseInfo(status=200, complete=True), eps[0])
    assert p.prefill_tokens(key("a")) == 100  # released once
    p.response_complete(second, req2, ResponseInfo(status=0, complete=False), eps[0])  # cancelled before a token
    assert p.prefill_tokens(key("a")) == 0
    third, req3 = (
        CycleState(),
        request(request_id="r3", api=ApiKind.COMPLETIONS, payload={"model": "m", "prompt": "z" * 800}),
    )
    await p.prepare_data(third, req3, eps)
    p.pre_request(third, req3, result("a"))
    p.response_received(third, req3, ResponseInfo(status=200, streaming=False), eps[0])
    assert p.prefill_tokens(key("a")) == 0, "a non-streamed response's headers come with the whole answer"
