"""Tests for context-length-aware: range labels, scores in and out of range, optional filtering."""

from __future__ import annotations

import pytest

from llm_epp.framework import CycleState, Endpoint, ScorerCategory
from llm_epp.plugins.disagg import context_length_aware as mod
from tests.unit.builders import FakeHandle, endpoint, key, names
from tests.unit.plugins.disagg_support import prompt_request

LABEL = "llm-d.ai/context-length-range"


def _pods() -> list[Endpoint]:
    return [
        endpoint("short", labels={LABEL: "0-2048"}),
        endpoint("long", labels={LABEL: "2048-32768"}),
        endpoint("point", labels={LABEL: "1000-1000"}),
        endpoint("none"),
        endpoint("bad", labels={LABEL: "lots"}),
    ]


def test_scores_follow_the_upstream_formula() -> None:
    scorer = mod.factory("c", mod.Params(), FakeHandle())
    scores = scorer.score(CycleState(), prompt_request(1000 * 4), _pods())  # 1000 tokens
    short = 0.3 + (0.7 * (1 / (1 + 2048 / 10000)) + 0.3 * (2048 - 1000) / 2048) * 0.7
    assert scores[key("short")] == pytest.approx(short)
    assert scores[key("long")] == pytest.approx(0.3 / (1 + 1048 / 1000))
    assert scores[key("point")] == 1.0
    assert scores[key("none")] == 0.5
    assert scores[key("bad")] == 0.0
    assert scorer.category is ScorerCategory.AFFINITY


def test_filter_only_when_enabled() -> None:
    off = mod.ContextLengthAware("c")
    assert names(off.filter(CycleState(), prompt_request(4000), _pods())) == ["short", "long", "point", "none", "bad"]
    on = mod.factory("c", mod.Params.model_validate({"enableFiltering": True}), FakeHandle())
    assert names(on.filter(CycleState(), prompt_request(4000), _pods())) == ["short", "point", "none"]
    assert names(on.filter(CycleState(), prompt_request(4 * 5000), _pods())) == ["long", "none"]


@pytest.mark.parametrize("value", ["5-1", "1-2-3", "a-b", "", "7"])
def test_malformed_ranges(value: str) -> None:
    assert mod.parse_range(value) is None


def test_custom_label_and_empty_label_rejected() -> None:
    scorer = mod.factory("c", mod.Params.model_validate({"label": "tier"}), FakeHandle())
    scores = scorer.score(CycleState(), prompt_request(40), [endpoint("a", labels={"tier": "0-100"})])
    assert scores[key("a")] > 0.5
    with pytest.raises(ValueError):
        mod.Params.model_validate({"label": ""})
