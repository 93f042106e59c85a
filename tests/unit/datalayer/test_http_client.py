"""Tests for the minimal HTTP/1.1 GET client against real loopback servers written here: framing (length,
chunked, until close) however the bytes are split, keep-alive and reconnection, and one typed error per
kind of failure, after which the connection is dropped. A few cases also run on uvloop."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import pytest
import uvloop

from llm_epp.datalayer.http_client import (
    BodyTooLargeError,
    ConnectError,
    ConnectionClosedError,
    HTTPConnection,
    HTTPTimeoutError,
    ProtocolError,
    Response,
    _Protocol,
    client_ssl_context,
)
from llm_epp.security.tls import self_signed

BODY = b'm_a 1\nm_b{x="y"} 2.5\n'


def length_response(body: bytes = BODY, status: str = "200 OK", extra: str = "") -> bytes:
    head = f"HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {len(body)}\r\n{extra}\r\n"
    return head.encode() + body


def chunked_response(body: bytes = BODY) -> bytes:
    """`body` in three chunks, with a chunk extension and a trailer."""
    a, b = len(body) // 3, 2 * len(body) // 3
    parts = [body[:a], body[a:b], body[b:]]
    out = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\ncontent-type: text/plain\r\n\r\n"
    out += b"%x;name=value\r\n%s\r\n" % (len(parts[0]), parts[0])
    out += b"".join(b"%X\r\n%s\r\n" % (len(p), p) for p in parts[1:])
    return out + b"0\r\nX-Checksum: abc\r\n\r\n"


def until_close_response(body: bytes = BODY) -> bytes:
    return b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n" + body


Handler = Callable[["Conn"], Awaitable[None]]


@dataclass
class Conn:
    """One accepted connection as the handler sees it; `index` counts connections from 0."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    index: int
    server: Server

    async def request(self) -> bytes | None:
        """The next request head, or None when the client closed."""
        try:
            head = await self.reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
            return None
        self.server.requests.append(head)
        return head

    async def send(self, data: bytes, *, piece: int = 0, pause: float = 0.001) -> None:
        """Writes `data`, in `piece`-byte writes with a pause between them when `piece` > 0."""
        step = piece or len(data) or 1
        for i in range(0, len(data), step):
            self.writer.write(data[i : i + step])
            await self.writer.drain()
            if piece:
                await asyncio.sleep(pause)


@dataclass
class Server:
    handler: Handler
    ssl_context: ssl.SSLContext | None = None
    connections: int = 0
    requests: list[bytes] = field(default_factory=list)
    port: int = 0

    def __post_init__(self) -> None:
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> Server:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0, ssl=self.ssl_context)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        index = self.connections
        self.connections += 1
        try:
            await self.handler(Conn(reader, writer, index, self))
        except (ConnectionError, ssl.SSLError, asyncio.CancelledError):
            pass  # a cancelled handler ends normally: asyncio 3.11 logs the exception() of a cancelled one
        finally:
            self._tasks.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()


def answering(response: bytes | Callable[[int], bytes], *, close: bool = False, piece: int = 0) -> Handler:
    """A handler answering every request with `response` (or `response(n)` for the n-th request over all
    connections); `close` closes the connection after each answer."""

    async def handle(conn: Conn) -> None:
        while await conn.request() is not None:
            data = response if isinstance(response, bytes) else response(len(conn.server.requests) - 1)
            await conn.send(data, piece=piece)
            if close:
                return

    return handle


async def hang(conn: Conn) -> None:
    await conn.request()
    await asyncio.Event().wait()


def first_connection(special: Handler, then: Handler) -> Handler:
    async def handle(conn: Conn) -> None:
        await (special if conn.index == 0 else then)(conn)

    return handle


@contextlib.asynccontextmanager
async def client(server: Server, **kwargs: object) -> AsyncIterator[HTTPConnection]:
    conn = HTTPConnection("127.0.0.1", server.port, **kwargs)  # type: ignore[arg-type]
    try:
        yield conn
    finally:
        await conn.aclose()


# --- framing ------------------------------------------------------------------------------------------------
async def test_content_length_body_and_the_request_sent() -> None:
    async with Server(answering(length_response())) as srv, client(srv) as conn:
        response = await conn.get("/metrics?x=1", 1.0)
    assert response == Response(200, response.headers, BODY)
    assert response.headers["content-type"] == "text/plain; version=0.0.4"
    assert response.headers["content-length"] == str(len(BODY))
    assert srv.requests == [
        b"GET /metrics?x=1 HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nAccept: text/plain;version=0.0.4\r\n"
        b"Accept-Encoding: identity\r\nConnection: keep-alive\r\n\r\n" % srv.port
    ]


