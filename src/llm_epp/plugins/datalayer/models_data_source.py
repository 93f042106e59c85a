"""models-data-source

Scheduling intent:
    Poll every endpoint's OpenAI-compatible `/v1/models` listing for `models-data-extractor`, so plugins
    can see which models and LoRA adapters (with their base model) each endpoint serves.

Inputs consumed:
    EndpointMetadata.address and port.

Configuration:
    scheme (`http` | `https`, default `http`), path (default `/v1/models`), insecureSkipVerify (default
    true). caCertPath, clientCertPath / clientKeyPath and interval: not supported yet (one TLS setting and
    one scrape period for the data layer).

Not registered yet:
    The data-layer runtime drives one Prometheus metrics source; this source returns JSON and needs the
    runtime to drive several sources (see `_attributes.py`). The type is listed as not supported yet.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from llm_epp.framework import EndpointMetadata, Handle, PluginParams, TypedName
from llm_epp.framework.types import join_host_port

TYPE = "models-data-source"
DEFAULT_PATH = "/v1/models"


class Params(PluginParams):
    scheme: Literal["http", "https"] = "http"
    path: str = DEFAULT_PATH
    insecure_skip_verify: bool = Field(default=True, alias="insecureSkipVerify")
    ca_cert_path: str = Field(default="", alias="caCertPath")
    client_cert_path: str = Field(default="", alias="clientCertPath")
    client_key_path: str = Field(default="", alias="clientKeyPath")
    interval: str = ""

    @model_validator(mode="after")
    def _supported(self) -> Params:
        refused = [
            k
            for k, v in (
                ("caCertPath", self.ca_cert_path),
                ("clientCertPath", self.client_cert_path),
                ("clientKeyPath", self.client_key_path),
                ("interval", self.interval),
            )
            if v
        ]
        if refused:
            raise ValueError(f"{', '.join(refused)} not supported yet; remove the parameter")
        return self


class ModelsDataSource:
    def __init__(self, name: str = TYPE, params: Params | None = None) -> None:
        params = params or Params()
        self._typed_name = TypedName(TYPE, name)
        self.scheme = params.scheme
        self.path = params.path if params.path.startswith("/") else "/" + params.path
        self._insecure_skip_verify = params.insecure_skip_verify

    @property
    def typed_name(self) -> TypedName:
        return self._typed_name

    @property
    def insecure_skip_verify(self) -> bool:
        return self._insecure_skip_verify

    def url(self, endpoint: EndpointMetadata) -> str:
        return f"{self.scheme}://{join_host_port(endpoint.address, endpoint.port)}{self.path}"


def factory(name: str, params: Params, handle: Handle) -> ModelsDataSource:
    return ModelsDataSource(name, params)
