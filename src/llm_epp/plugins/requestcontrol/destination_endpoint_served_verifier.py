"""destination-endpoint-served-verifier

Scheduling intent:
    Conformance testing only (the GIE conformance EPP configures it next to `header-based-testing-filter`):
    report to the client which endpoint actually served the request, so the test can check that the
    gateway honoured the EPP's choice.

Inputs consumed:
    The served endpoint Envoy reported for the response (`envoy.lb` /
    `x-gateway-destination-endpoint-served` dynamic metadata, protocol v1.0.0), which reaches the plugin as
    the ResponseInfo's `served_endpoint`; empty when Envoy reported none.

Configuration:
    No parameters.

Outputs produced:
    Response header `x-conformance-test-served-endpoint`: the served `ip:port`, or
    `fail: missing destination endpoint served metadata` when Envoy reported no served endpoint. Written
    on the response headers through RESPONSE_HEADERS_KEY.
"""

from __future__ import annotations

from llm_epp.framework import CycleState, Endpoint, Handle, InferenceRequest, PluginParams, TypedName
from llm_epp.framework.requestcontrol import RESPONSE_HEADERS_KEY, ResponseInfo

TYPE = "destination-endpoint-served-verifier"
HEADER = "x-conformance-test-served-endpoint"
MISSING = "fail: missing destination endpoint served metadata"


class Params(PluginParams):
    pass


class DestinationEndpointServedVerifier:
    def __init__(self, name: str = TYPE) -> None:
        self._typed_name = TypedName(TYPE, name)

    @property
    def typed_name(self) -> TypedName:
        return self._typed_name

    def response_received(
        self, cycle: CycleState, request: InferenceRequest, response: ResponseInfo, endpoint: Endpoint | None
    ) -> None:
        headers = cycle.read(RESPONSE_HEADERS_KEY)
        if headers is None:
            headers = {}
            cycle.write(RESPONSE_HEADERS_KEY, headers)
        headers[HEADER] = response.served_endpoint or MISSING


def factory(name: str, params: Params, handle: Handle) -> DestinationEndpointServedVerifier:
    return DestinationEndpointServedVerifier(name)
