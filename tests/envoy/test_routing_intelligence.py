"""Routing decisions that depend on plugins, end to end through a real Envoy."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import yaml

from llm_epp.api.v1 import picker_pb2
from llm_epp.gateway.envoy_config import EnvoyConfigOptions, build_bootstrap
from llm_epp.gateway.envoy_process import EnvoyProcess
from llm_epp.gateway.epp_process import EppProcess
from llm_epp.sim.stub import BackendPool
from tests.support.pickapi import PickApiAccess

pytestmark = pytest.mark.envoy


class Gateway:
    def __init__(
        self,
        backends: BackendPool,
        tmp: Path,
        config: str,
        labels: list[dict[str, str]] | None = None,
        extra_args: tuple[str, ...] = (),
    ) -> None:
        endpoints = [
            {"name": b.name, "address": "127.0.0.1", "port": b.port, "labels": (labels or [{}] * len(backends))[i]}
            for i, b in enumerate(backends)
        ]
        pool = tmp / "pool.yaml"
        pool.write_text(yaml.safe_dump({"endpoints": endpoints}))
        cfg = tmp / "epp.yaml"
        cfg.write_text(config)
        self.pick_api = PickApiAccess(tmp)
        self.epp = EppProcess(
            "--endpoints-file",
            str(pool),
            "--config-file",
            str(cfg),
            "--secure-serving=false",
            *self.pick_api.args,
            *extra_args,
        ).start()
        opts = EnvoyConfigOptions(
            listen_port=0, admin_port=0, epp_port=self.epp.grpc_port, epp_tls=False, failure_mode="FailClose"
        )
        try:
            self.envoy = EnvoyProcess(build_bootstrap(opts)).start()
        except Exception:
            self.epp.stop()
            raise

    def post(
        self, client: httpx.Client, prompt: str, headers: dict[str, str] | None = None, **body: object
    ) -> httpx.Response:
        payload = {"model": "stub-model", "prompt": prompt, "max_tokens": 2, **body}
        return client.post(self.envoy.url("/v1/completions"), json=payload, headers=headers or {})

    def stop(self) -> None:
        self.envoy.stop()
        self.epp.stop()


@pytest.fixture
def backends() -> Iterator[BackendPool]:
    with BackendPool(3, names=["a", "b", "c"]) as pool:
        yield pool


COST_CONFIG = """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: cost-aware-scorer
  parameters: {labelKey: example.com/cost}
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - {pluginRef: queue-scorer, weight: 1}
  - {pluginRef: cost-aware-scorer, weight: 5}
  - {pluginRef: max-score-picker}
"""


@pytest.mark.parametrize("with_plugin", [True, False], ids=["configured", "control"])
def test_the_example_python_plugin_changes_the_routing(
    backends: BackendPool, tmp_path: Path, with_plugin: bool
) -> None:
    labels = [{"example.com/cost": "4"}, {"example.com/cost": "1"}, {"example.com/cost": "3"}]
    config = COST_CONFIG if with_plugin else COST_CONFIG.replace("weight: 5", "weight: 0")
    gw = Gateway(backends, tmp_path, config, labels)
    try:
        with httpx.Client(timeout=30) as c:
            served = [gw.post(c, f"question {i}").headers["x-backend-name"] for i in range(20)]
    finally:
        gw.stop()
    if with_plugin:
        assert served == ["b"] * 20  # the cheapest endpoint wins every tie on queue depth
    else:
        assert len(set(served)) > 1  # without it, ties are broken at random


SHED_CONFIG = """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: max-score-picker
- name: capacity
  type: concurrency-detector
  parameters: {concurrencyMode: requests, maxConcurrency: 1}
schedulingProfiles:
- name: default
  plugins:
  - {pluginRef: queue-scorer}
  - {pluginRef: max-score-picker}
saturationDetector: {pluginRef: capacity}
"""

OBJECTIVES = """\
objectives:
- {name: batch, priority: -1}
- {name: interactive, priority: 0}
"""


def test_sheddable_requests_get_429_while_the_pool_is_saturated(tmp_path: Path) -> None:
    objectives = tmp_path / "objectives.yaml"
    objectives.write_text(OBJECTIVES)
    with BackendPool(2, names=["a", "b"], ttft_s=3.0) as pool:
        gw = Gateway(pool, tmp_path, SHED_CONFIG, extra_args=("--objectives-file", str(objectives)))
        batch = {"x-gateway-inference-objective": "batch"}
        interactive = {"x-gateway-inference-objective": "interactive"}
        try:
            with httpx.Client(timeout=30) as c:
                assert gw.post(c, "idle pool", batch).status_code == 200  # nothing in flight: admitted
            # two slow requests fill both endpoints (capacity 1 each): the pool is saturated
            with ThreadPoolExecutor(2) as ex:
                held = [ex.submit(_post_once, gw, f"hold {i}", interactive) for i in range(2)]
                gw.epp.wait_metric("inference_objective_running_requests", 2)
                with httpx.Client(timeout=30) as c:
                    shed = gw.post(c, "sheddable", batch)
                    kept = gw.post(c, "priority zero", interactive)
                assert [f.result() for f in held] == [200, 200]
        finally:
            gw.stop()
    assert shed.status_code == 429
    assert "sheddable" in shed.json()["error"]["message"]
    assert kept.status_code == 200


def _post_once(gw: Gateway, prompt: str, headers: dict[str, str]) -> int:
    with httpx.Client(timeout=30) as c:
        return gw.post(c, prompt, headers).status_code


DEFAULT_CONFIG_FILE = "# the reference default: queue 2, kv-cache 2, prefix 3\n"


def test_shared_prefixes_concentrate_and_distinct_prefixes_spread(backends: BackendPool, tmp_path: Path) -> None:
    system = "You are a meticulous assistant for a travel agency. " * 120  # ~6,000 characters
    assert len(system) >= 6000
    gw = Gateway(backends, tmp_path, DEFAULT_CONFIG_FILE)
    try:
        with httpx.Client(timeout=30) as c:
            shared = [gw.post(c, f"{system}Question {i}: where next?").headers["x-backend-name"] for i in range(40)]
            backends.reset()
            distinct = [
                gw.post(c, f"{i} " * 40 + f"unrelated prompt number {i} " * 100).headers["x-backend-name"]
                for i in range(40)
            ]
    finally:
        gw.stop()
    assert shared.count(shared[0]) == 40  # every follow-up goes where its prefix is cached
    assert len(set(distinct)) == 3  # without a shared prefix, ties spread over the pool


LORA_CONFIG = """\
plugins:
- type: queue-scorer
- type: lora-affinity-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - {pluginRef: queue-scorer, weight: 1}
  - {pluginRef: lora-affinity-scorer, weight: 2}
  - {pluginRef: max-score-picker}
