"""The virtual-time cluster routes through the real director: admission and shedding, subset filtering,
plugin-failure isolation, PrepareData under its deadline (in virtual seconds), response hooks, completion."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from llm_epp.datalayer.objectives import parse_objectives_file
from llm_epp.framework import (
    CycleState,
    Endpoint,
    EndpointKey,
    Handle,
    InferenceRequest,
    PluginParams,
    SchedulingResult,
    ScorerCategory,
    TypedName,
)
from llm_epp.framework.requestcontrol import ResponseInfo
from llm_epp.plugins import builtin_registry
from llm_epp.sim.cluster import Cluster, EppRouter, RequestResult, TraceRequest
from llm_epp.sim.profiles import TINY
from llm_epp.sim.routers import pod_address
from llm_epp.sim.workload import Prompt, SharedPrefixWorkload
from tests.unit.builders import FakeRecorder

PODS = 4
OBJECTIVE = "x-gateway-inference-objective"


def _prompts(n: int, seed: int = 3, output: int = 8) -> list[Prompt]:
    w = SharedPrefixWorkload(
        num_groups=4, prompts_per_group=8, system_prompt_len=96, question_len=32, output_len=output, seed=seed
    )
    return [w.next_prompt() for _ in range(n)]


def _run(router: EppRouter, trace: Sequence[TraceRequest], pods: int = PODS) -> dict[str, RequestResult]:
    results = Cluster(TINY, pods).run_trace(trace, router)
    assert len(results) == len(trace)
    return {r.id: r for r in results}


# --- plugins used by the tests -------------------------------------------------------------------------


class _NoParams(PluginParams):
    pass


class _Exploding:
    """A scorer and PreRequest / ResponseComplete hook that always raises."""

    def __init__(self, name: str) -> None:
        self._typed_name = TypedName("exploding", name)

    @property
    def typed_name(self) -> TypedName:
        return self._typed_name

    @property
    def category(self) -> ScorerCategory:
        return ScorerCategory.BALANCE

    def score(
        self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Mapping[EndpointKey, float]:
        raise RuntimeError("scorer bug")

    def pre_request(self, cycle: CycleState, request: InferenceRequest, result: SchedulingResult) -> None:
        raise RuntimeError("pre-request bug")

    def response_complete(
        self, cycle: CycleState, request: InferenceRequest, info: ResponseInfo, endpoint: Endpoint | None
    ) -> None:
        raise RuntimeError("completion bug")


class _SlowPrepareParams(PluginParams):
    delay: float = 0.0


class _SlowPrepare:
    """PrepareData that takes `delay` seconds (of whatever clock the loop keeps)."""

    def __init__(self, name: str, delay: float) -> None:
        self._typed_name = TypedName("slow-prepare", name)
        self.delay = delay

    @property
    def typed_name(self) -> TypedName:
        return self._typed_name

    async def prepare_data(self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> None:
        await asyncio.sleep(self.delay)


class _Witness:
    """Records when the response hooks run (on the plugin clock) and what they are told."""

    def __init__(self, name: str, handle: Handle) -> None:
        self._typed_name = TypedName("witness", name)
        self._handle = handle
        self.received: dict[str, tuple[float, int, str]] = {}
        self.completed: dict[str, tuple[float, int, int | None, bool]] = {}
        self.first_body: dict[str, float | None] = {}

    @property
    def typed_name(self) -> TypedName:
        return self._typed_name

    def response_received(
        self, cycle: CycleState, request: InferenceRequest, info: ResponseInfo, endpoint: Endpoint | None
    ) -> None:
        self.received[request.request_id] = (self._handle.now(), info.status, info.served_endpoint)

    def response_first_body(
        self, cycle: CycleState, request: InferenceRequest, info: ResponseInfo, endpoint: Endpoint | None
    ) -> None:
        self.first_body[request.request_id] = info.first_body_at

    def response_complete(
        self, cycle: CycleState, request: InferenceRequest, info: ResponseInfo, endpoint: Endpoint | None
    ) -> None:
        tokens = info.usage.completion_tokens if info.usage else None
        self.completed[request.request_id] = (self._handle.now(), info.status, tokens, info.complete)


def _registry():  # builtin plugins plus the test ones
    registry = builtin_registry()
    registry.register("exploding", _NoParams, lambda name, params, handle: _Exploding(name))
    registry.register("slow-prepare", _SlowPrepareParams, lambda name, params, handle: _SlowPrepare(name, params.delay))
    registry.register("witness", _NoParams, lambda name, params, handle: _Witness(name, handle))
    return registry


# --- tests ---------------------------------------------------------------------------------------------


SHEDDING_CONFIG = """
plugins:
- type: utilization-detector
  parameters: {queueDepthThreshold: 1, kvCacheUtilThreshold: 0.1}
