from __future__ import annotations

import pytest
from llm_epp_example_plugin.cost_aware_scorer import TYPE, CostAwareScorer, Params

from llm_epp.config import load_config_text
from llm_epp.framework import CycleState, EndpointKey, EndpointMetadata, NullRecorder
from llm_epp.framework.types import ApiKind, Endpoint, InferenceRequest, RequestBody
from llm_epp.plugins import builtin_registry


def ep(name: str, cost: str | None) -> Endpoint:
    labels = {"example.com/cost": cost} if cost is not None else {}
    return Endpoint(EndpointMetadata(EndpointKey("", name), "10.0.0.1", 8000, labels=labels))


REQUEST = InferenceRequest("r", "m", "m", RequestBody(ApiKind.COMPLETIONS))


@pytest.mark.parametrize(
    ("costs", "expected"),
    [
        ({"a": "1", "b": "4"}, {"a": 0.75, "b": 0.0}),
        ({"a": None, "b": "2"}, {"a": 0.5, "b": 0.0}),
        ({"a": "0", "b": "0"}, {"a": 1.0, "b": 1.0}),
        ({"a": "cheap", "b": "2"}, {"a": 0.5, "b": 0.0}),
        ({}, {}),
    ],
    ids=["labelled", "default-cost", "all-free", "not-a-number", "no-candidates"],
)
def test_scores(costs: dict[str, str | None], expected: dict[str, float]) -> None:
    scorer = CostAwareScorer(TYPE, Params())
    scores = scorer.score(CycleState(), REQUEST, [ep(n, c) for n, c in costs.items()])
    assert {k.name: v for k, v in scores.items()} == pytest.approx(expected)


def test_found_through_its_entry_point_by_type_name() -> None:
    config = load_config_text(
        "plugins:\n- type: cost-aware-scorer\n  parameters: {labelKey: tier-cost}\n- type: max-score-picker\n",
        builtin_registry(),
        NullRecorder(),
    )
    plugin = config.plugins["cost-aware-scorer"]
    assert isinstance(plugin, CostAwareScorer)
    assert plugin.params.label_key == "tier-cost"
    assert [s for p in config.profiles for s in p.scorers] == [("cost-aware-scorer", 1.0)]
