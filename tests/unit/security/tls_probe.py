"""What a TLS client of a test server sees: key pairs written as a Kubernetes secret update writes them, the
certificate and ALPN protocol a new connection gets, and a gRPC channel trusting one certificate."""

from __future__ import annotations

import socket
import ssl
from pathlib import Path

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import serialization


def write_pair(cert_dir: Path, pair: tuple[bytes, bytes]) -> None:
    """Replaces tls.crt / tls.key in `cert_dir`, each by a rename (a new inode, as a secret update)."""
    for name, data in (("tls.crt", pair[0]), ("tls.key", pair[1])):
        tmp = cert_dir / f".{name}.tmp"
        tmp.write_bytes(data)
        tmp.replace(cert_dir / name)


def served(port: int) -> tuple[bytes, str | None]:
    """The certificate (DER) a new TLS connection to 127.0.0.1:`port` gets and the protocol ALPN chose; the
    client offers h2 and sends no SNI (an IP address)."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.set_alpn_protocols(["h2"])
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, ctx.wrap_socket(raw) as tls:
        der = tls.getpeercert(binary_form=True)
        assert der is not None
        return der, tls.selected_alpn_protocol()


def der(cert_pem: bytes) -> bytes:
    return x509.load_pem_x509_certificate(cert_pem).public_bytes(serialization.Encoding.DER)


def secure_channel(port: int, trusted_cert: bytes) -> grpc.aio.Channel:
    """A channel to 127.0.0.1:`port` that trusts only `trusted_cert` (issued for "localhost")."""
    return grpc.aio.secure_channel(
        f"127.0.0.1:{port}",
        grpc.ssl_channel_credentials(root_certificates=trusted_cert),
        options=(("grpc.ssl_target_name_override", "localhost"),),
    )
