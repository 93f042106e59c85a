"""Tests for destination-endpoint-served-verifier (GIE conformance): the served endpoint goes back to the
client in `x-conformance-test-served-endpoint`; the conformance EPP's configuration loads as the suite
deploys it."""

from __future__ import annotations

from llm_epp.config.loader import load_config_text
from llm_epp.framework import CycleState, TypedName
from llm_epp.framework.requestcontrol import RESPONSE_HEADERS_KEY, ResponseInfo, ResponseReceived
from llm_epp.plugins import builtin_registry
from llm_epp.plugins.requestcontrol import destination_endpoint_served_verifier as mod
from llm_epp.plugins.requestcontrol.destination_endpoint_served_verifier import (
    HEADER,
    MISSING,
    DestinationEndpointServedVerifier,
)
from tests.unit.builders import FakeRecorder, endpoints, request


def test_copies_the_served_endpoint_into_the_response_header() -> None:
    cycle = CycleState()
    cycle.write(RESPONSE_HEADERS_KEY, {"x-other": "1"})
    ep = endpoints("a")[0]
    DestinationEndpointServedVerifier().response_received(
        cycle, request(), ResponseInfo(served_endpoint="10.0.0.7:8000"), ep
    )
    assert cycle.read(RESPONSE_HEADERS_KEY) == {"x-other": "1", HEADER: "10.0.0.7:8000"}


def test_reports_a_failure_when_envoy_reported_no_served_endpoint() -> None:
    cycle = CycleState()
    DestinationEndpointServedVerifier().response_received(cycle, request(), ResponseInfo(), None)
    assert cycle.read(RESPONSE_HEADERS_KEY) == {HEADER: "fail: missing destination endpoint served metadata"}
    assert MISSING.startswith("fail: ")


# The ConfigMap `plugins-config` of GIE v1.5.0 conformance/resources/base.yaml.
CONFORMANCE_CONFIG = """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: header-based-testing-filter
- type: destination-endpoint-served-verifier
schedulingProfiles:
- name: conformance-profile
  plugins:
  - pluginRef: header-based-testing-filter
"""


def test_the_conformance_configuration_loads_and_routes_as_the_suite_expects() -> None:
    loaded = load_config_text(CONFORMANCE_CONFIG, builtin_registry(), FakeRecorder())
    verifier = loaded.plugins["destination-endpoint-served-verifier"]
    assert isinstance(verifier, ResponseReceived)
    assert verifier.typed_name == TypedName(mod.TYPE, mod.TYPE)
    pool = endpoints("a", "b", "c")
    req = request(headers={"test-epp-endpoint-selection": "10.0.0.2"})
    result = loaded.scheduler.schedule(req, pool)
    assert result.primary is not None
    assert [e.key.name for e in result.primary.target_endpoints] == ["b"]
    cycle = CycleState()
    verifier.response_received(cycle, req, ResponseInfo(served_endpoint=pool[1].hostport), pool[1])
    assert cycle.read(RESPONSE_HEADERS_KEY) == {HEADER: "10.0.0.2:8000"}
