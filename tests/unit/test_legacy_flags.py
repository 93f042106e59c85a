"""The deprecated --model-server-metrics-* flags replace the metrics-data-source defaults (explicit plugin
parameters win) and the experimental-plugin gate."""

from __future__ import annotations

import pytest

from llm_epp.config import load_config_text
from llm_epp.framework import NullRecorder
from llm_epp.framework.types import EndpointKey, EndpointMetadata
from llm_epp.legacy_flags import FixedMetricsPort, apply_legacy_metrics_flags
from llm_epp.options import Options
from llm_epp.plugins import builtin_registry
from llm_epp.stability import EXPERIMENTAL_PLUGIN_TYPES, experimental_plugin_problem

ENDPOINT = EndpointMetadata(key=EndpointKey("pod-a", 8000), address="10.0.0.5", port=8000)

EXPLICIT = """
plugins:
- type: queue-scorer
- type: max-score-picker
- name: scrape
  type: metrics-data-source
  parameters:
    path: /custom
- type: core-metrics-extractor
dataLayer:
  sources:
  - pluginRef: scrape
    extractors:
    - pluginRef: core-metrics-extractor
"""


def _url(config_text: str | None, **flags: object) -> tuple[str, bool]:
    config = load_config_text(config_text, builtin_registry(), NullRecorder())
    apply_legacy_metrics_flags(config, Options(**flags))  # type: ignore[arg-type]
    assert config.data_source is not None
    return config.data_source.url(ENDPOINT), config.data_source.insecure_skip_verify


def test_flags_replace_the_defaults() -> None:
    assert _url(None) == ("http://10.0.0.5:8000/metrics", True)
    assert _url(
        None,
        model_server_metrics_scheme="https",
        model_server_metrics_path="/prometheus/metrics",
        model_server_metrics_https_insecure_skip_verify=False,
    ) == ("https://10.0.0.5:8000/prometheus/metrics", False)


def test_explicit_plugin_parameters_win_over_the_flags() -> None:
    url, _ = _url(EXPLICIT, model_server_metrics_scheme="https", model_server_metrics_path="/prometheus/metrics")
    assert url == "https://10.0.0.5:8000/custom"


def test_metrics_port() -> None:
    assert _url(None, model_server_metrics_port=9400)[0] == "http://10.0.0.5:9400/metrics"
    own = EndpointMetadata(key=EndpointKey("pod-b", 8000), address="10.0.0.6", port=8000, metrics_port=9500)
    config = load_config_text(None, builtin_registry(), NullRecorder())
    apply_legacy_metrics_flags(config, Options(model_server_metrics_port=9400))
    assert isinstance(config.data_source, FixedMetricsPort)
    assert config.data_source.url(own) == "http://10.0.0.6:9500/metrics"  # discovery's own metrics port stays
    # several target ports: ignored, as the reference applies it only to single-port pools
    many = Options(model_server_metrics_port=9400, endpoint_selector="app=x", endpoint_target_ports="8000,8001")
    config = load_config_text(None, builtin_registry(), NullRecorder())
    apply_legacy_metrics_flags(config, many)
    assert config.data_source is not None and config.data_source.url(ENDPOINT) == "http://10.0.0.5:8000/metrics"


@pytest.mark.parametrize("plugin_type", [*sorted(EXPERIMENTAL_PLUGIN_TYPES)[:3], "session-affinity-filter"])
def test_experimental_plugins_need_the_flag(plugin_type: str) -> None:
    types = {"picker": "max-score-picker", "mine": plugin_type}
    problem = experimental_plugin_problem(types, allow=False)
    assert f"plugin 'mine' (type {plugin_type!r}) is experimental" in problem
    assert "--allow-experimental-plugins" in problem
    assert experimental_plugin_problem(types, allow=True) == ""
    assert experimental_plugin_problem({"picker": "max-score-picker"}, allow=False) == ""
