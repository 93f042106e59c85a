"""gRPC message framing (length-prefixed messages) for the parsers of gRPC APIs.

On the wire every gRPC message is a 5-byte prefix (a compressed flag byte, then the message length as a
big-endian uint32) followed by the message bytes. A request body read by the EPP holds the unary request
message; a response body is a sequence of messages, split across chunks anywhere."""

from __future__ import annotations

import struct

from llm_epp.plugins.parsers.tokens import bad_request

PREFIX = 5
_LENGTH = struct.Struct(">I")
MAX_RESPONSE_MESSAGE_BYTES = 4 << 20  # response messages larger than this are skipped, not buffered


def frame(message: bytes) -> bytes:
    """`message` as one uncompressed gRPC frame."""
    return b"\x00" + _LENGTH.pack(len(message)) + message


def request_message(body: bytes, what: str) -> bytes:
    """The first message of a gRPC request body. Raises EppError(BadRequest) when the body is not one
    uncompressed gRPC frame (`what` names the expected message)."""
    if len(body) < PREFIX:
        raise bad_request(
            f"invalid gRPC request: expected a {what} in a gRPC frame (5-byte prefix), got {len(body)} bytes"
        )
    if body[0] > 1:
        raise bad_request(
            f"invalid gRPC request: expected a {what} in a gRPC frame, whose first byte is 0 or 1, got {body[0]}"
        )
    if body[0] == 1:
        raise bad_request(
            "compressed gRPC request messages are not supported: send the request uncompressed "
            "(no grpc-encoding on the request)"
        )
    length = _LENGTH.unpack_from(body, 1)[0]
    if len(body) < PREFIX + length:
        raise bad_request(
            f"incomplete gRPC request: the frame announces {length} bytes, the body holds {len(body) - PREFIX}"
        )
    return body[PREFIX : PREFIX + length]


class FrameReader:
    """Reassembles the messages of a gRPC response body fed in chunks and hands each complete, uncompressed
    message to `take`. Holds at most one partial message; a message announced larger than
    MAX_RESPONSE_MESSAGE_BYTES (or compressed) is skipped without buffering it."""

    __slots__ = ("_buf", "_skip")

    def __init__(self) -> None:
        self._buf = b""
        self._skip = 0  # bytes still to drop of a skipped message

    def feed_frames(self, chunk: bytes) -> None:
        data = self._buf + chunk if self._buf else chunk
        pos = 0
        if self._skip:
            dropped = min(self._skip, len(data))
            self._skip -= dropped
            pos = dropped
        while len(data) - pos >= PREFIX:
            compressed = data[pos] != 0
            length = _LENGTH.unpack_from(data, pos + 1)[0]
            if compressed or length > MAX_RESPONSE_MESSAGE_BYTES:
                available = len(data) - pos - PREFIX
                if available < length:
                    self._skip = length - available
                    pos = len(data)
                    break
                pos += PREFIX + length
                continue
            if len(data) - pos - PREFIX < length:
                break
            self.take(data[pos + PREFIX : pos + PREFIX + length])
            pos += PREFIX + length
        self._buf = data[pos:]

    def take(self, message: bytes) -> None:
        raise NotImplementedError
