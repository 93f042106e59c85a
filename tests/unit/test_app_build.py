"""`app.build`: the serving components around the shared request path (`llm_epp.composition`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from llm_epp.app import StartupError, build
from llm_epp.options import Options


def _ready_pods(c, pool: str) -> float | None:
    assert c.metrics_runtime is not None
    c.metrics_runtime.refresh_pool_gauges()
    return c.recorder.registry.get_sample_value("inference_pool_ready_pods", {"name": pool})


def test_the_endpoints_files_pool_name_names_the_pool_gauges(tmp_path: Path) -> None:
    f = tmp_path / "pool.yaml"
    f.write_text("poolName: demo\nendpoints: [{address: 10.0.0.1, port: 8000}]\n")
    c = build(Options(endpoints_file=str(f)))
    assert c.datastore.pool_name == "demo"
    assert _ready_pods(c, "demo") == 0.0  # the gauges carry the file's name (no metrics yet: 0 fresh pods)
    assert _ready_pods(c, "static") is None


def test_without_a_pool_name_the_pool_is_called_static(tmp_path: Path) -> None:
    c = build(Options(endpoints="10.0.0.1:8000"))
    assert c.datastore.pool_name == "static"
    assert _ready_pods(c, "static") == 0.0


def test_the_director_routes_over_the_datastore_with_the_configured_plugins() -> None:
    c = build(Options(endpoints="10.0.0.1:8000,10.0.0.2:8000"))
    assert c.director.scheduler is c.config.scheduler
    assert list(c.director.plugins.pre_request) == c.config.pre_request
    assert [e.hostport for e in c.director.candidates(None)] == ["10.0.0.1:8000", "10.0.0.2:8000"]


def test_a_bad_config_is_a_startup_error() -> None:
    with pytest.raises(StartupError, match="plugins"):
        build(Options(endpoints="10.0.0.1:8000", config_text="plugins: [{type: no-such-plugin}]"))


def test_an_encoder_cache_producer_gets_its_metrics_exported() -> None:
    config = """
plugins:
- {type: mm-embeddings-cache-producer}
- {type: mm-embeddings-cache-scorer}
schedulingProfiles:
- {name: default, plugins: [{pluginRef: mm-embeddings-cache-scorer}]}
"""
    c = build(Options(endpoints="10.0.0.1:8000", config_text=config))
    labels = {"plugin_type": "mm-embeddings-cache-producer", "plugin_name": "mm-embeddings-cache-producer"}
    assert c.recorder.registry.get_sample_value("llm_d_epp_encoder_cache_hit_ratio_count", labels) == 0.0
    plain = build(Options(endpoints="10.0.0.1:8000"))
    assert plain.recorder.registry.get_sample_value("llm_d_epp_encoder_cache_hit_ratio_count", labels) is None