@pytest.mark.parametrize(
    ("response", "close"),
    [(length_response(), False), (chunked_response(), False), (until_close_response(), True)],
    ids=["content-length", "chunked", "until-close"],
)
async def test_a_response_written_one_byte_at_a_time(response: bytes, close: bool) -> None:
    async with Server(answering(response, piece=1, close=close)) as srv, client(srv) as conn:
        got = await conn.get("/", 5.0)
    assert (got.status, got.body) == (200, BODY)


async def test_chunked_response_split_at_every_byte_boundary_on_one_connection() -> None:
    response = chunked_response()

    async def split_at_n(conn: Conn) -> None:
        while await conn.request() is not None:
            n = len(conn.server.requests)  # 1, 2, ... len(response) - 1
            await conn.send(response[:n])
            await asyncio.sleep(0.001)
            await conn.send(response[n:])

    async with Server(split_at_n) as srv, client(srv) as conn:
        for _ in range(1, len(response)):
            got = await conn.get("/", 2.0)
            assert (got.status, got.body, got.headers["content-type"]) == (200, BODY, "text/plain")
    assert srv.connections == 1


class _FakeTransport:
    def __init__(self) -> None:
        self.closed = False

    def write(self, data: bytes) -> None:
        pass

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True


@pytest.mark.parametrize(
    "response",
    [
        length_response(),
        chunked_response(),
        b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n" + chunked_response(),
        length_response().replace(b"\r\n", b"\n", 4),  # a head with bare LFs
        length_response().replace(b"\r\n", b"\n", 3),  # ... but for the empty line
    ],
    ids=["content-length", "chunked", "interim-then-chunked", "bare-lf-head", "mixed-head"],
)
async def test_parser_fed_every_split_and_byte_by_byte(response: bytes) -> None:
    """Deterministic: the protocol fed directly, every two-piece split and then one byte per read."""
    loop = asyncio.get_running_loop()
    proto = _Protocol(loop, 1 << 20)
    proto.connection_made(_FakeTransport())  # type: ignore[arg-type]
    feeds = [[response[:i], response[i:]] for i in range(1, len(response))]
    feeds.append([response[i : i + 1] for i in range(len(response))])
    for pieces in feeds:
        waiter = proto.request(b"GET / HTTP/1.1\r\n\r\n")
        for piece in pieces:
            assert not waiter.done()
            proto.data_received(piece)
        assert waiter.result().body == BODY
        assert not proto.closed


async def test_body_read_until_close() -> None:
    async with Server(answering(until_close_response(), close=True)) as srv, client(srv) as conn:
        assert (await conn.get("/", 1.0)).body == BODY
        assert (await conn.get("/", 1.0)).body == BODY
    assert srv.connections == 2


async def test_interim_response_skipped_and_no_body_statuses() -> None:
    responses = [
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n" + length_response(),
        b"HTTP/1.1 204 No Content\r\nContent-Length: 10\r\n\r\n",
        b"HTTP/1.1 304 Not Modified\r\n\r\n",
        length_response(),
    ]
    async with Server(answering(lambda n: responses[n])) as srv, client(srv) as conn:
        got = [await conn.get("/", 1.0) for _ in responses]
    assert [(r.status, r.body) for r in got] == [(200, BODY), (204, b""), (304, b""), (200, BODY)]
    assert srv.connections == 1


async def test_header_names_are_case_insensitive_and_repeats_joined() -> None:
    response = b"HTTP/1.1 200 OK\r\nCONTENT-LENGTH: 2\r\nX-A: 1\r\nx-a:2 \r\nConnection: Keep-Alive\r\n\r\nok"
    async with Server(answering(response)) as srv, client(srv) as conn:
        got = await conn.get("/", 1.0)
    assert got.headers == {"content-length": "2", "x-a": "1, 2", "connection": "Keep-Alive"}
    assert got.body == b"ok"


