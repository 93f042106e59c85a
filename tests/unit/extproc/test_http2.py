"""The HTTP/2 side of the ext_proc port (`llm_epp.extproc.http2`), spoken to frame by frame: what a gRPC
client may do (split messages, small windows, pings, unknown methods) works, and what a hostile or broken
client does (oversized frames and header blocks, bad HPACK, data past its window, streams it may not open)
ends its stream or its connection with the protocol's error code, never more buffering."""

from __future__ import annotations

import asyncio
import gc
import logging
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import grpc
import h2.config
import h2.connection
import h2.events
import h2.settings
from hpack import Encoder

from llm_epp.extproc import http2
from llm_epp.extproc.held import HeldBytes
from llm_epp.extproc.http2_server import PROCESS, ExtProcServer
from llm_epp.observability.logging import VERBOSE, InfoOncePerInterval

EOF = grpc.aio.EOF
GRPC_HEADERS = [
    (":method", "POST"),
    (":scheme", "http"),
    (":path", PROCESS),
    (":authority", "epp"),
    ("content-type", "application/grpc"),
    ("te", "trailers"),
]


def grpc_message(payload: bytes) -> bytes:
    return b"\0" + len(payload).to_bytes(4, "big") + payload


class Echo:
    """A servicer's `process`: answers each message with itself repeated `times` times; `hold` (when set)
    keeps it from reading at all."""

    def __init__(self, times: int = 1) -> None:
        self.times = times
        self.seen: list[bytes] = []
        self.hold: asyncio.Event | None = None

    async def __call__(self, _requests: Any, ctx: Any) -> None:
        if self.hold is not None:
            await self.hold.wait()
        while (message := await ctx.read()) is not EOF:
            self.seen.append(message)
            await ctx.write(message * self.times)


@asynccontextmanager
async def serving(process: Any, **kw: Any) -> AsyncIterator[ExtProcServer]:
    kw.setdefault("max_recv", 1 << 22)
    kw.setdefault("max_send", 1 << 22)
    server = ExtProcServer(process, lambda data: data, **kw)
    server.bind("127.0.0.1", 0)
    await server.start()
    try:
        yield server
    finally:
        await server.stop(None)


