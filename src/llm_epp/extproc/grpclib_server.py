"""The ext_proc port served by grpclib: HTTP/2 and gRPC framing run in the event loop's own thread.

grpcio runs its transport in C++ threads that hand every message to the event loop through a poller thread
and an eventfd; on a busy two-core box those hand-offs cost more than the framing itself. grpclib parses
HTTP/2 (with h2) inside the loop, so a request's messages go from the socket to `ExtProcServicer.process`
with no thread in between. Measured through Envoy beside grpcio (`benchmarks/results/overhead_picker.md`,
"Tenth check"), the same servicer costs about a fifth less CPU per request.

`ExtProcServer` has the parts of `grpc.aio.Server` that `llm-epp serve` uses: `bind()` (the
`add_*_port` step, before start), `start()` and `stop(grace)`. It serves:

- `envoy.service.ext_proc.v3.ExternalProcessor/Process`, the servicer's stream handler behind a context with
  `read()` (`grpc.aio.EOF` at the end) and `write(bytes)`, as grpc.aio gives it. A message larger than
  `max_recv` is refused with RESOURCE_EXHAUSTED before it is read (the length prefix says its size), an
  answer larger than `max_send` likewise; compressed messages are refused (Envoy does not compress).
- `grpc.health.v1.Health` (Check, List; Watch answers UNIMPLEMENTED) when given a `HealthState`.
- with `StreamMetrics`: the ext_proc stream counters, as the grpcio interceptor keeps them.

`stop(grace)` refuses new streams at once (UNAVAILABLE) and closes the listener, gives the streams in
flight up to `grace` seconds, then cancels what is left; `stop(None)` cancels at once.

Limits: at most `MAX_CONCURRENT_STREAMS` streams per connection (grpcio has none; h2's default of 100 would
make a burst on a fresh connection a protocol error), headers up to h2's 64 KiB. Anything that can reach
the port can open connections: the port needs TLS (`--secure-serving`) or a network boundary, as before.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import time
import weakref
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import grpc
from google.protobuf.message import DecodeError
from grpclib.const import Cardinality, Handler, Status
from grpclib.encoding.base import CodecBase
from grpclib.exceptions import GRPCError
from grpclib.protocol import H2Protocol
from grpclib.server import Server
from h2.settings import SettingCodes

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
MAX_CONCURRENT_STREAMS = 2**31 - 1
_EOF = grpc.aio.EOF

# grpclib logs every stream the peer resets at INFO ("Request was cancelled"); Envoy ends each ext_proc
# stream that way, so those lines would be one per request.
logging.getLogger("grpclib.server").setLevel(logging.WARNING)


class _Bytes(CodecBase):
    """Messages stay bytes: each handler decodes and encodes its own."""

    __content_subtype__ = "proto"

    def encode(self, message: Any, message_type: Any) -> bytes:
        return bytes(message)

    def decode(self, data: bytes, message_type: Any) -> bytes:
        return data


async def _receive(stream: Any, max_size: int) -> bytes | None:
    """The next message's bytes, or None at the end of the client's side; refuses one above `max_size`
    before reading it."""
    raw = stream._stream  # grpclib's protocol stream: the DATA buffer
    try:
        head = await raw.recv_data(5)
        if not head:
            return None
        if head[0]:
            raise GRPCError(Status.UNIMPLEMENTED, "compressed messages are not supported")
        size = int.from_bytes(head[1:5], "big")
        if size > max_size:
            raise GRPCError(Status.RESOURCE_EXHAUSTED, f"received message larger than max ({size} vs. {max_size})")
        return await raw.recv_data(size)
    except AssertionError:  # grpclib's buffer: the client's side ended inside a message
        raise GRPCError(Status.INTERNAL, "the stream ended inside a message") from None


class _Context:
    """What `ExtProcServicer.process` reads and writes through: grpc.aio's `read()` / `write()`."""

    __slots__ = ("read", "write")

    def __init__(self, stream: Any, decode: Callable[[bytes], Any], max_recv: int, max_send: int) -> None:
        send = stream.send_message

        async def read() -> Any:
            data = await _receive(stream, max_recv)
            if data is None:
                return _EOF
            try:
                return decode(data)
            except DecodeError as e:
                raise GRPCError(Status.INTERNAL, f"cannot parse the message: {e}") from None

        async def write(answer: bytes) -> None:
            if len(answer) > max_send:
                raise GRPCError(
                    Status.RESOURCE_EXHAUSTED, f"sent message larger than max ({len(answer)} vs. {max_send})"
                )
            await send(answer)

        self.read = read
        self.write = write


