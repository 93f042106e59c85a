"""The deprecated `--model-server-metrics-scheme/-path/-port/-https-insecure-skip-verify` flags, applied as the
reference applies them:

- scheme, path and insecure-skip-verify, when given, replace the `metrics-data-source` defaults: a parameter
  the configuration sets explicitly still wins (built-in default < flag < plugin parameter);
- port, when not 0, is scraped on every endpoint instead of its serving port, unless discovery gave the
  endpoint a metrics port of its own. The reference applies it only to pools with a single target port, so
  it is ignored (with a warning) when `--endpoint-target-ports` lists several.

The start-up log names each deprecated flag given (run())."""

from __future__ import annotations

import dataclasses
import logging

from llm_epp.config import LoadedConfig
from llm_epp.framework import EndpointMetadata, TypedName
from llm_epp.framework.datalayer import DataSource, source_interval
from llm_epp.options import Options
from llm_epp.plugins.datalayer.metrics_data_source import MetricsDataSource

log = logging.getLogger(__name__)


class FixedMetricsPort:
    """A `DataSource` scraping `port` on endpoints that have no metrics port of their own."""

    def __init__(self, inner: DataSource, port: int) -> None:
        self.inner = inner
        self.port = port

    @property
    def typed_name(self) -> TypedName:
        return self.inner.typed_name

    @property
    def insecure_skip_verify(self) -> bool:
        return self.inner.insecure_skip_verify

    @property
    def interval(self) -> float:
        return source_interval(self.inner)

    def __getattr__(self, name: str) -> object:  # the inner source's optional settings (TLS files)
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.inner, name)

    def url(self, endpoint: EndpointMetadata) -> str:
        if endpoint.metrics_port:
            return self.inner.url(endpoint)
        return self.inner.url(dataclasses.replace(endpoint, metrics_port=self.port))


def _explicit(params: dict[str, object], *keys: str) -> bool:
    return any(k in params for k in keys)


def apply_legacy_metrics_flags(config: LoadedConfig, opts: Options) -> None:
    """Rewrites `config.data_source` (and its entry in `config.plugins`) for the deprecated flags."""
    scheme, path = opts.model_server_metrics_scheme, opts.model_server_metrics_path
    insecure = opts.model_server_metrics_https_insecure_skip_verify
    port = opts.model_server_metrics_port
    if scheme is None and path is None and insecure is None and not port:
        return
    source = config.data_source
    if source is None:
        log.warning("the --model-server-metrics-* flags have no effect: the configuration collects no metrics")
        return
    if scheme is not None or path is not None or insecure is not None:
        if not isinstance(source, MetricsDataSource):
            log.warning(
                "--model-server-metrics-scheme/-path/-https-insecure-skip-verify have no effect on the data source "
                "%s; they apply to metrics-data-source",
                source.typed_name,
            )
        else:
            name = source.typed_name.name
            explicit = config.plugin_params.get(name) or {}
            replaced = MetricsDataSource(
                name,
                source.scheme if scheme is None or _explicit(explicit, "scheme") else scheme,
                source.path if path is None or _explicit(explicit, "path") else path,
                source.insecure_skip_verify
                if insecure is None or _explicit(explicit, "insecureSkipVerify", "insecure_skip_verify")
                else insecure,
                source.port,
                source.interval,
                source.ca_cert_path,
                source.client_cert_path,
                source.client_key_path,
            )
            if name in config.plugins:
                config.plugins[name] = replaced
            source = replaced
    if port:
        ports = [p for p in opts.endpoint_target_ports.split(",") if p.strip()]
        if len(set(ports)) > 1:
            log.warning(
                "--model-server-metrics-port is ignored: it applies to pools with one target port, and "
                "--endpoint-target-ports lists %d",
                len(set(ports)),
            )
        else:
            source = FixedMetricsPort(source, port)
    i = config.metrics_binding
    assert i is not None
    config.data_sources[i] = dataclasses.replace(config.data_sources[i], source=source)
