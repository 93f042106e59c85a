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
