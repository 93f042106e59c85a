"""The floor an ext_proc endpoint picker in Python can reach: a trivial picker built the cheapest known way
(grpc.aio on uvloop, a ``context.read()/write()`` loop, a generic handler whose answers are pre-serialised
bytes). It speaks the same protocol subset as ``llm-epp serve`` behind ``llm-epp envoy-config``'s defaults
(request headers SEND, request body FULL_DUPLEX_STREAMED, request trailers SEND, response headers SEND or
SKIP, response body NONE, response trailers SEND) and picks endpoints in turn, with no parsing and no state.

It exists to be measured beside llm-epp (``benchmarks.overhead --part picker``): whatever llm-epp spends above
it per request is llm-epp's own cost, not the price of Python, gRPC or the protocol.

With ``--transport asyncio`` the same loop runs behind llm-epp's own ext_proc server
(``llm_epp.extproc.http2_server``, llm-epp's default transport): the floor of that transport.

    python -m benchmarks.trivial_picker --endpoints 127.0.0.1:8001,127.0.0.1:8002 [--port 0] [--ports-file F]
        [--transport grpcio|asyncio]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

DESTINATION = "x-gateway-destination-endpoint"


def answers(endpoints: list[str]) -> tuple[dict[str, bytes], dict[str, bytes]]:
    """Per endpoint: the request-headers answer (header mutation + ``envoy.lb`` metadata) and the same with a
    content-length header, without the length (set per request)."""
    from envoy.config.core.v3.base_pb2 import HeaderValue, HeaderValueOption
    from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
    from google.protobuf.struct_pb2 import Struct

    routes: dict[str, bytes] = {}
    metadata: dict[str, bytes] = {}
    for dest in endpoints:
        md = Struct()
        md.update({"envoy.lb": {DESTINATION: dest}})
        metadata[dest] = pb.ProcessingResponse(dynamic_metadata=md).SerializeToString()
        hv = HeaderValueOption(header=HeaderValue(key=DESTINATION, raw_value=dest.encode()))
        routes[dest] = pb.ProcessingResponse(
            request_headers=pb.HeadersResponse(
                response=pb.CommonResponse(header_mutation=pb.HeaderMutation(set_headers=[hv]), clear_route_cache=True)
            )
        ).SerializeToString()
    return routes, metadata


def handler(endpoints: list[str], eof: object) -> Callable[[Any, Any], Awaitable[None]]:
    """The picker's stream handler: a ``context.read()/write()`` loop (``eof`` is what ``read()`` returns at the
    end of the stream), endpoints in turn, answers pre-serialised."""
    from envoy.config.core.v3.base_pb2 import HeaderValue, HeaderValueOption
    from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

    routes, metadata = answers(endpoints)
    turn = itertools.cycle(endpoints)
    rsp_headers = pb.ProcessingResponse(response_headers=pb.HeadersResponse()).SerializeToString()
    rsp_trailers = pb.ProcessingResponse(response_trailers=pb.TrailersResponse()).SerializeToString()
    req_trailers = pb.ProcessingResponse(request_trailers=pb.TrailersResponse()).SerializeToString()

    def route(dest: str, length: int | None) -> bytes:
        if length is None:
            return routes[dest] + metadata[dest]
        hv = HeaderValueOption(header=HeaderValue(key="content-length", raw_value=str(length).encode()))
        mutation = pb.HeaderMutation(set_headers=[hv])
        # fields of a message merge on the wire: the route answer plus one more set_headers entry
        extra = pb.ProcessingResponse(
            request_headers=pb.HeadersResponse(response=pb.CommonResponse(header_mutation=mutation))
        ).SerializeToString()
        return routes[dest] + extra + metadata[dest]

    def body_echo(body: bytes, eos: bool) -> bytes:
        streamed = pb.StreamedBodyResponse(body=body, end_of_stream=eos)
        common = pb.CommonResponse(body_mutation=pb.BodyMutation(streamed_response=streamed))
        return pb.ProcessingResponse(request_body=pb.BodyResponse(response=common)).SerializeToString()

    async def process(_requests: Any, ctx: Any) -> None:
        body = b""
        write = ctx.write
        while True:
            req = await ctx.read()
            if req is eof:
                return
            kind = req.WhichOneof("request")
            if kind == "request_body":
                body += req.request_body.body
                if req.request_body.end_of_stream:
                    await write(route(next(turn), len(body)))
                    await write(body_echo(body, True))
            elif kind == "response_headers":
                await write(rsp_headers)
                if req.response_headers.end_of_stream:
                    return
            elif kind == "request_headers":
                if req.request_headers.end_of_stream:
                    await write(route(next(turn), None))
            elif kind == "request_trailers":
                await write(route(next(turn), len(body)))
                await write(body_echo(body, False))
                await write(req_trailers)
            elif kind == "response_trailers":
                await write(rsp_trailers)
                return

    return process


def serve(endpoints: list[str], port: int, ports_file: Path | None, transport: str = "grpcio") -> None:
    import grpc
    import uvloop
    from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

    process = handler(endpoints, grpc.aio.EOF)

    async def main_asyncio() -> None:
        from llm_epp.extproc.http2_server import ExtProcServer

        server = ExtProcServer(process, pb.ProcessingRequest.FromString, max_recv=64 << 20, max_send=64 << 20)
        bound = server.bind("127.0.0.1", port)
        await server.start()
        if ports_file is not None:
            tmp = ports_file.with_suffix(".tmp")
            tmp.write_text(json.dumps({"grpc": bound}))
            tmp.rename(ports_file)
        await asyncio.Event().wait()

    async def main() -> None:
        server = grpc.aio.server(options=[("grpc.so_reuseport", 0), ("grpc.max_receive_message_length", 64 << 20)])
        server.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(
                    "envoy.service.ext_proc.v3.ExternalProcessor",
                    {
                        "Process": grpc.stream_stream_rpc_method_handler(
                            process, request_deserializer=pb.ProcessingRequest.FromString, response_serializer=None
                        )
                    },
                ),
            )
        )
        bound = server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        if ports_file is not None:
            tmp = ports_file.with_suffix(".tmp")
            tmp.write_text(json.dumps({"grpc": bound}))
            tmp.rename(ports_file)
        await server.wait_for_termination()

    uvloop.run(main_asyncio() if transport == "asyncio" else main())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--endpoints", required=True, help="comma-separated ip:port list, picked in turn")
    p.add_argument("--port", type=int, default=0, help="gRPC port on 127.0.0.1 (default 0: a free one)")
    p.add_argument("--ports-file", type=Path, help='write {"grpc": port} here once serving')
    p.add_argument(
        "--transport",
        choices=("grpcio", "asyncio"),
        default="grpcio",
        help="grpcio (default: the floor as the reference notes build it) or asyncio (llm-epp's own ext_proc "
        "server, extproc/http2_server.py, around the same loop: the floor of llm-epp's default transport)",
    )
    args = p.parse_args(argv)
    endpoints = [e.strip() for e in args.endpoints.split(",") if e.strip()]
    if not endpoints:
        p.error("--endpoints: give at least one ip:port")
    try:
        serve(endpoints, args.port, args.ports_file, args.transport)
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
