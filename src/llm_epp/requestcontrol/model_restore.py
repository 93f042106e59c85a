"""Putting the client's model name back into a response whose request was sent under another name.

The model server answers with the name it was asked for (`"model":"target"`); the client must see the name
it sent. Responses arrive in chunks, and a `"model"` field can be split anywhere across two of them, so the
restorer holds back only the tail of a chunk that could still grow into a match and releases it with the
next chunk (or at the end of the stream)."""

from __future__ import annotations

import orjson


class ModelNameRestorer:
    """Streams bytes through, replacing `"model":"<target>"` and `"model": "<target>"` with the incoming
    name. Call `feed` for every chunk in order and `flush` at the end of the stream."""

    __slots__ = ("_held", "_longest", "_patterns")

    def __init__(self, target: str, incoming: str) -> None:
        t, i = orjson.dumps(target), orjson.dumps(incoming)  # JSON string literals, quotes included
        self._patterns = tuple((prefix + t, prefix + i) for prefix in (b'"model":', b'"model": '))
        self._longest = max(len(p) for p, _ in self._patterns)
        self._held = b""

    def feed(self, chunk: bytes) -> bytes:
        data = self._held + chunk if self._held else chunk
        out: list[bytes] = []
        pos = 0
        patterns = self._patterns
        while True:
            best = -1
            best_pattern = patterns[0]
            for pattern in patterns:
                at = data.find(pattern[0], pos)
                if at >= 0 and (best < 0 or at < best):
                    best, best_pattern = at, pattern
            if best < 0:
                break
            out.append(data[pos:best])
            out.append(best_pattern[1])
            pos = best + len(best_pattern[0])
        keep = self._partial_tail(data, pos)
        end = len(data) - keep
        out.append(data[pos:end])
        self._held = data[end:]
        return b"".join(out) if len(out) > 1 else out[0]

    def flush(self) -> bytes:
        held, self._held = self._held, b""
        return held

    def _partial_tail(self, data: bytes, start: int) -> int:
        """Length of the longest suffix of data[start:] that is a proper prefix of a pattern."""
        lo = max(start, len(data) - self._longest + 1)
        at = data.find(b'"', lo)
        while at >= 0:
            tail = data[at:]
            for pattern, _ in self._patterns:
                if pattern.startswith(tail):
                    return len(data) - at
            at = data.find(b'"', at + 1)
        return 0
