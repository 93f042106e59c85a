"""dcgm-data-source

Scheduling intent:
    Poll NVIDIA's DCGM Exporter for GPU hardware metrics of each endpoint, for `dcgm-extractor`, so GPU
    utilization can steer routing (with `endpoint-attribute-filter` / `-scorer`). The exporter runs as a
    sidecar next to the model server (scraped at the pod's IP) or as a DaemonSet (the node's IP).

Inputs consumed:
    EndpointMetadata.address (the pod IP), and with `useNodeAddress` its node_address (the pod's
    `status.hostIP`, set by InferencePool discovery; endpoints without one are scraped at their own IP).

Configuration:
    scheme (`http` | `https`, default `http`), path (default `/metrics`), port (default 9400: the
    exporter's port, which replaces the endpoint's), insecureSkipVerify (default true).
    useNodeAddress (default false): scrape `<node IP>:<port>` (DaemonSet) instead of `<pod IP>:<port>`.
    interval (Go duration, optional): scrape period, rounded to the nearest multiple of the data layer's
        base tick (see metrics-data-source); omitted: every base tick.

    The exporter's page is polled on its own: a failing exporter never takes the endpoint out of the
    candidate set; its GPU attributes stop being refreshed.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from llm_epp.framework import EndpointMetadata, Handle, PluginParams, TypedName
from llm_epp.framework.types import join_host_port
from llm_epp.plugins.datalayer._interval import check_interval, interval_seconds

TYPE = "dcgm-data-source"
DEFAULT_PORT = 9400


class Params(PluginParams):
    scheme: Literal["http", "https"] = "http"
    path: str = "/metrics"
    port: int = Field(default=DEFAULT_PORT, ge=1, le=65535)
    insecure_skip_verify: bool = Field(default=True, alias="insecureSkipVerify")
    use_node_address: bool = Field(default=False, alias="useNodeAddress")
    interval: str = ""

    _interval = field_validator("interval")(check_interval)


class DcgmDataSource:
    def __init__(self, name: str = TYPE, params: Params | None = None) -> None:
        params = params or Params()
        self._typed_name = TypedName(TYPE, name)
        self.scheme = params.scheme
        self.path = params.path if params.path.startswith("/") else "/" + params.path
        self.port = params.port
        self.use_node_address = params.use_node_address
        self.interval = interval_seconds(params.interval)
        self._insecure_skip_verify = params.insecure_skip_verify

    @property
    def typed_name(self) -> TypedName:
        return self._typed_name

    @property
    def insecure_skip_verify(self) -> bool:
        return self._insecure_skip_verify

    def url(self, endpoint: EndpointMetadata) -> str:
        host = endpoint.address
        if self.use_node_address and endpoint.node_address:
            host = endpoint.node_address
        return f"{self.scheme}://{join_host_port(host, self.port)}{self.path}"


def factory(name: str, params: Params, handle: Handle) -> DcgmDataSource:
    return DcgmDataSource(name, params)
