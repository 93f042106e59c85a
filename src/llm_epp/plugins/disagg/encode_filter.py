"""encode-filter

Scheduling intent:
    Keep the endpoints that can run multimodal encoders: label `llm-d.ai/role` is `encode`,
    `encode-prefill` or `encode-prefill-decode`. Endpoints without the label are dropped. Used in the
    encode profile of E/P/D setups.

Inputs consumed:
    EndpointMetadata.labels.

Configuration:
    No parameters. Nothing passing gives an empty result (the profile fails, no fail-open).
"""

from __future__ import annotations

from llm_epp.framework import Handle, PluginParams
from llm_epp.plugins.disagg.common import ROLE_ENCODE, ROLE_ENCODE_PREFILL, ROLE_ENCODE_PREFILL_DECODE
from llm_epp.plugins.disagg.roles import RoleFilter

TYPE = "encode-filter"


class Params(PluginParams):
    pass


class EncodeFilter(RoleFilter):
    plugin_type = TYPE
    roles = frozenset({ROLE_ENCODE, ROLE_ENCODE_PREFILL, ROLE_ENCODE_PREFILL_DECODE})


def factory(name: str, params: Params, handle: Handle) -> EncodeFilter:
    return EncodeFilter(name)