# --- connections --------------------------------------------------------------------------------------------
async def test_keep_alive_reuses_one_connection() -> None:
    async with Server(answering(length_response())) as srv, client(srv) as conn:
        for _ in range(5):
            assert (await conn.get("/metrics", 1.0)).body == BODY
        assert conn.connects == 1
    assert srv.connections == 1
    assert len(srv.requests) == 5


async def test_connection_close_answers_reconnect() -> None:
    response = length_response(extra="Connection: close\r\n")
    async with Server(answering(response, close=True)) as srv, client(srv) as conn:
        for _ in range(3):
            assert (await conn.get("/", 1.0)).body == BODY
        assert conn.connects == 3
    assert srv.connections == 3


async def test_idle_connection_closed_by_the_server_as_the_request_goes_out_is_retried() -> None:
    async def answer_once_then_drop_the_next_request(conn: Conn) -> None:
        await conn.request()
        await conn.send(length_response())
        await conn.request()  # closes without answering, as a server timing out an idle connection may

    async with Server(first_connection(answer_once_then_drop_the_next_request, answering(length_response()))) as srv:
        async with client(srv) as conn:
            assert (await conn.get("/", 1.0)).body == BODY
            assert (await conn.get("/", 1.0)).body == BODY
    assert srv.connections == 2


async def test_one_request_at_a_time() -> None:
    async with Server(hang) as srv, client(srv) as conn:
        first = asyncio.create_task(conn.get("/", 5.0))
        await asyncio.sleep(0.05)
        with pytest.raises(RuntimeError):
            await conn.get("/", 1.0)
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first


async def test_cancelled_request_drops_the_connection() -> None:
    async with Server(first_connection(hang, answering(length_response()))) as srv, client(srv) as conn:
        task = asyncio.create_task(conn.get("/", 5.0))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert (await conn.get("/", 1.0)).body == BODY
    assert srv.connections == 2


async def test_aclose_then_get_reconnects() -> None:
    async with Server(answering(length_response())) as srv, client(srv) as conn:
        assert (await conn.get("/", 1.0)).body == BODY
        await conn.aclose()
        assert (await conn.get("/", 1.0)).body == BODY
    assert srv.connections == 2


# --- failures -----------------------------------------------------------------------------------------------
async def test_500_status_is_surfaced_and_the_connection_kept() -> None:
    response = length_response(b"<html>boom</html>", status="500 Internal Server Error")
    async with Server(answering(response)) as srv, client(srv) as conn:
        got = await conn.get("/", 1.0)
        assert (got.status, got.body) == (500, b"<html>boom</html>")
        await conn.get("/", 1.0)
    assert srv.connections == 1


@pytest.mark.parametrize(
    "response",
    [
        length_response(b"x" * 5000),
        chunked_response(b"x" * 5000),
        until_close_response(b"x" * 5000),
    ],
    ids=["content-length", "chunked", "until-close"],
)
async def test_body_over_the_cap(response: bytes) -> None:
    async with Server(answering(response)) as srv, client(srv, max_body=1000) as conn:
        with pytest.raises(BodyTooLargeError, match="larger than 1000 bytes"):
            await conn.get("/", 1.0)


async def test_timeout_when_the_server_never_answers() -> None:
    async with Server(first_connection(hang, answering(length_response()))) as srv, client(srv) as conn:
        started = time.monotonic()
        with pytest.raises(HTTPTimeoutError):
            await conn.get("/", 0.2)
        assert 0.15 < time.monotonic() - started < 1.0
        assert (await conn.get("/", 1.0)).body == BODY  # on a new connection
    assert srv.connections == 2


async def test_connection_refused() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    conn = HTTPConnection("127.0.0.1", port)
    with pytest.raises(ConnectError) as info:
        await conn.get("/", 1.0)
    assert isinstance(info.value.__cause__, ConnectionRefusedError)


@pytest.mark.parametrize(
    "response",
    [
        b"garbage\r\n\r\n",
        b"HTTP/1.1 2x0 OK\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/2 200\r\n\r\n",
        b"HTTP/1.1 200OK\r\n\r\n",
        b"ICY 200 OK\r\n",  # rejected before the head is complete
    ],
    ids=["garbage", "bad-code", "http2", "no-space", "not-http"],
)
async def test_malformed_status_line_drops_the_connection(response: bytes) -> None:
    async def garbage_then_hang(conn: Conn) -> None:
        await conn.request()
        await conn.send(response)
        await asyncio.Event().wait()

    async with Server(first_connection(garbage_then_hang, answering(length_response()))) as srv, client(srv) as conn:
        with pytest.raises(ProtocolError, match="malformed status line"):
            await conn.get("/", 1.0)
        assert (await conn.get("/", 1.0)).body == BODY
    assert srv.connections == 2


