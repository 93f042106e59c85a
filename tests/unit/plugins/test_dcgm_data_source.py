"""Tests for dcgm-data-source (pure part): the exporter URL per endpoint; unsupported options refused."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from llm_epp.framework import EndpointKey, EndpointMetadata
from llm_epp.framework.datalayer import DataSource
from llm_epp.plugins.datalayer.dcgm_data_source import DcgmDataSource, Params

MD = EndpointMetadata(EndpointKey("llm", "vllm-0"), "10.0.0.5", 8000, metrics_port=8001)


def test_url_uses_the_exporter_port() -> None:
    source = DcgmDataSource("dcgm", Params())
    assert isinstance(source, DataSource)
    assert source.url(MD) == "http://10.0.0.5:9400/metrics"
    custom = DcgmDataSource("dcgm", Params.model_validate({"scheme": "https", "port": 9500, "path": "dcgm"}))
    assert custom.url(MD) == "https://10.0.0.5:9500/dcgm"
    assert custom.insecure_skip_verify is True


def test_daemonset_mode_scrapes_the_node_address_when_the_endpoint_has_one() -> None:
    source = DcgmDataSource("dcgm", Params.model_validate({"useNodeAddress": True, "interval": "1s"}))
    assert source.interval == 1.0
    on_node = EndpointMetadata(EndpointKey("llm", "vllm-0"), "10.0.0.5", 8000, node_address="192.168.1.7")
    assert source.url(on_node) == "http://192.168.1.7:9400/metrics"
    assert source.url(MD) == "http://10.0.0.5:9400/metrics"  # no node address known: the pod's own
    assert DcgmDataSource("dcgm", Params()).url(on_node) == "http://10.0.0.5:9400/metrics"


@pytest.mark.parametrize(
    ("raw", "problem"),
    [({"interval": "soon"}, "invalid duration"), ({"interval": "-1s"}, "must not be negative"), ({"port": 0}, "1")],
    ids=["interval", "negative-interval", "port"],
)
def test_bad_options_are_refused(raw: dict[str, object], problem: str) -> None:
    with pytest.raises(ValidationError, match=problem):
        Params.model_validate(raw)
