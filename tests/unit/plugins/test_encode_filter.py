"""Tests for encode-filter: encoder roles pass; pods without the role label do not."""

from __future__ import annotations

from llm_epp.framework import CycleState, TypedName
from llm_epp.plugins.disagg import encode_filter as mod
from tests.unit.builders import FakeHandle, names, request
from tests.unit.plugins.test_decode_filter import _pods


def test_keeps_exactly_the_encoder_roles() -> None:
    kept = mod.factory("e", mod.Params(), FakeHandle()).filter(CycleState(), request(), _pods())
    assert names(kept) == ["encode", "encode-prefill", "encode-prefill-decode"]


def test_identity() -> None:
    assert mod.EncodeFilter("x").typed_name == TypedName("encode-filter", "x")
