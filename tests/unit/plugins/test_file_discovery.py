"""Tests for file-discovery (pure part): the reference's endpoints file format, entry by entry."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from llm_epp.framework import EndpointKey
from llm_epp.plugins.datalayer.file_discovery import FileDiscovery, Params


def plugin(**params: object) -> FileDiscovery:
    return FileDiscovery("fd", Params.model_validate({"path": "/etc/epp/endpoints.yaml", **params}))


def test_the_reference_file_format() -> None:
    found = plugin().parse_endpoints(
        """
endpoints:
  - name: vllm-0
    address: "10.0.0.1"
    port: "8000"
  - name: vllm-1
    namespace: llm
    address: "10.0.0.2"
    port: "8001"
    labels:
      inference.networking.k8s.io/engine-type: sglang
      tier: gold
"""
    )
    assert found.problems == ()
    a, b = found.endpoints
    assert (a.key, a.address, a.port, dict(a.labels), a.engine) == (
        EndpointKey("default", "vllm-0"),
        "10.0.0.1",
        8000,
        {},
        "vllm",
    )
    assert (b.key, b.port, b.labels["tier"], b.engine) == (EndpointKey("llm", "vllm-1"), 8001, "gold", "sglang")


def test_json_and_numeric_ports_load_too() -> None:
    found = plugin().parse_endpoints('{"endpoints": [{"name": "a", "address": "10.0.0.1", "port": 8000}]}')
    assert [(e.key.name, e.port) for e in found.endpoints] == [("a", 8000)]


def test_bad_entries_are_skipped_with_the_reason_and_the_rest_load() -> None:
    found = plugin().parse_endpoints(
        """
endpoints:
  - {name: ok, address: 10.0.0.1, port: "8000"}
  - {name: host, address: vllm.example.com, port: "8000"}
  - {name: v6, address: "fd00::1", port: "8000"}
  - {name: port, address: 10.0.0.3, port: "80000"}
  - {address: 10.0.0.4, port: "8000"}
  - {name: extra, address: 10.0.0.5, port: "8000", metricsPort: 9000}
"""
    )
    assert [e.key.name for e in found.endpoints] == ["ok", "extra"]
    text = "\n".join(found.problems)
    assert 'invalid IPv4 address "vllm.example.com"' in text
    assert 'invalid IPv4 address "fd00::1"' in text
    assert 'invalid port "80000"' in text
    assert "`name` is required" in text
    assert "unknown field(s) metricsPort ignored" in text


@pytest.mark.parametrize(
    ("text", "problem"),
    [("endpoints: [a", "not valid YAML"), ("- a\n- b\n", "expected a mapping"), ("endpoints: 3", "must be a list")],
)
def test_a_file_that_cannot_be_read_as_a_whole_raises(text: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        plugin().parse_endpoints(text)


def test_files_over_one_mebibyte_are_refused() -> None:
    with pytest.raises(ValueError, match="1 MiB"):
        plugin().parse_endpoints("endpoints: []\n" + "#" * (1 << 20))


def test_path_is_required() -> None:
    with pytest.raises(ValidationError, match="path"):
        Params.model_validate({"watchFile": True})
    assert plugin(watchFile=True).watch_file
    assert not plugin().watch_file
