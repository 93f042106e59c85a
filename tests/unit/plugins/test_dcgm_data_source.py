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


@pytest.mark.parametrize(
    ("raw", "problem"),
    [({"useNodeAddress": True}, "useNodeAddress: true is not supported yet"), ({"interval": "1s"}, "interval")],
    ids=["node-address", "interval"],
)
def test_unsupported_options_are_refused(raw: dict[str, object], problem: str) -> None:
    with pytest.raises(ValidationError, match=problem):
        Params.model_validate(raw)