"""


def _wait_for_scraped_adapters(gw: Gateway, expected: dict[str, list[str]]) -> None:
    """Polls the EPP's ListEndpoints until every endpoint's scraped LoRA adapters are as expected."""
    with gw.pick_api.channel() as channel:
        stub = gw.pick_api.stub(channel)
        deadline = time.monotonic() + 20
        while True:
            seen = {
                e.name: list(e.metrics.active_lora_adapters)
                for e in stub.ListEndpoints(picker_pb2.ListEndpointsRequest()).endpoints
                if e.has_metrics
            }
            if seen == expected:
                return
            assert time.monotonic() < deadline, f"metrics never showed the adapters: {seen}"
            time.sleep(0.05)


def test_lora_requests_prefer_the_endpoint_with_the_adapter_loaded(backends: BackendPool, tmp_path: Path) -> None:
    backends[0].lora_adapters = ["other-lora"]
    backends[1].lora_adapters = ["sql-lora"]
    backends[2].lora_adapters = ["a", "b", "c", "d"]  # full: max_loras 4
    gw = Gateway(backends, tmp_path, LORA_CONFIG)
    try:
        _wait_for_scraped_adapters(gw, {"a": ["other-lora"], "b": ["sql-lora"], "c": ["a", "b", "c", "d"]})
        with httpx.Client(timeout=30) as c:
            sql = [gw.post(c, f"q{i}", model="sql-lora").headers["x-backend-name"] for i in range(20)]
            new = [gw.post(c, f"q{i}", model="new-lora").headers["x-backend-name"] for i in range(20)]
    finally:
        gw.stop()
    assert sql == ["b"] * 20
    assert "c" not in new  # an endpoint with no free adapter slot is avoided for an adapter it lacks
    assert set(new) == {"a", "b"}


STALE_AWARE_CONFIG = """\
plugins:
- type: queue-scorer
- type: utilization-detector
  parameters: {queueDepthThreshold: 50, metricsStalenessThreshold: 500ms}
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - {pluginRef: utilization-detector}
  - {pluginRef: queue-scorer}
  - {pluginRef: max-score-picker}
"""


def _scraped(gw: Gateway) -> dict[str, tuple[bool, float, int]]:
    with gw.pick_api.channel() as channel:
        stub = gw.pick_api.stub(channel)
        reply = stub.ListEndpoints(picker_pb2.ListEndpointsRequest())
    return {e.name: (e.has_metrics, e.metrics_age_seconds, e.metrics.waiting_queue_size) for e in reply.endpoints}


def test_scraped_queue_depths_steer_traffic_and_failing_metrics_go_stale(backends: BackendPool, tmp_path: Path) -> None:
    for backend, queue in zip(backends, (0, 5, 20), strict=True):
        backend.queue = queue
    gw = Gateway(backends, tmp_path, STALE_AWARE_CONFIG)
    try:
        deadline = time.monotonic() + 20
        while {name: q for name, (has, _, q) in _scraped(gw).items() if has} != {"a": 0, "b": 5, "c": 20}:
            assert time.monotonic() < deadline, "queue depths were never scraped"
            time.sleep(0.05)
        with httpx.Client(timeout=30) as c:
            before = [gw.post(c, f"{i} distinct prompt {i}").headers["x-backend-name"] for i in range(20)]
        backends[0].metrics_failing = True  # the least loaded endpoint's /metrics starts failing
        deadline = time.monotonic() + 20
        while _scraped(gw)["a"][1] < 1.0:  # its last good scrape ages past the 500 ms threshold
            assert time.monotonic() < deadline, "the failing endpoint's metrics never aged"
            time.sleep(0.05)
        with httpx.Client(timeout=30) as c:
            after = [gw.post(c, f"{i} other prompt {i}").headers["x-backend-name"] for i in range(20)]
        assert "scrape_failed endpoint=a" in gw.epp.log()  # the failure was logged, with its reason
    finally:
        gw.stop()
    assert before == ["a"] * 20  # queue 0 beats 5 and 20
    assert after == ["b"] * 20  # stale metrics are not trusted: the next least loaded fresh endpoint wins
