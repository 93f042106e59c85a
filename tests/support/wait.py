"""Waiting for an eventual state in end-to-end tests (bounded; not a timing assertion)."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(cond: Callable[[], object], what: str, timeout: float = 30.0, interval: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out after {timeout:g}s waiting for {what}"
        time.sleep(interval)
