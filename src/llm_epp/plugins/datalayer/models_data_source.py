"""models-data-source

Scheduling intent:
    Poll every endpoint's OpenAI-compatible `/v1/models` listing for `models-data-extractor`, so plugins
    can see which models and LoRA adapters (with their base model) each endpoint serves.

Inputs consumed:
    EndpointMetadata.address and port.

Configuration:
    scheme (`http` | `https`, default `http`), path (default `/v1/models`), insecureSkipVerify (default
    true), interval (Go duration, optional: poll period, rounded to the nearest multiple of the data layer's
    base tick, see metrics-data-source; omitted: every base tick), caCertPath (verify against this CA
    bundle), clientCertPath / clientKeyPath (mTLS; together), read when the EPP starts.

    The answer is JSON (`payload` "json"): only extractors reading bodies (`models-data-extractor`) can be
    listed under this source. A failing poll never takes the endpoint out of the candidate set.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from llm_epp.framework import EndpointMetadata, Handle, PluginParams, TypedName
from llm_epp.framework.datalayer import PAYLOAD_JSON
from llm_epp.framework.types import join_host_port
from llm_epp.plugins.datalayer._interval import check_interval, interval_seconds

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

    _interval = field_validator("interval")(check_interval)

    @model_validator(mode="after")
    def _pair(self) -> Params:
        if bool(self.client_cert_path) != bool(self.client_key_path):
            raise ValueError("clientCertPath and clientKeyPath must be set together")
        return self


class ModelsDataSource:
    payload = PAYLOAD_JSON

    def __init__(self, name: str = TYPE, params: Params | None = None) -> None:
        params = params or Params()
        self._typed_name = TypedName(TYPE, name)
        self.scheme = params.scheme
        self.path = params.path if params.path.startswith("/") else "/" + params.path
        self._insecure_skip_verify = params.insecure_skip_verify
        self.interval = interval_seconds(params.interval)
        self.ca_cert_path = params.ca_cert_path
        self.client_cert_path = params.client_cert_path
        self.client_key_path = params.client_key_path

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
