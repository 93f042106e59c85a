"""The metrics port: `/metrics` (Prometheus text or OpenMetrics, gzip when asked) and, with `--enable-pprof`,
`/debug/pprof/*` (observability.pprof), both behind the same access check (`--metrics-endpoint-auth`,
observability.metrics_auth). With `--metrics-cert-dir` it speaks HTTPS (TLS 1.2 or later), and with
`--metrics-client-ca-file` it also requires a client certificate signed by that CA, as the reference; a
replaced key pair in the cert dir is taken for the next connections (a pair that does not load is not).

Served from daemon threads, one per connection (the documented exception to "no threads": a scrape or
a 30 s profile must never wait for the event loop, nor hold it up)."""

from __future__ import annotations

import gzip
import logging
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from llm_epp.observability import pprof
from llm_epp.observability.metrics_auth import Decision
from llm_epp.security.cert_reload import file_stamps

log = logging.getLogger(__name__)

SOCKET_TIMEOUT = 60.0  # a connection that sends nothing for this long is closed


class Authorizer(Protocol):
    def check(self, authorization: str | None, method: str, path: str) -> Decision: ...


def server_tls_context(cert_dir: str, client_ca_file: str = "") -> ssl.SSLContext:
    """TLS 1.2+ with `cert_dir`/tls.crt and tls.key; with `client_ca_file`, client certificates from that CA
    are required. Raises OSError / ssl.SSLError with the file at fault."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(str(Path(cert_dir) / "tls.crt"), str(Path(cert_dir) / "tls.key"))
    if client_ca_file:
        ctx.load_verify_locations(cafile=client_ca_file)
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


class CertDirWatch:
    """Loads a changed tls.crt / tls.key from `cert_dir` into `ctx` (checked when a connection arrives)."""

    def __init__(self, ctx: ssl.SSLContext, cert_dir: str) -> None:
        self.ctx = ctx
        self._dir = Path(cert_dir)
        self._stamp = file_stamps(self._dir)
        self.reloads = 0

    def maybe_reload(self) -> None:
        stamp = file_stamps(self._dir)
        if stamp == self._stamp:
            return
        self._stamp = stamp
        try:
            self.ctx.load_cert_chain(str(self._dir / "tls.crt"), str(self._dir / "tls.key"))
        except (OSError, ssl.SSLError) as e:
            log.warning(
                "metrics_certificate_reload_failed cert_dir=%s reason=%s; keeping the current pair", self._dir, e
            )
            return
        self.reloads += 1
        log.info("metrics_certificate_reloaded cert_dir=%s", self._dir)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    registry: CollectorRegistry
    authorizer: Authorizer | None
    pprof_enabled: bool
    cert_watch: CertDirWatch | None = None

    def get_request(self) -> tuple[Any, Any]:
        if self.cert_watch is not None:  # before accepting, so this connection already gets a new pair
            self.cert_watch.maybe_reload()
        return super().get_request()

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("metrics_connection_error client=%s", client_address, exc_info=True)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"
    timeout = SOCKET_TIMEOUT

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _send(self, status: int, content_type: str, body: bytes, encoding: str = "") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        if encoding:
            self.send_header("Content-Encoding", encoding)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        parts = urlsplit(self.path)
        path = parts.path
        served = path == "/metrics" or (self.server.pprof_enabled and path.startswith("/debug/pprof"))
        if not served:
            self._send(404, "text/plain; charset=utf-8", b"404 page not found\n")
            return
        authorizer = self.server.authorizer
        if authorizer is not None:
            decision = authorizer.check(self.headers.get("Authorization"), "GET", path)
            if decision.status != 200:
                self._send(decision.status, "text/plain; charset=utf-8", decision.message.encode() + b"\n")
                return
        if path == "/metrics":
            encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
            body = encoder(self.server.registry)
            if "gzip" in self.headers.get("Accept-Encoding", ""):
                self._send(200, content_type, gzip.compress(body), "gzip")
            else:
                self._send(200, content_type, body)
            return
        answer = pprof.handle(path, parts.query)
        assert answer is not None
        self._send(answer.status, answer.content_type, answer.body)


class MetricsHttpServer:
    """Serves the metrics port on host:port (0 picks a free port; read it back from `.port`)."""

    def __init__(
        self,
        registry: CollectorRegistry,
        host: str = "0.0.0.0",
        port: int = 9090,
        *,
        authorizer: Authorizer | None = None,
        enable_pprof: bool = False,
        tls: ssl.SSLContext | None = None,
        cert_watch: CertDirWatch | None = None,
    ) -> None:
        self._registry = registry
        self._address = (host, port)
        self._authorizer = authorizer
        self._pprof = enable_pprof
        self._tls = tls
        self._cert_watch = cert_watch
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> MetricsHttpServer:
        """Binds and starts serving; raises OSError when the port cannot be bound."""
        if self._server is not None:
            return self
        server = _Server(self._address, _Handler)
        server.registry = self._registry
        server.authorizer = self._authorizer
        server.pprof_enabled = self._pprof
        server.cert_watch = self._cert_watch
        if self._tls is not None:  # the handshake happens on the connection's thread, not the accept loop
            server.socket = self._tls.wrap_socket(server.socket, server_side=True, do_handshake_on_connect=False)
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.2}, name="metrics-http", daemon=True
        )
        self._thread.start()
        return self

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("MetricsHttpServer is not started")
        return int(self._server.server_address[1])

    @property
    def scheme(self) -> str:
        return "https" if self._tls is not None else "http"

    def stop(self) -> None:
        server, thread = self._server, self._thread
        self._server = self._thread = None
        if server is not None:
            server.shutdown()
            server.server_close()
        if thread is not None:
            thread.join(timeout=5)

    def __enter__(self) -> MetricsHttpServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
