"""The role filters' shared implementation: keep endpoints whose `llm-d.ai/role` label is in a fixed set."""

from __future__ import annotations

from collections.abc import Sequence

from llm_epp.framework import CycleState, Endpoint, InferenceRequest, TypedName
from llm_epp.plugins.disagg.common import ROLE_LABEL


class RoleFilter:
    """Keeps the endpoints whose role label value is in `roles` (and, when `keep_unlabelled`, those
    without the label). Nothing passing gives an empty result, which fails the profile."""

    roles: frozenset[str] = frozenset()
    keep_unlabelled = False
    plugin_type = ""

    def __init__(self, name: str) -> None:
        self._typed_name = TypedName(self.plugin_type, name)

    @property
    def typed_name(self) -> TypedName:
        return self._typed_name

    def filter(self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> Sequence[Endpoint]:
        roles, keep_unlabelled = self.roles, self.keep_unlabelled
        out = []
        for e in endpoints:
            role = e.metadata.labels.get(ROLE_LABEL)
            if (role is None and keep_unlabelled) or role in roles:
                out.append(e)
        return out
