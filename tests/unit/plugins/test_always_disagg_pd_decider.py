"""Tests for always-disagg-pd-decider: every request gets a prefill stage."""

from __future__ import annotations

from llm_epp.framework import CycleState, TypedName
from llm_epp.plugins.disagg import always_disagg_pd_decider as mod
from llm_epp.plugins.disagg.common import Decider
from tests.unit.builders import FakeHandle, request
from tests.unit.plugins.disagg_support import pod


def test_always_says_yes() -> None:
    decider = mod.factory("a", mod.Params(), FakeHandle())
    assert isinstance(decider, Decider)
    assert decider.disaggregate(CycleState(), request(), pod("d", "decode", "10.0.0.1"))
    assert decider.disaggregate(CycleState(), request(), None)
    assert decider.typed_name == TypedName("always-disagg-pd-decider", "a")
