"""Tests for the concurrency-detector plugin: saturation = total in-flight / (N x capacity) from the core's
in-flight load; as a filter, endpoints under int(capacity x (1 + headroom)), with no fail-open."""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

import pytest
from pydantic import ValidationError

from llm_epp.framework import CycleState, Endpoint, Filter, InFlightLoad, TypedName
from llm_epp.framework.flowcontrol import SaturationDetector
from llm_epp.plugins.scheduling import concurrency_detector as mod
from llm_epp.plugins.scheduling.concurrency_detector import ConcurrencyDetector, Params
from tests.unit.builders import FakeHandle, endpoint, names, request


def _ep(name: str, requests: int = 0, tokens: int = 0, updated: float = 1.0) -> Endpoint:
    ep = endpoint(name, updated=updated, address=f"10.0.{len(name)}.{sum(map(ord, name)) % 250}")
    return replace(ep, load=InFlightLoad(requests, tokens))


@pytest.mark.parametrize(
    ("eps", "mode", "expected"),
    [
        ([], "requests", 1.0),
        ([], "tokens", 1.0),
        ([_ep("a")], "requests", 0.0),
        ([_ep("a", requests=50)], "requests", 0.5),
        ([_ep("a", requests=100)], "requests", 1.0),
        ([_ep("a", requests=150)], "requests", 1.5),
        ([_ep("a", requests=100), _ep("b")], "requests", 0.5),
        ([_ep("a", requests=30), _ep("b", requests=60), _ep("c", requests=90)], "requests", 0.6),
        ([_ep("a", requests=90, tokens=500_000)], "tokens", 0.5),
        ([_ep("a", tokens=1_000_000), _ep("b", tokens=1_000_000)], "tokens", 1.0),
        ([_ep("a", requests=99, updated=0.0)], "requests", 0.99),
    ],
    ids=[
        "no-endpoints-requests",
        "no-endpoints-tokens",
        "idle",
        "half",
        "full",
        "over",
        "aggregate-not-mean-of-max",
        "aggregate-three",
        "tokens-mode-ignores-requests",
        "tokens-full",
        "metrics-staleness-does-not-matter",
    ],
)
def test_saturation(eps: list[Endpoint], mode: Any, expected: float) -> None:
    assert ConcurrencyDetector(mode=mode).saturation(eps) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("eps", "kw", "expected"),
    [
        ([], {}, []),
        ([_ep("a", requests=99)], {}, ["a"]),
        ([_ep("a", requests=100)], {}, []),
        ([_ep("a", requests=99), _ep("b", requests=100), _ep("c")], {}, ["a", "c"]),
        ([_ep("a", requests=119), _ep("b", requests=120)], {"headroom": 0.2}, ["a"]),
        ([_ep("a", requests=10), _ep("b", requests=11)], {"max_concurrency": 10, "headroom": 0.15}, ["a"]),
        (
            [_ep("a", tokens=119), _ep("b", tokens=120)],
            {"mode": "tokens", "max_token_concurrency": 100, "headroom": 0.2},
            ["a"],
        ),
        ([_ep("a", requests=500, tokens=0)], {"mode": "tokens"}, ["a"]),
        ([_ep("a", requests=100), _ep("b", requests=200)], {}, []),
    ],
    ids=[
        "no-candidates",
        "one-under-limit",
        "one-at-limit",
        "limit-is-strict",
        "headroom",
        "limit-truncates-to-int",
        "tokens-headroom",
        "tokens-mode-ignores-requests",
        "no-fail-open",
    ],
)
def test_filter(eps: list[Endpoint], kw: dict[str, Any], expected: list[str]) -> None:
    assert names(ConcurrencyDetector(**kw).filter(CycleState(), request(), eps)) == expected


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (None, ("requests", 100, 1000000, 0.0)),
        (
            {"concurrencyMode": "tokens", "maxConcurrency": 8, "maxTokenConcurrency": 4096, "headroom": 0.5},
            ("tokens", 8, 4096, 0.5),
        ),
        ({"max_concurrency": 3}, ("requests", 3, 1000000, 0.0)),
    ],
    ids=["defaults", "reference-keys", "snake-case"],
)
def test_params(raw: dict[str, Any] | None, expected: tuple[str, int, int, float]) -> None:
    p = Params.model_validate(raw or {})
    assert (p.concurrency_mode, p.max_concurrency, p.max_token_concurrency, p.headroom) == expected


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({"concurrencyMode": "bytes"}, "concurrencyMode"),
        ({"maxConcurrency": 0}, "maxConcurrency"),
        ({"maxTokenConcurrency": -5}, "maxTokenConcurrency"),
        ({"headroom": -0.5}, "headroom"),
    ],
    ids=["bad-mode", "zero-concurrency", "negative-token-concurrency", "negative-headroom"],
)
def test_bad_params_are_rejected_by_name(raw: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as info:
        Params.model_validate(raw)
    assert field in str(info.value)


def test_factory_uses_the_mode_capacity() -> None:
    raw = {"concurrencyMode": "tokens", "maxConcurrency": 1, "maxTokenConcurrency": 200}
    detector = mod.factory("c", Params.model_validate(raw), FakeHandle())
    assert detector.saturation([_ep("a", requests=5, tokens=100)]) == 0.5


def test_high_headroom_warns(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        mod.factory("c", Params(headroom=3), FakeHandle())
    assert "concurrency_detector_high_headroom" in caplog.text


def test_identity_and_extension_points() -> None:
    detector = mod.factory("conc", Params(), FakeHandle())
    assert detector.typed_name == TypedName("concurrency-detector", "conc")
    assert isinstance(detector, Filter)
    assert isinstance(detector, SaturationDetector)


def test_in_flight_load_producer_name_reads_the_core_in_flight_account() -> None:
    """Every producer name refers to the one in-flight account the core keeps: same plugin, same answers."""
    from llm_epp.plugins import builtin_registry
    from tests.unit.builders import FakeHandle as _Handle

    registry = builtin_registry()
    named = registry.build("concurrency-detector", "x", {"inFlightLoadProducerName": "my-load"}, _Handle())
    plain = registry.build("concurrency-detector", "x", None, _Handle())
    assert type(named) is type(plain)
    assert {k: v for k, v in vars(named).items() if k != "_typed_name"} == {
        k: v for k, v in vars(plain).items() if k != "_typed_name"
    }
