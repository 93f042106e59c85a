"""Tests for prefill-filter: prefill-capable roles pass; pods without the role label do not."""

from __future__ import annotations

from llm_epp.framework import CycleState, TypedName
from llm_epp.plugins.disagg import prefill_filter as mod
from tests.unit.builders import FakeHandle, names, request
from tests.unit.plugins.test_decode_filter import _pods


def test_keeps_exactly_the_prefill_capable_roles() -> None:
    kept = mod.factory("p", mod.Params(), FakeHandle()).filter(CycleState(), request(), _pods())
    assert names(kept) == ["prefill", "prefill-decode", "encode-prefill", "encode-prefill-decode", "both"]


def test_identity() -> None:
    assert mod.PrefillFilter("x").typed_name == TypedName("prefill-filter", "x")
