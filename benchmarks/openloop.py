"""Open-loop (fixed-rate) and closed-loop HTTP/1.1 load generators for the overhead benchmark.

asyncio protocols over a pool of keep-alive connections to one ``host:port``; every request is a POST of a
pre-built body.  The open-loop generator schedules request ``i`` at ``start + i / rate`` whatever the
responses do: a request finding no idle connection opens a new one (up to ``max_connections``; beyond that
it waits for one and the wait shows up as lag).  Per request it records the intended send time, the time its
bytes were written, and the time its last response byte arrived, so that

* ``latency`` = completion - intended send (the open-loop convention: includes any delay of the generator);
* ``service`` = completion - write: what the system under test took;
* ``lag`` = write - intended send: the generator's own lateness (timer wake-up, CPU contention, or all
  ``max_connections`` busy, counted in ``queued``).  A p99 lag well above the system's p99 latency means the
  generator or the machine, not the system under test, limited the run.

The loop runs over select(2) (microsecond timeouts; epoll's are milliseconds), so the number of connections is
capped below 1024 file descriptors.

The generator is bounded: it sends ``rate x duration`` requests, then waits at most ``drain_s`` for
outstanding answers; anything unanswered then counts as failed.  Only 127.0.0.1 targets are meant.

    result = run_open_loop("127.0.0.1", 8080, "/v1/completions", bodies, rate=300)
"""

from __future__ import annotations

import asyncio
import contextlib
import selectors
import statistics
from collections import deque
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

__all__ = ["LoadResult", "percentile", "run_closed_loop", "run_open_loop"]


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation; NaN for no values."""
    if not values:
        return float("nan")
    s = sorted(values)
    if len(s) == 1:
        return s[0]
    pos = (len(s) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


@dataclass
class LoadResult:
    """One measurement: the per-request timings of the successful requests, in milliseconds."""

    target_rate: float | None  # None: closed loop
    sent: int = 0
    ok: int = 0
    failed: int = 0
    window_s: float = 0.0  # first send to last completion
    latency_ms: list[float] = field(default_factory=list)
    service_ms: list[float] = field(default_factory=list)  # completion - write
    lag_ms: list[float] = field(default_factory=list)  # write - intended (all sent requests)
    connections: int = 0
    queued: int = 0  # requests that waited for a connection (all max_connections busy)
    statuses: dict[str, int] = field(default_factory=dict)

    @property
    def achieved_rps(self) -> float:
        return self.ok / self.window_s if self.window_s > 0 else 0.0

    def merge(self, other: LoadResult) -> None:
        self.sent += other.sent
        self.ok += other.ok
        self.failed += other.failed
        self.window_s += other.window_s
        self.latency_ms += other.latency_ms
        self.service_ms += other.service_ms
        self.lag_ms += other.lag_ms
        self.connections = max(self.connections, other.connections)
        self.queued += other.queued
        for k, v in other.statuses.items():
            self.statuses[k] = self.statuses.get(k, 0) + v


class _Conn(asyncio.Protocol):
    """One keep-alive HTTP/1.1 client connection carrying one request at a time."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.on_done: Callable[[_Conn, int | None, float], None] | None = None
        self.closed = False
        self.reusable = True
        self._status = 0
        self._clen = -1  # content-length; -1 while reading the head; -2 for chunked
        self._head_done = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def send(self, data: bytes, on_done: Callable[[_Conn, int | None, float], None]) -> float:
        """Write a request; returns the write time."""
        assert self.transport is not None
        self.on_done = on_done
        self._head_done = False
        self.transport.write(data)
        return self.loop.time()

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while self.on_done is not None and self._parse():
            pass

    def _parse(self) -> bool:
        """True when a whole response was consumed."""
        if not self._head_done:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return False
            lines = bytes(self.buf[:end]).decode("latin-1").split("\r\n")
            del self.buf[: end + 4]
            self._status = int(lines[0].split(" ", 2)[1])
            self._clen = 0
            for line in lines[1:]:
                name, _, value = line.partition(":")
                name = name.strip().lower()
                value = value.strip().lower()
                if name == "content-length":
                    self._clen = int(value)
                elif name == "transfer-encoding" and "chunked" in value:
                    self._clen = -2
                elif name == "connection" and value == "close":
                    self.reusable = False
            self._head_done = True
        if self._clen == -2:
            pos = 0
            while True:
                nl = self.buf.find(b"\r\n", pos)
                if nl < 0:
                    return False
                size = int(bytes(self.buf[pos:nl]).split(b";", 1)[0], 16)
                if size == 0:
                    end = self.buf.find(b"\r\n\r\n", nl)  # optional trailers end with an empty line
                    if end < 0:
                        return False
                    del self.buf[: end + 4]
                    break
                if len(self.buf) < nl + 2 + size + 2:
                    return False
                pos = nl + 2 + size + 2
        else:
            if len(self.buf) < self._clen:
                return False
            del self.buf[: self._clen]
        self._finish(self._status)
        return True

    def _finish(self, status: int | None) -> None:
        cb, self.on_done = self.on_done, None
        if cb is not None:
            cb(self, status, self.loop.time())

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._finish(None)


