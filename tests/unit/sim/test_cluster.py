"""The virtual-time cluster: behaviour only (tiny profile, small workloads; no timing assertions)."""

from __future__ import annotations

import pytest

from llm_epp.plugins.scheduling.utilization_detector import UtilizationDetector
from llm_epp.sim.cluster import ROUTERS, Cluster, EppRouter, RoundRobinRouter, RunResult, make_router
from llm_epp.sim.profiles import TINY
from llm_epp.sim.tokenizer import encode
from llm_epp.sim.virtual_loop import VirtualClock
from llm_epp.sim.workload import SharedPrefixWorkload, Stage, poisson_offsets

PODS = 4
OUTPUT = 12
SMALL = {"num_groups": 2, "prompts_per_group": 2, "system_prompt_len": 64, "question_len": 16, "output_len": 4}


def _workload(seed: int = 7) -> SharedPrefixWorkload:
    # 24 groups x 192 shared tokens: more shared prefixes than one tiny pod (4,096 KV tokens) can keep.
    return SharedPrefixWorkload(
        num_groups=24, prompts_per_group=5, system_prompt_len=192, question_len=32, output_len=OUTPUT, seed=seed
    )


def _run(router: str, seed: int = 7, stages: tuple[Stage, ...] = (Stage(30, 4), Stage(60, 2))) -> RunResult:
    return Cluster(TINY, PODS).run(_workload(seed), stages, make_router(router, PODS, seed=seed), seed=seed)


def test_workload_prompts_match_the_tokenizer_and_share_group_prefixes() -> None:
    w = _workload()
    assert len(w) == 120
    by_group = [p for p in w.prompts if p.group == 3]
    assert len(by_group) == 5
    for p in by_group:
        assert p.token_ids == encode(p.text)
        assert len(p.token_ids) == 192 + 32
        assert p.token_ids[:192] == by_group[0].token_ids[:192]
    assert by_group[0].token_ids[192:] != by_group[1].token_ids[192:]
    first_cycle = [w.next_prompt() for _ in range(len(w))]
    assert sorted((p.group, p.index) for p in first_cycle) == sorted((p.group, p.index) for p in w.prompts)
    assert [w.next_prompt() for _ in range(len(w))] == first_cycle  # one fixed shuffle, cycled


def test_poisson_offsets_are_seeded_and_increasing() -> None:
    import itertools
    import random

    a = poisson_offsets(10, 100, random.Random(1))
    assert a == poisson_offsets(10, 100, random.Random(1))
    assert a[0] == 0.0 and all(x < y for x, y in itertools.pairwise(a))


@pytest.mark.parametrize("router", ROUTERS)
def test_same_seed_same_results_and_every_request_finishes(router: str) -> None:
    first = _run(router)
    second = _run(router)
    assert first.requests == second.requests
    assert first.stages == second.stages
    assert len(first.requests) == 120 + 120
    for r in first.requests:
        assert not r.failed
        assert r.completion_tokens == OUTPUT
        assert r.arrival <= r.first_token <= r.finish
    for s in first.stages:
        assert s.failures == 0 and sum(s.requests_per_pod) == s.requests


def test_stages_run_one_after_the_other() -> None:
    result = _run("round-robin")
    first, second = result.stages
    assert second.start >= first.end
    assert all(r.stage == 0 for r in result.requests[:120]) and all(r.stage == 1 for r in result.requests[120:])


def test_round_robin_spreads_evenly() -> None:
    for stage in _run("round-robin").stages:
        assert max(stage.requests_per_pod) - min(stage.requests_per_pod) <= 1


def test_locality_bound_keeps_groups_on_one_pod_and_beats_round_robin() -> None:
    bound = _run("locality-bound")
    pods_of: dict[int, set[int]] = {}
    for r in bound.requests:
        pods_of.setdefault(r.group, set()).add(r.pod)
    assert all(len(p) == 1 for p in pods_of.values())
    rr = _run("round-robin")
    for b, r in zip(bound.stages, rr.stages, strict=True):
        assert b.prefix_hit_rate > r.prefix_hit_rate


def test_llm_epp_default_config_has_more_prefix_hits_than_round_robin() -> None:
    epp = _run("llm-epp")
    rr = _run("round-robin")
    for e, r in zip(epp.stages, rr.stages, strict=True):
        assert e.prefix_hit_rate > r.prefix_hit_rate
    assert sum(r.cached_tokens for r in epp.requests) > sum(r.cached_tokens for r in rr.requests)


def test_unknown_router_is_rejected() -> None:
    with pytest.raises(KeyError, match="round-robin"):
        make_router("nope", 2)


def test_llm_epp_plugins_judge_staleness_on_the_virtual_clock() -> None:
    config = """
plugins:
- type: utilization-detector
- type: queue-scorer
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
"""
    router = make_router("llm-epp", 2, config_text=config)
    assert isinstance(router, EppRouter)
    detector = router.config.plugins["utilization-detector"]
    assert isinstance(detector, UtilizationDetector)
    clock = VirtualClock(1.0e7)  # virtual seconds, nowhere near this machine's monotonic clock
    router.bind_clock(clock)
    router.on_scrape(Cluster(TINY, 2).metrics(), clock.now)
    assert detector.saturation(router.datastore.snapshot()) == 0.0  # fresh and idle on the virtual clock
    clock.advance_to(clock.now + 1.0)
    assert detector.saturation(router.datastore.snapshot()) == 1.0  # a virtual second later the scrape is stale


def test_run_trace_plays_requests_at_the_given_times() -> None:
    workload = SharedPrefixWorkload(**SMALL)
    trace = [(0.0, workload.next_prompt()), (0.5, workload.next_prompt()), (0.5, workload.next_prompt())]
    results = Cluster(TINY, 2).run_trace(trace, make_router("round-robin", 2))
    by_id = {r.id: r for r in results}
    assert [by_id[f"req-{k}"].arrival for k in (1, 2, 3)] == [0.0, 0.5, 0.5]
    assert [by_id[f"req-{k}"].pod for k in (1, 2, 3)] == [0, 1, 0]
    assert all(r.finish > r.first_token > r.arrival for r in results)
    with pytest.raises(ValueError, match="sorted"):
        Cluster(TINY, 2).run_trace(trace[::-1], make_router("round-robin", 2))


class _BrokenRouter(RoundRobinRouter):
    def pick(self, request, now):
        if request.id == "req-2":
            raise KeyError("a bug in the router")
        return super().pick(request, now)


def test_a_router_bug_stops_the_run_with_its_error() -> None:
    workload = SharedPrefixWorkload(**SMALL)
    trace = [(0.1 * k, workload.next_prompt()) for k in range(3)]
    with pytest.raises(KeyError, match="a bug in the router"):
        Cluster(TINY, 2).run_trace(trace, _BrokenRouter(2))
