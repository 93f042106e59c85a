"""latency-slo-admitter

Scheduling intent:
    Shed sheddable requests that no endpoint is predicted to serve within their SLO. A request with
    priority < 0 that carries a TTFT or TPOT SLO header is refused (503, as every admission refusal) when
    predictions exist and no candidate is predicted to meet the SLOs, none is idle (no running requests)
    and none is cold (KV-cache utilization below 2%). Requests with priority >= 0, requests without an
    SLO and requests routed before the predictor has learned anything are always admitted.

Inputs consumed:
    `latency-prediction-info` (so the default `predicted-latency-producer` is added when none is
    configured), endpoint metrics (running requests, KV-cache utilization), the request priority and
    the SLO headers `x-llm-d-slo-ttft-ms` / `x-llm-d-slo-tpot-ms` (or the older `x-slo-ttft-ms` /
    `x-slo-tpot-ms`).

Configuration:
    None (the reference has no parameters either).
"""

from __future__ import annotations

from collections.abc import Sequence

from llm_epp.framework import CycleState, Endpoint, Handle, InferenceRequest, PluginParams, TypedName
from llm_epp.plugins.requestcontrol.predicted_latency_producer import (
    LATENCY_PREDICTIONS_KEY,
    OLD_TPOT_SLO_HEADER,
    OLD_TTFT_SLO_HEADER,
    TPOT_SLO_HEADER,
    TTFT_SLO_HEADER,
    slo_ms,
)

TYPE = "latency-slo-admitter"
COLD_KV_CACHE = 0.02


class Params(PluginParams):
    pass


class LatencySloAdmitter:
    consumes = frozenset({LATENCY_PREDICTIONS_KEY.name})

    def __init__(self, name: str = TYPE) -> None:
        self._typed_name = TypedName(TYPE, name)

    @property
    def typed_name(self) -> TypedName:
        return self._typed_name

    async def admit(self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> str | None:
        if request.priority >= 0:
            return None
        headers = request.headers
        if (
            slo_ms(headers, TTFT_SLO_HEADER, OLD_TTFT_SLO_HEADER) <= 0
            and slo_ms(headers, TPOT_SLO_HEADER, OLD_TPOT_SLO_HEADER) <= 0
        ):
            return None
        infos = cycle.read(LATENCY_PREDICTIONS_KEY)
        if not infos:
            return None
        for ep in endpoints:
            info = infos.get(ep.key)
            if (
                (info is not None and info.valid)
                or ep.metrics.running_requests == 0
                or ep.metrics.kv_cache_usage < COLD_KV_CACHE
            ):
                return None
        return "no endpoint is predicted to meet the request's latency SLO (sheddable request shed)"


def factory(name: str, params: Params, handle: Handle) -> LatencySloAdmitter:
    return LatencySloAdmitter(name)
