"""Tests for llm_epp.framework.types: host:port joining and splitting (IPv6 included), endpoint identity
and the read-only domain objects."""

from __future__ import annotations

import dataclasses

import pytest

from llm_epp.framework import (
    ApiKind,
    Endpoint,
    EndpointKey,
    EndpointMetadata,
    ProfileResult,
    RequestBody,
    SchedulingResult,
)
from llm_epp.framework.types import is_ip, join_host_port, split_host_port
from tests.unit.builders import endpoint, request


@pytest.mark.parametrize(
    ("host", "port", "expected"),
    [
        ("10.0.0.1", 8000, "10.0.0.1:8000"),
        ("pod-a.svc", 80, "pod-a.svc:80"),
        ("::1", 8000, "[::1]:8000"),
        ("fd00:10:244::5", 8000, "[fd00:10:244::5]:8000"),
        ("fe80::1%eth0", 9002, "[fe80::1%eth0]:9002"),
        ("[::1]", 8000, "[::1]:8000"),
    ],
    ids=["ipv4", "hostname", "ipv6-loopback", "ipv6", "ipv6-zone", "ipv6-already-bracketed"],
)
def test_join_host_port(host: str, port: int, expected: str) -> None:
    assert join_host_port(host, port) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("10.0.0.1:8000", ("10.0.0.1", 8000)),
        ("10.0.0.1", ("10.0.0.1", None)),
        ("pod-a.svc:80", ("pod-a.svc", 80)),
        ("[::1]:8000", ("::1", 8000)),
        ("[fd00::5]", ("fd00::5", None)),
        ("fd00::5", ("fd00::5", None)),
        ("::1", ("::1", None)),
        ("  10.0.0.1:8000 ", ("10.0.0.1", 8000)),
        ("", ("", None)),
    ],
    ids=[
        "ipv4-port",
        "ipv4",
        "hostname-port",
        "ipv6-bracketed-port",
        "ipv6-bracketed",
        "ipv6-bare",
        "ipv6-loopback-bare",
        "whitespace",
        "empty",
    ],
)
def test_split_host_port(value: str, expected: tuple[str, int | None]) -> None:
    assert split_host_port(value) == expected


@pytest.mark.parametrize(
    "value",
    ["10.0.0.1:http", "10.0.0.1:", "[::1]:port", "[::1]:"],
    ids=["ipv4-named-port", "ipv4-empty-port", "ipv6-named-port", "ipv6-empty-port"],
)
def test_split_host_port_rejects_a_bad_port(value: str) -> None:
    with pytest.raises(ValueError):
        split_host_port(value)


@pytest.mark.parametrize(
    ("host", "port"),
    [("10.0.0.1", 8000), ("::1", 1), ("fd00:10:244::5", 65535), ("pod-a", 8080)],
    ids=["ipv4", "ipv6-loopback", "ipv6", "hostname"],
)
def test_split_inverts_join(host: str, port: int) -> None:
    assert split_host_port(join_host_port(host, port)) == (host, port)


@pytest.mark.parametrize(
    ("host", "expected"),
    [("10.0.0.1", True), ("::1", True), ("fd00::5", True), ("pod-a", False), ("", False), ("[::1]", False)],
    ids=["ipv4", "ipv6-loopback", "ipv6", "hostname", "empty", "bracketed"],
)
def test_is_ip(host: str, expected: bool) -> None:
    assert is_ip(host) is expected


@pytest.mark.parametrize(
    ("address", "port", "expected"),
    [("10.0.0.1", 8000, "10.0.0.1:8000"), ("fd00::5", 8001, "[fd00::5]:8001")],
    ids=["ipv4", "ipv6"],
)
def test_metadata_hostport(address: str, port: int, expected: str) -> None:
    meta = EndpointMetadata(EndpointKey("ns", "a"), address, port)
    assert meta.hostport == expected
    assert Endpoint(meta).hostport == expected


def test_metadata_hostport_is_derived_not_taken_from_the_caller() -> None:
    meta = EndpointMetadata(EndpointKey("ns", "a"), "10.0.0.1", 8000, hostport="1.2.3.4:1")
    assert meta.hostport == "10.0.0.1:8000"


def test_metadata_hostport_follows_replace() -> None:
    meta = EndpointMetadata(EndpointKey("ns", "a"), "10.0.0.1", 8000)
    moved = dataclasses.replace(meta, address="fd00::5", port=9000)
    assert moved.hostport == "[fd00::5]:9000"
    assert meta.hostport == "10.0.0.1:8000"


def test_metadata_is_frozen() -> None:
    meta = EndpointMetadata(EndpointKey("ns", "a"), "10.0.0.1", 8000)
    with pytest.raises(dataclasses.FrozenInstanceError):
        meta.port = 9000  # type: ignore[misc]


def test_metadata_defaults() -> None:
    meta = EndpointMetadata(EndpointKey("ns", "a"), "10.0.0.1", 8000)
    assert (meta.engine, meta.metrics_path, meta.metrics_port, dict(meta.labels)) == (
        "vllm",
        "/metrics",
        None,
        {},
    )


@pytest.mark.parametrize(
    ("key", "expected"),
    [(EndpointKey("ns", "pod-rank-0"), "ns/pod-rank-0"), (EndpointKey("", "pod"), "pod")],
    ids=["namespaced", "no-namespace"],
)
def test_endpoint_key_str(key: EndpointKey, expected: str) -> None:
    assert str(key) == expected


def test_endpoint_keys_are_values_and_ordered() -> None:
    assert EndpointKey("ns", "a") == EndpointKey("ns", "a")
    assert len({EndpointKey("ns", "a"), EndpointKey("ns", "a"), EndpointKey("ns", "b")}) == 2
    keys = [EndpointKey("b", "a"), EndpointKey("a", "z"), EndpointKey("a", "b")]
    assert sorted(keys) == [EndpointKey("a", "b"), EndpointKey("a", "z"), EndpointKey("b", "a")]


def test_endpoint_exposes_its_metadata_key_and_metrics() -> None:
    ep = endpoint("a", queue=3, kv=0.25, running=2, address="10.0.0.9", port=8001)
    assert ep.key == EndpointKey("default", "a")
    assert ep.hostport == "10.0.0.9:8001"
    assert (ep.metrics.waiting_queue_size, ep.metrics.kv_cache_usage, ep.metrics.running_requests) == (
        3,
        0.25,
        2,
    )


def test_default_mappings_are_read_only() -> None:
    meta = EndpointMetadata(EndpointKey("ns", "a"), "10.0.0.1", 8000)
    body = RequestBody(ApiKind.COMPLETIONS)
    for mapping in (meta.labels, Endpoint(meta).attributes, body.payload, ProfileResult(()).scores):
        with pytest.raises(TypeError):
            mapping["x"] = 1  # type: ignore[index]


def test_request_defaults() -> None:
    req = request("m")
    assert (req.incoming_model, req.target_model, req.priority, req.fairness_id, req.objective) == (
        "m",
        "m",
        0,
        "default-flow",
        "",
    )


def test_scheduling_result_primary() -> None:
    chosen = ProfileResult((endpoint("a"),))
    result = SchedulingResult({"decode": chosen, "prefill": None}, "decode")
    assert result.primary is chosen
    assert SchedulingResult({"decode": chosen, "prefill": None}, "prefill").primary is None
    assert SchedulingResult({"decode": chosen}, "missing").primary is None
