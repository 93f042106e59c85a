"""prefill-header-handler

Scheduling intent:
    Deprecated llm-d PreRequest plugin, the older name of `disagg-headers-handler` (same behaviour):
    write `x-prefiller-host-port` (first prefill target) and `x-encoder-hosts-ports` (encode targets)
    into the upstream request headers for the decode pod's sidecar.

Inputs consumed:
    The SchedulingResult's profile results.

Configuration:
    prefillProfile (string, default "prefill"): the prefill profile's name.
    encodeProfile (string, default "encode"): the encode profile's name.
"""

from __future__ import annotations

from llm_epp.framework import Handle
from llm_epp.plugins.disagg.disagg_headers_handler import HeadersHandler
from llm_epp.plugins.disagg.disagg_headers_handler import Params as _HeadersParams

TYPE = "prefill-header-handler"


class Params(_HeadersParams):
    pass


class PrefillHeaderHandler(HeadersHandler):
    plugin_type = TYPE


def factory(name: str, params: Params, handle: Handle) -> PrefillHeaderHandler:
    return PrefillHeaderHandler(name, params.prefill_profile, params.encode_profile)
