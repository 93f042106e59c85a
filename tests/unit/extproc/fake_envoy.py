"""A scripted fake Envoy for driving the ext_proc servicer without sockets."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from typing import Any

import grpc
from envoy.config.core.v3.base_pb2 import HeaderMap, HeaderValue
from envoy.extensions.filters.http.ext_proc.v3.processing_mode_pb2 import ProcessingMode
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from google.protobuf.struct_pb2 import Struct

from llm_epp.config import load_config_text
from llm_epp.datalayer import Datastore
from llm_epp.datalayer.static import parse_endpoint_list
from llm_epp.extproc.servicer import ExtProcServicer
from llm_epp.framework import NullRecorder
from llm_epp.plugins import builtin_registry
from llm_epp.plugins.parsers import default_parsers
from llm_epp.requestcontrol.director import Director, DirectorOptions, RequestPlugins

FDS = ProcessingMode.FULL_DUPLEX_STREAMED
BUFFERED = ProcessingMode.BUFFERED
NONE = ProcessingMode.NONE


def headers_msg(
    headers: dict[str, str],
    eos: bool = False,
    req_mode: int = FDS,
    resp_mode: int = NONE,
    subset: Any = None,
) -> pb.ProcessingRequest:
    hm = HeaderMap(headers=[HeaderValue(key=k, raw_value=v.encode()) for k, v in headers.items()])
    msg = pb.ProcessingRequest(request_headers=pb.HttpHeaders(headers=hm, end_of_stream=eos))
    msg.protocol_config.request_body_mode = req_mode
    msg.protocol_config.response_body_mode = resp_mode
    if subset is not None:
        s = Struct()
        s.update({"x-gateway-destination-endpoint-subset": subset})
        msg.metadata_context.filter_metadata["envoy.lb.subset_hint"].CopyFrom(s)
    return msg


def body_msg(data: bytes, eos: bool) -> pb.ProcessingRequest:
    return pb.ProcessingRequest(request_body=pb.HttpBody(body=data, end_of_stream=eos))


def response_headers_msg(headers: dict[str, str], eos: bool = False, served: str | None = None) -> pb.ProcessingRequest:
    hm = HeaderMap(headers=[HeaderValue(key=k, raw_value=v.encode()) for k, v in headers.items()])
    msg = pb.ProcessingRequest(response_headers=pb.HttpHeaders(headers=hm, end_of_stream=eos))
    if served is not None:
        s = Struct()
        s.update({"x-gateway-destination-endpoint-served": served})
        msg.metadata_context.filter_metadata["envoy.lb"].CopyFrom(s)
    return msg


def response_body_msg(data: bytes, eos: bool) -> pb.ProcessingRequest:
    return pb.ProcessingRequest(response_body=pb.HttpBody(body=data, end_of_stream=eos))


def request_trailers_msg() -> pb.ProcessingRequest:
    return pb.ProcessingRequest(request_trailers=pb.HttpTrailers())


def response_trailers_msg() -> pb.ProcessingRequest:
    return pb.ProcessingRequest(response_trailers=pb.HttpTrailers())


class FakeContext:
    """Plays Envoy's side of one stream: `read()` returns the scripted messages, then EOF (or raises
    CancelledError to model a client that went away); `write()` collects decoded answers."""

    def __init__(
        self, messages: Iterable[pb.ProcessingRequest], cancel_at_end: bool = False, cancel_on_write: int = -1
    ) -> None:
        self._messages = list(messages)
        self._cancel = cancel_at_end
        self._cancel_on_write = cancel_on_write  # models Envoy resetting the stream once it has an answer
        self.sent: list[pb.ProcessingResponse] = []

    async def read(self) -> Any:
        if self._messages:
            return self._messages.pop(0)
        if self._cancel:
            raise asyncio.CancelledError()
        return grpc.aio.EOF

    async def write(self, data: bytes) -> None:
        self.sent.append(pb.ProcessingResponse.FromString(data))
        if len(self.sent) - 1 == self._cancel_on_write:
            raise asyncio.CancelledError()

    def kinds(self) -> list[str]:
        return [m.WhichOneof("response") for m in self.sent]


class Recorder(NullRecorder):
    def __init__(self) -> None:
        self.errors: list[str] = []
        self.completed: list[tuple[Any, ...]] = []
        self.running = 0

    def request_error(self, model: str, target_model: str, error_code: str) -> None:
        self.errors.append(error_code)

    def running_requests(self, model: str, delta: int) -> None:
        self.running += delta

    def request_completed(self, *args: Any) -> None:
        self.completed.append(args)


class Harness:
    def __init__(
        self,
        endpoints: str,
        max_body: int = 16 << 20,
        explain: bool = False,
        plugins: RequestPlugins | None = None,
        config: str | None = None,
        servicer_opts: dict[str, Any] | None = None,
        **director_opts: Any,
    ) -> None:
        self.datastore = Datastore()
        self.datastore.replace_all(parse_endpoint_list(endpoints))
        self.recorder = Recorder()
        loaded = load_config_text(config, builtin_registry(), self.recorder)
        self.director = Director(
            self.datastore.snapshot,
            loaded.scheduler,
            plugins or RequestPlugins(),
            self.recorder,
            DirectorOptions(**director_opts),
            parsers=default_parsers(),
        )
        self.servicer = ExtProcServicer(self.director, max_body, enable_explain=explain, **(servicer_opts or {}))

    async def run(
        self, messages: Sequence[pb.ProcessingRequest], cancel_at_end: bool = False, cancel_on_write: int = -1
    ) -> FakeContext:
        ctx = FakeContext(messages, cancel_at_end, cancel_on_write)
        await self.servicer.process(None, ctx)  # type: ignore[arg-type]
        return ctx
