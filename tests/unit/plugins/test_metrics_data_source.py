"""Tests for metrics-data-source: the URL polled per endpoint and its parameters."""

from __future__ import annotations

import pytest

from llm_epp.framework import EndpointKey, EndpointMetadata, TypedName
from llm_epp.framework.datalayer import DataSource
from llm_epp.framework.registry import PluginParamsError, Registry
from llm_epp.plugins import builtin_registry
from llm_epp.plugins.datalayer import metrics_data_source as mod
from llm_epp.plugins.datalayer.metrics_data_source import MetricsDataSource
from tests.unit.builders import FakeHandle


def build(params: dict[str, object] | None = None) -> MetricsDataSource:
    registry = Registry(entry_point_group=None)
    registry.register(mod.TYPE, mod.Params, mod.factory)
    plugin = registry.build(mod.TYPE, "src", params, FakeHandle())
    assert isinstance(plugin, MetricsDataSource)
    return plugin


def md(address: str = "10.0.0.7", port: int = 8000, **kw: object) -> EndpointMetadata:
    return EndpointMetadata(EndpointKey("ns", "pod-rank-0"), address, port, **kw)  # type: ignore[arg-type]


def test_defaults_match_the_reference() -> None:
    plugin = build()
    assert isinstance(plugin, DataSource)
    assert plugin.typed_name == TypedName(mod.TYPE, "src")
    assert (plugin.scheme, plugin.path, plugin.insecure_skip_verify) == ("http", "/metrics", True)
    assert plugin.url(md()) == "http://10.0.0.7:8000/metrics"


@pytest.mark.parametrize(
    ("params", "endpoint", "url"),
    [
        ({"scheme": "https", "path": "/prometheus/metrics"}, md(), "https://10.0.0.7:8000/prometheus/metrics"),
        ({"path": "stats"}, md(), "http://10.0.0.7:8000/stats"),
        ({}, md(metrics_port=9400), "http://10.0.0.7:9400/metrics"),
        ({}, md("fd00::7", 8000), "http://[fd00::7]:8000/metrics"),
        ({"path": "/custom"}, md(metrics_path="/other"), "http://10.0.0.7:8000/other"),
        ({"path": "/custom"}, md(metrics_path="/metrics"), "http://10.0.0.7:8000/custom"),
        ({}, md(metrics_path="nested/metrics"), "http://10.0.0.7:8000/nested/metrics"),
    ],
    ids=[
        "https-path",
        "relative-path",
        "metrics-port",
        "ipv6",
        "endpoint-path-wins",
        "default-endpoint-path",
        "relative-endpoint-path",
    ],
)
def test_url(params: dict[str, object], endpoint: EndpointMetadata, url: str) -> None:
    assert build(params).url(endpoint) == url


def test_insecure_skip_verify_can_be_turned_off() -> None:
    assert build({"insecureSkipVerify": False}).insecure_skip_verify is False


@pytest.mark.parametrize(
    "params", [{"scheme": "ftp"}, {"insecureSkipVerify": "maybe"}, {"Path": "/x"}], ids=["scheme", "bool", "case"]
)
def test_invalid_params(params: dict[str, object]) -> None:
    with pytest.raises(PluginParamsError):
        build(params)


def test_port_overrides_the_endpoint_port() -> None:
    source = builtin_registry().build("metrics-data-source", "m", {"port": 9400, "path": "/stats"}, FakeHandle())
    assert isinstance(source, MetricsDataSource)
    md = EndpointMetadata(EndpointKey("ns", "p"), "10.1.2.3", 8000, metrics_port=8001)
    assert source.url(md) == "http://10.1.2.3:9400/stats"


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        ({"port": 0}, "greater than or equal to 1"),
        ({"port": 70000}, "less than or equal to 65535"),
        ({"interval": "soon"}, "invalid duration"),
        ({"interval": "-50ms"}, "must not be negative"),
        ({"clientCertPath": "/c.crt"}, "must be set together"),
    ],
    ids=["port-zero", "port-too-big", "bad-interval", "negative-interval", "cert-without-key"],
)
def test_refused_parameters(raw: dict[str, object], problem: str) -> None:
    with pytest.raises(PluginParamsError, match=problem):
        builtin_registry().parse_params("metrics-data-source", raw)


def test_interval_is_the_sources_own_scrape_period() -> None:
    source = builtin_registry().build("metrics-data-source", "m", {"interval": "1s", "port": 9100}, FakeHandle())
    assert isinstance(source, MetricsDataSource)
    assert (source.interval, source.port) == (1.0, 9100)
