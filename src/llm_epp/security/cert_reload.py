"""`--enable-cert-reload`: the ext_proc key pair in `--cert-path` is read again when its files change.

gRPC asks `CertReloader.fetch` for the certificate configuration at every new TLS handshake; it compares the
files' identity (inode, size, modification time — a Kubernetes secret update swaps a symlink, which changes
all three) with what was loaded and reloads on a difference. A pair that does not load or whose key does not
match its certificate (a half-written update) is not taken: the previous pair stays in use and the next
handshake tries again. Connections already open keep their session, so streams in progress are not dropped."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from llm_epp.security.tls import CertificateError, load_cert_dir

log = logging.getLogger(__name__)

_Stamp = tuple[tuple[int, int, int], ...]


def check_pair(cert_pem: bytes, key_pem: bytes) -> None:
    """Raises CertificateError unless `key_pem` is the private key of the first certificate in `cert_pem`."""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError) as e:
        raise CertificateError(f"cannot parse the key pair: {e}") from None
    spki = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    if cert.public_key().public_bytes(*spki) != key.public_key().public_bytes(*spki):
        raise CertificateError("tls.key is not the key of tls.crt")


def file_stamps(cert_dir: Path) -> _Stamp:
    """The identity (inode, size, mtime) of tls.crt and tls.key in `cert_dir`; zeros for a missing file."""
    stamps = []
    for name in ("tls.crt", "tls.key"):
        try:
            st = os.stat(cert_dir / name)
        except OSError:
            stamps.append((0, 0, 0))
        else:
            stamps.append((st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(stamps)


class CertReloader:
    """Dynamic server credentials over the tls.crt / tls.key pair in `cert_dir`."""

    def __init__(self, cert_dir: str | Path) -> None:
        self._dir = Path(cert_dir)
        self._stamp = self._stat()
        cert, key = load_cert_dir(self._dir)
        check_pair(cert, key)
        self._initial = grpc.ssl_server_certificate_configuration([(key, cert)])
        self._rejected: _Stamp | None = None
        self.reloads = 0

    def _stat(self) -> _Stamp:
        return file_stamps(self._dir)

    def fetch(self) -> grpc.ServerCertificateConfiguration | None:
        """None when the files did not change (or changed into something unusable); else the new pair."""
        try:
            stamp = self._stat()
            if stamp == self._stamp or stamp == self._rejected:
                return None
            try:
                cert, key = load_cert_dir(self._dir)
                check_pair(cert, key)
            except CertificateError as e:
                self._rejected = stamp
                log.warning(
                    "ext_proc_certificate_reload_failed cert_path=%s reason=%s; keeping the current pair", self._dir, e
                )
                return None
            self._stamp = stamp
            self._rejected = None
            self.reloads += 1
            log.info("ext_proc_certificate_reloaded cert_path=%s", self._dir)
            return grpc.ssl_server_certificate_configuration([(key, cert)])
        except Exception:  # never break a handshake over a reload problem
            log.exception("ext_proc_certificate_reload_error cert_path=%s", self._dir)
            return None

    def credentials(self) -> grpc.ServerCredentials:
        return grpc.dynamic_ssl_server_credentials(self._initial, self.fetch)
