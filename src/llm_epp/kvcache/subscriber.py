"""KV-event subscribers: one ZMQ SUB socket per model-server endpoint, all served by one background thread
that keeps the block index current, off the request path.

Per endpoint (llm-d's pod-discovery convention) the thread connects to `tcp://<ip>:<socketPort + rank>`
and subscribes to `topicFilter` (default `kv@`; vLLM's topic is `kv@<ip:port>@<model>`). Each message is
[topic, 8-byte big-endian sequence, msgpack batch]. The thread tracks the sequence per endpoint:

- a gap (seq > last + 1) is filled from the engine's replay socket when `replaySocketPort` is set
  (ROUTER; request [empty, start_seq]; answers [empty, seq, batch] ... then the all-0xFF end marker), else
  counted;
- a sequence going back (seq < last), or the same number on a different batch, means the engine
  restarted: the endpoint's blocks are dropped before the new batch is applied. A restarted engine whose
  first batches were lost (published before the subscriber reconnected) shows up as a gap instead; the
  replay then starts at `last` itself, and a batch there that differs from the one applied reveals the
  restart (the endpoint is dropped and the new publisher's buffer replayed from 0);
- the first message from an endpoint with seq > 0 asks for a replay from 0, so a new EPP replica catches
  up with what the engine still buffers.

Decoded batches are applied by `concurrency` worker threads (llm-d's `kvEventsConfig.concurrency`), each
endpoint always on the same worker, so one endpoint's events apply in order while endpoints proceed in
parallel; a restart's clear goes through the endpoint's worker too, before the batches after it.

Malformed frames and batches are counted (`DecodeStats`) and skipped; nothing a publisher sends stops the
thread. Endpoints that leave the pool are unsubscribed and dropped from the index. With `zmqEndpoint` set
the thread instead binds one SUB socket there and every engine connects to it; the endpoint then comes
from the topic."""

from __future__ import annotations

import logging
import queue
import threading
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from time import monotonic as _monotonic

import xxhash
import zmq

from llm_epp.framework.types import Endpoint, join_host_port
from llm_epp.kvcache.events import (
    END_OF_REPLAY,
    SEQ,
    DecodeStats,
    EventBatch,
    decode_batch,
    decode_seq,
    parse_topic,
)
from llm_epp.kvcache.index import KVBlockIndex

log = logging.getLogger(__name__)

DEFAULT_SOCKET_PORT = 5557
DEFAULT_TOPIC_FILTER = "kv@"
_POLL_MS = 100
_MAX_DRAIN = 256  # messages taken from one socket before the others get a turn
_REPORT_INTERVAL_S = 60.0  # at most one warning a minute about malformed input


@dataclass(frozen=True, slots=True)
class PodSource:
    """Where one endpoint publishes: `pod_id` is its `ip:port` (how the index names endpoints)."""

    pod_id: str
    endpoint: str
    replay_endpoint: str = ""


def rank_of(endpoint: Endpoint) -> int:
    """The data-parallel rank encoded in an endpoint name (`<pod>-rank-<n>`), else 0."""
    name = endpoint.key.name
    head, sep, tail = name.rpartition("-rank-")
    return int(tail) if sep and head and tail.isdigit() else 0


def sources_for(endpoints: Iterable[Endpoint], socket_port: int, replay_port: int = 0) -> list[PodSource]:
    out: list[PodSource] = []
    for ep in endpoints:
        address = ep.metadata.address
        if not address:
            continue
        rank = rank_of(ep)
        replay = f"tcp://{join_host_port(address, replay_port + rank)}" if replay_port > 0 else ""
        out.append(PodSource(ep.hostport, f"tcp://{join_host_port(address, socket_port + rank)}", replay))
    return out


@dataclass(slots=True)
class SubscriberStats:
    messages_by_pod: dict[str, int] = field(default_factory=dict)  # endpoints followed now (bounded)
    messages: int = 0
    gaps: int = 0
    replayed: int = 0
    replay_failures: int = 0
    restarts: int = 0
    duplicates: int = 0
    decode: DecodeStats = field(default_factory=DecodeStats)


DEFAULT_CONCURRENCY = 4  # llm-d's kvEventsConfig.concurrency default
_MAX_CENTRAL_PODS = 4096
_MAX_REPLAY = 100_000  # batches taken from one replay answer (vLLM buffers 10,000 by default)