@pytest.mark.parametrize(
    ("response", "message"),
    [
        (length_response() + b"HTTP/1.1 200 OK\r\n", "unexpected data after the response"),
        (chunked_response() + b"junk", "unexpected data after the response"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 1x\r\n\r\n", "invalid Content-Length"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 1, 2\r\n\r\n", "invalid Content-Length"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "invalid chunk size"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabc\r\n", "chunk data longer than its size"),
        (b"HTTP/1.1 200 OK\r\n Folded: x\r\n\r\n", "malformed header field"),
        (b"HTTP/1.1 200 OK\r\nNoColon\r\n\r\n", "malformed header field"),
    ],
    ids=["pipelined-garbage", "after-chunked", "bad-length", "two-lengths", "bad-chunk", "long-chunk", "fold", "colon"],
)
async def test_protocol_errors_drop_the_connection(response: bytes, message: str) -> None:
    async def bad_then_hang(conn: Conn) -> None:
        await conn.request()
        await conn.send(response)
        await asyncio.Event().wait()

    async with Server(first_connection(bad_then_hang, answering(length_response()))) as srv, client(srv) as conn:
        with pytest.raises(ProtocolError, match=message):
            await conn.get("/", 1.0)
        assert (await conn.get("/", 1.0)).body == BODY
    assert srv.connections == 2


async def test_data_sent_between_requests_drops_the_connection() -> None:
    async def answer_then_garbage(conn: Conn) -> None:
        await conn.request()
        await conn.send(length_response())
        await asyncio.sleep(0.05)
        await conn.send(b"surprise")
        await asyncio.Event().wait()

    async with Server(first_connection(answer_then_garbage, answering(length_response()))) as srv:
        async with client(srv) as conn:
            assert (await conn.get("/", 1.0)).body == BODY
            await asyncio.sleep(0.2)
            assert (await conn.get("/", 1.0)).body == BODY
    assert srv.connections == 2


async def test_closed_in_the_middle_of_the_body() -> None:
    async def cut(conn: Conn) -> None:
        await conn.request()
        await conn.send(length_response()[:-5])

    async with Server(cut) as srv, client(srv) as conn:
        with pytest.raises(ConnectionClosedError) as info:
            await conn.get("/", 1.0)
    assert info.value.started


# --- TLS ----------------------------------------------------------------------------------------------------
def _server_tls() -> ssl.SSLContext:
    cert, key = self_signed("127.0.0.1")  # an EC key and a self-signed certificate made with `cryptography`
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "tls.crt").write_bytes(cert)
        (Path(tmp) / "tls.key").write_bytes(key)
        ctx.load_cert_chain(Path(tmp) / "tls.crt", Path(tmp) / "tls.key")
    return ctx


async def test_tls_self_signed_with_insecure_skip_verify() -> None:
    async with Server(answering(chunked_response()), ssl_context=_server_tls()) as srv:
        insecure = client_ssl_context(insecure_skip_verify=True)
        async with client(srv, ssl_context=insecure) as conn:
            for _ in range(3):
                assert (await conn.get("/metrics", 2.0)).body == BODY
            assert conn.connects == 1
        assert srv.connections == 1
        async with client(srv, ssl_context=client_ssl_context()) as verifying:
            with pytest.raises(ConnectError) as info:
                await verifying.get("/metrics", 2.0)
            assert isinstance(info.value.__cause__, ssl.SSLCertVerificationError)


# --- the same on uvloop -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "case",
    [
        test_content_length_body_and_the_request_sent,
        test_chunked_response_split_at_every_byte_boundary_on_one_connection,
        test_connection_close_answers_reconnect,
        test_idle_connection_closed_by_the_server_as_the_request_goes_out_is_retried,
        test_timeout_when_the_server_never_answers,
        test_connection_refused,
        test_data_sent_between_requests_drops_the_connection,
        test_tls_self_signed_with_insecure_skip_verify,
    ],
    ids=lambda case: case.__name__.removeprefix("test_"),
)
def test_on_uvloop(case: Callable[[], Awaitable[None]]) -> None:
    async def run() -> None:
        await case()

    uvloop.run(run())
