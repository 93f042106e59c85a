"""Tests for agent-identity: the first agent session header becomes the `agent-identity` request attribute."""

from __future__ import annotations

import asyncio

import pytest

from llm_epp.framework import CycleState, TypedName
from llm_epp.framework.requestcontrol import PrepareData
from llm_epp.plugins import builtin_registry
from llm_epp.plugins.requestcontrol import agent_identity as mod
from llm_epp.plugins.requestcontrol.agent_identity import AgentIdentity, Params, read_identity
from tests.unit.builders import FakeHandle, request


def _identity(plugin: AgentIdentity, headers: dict[str, str]) -> str | None:
    cycle = CycleState()
    asyncio.run(plugin.prepare_data(cycle, request(headers=headers), []))
    return read_identity(cycle)


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"x-claude-code-session-id": "cc", "x-session-affinity": "oc"}, "cc"),
        ({"x-session-affinity": "oc", "session-id": "cx"}, "oc"),
        ({"session-id": "cx", "session_id": "old"}, "cx"),
        ({"session_id": "old"}, "old"),
        ({"x-claude-code-session-id": "", "session_id": "old"}, "old"),
        ({"x-other": "1"}, None),
    ],
    ids=["claude-code-first", "opencode", "codex", "codex-legacy", "empty-skipped", "none"],
)
def test_built_in_headers_in_priority_order(headers: dict[str, str], expected: str | None) -> None:
    assert _identity(AgentIdentity(), headers) == expected


def test_additional_headers_come_first_and_are_case_insensitive() -> None:
    plugin = AgentIdentity(params=Params(additional_session_headers=("X-My-Agent",)))
    assert _identity(plugin, {"x-my-agent": "mine", "x-claude-code-session-id": "cc"}) == "mine"
    assert _identity(plugin, {"x-claude-code-session-id": "cc"}) == "cc"


def test_built_from_reference_yaml() -> None:
    plugin = builtin_registry().build(mod.TYPE, "agents", {"additionalSessionHeaders": ["x-a", "x-b"]}, FakeHandle())
    assert isinstance(plugin, PrepareData)
    assert plugin.typed_name == TypedName("agent-identity", "agents")
    assert isinstance(plugin, AgentIdentity)
    assert plugin.headers[:2] == ("x-a", "x-b")


AGENT_PINNING = """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: agent-identity
- type: session-affinity-filter
  parameters:
    strategy: session_id
    sessionIdConfig:
      sources:
      - header: x-session-id
      - attribute: agent-identity
- type: queue-scorer
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: session-affinity-filter
  - pluginRef: queue-scorer
"""


def test_agent_turns_stay_on_one_endpoint_through_a_loaded_configuration() -> None:
    """The README's agent pinning: every turn of a Claude Code session goes where its first turn went, even
    when the queue scorer would now prefer another endpoint."""
    from llm_epp.config.loader import load_config_text
    from llm_epp.framework import Endpoint, EndpointMetadata, Metrics
    from tests.unit.builders import FakeRecorder, endpoints

    loaded = load_config_text(AGENT_PINNING, builtin_registry(), FakeRecorder())
    assert [p.typed_name.type for p in loaded.prepare_data] == ["agent-identity"]
    assert [p.typed_name.type for p in loaded.pre_request] == ["session-affinity-filter"]

    def pool(queues: list[int]) -> list[Endpoint]:
        return [
            Endpoint(EndpointMetadata(e.key, e.metadata.address, 8000), Metrics(waiting_queue_size=q, update_time=1))
            for e, q in zip(endpoints("a", "b", "c"), queues, strict=True)
        ]

    def turn(headers: dict[str, str], queues: list[int]) -> str:
        req = request(headers=headers)
        cycle = CycleState()
        candidates = pool(queues)
        for p in loaded.prepare_data:
            asyncio.run(p.prepare_data(cycle, req, candidates))
        result = loaded.scheduler.schedule(req, candidates, cycle)
        for p in loaded.pre_request:
            p.pre_request(cycle, req, result)
        assert result.primary is not None
        return result.primary.target_endpoints[0].key.name

    claude = {"x-claude-code-session-id": "sess-42"}
    assert turn(claude, [5, 0, 5]) == "b"
    assert turn(claude, [0, 9, 0]) == "b"  # pinned although b is now the busiest
    assert turn({"x-claude-code-session-id": "other"}, [0, 9, 1]) == "a"  # a new session goes by load
    assert turn({}, [3, 9, 0]) == "c"
