"""decode-filter

Scheduling intent:
    Keep the endpoints that can decode: label `llm-d.ai/role` is `decode`, `prefill-decode`, `both`
    (deprecated spelling of prefill-decode) or `encode-prefill-decode`, and endpoints WITHOUT the label
    (an unlabelled pod is an ordinary aggregated server). Used in the decode profile of P/D setups.

Inputs consumed:
    EndpointMetadata.labels.

Configuration:
    No parameters. Nothing passing gives an empty result (the profile fails, no fail-open).
"""

from __future__ import annotations

from llm_epp.framework import Handle, PluginParams
from llm_epp.plugins.disagg.common import ROLE_BOTH, ROLE_DECODE, ROLE_ENCODE_PREFILL_DECODE, ROLE_PREFILL_DECODE
from llm_epp.plugins.disagg.roles import RoleFilter

TYPE = "decode-filter"


class Params(PluginParams):
    pass


class DecodeFilter(RoleFilter):
    plugin_type = TYPE
    roles = frozenset({ROLE_DECODE, ROLE_PREFILL_DECODE, ROLE_BOTH, ROLE_ENCODE_PREFILL_DECODE})
    keep_unlabelled = True


def factory(name: str, params: Params, handle: Handle) -> DecodeFilter:
    return DecodeFilter(name)
