"""`--enable-pprof`: profiles of the running EPP under `/debug/pprof/` on the metrics port (docs/profiling.md).

The reference serves Go's pprof handlers there; these are their Python counterparts, with no extra
dependency and no cost until asked for:

- `profile?seconds=N` (default 30, at most 300): a sampled profile. A background thread takes the Python
  stack of every thread 100 times a second for N seconds; the answer is the stacks in the "folded" text
  format (`thread;outer;...;inner count` per line), which flamegraph.pl, speedscope and inferno read.
  Samples are wall-clock: an idle event loop shows as time in its poll.
- `heap?seconds=N` (default 10, at most 300): the memory allocated during the next N seconds and still
  held at their end, by allocation site (tracemalloc, 25 frames), largest first. When the process runs with
  `PYTHONTRACEMALLOC` set, the snapshot covers everything allocated since start instead and returns at once.
- `goroutine`: the current stack of every thread (the name kept from Go, so the usual URL works).
- `cmdline`: the command line, arguments separated by NUL bytes, as Go's.

One profile runs at a time; a second request meanwhile gets 409. Access is guarded as `/metrics` is
(`--metrics-endpoint-auth`), each path checked as its own non-resource URL."""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback
import tracemalloc
from collections import Counter
from dataclasses import dataclass
from types import FrameType
from urllib.parse import parse_qs

SAMPLE_INTERVAL = 0.01
MAX_SECONDS = 300
TRACE_FRAMES = 25
TOP_ALLOCATIONS = 100

INDEX = b"""/debug/pprof/
profile?seconds=N   sampled stacks of all threads for N seconds (folded text; default 30)
heap?seconds=N      memory allocated in the next N seconds and still held, by site (default 10)
goroutine           current stack of every thread
cmdline             the command line, NUL separated
"""


@dataclass(frozen=True)
class Answer:
    status: int
    content_type: str
    body: bytes


def _text(status: int, body: str) -> Answer:
    return Answer(status, "text/plain; charset=utf-8", body.encode())


_busy = threading.Lock()


def handle(path: str, query: str) -> Answer | None:
    """The answer for a `/debug/pprof/...` path, None for any other path. Blocks for the profile's length."""
    if not path.startswith("/debug/pprof"):
        return None
    name = path[len("/debug/pprof") :].strip("/")
    if name == "":
        return Answer(200, "text/plain; charset=utf-8", INDEX)
    if name == "cmdline":
        return Answer(200, "text/plain; charset=utf-8", "\x00".join(sys.argv).encode())
    if name == "goroutine":
        return _text(200, thread_stacks())
    if name not in ("profile", "heap"):
        return _text(404, f"unknown profile {name!r}; see /debug/pprof/\n")
    raw = parse_qs(query).get("seconds", ["30" if name == "profile" else "10"])[-1]
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if not 0 < seconds <= MAX_SECONDS:
        return _text(400, f"seconds must be a number in (0, {MAX_SECONDS}], got {raw!r}\n")
    if not _busy.acquire(blocking=False):
        return _text(409, "another profile is being taken; try again when it is done\n")
    try:
        if name == "profile":
            return _text(200, sample_stacks(seconds))
        return _text(200, heap_growth(seconds))
    finally:
        _busy.release()


def _frame_label(frame: FrameType) -> str:
    code = frame.f_code
    parts = code.co_filename.replace("\\", "/").rsplit("/", 2)
    return f"{code.co_qualname} ({'/'.join(parts[-2:])}:{code.co_firstlineno})"


def sample_stacks(seconds: float, interval: float = SAMPLE_INTERVAL) -> str:
    """Folded stacks of every other thread, sampled every `interval` for `seconds`."""
    names = {t.ident: t.name for t in threading.enumerate()}
    me = threading.get_ident()
    counts: Counter[str] = Counter()
    deadline = time.monotonic() + seconds
    while True:
        for ident, frame in sys._current_frames().items():
            if ident == me:
                continue
            stack: list[str] = []
            f: FrameType | None = frame
            while f is not None:
                stack.append(_frame_label(f))
                f = f.f_back
            thread = names.get(ident) or f"thread-{ident}"
            counts[";".join([thread.replace(";", ","), *reversed(stack)])] += 1
        now = time.monotonic()
        if now >= deadline:
            break
        time.sleep(min(interval, deadline - now))
    return "".join(f"{stack} {n}\n" for stack, n in counts.most_common())


def heap_growth(seconds: float) -> str:
    """Allocation sites of the memory allocated in the next `seconds` and still held then (all memory traced
    so far, at once, when tracemalloc was already on)."""
    started_here = not tracemalloc.is_tracing()
    if started_here:
        tracemalloc.start(TRACE_FRAMES)
        try:
            time.sleep(seconds)
            snapshot = tracemalloc.take_snapshot()
        finally:
            tracemalloc.stop()
        scope = f"allocated during the last {seconds:g}s and still held"
    else:
        snapshot = tracemalloc.take_snapshot()
        scope = "allocated since tracing started (PYTHONTRACEMALLOC) and still held"
    snapshot = snapshot.filter_traces((tracemalloc.Filter(False, tracemalloc.__file__),))
    stats = snapshot.statistics("traceback")
    total = sum(s.size for s in stats)
    lines = [f"# heap: {total} bytes in {sum(s.count for s in stats)} blocks {scope}; pid {os.getpid()}"]
    for stat in stats[:TOP_ALLOCATIONS]:
        lines.append(f"\n{stat.size} bytes in {stat.count} blocks")
        lines.extend(f"    {frame.filename}:{frame.lineno}" for frame in reversed(stat.traceback))
    return "\n".join(lines) + "\n"


def thread_stacks() -> str:
    names = {t.ident: t.name for t in threading.enumerate()}
    out = []
    for ident, frame in sys._current_frames().items():
        out.append(f"thread {names.get(ident) or ident}:\n" + "".join(traceback.format_stack(frame)))
    return "\n".join(out)
