"""Request bytes a process holds for its ext_proc streams, counted against `--max-held-request-bytes`.

Two counts of this kind, each against that limit: the servicer's, for the request bodies it keeps until
they are complete, and the asyncio transport's (`llm_epp.extproc.http2`), for the data that has arrived and
is not read yet and the messages being gathered. Whatever clients send, however many streams and
connections they open, each stays under the limit; a request that would pass either is answered 503 with
Retry-After.
"""

from __future__ import annotations

DEFAULT_MAX_HELD_BYTES = 256 << 20  # --max-held-request-bytes


class HeldBytesExceeded(Exception):
    """A holder could not take the bytes it needed: the stream's request is refused (the message says why)."""


class HeldBytes:
    __slots__ = ("limit", "used")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def take(self, n: int) -> bool:
        """Counts `n` more bytes held; False (and nothing counted) when they would pass the limit."""
        if self.used + n > self.limit:
            return False
        self.used += n
        return True

    def give(self, n: int) -> None:
        self.used -= n
