"""Tests for models-data-source (pure part): the `/v1/models` URL per endpoint."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from llm_epp.framework import EndpointKey, EndpointMetadata
from llm_epp.framework.datalayer import PAYLOAD_JSON, DataSource, source_payload
from llm_epp.plugins.datalayer.models_data_source import ModelsDataSource, Params


def test_url() -> None:
    md = EndpointMetadata(EndpointKey("llm", "vllm-0"), "fd00::5", 8000)
    source = ModelsDataSource("models", Params())
    assert isinstance(source, DataSource)
    assert source.url(md) == "http://[fd00::5]:8000/v1/models"
    assert ModelsDataSource("m", Params(scheme="https", path="models")).url(md) == "https://[fd00::5]:8000/models"


def test_interval_and_json_payload() -> None:
    source = ModelsDataSource("models", Params.model_validate({"interval": "5s"}))
    assert source.interval == 5.0
    assert source_payload(source) == PAYLOAD_JSON
    assert ModelsDataSource("models", Params()).interval == 0.0


def test_tls_files_are_kept_and_a_client_pair_is_complete() -> None:
    source = ModelsDataSource("m", Params.model_validate({"caCertPath": "/ca.crt", "clientCertPath": "/c.crt",
                                                          "clientKeyPath": "/c.key"}))  # fmt: skip
    assert (source.ca_cert_path, source.client_cert_path, source.client_key_path) == ("/ca.crt", "/c.crt", "/c.key")
    with pytest.raises(ValidationError, match="must be set together"):
        Params.model_validate({"clientCertPath": "/c.crt"})
