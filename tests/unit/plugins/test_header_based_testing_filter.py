"""Tests for the header-based-testing-filter plugin: keep the endpoints named (IP or IP:port, IPv6 too) in
the `test-epp-endpoint-selection` header; nothing without the header."""

from __future__ import annotations

import pytest

from llm_epp.framework import CycleState, TypedName
from llm_epp.plugins.scheduling import header_based_testing_filter as mod
from llm_epp.plugins.scheduling.header_based_testing_filter import HEADER, HeaderBasedTestingFilter, Params
from tests.unit.builders import FakeHandle, endpoint, names, request

POOL = [
    endpoint("v4-a", address="10.0.0.1", port=8000),
    endpoint("v4-a-rank1", address="10.0.0.1", port=8001),
    endpoint("v4-b", address="10.0.0.2", port=8000),
    endpoint("v6-a", address="fd00::1", port=8000),
    endpoint("v6-b", address="fd00::2", port=9000),
]


def _filter(header: str | None) -> list[str]:
    headers = {} if header is None else {HEADER: header}
    return names(HeaderBasedTestingFilter().filter(CycleState(), request(headers=headers), POOL))


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (None, []),
        ("", []),
        (" , ,", []),
        ("10.0.0.9", []),
        ("10.0.0.2", ["v4-b"]),
        ("10.0.0.1", ["v4-a", "v4-a-rank1"]),
        ("10.0.0.1:8001", ["v4-a-rank1"]),
        ("10.0.0.1:9999", []),
        ("10.0.0.2, 10.0.0.1:8000", ["v4-a", "v4-b"]),
        ("10.0.0.2:8000,10.0.0.2", ["v4-b"]),
        ("fd00::1", ["v6-a"]),
        ("[fd00::2]", ["v6-b"]),
        ("[fd00::2]:9000", ["v6-b"]),
        ("[fd00::2]:8000", []),
        ("[fd00::1]:8000, 10.0.0.2", ["v4-b", "v6-a"]),
        ("10.0.0.1:http, 10.0.0.2", ["v4-b"]),
        ("[fd00::1]:x,fd00::2", ["v6-b"]),
        ("10.0.0", []),
        ("fd00::1:8000", []),
    ],
    ids=[
        "header-absent",
        "header-empty",
        "only-separators",
        "unknown-ip",
        "one-ip",
        "ip-matches-every-port",
        "ip-port",
        "ip-wrong-port",
        "list-with-spaces",
        "duplicates",
        "ipv6-bare",
        "ipv6-bracketed",
        "ipv6-bracketed-port",
        "ipv6-wrong-port",
        "mixed-families",
        "bad-port-entry-skipped",
        "bad-ipv6-port-entry-skipped",
        "prefix-is-not-a-match",
        "unbracketed-ipv6-with-port-is-an-address",
    ],
)
def test_filter(header: str | None, expected: list[str]) -> None:
    assert _filter(header) == expected


def test_endpoint_order_is_kept_not_header_order() -> None:
    assert _filter("fd00::2, 10.0.0.2, 10.0.0.1:8000") == ["v4-a", "v4-b", "v6-b"]


def test_other_headers_are_ignored() -> None:
    req = request(headers={"x-other": "10.0.0.1", "test-epp-endpoint": "10.0.0.1"})
    assert HeaderBasedTestingFilter().filter(CycleState(), req, POOL) == ()


def test_no_candidates() -> None:
    req = request(headers={HEADER: "10.0.0.1"})
    assert list(HeaderBasedTestingFilter().filter(CycleState(), req, [])) == []


def test_header_name_is_the_reference_one() -> None:
    assert HEADER == "test-epp-endpoint-selection"


def test_identity() -> None:
    plugin = mod.factory("conformance", Params(), FakeHandle())
    assert plugin.typed_name == TypedName("header-based-testing-filter", "conformance")