class _Pool:
    def __init__(self, host: str, port: int, max_connections: int) -> None:
        self.loop = asyncio.get_running_loop()
        self.host = host
        self.port = port
        self.max = max_connections
        self.idle: list[_Conn] = []
        self.all: list[_Conn] = []
        self.opening = 0

    async def open(self) -> _Conn | None:
        self.opening += 1
        try:
            _, proto = await self.loop.create_connection(lambda: _Conn(self.loop), self.host, self.port)
        except OSError:
            return None
        finally:
            self.opening -= 1
        self.all.append(proto)
        return proto

    @property
    def size(self) -> int:
        return sum(1 for c in self.all if not c.closed) + self.opening

    async def prefill(self, n: int) -> None:
        conns = await asyncio.gather(*(self.open() for _ in range(min(n, self.max))))
        self.idle.extend(c for c in conns if c is not None)

    def close(self) -> None:
        for c in self.all:
            if c.transport is not None and not c.closed:
                c.transport.close()


def _request_bytes(host: str, port: int, path: str, body: bytes) -> bytes:
    head = (
        f"POST {path} HTTP/1.1\r\nhost: {host}:{port}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    )
    return head.encode("latin-1") + body


async def _open_loop(
    host: str,
    port: int,
    path: str,
    bodies: Sequence[bytes],
    rate: float,
    *,
    prefill: int,
    max_connections: int,
    drain_s: float,
) -> LoadResult:
    loop = asyncio.get_running_loop()
    pool = _Pool(host, port, max_connections)
    n = len(bodies)
    reqs = [_request_bytes(host, port, path, b) for b in bodies]
    intended = [0.0] * n
    written = [0.0] * n
    done = [0.0] * n
    status: list[int | None] = [None] * n
    waiting: deque[int] = deque()
    outstanding = 0
    all_done = loop.create_future()
    finished_sending = False
    queued = 0

    def send_on(conn: _Conn, i: int) -> None:
        written[i] = conn.send(reqs[i], lambda c, st, t: completed(c, i, st, t))

    def completed(conn: _Conn, i: int, st: int | None, t: float) -> None:
        nonlocal outstanding
        done[i] = t
        status[i] = st
        outstanding -= 1
        if not conn.closed and conn.reusable:
            if waiting:
                send_on(conn, waiting.popleft())
            else:
                pool.idle.append(conn)
        elif conn.transport is not None:
            conn.transport.close()
        if finished_sending and outstanding == 0 and not all_done.done():
            all_done.set_result(None)

    async def connect_and_send(i: int) -> None:
        nonlocal outstanding
        conn = await pool.open()
        if conn is None:
            status[i] = None
            done[i] = loop.time()
            written[i] = done[i]
            outstanding -= 1
            if finished_sending and outstanding == 0 and not all_done.done():
                all_done.set_result(None)
            return
        if waiting:  # earlier requests first
            waiting.append(i)
            i = waiting.popleft()
        send_on(conn, i)

    def dispatch(i: int) -> None:
        nonlocal outstanding, queued
        outstanding += 1
        while pool.idle and (pool.idle[-1].closed or not pool.idle[-1].reusable):
            pool.idle.pop()
        if pool.idle:
            send_on(pool.idle.pop(), i)
        elif pool.size < pool.max:
            tasks.add(t := asyncio.ensure_future(connect_and_send(i)))
            t.add_done_callback(tasks.discard)
        else:
            waiting.append(i)
            queued += 1

    tasks: set[asyncio.Future[None]] = set()
    await pool.prefill(prefill)
    interval = 1.0 / rate
    start = loop.time() + 0.01
    try:
        i = 0
        while i < n:
            now = loop.time()
            while i < n and start + i * interval <= now:
                intended[i] = start + i * interval
                dispatch(i)
                i += 1
            if i < n:
                # a long sleep wakes later than a short one: sleep to 1.5 ms before the send, then the rest
                delay = start + i * interval - loop.time()
                await asyncio.sleep(delay - 0.0015 if delay > 0.003 else max(0.0, delay))
        finished_sending = True
        if outstanding > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(all_done), drain_s)
    finally:
        pool.close()
        for t in list(tasks):
            t.cancel()
    res = LoadResult(target_rate=rate, sent=n, connections=len(pool.all), queued=queued)
    last = start
    for k in range(n):
        st = status[k]
        key = str(st) if st is not None else ("timeout" if done[k] == 0.0 else "conn-error")
        res.statuses[key] = res.statuses.get(key, 0) + 1
        if written[k]:
            res.lag_ms.append((written[k] - intended[k]) * 1000)
        if st == 200:
            res.ok += 1
            res.latency_ms.append((done[k] - intended[k]) * 1000)
            res.service_ms.append((done[k] - written[k]) * 1000)
            last = max(last, done[k])
        else:
            res.failed += 1
    res.window_s = max(last - start, n * interval)
    return res


