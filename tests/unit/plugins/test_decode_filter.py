"""Tests for decode-filter: decode-capable roles and pods without the role label pass."""

from __future__ import annotations

import pytest

from llm_epp.framework import CycleState, Endpoint, TypedName
from llm_epp.plugins.disagg import decode_filter as mod
from tests.unit.builders import FakeHandle, names, request
from tests.unit.plugins.disagg_support import pod

ALL_ROLES = ["decode", "prefill", "encode", "prefill-decode", "encode-prefill", "encode-prefill-decode", "both", "x"]


def _pods() -> list[Endpoint]:
    eps = [pod(role, role, f"10.0.1.{i}") for i, role in enumerate(ALL_ROLES, start=1)]
    eps.append(pod("unlabelled", None, "10.0.1.99"))
    return eps


def test_keeps_decode_roles_and_unlabelled_pods_in_order() -> None:
    f = mod.factory("d", mod.Params(), FakeHandle())
    kept = f.filter(CycleState(), request(), _pods())
    assert names(kept) == ["decode", "prefill-decode", "encode-prefill-decode", "both", "unlabelled"]


def test_nothing_passing_gives_an_empty_result() -> None:
    f = mod.DecodeFilter("d")
    assert list(f.filter(CycleState(), request(), [pod("p", "prefill", "10.0.0.1")])) == []


@pytest.mark.parametrize("value", ["Decode", " decode", ""])
def test_values_match_exactly(value: str) -> None:
    assert list(mod.DecodeFilter("d").filter(CycleState(), request(), [pod("p", value, "10.0.0.1")])) == []


def test_identity_and_no_parameters() -> None:
    assert mod.factory("x", mod.Params(), FakeHandle()).typed_name == TypedName("decode-filter", "x")
    with pytest.raises(ValueError):
        mod.Params.model_validate({"label": "llm-d.ai/role"})
