"""The director: in-flight accounting, shedding, objectives and rewrites, dry runs, hook pairing."""

from __future__ import annotations

import json
from collections.abc import Sequence

import pytest

from llm_epp.config import load_config_text
from llm_epp.datalayer import Datastore
from llm_epp.datalayer.static import parse_endpoint_list
from llm_epp.framework import CycleState, Endpoint, EppError, InferenceRequest, TypedName
from llm_epp.framework.requestcontrol import ResponseInfo
from llm_epp.framework.types import EndpointKey, SchedulingResult
from llm_epp.plugins import builtin_registry
from llm_epp.requestcontrol.director import Director, DirectorOptions, RequestPlugins, estimate_tokens
from llm_epp.requestcontrol.lifecycle import RequestRecord
from tests.unit.builders import FakeRecorder

BODY = json.dumps({"model": "m", "prompt": "hello world"}).encode()


class Hooks:
    """Records every request-control hook call."""

    typed_name = TypedName("hooks", "hooks")

    def __init__(self) -> None:
        self.calls: list[str] = []

    def pre_request(self, cycle: CycleState, request: InferenceRequest, result: SchedulingResult) -> None:
        self.calls.append("pre_request")

    def response_complete(
        self, cycle: CycleState, request: InferenceRequest, response: ResponseInfo, endpoint: Endpoint | None
    ) -> None:
        self.calls.append(f"complete:{response.complete}")


class Saturated:
    typed_name = TypedName("fake-detector", "fake-detector")

    def __init__(self, level: float) -> None:
        self.level = level

    def saturation(self, endpoints: Sequence[Endpoint]) -> float:
        return self.level


class StaticObjectives:
    def priority(self, objective: str) -> int | None:
        return {"batch": -1, "critical": 10}.get(objective)

    def rewrite(self, model: str) -> tuple[str, str] | None:
        return ("m-v2", "canary") if model == "m" else None


def make(endpoints: str = "10.0.0.1:8000,10.0.0.2:8000", saturation: float | None = None, **opts: object):
    ds = Datastore()
    ds.replace_all(parse_endpoint_list(endpoints))
    rec = FakeRecorder()
    hooks = Hooks()
    config = load_config_text(None, builtin_registry(), rec)
    director = Director(
        ds.snapshot,
        config.scheduler,
        RequestPlugins(pre_request=[hooks], response_complete=[hooks]),
        rec,
        DirectorOptions(**opts),  # type: ignore[arg-type]
        saturation=Saturated(saturation) if saturation is not None else None,
    )
    return ds, director, rec, hooks


def record(**headers: str) -> RequestRecord:
    return RequestRecord("req-1", {":path": "/v1/completions", **headers})


def total_load(ds: Datastore) -> tuple[int, int]:
    snap = ds.snapshot()
    return sum(e.load.requests for e in snap), sum(e.load.tokens for e in snap)


async def test_pick_reserves_and_finish_releases_exactly_once() -> None:
    ds, director, rec, hooks = make()
    r = record()
    await director.handle_request(r, BODY, None)
    assert r.endpoint is not None and r.endpoint.load.requests == 1
    assert total_load(ds) == (1, estimate_tokens(len(BODY)))
    director.finish(r, complete=True)
    director.finish(r, complete=False)  # a second end (e.g. cancel after completion) changes nothing
    assert total_load(ds) == (0, 0)
    assert hooks.calls == ["pre_request", "complete:True"]
    assert rec.running == [("m", 1), ("m", -1)]


async def test_load_is_a_fresh_signal_for_the_next_pick() -> None:
    ds, director, _, _ = make()
    records = [record() for _ in range(6)]
    for r in records:
        await director.handle_request(r, BODY, None)
    # metrics are equal (never scraped), so only in-flight load differs: the default scorers tie, and
    # the EPP's own counts show exactly what it sent.
    assert sorted(e.load.requests for e in ds.snapshot()) == sorted(
        [sum(1 for r in records if r.endpoint and r.endpoint.key == e.key) for e in ds.snapshot()]
    )
    assert total_load(ds)[0] == 6


async def test_release_never_goes_negative_when_the_endpoint_leaves_mid_request() -> None:
    ds, director, _, _ = make("10.0.0.1:8000")
    r = record()
    await director.handle_request(r, BODY, None)
    ds.clear()
    ds.replace_all(parse_endpoint_list("10.0.0.1:8000"))  # same endpoint comes back: a fresh counter
    director.finish(r, complete=False)
    assert total_load(ds) == (0, 0)
    assert r.endpoint is not None and r.endpoint.load.requests == 0  # the detached counter, released once


async def test_dry_run_reserves_nothing_and_runs_no_hooks() -> None:
    ds, director, rec, hooks = make()
    r = record()
    await director.handle_request(r, BODY, None, dry_run=True)
    assert r.destination
    assert total_load(ds) == (0, 0)
    assert hooks.calls == [] and rec.running == []
    director.finish(r, complete=True)
    assert hooks.calls == []


@pytest.mark.parametrize(
    ("objective", "saturation", "shed"),
    [
        ("batch", 1.0, True),
        ("batch", 0.99, False),
        ("critical", 5.0, False),
        ("", 5.0, False),
        ("unknown-objective", 5.0, False),
    ],
    ids=["sheddable-saturated", "sheddable-not-saturated", "priority-10", "no-objective", "unknown-objective"],
)
async def test_legacy_admission_sheds_only_sheddable_requests(objective: str, saturation: float, shed: bool) -> None:
    ds, director, rec, _ = make(saturation=saturation, objectives=StaticObjectives())
    r = record(**({"x-gateway-inference-objective": objective} if objective else {}))
    if shed:
        with pytest.raises(EppError) as err:
            await director.handle_request(r, BODY, None)
        assert err.value.code.http_status == 429
        assert "sheddable" in err.value.message
        assert total_load(ds) == (0, 0)
        assert rec.request_errors[-1][2] == "ResourceExhausted"
    else:
        await director.handle_request(r, BODY, None)
        assert r.destination


async def test_objective_priority_and_rewrite_rule() -> None:
    _, director, rec, _ = make(objectives=StaticObjectives())
    r = record(**{"x-gateway-inference-objective": "critical"})
    await director.handle_request(r, BODY, None)
    assert r.request is not None and r.request.priority == 10
    assert (r.incoming_model, r.target_model) == ("m", "m-v2")
    assert r.body_out is not None and json.loads(r.body_out)["model"] == "m-v2"
    assert rec.rewrites == [("canary", "m", "m-v2")]
    assert rec.scheduled == [("m", "m-v2", 10)]


async def test_rewrite_rules_win_over_the_rewrite_header() -> None:
    _, director, _, _ = make(objectives=StaticObjectives())
    r = record(**{"x-gateway-model-name-rewrite": "from-header"})
    await director.handle_request(r, BODY, None)
    assert r.target_model == "m-v2"


async def test_finish_of_an_unscheduled_request_runs_no_hooks() -> None:
    ds, director, _, hooks = make()
    r = record()
    with pytest.raises(EppError):
        await director.handle_request(r, b"{", None)
    director.finish(r, complete=False)
    assert hooks.calls == []
    assert total_load(ds) == (0, 0)


def test_estimate_tokens_matches_the_reference_formula() -> None:
    assert estimate_tokens(0) == 1 + 2  # max(0/4, 1) = 1, plus round(1.5)
    assert estimate_tokens(400) == 100 + 150
    assert estimate_tokens(12) == 3 + 5  # 4.5 rounds half away from zero, as in Go
    assert EndpointKey("ns", "a") < EndpointKey("ns", "b")
