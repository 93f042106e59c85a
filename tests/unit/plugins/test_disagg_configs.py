"""P/D configurations in llm-d-router's published shape, loaded by the real config loader and run through
the real producer, scheduler and PreRequest hooks."""

from __future__ import annotations

import pytest

from llm_epp.config import load_config_text
from llm_epp.framework import CycleState, Endpoint, InferenceRequest
from llm_epp.framework.requestcontrol import REQUEST_HEADERS_KEY
from llm_epp.plugins import builtin_registry
from tests.unit.builders import FakeRecorder, request
from tests.unit.plugins.disagg_support import pod, pool, prompt_request

PD_CONFIG = """
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: approx-prefix-cache-producer
  parameters:
    maxPrefixTokensToMatch: 16384
    lruCapacityPerServer: 31250
- type: prefix-cache-scorer
- type: queue-scorer
- type: prefill-filter
- type: decode-filter
- type: max-score-picker
- type: disagg-profile-handler
  parameters:
    deciders:
      prefill: prefix-based-pd-decider
- type: prefix-based-pd-decider
  parameters:
    nonCachedTokens: 16
schedulingProfiles:
- name: prefill
  plugins:
  - pluginRef: prefill-filter
  - pluginRef: max-score-picker
  - pluginRef: prefix-cache-scorer
    weight: 2
  - pluginRef: queue-scorer
    weight: 1
- name: decode
  plugins:
  - pluginRef: decode-filter
  - pluginRef: max-score-picker
  - pluginRef: prefix-cache-scorer
    weight: 2
  - pluginRef: queue-scorer
    weight: 1
"""

E_PD_CONFIG = """
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: encode-filter
- type: decode-filter
- type: max-score-picker
- type: always-disagg-multimodal-decider
- type: disagg-profile-handler
  parameters:
    deciders:
      encode: always-disagg-multimodal-decider
schedulingProfiles:
- name: encode
  plugins:
  - pluginRef: encode-filter
- name: decode
  plugins:
  - pluginRef: decode-filter
"""

V05_CONFIG = """
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: prefill-header-handler
- type: prefill-filter
- type: decode-filter
- type: max-score-picker
- type: prefix-cache-scorer
- type: pd-profile-handler
  parameters:
    threshold: 10
    hashBlockSize: 64
schedulingProfiles:
- name: prefill
  plugins:
  - pluginRef: prefill-filter
  - pluginRef: max-score-picker
- name: decode
  plugins:
  - pluginRef: decode-filter
  - pluginRef: max-score-picker
  - pluginRef: prefix-cache-scorer
"""


async def _route(
    text: str, req: InferenceRequest, endpoints: list[Endpoint], recorder: FakeRecorder
) -> tuple[list[str], dict[str, str]]:
    loaded = load_config_text(text, builtin_registry(), recorder, lambda: endpoints)
    cycle = CycleState()
    for plugin in loaded.prepare_data:
        await plugin.prepare_data(cycle, req, endpoints)
    result = loaded.scheduler.schedule(req, endpoints, cycle)
    for hook in loaded.pre_request:
        hook.pre_request(cycle, req, result)
    assert result.primary is not None
    return [e.key.name for e in result.primary.target_endpoints], dict(cycle.read(REQUEST_HEADERS_KEY) or {})


async def test_pd_config_disaggregates_cold_prompts_and_not_warm_ones() -> None:
    recorder = FakeRecorder()
    loaded = load_config_text(PD_CONFIG, builtin_registry(), recorder, pool)
    assert loaded.warnings == []
    endpoints = pool()
    req = prompt_request(4 * 400)  # 400 tokens, 25 blocks of 16
    cycle = CycleState()
    for plugin in loaded.prepare_data:
        await plugin.prepare_data(cycle, req, endpoints)
    result = loaded.scheduler.schedule(req, endpoints, cycle)
    for hook in loaded.pre_request:
        hook.pre_request(cycle, req, result)
    assert result.primary_profile_name == "decode"
    assert [e.key.name for e in result.primary.target_endpoints] == ["dec"]  # type: ignore[union-attr]
    assert cycle.read(REQUEST_HEADERS_KEY) == {"x-prefiller-host-port": "10.0.0.2:8200"}
    # the same prompt again: the decode pod now holds it, so nothing is left to prefill remotely
    warm = CycleState()
    for plugin in loaded.prepare_data:
        await plugin.prepare_data(warm, req, endpoints)
    result = loaded.scheduler.schedule(req, endpoints, warm)
    for hook in loaded.pre_request:
        hook.pre_request(warm, req, result)
    assert "prefill" not in result.profile_results
    assert warm.read(REQUEST_HEADERS_KEY) == {}
    assert [d[2] for d in recorder.disagg_decisions] == ["prefill-decode", "decode-only"]


async def test_e_pd_config_encodes_only_multimodal_requests() -> None:
    recorder = FakeRecorder()
    endpoints = [
        pod("dec", "prefill-decode", "10.0.0.1"),
        pod("enc1", "encode", "10.0.0.3"),
        pod("enc2", "encode", "10.0.0.4"),
    ]
    text = await _route(E_PD_CONFIG, request(), endpoints, recorder)
    assert text == (["dec"], {})
    image = request(
        payload={
            "model": "m",
            "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "u"}}]}],
        }
    )
    targets, headers = await _route(E_PD_CONFIG, image, endpoints, recorder)
    assert targets == ["dec"]
    assert headers["x-encoder-hosts-ports"] in ("10.0.0.3:8000", "10.0.0.4:8000")
    assert [d[2] for d in recorder.disagg_decisions] == ["decode-only", "encode-decode"]


@pytest.mark.parametrize(("chars", "disaggregated"), [(400, True), (8, False)])
async def test_v05_pd_profile_handler_config(chars: int, disaggregated: bool) -> None:
    recorder = FakeRecorder()
    targets, headers = await _route(V05_CONFIG, prompt_request(chars), pool(), recorder)
    assert targets == ["dec"]
    assert ("x-prefiller-host-port" in headers) is disaggregated
    assert [d[2] for d in recorder.pd_decisions] == ["prefill-decode" if disaggregated else "decode-only"]
