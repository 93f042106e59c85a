"""Frames between a front process and the serving process: a 4-byte big-endian length, then a pickled
tuple whose first item names the message. Both ends are processes of this EPP started together; the
socket lives in a directory only the EPP's user can enter, and a connection must present the per-run token
before anything is unpickled.

Writes are batched: frames queued during one event-loop iteration go out in one `write` call; messages
nobody waits for ride along with the next one, or leave within `LATER_S`."""

from __future__ import annotations

import asyncio
import logging
import pickle
import struct
from collections.abc import Callable
from typing import Any, cast

log = logging.getLogger(__name__)

_LEN = struct.Struct(">I")
MAX_FRAME = 1 << 30  # a request body can be large (--max-request-body-bytes); nothing legitimate is bigger
TOKEN_BYTES = 32
LATER_S = 0.002  # longest delay of a message nobody waits for (in-flight load is released this much later)


def encode(message: tuple[Any, ...]) -> bytes:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return _LEN.pack(len(data)) + data


class FrameConnection(asyncio.Protocol):
    """A stream of frames in both directions. `on_message` gets every decoded tuple; `on_lost` runs once
    when the connection ends. Until `token` (when given) has arrived as the first bytes, nothing is
    decoded; a wrong token closes the connection."""

    def __init__(
        self,
        on_message: Callable[[tuple[Any, ...]], None],
        on_lost: Callable[[], None],
        token: bytes | None = None,
    ) -> None:
        self._on_message = on_message
        self._on_lost = on_lost
        self._token = token
        self._buf = bytearray()
        self._out: list[bytes] = []
        self._flush_scheduled = False
        self._later: asyncio.TimerHandle | None = None
        self.transport: asyncio.Transport | None = None
        self.closed = False

    # --- asyncio.Protocol ---------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports are not its subclasses

    def data_received(self, data: bytes) -> None:
        buf = self._buf
        buf += data
        if self._token is not None:
            if len(buf) < len(self._token):
                return
            if bytes(buf[: len(self._token)]) != self._token:
                log.error("worker_connection_refused: wrong token")
                self.close()
                return
            del buf[: len(self._token)]
            self._token = None
        start = 0
        size = len(buf)
        while size - start >= 4:
            (n,) = _LEN.unpack_from(buf, start)
            if n > MAX_FRAME:
                log.error("worker_connection_refused: frame of %d bytes", n)
                self.close()
                return
            if size - start - 4 < n:
                break
            message = pickle.loads(buf[start + 4 : start + 4 + n])
            start += 4 + n
            try:
                self._on_message(message)
            except Exception:
                log.exception("worker_message_failed kind=%r", message[0] if message else None)
        if start:
            del buf[:start]

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed:
            self.closed = True
            self._on_lost()

    # --- sending ------------------------------------------------------------------------------------
    def send(self, message: tuple[Any, ...]) -> None:
        """Queues a message that someone waits for: it leaves at the end of this event-loop turn."""
        if self.closed:
            return
        self._out.append(encode(message))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def send_later(self, message: tuple[Any, ...]) -> None:
        """Queues a message nobody waits for (a request's end, its response status): it leaves with the next
        urgent message or within LATER_S, so the other process is not woken for it alone."""
        if self.closed:
            return
        self._out.append(encode(message))
        if not self._flush_scheduled and self._later is None:
            self._later = asyncio.get_running_loop().call_later(LATER_S, self.flush)

    def send_raw(self, data: bytes) -> None:
        if self.transport is not None:
            self.transport.write(data)

    def flush(self) -> None:
        self._flush_scheduled = False
        if self._later is not None:
            self._later.cancel()
            self._later = None
        out, self._out = self._out, []
        if out and self.transport is not None and not self.closed:
            self.transport.write(b"".join(out))

    def close(self) -> None:
        self.flush()
        if self.transport is not None:
            self.transport.close()
