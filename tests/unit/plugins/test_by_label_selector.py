"""Tests for by-label-selector, the deprecated llm-d alias of label-selector-filter."""

from __future__ import annotations

import pytest

from llm_epp.framework import CycleState, Filter, TypedName
from llm_epp.plugins.scheduling import by_label_selector as mod
from llm_epp.plugins.scheduling import label_selector_filter
from tests.unit.builders import FakeHandle, endpoint, names, request

POOL = [
    endpoint("p", address="10.0.0.1", labels={"role": "prefill"}),
    endpoint("d", address="10.0.0.2", labels={"role": "decode"}),
    endpoint("x", address="10.0.0.3"),
]


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ({}, ["p", "d", "x"]),
        ({"matchLabels": {"role": "decode"}}, ["d"]),
        ({"matchExpressions": [{"key": "role", "operator": "NotIn", "values": ["decode"]}]}, ["p", "x"]),
        ({"matchExpressions": [{"key": "role", "operator": "DoesNotExist"}]}, ["x"]),
    ],
    ids=["empty", "match-labels", "not-in", "does-not-exist"],
)
def test_behaves_like_label_selector_filter(raw: dict[str, object], expected: list[str]) -> None:
    alias = mod.factory("a", mod.Params.model_validate(raw), FakeHandle())
    same = label_selector_filter.factory("s", label_selector_filter.Params.model_validate(raw), FakeHandle())
    assert names(alias.filter(CycleState(), request(), POOL)) == expected
    assert names(same.filter(CycleState(), request(), POOL)) == expected


def test_no_candidates() -> None:
    assert mod.factory("a", mod.Params(), FakeHandle()).filter(CycleState(), request(), []) == []


def test_shares_the_params_model_and_keeps_its_own_type_name() -> None:
    assert mod.Params is label_selector_filter.Params
    plugin = mod.factory("legacy", mod.Params(), FakeHandle())
    assert plugin.typed_name == TypedName("by-label-selector", "legacy")
    assert type(plugin).__name__ == "ByLabelSelector"
    assert isinstance(plugin, Filter)