- type: queue-scorer
saturationDetector: {pluginRef: utilization-detector}
schedulingProfiles:
- name: default
  plugins: [{pluginRef: queue-scorer}]
"""


def test_a_sheddable_objective_is_refused_with_429_while_the_pool_is_saturated() -> None:
    objectives = parse_objectives_file("objectives: [{name: batch, priority: -1}]", "objectives.yaml")
    prompts = _prompts(48, output=24)
    # a burst of critical requests fills the pods' queues; sheddable ones follow while they are full, and
    # once more long after everything has drained
    trace = [TraceRequest(0.001 * k, p) for k, p in enumerate(prompts[:40])]
    trace += [TraceRequest(0.1 + 0.001 * k, p, {OBJECTIVE: "batch"}) for k, p in enumerate(prompts[40:44])]
    trace += [TraceRequest(30.0 + 0.5 * k, p, {OBJECTIVE: "batch"}) for k, p in enumerate(prompts[44:])]
    recorder = FakeRecorder()
    router = EppRouter(PODS, SHEDDING_CONFIG, objectives=objectives, recorder=recorder)
    results = _run(router, trace)
    critical = [results[f"req-{k}"] for k in range(1, 41)]
    during = [results[f"req-{k}"] for k in range(41, 45)]
    after = [results[f"req-{k}"] for k in range(45, 49)]
    assert all(r.status == 200 and not r.failed for r in critical)  # priority 0 is never shed
    assert [r.status for r in during] == [429] * 4 and all(r.failed and r.pod == -1 for r in during)
    assert all(r.status == 200 and not r.failed for r in after)  # an idle pool admits them
    assert [e[2] for e in recorder.request_errors] == ["ResourceExhausted"] * 4


def test_the_gateways_endpoint_subset_limits_the_candidates() -> None:
    prompts = _prompts(12)
    only = f"{pod_address(2)}:8000"
    trace = [TraceRequest(0.01 * k, p, subset=[only]) for k, p in enumerate(prompts[:8])]
    trace += [TraceRequest(0.5 + 0.01 * k, p, subset=["10.9.9.9:8000"]) for k, p in enumerate(prompts[8:])]
    results = _run(EppRouter(PODS), trace)
    assert {results[f"req-{k}"].pod for k in range(1, 9)} == {2}
    assert [results[f"req-{k}"].status for k in range(9, 13)] == [503] * 4  # the subset matches no pod

    ignoring = _run(EppRouter(PODS, disable_subset_filter=True), [*trace[:8]])
    assert len({r.pod for r in ignoring.values()}) > 1  # --disable-endpoint-subset-filter: the hint is ignored


def test_a_plugin_that_raises_is_skipped_and_requests_still_route_and_complete() -> None:
    config = """
plugins:
- type: queue-scorer
- type: exploding
schedulingProfiles:
- name: default
  plugins: [{pluginRef: queue-scorer}, {pluginRef: exploding}]
"""
    recorder = FakeRecorder()
    router = EppRouter(PODS, config, recorder=recorder, registry=_registry())
    results = _run(router, [TraceRequest(0.02 * k, p) for k, p in enumerate(_prompts(10))])
    assert all(r.status == 200 and r.completion_tokens == 8 for r in results.values())
    points = [point for point, name in recorder.plugin_errors if name.name == "exploding"]
    assert points.count("Scorer") == 10 and points.count("PreRequest") == 10 and points.count("ResponseComplete") == 10
    assert all(e.load.requests == 0 and e.load.tokens == 0 for e in router.datastore.snapshot())


def test_prepare_data_takes_virtual_time_and_is_cut_at_its_deadline() -> None:
    def first_token_delays(delay: float) -> list[float]:
        config = f"""
plugins:
- type: queue-scorer
- type: slow-prepare
  parameters: {{delay: {delay}}}
schedulingProfiles:
- name: default
  plugins: [{{pluginRef: queue-scorer}}]
