"""Tests for request-attribute-reporter: a CEL expression over the response usage becomes response
dynamic metadata (e.g. `envoy.lb` / `x-gateway-inference-request-cost`)."""

from __future__ import annotations

from typing import Any

import pytest

from llm_epp.config.loader import load_config_text
from llm_epp.framework import CycleState, TypedName
from llm_epp.framework.registry import PluginParamsError
from llm_epp.framework.requestcontrol import RESPONSE_METADATA_KEY, ResponseComplete, ResponseInfo, Usage
from llm_epp.plugins import builtin_registry
from llm_epp.plugins.requestcontrol import request_attribute_reporter as mod
from llm_epp.plugins.requestcontrol.request_attribute_reporter import RequestAttributeReporter
from tests.unit.builders import FakeHandle, FakeRecorder, request

COST = "x-gateway-inference-request-cost"


def _reporter(expression: str, condition: str = "", namespace: str | None = None) -> RequestAttributeReporter:
    key: dict[str, str] = {"name": COST}
    if namespace is not None:
        key["namespace"] = namespace
    attr: dict[str, Any] = {"key": key, "expression": expression}
    if condition:
        attr["condition"] = condition
    plugin = builtin_registry().build(mod.TYPE, "cost", {"attributes": [attr]}, FakeHandle())
    assert isinstance(plugin, RequestAttributeReporter)
    return plugin


def _complete(plugin: RequestAttributeReporter, usage: Usage | None) -> dict[str, dict[str, object]] | None:
    cycle = CycleState()
    plugin.response_complete(cycle, request(), ResponseInfo(usage=usage, complete=True), None)
    return cycle.read(RESPONSE_METADATA_KEY)


USAGE = Usage(prompt_tokens=100, completion_tokens=25, total_tokens=125)


@pytest.mark.parametrize(
    ("expression", "condition", "usage", "expected"),
    [
        ("usage.prompt_tokens + usage.completion_tokens", "", USAGE, 125.0),
        ("usage.completion_tokens", "has(usage.completion_tokens)", USAGE, 25.0),
        ("usage.total_tokens * 0.5 + 0.9", "", USAGE, 63.0),
        ("int(usage.prompt_tokens) + 1", "", USAGE, 101.0),
        (
            "usage.prompt_tokens_details.cached_tokens",
            "has(usage.prompt_tokens_details)",
            Usage(10, 1, 11, cached_tokens=8),
            8.0,
        ),
        (
            "usage.prompt_token_details.cached_tokens",
            "has(usage.prompt_token_details)",
            Usage(10, 1, 11, cached_tokens=8),
            8.0,
        ),
        ("usage.prompt_tokens", "usage.prompt_tokens > 1000.0", USAGE, None),
        ("usage.prompt_tokens", "has(usage.prompt_tokens_details)", USAGE, None),
        ("usage.prompt_tokens + 1", "", USAGE, None),
        ("usage.prompt_tokens > 1.0", "", USAGE, None),
        ("usage.completion_tokens - usage.completion_tokens", "", USAGE, None),
        ("usage.prompt_tokens", "", None, None),
        ("usage.completion_tokens - 26.0", "", USAGE, None),
    ],
    ids=[
        "sum",
        "condition-holds",
        "truncated",
        "int-conversion",
        "cached-tokens",
        "cached-tokens-gie-spelling",
        "condition-false",
        "no-details",
        "double-plus-int-is-a-type-error",
        "not-a-number",
        "zero-not-reported",
        "no-usage",
        "minus-one-not-reported",
    ],
)
def test_value(expression: str, condition: str, usage: Usage | None, expected: float | None) -> None:
    metadata = _complete(_reporter(expression, condition), usage)
    assert metadata == (None if expected is None else {"envoy.lb": {COST: expected}})


def test_namespace_and_other_metadata_kept() -> None:
    plugin = _reporter("usage.total_tokens", namespace="acme.billing")
    cycle = CycleState()
    cycle.write(RESPONSE_METADATA_KEY, {"envoy.lb": {"x": 1}})
    plugin.response_complete(cycle, request(), ResponseInfo(usage=USAGE), None)
    assert cycle.read(RESPONSE_METADATA_KEY) == {"envoy.lb": {"x": 1}, "acme.billing": {COST: 125.0}}


@pytest.mark.parametrize(
    ("params", "problem"),
    [
        ({}, "exactly one entry"),
        ({"attributes": []}, "exactly one entry"),
        ({"attributes": [{"key": {"name": "a"}, "expression": "1.0"}] * 2}, "exactly one entry"),
        ({"attributes": [{"key": {"name": ""}, "expression": "1.0"}]}, "attributes.0.key.name"),
        ({"attributes": [{"key": {"name": "a"}, "expression": ""}]}, "attributes.0.expression"),
        ({"attributes": [{"key": {"name": "a"}, "expression": "usage.prompt_tokens +"}]}, "not a valid CEL"),
        ({"attributes": [{"key": {"name": "a"}, "expression": "request.size"}]}, "only the variable 'usage'"),
        ({"attributes": [{"key": {"name": "a"}, "expression": "1.0", "condition": "has("}]}, "attributes.0.condition"),
    ],
    ids=["none", "empty", "two", "no-name", "no-expression", "syntax", "unknown-variable", "bad-condition"],
)
def test_bad_parameters_are_refused_at_load(params: dict[str, Any], problem: str) -> None:
    with pytest.raises(PluginParamsError) as info:
        builtin_registry().parse_params(mod.TYPE, params)
    assert problem in str(info.value) or any(problem in p for p, _ in info.value.problems)


# llm-d-router test/integration/epp/testdata/request-attribute-reporter-config.yaml, without the mock source
CONFIG = """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
  - name: total-tokens-cost-reporter
    type: request-attribute-reporter
    parameters:
      attributes:
        - key:
            namespace: envoy.lb
            name: x-gateway-inference-request-cost
          expression: |
            usage.completion_tokens
          condition: "has(usage.completion_tokens)"
"""


def test_reference_configuration_loads_and_reports() -> None:
    loaded = load_config_text(CONFIG, builtin_registry(), FakeRecorder())
    plugin = loaded.plugins["total-tokens-cost-reporter"]
    assert isinstance(plugin, ResponseComplete)
    assert plugin.typed_name == TypedName(mod.TYPE, "total-tokens-cost-reporter")
    cycle = CycleState()
    plugin.response_complete(cycle, request(), ResponseInfo(usage=USAGE, complete=True), None)
    assert cycle.read(RESPONSE_METADATA_KEY) == {"envoy.lb": {COST: 25.0}}
