from __future__ import annotations

import dataclasses

import pytest

from llm_epp.framework import CycleState
from llm_epp.framework.registry import PluginParamsError
from llm_epp.framework.requestcontrol import ResponseInfo, Usage
from llm_epp.plugins import builtin_registry
from llm_epp.plugins.flowcontrol.program_aware_fairness import ProgramAwareFairness
from tests.unit.builders import FakeHandle, request
from tests.unit.flowcontrol.queueing import band, drain, item


def _policy(handle: FakeHandle, **params: object) -> ProgramAwareFairness:
    built = builtin_registry().build("program-aware-fairness", "paf", params or None, handle)
    assert isinstance(built, ProgramAwareFairness)
    return built


def _complete(p: ProgramAwareFairness, program: str, prompt: int, completion: int, complete: bool = True) -> None:
    r = dataclasses.replace(request(), fairness_id=program)
    p.response_complete(
        CycleState(), r, ResponseInfo(status=200, usage=Usage(prompt, completion), complete=complete), None
    )


def test_the_program_with_the_least_attained_service_goes_first() -> None:
    handle = FakeHandle()
    p = _policy(handle)
    _complete(p, "heavy", 1000, 1000)  # 3000 weighted tokens
    _complete(p, "light", 10, 5)  # 20
    assert p.service("heavy") == 3000 and p.service("light") == 20
    b = band(fairness=p)
    b.add(item("h1", flow="heavy", enqueued_at=0.0))  # waited longest, but served the most
    b.add(item("l1", flow="light", enqueued_at=5.0))
    b.add(item("n1", flow="new", enqueued_at=9.0))
    # light: 0.8 x (1 - 20/3000) + 0.2 x (1 - 5/9) = 0.88; new: 0.8 x 1 + 0.2 x 0 = 0.8; heavy: 0 + 0.2 x 1
    assert drain(b) == ["l1", "n1", "h1"], "the heavy program waits although its request is the oldest"


def test_the_head_age_breaks_ties() -> None:
    b = band(fairness=_policy(FakeHandle()))
    b.add(item("young", flow="a", enqueued_at=5.0))
    b.add(item("old", flow="b", enqueued_at=1.0))
    assert drain(b)[0] == "old"


def test_attained_service_decays_by_its_half_life() -> None:
    handle = FakeHandle()
    p = _policy(handle, lasHalfLifeSeconds=10)
    _complete(p, "a", 100, 0)
    handle.clock = 20.0
    assert p.service("a") == pytest.approx(25.0)
    never = _policy(FakeHandle(), lasHalfLifeSeconds=0)
    _complete(never, "a", 100, 0)
    assert never.service("a", now=1e6) == 100


def test_incomplete_responses_add_nothing_and_idle_programs_are_forgotten() -> None:
    handle = FakeHandle()
    p = _policy(handle, evictionTtlSeconds=100, evictionSweepSeconds=1)
    _complete(p, "cut", 100, 100, complete=False)
    assert "cut" not in p.programs
    _complete(p, "old", 1, 1)
    handle.clock = 500.0
    _complete(p, "recent", 1, 1)
    assert set(p.programs) == {"recent"}


def test_bad_parameters_are_refused() -> None:
    for params in ({"strategy": "wfq"}, {"evictionSweepSeconds": 0}, {"lasWeightService": -1}):
        with pytest.raises(PluginParamsError):
            builtin_registry().build("program-aware-fairness", "p", params, FakeHandle())
