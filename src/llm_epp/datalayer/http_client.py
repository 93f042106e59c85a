"""A minimal HTTP/1.1 GET client on `asyncio.Protocol`, for polling model servers' /metrics pages.

Each `HTTPConnection` talks to one endpoint over one persistent connection, one request at a time,
reconnecting after the server closes it or after any error. It does only what a scrape needs: send a
small fixed request, parse the status line and headers, and read the body by Content-Length, chunked
transfer coding (extensions and trailers skipped) or until the server closes. The body is capped.

Why not a general client: a keep-alive fetch of a ~100 KB page through httpx costs 1-2 ms of CPU, more
than 90 % of it in its connection-pool and anyio machinery, which limits one core to ~20 endpoints polled
every 50 ms. Here the per-request Python work is a few calls: the body arrives in a few large reads that
are appended to a list and joined once; the head is found with `bytes.find`, decoded and split once.

Errors (all `HTTPClientError`): `ConnectError` (refused, DNS, TLS handshake; the OS error is the
`__cause__`), `HTTPTimeoutError`, `ConnectionClosedError` (closed before the response was complete),
`ProtocolError` (malformed response, data nobody asked for), `BodyTooLargeError`. After any of them the
connection is dropped; the next `get` opens a new one.
"""

from __future__ import annotations

import asyncio
import ssl
from typing import NamedTuple, cast

__all__ = [
    "DEFAULT_ACCEPT",
    "MAX_BODY_BYTES",
    "BodyTooLargeError",
    "ConnectError",
    "ConnectionClosedError",
    "HTTPClientError",
    "HTTPConnection",
    "HTTPTimeoutError",
    "ProtocolError",
    "Response",
    "client_ssl_context",
]

DEFAULT_ACCEPT = "text/plain;version=0.0.4"
MAX_BODY_BYTES = 16 << 20
MAX_HEAD_BYTES = 64 << 10
_MAX_CHUNK_LINE = 4096


class HTTPClientError(Exception):
    """Base of every error `HTTPConnection.get` raises for a failed exchange."""


class ConnectError(HTTPClientError):
    """The connection (TCP or TLS handshake) could not be opened; `__cause__` is the OS or SSL error."""


class HTTPTimeoutError(HTTPClientError):
    """No complete response (connection included) within the request's timeout. `connecting`: the time
    ran out before a connection was established."""

    connecting = False


class ConnectionClosedError(HTTPClientError):
    """The server closed the connection before the response was complete. `started` tells whether any
    byte of the response had arrived; `__cause__` is the transport's error, if any."""

    def __init__(self, message: str, *, started: bool) -> None:
        super().__init__(message)
        self.started = started


class ProtocolError(HTTPClientError):
    """The server's bytes are not a valid HTTP/1.x response. The message is short and fixed."""


class BodyTooLargeError(HTTPClientError):
    def __init__(self, limit: int) -> None:
        super().__init__(f"response body larger than {limit} bytes")
        self.limit = limit


class Response(NamedTuple):
    status: int
    headers: dict[str, str]  # lower-case names; repeated fields joined with ", "
    body: bytes


def client_ssl_context(*, insecure_skip_verify: bool = False) -> ssl.SSLContext:
    """A TLS client context; build it once and share it (loading the system CA store takes milliseconds).
    `insecure_skip_verify` accepts any certificate for any name, as the reference EPP's option."""
    if insecure_skip_verify:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    else:
        ctx = ssl.create_default_context()
    ctx.set_alpn_protocols(["http/1.1"])
    return ctx


# Parser states.
_IDLE = 0  # no request pending
_HEAD = 1  # reading the status line and headers
_LENGTH = 2  # body of a known length
_UNTIL_CLOSE = 3  # body delimited by the end of the connection
_CHUNK_SIZE = 4  # chunked: the chunk-size line
_CHUNK_DATA = 5  # chunked: chunk data, `_need` bytes left
_CHUNK_END = 6  # chunked: the CRLF after chunk data
_TRAILER = 7  # chunked: trailer fields up to the empty line

_HEX = frozenset(b"0123456789abcdefABCDEF")