class RawClient:
    """Writes frames as given (nothing checks them) and reads the server's frames back."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.encoder = Encoder()
        self.buf = b""

    @classmethod
    async def open(cls, port: int, *, preface: bytes = http2.PREFACE) -> RawClient:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        client = cls(reader, writer)
        writer.write(preface)
        if preface == http2.PREFACE:
            client.send(http2.SETTINGS, 0, 0)
        return client

    def send(self, kind: int, flags: int, stream_id: int, payload: bytes = b"") -> None:
        self.writer.write(http2._frame(kind, flags, stream_id, payload))

    def headers(self, stream_id: int, fields: list[tuple[str, str]] = GRPC_HEADERS, flags: int = 0) -> None:
        self.send(http2.HEADERS, http2.END_HEADERS | flags, stream_id, self.encoder.encode(fields))

    async def frame(self) -> tuple[int, int, int, bytes] | None:
        """The next frame the server sends, or None when it closes the connection."""
        while len(self.buf) < 9 or len(self.buf) < 9 + int.from_bytes(self.buf[:3], "big"):
            data = await asyncio.wait_for(self.reader.read(1 << 16), 10)
            if not data:
                return None
            self.buf += data
        length = int.from_bytes(self.buf[:3], "big")
        kind, flags = self.buf[3], self.buf[4]
        stream_id = int.from_bytes(self.buf[5:9], "big")
        payload, self.buf = self.buf[9 : 9 + length], self.buf[9 + length :]
        return kind, flags, stream_id, payload

    async def until(self, kind: int, stream_id: int | None = None) -> tuple[int, bytes]:
        """Skips frames up to the first of `kind` (on `stream_id`, if given): its flags and payload."""
        while (got := await self.frame()) is not None:
            if got[0] == kind and (stream_id is None or got[2] == stream_id):
                return got[1], got[3]
        raise AssertionError(f"the connection closed before a frame of type {kind}")

    async def echoed(self, stream_id: int, frame_flags: int, payload: bytes) -> bytes:
        """Sends `payload` (framed as `frame_flags` say) as the stream's last DATA and returns the answer's
        DATA."""
        self.send(http2.DATA, http2.END_STREAM | frame_flags, stream_id, payload)
        _, answer = await self.until(http2.DATA, stream_id)
        return answer

    async def goaway_code(self) -> int:
        _, payload = await self.until(http2.GOAWAY)
        assert await self.frame() is None, "the connection stays open after GOAWAY"
        return int.from_bytes(payload[4:8], "big")

    async def close(self) -> None:
        self.writer.close()
        await self.writer.wait_closed()


class H2Client:
    """A well-behaved client (the `h2` library) over a socket: streams, windows and pings as it keeps them."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, window: int) -> None:
        self.reader = reader
        self.writer = writer
        config = h2.config.H2Configuration(client_side=True)
        self.conn = h2.connection.H2Connection(config)
        self.conn.local_settings = h2.settings.Settings(
            client=True, initial_values={h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: window}
        )
        self.conn.initiate_connection()
        self.data: dict[int, bytearray] = {}
        self.trailers: dict[int, dict[bytes, bytes]] = {}
        self.ended: set[int] = set()
        self.pongs: list[bytes] = []
        self.auto_ack = True

    @classmethod
    async def open(cls, port: int, window: int = 65_535) -> H2Client:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        client = cls(reader, writer, window)
        client.flush()
        return client

    def flush(self) -> None:
        self.writer.write(self.conn.data_to_send())

    async def pump(self) -> None:
        data = await asyncio.wait_for(self.reader.read(1 << 16), 10)
        assert data, "the server closed the connection"
        for event in self.conn.receive_data(data):
            if isinstance(event, h2.events.DataReceived):
                self.data.setdefault(event.stream_id, bytearray()).extend(event.data)
                if self.auto_ack:
                    self.conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            elif isinstance(event, h2.events.TrailersReceived):
                self.trailers[event.stream_id] = dict(event.headers)
            elif isinstance(event, h2.events.ResponseReceived) and any(k == b"grpc-status" for k, _ in event.headers):
                self.trailers[event.stream_id] = dict(event.headers)
            elif isinstance(event, h2.events.StreamEnded):
                self.ended.add(event.stream_id)
            elif isinstance(event, h2.events.PingAckReceived):
                self.pongs.append(event.ping_data)
        self.flush()

    async def until(self, cond: Any) -> None:
        while not cond():
            await self.pump()

    async def send_all(self, stream_id: int, data: bytes, end_stream: bool = True) -> None:
        """Sends `data` in frames as the server's windows let it."""
        view = memoryview(data)
        while view:
            n = min(len(view), self.conn.local_flow_control_window(stream_id), self.conn.max_outbound_frame_size)
            if n <= 0:
                await self.pump()
                continue
            self.conn.send_data(stream_id, bytes(view[:n]))
            view = view[n:]
            self.flush()
        if end_stream:
            self.conn.end_stream(stream_id)
            self.flush()

    async def close(self) -> None:
        self.writer.close()
        await self.writer.wait_closed()


async def test_a_message_larger_than_a_frame_and_the_window_is_gathered_and_answered_in_frames() -> None:
    """200 KB in (over several 16 KiB frames and past the 64 KiB default window, so the server must return
    window as it reads) and 400 KB back to a client whose window is 1,000 bytes until it reads more."""
    process = Echo(times=2)
    message = bytes(range(256)) * 800
    async with serving(process) as server:
        client = await H2Client.open(server.port, window=1_000)
        client.conn.send_headers(1, GRPC_HEADERS)
        await client.send_all(1, grpc_message(message))
        await client.until(lambda: 1 in client.ended)
        assert bytes(client.data[1]) == grpc_message(message * 2)
        assert client.trailers[1][b"grpc-status"] == b"0"
        assert process.seen == [message]
        await client.close()


async def test_an_answer_of_megabytes_to_a_client_with_wide_windows_arrives_whole() -> None:
    """The path a large held body takes back to Envoy: frames as the windows and the socket allow."""
    process = Echo(times=16)
    message = bytes(range(256)) * 2048  # 512 KiB, answered with 8 MiB
    async with serving(process, max_send=1 << 24) as server:
        client = await H2Client.open(server.port, window=(1 << 31) - 1)
        client.conn.increment_flow_control_window((1 << 31) - 1 - 65_535)
        client.conn.send_headers(1, GRPC_HEADERS)
        await client.send_all(1, grpc_message(message))
        await client.until(lambda: 1 in client.ended)
        assert bytes(client.data[1]) == grpc_message(message * 16)
        assert client.trailers[1][b"grpc-status"] == b"0"
        await client.close()


