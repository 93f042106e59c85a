"""`llm-epp serve` TLS flags on the ext_proc port, seen by real TLS clients: --tls-cipher-suites limits the
TLS 1.2 suites, --enable-cert-reload serves a replaced key pair to new connections."""

from __future__ import annotations

import socket
import ssl
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from llm_epp.gateway.epp_process import EppProcess
from llm_epp.security.tls import self_signed
from tests.support.wait import wait_until


def _write(cert_dir: Path, pair: tuple[bytes, bytes]) -> None:
    for name, data in zip(("tls.crt", "tls.key"), pair, strict=True):
        tmp = cert_dir / f".{name}.tmp"
        tmp.write_bytes(data)
        tmp.replace(cert_dir / name)


def _handshake(port: int, *, ciphers: str = "", tls12: bool = False) -> tuple[bytes, str]:
    """(the served certificate, the negotiated cipher)."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.set_alpn_protocols(["h2"])
    if tls12:
        ctx.maximum_version = ssl.TLSVersion.TLSv1_2
    if ciphers:
        ctx.set_ciphers(ciphers)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, ctx.wrap_socket(raw) as tls:
        der = tls.getpeercert(binary_form=True)
        cipher = tls.cipher()
    assert der is not None and cipher is not None
    return der, cipher[0]


def _der(pem: bytes) -> bytes:
    return x509.load_pem_x509_certificate(pem).public_bytes(serialization.Encoding.DER)


@pytest.mark.parametrize("transport", ["asyncio", "grpcio"])
def test_cipher_suites_and_cert_reload(tmp_path: Path, transport: str) -> None:
    first, second = self_signed(), self_signed()  # ECDSA P-256 keys
    _write(tmp_path, first)
    args = (
        f"--grpc-transport={transport}",
        "--endpoints",
        "127.0.0.1:1",
        "--cert-path",
        str(tmp_path),
        "--enable-cert-reload",
        "--tls-cipher-suites",
        "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,TLS_AES_128_GCM_SHA256",
        "--tls-min-version=VersionTLS12",
    )
    with EppProcess(*args) as epp:
        assert f"transport={transport}" in epp.log()  # the flag chose what serves the port
        port = epp.grpc_port
        der, cipher = _handshake(port, tls12=True)
        assert der == _der(first[0])
        assert cipher == "ECDHE-ECDSA-AES256-GCM-SHA384"
        with pytest.raises(ssl.SSLError):  # a TLS 1.2 suite not in the list
            _handshake(port, tls12=True, ciphers="ECDHE-ECDSA-AES128-GCM-SHA256")
        _write(tmp_path, second)
        wait_until(lambda: _handshake(port)[0] == _der(second[0]), "new connections to get the new certificate")
        assert "ext_proc_certificate_reloaded" in epp.log()
