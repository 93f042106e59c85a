"""`--enable-grpc-stream-metrics`: ext_proc streams counted by a real grpc.aio server's interceptor."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from prometheus_client import CollectorRegistry

from llm_epp.observability.stream_metrics import StreamMetrics

SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"


async def _process(requests: object, context: grpc.aio.ServicerContext) -> None:
    while True:
        message = await context.read()
        if message is grpc.aio.EOF:
            return
        if message == b"full":
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "too much")
        if message == b"hold":
            await asyncio.sleep(30)
        await context.write(message)


async def _health(requests: object, context: grpc.aio.ServicerContext) -> None:
    await context.write(b"ok")


async def test_streams_by_code_inflight_and_duration() -> None:
    registry = CollectorRegistry()
    metrics = StreamMetrics(registry)
    server = grpc.aio.server(interceptors=[metrics.interceptor()])
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(SERVICE, {"Process": grpc.stream_stream_rpc_method_handler(_process)}),
            grpc.method_handlers_generic_handler(
                "other.Service", {"Watch": grpc.stream_stream_rpc_method_handler(_health)}
            ),
        )
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()

    def value(name: str, **labels: str) -> float:
        return registry.get_sample_value(name, labels) or 0.0

    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            process = channel.stream_stream(f"/{SERVICE}/Process")
            ok = process()
            await ok.write(b"a")
            assert await ok.read() == b"a"
            await ok.done_writing()
            assert await ok.code() == grpc.StatusCode.OK

            full = process()
            await full.write(b"full")
            assert await full.code() == grpc.StatusCode.RESOURCE_EXHAUSTED

            held = process()
            await held.write(b"hold")
            await asyncio.sleep(0.2)
            assert value("llm_d_epp_extproc_streams_inflight") == 1
            held.cancel()
            for _ in range(100):
                if value("llm_d_epp_extproc_streams_total", code="Canceled"):
                    break
                await asyncio.sleep(0.02)

            other = channel.stream_stream("/other.Service/Watch")()
            assert await other.read() == b"ok"
            await other.done_writing()
            await other.code()
    finally:
        await server.stop(None)

    assert value("llm_d_epp_extproc_streams_total", code="OK") == 1
    assert value("llm_d_epp_extproc_streams_total", code="ResourceExhausted") == 1
    assert value("llm_d_epp_extproc_streams_total", code="Canceled") == 1
    assert value("llm_d_epp_extproc_streams_inflight") == 0
    assert value("llm_d_epp_extproc_stream_duration_seconds_count") == 3  # the other service is not counted


@pytest.mark.parametrize(
    ("code", "go"), [(grpc.StatusCode.INVALID_ARGUMENT, "InvalidArgument"), (grpc.StatusCode.OK, "OK")]
)
def test_go_code_names(code: grpc.StatusCode, go: str) -> None:
    from llm_epp.observability.stream_metrics import GO_CODE_NAMES

    assert GO_CODE_NAMES[code] == go
    assert GO_CODE_NAMES[grpc.StatusCode.CANCELLED] == "Canceled"
