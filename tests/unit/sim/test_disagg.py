"""Prefill/decode disaggregation in the simulator: the engine's remote-prefill hook, vLLM's NIXL parameters, and
the virtual-time cluster splitting requests through the real director, the disaggregation plugins and the
sidecar's own decision functions."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest

from llm_epp.sim.cluster import Cluster, EppRouter, RequestResult, RoundRobinRouter, RoutedRequest
from llm_epp.sim.disagg import KvTransfer, RemotePrefill, prefill_kv_transfer_params, pulled_tokens, role_labels
from llm_epp.sim.engine import Engine, EventKind, SimRequest
from llm_epp.sim.profiles import TINY
from llm_epp.sim.routers import pod_address
from llm_epp.sim.workload import Prompt, SharedPrefixWorkload

ROLES = ("prefill", "prefill", "decode", "decode")


def _config(decider: str) -> str:
    return f"""
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: approx-prefix-cache-producer
- type: prefix-cache-scorer
- type: queue-scorer
- type: prefill-filter
- type: decode-filter
- type: max-score-picker
{decider}
- type: disagg-profile-handler
  parameters:
    deciders:
      prefill: decider
schedulingProfiles:
- name: decode
  plugins:
  - pluginRef: decode-filter
  - pluginRef: max-score-picker
  - pluginRef: prefix-cache-scorer
    weight: 2
  - pluginRef: queue-scorer
- name: prefill
  plugins:
  - pluginRef: prefill-filter
  - pluginRef: max-score-picker
  - pluginRef: queue-scorer
