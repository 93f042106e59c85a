"""Tests for header-label-affinity-scorer: endpoints whose label equals the request header score 1."""

from __future__ import annotations

import pytest

from llm_epp.framework import CycleState, ScorerCategory, TypedName
from llm_epp.framework.registry import PluginParamsError
from llm_epp.plugins import builtin_registry
from llm_epp.plugins.scheduling import header_label_affinity_scorer as mod
from llm_epp.plugins.scheduling.header_label_affinity_scorer import HeaderLabelAffinityScorer, Params
from tests.unit.builders import FakeHandle, endpoint, request

ZONE = "topology.kubernetes.io/zone"
POOL = [
    endpoint("a", address="10.0.0.1", labels={ZONE: "east"}),
    endpoint("b", address="10.0.0.2", labels={ZONE: "west"}),
    endpoint("c", address="10.0.0.3"),
]


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"x-preferred-zone": "west"}, [0.0, 1.0, 0.0]),
        ({"x-preferred-zone": "north"}, [0.0, 0.0, 0.0]),
        ({"x-preferred-zone": ""}, [0.0, 0.0, 0.0]),
        ({}, [0.0, 0.0, 0.0]),
    ],
    ids=["match", "unknown-value", "empty-header", "no-header"],
)
def test_score(headers: dict[str, str], expected: list[float]) -> None:
    scorer = HeaderLabelAffinityScorer("z", Params(header_name="X-Preferred-Zone", label_key=ZONE))
    scores = scorer.score(CycleState(), request(headers=headers), POOL)
    assert [scores[e.key] for e in POOL] == expected


@pytest.mark.parametrize(
    "raw",
    [{}, {"headerName": "x"}, {"labelKey": "k"}, {"headerName": "", "labelKey": "k"}],
    ids=["none", "no-label", "no-header", "empty-header"],
)
def test_both_parameters_are_required(raw: dict[str, str]) -> None:
    with pytest.raises(PluginParamsError):
        builtin_registry().parse_params(mod.TYPE, raw)


def test_built_from_reference_yaml() -> None:
    raw = {"headerName": "x-disagg-slice", "labelKey": "disaggregatedset.x-k8s.io/slice"}
    scorer = builtin_registry().build(mod.TYPE, "slice-affinity", raw, FakeHandle())
    assert scorer.typed_name == TypedName(mod.TYPE, "slice-affinity")
    assert isinstance(scorer, HeaderLabelAffinityScorer)
    assert scorer.category is ScorerCategory.AFFINITY