"""
        router = EppRouter(PODS, config, registry=_registry())
        trace = [TraceRequest(1.0 * k, p) for k, p in enumerate(_prompts(4))]  # one at a time: no queueing
        return [r.ttft for r in sorted(_run(router, trace).values(), key=lambda r: r.arrival)]

    base, slow, stuck = first_token_delays(0.0), first_token_delays(0.1), first_token_delays(60.0)
    for b, s, t in zip(base, slow, stuck, strict=True):
        assert abs((s - b) - 0.1) < 1e-6  # the request waited in the director for 0.1 virtual seconds
        assert abs((t - b) - 0.4) < 1e-6  # the 400 ms PrepareData deadline, in virtual seconds


WITNESSED = """
plugins:
- type: queue-scorer
- type: witness
schedulingProfiles:
- name: default
  plugins: [{pluginRef: queue-scorer}]
"""


def _witnessed(**signals: Any) -> tuple[EppRouter, _Witness]:
    router = EppRouter(PODS, WITNESSED, registry=_registry(), **signals)
    witness = router.config.plugins["witness"]
    assert isinstance(witness, _Witness)
    return router, witness


def test_with_response_bodies_read_the_hooks_run_at_the_first_token_and_at_the_end_with_the_usage() -> None:
    router, witness = _witnessed(response_headers_at="first-token", response_usage=True)
    results = _run(router, [TraceRequest(0.01 * k, p) for k, p in enumerate(_prompts(6))])
    assert set(witness.received) == set(witness.completed) == set(results)
    for rid, r in results.items():
        at, status, served = witness.received[rid]
        assert (at, status, served) == (r.first_token, 200, f"{pod_address(r.pod)}:8000")
        assert witness.first_body[rid] == r.first_token  # the first body bytes: the first token
        assert witness.completed[rid] == (r.finish, 200, r.completion_tokens, True)


def test_by_default_as_deployed_the_headers_come_when_the_pod_takes_the_request_and_no_usage_is_read() -> None:
    # What an EPP behind response body mode NONE (envoy-config's default) learns: vLLM sends a streamed
    # response's headers at once, and the body (with its usage) never passes through the EPP.
    router, witness = _witnessed()
    trace = [TraceRequest(0.01 * k, p) for k, p in enumerate(_prompts(6))]
    results = _run(router, trace)
    assert set(witness.received) == set(witness.completed) == set(results)
    for rid, r in results.items():
        at, status, served = witness.received[rid]
        assert at == r.arrival < r.first_token  # routed at once: the pod took it when it arrived
        assert (status, served) == (200, f"{pod_address(r.pod)}:8000")
        assert witness.completed[rid] == (r.finish, 200, None, True)
    assert witness.first_body == {}, "response bodies NONE: no body reaches the EPP"


def test_the_response_signals_are_checked() -> None:
    with pytest.raises(ValueError, match="response_headers_at 'body'"):
        EppRouter(PODS, response_headers_at="body")


def test_metrics_reach_the_endpoints_through_the_datastore_on_the_scrape_interval() -> None:
    router = EppRouter(2, scrape_interval=0.05)
    trace = [TraceRequest(0.0, p) for p in _prompts(6, output=40)]
    cluster = Cluster(TINY, 2)
    cluster.run_trace(trace, router)
    snapshot = router.datastore.snapshot()
    stamps = {e.metrics.update_time for e in snapshot}
    assert len(stamps) == 1
    (stamp,) = stamps
    assert stamp > 0 and abs(stamp / 0.05 - round(stamp / 0.05)) < 1e-6  # on the 50 ms grid
    assert stamp <= cluster.clock < stamp + 0.05
    assert [e.metrics.cache_num_blocks for e in snapshot] == [TINY.num_gpu_blocks] * 2


def test_seeded_runs_repeat_and_the_seed_reaches_the_plugins() -> None:
    config = """
plugins:
- type: random-picker
schedulingProfiles:
- name: default
  plugins: [{pluginRef: random-picker}]
"""
    trace = [TraceRequest(0.01 * k, p) for k, p in enumerate(_prompts(24))]

    def pods(seed: int) -> list[int]:
        results = _run(EppRouter(PODS, config, seed=seed), trace)
        return [results[f"req-{k}"].pod for k in range(1, 25)]

    assert pods(1) == pods(1)
    assert pods(1) != pods(2)
