"""Flow control in the virtual-time cluster, through the real director: requests beyond the pool's
capacity wait in the EPP's queues and are dispatched as capacity frees, a later priority-10 request goes
before earlier queued priority-0 ones, and a request that outlives its time to live gets 503 exactly when
its TTL (in virtual seconds) runs out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from llm_epp.datalayer.objectives import parse_objectives_file
from llm_epp.framework import (
    CycleState,
    Endpoint,
    Handle,
    InferenceRequest,
    PluginParams,
    SchedulingResult,
    TypedName,
)
from llm_epp.framework.requestcontrol import ResponseInfo
from llm_epp.plugins import builtin_registry
from llm_epp.sim.cluster import Cluster, EppRouter, RequestResult, TraceRequest
from llm_epp.sim.profiles import TINY
from llm_epp.sim.workload import Prompt, SharedPrefixWorkload

PODS = 2
PER_POD = 2
OBJECTIVE = "x-gateway-inference-objective"
CONFIG = """
featureGates: [flowControl]
plugins:
- type: queue-scorer
- {name: cap, type: concurrency-detector, parameters: {maxConcurrency: %d}}
- type: dispatches
flowControl:
  saturationDetector: {pluginRef: cap}
  defaultRequestTTL: %s
schedulingProfiles:
- name: default
  plugins: [{pluginRef: queue-scorer}]
"""


class _NoParams(PluginParams):
    pass


class _Dispatches:
    """Records, on the virtual clock, when each request was scheduled onto a pod and when it ended."""

    def __init__(self, name: str, handle: Handle) -> None:
        self._typed_name = TypedName("dispatches", name)
        self._handle = handle
        self.started: dict[str, float] = {}
        self.ended: dict[str, float] = {}

    @property
    def typed_name(self) -> TypedName:
        return self._typed_name

    def pre_request(self, cycle: CycleState, request: InferenceRequest, result: SchedulingResult) -> None:
        self.started[request.request_id] = self._handle.now()

    def response_complete(
        self, cycle: CycleState, request: InferenceRequest, info: ResponseInfo, endpoint: Endpoint | None
    ) -> None:
        self.ended[request.request_id] = self._handle.now()


def _router(ttl: str = "0s") -> tuple[EppRouter, _Dispatches]:
    registry = builtin_registry()
    registry.register("dispatches", _NoParams, lambda name, params, handle: _Dispatches(name, handle))
    objectives = parse_objectives_file("objectives: [{name: urgent, priority: 10}]", "objectives.yaml")
    router = EppRouter(PODS, CONFIG % (PER_POD, ttl), objectives=objectives, registry=registry)
    witness = router.config.plugins["dispatches"]
    assert isinstance(witness, _Dispatches)
    return router, witness


def _prompts(n: int, output: int = 32) -> list[Prompt]:
    w = SharedPrefixWorkload(
        num_groups=4, prompts_per_group=8, system_prompt_len=96, question_len=32, output_len=output, seed=5
    )
    return [w.next_prompt() for _ in range(n)]


def _run(router: EppRouter, trace: Sequence[TraceRequest]) -> dict[str, RequestResult]:
    results = Cluster(TINY, PODS).run_trace(trace, router)
    return {r.id: r for r in results}


def _max_in_flight(started: Mapping[str, float], ended: Mapping[str, float]) -> int:
    events = sorted([(t, 1) for t in started.values()] + [(t, -1) for t in ended.values()], key=lambda e: (e[0], e[1]))
    peak = level = 0
    for _, step in events:
        level += step
        peak = max(peak, level)
    return peak


def test_queued_requests_dispatch_as_capacity_frees_and_priority_overtakes() -> None:
    router, seen = _router()
    prompts = _prompts(16)
    # a burst of 12 at priority 0, then 4 urgent ones while most of the burst still waits
    trace = [TraceRequest(0.001 * k, p) for k, p in enumerate(prompts[:12])]
    trace += [TraceRequest(0.05 + 0.001 * k, p, {OBJECTIVE: "urgent"}) for k, p in enumerate(prompts[12:])]
    results = _run(router, trace)
    assert all(r.status == 200 and not r.failed for r in results.values())
    assert len(seen.started) == len(seen.ended) == 16
    assert _max_in_flight(seen.started, seen.ended) == PODS * PER_POD, "never more than the pool's capacity"
    queued_zero = [rid for rid in (f"req-{k}" for k in range(1, 13)) if seen.started[rid] > 0.05]
    assert len(queued_zero) >= 4, "the burst waited in the EPP"
    first_zero_after = min(seen.started[rid] for rid in queued_zero)
    urgent = [f"req-{k}" for k in range(13, 17)]
    assert max(seen.started[rid] for rid in urgent) <= first_zero_after, "urgent ones go before queued 0s"
    # each dispatch of a queued request follows the end of a request (capacity freed)
    ends = sorted(seen.ended.values())
    for rid in queued_zero + urgent:
        assert any(abs(e - seen.started[rid]) < 1e-9 for e in ends) or seen.started[rid] == results[rid].arrival
    assert all(e.load.requests == 0 for e in router.datastore.snapshot()), "no leaked in-flight slot"


def test_a_request_that_outlives_its_ttl_gets_503_at_its_ttl() -> None:
    router, seen = _router("500ms")
    prompts = _prompts(24, output=200)  # long answers: the queue cannot drain in 0.5 s
    results = _run(router, [TraceRequest(0.001 * k, p) for k, p in enumerate(prompts)])
    expired = [r for r in results.values() if r.status == 503]
    served = [r for r in results.values() if r.status == 200]
    assert expired and served and len(expired) + len(served) == 24
    for r in expired:
        assert r.failed and r.pod == -1 and r.id not in seen.started, "never dispatched"
        assert abs(r.finish - r.arrival - 0.5) < 1e-6, "answered when its TTL ran out"
    assert _max_in_flight(seen.started, seen.ended) <= PODS * PER_POD
