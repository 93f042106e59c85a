"""header-based-testing-filter

Scheduling intent:
    Conformance testing only: keep the endpoints named by the request header
    `test-epp-endpoint-selection` (a comma list of `IP` or `IP:port`). Without the header nothing passes.

Inputs consumed:
    The request header `test-epp-endpoint-selection`.

Configuration:
    No parameters.
"""

from __future__ import annotations

from collections.abc import Sequence

from llm_epp.framework import CycleState, Endpoint, Handle, InferenceRequest, PluginParams, TypedName
from llm_epp.framework.types import split_host_port

TYPE = "header-based-testing-filter"
HEADER = "test-epp-endpoint-selection"


class Params(PluginParams):
    pass


def matches(selection: str, endpoint: Endpoint) -> bool:
    """True when `endpoint` is named in a comma list of `IP` or `IP:port` (port-aware when given)."""
    for item in selection.split(","):
        item = item.strip()
        if not item:
            continue
        try:
            host, port = split_host_port(item)
        except ValueError:
            continue
        if host == endpoint.metadata.address and (port is None or port == endpoint.metadata.port):
            return True
    return False


class HeaderBasedTestingFilter:
    def __init__(self, name: str = TYPE) -> None:
        self._typed_name = TypedName(TYPE, name)

    @property
    def typed_name(self) -> TypedName:
        return self._typed_name

    def filter(self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> Sequence[Endpoint]:
        selection = request.headers.get(HEADER)
        if not selection:
            return ()
        return [e for e in endpoints if matches(selection, e)]


def factory(name: str, params: Params, handle: Handle) -> HeaderBasedTestingFilter:
    return HeaderBasedTestingFilter(name)
