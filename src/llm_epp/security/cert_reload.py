"""`--enable-cert-reload`: the ext_proc key pair in `--cert-path` is read again when its files change.

gRPC asks `CertReloader.fetch` for the certificate configuration at every new TLS handshake (the asyncio
transport's context, `server_ssl.ReloadingContext`, asks at every ClientHello). `PairFiles`, shared by both,
compares the files' identity (inode, size, modification time — a Kubernetes secret update swaps a symlink, which
changes all three) with what was loaded and reloads on a difference. A pair that does not load or whose key does
not match its certificate (a half-written update) is not taken: the previous pair stays in use and the next
handshake tries again. Connections already open keep their session, so streams in progress are not dropped."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from llm_epp.security.tls import CertificateError, load_cert_dir

log = logging.getLogger(__name__)

_Stamp = tuple[tuple[int, int, int], ...]
T = TypeVar("T")


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


class PairFiles:
    """The tls.crt / tls.key pair in `cert_dir` and whether it changed since it was last taken. `initial` is
    the pair read at construction (checked; raises CertificateError)."""

    def __init__(self, cert_dir: str | Path) -> None:
        self.dir = Path(cert_dir)
        self._stamp = file_stamps(self.dir)
        cert, key = load_cert_dir(self.dir)
        check_pair(cert, key)
        self.initial = (cert, key)
        self._rejected: _Stamp | None = None
        self.reloads = 0

    def changed(self, build: Callable[[bytes, bytes], T]) -> T | None:
        """`build(cert, key)` of the pair on disk if the files changed since the last pair taken and it loads,
        matches and builds (CertificateError from `build` rejects it too); else None. A rejected pair is not
        read again until the files change once more."""
        stamp = file_stamps(self.dir)
        if stamp == self._stamp or stamp == self._rejected:
            return None
        try:
            cert, key = load_cert_dir(self.dir)
            check_pair(cert, key)
            made = build(cert, key)
        except CertificateError as e:
            self._rejected = stamp
            log.warning(
                "ext_proc_certificate_reload_failed cert_path=%s reason=%s; keeping the current pair", self.dir, e
            )
            return None
        self._stamp = stamp
        self._rejected = None
        self.reloads += 1
        log.info("ext_proc_certificate_reloaded cert_path=%s", self.dir)
        return made


class CertReloader:
    """Dynamic grpcio server credentials over the tls.crt / tls.key pair in `cert_dir`."""

    def __init__(self, cert_dir: str | Path) -> None:
        self._files = PairFiles(cert_dir)
        cert, key = self._files.initial
        self._initial = grpc.ssl_server_certificate_configuration([(key, cert)])

    @property
    def reloads(self) -> int:
        return self._files.reloads

    def fetch(self) -> grpc.ServerCertificateConfiguration | None:
        """None when the files did not change (or changed into something unusable); else the new pair."""
        try:
            return self._files.changed(lambda cert, key: grpc.ssl_server_certificate_configuration([(key, cert)]))
        except Exception:  # never break a handshake over a reload problem
            log.exception("ext_proc_certificate_reload_error cert_path=%s", self._files.dir)
            return None

    def credentials(self) -> grpc.ServerCredentials:
        return grpc.dynamic_ssl_server_credentials(self._initial, self.fetch)