class ApplyPool:
    """`workers` threads applying batches to the index; an endpoint is always served by the same worker
    (its shard), so its events keep their order."""

    def __init__(self, index: KVBlockIndex, workers: int) -> None:
        if workers < 1:
            raise ValueError(f"concurrency must be at least 1, got {workers}")
        self.index = index
        self.workers = workers
        self._queues: list[queue.SimpleQueue[tuple[str, str, EventBatch | None] | None]] = []
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        if self._threads:
            return
        self._queues = [queue.SimpleQueue() for _ in range(self.workers)]
        for i, q in enumerate(self._queues):
            t = threading.Thread(target=self._work, args=(q,), name=f"kv-events-apply-{i}", daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self, timeout: float = 5.0) -> None:
        for q in self._queues:
            q.put(None)
        for t in self._threads:
            t.join(timeout)
        self._threads = []
        self._queues = []

    def depth(self) -> int:
        """Batches waiting to be applied, over all workers."""
        return sum(q.qsize() for q in self._queues)

    def apply(self, pod: str, model: str, batch: EventBatch) -> None:
        self._shard(pod).put((pod, model, batch))

    def clear(self, pod: str) -> None:
        """Drops the endpoint's blocks once the batches queued before this call are applied."""
        self._shard(pod).put((pod, "", None))

    def _shard(self, pod: str) -> queue.SimpleQueue[tuple[str, str, EventBatch | None] | None]:
        if not self._queues:
            self.start()
        return self._queues[zlib.crc32(pod.encode()) % self.workers]

    def _work(self, q: queue.SimpleQueue[tuple[str, str, EventBatch | None] | None]) -> None:
        index = self.index
        while (item := q.get()) is not None:
            pod, model, batch = item
            try:
                if batch is None:
                    index.clear_pod(pod)
                else:
                    index.apply(pod, model, batch)
            except Exception:  # a worker must never die
                log.exception("kv_events_apply_failed pod=%s", pod)


@dataclass(slots=True)
class _Sub:
    source: PodSource
    socket: zmq.Socket[bytes]
    last_seq: int | None = None
    last_digest: int = 0  # of the last batch applied: tells a restarted publisher's batch under the same number


