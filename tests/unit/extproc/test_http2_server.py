"""The event loop's server of the ext_proc port (`--grpc-transport asyncio`), spoken to by grpcio clients
(Envoy's side is covered by the Envoy tests, which run `llm-epp serve` on it): the stream a servicer sees,
message limits, resets, health on the same port, streams per connection, stop with and without grace, stream
metrics, TLS and its reload. The HTTP/2 protocol itself, frame by frame: `test_http2.py`."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import h2.config
import h2.connection
import pytest
from prometheus_client import CollectorRegistry

from llm_epp.extproc.http2_server import PROCESS, ExtProcServer
from llm_epp.observability.health import (
    NOT_SERVING,
    SERVICE,
    SERVING,
    HealthState,
    decode_check_response,
    decode_list_response,
    encode_check_request,
)
from llm_epp.observability.stream_metrics import StreamMetrics
from llm_epp.security.server_ssl import ReloadingContext, server_context
from llm_epp.security.tls import CertificateError, self_signed
from tests.support.certs import TestCA
from tests.unit.security.tls_probe import der, secure_channel, served, write_pair

EOF = grpc.aio.EOF


class Upper:
    """A servicer's `process`: answers each message with it in capitals, ends at the client's end; records
    what it saw and how it ended."""

    def __init__(self) -> None:
        self.seen: list[bytes] = []
        self.ended: list[str] = []
        self.hold: asyncio.Event | None = None  # set: wait for it before each answer

    async def __call__(self, _requests: Any, ctx: Any) -> None:
        try:
            while True:
                message = await ctx.read()
                if message is EOF:
                    self.ended.append("eof")
                    return
                self.seen.append(message)
                if self.hold is not None:
                    await self.hold.wait()
                await ctx.write(message.upper() * (1000 if message == b"big" else 1))
        except asyncio.CancelledError:
            self.ended.append("cancelled")
            raise


async def _serve(process: Callable[[Any, Any], Awaitable[None]], **kw: Any) -> ExtProcServer:
    kw.setdefault("max_recv", 1024)
    kw.setdefault("max_send", 2048)
    server = ExtProcServer(process, lambda data: data, **kw)
    server.bind("127.0.0.1", 0)
    await server.start()
    return server


def _stream(channel: grpc.aio.Channel) -> Any:
    return channel.stream_stream(PROCESS)()


async def _until(cond: Callable[[], object], what: str) -> None:
    for _ in range(500):
        if cond():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


async def _held(channel: grpc.aio.Channel, process: Upper) -> Any:
    """A stream whose first message the handler has read and holds (`process.hold` not set)."""
    call = _stream(channel)
    await call.write(b"slow")
    await _until(lambda: process.seen, "the handler to read the message")
    return call


async def test_a_stream_reads_its_messages_and_ends_at_the_clients_end() -> None:
    process = Upper()
    server = await _serve(process)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            call = _stream(channel)
            for word in (b"one", b"two"):
                await call.write(word)
                assert await call.read() == word.upper()
            await call.done_writing()
            assert await call.read() == grpc.aio.EOF
            assert await call.code() == grpc.StatusCode.OK
        assert process.seen == [b"one", b"two"]
        assert process.ended == ["eof"]
    finally:
        await server.stop(None)


async def test_messages_over_the_limits_are_refused() -> None:
    registry = CollectorRegistry()
    process = Upper()
    server = await _serve(process, stream_metrics=StreamMetrics(registry))
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            call = _stream(channel)
            await call.write(b"x" * 2000)  # over max_recv: refused from its length, never handed on
            assert await call.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "larger than max (2000 vs. 1024)" in (await call.details())
            call = _stream(channel)
            await call.write(b"big")  # answered with 3,000 bytes: over max_send
            assert await call.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert process.seen == [b"big"]
        total = "llm_d_epp_extproc_streams_total"
        assert registry.get_sample_value(total, {"code": "ResourceExhausted"}) == 2  # Go's name for the code
    finally:
        await server.stop(None)


async def test_a_hostile_length_prefix_allocates_nothing_and_bad_framing_is_refused() -> None:
    """A raw HTTP/2 client announces a 4 GiB message, a compressed one, and one its stream ends inside: each
    is refused with its status, and nothing reaches the handler."""
    process = Upper()
    server = await _serve(process)
    try:
        cases = (
            (b"\x00\xff\xff\xff\xff", b"8"),  # RESOURCE_EXHAUSTED
            (b"\x01\x00\x00\x00\x01x", b"12"),  # UNIMPLEMENTED
            (b"\x00\x00\x00\x00\x0aabc", b"13"),  # INTERNAL: 10 bytes announced, 3 sent, then the end
        )
        for frame, status in cases:
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
            conn.initiate_connection()
            headers = [
                (":method", "POST"),
                (":scheme", "http"),
                (":path", PROCESS),
                (":authority", "x"),
                ("content-type", "application/grpc"),
                ("te", "trailers"),
            ]
            conn.send_headers(1, headers)
            conn.send_data(1, frame, end_stream=status == b"13")
            writer.write(conn.data_to_send())
            trailers: dict[bytes, bytes] = {}
            while b"grpc-status" not in trailers:
                data = await asyncio.wait_for(reader.read(65536), 10)
                assert data, "the connection closed without a status"
                for event in conn.receive_data(data):
                    if hasattr(event, "headers") and event.headers:
                        trailers.update(dict(event.headers))
                writer.write(conn.data_to_send())
            assert trailers[b"grpc-status"] == status
            writer.close()
            await writer.wait_closed()
        assert process.seen == []
    finally:
        await server.stop(None)


async def test_a_message_that_does_not_parse_is_refused_with_the_reason() -> None:
    from envoy.service.ext_proc.v3.external_processor_pb2 import ProcessingRequest

    seen: list[Any] = []

    async def process(_requests: Any, ctx: Any) -> None:
        seen.append(await ctx.read())

    server = ExtProcServer(process, ProcessingRequest.FromString, max_recv=1024, max_send=1024)
    server.bind("127.0.0.1", 0)
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            with pytest.raises(grpc.aio.AioRpcError) as bad:
                await channel.unary_unary(PROCESS)(b"\xff\xff\xff")
            assert bad.value.code() == grpc.StatusCode.INTERNAL
            assert "cannot parse the message" in (bad.value.details() or "")
        assert seen == []
    finally:
        await server.stop(None)


async def test_a_reset_cancels_the_handler_and_metrics_count_each_ending() -> None:
    registry = CollectorRegistry()
    metrics = StreamMetrics(registry)
    process = Upper()
    process.hold = asyncio.Event()
    server = await _serve(process, stream_metrics=metrics)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            call = await _held(channel, process)
            assert registry.get_sample_value("llm_d_epp_extproc_streams_inflight") == 1
            call.cancel()
            await _until(lambda: process.ended, "the handler to end")
            assert process.ended == ["cancelled"]
            process.hold.set()
            ok = _stream(channel)
            await ok.write(b"go")
            assert await ok.read() == b"GO"
            await ok.done_writing()
            assert await ok.code() == grpc.StatusCode.OK
        total = "llm_d_epp_extproc_streams_total"
        assert registry.get_sample_value(total, {"code": "Canceled"}) == 1
        assert registry.get_sample_value(total, {"code": "OK"}) == 1
        assert registry.get_sample_value("llm_d_epp_extproc_streams_inflight") == 0
    finally:
        await server.stop(None)


async def test_health_is_served_on_the_port_only_when_given() -> None:
    state = HealthState(synced=True)
    server = await _serve(Upper(), health=state)
    bare = await _serve(Upper())
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            check = channel.unary_unary(f"/{SERVICE}/Check")
            assert decode_check_response(await check(encode_check_request(""))) == SERVING
            state.draining = True
            assert decode_check_response(await check(encode_check_request(""))) == NOT_SERVING
            listed = decode_list_response(await channel.unary_unary(f"/{SERVICE}/List")(b""))
            assert listed and all(v == NOT_SERVING for v in listed.values())
            with pytest.raises(grpc.aio.AioRpcError) as watch:
                async for _ in channel.unary_stream(f"/{SERVICE}/Watch")(encode_check_request("")):
                    pass
            assert watch.value.code() == grpc.StatusCode.UNIMPLEMENTED
        async with grpc.aio.insecure_channel(f"127.0.0.1:{bare.port}") as channel:
            with pytest.raises(grpc.aio.AioRpcError) as missing:
                await channel.unary_unary(f"/{SERVICE}/Check")(encode_check_request(""))
            assert missing.value.code() == grpc.StatusCode.UNIMPLEMENTED
    finally:
        await server.stop(None)
        await bare.stop(None)


async def test_hundreds_of_streams_share_one_connection() -> None:
    """h2's own limit is 100 streams per connection; a gateway multiplexing more must not be refused."""
    process = Upper()
    process.hold = asyncio.Event()
    server = await _serve(process)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            calls = [_stream(channel) for _ in range(300)]
            for i, call in enumerate(calls):
                await call.write(b"s%d" % i)
            await _until(lambda: len(process.seen) == 300, "all 300 streams open at once")
            process.hold.set()
            answers = await asyncio.gather(*(call.read() for call in calls))
            assert answers == [b"S%d" % i for i in range(300)]
            for call in calls:
                await call.done_writing()
    finally:
        await server.stop(None)


