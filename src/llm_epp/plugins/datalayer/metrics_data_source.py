"""metrics-data-source

Scheduling intent:
    Poll every endpoint's Prometheus /metrics page so the extractors (`core-metrics-extractor`) can keep
    its Metrics fresh. The data-layer runtime fetches the URL this plugin builds once per
    `--refresh-metrics-interval` (50 ms) with a 1 s deadline and parses only what the extractor needs.

Inputs consumed:
    EndpointMetadata.address and port (or `metrics_port` when discovery sets one) and `metrics_path`
    when discovery sets one other than "/metrics" (e.g. `metricsPath` in an endpoints file).

Configuration:
    scheme ("http" or "https", default "http").
    path (default "/metrics"): URL path of the metrics page; a missing leading "/" is added.
    insecureSkipVerify (default true): with https, do not verify the model server's certificate.
    port (int in [1, 65535], optional): scrape this port instead of the endpoint's (or its metrics port).
    interval (Go duration, optional): this source's scrape period, rounded to the nearest multiple of the
        data layer's base tick (`--refresh-metrics-interval`, lowered to the smallest source interval, not
        below 50 ms); omitted: every base tick.

    caCertPath (optional): with https and insecureSkipVerify false, verify the model server against this PEM
        CA bundle instead of the system CAs.
    clientCertPath / clientKeyPath (optional, together): present this client certificate (mTLS).
    The files are read when the EPP starts; one that cannot be used stops it with the reason.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from llm_epp.framework import EndpointMetadata, Handle, PluginParams, TypedName
from llm_epp.framework.types import join_host_port
from llm_epp.plugins.datalayer._interval import check_interval, interval_seconds

TYPE = "metrics-data-source"
DEFAULT_PATH = "/metrics"


class Params(PluginParams):
    scheme: Literal["http", "https"] = "http"
    path: str = DEFAULT_PATH
    insecure_skip_verify: bool = Field(True, alias="insecureSkipVerify")
    port: int | None = Field(default=None, ge=1, le=65535)
    ca_cert_path: str = Field(default="", alias="caCertPath")
    client_cert_path: str = Field(default="", alias="clientCertPath")
    client_key_path: str = Field(default="", alias="clientKeyPath")
    interval: str = ""

    @field_validator("interval")
    @classmethod
    def _duration(cls, value: str) -> str:
        check_interval(value)
        return value

    @model_validator(mode="after")
    def _pair(self) -> Params:
        if bool(self.client_cert_path) != bool(self.client_key_path):
            raise ValueError("clientCertPath and clientKeyPath must be set together")
        return self


class MetricsDataSource:
    def __init__(
        self,
        name: str = TYPE,
        scheme: str = "http",
        path: str = DEFAULT_PATH,
        insecure_skip_verify: bool = True,
        port: int | None = None,
        interval: float = 0.0,
        ca_cert_path: str = "",
        client_cert_path: str = "",
        client_key_path: str = "",
    ) -> None:
        self._typed_name = TypedName(TYPE, name)
        self.port = port
        self.interval = interval
        self.ca_cert_path = ca_cert_path
        self.client_cert_path = client_cert_path
        self.client_key_path = client_key_path
        self.scheme = scheme
        self.path = path if path.startswith("/") else "/" + path
        self._insecure_skip_verify = insecure_skip_verify

    @property
    def typed_name(self) -> TypedName:
        return self._typed_name

    @property
    def insecure_skip_verify(self) -> bool:
        return self._insecure_skip_verify

    def url(self, endpoint: EndpointMetadata) -> str:
        port = self.port or endpoint.metrics_port or endpoint.port
        path = endpoint.metrics_path if endpoint.metrics_path not in ("", DEFAULT_PATH) else self.path
        if not path.startswith("/"):
            path = "/" + path
        return f"{self.scheme}://{join_host_port(endpoint.address, port)}{path}"


def factory(name: str, params: Params, handle: Handle) -> MetricsDataSource:
    return MetricsDataSource(
        name,
        params.scheme,
        params.path,
        params.insecure_skip_verify,
        params.port,
        interval_seconds(params.interval),
        params.ca_cert_path,
        params.client_cert_path,
        params.client_key_path,
    )
