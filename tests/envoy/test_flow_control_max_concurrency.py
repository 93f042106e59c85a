"""`kv-cache-headroom-detector`'s `maxConcurrency` through a real Envoy and `llm-epp serve`: one pod whose
scraped vLLM metrics show an empty KV cache, which holds every request until the test lets it go.

With `maxConcurrency: 1` the second request waits in the EPP's queue although the KV prediction has room for
it, and reaches the pod when the first ends; without the parameter both reach the pod at once."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.envoy.test_flow_control import QUEUE_SIZE, Pod, Stack, _handler, serve_stack, start_pod

pytestmark = pytest.mark.envoy

CONFIG = """\
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
featureGates: [flowControl]
plugins:
- type: queue-scorer
- type: kv-cache-headroom-detector
  parameters: {%s}
flowControl:
  saturationDetector: {pluginRef: kv-cache-headroom-detector}
schedulingProfiles:
- name: default
  plugins:
  - {pluginRef: kv-cache-headroom-detector}
  - {pluginRef: queue-scorer, weight: 1}
"""

IDLE_VLLM = (
    b"# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
    b"# TYPE vllm:num_requests_running gauge\n"
    b'vllm:num_requests_running{model_name="m"} 0.0\n'
    b"# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n"
    b"# TYPE vllm:num_requests_waiting gauge\n"
    b'vllm:num_requests_waiting{model_name="m"} 0.0\n'
    b"# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.\n"
    b"# TYPE vllm:kv_cache_usage_perc gauge\n"
    b'vllm:kv_cache_usage_perc{model_name="m"} 0.0\n'
    b"# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
    b"# TYPE vllm:cache_config_info gauge\n"
    b'vllm:cache_config_info{block_size="16",cache_dtype="auto",num_gpu_blocks="10000"} 1.0\n'
)


def _metrics_handler(ref: list[Pod], polls: list[int]) -> type:
    base = _handler(ref)

    class Handler(base):  # type: ignore[misc, valid-type]
        def do_GET(self) -> None:
            body = IDLE_VLLM if self.path.split("?")[0] == "/metrics" else b""
            if body:
                with ref[0].cond:
                    polls[0] += 1
            self.send_response(200 if body else 404)
            self.send_header("content-type", "text/plain; version=0.0.4")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    return Handler


def _stack(params: str) -> Iterator[Stack]:
    polls = [0]
    pod = start_pod(lambda ref: _metrics_handler(ref, polls))
    running = serve_stack(pod, CONFIG % params)
    try:
        stack = next(running)
        # The detector counts a pod whose metrics were never read as full: wait until a second poll has begun,
        # by which time the first one's figures are in the endpoint store (an endpoint's polls do not overlap).
        with pod.cond:
            assert pod.cond.wait_for(lambda: polls[0] >= 2, 10), "the pod's metrics were never scraped"
        yield stack
    finally:
        running.close()


@pytest.fixture
def capped() -> Iterator[Stack]:
    yield from _stack("maxConcurrency: 1")


@pytest.fixture
def uncapped() -> Iterator[Stack]:
    yield from _stack("")


def test_the_limit_holds_the_second_request_at_the_epp_until_the_first_ends(capped: Stack) -> None:
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(capped.post, "first")
        assert capped.pod.wait_arrivals(1) == ["first"]
        second = pool.submit(capped.post, "second")
        assert capped.epp.wait_metric(QUEUE_SIZE, 1) == 1, capped.epp.log()
        time.sleep(0.3)
        assert capped.pod.arrived == ["first"], "the empty KV cache has room, the limit does not"
        capped.pod.release.release()
        assert capped.pod.wait_arrivals(2) == ["first", "second"]
        capped.pod.release.release()
        assert [f.result(30).status_code for f in (first, second)] == [200, 200]
    assert capped.queued() == 0


def test_without_the_limit_both_requests_reach_the_pod_at_once(uncapped: Stack) -> None:
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(uncapped.post, "first")
        assert uncapped.pod.wait_arrivals(1) == ["first"]
        second = pool.submit(uncapped.post, "second")
        assert sorted(uncapped.pod.wait_arrivals(2)) == ["first", "second"], uncapped.epp.log()
        for _ in range(2):
            uncapped.pod.release.release()
        assert [f.result(30).status_code for f in (first, second)] == [200, 200]
