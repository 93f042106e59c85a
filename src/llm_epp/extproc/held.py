"""Request bytes one process holds for its ext_proc streams, against `--max-held-request-bytes`.

Two holders draw on one count: the servicer, for the request bodies it keeps until they are complete, and
the asyncio transport (`llm_epp.extproc.http2`), for a message that spans several frames while it is
gathered. Whatever clients send, however many streams and connections they open, what is held this way
stays under the limit; a request that would pass it is answered 503 with Retry-After.
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

    def take(self, n: int, slack: int = 0) -> bool:
        """Counts `n` more bytes held; False (and nothing counted) when they would pass the limit by more than
        `slack`."""
        if self.used + n > self.limit + slack:
            return False
        self.used += n
        return True

    def give(self, n: int) -> None:
        self.used -= n
