"""TLS for the ext_proc port when the event loop serves it (`--grpc-transport asyncio`): a Python
`ssl.SSLContext` with the same policy as the grpcio credentials (TLS 1.2 and 1.3, `--tls-cipher-suites` for
the TLS 1.2 suites, ALPN `h2`).

With `--enable-cert-reload` the context looks at tls.crt / tls.key at every new TLS handshake (two `stat`
calls, through the server-name callback, which OpenSSL runs for every ClientHello, with or without SNI)
and, when they changed, hands the handshake a new context built from them. A pair that does not load or
does not match is not taken: the previous one stays and the next handshake tries again, as with grpcio.
Open connections keep their session."""

from __future__ import annotations

import logging
import os
import ssl
import tempfile
from pathlib import Path

from llm_epp.security.cert_reload import PairFiles
from llm_epp.security.tls import CertificateError

log = logging.getLogger(__name__)


def server_context(cert: bytes, key: bytes, ciphers: str = "", client_ca: bytes | None = None) -> ssl.SSLContext:
    """A server context for the PEM pair; `ciphers` an OpenSSL list of TLS 1.2 suites ("" keeps the
    library's defaults); with `client_ca` (PEM) the handshake completes only for a client certificate that CA
    signed. Raises CertificateError when the pair or the CA does not load."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    if client_ca is not None:
        try:
            ctx.load_verify_locations(cadata=client_ca.decode("ascii", "replace"))
        except ssl.SSLError as e:
            raise CertificateError(f"cannot load the client CA: {e.reason or e}") from None
        ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.set_alpn_protocols(["h2"])
    if ciphers:
        ctx.set_ciphers(ciphers)
    with tempfile.TemporaryDirectory(prefix="llm-epp-tls-") as tmp:  # the ssl module loads files only
        cert_file, key_file = Path(tmp) / "tls.crt", Path(tmp) / "tls.key"
        cert_file.write_bytes(cert)
        fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(key)
        try:
            ctx.load_cert_chain(cert_file, key_file)
        except ssl.SSLError as e:
            raise CertificateError(f"cannot load the key pair: {e.reason or e}") from None
    return ctx


class ReloadingContext:
    """`context` serves the pair in `cert_dir` and follows its changes (see the module's docstring)."""

    def __init__(self, cert_dir: str | Path, ciphers: str = "", client_ca: bytes | None = None) -> None:
        self._files = PairFiles(cert_dir)
        self._ciphers = ciphers
        self._client_ca = client_ca  # every context built keeps requiring (and trusting) it
        self.context = server_context(*self._files.initial, ciphers, client_ca)
        self.context.sni_callback = self._on_hello
        self._current = self.context

    @property
    def reloads(self) -> int:
        return self._files.reloads

    def _build(self, cert: bytes, key: bytes) -> ssl.SSLContext:
        return server_context(cert, key, self._ciphers, self._client_ca)

    def _on_hello(self, conn: ssl.SSLObject, _server_name: str | None, _ctx: ssl.SSLContext) -> None:
        try:
            fresh = self._files.changed(self._build)
            if fresh is not None:
                self._current = fresh
            if self._current is not self.context:
                conn.context = self._current
        except Exception:  # never break a handshake over a reload problem
            log.exception("ext_proc_certificate_reload_error cert_path=%s", self._files.dir)