@asynccontextmanager
async def _a_held_stream() -> AsyncIterator[tuple[ExtProcServer, Upper, grpc.aio.Channel, Any]]:
    """A running server, its handler, a channel to it and a stream whose first message the handler holds."""
    process = Upper()
    process.hold = asyncio.Event()
    server = await _serve(process)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        yield server, process, channel, await _held(channel, process)


async def test_stop_with_grace_lets_streams_finish_and_refuses_new_ones() -> None:
    async with _a_held_stream() as (server, process, channel, inflight):
        stopping = asyncio.ensure_future(server.stop(30))
        await asyncio.sleep(0.2)
        assert not stopping.done()  # waits for the stream in flight
        with pytest.raises(grpc.aio.AioRpcError) as late:  # a new stream on the open connection
            await channel.unary_unary(PROCESS)(b"late")
        assert late.value.code() == grpc.StatusCode.UNAVAILABLE
        with socket.socket() as probe:  # the listener is closed
            assert probe.connect_ex(("127.0.0.1", server.port)) != 0
        process.hold.set()
        assert await inflight.read() == b"SLOW"
        await inflight.done_writing()
        assert await inflight.code() == grpc.StatusCode.OK
        await asyncio.wait_for(stopping, 10)
    assert process.ended == ["eof"]
    assert process.seen == [b"slow"]


