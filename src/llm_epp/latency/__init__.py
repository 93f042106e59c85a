"""Online prediction of time to first token (TTFT) and time per output token (TPOT) per endpoint.

`LatencyPredictor` turns what the EPP knows when it schedules (endpoint metrics, prompt length, prefix-cache
match, its own in-flight load) into predicted TTFT and TPOT, and learns from the latencies it observes on
the requests it routes. The event loop collects samples and reads the current (immutable) models; refits
run in the loop's default executor, timed by the request path's clock."""

from llm_epp.latency.features import Features
from llm_epp.latency.model import RidgeModel, fit_ridge
from llm_epp.latency.predictor import LatencyPredictor, Prediction, PredictorSettings

__all__ = ["Features", "LatencyPredictor", "Prediction", "PredictorSettings", "RidgeModel", "fit_ridge"]
