"""Tests for the deprecated by-label filter (llm-d): one label, a set of valid values, optionally pods
without the label."""

from __future__ import annotations

import logging

import pytest
from pydantic import ValidationError

from llm_epp.framework import CycleState, Filter, TypedName
from llm_epp.plugins.scheduling import by_label as mod
from llm_epp.plugins.scheduling.by_label import ByLabel, Params
from tests.unit.builders import FakeHandle, endpoint, names, request

POOL = [
    endpoint("p", address="10.0.0.1", labels={"llm-d.ai/role": "prefill"}),
    endpoint("d", address="10.0.0.2", labels={"llm-d.ai/role": "decode"}),
    endpoint("b", address="10.0.0.3", labels={"llm-d.ai/role": "both"}),
    endpoint("e", address="10.0.0.4", labels={"llm-d.ai/role": ""}),
    endpoint("none", address="10.0.0.5"),
]


@pytest.mark.parametrize(
    ("label", "valid", "allow_missing", "expected"),
    [
        ("llm-d.ai/role", ["decode", "both"], False, ["d", "b"]),
        ("llm-d.ai/role", ["decode", "both"], True, ["d", "b", "none"]),
        ("llm-d.ai/role", [], True, ["none"]),
        ("llm-d.ai/role", [], False, []),
        ("llm-d.ai/role", ["encode"], False, []),
        ("llm-d.ai/role", [""], False, ["e", "none"]),
        ("other", ["x"], True, ["p", "d", "b", "e", "none"]),
    ],
    ids=[
        "valid-values",
        "valid-values-or-unlabelled",
        "only-unlabelled",
        "nothing-valid",
        "no-match-no-fail-open",
        "empty-value-matches-missing-label",
        "label-nobody-has",
    ],
)
def test_filter(label: str, valid: list[str], allow_missing: bool, expected: list[str]) -> None:
    plugin = ByLabel(label=label, valid_values=valid, allows_no_label=allow_missing)
    assert names(plugin.filter(CycleState(), request(), POOL)) == expected


def test_no_candidates() -> None:
    assert ByLabel(label="x", allows_no_label=True).filter(CycleState(), request(), []) == []


def test_one_candidate() -> None:
    assert names(
        ByLabel(label="llm-d.ai/role", valid_values=["decode"]).filter(CycleState(), request(), POOL[1:2])
    ) == ["d"]


def test_params_use_the_llm_d_keys() -> None:
    raw = {"label": "llm-d.ai/role", "validValues": ["decode"], "allowsNoLabel": True}
    plugin = mod.factory("decode", Params.model_validate(raw), FakeHandle())
    assert names(plugin.filter(CycleState(), request(), POOL)) == ["d", "none"]


def test_default_params_build_and_warn(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        plugin = mod.factory("bl", Params(), FakeHandle())
    assert "by_label_without_label" in caplog.text
    assert names(plugin.filter(CycleState(), request(), POOL)) == []


@pytest.mark.parametrize(
    "raw",
    [{"label": 3}, {"validValues": "decode"}, {"allowsNoLabel": "maybe"}, {"valid_value": ["x"]}],
    ids=["label-not-string", "values-not-list", "allows-not-bool", "misspelt"],
)
def test_bad_params_are_rejected(raw: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        Params.model_validate(raw)


def test_identity() -> None:
    plugin = mod.factory("bl", Params(label="x"), FakeHandle())
    assert plugin.typed_name == TypedName("by-label", "bl")
    assert isinstance(plugin, Filter)
