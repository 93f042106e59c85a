"""`--enable-cert-reload`: replacing tls.crt / tls.key changes what new TLS connections see, while a stream
opened before keeps working."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from llm_epp.security.cert_reload import CertReloader, check_pair
from llm_epp.security.tls import CertificateError, self_signed
from tests.unit.security.tls_probe import der, secure_channel, served, write_pair

METHOD = "/test.Echo/Chat"


async def _echo(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
    async for message in requests:
        yield message


async def test_new_connections_get_the_new_pair_and_open_streams_continue(tmp_path: Path) -> None:
    first, second = self_signed(), self_signed()
    write_pair(tmp_path, first)
    reloader = CertReloader(tmp_path)
    server = grpc.aio.server()
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("test.Echo", {"Chat": grpc.stream_stream_rpc_method_handler(_echo)}),)
    )
    port = server.add_secure_port("127.0.0.1:0", reloader.credentials())
    await server.start()
    try:
        old = secure_channel(port, first[0])
        call = old.stream_stream(METHOD)()
        await call.write(b"before")
        assert await call.read() == b"before"
        assert served(port)[0] == der(first[0])

        write_pair(tmp_path, second)
        assert served(port)[0] == der(second[0])  # a new connection sees the new certificate
        assert reloader.reloads == 1
        new = secure_channel(port, second[0])
        fresh = new.stream_stream(METHOD)()
        await fresh.write(b"new")
        assert await fresh.read() == b"new"
        await fresh.done_writing()
        stale = secure_channel(port, first[0])  # trusts only the replaced certificate
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stale.unary_unary(METHOD)(b"x", timeout=5)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        await stale.close()
        await call.write(b"after")  # the stream opened on the old certificate goes on
        assert await call.read() == b"after"
        await call.done_writing()
        await old.close()
        await new.close()
    finally:
        await server.stop(None)


async def test_a_half_written_or_broken_pair_keeps_the_current_one(tmp_path: Path) -> None:
    first, second = self_signed(), self_signed()
    write_pair(tmp_path, first)
    reloader = CertReloader(tmp_path)
    assert reloader.fetch() is None  # unchanged
    (tmp_path / "tls.crt").write_bytes(second[0])  # key not yet replaced
    assert reloader.fetch() is None
    assert reloader.reloads == 0
    (tmp_path / "tls.key").write_bytes(second[1])
    assert reloader.fetch() is not None
    assert reloader.reloads == 1
    (tmp_path / "tls.key").write_bytes(b"garbage")
    assert reloader.fetch() is None


def test_check_pair_explains_a_mismatch() -> None:
    (cert, _), (_, other_key) = self_signed(), self_signed()
    with pytest.raises(CertificateError, match=r"tls\.key is not the key of tls\.crt"):
        check_pair(cert, other_key)