class _Protocol(asyncio.Protocol):
    """One connection: parses the answer to the one pending request and resolves its future."""

    def __init__(self, loop: asyncio.AbstractEventLoop, max_body: int) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.lost: asyncio.Future[None] = loop.create_future()
        self._loop = loop
        self._max_body = max_body
        self._waiter: asyncio.Future[Response] | None = None
        self._state = _IDLE
        self._buf = bytearray()  # an incomplete head or chunked-framing line, until the next read
        self._chunks: list[bytes] = []  # body so far
        self._size = 0  # len of the body so far
        self._need = 0  # _LENGTH: the whole body's length; _CHUNK_DATA: bytes left in the chunk
        self._status = 0
        self._headers: dict[str, str] = {}
        self._keep_alive = True
        self._started = False  # a byte of the response arrived

    # --- asyncio callbacks ------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports are not asyncio classes

    def data_received(self, data: bytes) -> None:
        state = self._state
        if state == _LENGTH:  # the bulk of a page: a few large reads
            self._chunks.append(data)
            self._size += len(data)
            if self._size >= self._need:
                self._finish_length()
            return
        if state == _UNTIL_CLOSE:
            self._chunks.append(data)
            self._size += len(data)
            if self._size > self._max_body:
                self._fail(BodyTooLargeError(self._max_body))
            return
        if state == _IDLE:  # nobody asked: the connection is out of step
            self.abort()
            return
        try:
            if state == _HEAD:
                self._started = True
                self._head(data)
            else:
                self._chunked(data, 0)
        except HTTPClientError as e:
            self._fail(e)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if not self.lost.done():
            self.lost.set_result(None)
        if self._waiter is None:
            return
        if self._state == _UNTIL_CLOSE and exc is None:
            self._complete(b"".join(self._chunks))
            return
        err = ConnectionClosedError("connection closed before the response was complete", started=self._started)
        err.__cause__ = exc
        self._fail(err)

    # --- driven by HTTPConnection -----------------------------------------------------------------------
    def request(self, data: bytes) -> asyncio.Future[Response]:
        assert self.transport is not None and self._waiter is None
        waiter: asyncio.Future[Response] = self._loop.create_future()
        self._waiter = waiter
        self._state = _HEAD
        self._buf.clear()
        self._chunks = []
        self._size = 0
        self._started = False
        self.transport.write(data)
        return waiter

    @property
    def usable(self) -> bool:
        return not self.closed and self.transport is not None and not self.transport.is_closing()

    def close(self) -> None:
        """Graceful close (TLS close_notify); `lost` resolves when done."""
        self.closed = True
        if self.transport is not None and not self.lost.done():
            self.transport.close()

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None and not self.lost.done():
            self.transport.abort()

    # --- parsing ----------------------------------------------------------------------------------------
    def _head(self, data: bytes) -> None:
        """Parses the head once complete (skipping 1xx interim responses), then hands the rest of `data`
        to the body. Usually the whole head comes in the first read and the body is sliced off it once."""
        pos = 0
        start = 0
        if self._buf:  # the head came in pieces
            start = max(len(self._buf) - 2, 0)
            self._buf += data
            data = bytes(self._buf)
            self._buf.clear()
        while True:
            if len(data) - pos >= 5 and not data.startswith(b"HTTP/", pos):
                raise ProtocolError("malformed status line")
            # The head ends at an empty line: CRLF CRLF, or with bare LFs tolerated, LF LF or LF CRLF.
            end = data.find(b"\n\r\n", start)
            lf = data.find(b"\n\n", start, end if end >= 0 else len(data))
            if lf >= 0:
                head = data[pos:lf]
                pos = lf + 2
            elif end >= 0:
                head = data[pos:end]
                pos = end + 3
            else:
                if len(data) - pos > MAX_HEAD_BYTES:
                    raise ProtocolError("response head too large")
                self._buf += data[pos:] if pos else data
                return
            start = pos
            status, http10, headers = _head_fields(head.decode("latin-1"))
            if 100 <= status < 200 and status != 101:
                continue  # 100 Continue, 103 Early Hints: the real answer follows
            if status == 101:
                raise ProtocolError("unexpected 101 Switching Protocols")
            break
        self._status = status
        self._headers = headers
        connection = headers.get("connection", "").lower()
        self._keep_alive = "keep-alive" in connection if http10 else "close" not in connection
        self._choose_body(status, headers)
        state = self._state
        if state == _CHUNK_SIZE:
            self._chunked(data, pos)
            return
        rest = data[pos:] if pos < len(data) else b""
        if state == _LENGTH:
            if rest:
                self._chunks.append(rest)
                self._size = len(rest)
            if self._size >= self._need:
                self._finish_length()
        elif state == _UNTIL_CLOSE:
            if rest:
                self._chunks.append(rest)
                self._size = len(rest)
                if self._size > self._max_body:
                    raise BodyTooLargeError(self._max_body)
        else:  # _IDLE: a response without a body (204, 304)
            if rest:
                raise ProtocolError("unexpected data after the response")
            self._complete(b"")

    def _choose_body(self, status: int, headers: dict[str, str]) -> None:
        if status == 204 or status == 304:
            self._state = _IDLE
            return
        te = headers.get("transfer-encoding")
        if te is not None:
            if "content-length" in headers:
                self._keep_alive = False  # both framings: use chunked, then do not trust the connection
            if te.rsplit(",", 1)[-1].strip().lower() == "chunked":
                self._state = _CHUNK_SIZE
            else:
                self._state = _UNTIL_CLOSE
                self._keep_alive = False
            return
        cl = headers.get("content-length")
        if cl is None:
            self._state = _UNTIL_CLOSE
            self._keep_alive = False
            return
        if not (cl.isdigit() and cl.isascii()):
            values = {v.strip() for v in cl.split(",")}  # "42, 42" (a repeated field) is allowed
            cl = values.pop()
            if values or not cl.isdigit() or not cl.isascii():
                raise ProtocolError("invalid Content-Length")
        if len(cl) > 18:
            raise ProtocolError("invalid Content-Length")
        length = int(cl)
        if length > self._max_body:
            raise BodyTooLargeError(self._max_body)
        self._need = length
        self._state = _LENGTH

    def _chunked(self, data: bytes, pos: int) -> None:
        """Consumes chunked framing and data from `data[pos:]`. Chunk data is sliced straight off the read;
        only an incomplete framing line waits in `_buf` for the next read."""
        if self._buf:
            self._buf += data[pos:]
            data = bytes(self._buf)
            self._buf.clear()
            pos = 0
        size = len(data)
        while True:
            state = self._state
            if state == _CHUNK_DATA:
                take = min(size - pos, self._need)
                if not take:
                    return
                self._chunks.append(data if take == size else data[pos : pos + take])
                pos += take
                self._need -= take
                if not self._need:
                    self._state = _CHUNK_END
            elif state == _CHUNK_SIZE:
                nl = data.find(b"\n", pos)
                if nl < 0:
                    if size - pos > _MAX_CHUNK_LINE:
                        raise ProtocolError("chunk-size line too long")
                    self._buf += data[pos:]
                    return
                digits = data[pos:nl].split(b";", 1)[0].strip()  # chunk extensions are ignored
                pos = nl + 1
                if not digits or len(digits) > 15 or not _HEX.issuperset(digits):
                    raise ProtocolError("invalid chunk size")
                n = int(digits, 16)
                if n:
                    self._size += n
                    if self._size > self._max_body:
                        raise BodyTooLargeError(self._max_body)
                    self._need = n
                    self._state = _CHUNK_DATA
                else:
                    self._state = _TRAILER
            elif state == _CHUNK_END:
                if pos == size:
                    return
                if data[pos] == 0x0A:  # a bare LF, tolerated
                    pos += 1
                elif data[pos] == 0x0D:
                    if pos + 1 == size:
                        self._buf += b"\r"
                        return
                    if data[pos + 1] != 0x0A:
                        raise ProtocolError("chunk data longer than its size")
                    pos += 2
                else:
                    raise ProtocolError("chunk data longer than its size")
                self._state = _CHUNK_SIZE
            else:  # _TRAILER: skip fields up to the empty line
                nl = data.find(b"\n", pos)
                if nl < 0:
                    if size - pos > MAX_HEAD_BYTES:
                        raise ProtocolError("trailer too large")
                    self._buf += data[pos:]
                    return
                empty = nl == pos or (nl == pos + 1 and data[pos] == 0x0D)
                pos = nl + 1
                if empty:
                    if pos != size:
                        raise ProtocolError("unexpected data after the response")
                    chunks = self._chunks
                    self._complete(chunks[0] if len(chunks) == 1 else b"".join(chunks))
                    return

    def _finish_length(self) -> None:
        if self._size > self._need:
            self._fail(ProtocolError("unexpected data after the response"))
            return
        chunks = self._chunks
        self._complete(chunks[0] if len(chunks) == 1 else b"".join(chunks))

    # --- outcome ----------------------------------------------------------------------------------------
    def _complete(self, body: bytes) -> None:
        waiter = self._waiter
        self._waiter = None
        self._state = _IDLE
        self._chunks = []
        if not self._keep_alive:
            self.close()
        if waiter is not None and not waiter.done():
            waiter.set_result(Response(self._status, self._headers, body))

    def _fail(self, err: HTTPClientError) -> None:
        waiter = self._waiter
        self._waiter = None
        self._state = _IDLE
        self._chunks = []
        self.abort()
        if waiter is not None and not waiter.done():
            waiter.set_exception(err)


