"""Tests for prefix-hash-scorer: consistent hashing of the prompt's first characters onto a ring of the
candidates, stable under membership changes, with bounded load on in-flight requests."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from pydantic import ValidationError

from llm_epp.framework import (
    ApiKind,
    CycleState,
    Endpoint,
    EndpointMetadata,
    InferenceRequest,
    InFlightLoad,
    Metrics,
    RequestBody,
    ScorerCategory,
    TypedName,
)
from llm_epp.plugins.scheduling import prefix_hash_scorer as mod
from llm_epp.plugins.scheduling.prefix_hash_scorer import Params, PrefixHashScorer
from tests.unit.builders import FakeHandle, key


def ep(name: str, requests: int = 0) -> Endpoint:
    return Endpoint(EndpointMetadata(key(name), "10.0.5.1", 8000), Metrics(), InFlightLoad(requests))


def pool(n: int) -> list[Endpoint]:
    return [ep(f"e{i}") for i in range(n)]


def completion(prompt: str, model: str = "m", salt: str = "") -> InferenceRequest:
    return InferenceRequest("r", model, model, RequestBody(ApiKind.COMPLETIONS, {"prompt": prompt}, cache_salt=salt))


def chosen(scorer: PrefixHashScorer, request: InferenceRequest, endpoints: list[Endpoint]) -> str | None:
    scores = scorer.score(CycleState(), request, endpoints)
    assert set(scores) == {e.key for e in endpoints}
    winners = [k.name for k, v in scores.items() if v == 1.0]
    assert len(winners) <= 1 and all(v in (0.0, 1.0) for v in scores.values())
    return winners[0] if winners else None


PROMPTS = [f"system prompt {i:04d} " * 20 + "question" for i in range(2000)]


def test_same_prefix_same_endpoint_regardless_of_the_rest() -> None:
    scorer = PrefixHashScorer(prefix_chars=64)
    endpoints = pool(8)
    for prompt in PROMPTS[:50]:
        first = chosen(scorer, completion(prompt[:64] + "tail one"), endpoints)
        assert chosen(scorer, completion(prompt[:64] + "a different tail"), endpoints) == first


def test_keys_spread_over_the_endpoints() -> None:
    scorer = PrefixHashScorer()
    endpoints = pool(8)
    counts = Counter(chosen(scorer, completion(p), endpoints) for p in PROMPTS)
    assert len(counts) == 8
    assert max(counts.values()) < 2.0 * len(PROMPTS) / 8


@pytest.mark.parametrize("n", [4, 8, 16])
def test_adding_one_endpoint_moves_few_keys_and_only_to_it(n: int) -> None:
    scorer = PrefixHashScorer()
    before = {p: chosen(scorer, completion(p), pool(n)) for p in PROMPTS}
    bigger = [*pool(n), ep("new")]
    after = {p: chosen(scorer, completion(p), bigger) for p in PROMPTS}
    moved = [p for p in PROMPTS if before[p] != after[p]]
    assert all(after[p] == "new" for p in moved)
    assert 0 < len(moved) < len(PROMPTS) / 2
    assert len(moved) < 2.5 * len(PROMPTS) / (n + 1)


def test_removing_one_endpoint_moves_only_its_keys() -> None:
    scorer = PrefixHashScorer()
    full = pool(8)
    before = {p: chosen(scorer, completion(p), full) for p in PROMPTS}
    after = {p: chosen(scorer, completion(p), full[:3] + full[4:]) for p in PROMPTS}
    assert {before[p] for p in PROMPTS if before[p] != after[p]} == {"e3"}


def test_ring_is_built_once_per_candidate_set() -> None:
    scorer = PrefixHashScorer()
    endpoints = pool(4)
    chosen(scorer, completion("x"), endpoints)
    ring = scorer.ring(frozenset(e.key for e in endpoints))
    chosen(scorer, completion("y"), list(reversed(endpoints)))
    assert scorer.ring(frozenset(e.key for e in endpoints)) is ring
    for i in range(20):
        chosen(scorer, completion("z"), pool(5 + i))
    assert len(scorer._rings) <= 8


def test_bounded_load_skips_endpoints_over_the_limit() -> None:
    scorer = PrefixHashScorer()
    idle = pool(4)
    prompt = PROMPTS[0]
    home = chosen(scorer, completion(prompt), idle)
    # others at 2, home at 4: (10 + 1) / 4 x 1.25 = 3.44, limit 4, and the home endpoint is at it
    loaded = [ep(e.key.name, 4 if e.key.name == home else 2) for e in idle]
    assert chosen(scorer, completion(prompt), loaded) != home
    # home at 3: (9 + 1) / 4 x 1.25 = 3.125, limit 4, room for one more
    loaded = [ep(e.key.name, 3 if e.key.name == home else 2) for e in idle]
    assert chosen(scorer, completion(prompt), loaded) == home


def test_bounded_load_keeps_the_maximum_within_the_factor() -> None:
    scorer = PrefixHashScorer(load_factor=1.25)
    loads = {f"e{i}": 0 for i in range(8)}
    for _ in range(400):  # one hot prefix, nothing ever completes
        endpoints = [ep(n, r) for n, r in loads.items()]
        name = chosen(scorer, completion("hot prefix " * 30), endpoints)
        assert name is not None
        loads[name] += 1
        total = sum(loads.values())
        assert max(loads.values()) <= -(-1.25 * total // 8)


def test_a_large_load_factor_turns_the_bound_off() -> None:
    scorer = PrefixHashScorer(load_factor=1e9)
    endpoints = pool(4)
    home = chosen(scorer, completion("p"), endpoints)
    busy = [ep(e.key.name, 100 if e.key.name == home else 0) for e in endpoints]
    assert chosen(scorer, completion("p"), busy) == home


@pytest.mark.parametrize(
    ("a", "b"),
    [(completion("same", model="m1"), completion("same", model="m2")), (completion("s"), completion("s", salt="x"))],
    ids=["model", "salt"],
)
def test_model_and_salt_are_part_of_the_key(a: InferenceRequest, b: InferenceRequest) -> None:
    scorer = PrefixHashScorer()
    assert scorer.request_key(a) != scorer.request_key(b)


def test_only_the_first_prefix_chars_count() -> None:
    scorer = PrefixHashScorer(prefix_chars=10)
    assert scorer.request_key(completion("0123456789abc")) == scorer.request_key(completion("0123456789xyz"))
    assert scorer.request_key(completion("0123456789")) != scorer.request_key(completion("012345678"))


def test_edge_cases() -> None:
    scorer = PrefixHashScorer()
    assert scorer.score(CycleState(), completion("x"), []) == {}
    assert chosen(scorer, completion("x"), [ep("only", 50)]) == "only"
    assert chosen(scorer, completion(""), pool(3)) is None  # no prompt text: no preference
    assert scorer.request_key(completion("")) is None


def test_chat_requests_hash_their_messages() -> None:
    scorer = PrefixHashScorer()
    body = RequestBody(ApiKind.CHAT_COMPLETIONS, {"messages": [{"role": "system", "content": "S" * 300}]})
    req = InferenceRequest("r", "m", "m", body)
    assert chosen(scorer, req, pool(4)) is not None


@pytest.mark.parametrize(
    ("raw", "expected"),
    [({}, (256, 1.25, 100)), ({"prefixChars": 64, "loadFactor": 2, "virtualNodes": 10}, (64, 2.0, 10))],
)
def test_params(raw: dict[str, Any], expected: tuple[int, float, int]) -> None:
    scorer = mod.factory("h", Params.model_validate(raw), FakeHandle())
    assert (scorer.prefix_chars, scorer.load_factor, scorer.virtual_nodes) == expected
    assert scorer.typed_name == TypedName("prefix-hash-scorer", "h")
    assert scorer.category is ScorerCategory.AFFINITY


@pytest.mark.parametrize(
    "raw",
    [{"prefixChars": 0}, {"loadFactor": 0.9}, {"virtualNodes": 0}, {"replicas": 3}],
    ids=["no-chars", "factor-below-1", "no-vnodes", "unknown"],
)
def test_invalid_params_are_rejected(raw: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        Params.model_validate(raw)


def test_endpoint_identity_not_address_places_the_points() -> None:
    a = Endpoint(EndpointMetadata(key("a"), "10.0.0.1", 8000), Metrics())
    a_moved = Endpoint(EndpointMetadata(key("a"), "10.9.9.9", 9000), Metrics())
    scorer = PrefixHashScorer()
    b = ep("b")
    assert all(
        chosen(scorer, completion(p), [a, b]) == chosen(scorer, completion(p), [a_moved, b]) for p in PROMPTS[:50]
    )
