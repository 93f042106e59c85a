"""The request side of HTTP/1.1 for the simulated and stub model servers: request line, headers, and a
body sent with Content-Length or chunked (Envoy forwards FULL_DUPLEX_STREAMED bodies chunked)."""

from __future__ import annotations

import asyncio
from typing import NamedTuple

MAX_BODY = 64 * 1024 * 1024


class BadHTTPRequest(Exception):
    """A request the server cannot read; answer `status` and close."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class HTTPRequest(NamedTuple):
    method: str
    target: str  # as sent, including any query string
    headers: dict[str, str]  # lower-case names; repeated headers joined with ", "
    body: bytes

    @property
    def path(self) -> str:
        return self.target.split("?", 1)[0]


async def read_request(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, max_body: int = MAX_BODY
) -> HTTPRequest | None:
    """The next request on a keep-alive connection, or None when the client closed it."""
    line = await reader.readline()
    if not line:
        return None
    try:
        method, target, _version = line.decode("latin-1").rstrip("\r\n").split(" ", 2)
    except ValueError:
        raise BadHTTPRequest(400, "malformed request line") from None
    headers: dict[str, str] = {}
    while True:
        raw = await reader.readline()
        if not raw:
            return None
        text = raw.decode("latin-1").rstrip("\r\n")
        if not text:
            break
        name, _, value = text.partition(":")
        key = name.strip().lower()
        value = value.strip()
        headers[key] = f"{headers[key]}, {value}" if key in headers else value
    if headers.get("expect", "").lower() == "100-continue":
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        await writer.drain()
    if "chunked" in headers.get("transfer-encoding", "").lower():
        body = await _read_chunked(reader, max_body)
    elif "content-length" in headers:
        try:
            length = int(headers["content-length"])
        except ValueError:
            raise BadHTTPRequest(400, "bad content-length") from None
        if length > max_body:
            raise BadHTTPRequest(413, "body too large")
        body = await reader.readexactly(length)
    else:
        body = b""
    return HTTPRequest(method, target, headers, body)


async def _read_chunked(reader: asyncio.StreamReader, max_body: int) -> bytes:
    parts: list[bytes] = []
    total = 0
    while True:
        size_line = (await reader.readline()).decode("latin-1").strip()
        try:
            size = int(size_line.split(";", 1)[0], 16)
        except ValueError:
            raise BadHTTPRequest(400, "bad chunk size") from None
        if size == 0:
            while (await reader.readline()).strip():  # trailers, up to the blank line
                pass
            return b"".join(parts)
        total += size
        if total > max_body:
            raise BadHTTPRequest(413, "body too large")
        parts.append(await reader.readexactly(size))
        await reader.readexactly(2)  # CRLF after the chunk data
