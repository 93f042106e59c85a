"""Real HTTP servers on 127.0.0.1 standing in for the prefill and decode model servers: they record what
they receive and answer like vLLM (a JSON completion, or an SSE stream ending in a usage chunk)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from llm_epp.pdsidecar.proxy import Sidecar, SidecarConfig


@dataclass
class Received:
    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: Any


@dataclass
class ModelServer:
    """Answers every request; `status`/`body` override the answer, `cached_tokens` goes in the usage."""

    name: str
    cached_tokens: int = 0
    status: int = 200
    body: bytes | None = None
    kv_params: dict[str, Any] | None = field(
        default_factory=lambda: {
            "remote_engine_id": "engine-p",
            "remote_block_ids": [1, 2, 3],
            "remote_host": "10.9.9.9",
        }
    )
    received: list[Received] = field(default_factory=list)
    port: int = 0
    fail_first: int = 0  # answer this many requests with 503 first

    @property
    def hostport(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _usage(self, body: dict[str, Any]) -> dict[str, Any]:
        return {
            "prompt_tokens": 40,
            "completion_tokens": 3,
            "total_tokens": 43,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        }

    async def handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        body = orjson.loads(raw) if raw else None
        headers = {k.lower(): v for k, v in request.headers.items()}
        self.received.append(Received(request.method, request.path, request.query_string, headers, body))
        if self.fail_first > 0:
            self.fail_first -= 1
            return web.Response(status=503, body=b'{"error": "busy"}', content_type="application/json")
        if self.body is not None or self.status != 200:
            return web.Response(status=self.status, body=self.body or b"{}", content_type="application/json")
        if not isinstance(body, dict):
            return web.json_response({"object": "list", "data": [{"id": "m"}], "server": self.name})
        if body.get("stream"):
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            for text in ("Hel", "lo", "!"):
                chunk = {"id": "c1", "choices": [{"index": 0, "delta": {"content": text}}], "usage": None}
                await response.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
            if (body.get("stream_options") or {}).get("include_usage"):
                # split the usage chunk over two writes: the sidecar must reassemble the line
                line = b"data: " + orjson.dumps({"id": "c1", "choices": [], "usage": self._usage(body)}) + b"\n\n"
                await response.write(line[:17])
                await response.write(line[17:])
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
            return response
        answer: dict[str, Any] = {
            "id": "c1",
            "object": "chat.completion",
            "server": self.name,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello!"}, "finish_reason": "stop"}],
            "usage": self._usage(body),
        }
        if self.kv_params is not None and (body.get("kv_transfer_params") or {}).get("do_remote_decode"):
            answer["kv_transfer_params"] = self.kv_params
        return web.json_response(answer)


@contextlib.asynccontextmanager
async def serving(app: web.Application) -> AsyncIterator[int]:
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    server = site._server
    assert server is not None
    port = server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield port
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def model_server(server: ModelServer) -> AsyncIterator[ModelServer]:
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", server.handle)
    async with serving(app) as port:
        server.port = port
        yield server


@contextlib.asynccontextmanager
async def sidecar(config: SidecarConfig) -> AsyncIterator[str]:
    async with serving(Sidecar(config).app()) as port:
        yield f"http://127.0.0.1:{port}"
