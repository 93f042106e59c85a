"""gRPC over HTTP/2 (RFC 9113) inside the event loop: the connection protocol behind the ext_proc port.

Only the server side of what gRPC uses: one request stream per RPC, messages in DATA frames behind gRPC's
5-byte length prefix, a status in trailers. Header blocks are decoded with `hpack`; the few header blocks
the server sends are literals that never touch HPACK's dynamic table, so they are built once. Everything
else (frames, flow control, stream states) is here, and costs a fraction of a general HTTP/2 stack per
request (`benchmarks/results/overhead_picker.md`, "Eleventh check").

Bounds a client cannot lift:

- frames of at most 16 KiB (the protocol's default), header blocks of at most `MAX_HEADER_BLOCK` bytes;
- at most `max_streams` streams open per connection (SETTINGS_MAX_CONCURRENT_STREAMS, more are refused with
  REFUSED_STREAM); until the client acknowledges the setting, `UNACKED_STREAMS_FACTOR` times as many, since
  a gateway may open a burst of streams before the setting reaches it;
- a message's size checked from its length prefix before it is read;
- received data acknowledged only as handlers consume it, so a connection buffers at most its flow-control
  window (`CONNECTION_WINDOW`);
- across all connections, what has arrived and is not read yet, and the messages being gathered, count in
  `held` from the moment they arrive. Past its limit, a stream's data is dropped and its reads raise
  `HeldBytesExceeded` (a handler that does not catch it ends with RESOURCE_EXHAUSTED). The number of
  connections therefore does not multiply what the windows let a client park.

Answers leave in one write per loop pass and connection (`_flush`), or sooner past `FLUSH_AT` bytes; while
the peer does not read them, the connection does not read the peer.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, cast
from urllib.parse import quote

import grpc
from hpack import Decoder
from hpack.exceptions import HPACKError

from llm_epp.extproc.held import HeldBytes, HeldBytesExceeded
from llm_epp.observability.logging import InfoOncePerInterval

log = logging.getLogger(__name__)

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
END_STREAM = ACK = 0x1
END_HEADERS = 0x4
PADDED = 0x8
PRIORITY_FLAG = 0x20

NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR = 0x0, 0x1, 0x2, 0x3
STREAM_CLOSED, FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL, COMPRESSION_ERROR = 0x5, 0x6, 0x7, 0x8, 0x9
ENHANCE_YOUR_CALM = 0xB

SETTINGS_HEADER_TABLE_SIZE, SETTINGS_MAX_CONCURRENT_STREAMS = 0x1, 0x3
SETTINGS_INITIAL_WINDOW_SIZE, SETTINGS_MAX_FRAME_SIZE = 0x4, 0x5
SETTINGS_MAX_HEADER_LIST_SIZE = 0x6

MAX_FRAME = 16_384  # what we accept (the protocol's default; we never raise it)
MAX_HEADER_BLOCK = 65_536  # a header block (HEADERS and its CONTINUATIONs), encoded
STREAM_WINDOW = 1 << 20  # what one stream may send ahead of its handler
CONNECTION_WINDOW = 16 << 20  # what one connection may send ahead of its handlers
MAX_CONCURRENT_STREAMS = 1024  # per connection; a gateway needing more opens another connection
UNACKED_STREAMS_FACTOR = 4  # the limit is that many times higher until the client has acknowledged it
MAX_WINDOW = (1 << 31) - 1
MAX_STATUS_MESSAGE = 1024  # characters of grpc-message
FLUSH_AT = 64 << 10  # output held for the end of the loop pass, at most; more is written at once
PREFACE_TIMEOUT_S = 20.0  # a connection that has not sent the client preface by then is closed
ERROR_LOG_INTERVAL_S = 10.0  # connection errors: one INFO line per interval, the others at VERBOSE

# Connection errors and refusals: any client that can connect can cause them, and must not flood the log. Each
# kind has a budget of its own, so that a flood of one (garbage connections) cannot push the others (the server's
# limits being reached, which the operator must see) down to VERBOSE.
log_connection_error = InfoOncePerInterval(log, ERROR_LOG_INTERVAL_S).log
log_stream_refused = InfoOncePerInterval(log, ERROR_LOG_INTERVAL_S).log
log_connection_refused = InfoOncePerInterval(log, ERROR_LOG_INTERVAL_S).log


class StreamCount:
    """The streams open on all of a server's connections, and how many it serves at once (0: no limit)."""

    __slots__ = ("limit", "open")

    def __init__(self, limit: int = 0) -> None:
        self.limit = limit
        self.open = 0