def _head_fields(head: str) -> tuple[int, bool, dict[str, str]]:
    """(status code, is HTTP/1.0, header fields) of a response head, its lines ended by CRLF or LF.
    Field names are lower-cased; a repeated field's values are joined with ", "."""
    lines = head.split("\n")
    status_line = lines[0].rstrip("\r")
    version = status_line[:9]
    code = status_line[9:12]
    if (
        (version != "HTTP/1.1 " and version != "HTTP/1.0 ")
        or len(code) != 3
        or not code.isdigit()
        or not code.isascii()
        or (len(status_line) > 12 and status_line[12] != " ")
    ):
        raise ProtocolError("malformed status line")
    headers: dict[str, str] = {}
    for i in range(1, len(lines)):
        name, sep, value = lines[i].partition(":")
        if not sep or not name or name[0] in " \t" or name[-1] in " \t":
            raise ProtocolError("malformed header field")
        key = name.lower()
        if key in headers:
            headers[key] += ", " + value.strip()
        else:
            headers[key] = value.strip()
    return int(code), version == "HTTP/1.0 ", headers


class HTTPConnection:
    """GETs to one endpoint over one kept-alive connection, one request at a time.

    `ssl_context` switches to TLS (`server_hostname` defaults to `host`). `accept` is the Accept header;
    `identity` asks for an uncompressed body. `aclose()` closes the current connection; a later `get`
    opens a new one."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        ssl_context: ssl.SSLContext | None = None,
        server_hostname: str | None = None,
        accept: str = DEFAULT_ACCEPT,
        identity: bool = True,
        max_body: int = MAX_BODY_BYTES,
    ) -> None:
        self.host = host
        self.port = port
        self.max_body = max_body
        self.connects = 0  # connections opened so far
        self._ssl = ssl_context
        self._server_hostname = (server_hostname or host) if ssl_context is not None else None
        authority = f"[{host}]" if ":" in host else host
        if port != (443 if ssl_context is not None else 80):
            authority = f"{authority}:{port}"
        self._fields = (
            f"Host: {authority}\r\nAccept: {accept}\r\n"
            + ("Accept-Encoding: identity\r\n" if identity else "")
            + "Connection: keep-alive\r\n\r\n"
        ).encode("ascii")  # UnicodeEncodeError (a ValueError) for a non-ASCII host
        self._proto: _Protocol | None = None
        self._busy = False
        self._connecting = False
        self._path: str | None = None
        self._request = b""

    def request_bytes(self, path: str) -> bytes:
        """The bytes sent for `GET path`; ValueError if `path` cannot go in a request line."""
        if not path.startswith("/") or not path.isascii() or not path.isprintable() or " " in path:
            raise ValueError(f"invalid request path {path!r}")
        return b"GET " + path.encode("ascii") + b" HTTP/1.1\r\n" + self._fields

    async def get(
        self,
        path: str,
        timeout: float | None = None,  # noqa: ASYNC109 - a timeout must also drop the connection
    ) -> Response:
        """The response to `GET path`, whatever its status. `timeout` bounds the whole exchange,
        connecting included. Raises an `HTTPClientError` subclass; the connection is then dropped."""
        if self._busy:
            raise RuntimeError("HTTPConnection.get() is already running: one request at a time")
        if path != self._path:
            self._request = self.request_bytes(path)
            self._path = path
        self._busy = True
        try:
            async with asyncio.timeout(timeout):
                return await self._exchange(self._request)
        except TimeoutError:
            connecting = self._connecting
            self._drop()
            err = HTTPTimeoutError(f"no complete response from {self.host}:{self.port} in time")
            err.connecting = connecting
            raise err from None
        except BaseException:  # our errors, and cancellation mid-exchange: the connection is out of step
            self._drop()
            raise
        finally:
            self._busy = False
            self._connecting = False

    async def _exchange(self, request: bytes) -> Response:
        proto = self._proto
        if proto is not None and proto.usable:
            try:
                return await proto.request(request)
            except ConnectionClosedError as e:
                if e.started:
                    raise
                # The server closed the idle connection as the request went out; GET is safe to retry once.
                self._proto = None
        return await (await self._connect()).request(request)

    async def _connect(self) -> _Protocol:
        loop = asyncio.get_running_loop()
        self._connecting = True
        try:
            _, proto = await loop.create_connection(
                lambda: _Protocol(loop, self.max_body),
                self.host,
                self.port,
                ssl=self._ssl,
                server_hostname=self._server_hostname,
            )
        except OSError as e:  # refused, unreachable, DNS (gaierror), TLS handshake (SSLError)
            self._connecting = False
            raise ConnectError(f"cannot connect to {self.host}:{self.port}: {e}") from e
        # (a cancelled connect leaves _connecting set, for get() to tell a connect timeout; get() resets it)
        self._connecting = False
        self._proto = proto
        self.connects += 1
        return proto

    def _drop(self) -> None:
        if self._proto is not None:
            self._proto.abort()
            self._proto = None

    def close(self) -> None:
        """Drops the connection at once (no TLS close_notify)."""
        self._drop()

    async def aclose(self) -> None:
        """Closes the connection gracefully, waiting at most a second for the transport to finish."""
        proto, self._proto = self._proto, None
        if proto is None:
            return
        if not proto.lost.done():
            proto.close()
            await asyncio.wait([proto.lost], timeout=1.0)
            if not proto.lost.done():
                proto.abort()