async def test_a_stalled_answer_resumes_when_the_client_opens_its_window() -> None:
    process = Echo(times=50)
    async with serving(process) as server:
        client = await H2Client.open(server.port, window=10_000)
        client.auto_ack = False
        client.conn.send_headers(1, GRPC_HEADERS)
        await client.send_all(1, grpc_message(b"x" * 1_000))
        await client.until(lambda: len(client.data.get(1, b"")) >= 10_000)
        assert 1 not in client.ended  # 50,005 bytes to send, 10,000 allowed
        client.conn.acknowledge_received_data(len(client.data[1]), 1)
        client.conn.increment_flow_control_window(1 << 20)
        client.conn.increment_flow_control_window(1 << 20, stream_id=1)
        client.flush()
        client.auto_ack = True
        await client.until(lambda: 1 in client.ended)
        assert bytes(client.data[1]) == grpc_message(b"x" * 50_000)
        await client.close()


async def test_data_a_handler_never_reads_is_returned_to_the_connection_window_when_its_stream_ends() -> None:
    """Streams whose handler holds, each sent a full stream window and then reset by the client: 24 MiB in
    all, past the 16 MiB connection window. The connection keeps its window (a new stream is answered)."""
    process = Echo()
    process.hold = asyncio.Event()
    async with serving(process) as server:
        client = await H2Client.open(server.port)
        for stream_id in range(1, 49, 2):
            client.conn.send_headers(stream_id, GRPC_HEADERS)
            await client.send_all(stream_id, b"\0" * http2.STREAM_WINDOW, end_stream=False)
            client.conn.reset_stream(stream_id)
            client.flush()
        process.hold.set()
        client.conn.send_headers(49, GRPC_HEADERS)
        await client.send_all(49, grpc_message(b"still here"))
        await client.until(lambda: 49 in client.ended)
        assert bytes(client.data[49]) == grpc_message(b"still here")
        await client.close()


async def test_pings_are_answered_and_streams_of_unknown_methods_or_other_content_are_refused() -> None:
    async with serving(Echo()) as server:
        client = await H2Client.open(server.port)
        client.conn.ping(b"12345678")
        client.conn.send_headers(1, [(k, "/no.Such/Method" if k == ":path" else v) for k, v in GRPC_HEADERS], True)
        client.conn.send_headers(3, [(k, "text/plain" if k == "content-type" else v) for k, v in GRPC_HEADERS], True)
        client.flush()
        await client.until(lambda: {1, 3} <= client.ended and client.pongs)
        assert client.pongs == [b"12345678"]
        assert client.trailers[1][b"grpc-status"] == str(grpc.StatusCode.UNIMPLEMENTED.value[0]).encode()
        assert client.trailers[1][b"grpc-message"] == b"Method not found: /no.Such/Method"
        assert 3 not in client.trailers  # not gRPC: a plain HTTP status
        await client.close()


