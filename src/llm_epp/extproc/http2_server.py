"""The ext_proc port served in the event loop's own thread (`--grpc-transport asyncio`, the default).

grpcio runs its transport in C++ threads that hand every message to the event loop through a poller thread
and an eventfd; on a busy two-core box those hand-offs cost more than the framing itself. Here the loop reads
the socket, `llm_epp.extproc.http2` frames gRPC over HTTP/2, and a request's messages reach
`ExtProcServicer.process` with no thread in between (`benchmarks/results/overhead_picker.md`, "Eleventh
check", for what it saves).

`ExtProcServer` has the parts of `grpc.aio.Server` that `llm-epp serve` uses: `bind()` (the `add_*_port`
step, before start), `start()` and `stop(grace)`. It serves:

- `envoy.service.ext_proc.v3.ExternalProcessor/Process` (unless `process` is None, as on the health port),
  the servicer's stream handler behind a context with `read()` (`grpc.aio.EOF` at the end) and
  `write(bytes)`, as grpc.aio gives it. A message larger than `max_recv` is refused with RESOURCE_EXHAUSTED
  before it is read (the length prefix says its size), an answer larger than `max_send` likewise;
  compressed messages are refused (Envoy does not compress).
- `grpc.health.v1.Health` (Check, List; Watch answers UNIMPLEMENTED) when given a `HealthState`.
- unary methods given as `UnaryMethod`s (the direct-routing API, behind its guard): each gets a context with
  the parts of grpc.aio's that the API uses (`abort`, `invocation_metadata`, `peer`, and `auth_context` with
  the verified client certificate's names when the `ssl_context` requires one).
- with `StreamMetrics`: the ext_proc stream counters, as the grpcio interceptor keeps them.

`stop(grace)` refuses new streams at once (UNAVAILABLE) and closes the listener, gives the streams in
flight up to `grace` seconds, then cancels what is left and drops the connections; `stop(None)` cancels at
once. What a client can make the server hold is bounded per connection (`max_streams` streams and the
flow-control windows) and across connections: received data not yet read, and messages being gathered,
count in `held` (`--max-held-request-bytes`). The connections themselves are at most `max_connections`
(`--grpc-max-connections`): one past it is sent GOAWAY (ENHANCE_YOUR_CALM) and closed; a connection that
has not sent the HTTP/2 client preface within 20 s is closed; and the streams open on all connections
together are at most `max_open_streams` (`--grpc-max-streams`; one past it is refused with
REFUSED_STREAM). A client that can connect can still take those connections and streams from the
gateways, so the port needs TLS (`--secure-serving`) or a network boundary.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import logging
import socket
import ssl
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import grpc
from google.protobuf.message import DecodeError

from llm_epp.extproc.held import DEFAULT_MAX_HELD_BYTES, HeldBytes
from llm_epp.extproc.http2 import (
    ENHANCE_YOUR_CALM,
    MAX_CONCURRENT_STREAMS,
    Handler,
    Http2Connection,
    RpcError,
    Stream,
    StreamCount,
    goodbye,
    log_connection_refused,
)
from llm_epp.observability.health import (
    SERVICE as HEALTH_SERVICE,
)
from llm_epp.observability.health import (
    HealthState,
    decode_check_request,
    encode_check_response,
    encode_list_response,
    log_check,
)
from llm_epp.observability.stream_metrics import GO_CODE_NAMES

if TYPE_CHECKING:
    from llm_epp.observability.stream_metrics import StreamMetrics

log = logging.getLogger(__name__)

PROCESS = "/envoy.service.ext_proc.v3.ExternalProcessor/Process"
DEFAULT_MAX_CONNECTIONS = 4096  # --grpc-max-connections
DEFAULT_MAX_STREAMS = 65_536  # --grpc-max-streams: across connections
_EOF = grpc.aio.EOF
_HEALTH_REQUEST_MAX = 1 << 16


class _Refused(asyncio.Protocol):
    """A connection past the server's limit: sent SETTINGS, then GOAWAY with ENHANCE_YOUR_CALM and no stream
    accepted, and closed. What it sends meanwhile is discarded, for at most `LINGER_S`: a socket closed with
    unread input is reset, and the reset can destroy the GOAWAY before the client reads it."""

    LINGER_S = 1.0
    _GOODBYE = goodbye(ENHANCE_YOUR_CALM, "too many connections")

    def __init__(self) -> None:
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, base: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, base)  # uvloop's transports do not subclass asyncio's
        transport.write(self._GOODBYE)
        if transport.can_write_eof():
            transport.write_eof()
        self._timer = asyncio.get_running_loop().call_later(self.LINGER_S, transport.close)

    def data_received(self, data: bytes) -> None:
        pass

    def eof_received(self) -> bool:
        return False  # the transport closes

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()


@dataclass(frozen=True)
class UnaryMethod:
    """A unary RPC served beside ext_proc (the direct-routing API): how its request is decoded, what answers
    it (`behavior(request, context)`, with the context grpc.aio's methods would get) and how the answer is
    encoded."""

    deserialize: Callable[[bytes], Any]
    behavior: Callable[[Any, Any], Awaitable[Any]]
    serialize: Callable[[Any], bytes]


class _UnaryContext:
    """The parts of grpc.aio's ServicerContext that a unary method and its guard use: `abort`, the call's
    metadata, the peer's address and, over mTLS, the identity in the client's certificate."""

    __slots__ = ("_stream",)

    def __init__(self, stream: Stream) -> None:
        self._stream = stream

    async def abort(self, code: grpc.StatusCode, details: str = "") -> None:
        raise RpcError(code, details)

    def invocation_metadata(self) -> tuple[tuple[str, str | bytes], ...]:
        out: list[tuple[str, str | bytes]] = []
        for name, value in self._stream.headers:
            if name.startswith(b":"):
                continue
            key = name.decode("latin-1")
            if key.endswith("-bin"):
                try:
                    out.append((key, base64.b64decode(value + b"=" * (-len(value) % 4))))
                except ValueError:
                    continue
            else:
                out.append((key, value.decode("latin-1")))
        return tuple(out)

    def peer(self) -> str:
        address = self._stream._conn.extra_info("peername")
        if not isinstance(address, tuple) or len(address) < 2:
            return "unknown"
        host, port = address[0], address[1]
        return f"ipv6:[{host}]:{port}" if ":" in host else f"ipv4:{host}:{port}"

    def auth_context(self) -> dict[str, list[bytes]]:
        """As gRPC names them: `x509_common_name` and `x509_subject_alternative_name` of a verified client
        certificate (empty without one)."""
        ssl_object = self._stream._conn.extra_info("ssl_object")
        cert = ssl_object.getpeercert() if ssl_object is not None else None
        if not cert:
            return {}
        out: dict[str, list[bytes]] = {}
        for rdn in cert.get("subject", ()):
            for key, value in rdn:
                if key == "commonName":
                    out.setdefault("x509_common_name", []).append(value.encode())
        for _kind, value in cert.get("subjectAltName", ()):
            out.setdefault("x509_subject_alternative_name", []).append(value.encode())
        return out


class _Context:
    """What `ExtProcServicer.process` reads and writes through: grpc.aio's `read()` / `write()`."""

    __slots__ = ("read", "write")

    def __init__(self, stream: Stream, decode: Callable[[bytes], Any], max_recv: int, max_send: int) -> None:
        receive = stream.read
        send = stream.write

        async def read() -> Any:
            data = await receive(max_recv)
            if data is None:
                return _EOF
            try:
                return decode(data)
            except DecodeError as e:
                raise RpcError(grpc.StatusCode.INTERNAL, f"cannot parse the message: {e}") from None

        async def write(answer: bytes) -> None:
            if len(answer) > max_send:
                raise RpcError(
                    grpc.StatusCode.RESOURCE_EXHAUSTED, f"sent message larger than max ({len(answer)} vs. {max_send})"
                )
            await send(answer)

        self.read = read
        self.write = write


class ExtProcServer:
    def __init__(
        self,
        process: Callable[[Any, Any], Awaitable[None]] | None,
        decode: Callable[[bytes], Any],
        *,
        max_recv: int,
        max_send: int,
        health: HealthState | None = None,
        stream_metrics: StreamMetrics | None = None,
        ssl_context: ssl.SSLContext | None = None,
        held: HeldBytes | None = None,
        max_streams: int = MAX_CONCURRENT_STREAMS,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        max_open_streams: int = DEFAULT_MAX_STREAMS,
        unary: Mapping[str, UnaryMethod] | None = None,
    ) -> None:
        self._process = process
        self._decode = decode
        self.max_recv = max_recv
        self.max_send = max_send
        self._health = health
        self._metrics = stream_metrics
        self._ssl = ssl_context
        self.held = held if held is not None else HeldBytes(DEFAULT_MAX_HELD_BYTES)
        self._max_streams = max_streams
        self.max_connections = max_connections  # 0: no limit
        self.refused_connections = 0
        self.open_streams = StreamCount(max_open_streams)  # 0: no limit
        self._sock: socket.socket | None = None
        self._listener: asyncio.Server | None = None
        self._connections: set[Http2Connection] = set()
        self._refusing = False
        self._streams = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._routes: dict[str, Handler] = {PROCESS: self._ext_proc} if process is not None else {}
        if health is not None:
            self._routes |= {
                f"/{HEALTH_SERVICE}/Check": self._check,
                f"/{HEALTH_SERVICE}/List": self._list,
                f"/{HEALTH_SERVICE}/Watch": self._watch,
            }
        for path, method in (unary or {}).items():
            self._routes[path] = functools.partial(self._unary, method)
        self.port = 0

    # --- grpc.aio.Server's surface ---------------------------------------------------------------------
    def bind(self, host: str, port: int) -> int:
        """Opens the listening socket (before `start()`, like `add_insecure_port`); the bound port. Raises
        OSError when the address cannot be bound."""
        host = host.strip("[]") or "0.0.0.0"
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        sock = socket.socket(family, kind, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6 and host == "::":
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            sock.bind(address)
            sock.listen(1024)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        self._sock = sock
        self.port = int(sock.getsockname()[1])
        return self.port

    async def start(self) -> None:
        if self._sock is None:
            raise RuntimeError("bind() the server before start()")
        self._listener = await asyncio.get_running_loop().create_server(
            self._connection, sock=self._sock, ssl=self._ssl
        )

    async def stop(self, grace: float | None) -> None:
        listener = self._listener
        if listener is None:
            if self._sock is not None:
                self._sock.close()
            return
        self._refusing = True
        listener.close()  # no new connections; the open ones stay until the streams in flight are over
        if grace:
            try:
                await asyncio.wait_for(self._idle.wait(), grace)
            except TimeoutError:
                log.info("ext_proc_streams_cancelled_at_stop streams=%d grace=%.1fs", self._streams, grace)
        handlers = [task for conn in self._connections for task in conn.handlers()]
        for task in handlers:
            task.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)
        for conn in list(self._connections):
            conn.abort()
        await listener.wait_closed()
        await asyncio.sleep(0)  # lets the loop release the aborted sockets
        self._listener = None

    # --- connections ------------------------------------------------------------------------------------
    def _connection(self) -> asyncio.Protocol:
        if self.max_connections and len(self._connections) >= self.max_connections:
            self.refused_connections += 1
            log_connection_refused(
                "grpc_connection_refused port=%d connections=%d limit=%d (--grpc-max-connections): a connection "
                "past the limit is closed at once",
                self.port,
                len(self._connections),
                self.max_connections,
            )
            return _Refused()
        conn = Http2Connection(
            self._routes.get,
            self._is_refusing,
            self._connections.discard,
            self.held,
            self._max_streams,
            self.open_streams,
        )
        self._connections.add(conn)
        return conn

    def _is_refusing(self) -> bool:
        return self._refusing

    # --- handlers ---------------------------------------------------------------------------------------
    async def _ext_proc(self, stream: Stream) -> None:
        assert self._process is not None  # routed only when given
        self._streams += 1
        self._idle.clear()
        metrics = self._metrics
        start = time.perf_counter()
        code = "OK"
        if metrics is not None:
            metrics.inflight.inc()
        try:
            await self._process(None, _Context(stream, self._decode, self.max_recv, self.max_send))
        except asyncio.CancelledError:
            code = "Canceled"
            raise
        except RpcError as e:
            code = GO_CODE_NAMES[e.code]
            raise
        except Exception:
            code = "Unknown"
            raise
        finally:
            self._streams -= 1
            if not self._streams:
                self._idle.set()
            if metrics is not None:
                metrics.inflight.dec()
                metrics.duration.observe(time.perf_counter() - start)
                metrics.total.labels(code).inc()

    async def _unary(self, method: UnaryMethod, stream: Stream) -> None:
        data = await stream.read(self.max_recv)
        if data is None:
            raise RpcError(grpc.StatusCode.INTERNAL, "the call sent no request message")
        response = await method.behavior(method.deserialize(data), _UnaryContext(stream))
        answer = method.serialize(response)
        if len(answer) > self.max_send:
            raise RpcError(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"the answer is {len(answer)} bytes, more than the server sends ({self.max_send})",
            )
        await stream.write(answer)

    async def _check(self, stream: Stream) -> None:
        assert self._health is not None
        data = await stream.read(_HEALTH_REQUEST_MAX)
        service = decode_check_request(data or b"")
        status = self._health.status(service)
        log_check(self._health, service, status)
        await stream.write(encode_check_response(status))

    async def _list(self, stream: Stream) -> None:
        assert self._health is not None
        await stream.read(_HEALTH_REQUEST_MAX)
        state = self._health
        await stream.write(encode_list_response({n: state.status(n) for n in state.listed_services()}))

    async def _watch(self, stream: Stream) -> None:
        raise RpcError(grpc.StatusCode.UNIMPLEMENTED, "Watch is not implemented")
