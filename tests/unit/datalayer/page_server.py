"""A tiny asyncio HTTP/1.1 server for data-layer tests: serves fixed pages per path on 127.0.0.1 with
keep-alive, and can misbehave on purpose (error status, wrong content type, never answer, close before
the announced length, HTTP/1.0 read-until-close bodies)."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ssl
from dataclasses import dataclass, field
from types import TracebackType

TEXT = "text/plain; version=0.0.4; charset=utf-8"


@dataclass
class Route:
    body: bytes = b""
    status: int = 200
    content_type: str | None = TEXT
    mode: str = "normal"  # "normal" | "hang" | "short" (closes before Content-Length) | "http10" (no length)
    delay: float = 0.0


@dataclass
class PageServer:
    routes: dict[str, Route] = field(default_factory=dict)
    ssl_context: ssl.SSLContext | None = None
    hits: collections.Counter[str] = field(default_factory=collections.Counter)
    connections: int = 0
    request_headers: list[dict[str, str]] = field(default_factory=list)
    port: int = 0
    in_flight: int = 0
    max_in_flight: int = 0

    def __post_init__(self) -> None:
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def url(self, path: str) -> str:
        scheme = "https" if self.ssl_context else "http"
        return f"{scheme}://127.0.0.1:{self.port}{path}"

    async def start(self) -> PageServer:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0, ssl=self.ssl_context)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        if self._server is None:
            return
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()
        self._server = None

    async def __aenter__(self) -> PageServer:
        return await self.start()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self.connections += 1
        try:
            while True:
                request_line = await reader.readline()
                if not request_line:
                    return
                headers: dict[str, str] = {}
                while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
                    name, _, value = line.decode().partition(":")
                    headers[name.strip().lower()] = value.strip()
                self.request_headers.append(headers)
                path = request_line.split()[1].decode()
                self.hits[path] += 1
                route = self.routes.get(path, Route(b"no such page\n", status=404))
                self.in_flight += 1
                self.max_in_flight = max(self.max_in_flight, self.in_flight)
                try:
                    if route.delay:
                        await asyncio.sleep(route.delay)
                    if route.mode == "hang":
                        await asyncio.Event().wait()
                    keep_open = await self._answer(writer, route)
                finally:
                    self.in_flight -= 1
                if not keep_open:
                    return
        except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError):
            return
        finally:
            self._tasks.discard(task)
            writer.close()

    @staticmethod
    async def _answer(writer: asyncio.StreamWriter, route: Route) -> bool:
        """Writes the response; False when the connection must close afterwards."""
        version = "HTTP/1.0" if route.mode == "http10" else "HTTP/1.1"
        head = [f"{version} {route.status} X"]
        if route.content_type:
            head.append(f"Content-Type: {route.content_type}")
        if route.mode == "short":
            head.append(f"Content-Length: {len(route.body) + 1000}")
        elif route.mode != "http10":
            head.append(f"Content-Length: {len(route.body)}")
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + route.body)
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        return route.mode == "normal"
