"""agent-identity

Scheduling intent:
    Recognise the session of a coding agent from the header the agent sends on every turn and publish it
    as the request attribute `agent-identity`, so every turn of one agent session can be kept together:
    list `{attribute: agent-identity}` as a source of a `session_id` session-affinity scorer or filter.

Inputs consumed:
    Request headers, in this order (the first non-empty one wins): the `additionalSessionHeaders`, then
    `x-claude-code-session-id` (Claude Code), `x-session-affinity` (OpenCode), `session-id` (Codex) and
    `session_id` (older Codex).

Configuration:
    additionalSessionHeaders (list of header names, default []): checked before the built-in ones, in
    order; names are matched case-insensitively.

Outputs produced:
    Request attribute (`agent-identity`, "") = the header's value, written in PrepareData. Nothing is
    published when no header matches. The reference also derives the flow-control fairness id from this
    attribute when the request names none; llm-epp has no flow control to feed yet.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field

from llm_epp.framework import CycleState, Endpoint, Handle, InferenceRequest, PluginParams, TypedName
from llm_epp.plugins.requestcontrol._attributes import get_attribute, put_attribute

TYPE = "agent-identity"
ATTRIBUTE = "agent-identity"
DEFAULT_HEADERS = ("x-claude-code-session-id", "x-session-affinity", "session-id", "session_id")


class Params(PluginParams):
    additional_session_headers: tuple[str, ...] = Field(default=(), alias="additionalSessionHeaders")


class AgentIdentity:
    produces = frozenset({f"{ATTRIBUTE}/"})

    def __init__(self, name: str = TYPE, params: Params | None = None) -> None:
        self._typed_name = TypedName(TYPE, name)
        extra = (params or Params()).additional_session_headers
        self.headers = tuple(h.lower() for h in (*extra, *DEFAULT_HEADERS))

    @property
    def typed_name(self) -> TypedName:
        return self._typed_name

    def identity(self, request: InferenceRequest) -> str:
        for header in self.headers:
            value = request.headers.get(header)
            if value:
                return value
        return ""

    async def prepare_data(self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> None:
        identity = self.identity(request)
        if identity:
            put_attribute(cycle, ATTRIBUTE, "", identity)


def read_identity(cycle: CycleState) -> str | None:
    value = get_attribute(cycle, ATTRIBUTE, "")
    return value if isinstance(value, str) else None


def factory(name: str, params: Params, handle: Handle) -> AgentIdentity:
    return AgentIdentity(name, params)
