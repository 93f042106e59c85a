"""The metrics port of `llm-epp serve` as the flags set it up: HTTPS with client certificates, profiles and
the ext_proc stream metrics."""

from __future__ import annotations

import ssl
from pathlib import Path

import grpc
import httpx
from cryptography.hazmat.primitives import serialization

from llm_epp.gateway.epp_process import EppProcess
from tests.support.certs import issue_cert as _cert
from tests.support.certs import write_pair as _write


def test_https_metrics_with_client_certificates_profiles_and_stream_metrics(tmp_path: Path) -> None:
    ca = _cert("metrics-ca")
    (tmp_path / "ca.crt").write_bytes(ca[0].public_bytes(serialization.Encoding.PEM))
    _write(tmp_path / "server", *_cert("localhost", ca))
    _write(tmp_path / "client", *_cert("prometheus", ca))
    args = (
        "--endpoints",
        "127.0.0.1:1",
        "--secure-serving=false",
        "--metrics-cert-dir",
        str(tmp_path / "server"),
        "--metrics-client-ca-file",
        str(tmp_path / "ca.crt"),
        "--metrics-endpoint-auth=false",
        "--enable-grpc-stream-metrics",
    )
    with EppProcess(*args) as epp:
        base = f"https://localhost:{epp.ports['metrics']}"
        client = ssl.create_default_context(cafile=str(tmp_path / "ca.crt"))
        client.load_cert_chain(str(tmp_path / "client" / "tls.crt"), str(tmp_path / "client" / "tls.key"))
        with grpc.insecure_channel(f"127.0.0.1:{epp.grpc_port}") as channel:  # one ext_proc stream, closed at once
            process = channel.stream_stream("/envoy.service.ext_proc.v3.ExternalProcessor/Process")
            assert list(process(iter(()), timeout=10)) == []
        with httpx.Client(verify=client, timeout=30) as http:
            text = http.get(f"{base}/metrics").text
            assert 'llm_d_epp_extproc_streams_total{code="OK"} 1.0' in text
            assert "llm_d_epp_extproc_streams_inflight 0.0" in text
            profile = http.get(f"{base}/debug/pprof/profile?seconds=0.2")
            assert profile.status_code == 200 and "MainThread;" in profile.text
        try:
            httpx.get(f"{base}/metrics", verify=ssl.create_default_context(cafile=str(tmp_path / "ca.crt")), timeout=10)
        except (httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError):
            pass
        else:
            raise AssertionError("a client without a certificate was served")