async def test_stop_without_grace_cancels_streams_in_flight() -> None:
    async with _a_held_stream() as (server, process, _, call):
        await asyncio.wait_for(server.stop(None), 10)
        assert process.ended == ["cancelled"]
        assert await call.code() != grpc.StatusCode.OK
    assert process.seen == [b"slow"]


def test_binding_a_taken_port_raises() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        server = ExtProcServer(Upper(), bytes, max_recv=1, max_send=1)
        with pytest.raises(OSError):
            server.bind("127.0.0.1", taken.getsockname()[1])


# --- TLS ---------------------------------------------------------------------------------------------


async def test_tls_serves_h2_to_grpc_clients_with_the_given_pair() -> None:
    pair = self_signed()
    server = await _serve(Upper(), ssl_context=server_context(*pair, "ECDHE-ECDSA-AES128-GCM-SHA256"))
    try:
        assert await asyncio.to_thread(served, server.port) == (der(pair[0]), "h2")
        async with secure_channel(server.port, pair[0]) as channel:
            call = _stream(channel)
            await call.write(b"tls")
            assert await call.read() == b"TLS"
            await call.done_writing()
    finally:
        await server.stop(None)


def test_a_pair_that_does_not_match_is_refused() -> None:
    first, second = self_signed(), self_signed()
    with pytest.raises(CertificateError, match="cannot load the key pair"):
        server_context(first[0], second[1])


async def test_reload_new_connections_get_the_new_pair_open_streams_continue(tmp_path: Path) -> None:
    first, second = self_signed(), self_signed()
    write_pair(tmp_path, first)
    reloading = ReloadingContext(tmp_path)
    server = await _serve(Upper(), ssl_context=reloading.context)
    try:
        old = secure_channel(server.port, first[0])
        call = _stream(old)
        await call.write(b"before")
        assert await call.read() == b"BEFORE"

        (tmp_path / "tls.crt").write_bytes(second[0])  # half written: the key is still the old one
        assert (await asyncio.to_thread(served, server.port))[0] == der(first[0])
        assert reloading.reloads == 0
        write_pair(tmp_path, second)
        assert await asyncio.to_thread(served, server.port) == (der(second[0]), "h2")
        assert reloading.reloads == 1
        async with secure_channel(server.port, second[0]) as new:
            fresh = _stream(new)
            await fresh.write(b"new")
            assert await fresh.read() == b"NEW"
            await fresh.done_writing()
        await call.write(b"after")  # the stream opened on the old pair goes on
        assert await call.read() == b"AFTER"
        await call.done_writing()
        await old.close()
    finally:
        await server.stop(None)


async def test_a_reloaded_pair_keeps_requiring_a_client_certificate_of_the_ca(tmp_path: Path) -> None:
    """The direct-routing API's own port with `--pick-api-client-ca-file` and `--enable-cert-reload`: after a
    new pair is taken, a client certificate the CA signed is still required, and still enough."""
    ca = TestCA()
    first, second, caller = ca.issue("localhost", server=True), ca.issue("localhost", server=True), ca.issue("caller")
    write_pair(tmp_path, (first.cert, first.key))
    reloading = ReloadingContext(tmp_path, client_ca=ca.pem)
    server = await _serve(Upper(), ssl_context=reloading.context)
    certified = grpc.ssl_channel_credentials(
        root_certificates=ca.pem, private_key=caller.key, certificate_chain=caller.cert
    )
    try:
        for pair in (first, second):
            if pair is second:
                write_pair(tmp_path, (second.cert, second.key))
                assert (await asyncio.to_thread(served, server.port))[0] == der(second.cert)
            override = (("grpc.ssl_target_name_override", "localhost"),)
            async with grpc.aio.secure_channel(f"127.0.0.1:{server.port}", certified, options=override) as ch:
                call = _stream(ch)
                await call.write(b"certified")
                assert await call.read() == b"CERTIFIED"
                await call.done_writing()
            async with secure_channel(server.port, ca.pem) as anonymous:  # trusts the server, shows no certificate
                call = _stream(anonymous)
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await call.write(b"anonymous")
                    await call.read()
                assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        assert reloading.reloads == 1
    finally:
        await server.stop(None)
