"""dcgm-data-source

Scheduling intent:
    Poll NVIDIA's DCGM Exporter for GPU hardware metrics of each endpoint, for `dcgm-extractor`, so GPU
    utilization can steer routing (with `endpoint-attribute-filter` / `-scorer`). The exporter runs as a
    sidecar next to the model server (scraped at the pod's IP) or as a DaemonSet (the node's IP).

Inputs consumed:
    EndpointMetadata.address (the pod IP).

Configuration:
    scheme (`http` | `https`, default `http`), path (default `/metrics`), port (default 9400: the
    exporter's port, which replaces the endpoint's), insecureSkipVerify (default true).
    useNodeAddress (default false): `true` (DaemonSet: scrape the node's IP) is not supported yet, since
        endpoints do not carry their node's address. interval: not supported yet (one scrape period).

Not registered yet:
    The data-layer runtime drives one metrics source; this source needs it to drive several (see
    `_attributes.py`). The type is listed as not supported yet until then.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from llm_epp.framework import EndpointMetadata, Handle, PluginParams, TypedName
from llm_epp.framework.types import join_host_port

TYPE = "dcgm-data-source"
DEFAULT_PORT = 9400


class Params(PluginParams):
    scheme: Literal["http", "https"] = "http"
    path: str = "/metrics"
    port: int = Field(default=DEFAULT_PORT, ge=1, le=65535)
    insecure_skip_verify: bool = Field(default=True, alias="insecureSkipVerify")
    use_node_address: bool = Field(default=False, alias="useNodeAddress")
    interval: str = ""

    @model_validator(mode="after")
    def _supported(self) -> Params:
        if self.use_node_address:
            raise ValueError("useNodeAddress: true is not supported yet: endpoints do not carry their node's address")
        if self.interval:
            raise ValueError("interval is not supported yet: every source is polled at --refresh-metrics-interval")
        return self


class DcgmDataSource:
    def __init__(self, name: str = TYPE, params: Params | None = None) -> None:
        params = params or Params()
        self._typed_name = TypedName(TYPE, name)
        self.scheme = params.scheme
        self.path = params.path if params.path.startswith("/") else "/" + params.path
        self.port = params.port
        self._insecure_skip_verify = params.insecure_skip_verify

    @property
    def typed_name(self) -> TypedName:
        return self._typed_name

    @property
    def insecure_skip_verify(self) -> bool:
        return self._insecure_skip_verify

    def url(self, endpoint: EndpointMetadata) -> str:
        return f"{self.scheme}://{join_host_port(endpoint.address, self.port)}{self.path}"


def factory(name: str, params: Params, handle: Handle) -> DcgmDataSource:
    return DcgmDataSource(name, params)
