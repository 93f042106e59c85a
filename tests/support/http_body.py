"""The body of a request read by a loopback `http.server` pod, whichever framing Envoy chose.

With request bodies FULL_DUPLEX_STREAMED, Envoy forwards the (re-streamed) body chunked and without a
content-length; a pod that reads only content-length leaves the chunks on the connection, answers them as
a malformed next request, and Envoy fails whichever request it sends on that connection next."""

from __future__ import annotations

from http.server import BaseHTTPRequestHandler


def read_request_body(handler: BaseHTTPRequestHandler) -> bytes:
    if "chunked" not in handler.headers.get("transfer-encoding", "").lower():
        return handler.rfile.read(int(handler.headers.get("content-length", "0")))
    parts: list[bytes] = []
    while True:
        size = int(handler.rfile.readline().split(b";")[0].strip(), 16)
        if size == 0:
            handler.rfile.readline()  # the empty line after the last chunk (no trailers are sent)
            return b"".join(parts)
        parts.append(handler.rfile.read(size))
        handler.rfile.readline()
