"""Stub OpenAI-compatible model servers (stdlib asyncio, HTTP/1.1) for the demo, tests and overhead
benchmarks: they answer at once, or after a set TTFT and inter-token delay, and model no GPU.

Each ``Backend`` listens on 127.0.0.1 (port 0 by default), tags every response with
``x-backend-name: <name>``, and records every request it receives.  Request bodies may be sent with
``content-length`` or ``transfer-encoding: chunked`` (Envoy forwards FULL_DUPLEX_STREAMED bodies chunked).

Endpoints:

* ``POST /v1/completions``, ``POST /v1/chat/completions`` -- ``max_tokens`` (default 16) tokens.
  ``"stream": true`` answers vLLM-style SSE (``data: {json}\\n\\n`` per token, a ``"choices": []`` usage
  chunk when ``stream_options.include_usage``, then ``data: [DONE]\\n\\n``); otherwise one JSON body with
  ``usage``.  Every JSON object echoes the request's ``model`` and carries ``x_backend_name``,
  ``x_body_sha256`` and ``x_body_len`` of the body as received.
* ``GET /v1/models``, ``GET /health``.
* ``GET /metrics`` -- vLLM gauges from the settable attributes ``queue``
  (``vllm:num_requests_waiting``), ``running`` (``vllm:num_requests_running``; ``None`` = live in-flight
  count) and ``kv_cache_usage`` (``vllm:kv_cache_usage_perc``, 0..1); the ``name[]`` query parameter
  restricts the page as prometheus_client does.

``BackendPool`` runs several backends on one event loop in a background thread so that synchronous and
asynchronous tests can share it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import json
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from llm_epp.sim.http import BadHTTPRequest, read_request
from llm_epp.sim.metric_names import requested_names, restrict

__all__ = ["Backend", "BackendPool", "RecordedRequest"]

_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 413: "Too Large"}
_NOT_SERVED = frozenset({"/metrics", "/health"})


@dataclass
class RecordedRequest:
    backend: str
    method: str
    path: str  # as sent, including any query string
    headers: dict[str, str]  # lower-case names; repeated headers joined with ", "
    body: bytes
    received_at: float = field(default_factory=time.monotonic)

    def json(self) -> Any:
        return json.loads(self.body)


class Backend:
    """One stub model server."""

    def __init__(
        self,
        name: str,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        model: str = "stub-model",
        ttft_s: float = 0.0,
        itl_s: float = 0.0,
    ) -> None:
        self.name = name
        self.host = host
        self.port = port
        self.model = model
        self.ttft_s = ttft_s  # delay before the first token / the JSON answer
        self.itl_s = itl_s  # delay between streamed tokens
        self.queue = 0
        self.running: int | None = None
        self.kv_cache_usage = 0.0
        # LoRA adapters reported as loaded in vllm:lora_requests_info (None: the series is not exported)
        self.lora_adapters: list[str] | None = None
        self.metrics_failing = False  # True: /metrics answers 500 with an HTML page
        self.max_loras = 4
        self._started_at = time.time()
        self.in_flight = 0
        self.requests: list[RecordedRequest] = []
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._ids = itertools.count(1)

    # ------------------------------------------------------------------ lifecycle

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    async def start(self) -> Backend:
        self._server = await asyncio.start_server(self._handle, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        await server.wait_closed()

    async def __aenter__(self) -> Backend:
        return await self.start()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    # ------------------------------------------------------------------ inspection

    @property
    def served(self) -> int:
        """Requests other than ``/metrics`` and ``/health`` (i.e. those a gateway routed here)."""
        return sum(1 for r in list(self.requests) if r.path.split("?", 1)[0] not in _NOT_SERVED)

    def served_requests(self) -> list[RecordedRequest]:
        return [r for r in list(self.requests) if r.path.split("?", 1)[0] not in _NOT_SERVED]

    def reset(self) -> None:
        self.requests = []

    # ------------------------------------------------------------------ HTTP/1.1

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            while True:
                try:
                    raw = await read_request(reader, writer)
                except BadHTTPRequest as exc:
                    await self._send_json(writer, exc.status, {"error": exc.message}, keep_alive=False)
                    break
                if raw is None:
                    break
                request = RecordedRequest(self.name, raw.method, raw.target, raw.headers, raw.body)
                keep_alive = self._keep_alive(request)
                self.requests.append(request)
                await self._dispatch(request, writer, keep_alive)
                if not keep_alive:
                    break
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        finally:
            self._tasks.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    @staticmethod
    def _keep_alive(request: RecordedRequest) -> bool:
        return "close" not in request.headers.get("connection", "").lower()

    def _head(self, status: int, content_type: str, extra: Iterable[tuple[str, str]], keep_alive: bool) -> bytes:
        lines = [
            f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}",
            f"content-type: {content_type}",
            f"x-backend-name: {self.name}",
            f"connection: {'keep-alive' if keep_alive else 'close'}",
            *(f"{k}: {v}" for k, v in extra),
        ]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    async def _send(
        self, writer: asyncio.StreamWriter, status: int, body: bytes, content_type: str, keep_alive: bool
    ) -> None:
        writer.write(self._head(status, content_type, [("content-length", str(len(body)))], keep_alive) + body)
        await writer.drain()

    async def _send_json(self, writer: asyncio.StreamWriter, status: int, obj: Any, keep_alive: bool) -> None:
        await self._send(writer, status, json.dumps(obj).encode(), "application/json", keep_alive)

    # ------------------------------------------------------------------ routes

    async def _dispatch(self, req: RecordedRequest, writer: asyncio.StreamWriter, keep_alive: bool) -> None:
        path = req.path.split("?", 1)[0]
        if path in ("/v1/completions", "/v1/chat/completions"):
            if req.method != "POST":
                await self._send_json(writer, 405, {"error": "use POST"}, keep_alive)
                return
            self.in_flight += 1
            try:
                await self._completion(req, writer, keep_alive, chat=path.endswith("/chat/completions"))
            finally:
                self.in_flight -= 1
        elif path == "/v1/models" and req.method == "GET":
            models = {
                "object": "list",
                "data": [{"id": self.model, "object": "model", "created": 0, "owned_by": "llm-epp-tests"}],
            }
            await self._send_json(writer, 200, models, keep_alive)
        elif path == "/health" and req.method == "GET":
            await self._send(writer, 200, b"", "text/plain", keep_alive)
        elif path == "/metrics" and req.method == "GET":
            if self.metrics_failing:
                await self._send(writer, 500, b"<html>internal error</html>", "text/html", keep_alive)
            else:
                page = self.metrics_text()
                if (names := requested_names(req.path)) is not None:
                    page = restrict(page, names)
                await self._send(writer, 200, page.encode(), "text/plain; version=0.0.4", keep_alive)
        else:
            await self._send_json(writer, 404, {"error": f"no route for {req.method} {path}"}, keep_alive)

    def metrics_text(self) -> str:
        running = self.in_flight if self.running is None else self.running
        label = f'{{model_name="{self.model}"}}'
        gauges = [
            ("vllm:num_requests_waiting", "Requests waiting to be processed.", float(self.queue)),
            ("vllm:num_requests_running", "Requests currently running.", float(running)),
            ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", self.kv_cache_usage),
        ]
        out = []
        for name, help_text, value in gauges:
            out += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge", f"{name}{label} {value}"]
        if self.lora_adapters is not None:
            running_loras = ",".join(self.lora_adapters)
            out += [
                "# HELP vllm:lora_requests_info Running stats on lora requests.",
                "# TYPE vllm:lora_requests_info gauge",
                f'vllm:lora_requests_info{{max_lora="{self.max_loras}",running_lora_adapters="{running_loras}",'
                f'waiting_lora_adapters=""}} {self._started_at:.3f}',
            ]
        return "\n".join(out) + "\n"

    async def _completion(
        self, req: RecordedRequest, writer: asyncio.StreamWriter, keep_alive: bool, *, chat: bool
    ) -> None:
        try:
            payload = json.loads(req.body)
            if not isinstance(payload, dict):
                raise ValueError("body is not a JSON object")
        except ValueError as exc:
            await self._send_json(writer, 400, {"error": f"invalid JSON body: {exc}"}, keep_alive)
            return
        model = payload.get("model", self.model)
        max_tokens = payload.get("max_tokens") or payload.get("max_completion_tokens") or 16
        prompt_tokens = _count_prompt_tokens(payload, chat=chat)
        tokens = [f" t{i}" for i in range(int(max_tokens))]
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": len(tokens),
            "total_tokens": prompt_tokens + len(tokens),
        }
        base = {
            "id": f"{'chatcmpl' if chat else 'cmpl'}-{self.name}-{next(self._ids)}",
            "created": int(time.time()),
            "model": model,
            "x_backend_name": self.name,
            "x_body_sha256": hashlib.sha256(req.body).hexdigest(),
            "x_body_len": len(req.body),
        }
        if self.ttft_s:
            await asyncio.sleep(self.ttft_s)
        if not payload.get("stream"):
            if chat:
                choice: dict[str, Any] = {
                    "index": 0,
                    "message": {"role": "assistant", "content": "".join(tokens)},
                    "finish_reason": "length",
                }
            else:
                choice = {"index": 0, "text": "".join(tokens), "logprobs": None, "finish_reason": "length"}
            obj = {**base, "object": "chat.completion" if chat else "text_completion"}
            obj.update(choices=[choice], usage=usage)
            await self._send_json(writer, 200, obj, keep_alive)
            return

        extra = [("transfer-encoding", "chunked"), ("cache-control", "no-cache")]
        writer.write(self._head(200, "text/event-stream", extra, keep_alive))
        object_name = "chat.completion.chunk" if chat else "text_completion"
        for i, token in enumerate(tokens):
            if i and self.itl_s:
                await asyncio.sleep(self.itl_s)
            finish = "length" if i == len(tokens) - 1 else None
            if chat:
                delta = {"role": "assistant", "content": token} if i == 0 else {"content": token}
                choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            else:
                choice = {"index": 0, "text": token, "logprobs": None, "finish_reason": finish}
            await _write_event(writer, {**base, "object": object_name, "choices": [choice]})
        stream_options = payload.get("stream_options") or {}
        if isinstance(stream_options, dict) and stream_options.get("include_usage"):
            await _write_event(writer, {**base, "object": object_name, "choices": [], "usage": usage})
        await _write_chunk(writer, b"data: [DONE]\n\n")
        writer.write(b"0\r\n\r\n")
        await writer.drain()


async def _write_chunk(writer: asyncio.StreamWriter, data: bytes) -> None:
    writer.write(b"%x\r\n%s\r\n" % (len(data), data))
    await writer.drain()


async def _write_event(writer: asyncio.StreamWriter, obj: Any) -> None:
    await _write_chunk(writer, b"data: " + json.dumps(obj).encode() + b"\n\n")


def _count_prompt_tokens(payload: dict[str, Any], *, chat: bool) -> int:
    """Whitespace-separated words of the prompt (or message contents); at least 1."""
    texts: list[str] = []
    if chat:
        for message in payload.get("messages") or []:
            content = message.get("content") if isinstance(message, dict) else None
            if isinstance(content, str):
                texts.append(content)
            elif isinstance(content, list):
                texts += [p.get("text", "") for p in content if isinstance(p, dict)]
    else:
        prompt = payload.get("prompt", "")
        texts += [prompt] if isinstance(prompt, str) else [str(p) for p in prompt]
    return max(1, sum(len(t.split()) for t in texts))


class BackendPool:
    """N backends on one event loop in a daemon thread; a sync context manager."""

    def __init__(self, n: int = 2, *, names: Sequence[str] | None = None, **backend_kwargs: Any) -> None:
        names = list(names) if names is not None else [f"b{i}" for i in range(n)]
        self.backends = [Backend(name, **backend_kwargs) for name in names]
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> BackendPool:
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._thread = threading.Thread(target=loop.run_forever, name="backend-pool", daemon=True)
        self._thread.start()
        try:
            self.call(self._start_all())
        except BaseException:
            self.stop()
            raise
        return self

    async def _start_all(self) -> None:
        for backend in self.backends:
            await backend.start()

    async def _stop_all(self) -> None:
        await asyncio.gather(*(b.stop() for b in self.backends), return_exceptions=True)

    def call(self, coro: Any, timeout: float = 30.0) -> Any:
        """Run a coroutine on the pool's loop from another thread and return its result."""
        assert self._loop is not None, "pool not started"
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def stop(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        with contextlib.suppress(Exception):
            self.call(self._stop_all())
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()
        self._loop = self._thread = None

    def __enter__(self) -> BackendPool:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def __len__(self) -> int:
        return len(self.backends)

    def __getitem__(self, index: int) -> Backend:
        return self.backends[index]

    @property
    def addresses(self) -> list[str]:
        return [b.address for b in self.backends]

    @property
    def by_address(self) -> dict[str, Backend]:
        return {b.address: b for b in self.backends}

    @property
    def by_name(self) -> dict[str, Backend]:
        return {b.name: b for b in self.backends}

    def served_counts(self) -> dict[str, int]:
        """Routed requests per backend name (``/metrics`` and ``/health`` not counted)."""
        return {b.name: b.served for b in self.backends}

    def reset(self) -> None:
        for backend in self.backends:
            backend.reset()
