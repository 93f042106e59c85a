"""An optional recorder extension for latency-prediction plugins. A `Recorder` that also implements
`LatencyRecorder` gets the observed and predicted TTFT/TPOT of requests routed with predictions (the
reference's `inference_objective_request_*ttft*` / `*tpot*` families); plugins check with `isinstance`
and record nothing otherwise. `plugin` names the recording plugin (llm-d-router's `llm_d_epp_*` twins carry
it as `plugin_name` / `plugin_type`)."""

from __future__ import annotations

from typing import Literal, Protocol, runtime_checkable

from llm_epp.framework.plugin import TypedName

LatencyKind = Literal[
    "ttft", "predicted_ttft", "tpot", "predicted_tpot", "ttft_prediction_duration", "tpot_prediction_duration"
]
SloKind = Literal["ttft", "tpot"]


@runtime_checkable
class LatencyRecorder(Protocol):
    def latency_observed(
        self, model: str, target_model: str, kind: LatencyKind, seconds: float, plugin: TypedName | None = None
    ) -> None: ...

    def latency_slo_checked(
        self, model: str, target_model: str, kind: SloKind, violated: bool, plugin: TypedName | None = None
    ) -> None: ...