class RpcError(Exception):
    """Ends an RPC with a gRPC status other than OK; `message` goes to the client as grpc-message."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class _ConnectionError(Exception):
    def __init__(self, code: int, why: str) -> None:
        super().__init__(why)
        self.code = code


def _frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    return len(payload).to_bytes(3, "big") + bytes((kind, flags)) + stream_id.to_bytes(4, "big") + payload


def goodbye(code: int, why: str) -> bytes:
    """What a server sends a connection it will not serve: its (empty) SETTINGS, which must come first, then
    GOAWAY with no stream accepted."""
    return _frame(SETTINGS, 0, 0) + _frame(GOAWAY, 0, 0, bytes(4) + code.to_bytes(4, "big") + why.encode())


def _hpack_int(value: int, prefix_bits: int, first: int) -> bytes:
    """An HPACK integer (RFC 7541 5.1) with `first`'s high bits above the prefix."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    out = bytearray((first | limit,))
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _literal(name: bytes, value: bytes) -> bytes:
    """A header as a literal that is never indexed (RFC 7541 6.2.3): no dynamic-table state on either side."""
    return b"\x10" + _hpack_int(len(name), 7, 0) + name + _hpack_int(len(value), 7, 0) + value


_STATUS_200 = b"\x88"  # ':status: 200', static table entry 8
_GRPC_HEADERS = _STATUS_200 + _literal(b"content-type", b"application/grpc")
_OK_TRAILERS = _literal(b"grpc-status", b"0")
_NOT_GRPC = b"\x18\x03415"  # ':status: 415' (never indexed, name from the static table): not a gRPC request


def _status_block(code: grpc.StatusCode, message: str) -> bytes:
    block = _literal(b"grpc-status", str(code.value[0]).encode())
    message = message[:MAX_STATUS_MESSAGE]  # it may quote the client (an unknown path): one frame holds it
    if message:  # percent-encoded as gRPC's HTTP/2 mapping asks
        block += _literal(b"grpc-message", quote(message, safe=" !\"#$&'()*+,-./:;<=>?@[\\]^_`{|}~").encode())
    return block


