"""prefill-filter

Scheduling intent:
    Keep the endpoints that can prefill: label `llm-d.ai/role` is `prefill`, `encode-prefill`,
    `prefill-decode`, `both` (deprecated spelling of prefill-decode) or `encode-prefill-decode`.
    Endpoints without the label are dropped. Used in the prefill profile of P/D setups.

Inputs consumed:
    EndpointMetadata.labels.

Configuration:
    No parameters. Nothing passing gives an empty result (the profile fails, no fail-open).
"""

from __future__ import annotations

from llm_epp.framework import Handle, PluginParams
from llm_epp.plugins.disagg.common import (
    ROLE_BOTH,
    ROLE_ENCODE_PREFILL,
    ROLE_ENCODE_PREFILL_DECODE,
    ROLE_PREFILL,
    ROLE_PREFILL_DECODE,
)
from llm_epp.plugins.disagg.roles import RoleFilter

TYPE = "prefill-filter"


class Params(PluginParams):
    pass


class PrefillFilter(RoleFilter):
    plugin_type = TYPE
    roles = frozenset({ROLE_PREFILL, ROLE_ENCODE_PREFILL, ROLE_PREFILL_DECODE, ROLE_BOTH, ROLE_ENCODE_PREFILL_DECODE})


def factory(name: str, params: Params, handle: Handle) -> PrefillFilter:
    return PrefillFilter(name)
