"""SLO-aware routing end to end: Envoy, `llm-epp serve` and two stub model servers of different speed.

The predictor is trained only through real requests: first, requests without an SLO are spread at random
over both endpoints (no predictions exist yet, so the tier filter keeps both), and the producer learns
each endpoint's time to first token from the response headers, with the endpoints' scraped metrics as
features. Then requests carrying a TTFT SLO go only to the endpoint predicted to meet it, while requests
without an SLO still spread."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import httpx
import pytest

from llm_epp.sim.stub import BackendPool
from tests.envoy.test_routing_intelligence import Gateway, _scraped

pytestmark = pytest.mark.envoy

SLO_CONFIG = """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: predicted-latency-producer
- type: slo-headroom-tier-filter
  parameters: {epsilonExploreNeg: 0}
- type: random-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: slo-headroom-tier-filter
  - pluginRef: random-picker
"""


SCORER_CONFIG = """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: predicted-latency-scorer
  parameters: {streamingMode: false, epsilonExploreNeg: 0, epsilonExploreSticky: 0}
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: predicted-latency-scorer
  - pluginRef: max-score-picker
"""


def test_slo_requests_are_steered_away_from_the_endpoint_predicted_to_miss(tmp_path: Path) -> None:
    free = _steer(tmp_path, SLO_CONFIG, stream=False)
    assert free["slow"] > 0 and free["fast"] > 0  # without an SLO nothing is predicted to miss: no steering


def test_the_single_plugin_scorer_learns_from_streamed_responses_and_steers(tmp_path: Path) -> None:
    """predicted-latency-scorer alone, trained on streamed responses (TTFT timed at the first body chunk by
    the director, TPOT from the usage chunk)."""
    # warm-up: without an SLO the scorer favours the endpoint predicted fastest, with an SLO both meet it
    # favours the least headroom (the slow one): alternating, both keep being observed
    free = _steer(tmp_path, SCORER_CONFIG, stream=True, warm=(None, {"x-llm-d-slo-ttft-ms": "100000"}))
    # without an SLO every endpoint misses it; the smallest predicted TTFT deficit is weighted 83 to 2
    assert free["fast"] >= 15


def _steer(tmp_path: Path, config: str, stream: bool, warm: Sequence[dict[str, str] | None] = (None,)) -> Counter[str]:
    """Trains the predictor on 40 requests spread over a fast and a slow endpoint, then checks that 30 SLO
    requests (new and old header) all go to the fast one; returns where 20 requests without an SLO went."""
    body: dict[str, object] = {"stream": True, "stream_options": {"include_usage": True}} if stream else {}
    with BackendPool(2, names=["fast", "slow"]) as pool:
        fast, slow = pool.by_name["fast"], pool.by_name["slow"]
        fast.ttft_s, fast.kv_cache_usage, fast.running = 0.01, 0.1, 1
        slow.ttft_s, slow.kv_cache_usage, slow.running = 0.25, 0.9, 12
        gw = Gateway(pool, tmp_path, config)
        try:
            deadline = time.monotonic() + 20
            while not all(has for has, _, _ in _scraped(gw).values()):
                assert time.monotonic() < deadline, "the endpoints' metrics were never scraped"
                time.sleep(0.05)
            with httpx.Client(timeout=30) as c:
                warmup = Counter(
                    gw.post(c, f"training prompt {i}", warm[i % len(warm)], **body).headers["x-backend-name"]
                    for i in range(40)
                )
                time.sleep(2.5)  # the trainer refits at most 1 s after its last sample
                slo = {"x-llm-d-slo-ttft-ms": "150"}
                steered = [gw.post(c, f"slo prompt {i}", slo, **body).headers["x-backend-name"] for i in range(20)]
                old_header = [
                    gw.post(c, f"old {i}", {"x-slo-ttft-ms": "150"}, **body).headers["x-backend-name"]
                    for i in range(10)
                ]
                free = Counter(
                    gw.post(c, f"free prompt {i}", None, **body).headers["x-backend-name"] for i in range(20)
                )
        finally:
            gw.stop()
    assert warmup["fast"] >= 10 and warmup["slow"] >= 10  # both endpoints were seen by the predictor
    assert steered == ["fast"] * 20
    assert old_header == ["fast"] * 10
    return free
