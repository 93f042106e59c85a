"""Flow-control eviction in the virtual-time cluster, through the real director: while sheddable requests
(priority < 0) fill the pool, queued priority-10 requests make flow control evict running sheddable ones;
the client of an evicted request gets 429, its pod aborts it and frees its KV blocks, and the urgent
requests take the freed places."""

from __future__ import annotations

from llm_epp.datalayer.objectives import parse_objectives_file
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
flowControl:
  saturationDetector: {pluginRef: cap}
  enableEviction: %s
schedulingProfiles:
- name: default
  plugins: [{pluginRef: queue-scorer}]
"""
OBJECTIVES = "objectives: [{name: urgent, priority: 10}, {name: batch, priority: -1}]"


def _prompts(n: int, output: int) -> list[Prompt]:
    w = SharedPrefixWorkload(
        num_groups=4, prompts_per_group=8, system_prompt_len=96, question_len=32, output_len=output, seed=7
    )
    return [w.next_prompt() for _ in range(n)]


def _run(eviction: bool) -> tuple[Cluster, EppRouter, dict[str, RequestResult]]:
    objectives = parse_objectives_file(OBJECTIVES, "objectives.yaml")
    router = EppRouter(PODS, CONFIG % (PER_POD, str(eviction).lower()), objectives=objectives)
    batch, urgent = _prompts(6, output=400), _prompts(2, output=20)
    # the pool's 4 places go to sheddable requests with long answers; 2 more wait; then 2 urgent ones arrive
    trace = [TraceRequest(0.001 * k, p, {OBJECTIVE: "batch"}) for k, p in enumerate(batch)]
    trace += [TraceRequest(0.5 + 0.001 * k, p, {OBJECTIVE: "urgent"}) for k, p in enumerate(urgent)]
    cluster = Cluster(TINY, PODS)
    results = cluster.run_trace(trace, router)
    return cluster, router, {r.id: r for r in results}


def test_queued_urgent_requests_evict_running_sheddable_ones_and_their_pods_abort_them() -> None:
    cluster, router, results = _run(eviction=True)
    urgent = [results["req-7"], results["req-8"]]
    evicted = [r for r in results.values() if r.status == 429]
    assert evicted, "running sheddable requests were evicted"
    for r in evicted:
        assert r.failed and r.pod >= 0, "it had been dispatched to a pod"
        assert r.id not in ("req-7", "req-8")
        assert r.finish >= 0.5, "evicted only once the urgent requests waited"
    assert all(r.status == 200 and not r.failed for r in urgent)
    # evictions are paced (at most 2 per decision, the next after the freed capacity shows): the urgent ones
    # start long before the sheddable requests could have ended by themselves
    slowest_batch = max(r.finish for r in results.values() if r.status == 200 and r.id not in ("req-7", "req-8"))
    assert max(r.ttft for r in urgent) < slowest_batch - 1.0
    first_eviction = min(r.finish for r in evicted)
    assert min(r.arrival + r.ttft for r in urgent) >= first_eviction
    # the pods aborted them: nothing runs, nothing is held, no in-flight slot leaked
    assert all(engine.idle for engine in cluster.engines)
    assert all(m.num_requests_running == 0 and m.kv_cache_usage_perc == 0 for m in cluster.metrics())
    assert all(e.load.requests == 0 for e in router.datastore.snapshot())
    fc = router.director.flow_control
    assert fc is not None and fc.evictor is not None and fc.evictor.stats() == (0, 0)


def test_without_eviction_the_urgent_requests_wait_for_a_sheddable_one_to_end() -> None:
    _, _, results = _run(eviction=False)
    assert all(r.status == 200 and not r.failed for r in results.values())
    batch_ends = sorted(r.finish for r in results.values() if r.id not in ("req-7", "req-8"))
    urgent_start = min(results[i].arrival + results[i].ttft for i in ("req-7", "req-8"))
    assert urgent_start >= batch_ends[0], "no place freed before a sheddable request ended"