def _resolver(fut: asyncio.Future[tuple[int | None, float]]) -> Callable[[_Conn, int | None, float], None]:
    def done(conn: _Conn, status: int | None, t: float) -> None:
        if not fut.done():
            fut.set_result((status, t))

    return done


async def _closed_loop(
    host: str, port: int, path: str, bodies: Sequence[bytes], connections: int, timeout_s: float
) -> LoadResult:
    loop = asyncio.get_running_loop()
    pool = _Pool(host, port, connections)
    await pool.prefill(connections)
    next_i = 0
    res = LoadResult(target_rate=None, sent=0, connections=len(pool.all))

    async def worker(conn: _Conn) -> None:
        nonlocal next_i
        while next_i < len(bodies) and not conn.closed:
            i = next_i
            next_i += 1
            fut: asyncio.Future[tuple[int | None, float]] = loop.create_future()
            t0 = conn.send(
                _request_bytes(host, port, path, bodies[i]),
                _resolver(fut),
            )
            res.sent += 1
            st, t1 = await fut
            res.statuses[str(st)] = res.statuses.get(str(st), 0) + 1
            if st == 200:
                res.ok += 1
                res.latency_ms.append((t1 - t0) * 1000)
                res.service_ms.append((t1 - t0) * 1000)
            else:
                res.failed += 1
            if not conn.reusable:
                break

    t_start = loop.time()
    try:
        await asyncio.wait_for(asyncio.gather(*(worker(c) for c in pool.idle)), timeout_s)
    except TimeoutError:
        pass
    finally:
        pool.close()
    res.window_s = loop.time() - t_start
    res.failed += len(bodies) - res.sent
    return res


T = TypeVar("T")


def _run(coro: Coroutine[Any, Any, T]) -> T:
    """Run on an event loop over select(2): its timeout has microsecond resolution, where epoll's is a
    millisecond (asyncio's default loop would wake up to 1 ms late for every scheduled send).  select(2) handles
    file descriptors below 1024 only, hence the cap on connections."""
    with asyncio.Runner(loop_factory=lambda: asyncio.SelectorEventLoop(selectors.SelectSelector())) as runner:
        return runner.run(coro)


def run_open_loop(
    host: str,
    port: int,
    path: str,
    bodies: Sequence[bytes],
    rate: float,
    *,
    prefill: int = 32,
    max_connections: int = 768,
    drain_s: float = 5.0,
) -> LoadResult:
    """Send ``len(bodies)`` requests at ``rate`` per second (open loop) and wait ``drain_s`` at most."""
    return asyncio.run(
        _open_loop(host, port, path, bodies, rate, prefill=prefill, max_connections=max_connections, drain_s=drain_s)
    )


def run_closed_loop(
    host: str, port: int, path: str, bodies: Sequence[bytes], connections: int, timeout_s: float = 600.0
) -> LoadResult:
    """Send ``len(bodies)`` requests over ``connections`` connections, each waiting for its answer (closed loop);
    latencies are measured from the write.  Stops after ``timeout_s``."""
    return _run(_closed_loop(host, port, path, bodies, connections, timeout_s))


def summary(values: Sequence[float]) -> str:
    """``p50/p99/max`` of a list of milliseconds, for progress lines."""
    if not values:
        return "-"
    return f"{statistics.median(values):.2f}/{percentile(values, 99):.2f}/{max(values):.2f}"
