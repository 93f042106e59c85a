"""--grpc-max-recv-msg-size / --grpc-max-send-msg-size reach the gRPC server."""

from __future__ import annotations

import grpc

from llm_epp.app import grpc_server_options
from llm_epp.options import DEFAULT_GRPC_MAX_MSG_BYTES, Options


async def _echo(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    return request * 4


async def test_message_size_limits() -> None:
    server = grpc.aio.server(
        options=grpc_server_options(Options(grpc_max_recv_msg_size=1024, grpc_max_send_msg_size=2048))
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("t.Echo", {"Call": grpc.unary_unary_rpc_method_handler(_echo)}),)
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = channel.unary_unary("/t.Echo/Call")
            assert await call(b"x" * 500) == b"x" * 2000  # in 500 <= 1024, out 2000 <= 2048
            for size in (2000, 600):  # 2000 in > 1024; 600 in but 2400 out > 2048
                try:
                    await call(b"x" * size)
                except grpc.aio.AioRpcError as e:
                    assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                else:
                    raise AssertionError(f"{size} bytes passed the limits")
    finally:
        await server.stop(None)


def test_defaults() -> None:
    options = dict(grpc_server_options(Options()))
    assert options["grpc.max_receive_message_length"] == DEFAULT_GRPC_MAX_MSG_BYTES
    assert options["grpc.max_send_message_length"] == DEFAULT_GRPC_MAX_MSG_BYTES
