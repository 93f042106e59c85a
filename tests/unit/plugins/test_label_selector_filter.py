"""Tests for the label-selector-filter plugin (llm-d): Kubernetes label-selector semantics over endpoint
labels; an empty selector keeps everything; no fail-open."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from llm_epp.framework import CycleState, Filter, TypedName
from llm_epp.plugins.scheduling import label_selector_filter as mod
from llm_epp.plugins.scheduling.label_selector_filter import LabelSelectorFilter, Params
from tests.unit.builders import FakeHandle, endpoint, names, request

POOL = [
    endpoint("prefill-0", address="10.0.0.1", labels={"llm-d.ai/role": "prefill", "tier": "fast"}),
    endpoint("decode-0", address="10.0.0.2", labels={"llm-d.ai/role": "decode", "tier": "fast"}),
    endpoint("decode-1", address="10.0.0.3", labels={"llm-d.ai/role": "decode", "tier": "slow"}),
    endpoint("plain", address="10.0.0.4"),
]


def _run(raw: dict[str, Any] | None, pool: list[Any] = POOL) -> list[str]:
    plugin = mod.factory("f", Params.model_validate(raw or {}), FakeHandle())
    return names(plugin.filter(CycleState(), request(), pool))


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (None, ["prefill-0", "decode-0", "decode-1", "plain"]),
        ({"matchLabels": {"llm-d.ai/role": "decode"}}, ["decode-0", "decode-1"]),
        ({"matchLabels": {"llm-d.ai/role": "decode", "tier": "fast"}}, ["decode-0"]),
        ({"matchLabels": {"llm-d.ai/role": "encode"}}, []),
        (
            {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["fast", "medium"]}]},
            ["prefill-0", "decode-0"],
        ),
        (
            {"matchExpressions": [{"key": "llm-d.ai/role", "operator": "NotIn", "values": ["prefill"]}]},
            ["decode-0", "decode-1", "plain"],
        ),
        ({"matchExpressions": [{"key": "tier", "operator": "Exists"}]}, ["prefill-0", "decode-0", "decode-1"]),
        ({"matchExpressions": [{"key": "tier", "operator": "DoesNotExist"}]}, ["plain"]),
        (
            {
                "matchLabels": {"llm-d.ai/role": "decode"},
                "matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["slow"]}],
            },
            ["decode-0"],
        ),
        (
            {
                "matchExpressions": [
                    {"key": "tier", "operator": "Exists"},
                    {"key": "llm-d.ai/role", "operator": "In", "values": ["prefill", "decode"]},
                    {"key": "tier", "operator": "In", "values": ["slow"]},
                ]
            },
            ["decode-1"],
        ),
    ],
    ids=[
        "empty-selector-keeps-all",
        "match-labels",
        "match-labels-and",
        "match-labels-none",
        "in",
        "not-in-includes-unlabelled",
        "exists",
        "does-not-exist",
        "labels-and-expressions",
        "expressions-and",
    ],
)
def test_filter(raw: dict[str, Any] | None, expected: list[str]) -> None:
    assert _run(raw) == expected


def test_no_candidates() -> None:
    assert _run({"matchLabels": {"tier": "fast"}}, []) == []


def test_one_candidate() -> None:
    assert _run({"matchLabels": {"tier": "fast"}}, POOL[:1]) == ["prefill-0"]


def test_a_label_with_an_empty_value_matches_only_the_empty_value() -> None:
    pool = [endpoint("e", address="10.0.0.1", labels={"tier": ""}), endpoint("n", address="10.0.0.2")]
    assert _run({"matchLabels": {"tier": ""}}, pool) == ["e"]


def test_the_request_plays_no_part() -> None:
    plugin = LabelSelectorFilter(match_labels={"tier": "slow"})
    req = request(headers={"tier": "fast"}, model="other")
    assert names(plugin.filter(CycleState(), req, POOL)) == ["decode-1"]


@pytest.mark.parametrize(
    "raw",
    [
        {"matchExpressions": [{"key": "tier", "operator": "In"}]},
        {"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": []}]},
        {"matchExpressions": [{"key": "tier", "operator": "Exists", "values": ["x"]}]},
        {"matchExpressions": [{"key": "tier", "operator": "in", "values": ["x"]}]},
        {"matchExpressions": [{"key": "", "operator": "Exists"}]},
        {"matchExpressions": [{"key": "tier", "operator": "Exists", "value": "x"}]},
        {"matchLabels": {"tier": 1}},
        {"matchLabels": ["tier"]},
    ],
    ids=[
        "in-without-values",
        "not-in-empty-values",
        "exists-with-values",
        "lowercase-operator",
        "empty-key",
        "misspelt-field",
        "non-string-value",
        "labels-not-a-map",
    ],
)
def test_bad_params_are_rejected(raw: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        Params.model_validate(raw)


def test_identity() -> None:
    plugin = mod.factory("decode-pods", Params(), FakeHandle())
    assert plugin.typed_name == TypedName("label-selector-filter", "decode-pods")
    assert isinstance(plugin, Filter)