"""


ALWAYS = _config("- type: always-disagg-pd-decider\n  name: decider")
PREFIX_BASED = _config("- type: prefix-based-pd-decider\n  name: decider\n  parameters:\n    nonCachedTokens: 200")


def _prompts(n: int, length: int, seed: int = 1, output: int = 8) -> list[Prompt]:
    w = SharedPrefixWorkload(
        num_groups=n, prompts_per_group=1, system_prompt_len=0, question_len=length, output_len=output, seed=seed
    )
    return [w.next_prompt() for _ in range(n)]


def _run(cluster: Cluster, router: object, prompts: Sequence[Prompt], gap: float = 0.05) -> list[RequestResult]:
    results = cluster.run_trace([(i * gap, p) for i, p in enumerate(prompts)], router)  # type: ignore[arg-type]
    assert len(results) == len(prompts)
    return sorted(results, key=lambda r: int(r.id.split("-")[1]))


# --- engine and parameters ----------------------------------------------------------------------------------


def test_transferred_kv_is_not_prefilled_and_is_cached_afterwards() -> None:
    prompt = tuple(range(1, 301))  # 300 tokens: 18 full blocks + 12
    p = TINY
    first: dict[str, float] = {}
    engines = {}
    for name, external in (("local", 0), ("remote", len(prompt))):
        engine = Engine(p)
        engine.submit(SimRequest(name, prompt, 4, external_tokens=external), 0.0)
        while (t := engine.next_event_time()) is not None:
            for ev in engine.advance(t):
                if ev.kind is EventKind.FIRST_TOKEN:
                    first[name] = ev.time
        engines[name] = engine
    # one step computing only the last prompt token over a context of the whole prompt
    assert first["remote"] == pytest.approx(p.step_base + p.prefill_cost_per_token + p.kv_read_cost_per_token * 300)
    assert first["local"] == pytest.approx(
        p.step_base + p.prefill_cost_per_token * 300 + p.kv_read_cost_per_token * 300
    )
    assert engines["remote"].cached_prefix_tokens(prompt) == 18 * 16
    m = engines["remote"].metrics()
    assert (m.prefix_cache_queries, m.prefix_cache_hits, m.generation_tokens) == (300, 0, 4)


def test_transfer_time_and_vllm_parameters() -> None:
    t = KvTransfer(bandwidth=1e9, setup_latency=0.002)
    assert t.duration(0) == 0.002
    assert t.duration(500_000_000) == pytest.approx(0.502)
    with pytest.raises(ValueError, match="bandwidth"):
        KvTransfer(bandwidth=0)
    params = prefill_kv_transfer_params(
        engine_id="e", request_id="r", num_prompt_tokens=33, block_size=16, host="10.0.0.1", port=8000
    )
    assert params["do_remote_prefill"] is True and params["do_remote_decode"] is False
    assert params["remote_block_ids"] == [0, 1, 2]
    assert RemotePrefill.parse(params) == RemotePrefill("10.0.0.1", 8000, "e", "r")
    for missing in ("remote_block_ids", "remote_engine_id", "remote_request_id", "remote_host", "remote_port"):
        assert RemotePrefill.parse({k: v for k, v in params.items() if k != missing}) is None
    assert RemotePrefill.parse({**params, "do_remote_prefill": False}) is None
    assert RemotePrefill.parse({**params, "remote_block_ids": []}) is None
    assert pulled_tokens(100, 64) == 36 and pulled_tokens(10, 64) == 0
    assert role_labels("both") == {"llm-d.ai/role": "prefill-decode"}
    with pytest.raises(ValueError, match="prefill, decode, both"):
        role_labels("encode")


# --- the virtual-time cluster ---------------------------------------------------------------------------------


def _pd_cluster(**kw: object) -> Cluster:
    return Cluster(TINY, 4, roles=ROLES, **kw)  # type: ignore[arg-type]


def test_always_disaggregate_prefills_on_a_prefill_pod_and_decodes_after_the_transfer() -> None:
    transfer = KvTransfer(bandwidth=1e8, setup_latency=0.01)
    cluster = _pd_cluster(kv_transfer=transfer)
    router = EppRouter(4, ALWAYS, pod_labels=cluster.pod_labels())
    prompts = _prompts(6, 200)
    results = _run(cluster, router, prompts)
    for r, prompt in zip(results, prompts, strict=True):
        assert not r.failed
        assert r.prefill_pod in (0, 1) and r.pod in (2, 3)
        nbytes = len(prompt.token_ids) * TINY.kv_bytes_per_token
        assert r.kv_bytes == nbytes
        assert r.ttft > transfer.duration(nbytes)
        assert r.completion_tokens == prompt.max_tokens
    m = cluster.metrics()
    assert sum(x.generation_tokens for x in m[:2]) == len(prompts)  # one token per prefill leg
    assert sum(x.generation_tokens for x in m[2:]) == sum(p.max_tokens for p in prompts)
    assert sum(x.prompt_tokens for x in m[:2]) == sum(len(p.token_ids) for p in prompts)
    assert cluster.sidecar is not None and cluster.sidecar.split == len(prompts)


def test_the_prefix_based_decider_splits_only_long_uncached_prompts() -> None:
    cluster = _pd_cluster()
    router = EppRouter(4, PREFIX_BASED, pod_labels=cluster.pod_labels())
    short, long = _prompts(3, 100, seed=2), _prompts(3, 400, seed=3)
    results = _run(cluster, router, [short[0], long[0], short[1], long[1], short[2], long[2]])
    split = [r.prefill_pod >= 0 for r in results]
    assert split == [False, True, False, True, False, True]
    assert all(r.pod in (2, 3) and not r.failed for r in results)
    assert [r.kv_bytes > 0 for r in results] == split
    # the same long prompt again: its decode pod now holds it, so it is not worth a split
    again = _run(cluster, router, [long[0]])
    assert again[0].prefill_pod == -1 and again[0].cached_tokens > 0


def test_an_aggregated_pool_with_the_default_config_never_splits() -> None:
    cluster = Cluster(TINY, 4, roles=("both",) * 4)
    router = EppRouter(4, None, pod_labels=cluster.pod_labels())
    results = _run(cluster, router, _prompts(8, 200))
    assert all(r.prefill_pod == -1 and r.kv_bytes == 0 and not r.failed for r in results)
    assert cluster.sidecar is not None and cluster.sidecar.split == 0


class _HeaderRouter(RoundRobinRouter):
    """Round robin over the decode pods that names a fixed prefill target, whatever it is."""

    def __init__(self, target: str) -> None:
        super().__init__(2)
        self._target = target

    def pick(self, request: RoutedRequest, now: float) -> int:
        return 2 + super().pick(request, now)

    def upstream_headers(self, request: RoutedRequest) -> Mapping[str, str]:
        return {"x-prefiller-host-port": self._target}


def test_the_sidecar_refuses_a_target_outside_the_pool_and_uses_one_inside() -> None:
    prompts = _prompts(2, 120)
    denied = _run(_pd_cluster(), _HeaderRouter("10.9.9.9:8000"), prompts)
    assert [(r.failed, r.status) for r in denied] == [(True, 403), (True, 403)]
    used = _run(_pd_cluster(), _HeaderRouter(f"{pod_address(1)}:8000"), prompts)
    assert [(r.failed, r.prefill_pod) for r in used] == [(False, 1), (False, 1)]


def test_a_prefill_pod_rejecting_the_prompt_is_the_clients_400() -> None:
    long = _prompts(1, TINY.max_model_len)  # too long for the prefill pod
    results = _run(_pd_cluster(), _HeaderRouter(f"{pod_address(0)}:8000"), long)
    assert (results[0].failed, results[0].status) == (True, 400)
