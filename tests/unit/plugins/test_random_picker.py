"""Tests for the random-picker plugin: uniform choice among candidates, scores ignored."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from pydantic import ValidationError

from llm_epp.framework import CycleState, TypedName
from llm_epp.plugins.scheduling import random_picker as mod
from llm_epp.plugins.scheduling.random_picker import Params, RandomPicker
from tests.unit.builders import FakeHandle, names, scored


@pytest.mark.parametrize(
    ("candidates", "max_endpoints", "expected_len"),
    [
        ([], 1, 0),
        ([], 2, 0),
        ([("a", 0.0)], 1, 1),
        ([("a", 0.0)], 5, 1),
        ([("a", 0.1), ("b", 0.2), ("c", 0.3)], 1, 1),
        ([("a", 0.1), ("b", 0.2), ("c", 0.3)], 2, 2),
        ([("a", 0.1), ("b", 0.2), ("c", 0.3)], 3, 3),
        ([("a", 0.1), ("b", 0.2), ("c", 0.3)], 9, 3),
    ],
    ids=["none", "none-many", "one", "one-many", "pick-one", "pick-two", "pick-all", "more-than-candidates"],
)
def test_pick_returns_distinct_candidates(
    candidates: list[tuple[str, float]], max_endpoints: int, expected_len: int
) -> None:
    picker = RandomPicker(max_endpoints=max_endpoints, rng=random.Random(5))
    result = picker.pick(CycleState(), scored(*candidates))
    got = names(result.target_endpoints)
    assert len(got) == expected_len
    assert len(set(got)) == expected_len
    assert set(got) <= {n for n, _ in candidates}


@pytest.mark.parametrize("max_endpoints", [1, 2], ids=["one", "two"])
def test_scores_are_ignored_and_every_candidate_is_chosen(max_endpoints: int) -> None:
    picker = RandomPicker(max_endpoints=max_endpoints, rng=random.Random(11))
    candidates = scored(("low", 0.0), ("mid", 0.5), ("high", 1.0))
    firsts: Counter[str] = Counter()
    for _ in range(300):
        firsts[names(picker.pick(CycleState(), candidates).target_endpoints)[0]] += 1
    assert set(firsts) == {"low", "mid", "high"}


@pytest.mark.parametrize(
    ("raw", "expected"),
    [(None, 1), ({"maxNumOfEndpoints": 4}, 4)],
    ids=["default", "camel-case"],
)
def test_params(raw: dict[str, int] | None, expected: int) -> None:
    assert Params.model_validate(raw or {}).max_num_of_endpoints == expected


@pytest.mark.parametrize("raw", [{"maxNumOfEndpoints": 0}, {"count": 2}], ids=["zero", "unknown-key"])
def test_bad_params_are_rejected(raw: dict[str, int]) -> None:
    with pytest.raises(ValidationError):
        Params.model_validate(raw)


def test_factory_uses_name_and_params() -> None:
    picker = mod.factory("spread", Params.model_validate({"maxNumOfEndpoints": 2}), FakeHandle())
    assert picker.typed_name == TypedName("random-picker", "spread")
    result = picker.pick(CycleState(), scored(("a", 0.1), ("b", 0.9), ("c", 0.5)))
    assert len(result.target_endpoints) == 2
