"""Data sources over TLS with their own CA and a client certificate (mTLS), against a real HTTPS model-server
stand-in on 127.0.0.1 that requires a client certificate from the test CA."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest

from llm_epp.config import load_config_text
from llm_epp.datalayer.datastore import Datastore
from llm_epp.datalayer.runtime import DataLayer, MetricsRuntime, build_data_layer
from llm_epp.framework import EndpointKey, EndpointMetadata, NullRecorder
from llm_epp.plugins import builtin_registry
from llm_epp.plugins.datalayer.models_data_extractor import KEY as MODELS_KEY
from tests.support.certs import TestCA
from tests.unit.datalayer.page_server import PageServer, Route
from tests.unit.datalayer.test_sources import JSON, TESTDATA, eventually, models_body, running

KEY = EndpointKey("ns", "vllm-0")


def files(tmp_path: Path, ca: TestCA) -> dict[str, Path]:
    server, client = ca.issue("127.0.0.1", server=True), ca.issue("epp")
    out = {"ca": ca.write_ca(tmp_path / "ca.crt")}
    for name, data in (("server.crt", server.cert), ("server.key", server.key)):
        (tmp_path / name).write_bytes(data)
    for name, data in (("client.crt", client.cert), ("client.key", client.key)):
        (tmp_path / name).write_bytes(data)
    out.update({n: tmp_path / n for n in ("server.crt", "server.key", "client.crt", "client.key")})
    return out


def server_context(f: dict[str, Path]) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(f["server.crt"], f["server.key"])
    ctx.load_verify_locations(f["ca"])
    ctx.verify_mode = ssl.CERT_REQUIRED  # mTLS: only clients with a certificate from the test CA
    return ctx


def config(f: dict[str, Path], client: bool = True, ca: str | None = None) -> str:
    tls = f"insecureSkipVerify: false, caCertPath: {ca or f['ca']}"
    if client:
        tls += f", clientCertPath: {f['client.crt']}, clientKeyPath: {f['client.key']}"
    return (
        "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n"
        f"- {{type: metrics-data-source, parameters: {{scheme: https, {tls}}}}}\n"
        f"- {{type: models-data-source, parameters: {{scheme: https, {tls}}}}}\n"
        "- type: core-metrics-extractor\n- type: models-data-extractor\n- type: queue-scorer\n"
        "dataLayer:\n  sources:\n"
        "  - {pluginRef: metrics-data-source, extractors: [{pluginRef: core-metrics-extractor}]}\n"
        "  - {pluginRef: models-data-source, extractors: [{pluginRef: models-data-extractor}]}\n"
    )


def layer_for(text: str, port: int) -> tuple[Datastore, DataLayer]:
    loaded = load_config_text(text, builtin_registry(), NullRecorder())
    ds = Datastore()
    ds.replace_all([EndpointMetadata(KEY, "127.0.0.1", port)])
    return ds, build_data_layer(ds, [(b.source, b.extractors) for b in loaded.data_sources], refresh_interval=0.05)


def failure(runtime: MetricsRuntime | None) -> str | None:
    state = runtime.state(KEY) if runtime is not None else None
    return state.failure if state is not None else None


async def test_mtls_with_the_sources_own_ca(tmp_path: Path) -> None:
    f = files(tmp_path, TestCA())
    routes = {
        "/metrics": Route((TESTDATA / "vllm.txt").read_bytes()),
        "/v1/models": Route(models_body(("m", None)), content_type=JSON),
    }
    async with PageServer(routes=routes, ssl_context=server_context(f)) as srv:
        ds, layer = layer_for(config(f), srv.port)
        async with running(layer):
            await eventually(
                lambda: ds.snapshot()[0].metrics.update_time > 0 and MODELS_KEY in ds.snapshot()[0].attributes
            )
        # without a client certificate the server refuses the handshake: nothing is scraped
        ds, layer = layer_for(config(f, client=False), srv.port)
        async with running(layer):
            await eventually(lambda: failure(layer.metrics) is not None)
        assert ds.snapshot()[0].metrics.update_time == 0
        # a CA that did not sign the server's certificate: verification fails
        other = TestCA("other").write_ca(tmp_path / "other.crt")
        ds, layer = layer_for(config(f, ca=str(other)), srv.port)
        async with running(layer):
            await eventually(
                lambda: layer.metrics.state(KEY) is not None and layer.metrics.state(KEY).failure == "TLS error"
            )  # type: ignore[attr-defined]


def test_unusable_files_stop_the_start_with_the_reason(tmp_path: Path) -> None:
    f = files(tmp_path, TestCA())
    with pytest.raises(ValueError, match=r"caCertPath .*missing.crt: no usable CA certificate"):
        layer_for(config(f, ca=str(tmp_path / "missing.crt")), 1)
    (tmp_path / "client.key").write_text("not a key")
    with pytest.raises(ValueError, match="cannot load the key pair"):
        layer_for(config(f), 1)
