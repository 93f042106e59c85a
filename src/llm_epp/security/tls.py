"""TLS for the ext_proc port: a self-signed certificate made at start (the reference's default), or
tls.crt / tls.key read from --cert-path."""

from __future__ import annotations

import datetime
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


class CertificateError(ValueError):
    pass


def self_signed(common_name: str = "llm-epp", days: int = 3650) -> tuple[bytes, bytes]:
    """Returns (certificate PEM, private key PEM)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName(common_name), x509.DNSName("localhost")]),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


def load_cert_dir(path: str | Path) -> tuple[bytes, bytes]:
    """Reads tls.crt and tls.key from a directory (a mounted Kubernetes TLS secret)."""
    d = Path(path)
    try:
        return (d / "tls.crt").read_bytes(), (d / "tls.key").read_bytes()
    except OSError as e:
        raise CertificateError(
            f"--cert-path {d}: cannot read {e.filename}: {e.strerror}; expected tls.crt and tls.key"
        ) from None
