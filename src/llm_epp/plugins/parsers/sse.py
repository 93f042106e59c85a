"""Server-Sent Events reading shared by the parsers' response readers.

`SseDataReader` reassembles `data:` lines across response body chunks and hands each complete line whose
bytes contain the reader's `marker` to `take` (the payload after `data:`, stripped). Lines without the
marker cost a substring search only, so token events of a long stream are not decoded. A line longer than
MAX_LINE_BYTES is dropped rather than held (usage events are small)."""

from __future__ import annotations

from llm_epp.framework.requestcontrol import Usage

_DATA = b"data:"
MAX_LINE_BYTES = 1 << 20


class SseDataReader:
    """Base of the SSE usage readers: subclasses set `marker` and implement `take`."""

    __slots__ = ("_partial", "_usage")
    marker = b""

    def __init__(self) -> None:
        self._partial = b""
        self._usage: Usage | None = None

    @property
    def usage(self) -> Usage | None:
        return self._usage

    def feed(self, chunk: bytes, end_of_stream: bool = False) -> None:
        data = self._partial + chunk if self._partial else chunk
        last_nl = data.rfind(b"\n")
        marker = self.marker
        if last_nl < 0:
            self._partial = data if len(data) <= MAX_LINE_BYTES else b""
        else:
            self._partial = data[last_nl + 1 :] if len(data) - last_nl <= MAX_LINE_BYTES else b""
            complete = data[: last_nl + 1]
            if marker in complete:
                for line in complete.split(b"\n"):
                    if marker in line and line.startswith(_DATA):
                        self.take(line[len(_DATA) :].strip())
        if end_of_stream:
            if self._partial.startswith(_DATA) and marker in self._partial:
                self.take(self._partial[len(_DATA) :].strip())
            self._partial = b""

    def take(self, payload: bytes) -> None:
        """One complete `data:` payload containing the marker."""
        raise NotImplementedError


def non_negative_int(value: object) -> int:
    """A JSON token count: a non-negative integer, else 0."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0