class Stream:
    """One RPC: `read()` its messages, `write()` answers; the handler's return ends it with status OK."""

    __slots__ = (
        "_buffered",
        "_chunks",
        "_conn",
        "_held",
        "_refused",
        "_unacked",
        "_waiter",
        "ended",
        "headers",
        "id",
        "path",
        "remote_ended",
        "send_window",
        "started",
        "task",
    )

    def __init__(self, conn: Http2Connection, stream_id: int, path: str) -> None:
        self.id = stream_id
        self.path = path
        self._conn = conn
        self._held = conn.held
        self._chunks: deque[bytes] = deque()
        self._buffered = 0
        self._refused = False  # its data passed the held bytes: dropped, and its reads raise
        self._waiter: asyncio.Future[None] | None = None
        self._unacked = 0  # consumed by the handler, not yet returned to the peer's window
        self.remote_ended = False
        self.started = False  # response headers sent
        self.ended = False  # our END_STREAM sent, or the stream reset
        self.send_window = conn.peer_initial_window
        self.task: asyncio.Task[None] | None = None
        self.headers: list[tuple[bytes, bytes]] = []  # the request's header block, decoded

    # --- receiving -----------------------------------------------------------------------------------------
    def _received(self, data: bytes) -> None:
        if data:
            self._chunks.append(data)
            self._buffered += len(data)
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _refuse(self) -> None:
        """Drops what the stream holds and ends its reads (`HeldBytesExceeded`)."""
        self._refused = True
        self._conn.release(self)
        self._wake()

    async def _more(self) -> bool:
        """Waits for data or the end of the client's side; False at the end with nothing buffered."""
        while not self._buffered:
            if self._refused:
                raise HeldBytesExceeded(
                    "the endpoint picker holds too many request bytes right now (--max-held-request-bytes): retry later"
                )
            if self.remote_ended:
                return False
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return True

    def _take(self, n: int, keep_held: bool = False) -> bytes:
        """Up to `n` buffered bytes, returned to the peer's window (and, unless `keep_held`, to the held
        bytes)."""
        head = self._chunks[0]
        if len(head) <= n:
            self._chunks.popleft()
            taken = head
        else:
            taken, self._chunks[0] = head[:n], head[n:]
        size = len(taken)
        self._buffered -= size
        if not keep_held:
            self._held.used -= size  # HeldBytes.give, inline: this runs for every message
        self._consumed(size)
        return taken

    def _consumed(self, n: int) -> None:
        self._unacked += n
        if self._unacked >= STREAM_WINDOW // 2 and not self.remote_ended:
            self._conn.window_update(self.id, self._unacked)
            self._unacked = 0
        self._conn.consumed(n)

    async def _exactly(self, n: int) -> bytes | None:
        """`n` bytes (a message that spans frames is gathered as they arrive); None if the client's side ends
        first."""
        if self._buffered >= n and len(self._chunks[0]) >= n:
            return self._take(n)
        parts = bytearray()  # counted in the held bytes, as it was on arrival
        try:
            while len(parts) < n:
                if not await self._more():
                    return None
                parts += self._take(n - len(parts), keep_held=True)
        finally:
            self._held.give(len(parts))
        return bytes(parts)

    async def read(self, max_size: int) -> bytes | None:
        """The next message, or None when the client's side has ended. Raises `RpcError` for a message above
        `max_size` (refused from its length prefix, before it is read), a compressed one, or a stream that ends
        inside a message."""
        if not self._buffered and not await self._more():
            return None
        head = await self._exactly(5)
        if head is None:
            raise RpcError(grpc.StatusCode.INTERNAL, "the stream ended inside a message")
        if head[0]:
            raise RpcError(grpc.StatusCode.UNIMPLEMENTED, "compressed messages are not supported")
        size = int.from_bytes(head[1:5], "big")
        if size > max_size:
            raise RpcError(
                grpc.StatusCode.RESOURCE_EXHAUSTED, f"received message larger than max ({size} vs. {max_size})"
            )
        if not size:
            return b""
        body = await self._exactly(size)
        if body is None:
            raise RpcError(grpc.StatusCode.INTERNAL, "the stream ended inside a message")
        return body

    # --- sending -------------------------------------------------------------------------------------------
    async def write(self, message: bytes) -> None:
        """Sends one message (the response headers first, with the first one)."""
        conn = self._conn
        if self.ended:
            raise asyncio.CancelledError  # reset by the client: the handler is being cancelled
        if not self.started:
            self.started = True
            conn.headers(self.id, _GRPC_HEADERS, end_stream=False)
        framed = b"\0" + len(message).to_bytes(4, "big") + message
        size = len(framed)
        if size <= conn.peer_max_frame and size <= self.send_window and size <= conn.send_window and conn.writable:
            self.send_window -= size
            conn.send_window -= size
            conn.data(self.id, framed)
            return
        await conn.send_flow_controlled(self, memoryview(framed))

    def finish(self, code: grpc.StatusCode | None = None, message: str = "") -> None:
        """Trailers: status OK (code None) or the given one; a response with no message yet is trailers-only."""
        if self.ended:
            return
        block = _OK_TRAILERS if code is None else _status_block(code, message)
        if not self.started:
            self.started = True
            block = _GRPC_HEADERS + block
        self._conn.headers(self.id, block, end_stream=True)
        self.ended = True


Handler = Callable[[Stream], Awaitable[None]]