class _Protocol(H2Protocol):
    transport: Any = None

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        self.transport = transport
        self.connection._connection.update_settings({SettingCodes.MAX_CONCURRENT_STREAMS: MAX_CONCURRENT_STREAMS})
        self.connection.flush()


class _Server(Server):
    """grpclib's server with `_Protocol` connections, which it keeps so `close_connections` can end them."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.connections: weakref.WeakSet[_Protocol] = weakref.WeakSet()

    def _protocol_factory(self) -> H2Protocol:
        made = super()._protocol_factory()
        protocol = _Protocol(made.handler, made.config, made.h2_config)
        self.connections.add(protocol)
        return protocol

    async def close_connections(self) -> None:
        """Drops every connection still open (the streams on them are over) and lets the loop release their
        sockets."""
        for protocol in list(self.connections):
            if protocol.transport is not None and not protocol.transport.is_closing():
                protocol.transport.abort()
        await asyncio.sleep(0)


class ExtProcServer:
    def __init__(
        self,
        process: Callable[[Any, Any], Awaitable[None]],
        decode: Callable[[bytes], Any],
        *,
        max_recv: int,
        max_send: int,
        health: HealthState | None = None,
        stream_metrics: StreamMetrics | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self._process = process
        self._decode = decode
        self.max_recv = max_recv
        self.max_send = max_send
        self._health = health
        self._metrics = stream_metrics
        self._ssl = ssl_context
        self._sock: socket.socket | None = None
        self._server: _Server | None = None
        self._refusing = False
        self._streams = 0
        self._idle = asyncio.Event()
        self._idle.set()
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
        server = _Server([self], codec=_Bytes())
        await server.start(sock=self._sock, ssl=self._ssl)
        self._server = server

    async def stop(self, grace: float | None) -> None:
        server = self._server
        if server is None:
            if self._sock is not None:
                self._sock.close()
            return
        self._refusing = True
        listener = server._server  # the asyncio server: stop accepting connections, keep the open ones
        if listener is not None:
            listener.close()
        if grace:
            try:
                await asyncio.wait_for(self._idle.wait(), grace)
            except TimeoutError:
                log.info("ext_proc_streams_cancelled_at_stop streams=%d grace=%.1fs", self._streams, grace)
        server.close()  # cancels the streams still in flight
        await server.wait_closed()
        await server.close_connections()
        self._server = None

    # --- grpclib's IServable -----------------------------------------------------------------------------
    def __mapping__(self) -> dict[str, Handler]:
        mapping = {PROCESS: Handler(self._ext_proc, Cardinality.STREAM_STREAM, bytes, bytes)}
        if self._health is not None:
            mapping[f"/{HEALTH_SERVICE}/Check"] = Handler(self._check, Cardinality.UNARY_UNARY, bytes, bytes)
            mapping[f"/{HEALTH_SERVICE}/List"] = Handler(self._list, Cardinality.UNARY_UNARY, bytes, bytes)
            mapping[f"/{HEALTH_SERVICE}/Watch"] = Handler(self._watch, Cardinality.UNARY_STREAM, bytes, bytes)
        return mapping

    async def _ext_proc(self, stream: Any) -> None:
        if self._refusing:
            raise GRPCError(Status.UNAVAILABLE, "the EPP is shutting down")
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
        except GRPCError as e:
            code = _go_code(e.status)
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

    async def _check(self, stream: Any) -> None:
        assert self._health is not None
        data = await _receive(stream, 1 << 16)
        service = decode_check_request(data or b"")
        status = self._health.status(service)
        log_check(self._health, service, status)
        await stream.send_message(encode_check_response(status))

    async def _list(self, stream: Any) -> None:
        assert self._health is not None
        await _receive(stream, 1 << 16)
        state = self._health
        await stream.send_message(encode_list_response({n: state.status(n) for n in state.listed_services()}))

    async def _watch(self, stream: Any) -> None:
        raise GRPCError(Status.UNIMPLEMENTED, "Watch is not implemented")


def _go_code(status: Status) -> str:
    """Go's codes.Code.String() of a grpclib status, as the grpcio interceptor labels streams."""
    return GO_CODE_NAMES[grpc.StatusCode[status.name]]