async def test_data_past_the_stream_window_resets_that_stream_only() -> None:
    process = Echo()
    process.hold = asyncio.Event()
    async with serving(process) as server:
        client = await RawClient.open(server.port)
        client.headers(1)
        chunk = b"\0" * http2.MAX_FRAME
        for _ in range(http2.STREAM_WINDOW // http2.MAX_FRAME + 1):  # one frame more than the window
            client.send(http2.DATA, 0, 1, chunk)
        _, payload = await client.until(http2.RST_STREAM, 1)
        assert int.from_bytes(payload, "big") == http2.FLOW_CONTROL_ERROR
        process.hold.set()
        client.headers(3)
        assert await client.echoed(3, 0, grpc_message(b"next")) == grpc_message(b"next")
        await client.close()


async def test_protocol_violations_end_the_connection_with_their_error_code() -> None:
    async with serving(Echo()) as server:
        cases: list[tuple[str, Any, int]] = [
            ("a frame above 16 KiB", lambda c: c.send(http2.DATA, 0, 1, b"\0" * (http2.MAX_FRAME + 1)), 0x6),
            ("HPACK that does not decode", lambda c: c.send(http2.HEADERS, http2.END_HEADERS, 1, b"\xff\xff"), 0x9),
            ("a client stream with an even id", lambda c: c.headers(2), 0x1),
            ("DATA on a stream never opened", lambda c: c.send(http2.DATA, 0, 7, b"x"), 0x1),
            ("a PUSH_PROMISE", lambda c: c.send(http2.PUSH_PROMISE, http2.END_HEADERS, 1, b"\0\0\0\2"), 0x1),
            ("a malformed PING", lambda c: c.send(http2.PING, 0, 0, b"short"), 0x1),
            ("an initial window past 2^31-1", lambda c: c.send(http2.SETTINGS, 0, 0, b"\0\4\x80\0\0\0"), 0x3),
        ]
        for what, act, code in cases:
            client = await RawClient.open(server.port)
            act(client)
            assert await client.goaway_code() == code, what
            await client.close()
        client = await RawClient.open(server.port, preface=b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert await client.goaway_code() == http2.PROTOCOL_ERROR
        await client.close()


async def test_a_header_block_is_bounded_across_continuation_frames() -> None:
    async with serving(Echo()) as server:
        client = await RawClient.open(server.port)
        client.send(http2.HEADERS, 0, 1, client.encoder.encode(GRPC_HEADERS))
        for _ in range(http2.MAX_HEADER_BLOCK // http2.MAX_FRAME + 1):
            client.send(http2.CONTINUATION, 0, 1, b"\0" * http2.MAX_FRAME)
        assert await client.goaway_code() == http2.ENHANCE_YOUR_CALM
        await client.close()
        client = await RawClient.open(server.port)
        block = client.encoder.encode(GRPC_HEADERS)  # split over three frames: fine
        client.send(http2.HEADERS, 0, 1, block[:5])
        client.send(http2.CONTINUATION, 0, 1, block[5:10])
        client.send(http2.CONTINUATION, http2.END_HEADERS, 1, block[10:])
        assert await client.echoed(1, 0, grpc_message(b"split")) == grpc_message(b"split")
        await client.close()


async def test_a_client_sending_one_byte_at_a_time_is_understood() -> None:
    """The preface, SETTINGS, a header block and a message spanning two frames, each written a byte at a time
    (the server sees many partial frames and joins each only once it is whole)."""
    process = Echo()
    async with serving(process) as server:
        client = await RawClient.open(server.port, preface=b"")
        message = grpc_message(b"z" * 20_000)
        wire = (
            http2.PREFACE
            + http2._frame(http2.SETTINGS, 0, 0)
            + http2._frame(http2.HEADERS, http2.END_HEADERS, 1, client.encoder.encode(GRPC_HEADERS))
            + http2._frame(http2.DATA, 0, 1, message[: http2.MAX_FRAME])
            + http2._frame(http2.DATA, http2.END_STREAM, 1, message[http2.MAX_FRAME :])
        )
        for i in range(len(wire)):
            client.writer.write(wire[i : i + 1])
            if i % 64 == 0:
                await client.writer.drain()
                await asyncio.sleep(0)
        answer = b""
        while len(answer) < len(message):
            _, payload = await client.until(http2.DATA, 1)
            answer += payload
        assert answer == message
        assert process.seen == [b"z" * 20_000]
        await client.close()


def _literal(first: int, value: bytes) -> bytes:
    """An HPACK literal field: `first` says its kind and names its static name; the value without Huffman."""
    return bytes([first, len(value)]) + value


async def test_a_repeated_header_block_means_what_the_current_table_says() -> None:
    """The same bytes of a header block decode against HPACK's dynamic table as it is now: a block naming
    dynamic entry 62 as its :path reaches the method that entry holds at the time, and after a size update
    that empties the table the same bytes are an error (the server remembers the last block it decoded)."""
    process = Echo()
    content_type = b"\x00\x0ccontent-type\x10application/grpc"  # a literal, new name, not indexed
    post_http = b"\x83\x86"  # :method POST, :scheme http (static entries 3 and 6)

    def inserting(path: str) -> bytes:  # :path (static name 4) as a new dynamic entry, 62
        return post_http + _literal(0x44, path.encode()) + content_type

    same = post_http + b"\xbe" + content_type  # :path from dynamic entry 62; the table is left as it was
    async with serving(process) as server:
        client = await RawClient.open(server.port)
        client.send(http2.HEADERS, http2.END_HEADERS, 1, inserting(PROCESS))
        assert await client.echoed(1, 0, grpc_message(b"one")) == grpc_message(b"one")
        for stream_id in (3, 5):
            client.send(http2.HEADERS, http2.END_HEADERS, stream_id, same)
            assert await client.echoed(stream_id, 0, grpc_message(b"again")) == grpc_message(b"again")

        client.send(http2.HEADERS, http2.END_HEADERS | http2.END_STREAM, 7, inserting("/no.Such/Method"))
        client.send(http2.HEADERS, http2.END_HEADERS | http2.END_STREAM, 9, same)
        for stream_id in (7, 9):
            _, block = await client.until(http2.HEADERS, stream_id)
            assert b"Method not found: /no.Such/Method" in block

        client.send(http2.HEADERS, http2.END_HEADERS | http2.END_STREAM, 11, b"\x20" + same)  # table size 0
        assert await client.goaway_code() == http2.COMPRESSION_ERROR
        await client.close()
    assert process.seen == [b"one", b"again", b"again"]


async def test_table_size_updates_take_effect_each_time_a_block_carries_one() -> None:
    """Table size updates take effect each time a block carries one: after the size was set back, the same
    block shrinks the table again, so an entry too large for the small table is not kept and a reference to
    it is an error, as the client's encoder expects."""
    process = Echo()
    fields = b"\x83\x86" + _literal(0x04, PROCESS.encode()) + b"\x00\x0ccontent-type\x10application/grpc"
    small, default = b"\x3f\x45", b"\x3f\xe1\x1f"  # size updates to 100 and to 4,096 bytes
    big = b"\x40\x05x-big" + _literal(100, b"v" * 100)[1:]  # inserted: 137 bytes, more than 100
    async with serving(process) as server:
        client = await RawClient.open(server.port)
        for stream_id, block in ((1, small + fields), (3, default + fields), (5, small + fields), (7, fields + big)):
            client.send(http2.HEADERS, http2.END_HEADERS, stream_id, block)
            assert await client.echoed(stream_id, 0, grpc_message(b"m")) == grpc_message(b"m")
        client.send(http2.HEADERS, http2.END_HEADERS | http2.END_STREAM, 9, fields + b"\xbe")  # entry 62
        assert await client.goaway_code() == http2.COMPRESSION_ERROR
        await client.close()


async def test_padded_frames_are_read_without_their_padding() -> None:
    async with serving(Echo()) as server:
        client = await RawClient.open(server.port)
        block = client.encoder.encode(GRPC_HEADERS)
        client.send(http2.HEADERS, http2.END_HEADERS | http2.PADDED, 1, b"\3" + block + b"pad")
        padded = b"\2" + grpc_message(b"padded") + b"pp"
        assert await client.echoed(1, http2.PADDED, padded) == grpc_message(b"padded")
        await client.close()


async def test_a_client_that_does_not_read_is_not_read_either() -> None:
    """A flood of PINGs from a client that never reads the acknowledgements: once the server's socket and
    its transport are full, the server stops reading that client, so what it holds for it stays bounded (here
    ~1.7 MB of acknowledgements would otherwise pile up)."""
    async with serving(Echo()) as server:
        _, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        writer.write(http2.PREFACE + http2._frame(http2.SETTINGS, 0, 0))
        await _until(lambda: server._connections, "the connection")
        (conn,) = server._connections
        assert conn.transport is not None
        conn.transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        ping = http2._frame(http2.PING, 0, 0, b"8 bytes!")
        writer.write(ping * 100_000)
        await _until(lambda: not conn.writable, "the server to stop writing")
        for _ in range(50):  # the client keeps sending; the server must not keep reading
            await asyncio.sleep(0.01)
        assert conn.transport.get_write_buffer_size() < 512 << 10
        writer.transport.abort()


async def test_messages_that_span_frames_are_gathered_within_the_held_bytes_across_connections() -> None:
    """Two clients on two connections: while one holds 40,000 bytes of an unfinished 80,000-byte message, a
    70,000-byte message from the other would take the request bytes held past 100,000: its data is dropped
    and its read raises `HeldBytesExceeded`, which a handler that does not catch it turns into
    RESOURCE_EXHAUSTED. The first message completes, and once its bytes are let go the second client's
    message fits. A client resetting a stream mid-message gives its bytes back too."""
    process = Echo()
    async with serving(process, held=HeldBytes(100_000)) as server:
        first = await H2Client.open(server.port, window=1 << 20)
        first.conn.send_headers(1, GRPC_HEADERS)
        message = bytes(range(256)) * 312 + b"12345678"  # 80,000 bytes
        framed = grpc_message(message)
        await first.send_all(1, framed[:40_005], end_stream=False)
        await _until(lambda: server.held.used == 40_000, "the first message's bytes to be gathered")

        second = await H2Client.open(server.port, window=1 << 20)
        second.conn.send_headers(1, GRPC_HEADERS)
        await second.send_all(1, grpc_message(b"y" * 70_000))
        await second.until(lambda: 1 in second.ended)
        assert second.trailers[1][b"grpc-status"] == str(grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]).encode()
        assert b"--max-held-request-bytes" in second.trailers[1][b"grpc-message"]
        assert 1 not in second.data  # nothing was answered
        assert server.held.used == 40_000  # the refused message's bytes are let go

        await first.send_all(1, framed[40_005:])
        await first.until(lambda: 1 in first.ended)
        assert bytes(first.data[1]) == framed
        assert server.held.used == 0

        second.conn.send_headers(3, GRPC_HEADERS)
        await second.send_all(3, grpc_message(b"y" * 70_000))
        await second.until(lambda: 3 in second.ended)
        assert second.trailers[3][b"grpc-status"] == b"0"
        assert bytes(second.data[3]) == grpc_message(b"y" * 70_000)

        first.conn.send_headers(3, GRPC_HEADERS)
        await first.send_all(3, framed[:50_005], end_stream=False)
        await _until(lambda: server.held.used == 50_000, "the third message's bytes to be gathered")
        first.conn.reset_stream(3)
        first.flush()
        await _until(lambda: server.held.used == 0, "a reset stream's bytes to be let go")
        await first.close()
        await second.close()


async def test_data_parked_on_streams_that_are_not_read_stays_within_the_held_bytes_across_connections() -> None:
    """Six streams on two connections, whose handler does not read yet, are each sent a whole 40,000-byte
    message: 240,000 bytes the windows would let them park (1 MiB per stream, 16 MiB per connection, and
    connections are not counted). The held bytes keep it to 100,000: the streams whose data no longer fit
    are refused; once the handler reads, the others are answered, and nothing stays held."""
    process = Echo()
    process.hold = asyncio.Event()
    message = grpc_message(b"p" * 39_995)
    async with serving(process, held=HeldBytes(100_000)) as server:
        clients = [await H2Client.open(server.port, window=1 << 20) for _ in range(2)]
        for client in clients:
            for stream_id in (1, 3, 5):
                client.conn.send_headers(stream_id, GRPC_HEADERS)
                await client.send_all(stream_id, message, end_stream=False)
        await _until(lambda: len(server._connections) == 2, "both connections")
        await asyncio.sleep(0.1)  # what was sent has arrived
        assert server.held.used <= 100_000
        process.hold.set()
        answered, refused = 0, 0
        for client in clients:
            for stream_id in (1, 3, 5):
                client.conn.end_stream(stream_id)
                client.flush()
            await client.until(partial({1, 3, 5}.issubset, client.ended))
            for stream_id in (1, 3, 5):
                if client.trailers[stream_id][b"grpc-status"] == b"0":
                    assert bytes(client.data[stream_id]) == message
                    answered += 1
                else:
                    assert client.trailers[stream_id][b"grpc-status"] == b"8"  # RESOURCE_EXHAUSTED
                    refused += 1
            await client.close()
        # Two whole messages fit in 100,000 bytes (which two depends on how the frames interleave).
        assert answered + refused == 6 and 1 <= answered <= 2
        await _until(lambda: server.held.used == 0, "the held bytes to be let go")


async def test_streams_past_the_concurrency_limit_are_refused_until_one_closes() -> None:
    """The limit is advertised, and enforced once the client has acknowledged it; before that (a gateway may
    open a burst of streams before the setting reaches it) it is four times higher, but still a limit."""
    process = Echo()
    async with serving(process, max_streams=3) as server:
        client = await H2Client.open(server.port)
        await client.until(lambda: client.conn.remote_settings.max_concurrent_streams == 3)
        unacked = await RawClient.open(server.port)
        for stream_id in range(1, 27, 2):
            unacked.headers(stream_id)
        _, payload = await unacked.until(http2.RST_STREAM)
        assert payload == http2.REFUSED_STREAM.to_bytes(4, "big")
        assert max(len(c.streams) for c in server._connections) == 12
        await unacked.close()

        raw = await RawClient.open(server.port)
        raw.send(http2.SETTINGS, http2.ACK, 0)
        for stream_id in (1, 3, 5, 7):  # a client that ignores the setting
            raw.headers(stream_id)
        _, payload = await raw.until(http2.RST_STREAM, 7)
        assert int.from_bytes(payload, "big") == http2.REFUSED_STREAM
        assert await raw.echoed(1, 0, grpc_message(b"one")) == grpc_message(b"one")
        await raw.until(http2.HEADERS, 1)  # stream 1's trailers: it is over, so one more stream fits
        raw.headers(9)
        assert await raw.echoed(9, 0, grpc_message(b"nine")) == grpc_message(b"nine")
        assert await raw.echoed(3, 0, grpc_message(b"three")) == grpc_message(b"three")
        await raw.close()
        await client.close()


async def _until(cond: Any, what: str) -> None:
    for _ in range(500):
        if cond():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


async def test_connections_past_the_limit_are_sent_goaway_and_closed_until_one_ends() -> None:
    async with serving(Echo(), max_connections=2) as server:
        first = await RawClient.open(server.port)
        second = await RawClient.open(server.port)
        await _until(lambda: len(server._connections) == 2, "two connections")
        third = await RawClient.open(server.port)
        third.headers(1)  # not read: the connection is closed first
        assert await third.goaway_code() == http2.ENHANCE_YOUR_CALM
        assert server.refused_connections == 1 and len(server._connections) == 2
        first.headers(1)
        assert await first.echoed(1, 0, grpc_message(b"one")) == grpc_message(b"one")
        await second.close()
        await _until(lambda: len(server._connections) == 1, "the second connection to end")
        fourth = await RawClient.open(server.port)
        fourth.headers(1)
        assert await fourth.echoed(1, 0, grpc_message(b"four")) == grpc_message(b"four")
        assert server.refused_connections == 1
        for client in (first, third, fourth):
            await client.close()

    async with serving(Echo(), max_connections=0) as unlimited:  # 0: no limit
        clients = [await RawClient.open(unlimited.port) for _ in range(5)]
        for client in clients:
            client.headers(1)
            assert await client.echoed(1, 0, grpc_message(b"x")) == grpc_message(b"x")
            await client.close()
        assert unlimited.refused_connections == 0


async def test_a_connection_without_the_client_preface_is_closed_after_the_deadline(monkeypatch: Any) -> None:
    monkeypatch.setattr(http2, "PREFACE_TIMEOUT_S", 0.2)
    async with serving(Echo()) as server:
        silent = await RawClient.open(server.port, preface=b"")
        partial_preface = await RawClient.open(server.port, preface=http2.PREFACE[:10])
        talking = await RawClient.open(server.port)
        assert await silent.goaway_code() == http2.PROTOCOL_ERROR
        assert await partial_preface.goaway_code() == http2.PROTOCOL_ERROR
        await asyncio.sleep(0.3)  # past the deadline: a client that sent the preface keeps its connection
        talking.headers(1)
        assert await talking.echoed(1, 0, grpc_message(b"still here")) == grpc_message(b"still here")
        for client in (silent, partial_preface, talking):
            await client.close()


async def test_connection_errors_log_one_info_line_per_interval(monkeypatch: Any, caplog: Any) -> None:
    monkeypatch.setattr(http2, "log_connection_error", InfoOncePerInterval(http2.log).log)  # a fresh interval
    caplog.set_level(VERBOSE, logger=http2.log.name)
    async with serving(Echo()) as server:
        for _ in range(3):
            client = await RawClient.open(server.port, preface=b"GET / HTTP/1.1\r\n\r\n")
            assert await client.goaway_code() == http2.PROTOCOL_ERROR
            await client.close()
    errors = [r for r in caplog.records if r.getMessage().startswith("http2_connection_error")]
    assert [r.levelno for r in errors] == [logging.INFO, VERBOSE, VERBOSE]
    assert "not an HTTP/2 client preface" in errors[0].getMessage()


async def test_a_flood_of_bad_connections_does_not_hide_the_limits_being_reached(monkeypatch: Any, caplog: Any) -> None:
    from llm_epp.extproc import http2_server

    for log in (http2.log_connection_error, http2.log_stream_refused, http2_server.log_connection_refused):
        monkeypatch.setattr(log.__self__, "_last", None)  # the budgets as a new process has them
    caplog.set_level(VERBOSE, logger=http2.log.name)
    process = Echo()
    process.hold = asyncio.Event()  # the first stream stays open
    async with serving(process, max_connections=2, max_open_streams=1) as server:
        for _ in range(3):
            garbage = await RawClient.open(server.port, preface=b"GET / HTTP/1.1\r\n\r\n")
            assert await garbage.goaway_code() == http2.PROTOCOL_ERROR
            await garbage.close()
        a = await RawClient.open(server.port)
        a.headers(1)
        await _until(lambda: server.open_streams.open == 1, "one open stream")
        a.headers(3)  # past --grpc-max-streams
        _, payload = await a.until(http2.RST_STREAM)
        assert int.from_bytes(payload, "big") == http2.REFUSED_STREAM
        b = await RawClient.open(server.port)
        await _until(lambda: len(server._connections) == 2, "two connections")
        c = await RawClient.open(server.port)  # past --grpc-max-connections
        assert await c.goaway_code() == http2.ENHANCE_YOUR_CALM
        process.hold.set()
        for client in (a, b, c):
            await client.close()
    levels = {
        kind: [r.levelno for r in caplog.records if r.getMessage().startswith(kind)]
        for kind in ("http2_connection_error", "grpc_stream_refused", "grpc_connection_refused")
    }
    assert levels == {
        "http2_connection_error": [logging.INFO, VERBOSE, VERBOSE],
        "grpc_stream_refused": [logging.INFO],
        "grpc_connection_refused": [logging.INFO],
    }


async def test_streams_the_client_cancels_leave_no_garbage_for_the_collector() -> None:
    """Envoy resets every ext_proc stream once its response has passed, which cancels the stream's task. What
    the stream held must then be freed at once: a reference cycle (the task's CancelledError -> its traceback
    -> the stream -> the task) would leave it all for the collector, whose full passes stall the event loop."""
    process = Echo()
    process.hold = asyncio.Event()  # every handler waits until its stream is cancelled
    gc.collect()
    gc.disable()
    try:
        async with serving(process) as server:
            client = await RawClient.open(server.port)
            for stream_id in range(1, 41, 2):
                client.headers(stream_id)
            await _until(lambda: server.open_streams.open == 20, "twenty open streams")
            for stream_id in range(1, 41, 2):
                client.send(http2.RST_STREAM, 0, stream_id, http2.CANCEL.to_bytes(4, "big"))
            await _until(lambda: server.open_streams.open == 0, "the cancelled streams to end")
            for _ in range(3):
                await asyncio.sleep(0)  # the cancelled tasks finish
            alive = [o for o in gc.get_objects() if type(o) is http2.Stream]
            assert alive == []
            await client.close()
    finally:
        gc.enable()


async def test_streams_past_the_servers_limit_are_refused_across_connections() -> None:
    process = Echo()
    process.hold = asyncio.Event()  # handlers wait: their streams stay open
    async with serving(process, max_open_streams=3) as server:
        a = await RawClient.open(server.port)
        b = await RawClient.open(server.port)
        a.headers(1)
        a.headers(3)
        b.headers(1)
        await _until(lambda: server.open_streams.open == 3, "three open streams")
        b.headers(3)  # a fourth, on a connection with room of its own
        _, payload = await b.until(http2.RST_STREAM)
        assert int.from_bytes(payload, "big") == http2.REFUSED_STREAM
        assert server.open_streams.open == 3

        a.send(http2.RST_STREAM, 0, 3, http2.CANCEL.to_bytes(4, "big"))  # the client ends one of them
        await _until(lambda: server.open_streams.open == 2, "the reset stream to be gone")
        b.headers(5)
        await _until(lambda: server.open_streams.open == 3, "a new stream in its place")
        process.hold.set()
        assert await b.echoed(5, 0, grpc_message(b"five")) == grpc_message(b"five")
        await a.close()  # streams of a closed connection are counted out
        await b.close()
        await _until(lambda: server.open_streams.open == 0, "every stream counted out")