class Http2Connection(asyncio.Protocol):
    """One client connection. `route(path)` gives the handler of an RPC, or None (UNIMPLEMENTED);
    `refusing()` true makes new RPCs end at once with UNAVAILABLE."""

    def __init__(
        self,
        route: Callable[[str], Handler | None],
        refusing: Callable[[], bool],
        on_close: Callable[[Http2Connection], None],
        held: HeldBytes,
        max_streams: int = MAX_CONCURRENT_STREAMS,
        open_streams: StreamCount | None = None,
    ) -> None:
        self._route = route
        self._refusing = refusing
        self._on_close = on_close
        self.held = held  # what has arrived on all connections and is not read yet, and messages being gathered
        self._max_streams = max_streams
        self._stream_limit = max_streams * UNACKED_STREAMS_FACTOR
        self.open_streams = open_streams if open_streams is not None else StreamCount()  # across connections
        self._loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self._buf = bytearray()  # the start of a frame (or of the preface) that has not fully arrived
        self._need = 0  # how long `_buf` must grow before a frame (or the preface) can be read from it
        self._preface = False
        self._preface_timer: asyncio.TimerHandle | None = None
        self._settings_seen = False
        self._decoder = Decoder()
        self._decoder.max_header_list_size = MAX_HEADER_BLOCK
        self._table = self._decoder.header_table
        # The last header block decoded, with the state of HPACK's dynamic table it was decoded in (newest
        # entry, entry count, size) and what it decoded to. A gateway sends the same block for each of its
        # RPCs; in the same state, the same bytes decode to the same headers and leave the table as it was.
        self._last_block: tuple[bytes, object, int, int, list[tuple[bytes, bytes]]] | None = None
        self._block: bytearray | None = None  # a header block waiting for CONTINUATION frames
        self._block_stream = 0
        self._block_end_stream = False
        self.streams: dict[int, Stream] = {}
        self._last_id = 0
        self._goaway = False
        self.peer_initial_window = 65_535
        self.peer_max_frame = MAX_FRAME
        self.send_window = 65_535
        self._unacked = 0
        self._window_used = 0  # bytes the peer sent that we have not returned to its connection window
        self.writable = True
        self._can_send: asyncio.Event | None = None  # set when the peer's windows grow or it reads again
        self._out: list[bytes] = []
        self._out_bytes = 0
        self._flush_due = False

    # --- asyncio.Protocol ----------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        settings = (
            SETTINGS_MAX_CONCURRENT_STREAMS.to_bytes(2, "big")
            + self._max_streams.to_bytes(4, "big")
            + SETTINGS_INITIAL_WINDOW_SIZE.to_bytes(2, "big")
            + STREAM_WINDOW.to_bytes(4, "big")
            + SETTINGS_MAX_HEADER_LIST_SIZE.to_bytes(2, "big")
            + MAX_HEADER_BLOCK.to_bytes(4, "big")
        )
        self._send(_frame(SETTINGS, 0, 0, settings))
        self._send(_frame(WINDOW_UPDATE, 0, 0, (CONNECTION_WINDOW - 65_535).to_bytes(4, "big")))
        self._preface_timer = self._loop.call_later(PREFACE_TIMEOUT_S, self._preface_late)

    def _preface_late(self) -> None:
        self._preface_timer = None
        if not self._preface:
            self._fail(PROTOCOL_ERROR, f"no HTTP/2 client preface within {PREFACE_TIMEOUT_S:g} s")

    def data_received(self, data: bytes) -> None:
        if self._buf:  # joined only once the frame can be read: a frame sent in pieces is copied once
            self._buf += data
            if len(self._buf) < self._need:
                return
            data = bytes(self._buf)
            self._buf.clear()
        try:
            if not self._preface:
                if len(data) < len(PREFACE):
                    if not PREFACE.startswith(data):
                        raise _ConnectionError(PROTOCOL_ERROR, "not an HTTP/2 client preface")
                    self._buf += data
                    self._need = len(PREFACE)
                    return
                if not data.startswith(PREFACE):
                    raise _ConnectionError(PROTOCOL_ERROR, "not an HTTP/2 client preface")
                data = data[len(PREFACE) :]
                self._preface = True
                if self._preface_timer is not None:
                    self._preface_timer.cancel()
                    self._preface_timer = None
            pos, end = 0, len(data)
            while end - pos >= 9:
                length = int.from_bytes(data[pos : pos + 3], "big")
                if length > MAX_FRAME:
                    raise _ConnectionError(FRAME_SIZE_ERROR, f"a frame of {length} bytes (at most {MAX_FRAME})")
                if end - pos < 9 + length:
                    break
                stream_id = int.from_bytes(data[pos + 5 : pos + 9], "big") & 0x7FFFFFFF
                self._frame(data[pos + 3], data[pos + 4], stream_id, data[pos + 9 : pos + 9 + length])
                pos += 9 + length
                if self.transport is None or self.transport.is_closing():
                    return
            if pos < end:
                self._buf += data[pos:]
                self._need = 9 + (int.from_bytes(data[pos : pos + 3], "big") if end - pos >= 9 else 0)
        except _ConnectionError as e:
            self._fail(e.code, str(e))

    def pause_writing(self) -> None:
        """The peer is not reading what we send: stop reading what it sends (its pings, resets and requests
        would make more output) until it catches up."""
        self.writable = False
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        self.writable = True
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()
        self._opened()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if self._preface_timer is not None:
            self._preface_timer.cancel()
            self._preface_timer = None
        for stream in list(self.streams.values()):
            self.held.give(stream._buffered)
            stream._buffered = 0
            stream._chunks.clear()
            stream.ended = stream.remote_ended = True
            stream._wake()
            if stream.task is not None:
                stream.task.cancel()
        self.open_streams.open -= len(self.streams)
        self.streams.clear()
        self._opened()
        self._on_close(self)

    # --- frames in -----------------------------------------------------------------------------------------
    def _frame(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        if self._block is not None and kind != CONTINUATION:
            raise _ConnectionError(PROTOCOL_ERROR, "a header block was interrupted by another frame")
        if not self._settings_seen and kind != SETTINGS:
            raise _ConnectionError(PROTOCOL_ERROR, "the connection must start with SETTINGS")
        if kind == DATA:
            self._on_data(flags, stream_id, payload)
        elif kind == HEADERS:
            self._on_headers(flags, stream_id, payload)
        elif kind == CONTINUATION:
            self._on_continuation(flags, stream_id, payload)
        elif kind == WINDOW_UPDATE:
            self._on_window_update(stream_id, payload)
        elif kind == RST_STREAM:
            if stream_id == 0 or len(payload) != 4:
                raise _ConnectionError(PROTOCOL_ERROR, "a malformed RST_STREAM")
            stream = self.streams.pop(stream_id, None)
            if stream is not None:
                self.open_streams.open -= 1
                self.release(stream)
                stream.ended = stream.remote_ended = True
                stream._wake()
                if stream.task is not None:
                    stream.task.cancel()
        elif kind == SETTINGS:
            self._on_settings(flags, stream_id, payload)
        elif kind == PING:
            if stream_id or len(payload) != 8:
                raise _ConnectionError(PROTOCOL_ERROR, "a malformed PING")
            if not flags & ACK:
                self._send(_frame(PING, ACK, 0, payload))
        elif kind == GOAWAY:
            self._goaway = True
            if not self.streams and self.transport is not None:
                self._flush()
                self.transport.close()
        elif kind == PUSH_PROMISE:
            raise _ConnectionError(PROTOCOL_ERROR, "a client may not push")
        elif kind == PRIORITY:
            if stream_id == 0 or len(payload) != 5:
                raise _ConnectionError(PROTOCOL_ERROR, "a malformed PRIORITY")
        # other frame types are ignored, as the protocol asks

    def _on_settings(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id:
            raise _ConnectionError(PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & ACK:
            if payload:
                raise _ConnectionError(FRAME_SIZE_ERROR, "a SETTINGS acknowledgement with a payload")
            self._stream_limit = self._max_streams  # our one SETTINGS frame is acknowledged
            return
        if len(payload) % 6:
            raise _ConnectionError(FRAME_SIZE_ERROR, "a SETTINGS frame of a partial setting")
        self._settings_seen = True
        for at in range(0, len(payload), 6):
            key = int.from_bytes(payload[at : at + 2], "big")
            value = int.from_bytes(payload[at + 2 : at + 6], "big")
            if key == SETTINGS_INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise _ConnectionError(FLOW_CONTROL_ERROR, f"an initial window of {value}")
                delta = value - self.peer_initial_window
                self.peer_initial_window = value
                for stream in self.streams.values():
                    stream.send_window += delta
                self._opened()
            elif key == SETTINGS_MAX_FRAME_SIZE:
                if not MAX_FRAME <= value <= (1 << 24) - 1:
                    raise _ConnectionError(PROTOCOL_ERROR, f"a maximum frame size of {value}")
                self.peer_max_frame = value
            # the header table size does not matter: what we send never enters the dynamic table
        self._send(_frame(SETTINGS, ACK, 0))

    def _on_window_update(self, stream_id: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise _ConnectionError(FRAME_SIZE_ERROR, "a WINDOW_UPDATE of the wrong size")
        increment = int.from_bytes(payload, "big") & 0x7FFFFFFF
        if stream_id == 0:
            if not increment:
                raise _ConnectionError(PROTOCOL_ERROR, "a WINDOW_UPDATE of 0 on the connection")
            self.send_window += increment
            if self.send_window > MAX_WINDOW:
                raise _ConnectionError(FLOW_CONTROL_ERROR, "the connection's window grew past 2^31-1")
        else:
            stream = self.streams.get(stream_id)
            if stream is None:
                return
            if not increment:
                self._reset(stream, PROTOCOL_ERROR)
                return
            stream.send_window += increment
            if stream.send_window > MAX_WINDOW:
                self._reset(stream, FLOW_CONTROL_ERROR)
                return
        self._opened()

    def _on_data(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id == 0:
            raise _ConnectionError(PROTOCOL_ERROR, "DATA on stream 0")
        self._window_used += len(payload)
        if self._window_used > CONNECTION_WINDOW:
            raise _ConnectionError(FLOW_CONTROL_ERROR, "DATA beyond the connection's window")
        data = payload
        if flags & PADDED:
            data = self._unpad(payload)
        stream = self.streams.get(stream_id)
        if stream is None or stream.remote_ended:
            if stream_id > self._last_id:
                raise _ConnectionError(PROTOCOL_ERROR, f"DATA on idle stream {stream_id}")
            self.consumed(len(payload))  # a stream that is over: the bytes still count on the connection
            if stream is not None:
                self._reset(stream, STREAM_CLOSED)
            return
        if flags & END_STREAM:
            stream.remote_ended = True
        if stream.ended:  # our side is over: what the client still sends is dropped
            self.consumed(len(payload))
            if stream.remote_ended:
                self._close(stream)
            return
        if len(payload) - len(data):
            stream._consumed(len(payload) - len(data))  # padding is consumed on arrival
        if stream._buffered + stream._unacked + len(data) > STREAM_WINDOW:
            self.consumed(len(data))
            self._reset(stream, FLOW_CONTROL_ERROR)
            return
        held = self.held
        if stream._refused or held.used + len(data) > held.limit:
            self.consumed(len(data))  # dropped: the connection's window gets it back
            if not stream._refused:
                stream._refuse()
            return
        held.used += len(data)  # HeldBytes.take, inline: this runs for every frame
        stream._received(data)

    def _on_headers(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id == 0:
            raise _ConnectionError(PROTOCOL_ERROR, "HEADERS on stream 0")
        block = payload
        if flags & PADDED:
            block = self._unpad(payload)
        if flags & PRIORITY_FLAG:
            if len(block) < 5:
                raise _ConnectionError(PROTOCOL_ERROR, "a HEADERS frame too short for its priority")
            block = block[5:]
        if flags & END_HEADERS:
            self._header_block(stream_id, block, bool(flags & END_STREAM))
        else:
            self._block = bytearray(block)
            self._block_stream = stream_id
            self._block_end_stream = bool(flags & END_STREAM)

    def _on_continuation(self, flags: int, stream_id: int, payload: bytes) -> None:
        block = self._block
        if block is None or stream_id != self._block_stream:
            raise _ConnectionError(PROTOCOL_ERROR, "a CONTINUATION that continues nothing")
        block += payload
        if len(block) > MAX_HEADER_BLOCK:
            raise _ConnectionError(ENHANCE_YOUR_CALM, f"a header block above {MAX_HEADER_BLOCK} bytes")
        if flags & END_HEADERS:
            self._block = None
            self._header_block(stream_id, bytes(block), self._block_end_stream)

    def _header_block(self, stream_id: int, block: bytes, end_stream: bool) -> None:
        headers = self._decode(block)
        stream = self.streams.get(stream_id)
        if stream is not None:  # trailers from the client: only their END_STREAM matters
            if not end_stream:
                self._reset(stream, PROTOCOL_ERROR)
                return
            stream.remote_ended = True
            stream._wake()
            if stream.ended:
                self._close(stream)
            return
        if stream_id <= self._last_id:
            if stream_id % 2:
                return  # a stream that is over (we reset it, or it ended): nothing to do
            raise _ConnectionError(PROTOCOL_ERROR, f"HEADERS on stream {stream_id}")
        if not stream_id % 2:
            raise _ConnectionError(PROTOCOL_ERROR, f"a client stream with an even id ({stream_id})")
        self._last_id = stream_id
        total = self.open_streams
        if self._goaway or len(self.streams) >= self._stream_limit or (total.limit and total.open >= total.limit):
            if not self._goaway and len(self.streams) < self._stream_limit:
                log_stream_refused(
                    "grpc_stream_refused open_streams=%d limit=%d (--grpc-max-streams): a stream past the limit "
                    "is refused (REFUSED_STREAM)",
                    total.open,
                    total.limit,
                )
            self._send(_frame(RST_STREAM, 0, stream_id, REFUSED_STREAM.to_bytes(4, "big")))
            return
        fields: dict[bytes, bytes] = {}
        for name, value in headers:
            fields.setdefault(name, value)
        path = fields.get(b":path", b"").decode("latin-1")
        stream = Stream(self, stream_id, path)
        stream.headers = headers
        stream.remote_ended = end_stream
        self.streams[stream_id] = stream
        total.open += 1
        content_type = fields.get(b"content-type", b"")
        if fields.get(b":method") != b"POST" or not content_type.startswith(b"application/grpc"):
            self._send(_frame(HEADERS, END_HEADERS | END_STREAM, stream_id, _NOT_GRPC))
            stream.started = stream.ended = True
            self._end(stream)
            return
        handler = self._route(path)
        if handler is None:
            stream.finish(grpc.StatusCode.UNIMPLEMENTED, f"Method not found: {path}")
            self._end(stream)
            return
        if self._refusing():
            stream.finish(grpc.StatusCode.UNAVAILABLE, "the server is shutting down")
            self._end(stream)
            return
        stream.task = self._loop.create_task(self._run(stream, handler))

    def _decode(self, block: bytes) -> list[tuple[bytes, bytes]]:
        table = self._table
        entries = table.dynamic_entries
        newest = entries[0] if entries else None
        count, size = len(entries), table.maxsize
        last = self._last_block
        if last is not None and last[1] is newest and last[2] == count and last[3] == size and last[0] == block:
            return last[4]
        try:
            headers = cast("list[tuple[bytes, bytes]]", self._decoder.decode(block, raw=True))
        except HPACKError as e:
            raise _ConnectionError(COMPRESSION_ERROR, f"a header block that does not decode: {e}") from None
        # Kept with the table's state before it (the entry held here keeps its identity unique). A block that
        # changed that state leaves a state it does not match until another block has replaced it here: an
        # insertion puts a new object first, a size update changes the size, an eviction the count.
        self._last_block = (block, newest, count, size, headers)
        return headers

    async def _run(self, stream: Stream, handler: Handler) -> None:
        try:
            await handler(stream)
        except asyncio.CancelledError:
            if self.transport is not None and not stream.ended:
                self._reset(stream, CANCEL)
            raise
        except RpcError as e:
            stream.finish(e.code, e.message)
        except HeldBytesExceeded as e:
            stream.finish(grpc.StatusCode.RESOURCE_EXHAUSTED, str(e))
        except Exception:
            log.exception("grpc_handler_failed path=%s", stream.path)
            stream.finish(grpc.StatusCode.UNKNOWN, "Internal Server Error")
        else:
            stream.finish()
            if stream.remote_ended:
                self._close(stream)
            return  # a client still sending after status OK is read to its end (and ignored)
        finally:
            # The stream lets go of its task once the task is done. Otherwise every cancelled stream (Envoy
            # resets each one once its response has passed) is a reference cycle: the task keeps its
            # CancelledError, whose traceback keeps this frame, which keeps the stream. Only the collector could
            # free those, and its full passes stall the event loop for milliseconds.
            stream.task = None
        self._end(stream)

    # --- stream ends ---------------------------------------------------------------------------------------
    def _end(self, stream: Stream) -> None:
        """Our side ended with a status other than OK: the stream closes now if the client's side is over too;
        a client still sending is told to stop (RST_STREAM, NO_ERROR)."""
        if stream.remote_ended:
            self._close(stream)
        elif self.streams.get(stream.id) is stream:
            self._reset(stream, NO_ERROR)

    def _close(self, stream: Stream) -> None:
        if self.streams.pop(stream.id, None) is not None:
            self.open_streams.open -= 1
            self.release(stream)
        if self._goaway and not self.streams and self.transport is not None:
            self._flush()
            self.transport.close()

    def _reset(self, stream: Stream, code: int) -> None:
        self._send(_frame(RST_STREAM, 0, stream.id, code.to_bytes(4, "big")))
        stream.ended = stream.remote_ended = True
        stream._wake()
        if stream.task is not None and stream.task is not asyncio.current_task():
            stream.task.cancel()
        self._close(stream)

    def release(self, stream: Stream) -> None:
        """Drops what `stream` has buffered (a closed stream left it unread, or it was refused): back to the
        connection's window and to the held bytes."""
        if stream._buffered:
            self.consumed(stream._buffered)
            self.held.give(stream._buffered)
            stream._buffered = 0
            stream._chunks.clear()

    # --- flow control --------------------------------------------------------------------------------------
    def consumed(self, n: int) -> None:
        self._unacked += n
        if self._unacked >= CONNECTION_WINDOW // 2:
            self.window_update(0, self._unacked)
            self._window_used -= self._unacked
            self._unacked = 0

    def window_update(self, stream_id: int, n: int) -> None:
        self._send(_frame(WINDOW_UPDATE, 0, stream_id, n.to_bytes(4, "big")))

    def _opened(self) -> None:
        if self._can_send is not None:
            self._can_send.set()

    async def send_flow_controlled(self, stream: Stream, rest: memoryview) -> None:
        """Sends a message that does not fit at once: frame by frame as the peer's windows and the socket
        allow."""
        while rest:
            if self.transport is None or stream.ended:
                raise asyncio.CancelledError
            n = min(len(rest), self.peer_max_frame, stream.send_window, self.send_window)
            if n <= 0 or not self.writable:
                if self._can_send is None:
                    self._can_send = asyncio.Event()
                self._can_send.clear()
                self._flush()
                await self._can_send.wait()
                continue
            stream.send_window -= n
            self.send_window -= n
            flushed = self._out_bytes + 9 + n >= FLUSH_AT
            self.data(stream.id, bytes(rest[:n]))
            rest = rest[n:]
            if flushed:
                await asyncio.sleep(0)  # a long message: the other streams get their turn

    # --- frames out ----------------------------------------------------------------------------------------
    def headers(self, stream_id: int, block: bytes, *, end_stream: bool) -> None:
        self._send(_frame(HEADERS, END_HEADERS | (END_STREAM if end_stream else 0), stream_id, block))

    def data(self, stream_id: int, payload: bytes) -> None:
        self._send(_frame(DATA, 0, stream_id, payload))

    def _send(self, frame: bytes) -> None:
        self._out.append(frame)
        self._out_bytes += len(frame)
        if self._out_bytes >= FLUSH_AT:
            self._flush()
        elif not self._flush_due:
            self._flush_due = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        """Everything this loop pass produced, in one write."""
        self._flush_due = False
        out = self._out
        if not out:
            return
        self._out = []
        self._out_bytes = 0
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        transport.write(out[0] if len(out) == 1 else b"".join(out))

    def _fail(self, code: int, why: str) -> None:
        log_connection_error("http2_connection_error code=%d reason=%s", code, why)
        self._send(_frame(GOAWAY, 0, 0, self._last_id.to_bytes(4, "big") + code.to_bytes(4, "big") + why.encode()))
        self._flush()
        if self.transport is not None:
            self.transport.close()

    def _unpad(self, payload: bytes) -> bytes:
        if not payload:
            raise _ConnectionError(PROTOCOL_ERROR, "a padded frame without its pad length")
        pad = payload[0]
        if pad >= len(payload):
            raise _ConnectionError(PROTOCOL_ERROR, "padding longer than the frame")
        return payload[1 : len(payload) - pad]

    # --- shutdown ------------------------------------------------------------------------------------------
    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def extra_info(self, name: str) -> Any:
        """The transport's `get_extra_info(name)` (peername, ssl_object, ...), None once it is closed."""
        return self.transport.get_extra_info(name) if self.transport is not None else None

    def handlers(self) -> list[asyncio.Task[None]]:
        return [s.task for s in self.streams.values() if s.task is not None]