class KVEventsRunner:
    """Owns the subscriber thread for one index. `start()` / `stop()` from the event loop or anywhere;
    `set_sources` and `start(sources_fn=...)` tell it which endpoints to follow."""

    def __init__(
        self,
        index: KVBlockIndex,
        *,
        topic_filter: str = DEFAULT_TOPIC_FILTER,
        bind_endpoint: str = "",
        replay_timeout: float = 2.0,
        refresh_interval: float = 1.0,
        concurrency: int = 1,
    ) -> None:
        self.index = index
        self.pool = ApplyPool(index, concurrency)
        self.topic_filter = topic_filter
        self.bind_endpoint = bind_endpoint
        self.replay_timeout = replay_timeout
        self.refresh_interval = refresh_interval
        self.stats = SubscriberStats()
        self._lock = threading.Lock()
        self._wanted: dict[str, PodSource] | None = None
        self._sources_fn: Callable[[], Iterable[PodSource]] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._ctx: zmq.Context[zmq.Socket[bytes]] | None = None
        self._subs: dict[str, _Sub] = {}  # owned by the thread
        self._subscribed: tuple[str, ...] = ()  # what the thread last set up, for other threads to read
        self.bound_endpoint = ""  # with bind_endpoint: the address actually bound (resolves a `*` port)

    # --- control (any thread) --------------------------------------------------------------------------
    def set_sources(self, sources: Iterable[PodSource]) -> None:
        with self._lock:
            self._wanted = {s.pod_id: s for s in sources}

    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self, sources_fn: Callable[[], Iterable[PodSource]] | None = None) -> None:
        """Starts the thread (idempotent). With `sources_fn` the thread re-reads the endpoint set every
        `refresh_interval` seconds; it runs on the subscriber thread, so it must be safe to call there."""
        if sources_fn is not None:
            self._sources_fn = sources_fn
        if self.running():
            return
        self._stop.clear()
        self.pool.start()
        self._ctx = zmq.Context()
        self._thread = threading.Thread(target=self._run, name="kv-events", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
        self._thread = None
        self.pool.stop(timeout)
        if self._ctx is not None:
            self._ctx.destroy(linger=0)
            self._ctx = None

    def subscribed(self) -> list[str]:
        """Endpoints with a live subscription (as of the thread's last reconcile)."""
        return sorted(self._subscribed)

    # --- the thread ------------------------------------------------------------------------------------

    def _run(self) -> None:
        assert self._ctx is not None
        ctx = self._ctx
        self._subs = {}
        poller = zmq.Poller()
        central: _Sub | None = None
        central_seqs: dict[str, tuple[int | None, int]] = {}
        if self.bind_endpoint:
            sock = ctx.socket(zmq.SUB)
            sock.setsockopt(zmq.LINGER, 0)
            sock.bind(self.bind_endpoint)
            self.bound_endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
            sock.setsockopt(zmq.SUBSCRIBE, self.topic_filter.encode())
            central = _Sub(PodSource("", self.bind_endpoint), sock)
            poller.register(sock, zmq.POLLIN)
        next_refresh = 0.0
        next_report = _monotonic() + _REPORT_INTERVAL_S
        reported = 0
        clock = _monotonic
        while not self._stop.is_set():
            try:
                now = clock()
                if now >= next_report:
                    next_report = now + _REPORT_INTERVAL_S
                    reported = self._report(reported)
                if self._sources_fn is not None and now >= next_refresh:
                    next_refresh = now + self.refresh_interval
                    self.set_sources(self._sources_fn())
                self._reconcile(ctx, poller)
                ready = dict(poller.poll(_POLL_MS))
                for sub in list(self._subs.values()):
                    if sub.socket in ready:
                        self._drain(ctx, sub, None)
                if central is not None and central.socket in ready:
                    self._drain(ctx, central, central_seqs)
            except zmq.ZMQError as e:
                if self._stop.is_set():
                    break
                log.warning("kv_events_socket_error error=%s", e)
                self._stop.wait(0.1)
            except Exception:  # the subscriber thread must never die; count and go on
                log.exception("kv_events_unexpected_error")
                self._stop.wait(0.1)
        for sub in self._subs.values():
            sub.socket.close(0)
        if central is not None:
            central.socket.close(0)
        self._subs = {}
        self._subscribed = ()

    def _report(self, reported: int) -> int:
        """Logs a warning when malformed messages or events arrived since the last report."""
        d = self.stats.decode
        bad = d.malformed_messages + d.malformed_events + d.unknown_events
        if bad > reported:
            log.warning(
                "kv_events_malformed new=%d messages=%d events=%d unknown=%d last_error=%r",
                bad - reported,
                d.malformed_messages,
                d.malformed_events,
                d.unknown_events,
                d.last_error,
            )
        return bad

    def _reconcile(self, ctx: zmq.Context[zmq.Socket[bytes]], poller: zmq.Poller) -> None:
        with self._lock:
            wanted, self._wanted = self._wanted, None
        if wanted is None:
            return
        for pod_id, sub in list(self._subs.items()):
            if wanted.get(pod_id) != sub.source:
                poller.unregister(sub.socket)
                sub.socket.close(0)
                del self._subs[pod_id]
                if pod_id not in wanted:
                    self.pool.clear(pod_id)
                    self.stats.messages_by_pod.pop(pod_id, None)
                    log.info("kv_events_unsubscribed pod=%s", pod_id)
        for pod_id, source in wanted.items():
            if pod_id in self._subs:
                continue
            sock = ctx.socket(zmq.SUB)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SUBSCRIBE, self.topic_filter.encode())
            sock.connect(source.endpoint)
            self._subs[pod_id] = _Sub(source, sock)
            poller.register(sock, zmq.POLLIN)
            log.info("kv_events_subscribed pod=%s endpoint=%s", pod_id, source.endpoint)
        self._subscribed = tuple(self._subs)
        self.index.retain_pods(set(wanted))

    def _drain(
        self, ctx: zmq.Context[zmq.Socket[bytes]], sub: _Sub, central: dict[str, tuple[int | None, int]] | None
    ) -> None:
        for _ in range(_MAX_DRAIN):
            try:
                frames = sub.socket.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            self._handle(ctx, sub, frames, central)

    def _handle(
        self,
        ctx: zmq.Context[zmq.Socket[bytes]],
        sub: _Sub,
        frames: Sequence[bytes],
        central: dict[str, tuple[int | None, int]] | None,
    ) -> None:
        stats = self.stats
        stats.messages += 1
        if len(frames) != 3:
            stats.decode.count("message", f"frames: expected 3, got {len(frames)}")
            return
        seq = decode_seq(frames[1])
        if seq is None:
            stats.decode.count("message", "sequence: frame shorter than 8 bytes")
            return
        try:
            topic = frames[0].decode()
        except UnicodeDecodeError:
            stats.decode.count("message", "topic: not UTF-8")
            return
        topic_pod, model = parse_topic(topic)
        digest = xxhash.xxh3_64_intdigest(frames[2])
        if central is not None:
            pod = topic_pod
            last, last_digest = central.get(pod, (None, 0))
        else:
            pod = sub.source.pod_id
            last, last_digest = sub.last_seq, sub.last_digest
        by_pod = stats.messages_by_pod
        if pod in by_pod or len(by_pod) < _MAX_CENTRAL_PODS:
            by_pod[pod] = by_pod.get(pod, 0) + 1
        if last is not None and seq <= last:
            if seq == last and digest == last_digest:
                stats.duplicates += 1
                return
            self._restarted(pod, seq, last)
            last = None
        if central is None and sub.source.replay_endpoint and seq > (last + 1 if last is not None else 0):
            stats.gaps += 1
            self._replay(ctx, sub, pod, model, last, last_digest, seq)
        elif last is not None and seq > last + 1:
            stats.gaps += 1
        batch = decode_batch(frames[2], stats.decode)
        if batch is not None:
            self.pool.apply(pod, model, batch)
        if central is not None:
            if pod in central or len(central) < _MAX_CENTRAL_PODS:
                central[pod] = (seq, digest)
        else:
            sub.last_seq, sub.last_digest = seq, digest

    def _restarted(self, pod: str, seq: int, last: int) -> None:
        self.stats.restarts += 1
        self.pool.clear(pod)
        log.info("kv_events_publisher_restarted pod=%s seq=%d last=%d", pod, seq, last)

    def _replay(
        self,
        ctx: zmq.Context[zmq.Socket[bytes]],
        sub: _Sub,
        pod: str,
        model: str,
        last: int | None,
        last_digest: int,
        stop: int,
    ) -> None:
        """Applies the batches after `last` and before `stop` the engine still buffers. The replay starts
        at `last` itself: if the engine's batch under that number is not the one applied, the publisher
        restarted (its first batches were lost before this subscriber reconnected), so the endpoint's
        blocks are dropped and everything the new publisher buffers is applied instead."""
        endpoint = sub.source.replay_endpoint
        got = self._fetch(ctx, endpoint, pod, last if last is not None else 0)
        if got is None:
            return
        first = last + 1 if last is not None else 0
        if last is not None and got and got[0][0] == last and xxhash.xxh3_64_intdigest(got[0][1]) != last_digest:
            self._restarted(pod, stop, last)
            got = self._fetch(ctx, endpoint, pod, 0)
            if got is None:
                return
            first = 0
        for seq, payload in got:
            if first <= seq < stop:
                batch = decode_batch(payload, self.stats.decode)
                if batch is not None:
                    self.pool.apply(pod, model, batch)
                    self.stats.replayed += 1

    def _fetch(
        self, ctx: zmq.Context[zmq.Socket[bytes]], endpoint: str, pod: str, start: int
    ) -> list[tuple[int, bytes]] | None:
        """The (sequence, batch) pairs the engine buffers from `start` on, in order; None on a timeout."""
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        out: list[tuple[int, bytes]] = []
        try:
            sock.connect(endpoint)
            sock.send_multipart([b"", SEQ.pack(start)])
            deadline = _monotonic() + self.replay_timeout
            while True:
                remaining = deadline - _monotonic()
                if remaining <= 0 or not sock.poll(int(remaining * 1000)):
                    self.stats.replay_failures += 1
                    log.warning("kv_events_replay_timeout pod=%s endpoint=%s start=%d", pod, endpoint, start)
                    return None
                frames = sock.recv_multipart()
                if len(frames) != 3:
                    self.stats.decode.count("message", f"replay frames: expected 3, got {len(frames)}")
                    continue
                seq = decode_seq(frames[1])
                if seq is None:
                    self.stats.decode.count("message", "replay sequence: frame shorter than 8 bytes")
                    continue
                if seq == END_OF_REPLAY:
                    return out
                if seq >= start and len(out) < _MAX_REPLAY:
                    out.append((seq, frames[2]))
        finally:
            sock.close(0)
