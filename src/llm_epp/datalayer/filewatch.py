"""A configuration file that is reloaded when it changes: a broken edit is logged and the last good
content kept, so an operator's typo never empties the pool."""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


class WatchedFile(Generic[T]):
    """Subclasses say how to parse the text (`parse`, raising ValueError with a clear message) and what to
    do with the result (`apply`). `kind` names the file in log lines (`endpoints_file_reloaded`)."""

    kind = "file"
    error: type[ValueError] = ValueError  # raised (by parse, and here) for an unreadable or invalid file

    def __init__(self, path: str | Path, interval: float = 1.0) -> None:
        self.path = Path(path)
        self.interval = interval
        self._stamp: tuple[float, int] | None = None

    def parse(self, text: str, source: str) -> T:
        raise NotImplementedError

    def apply(self, value: T, initial: bool) -> str:
        """Uses the parsed content; returns a short summary for the reload log line."""
        raise NotImplementedError

    def load(self) -> None:
        """Initial load: errors propagate (a bad file at startup is fatal)."""
        self._stamp = self._stat()
        self.apply(self._read(), initial=True)

    def poll_once(self) -> bool:
        """Reload if the file changed (modification time or size); True when new content was applied."""
        stamp = self._stat()
        if stamp == self._stamp:
            return False
        self._stamp = stamp
        if stamp is None:
            log.error("%s_missing path=%s; keeping the last good content", self.kind, self.path)
            return False
        try:
            value = self._read()
        except ValueError as e:
            log.error("%s_invalid %s; keeping the last good content", self.kind, e)
            return False
        summary = self.apply(value, initial=False)
        log.info("%s_reloaded path=%s %s", self.kind, self.path, summary)
        return True

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            self.poll_once()

    def _stat(self) -> tuple[float, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_mtime, st.st_size)

    def _read(self) -> T:
        try:
            text = self.path.read_text()
        except OSError as e:
            raise self.error(f"{self.path}: cannot read: {e.strerror}") from None
        return self.parse(text, str(self.path))
