"""latency-slo-admitter: sheddable requests predicted to miss their SLO everywhere are refused; idle or
cold endpoints, critical requests, requests without an SLO and an untrained predictor admit."""

from __future__ import annotations

from llm_epp.framework import CycleState
from llm_epp.plugins.requestcontrol.latency_slo_admitter import LatencySloAdmitter
from llm_epp.plugins.requestcontrol.predicted_latency_producer import LATENCY_PREDICTIONS_KEY, LatencyPredictionInfo
from tests.unit.builders import endpoint, key, request

SLO = {"x-llm-d-slo-ttft-ms": "200"}


def cycle_with(**valid: bool) -> CycleState:
    cycle = CycleState()
    cycle.write(
        LATENCY_PREDICTIONS_KEY,
        {key(n): LatencyPredictionInfo(100, 10, v, True, 100 if v else -100, 0) for n, v in valid.items()},
    )
    return cycle


BUSY = [endpoint("a", kv=0.5, running=3), endpoint("b", kv=0.6, running=4)]


async def test_sheddable_request_predicted_to_miss_is_refused() -> None:
    reason = await LatencySloAdmitter().admit(cycle_with(a=False, b=False), request(headers=SLO, priority=-1), BUSY)
    assert reason is not None and "SLO" in reason


async def test_admitted_when_one_endpoint_meets_it_or_is_idle_or_cold() -> None:
    a = LatencySloAdmitter()
    assert await a.admit(cycle_with(a=False, b=True), request(headers=SLO, priority=-1), BUSY) is None
    idle = [BUSY[0], endpoint("b", kv=0.6, running=0)]
    assert await a.admit(cycle_with(a=False, b=False), request(headers=SLO, priority=-1), idle) is None
    cold = [BUSY[0], endpoint("b", kv=0.01, running=2)]
    assert await a.admit(cycle_with(a=False, b=False), request(headers=SLO, priority=-1), cold) is None


async def test_critical_no_slo_or_no_predictions_always_admit() -> None:
    a = LatencySloAdmitter()
    miss = cycle_with(a=False, b=False)
    assert await a.admit(miss, request(headers=SLO, priority=0), BUSY) is None
    assert await a.admit(miss, request(priority=-1), BUSY) is None
    assert await a.admit(CycleState(), request(headers=SLO, priority=-1), BUSY) is None
    old = {"x-slo-tpot-ms": "5"}
    assert await a.admit(miss, request(headers=old, priority=-1), BUSY) is not None
