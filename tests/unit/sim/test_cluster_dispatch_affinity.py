"""Affinity-aware dispatch in the virtual-time cluster, through the real director: with
`kv-cache-headroom-detector` as flow control's saturation detector, a burst of requests from a few prefix
groups is released so that each group's requests join the pod already holding its prefix, instead of
copying every prefix to every pod (what releasing strictly in queue order does)."""

from __future__ import annotations

from llm_epp.sim.cluster import Cluster, EppRouter, RequestResult, TraceRequest
from llm_epp.sim.profiles import TINY
from llm_epp.sim.workload import SharedPrefixWorkload

PODS = 2
GROUPS = 10
REQUESTS = 50
CONFIG = """
featureGates: [flowControl]
plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: prefix-cache-scorer
- type: kv-cache-headroom-detector
  parameters: {dispatchWindow: %d}
flowControl:
  saturationDetector: {pluginRef: kv-cache-headroom-detector}
schedulingProfiles:
- name: default
  plugins:
  - {pluginRef: kv-cache-headroom-detector}
  - {pluginRef: queue-scorer, weight: 2}
  - {pluginRef: kv-cache-utilization-scorer, weight: 2}
  - {pluginRef: prefix-cache-scorer, weight: 3}
"""


def _run(window: int) -> tuple[EppRouter, list[RequestResult]]:
    # 10 groups sharing a 1,200-token system prompt each; a pod holds 4,096 tokens: a prefix copied to both
    # pods leaves room for few requests, kept on one pod it leaves room for several
    w = SharedPrefixWorkload(
        num_groups=GROUPS, prompts_per_group=5, system_prompt_len=1200, question_len=64, output_len=160, seed=3
    )
    prompts = [w.next_prompt() for _ in range(REQUESTS)]
    router = EppRouter(PODS, CONFIG % window, seed=1)
    trace = [TraceRequest(0.005 * k, p) for k, p in enumerate(prompts)]
    return router, Cluster(TINY, PODS).run_trace(trace, router)


def test_queued_requests_join_the_pod_holding_their_prefix() -> None:
    in_order_router, in_order = _run(window=0)
    affine_router, affine = _run(window=8)
    for results, router in ((in_order, in_order_router), (affine, affine_router)):
        assert len(results) == REQUESTS and all(r.status == 200 and not r.failed for r in results)
        assert all(e.load.requests == 0 for e in router.datastore.snapshot()), "no leaked in-flight slot"
    computed = sum(r.prompt_tokens - r.cached_tokens for r in affine)
    assert computed < sum(r.prompt_tokens - r.cached_tokens for r in in_order), "less prefill recomputed"
    assert max(r.finish for r in affine) < max(r.finish for r in in_order), "the burst is served sooner"
