"""KV-cache events from simulated vLLM and SGLang pods, as the engines publish them with
``--kv-events-config``.

:class:`KVEventRecorder` listens to an :class:`~llm_epp.sim.engine.Engine`'s prefix cache and turns what
happens there into vLLM's events:

* ``BlockStored`` when blocks of a request become full (one event per request and step, as vLLM's block
  pool emits it): the new blocks' hashes, the hash of the block before them (nil for block 0), their
  token ids, the block size, the LoRA id, medium ``"GPU"`` and the LoRA name;
* ``BlockRemoved`` (one hash, medium ``"GPU"``) when a cached block is evicted;
* ``AllBlocksCleared`` when the prefix cache is reset.

Hashes are vLLM's own (:mod:`llm_epp.kvcache.vllm_hashing`: ``--prefix-caching-hash-algo``, the
``PYTHONHASHSEED`` root, the LoRA name as extra key), sent as the low 64 bits (an unsigned int, vLLM's
``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1`` default) or as the raw digest bytes. Generated tokens have ids
too (:func:`~llm_epp.sim.engine.generated_token_id`), so blocks holding output are published like any.

With ``engine="sglang"`` a pod publishes what SGLang's radix cache does instead: page hashes of
:mod:`llm_epp.kvcache.sglang_hashing` (SHA-256 chain, no seed) as signed 64-bit ints, each event a
positional array (``["BlockStored", hashes, parent, token_ids, page_size, nil, "GPU"]``,
``["BlockRemoved", hashes, "GPU"]``, ``["AllBlocksCleared"]``; consecutive removals are merged into one
event, as SGLang's event queue merges them), the batch ``[ts, events, attn_dp_rank]``. Blocks of LoRA
requests are published without LoRA information (``lora_id`` nil), as SGLang's radix cache does when the
adapter has no namespace of its own. Topic, sequence numbers and the replay socket are the same as vLLM's.

:func:`encode_batch` packs a step's events as ``[ts, [event, ...], data_parallel_rank]`` with msgpack:
``encoding="array"`` puts each event's fields in order after its tag (vLLM's tagged array structs; fields
at the end equal to their default left out), ``"map"`` gives each event as a map with its tag under
``"type"`` and the batch as a map.

Two ways out:

* :class:`ZmqKVEventPublisher`, for live pods: a real ZMQ PUB socket sending ``[topic, 8-byte big-endian
  sequence, batch]`` (sequence from 0 per process), a ring buffer of the last ``buffer_steps`` batches and
  vLLM's replay ROUTER socket (request ``[empty, start seq]``, answers ``[empty, seq, batch]`` for every
  buffered batch from ``start``, then ``[empty, 0xFF * 8, empty]``). Endpoints follow vLLM's rule: one with
  ``*`` or an ``ipc://`` address is bound, any other is connected to (an EPP's ``zmqEndpoint``). One
  thread owns both sockets. Fault injection for tests: :meth:`~ZmqKVEventPublisher.skip` loses the next
  batches on the PUB socket (they stay replayable), :meth:`~ZmqKVEventPublisher.send_raw` sends any
  frames.
* :class:`VirtualKVEvents`, for the virtual-time cluster: a ``KVIndexService`` whose indexes never open a
  socket; each pod's batches are encoded, then decoded and applied to every opened index ``delay``
  virtual seconds after the step that produced them, in order, exactly as a subscriber would."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import queue
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
import zmq

from llm_epp.framework.kvindex import KVIndexSettings, PrefixLookup
from llm_epp.framework.types import Endpoint
from llm_epp.kvcache.events import END_OF_REPLAY, SEQ, DecodeStats, decode_batch
from llm_epp.kvcache.service import InMemoryKVIndex
from llm_epp.kvcache.sglang_hashing import event_hash as sglang_event_hash
from llm_epp.kvcache.sglang_hashing import page_digests
from llm_epp.kvcache.vllm_hashing import ALGORITHMS, block_extra_keys, external_hash, hash_function
from llm_epp.sim.live import LivePod

__all__ = [
    "ENCODINGS",
    "EVENT_ENGINES",
    "KVEventRecorder",
    "KVEventsOptions",
    "LiveKVEvents",
    "PublisherConfig",
    "VirtualKVEvents",
    "ZmqKVEventPublisher",
    "encode_batch",
    "kv_topic",
]

log = logging.getLogger(__name__)

ENCODINGS = ("array", "map")
EVENT_ENGINES = ("vllm", "sglang")
MEDIUM_GPU = "GPU"
_END_SEQ = SEQ.pack(END_OF_REPLAY)

# an event as the recorder keeps it: (tag, fields...) with hashes as digests
Stored = tuple[str, list[bytes], bytes | None, list[int], int, int | None, str | None]
Removed = tuple[str, list[bytes]]
Cleared = tuple[str]
RecordedEvent = Stored | Removed | Cleared


def kv_topic(address: str, model: str) -> str:
    """The topic llm-d's guides configure: ``kv@<pod ip:port>@<model>``."""
    return f"kv@{address}@{model}"


@dataclass(frozen=True, slots=True)
class KVEventsOptions:
    """How a simulated pod publishes (vLLM's ``--kv-events-config`` and hashing flags; ``engine`` picks vLLM's
    or SGLang's events, see the module docstring)."""

    encoding: str = "array"
    hash_algorithm: str = "sha256"  # --prefix-caching-hash-algo
    python_hash_seed: str = "0"  # PYTHONHASHSEED of the engine process
    int_hashes: bool = True  # VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES
    data_parallel_rank: int | None = 0
    buffer_steps: int = 10_000
    engine: str = "vllm"  # or "sglang"

    def __post_init__(self) -> None:
        if self.engine not in EVENT_ENGINES:
            raise ValueError(f"KV events engine {self.engine!r}: use one of {', '.join(EVENT_ENGINES)}")
        if self.engine == "sglang" and (self.encoding != "array" or not self.int_hashes):
            raise ValueError("SGLang publishes array-encoded events with integer hashes only")
        if self.encoding not in ENCODINGS:
            raise ValueError(f"KV event encoding {self.encoding!r}: use one of {', '.join(ENCODINGS)}")
        if self.hash_algorithm not in ALGORITHMS:
            raise ValueError(f"hash algorithm {self.hash_algorithm!r}: use one of {', '.join(ALGORITHMS)}")
        if self.buffer_steps < 1:
            raise ValueError("buffer_steps must be >= 1")


class KVEventRecorder:
    """An engine's ``kv_listener``: collects vLLM's events until :meth:`take` (see the module docstring).

    ``lora_ids`` numbers the adapters (vLLM's ``lora_int_id``); by default in the order first seen, from 1.
    Engine block ids are mapped to vLLM hashes through a memo (the mapping is a pure function of the
    tokens); a parent missing from it is recomputed from the request's tokens."""

    def __init__(self, block_size: int, options: KVEventsOptions = KVEventsOptions(), memo_size: int = 1 << 18) -> None:
        self.block_size = block_size
        self.options = options
        self._sglang = options.engine == "sglang"
        self._hash = hash_function(options.hash_algorithm)
        # the chain's start: vLLM's NONE_HASH; nothing for SGLang (its first page has no prior digest)
        self._none_hash: bytes | None = None if self._sglang else self._hash(options.python_hash_seed)
        self._memo: OrderedDict[int, bytes] = OrderedDict()
        self._memo_size = memo_size
        self._lora_ids: dict[str, int] = {}
        self._events: list[RecordedEvent] = []
        self.stored_blocks = 0
        self.removed_blocks = 0

    # --- KVCacheListener ---------------------------------------------------------------------------------
    def blocks_stored(
        self,
        block_ids: Sequence[int],
        parent_id: int | None,
        first_block: int,
        lora: str | None,
        tokens: Callable[[int, int], Sequence[int]],
    ) -> None:
        bs = self.block_size
        parent: bytes | None = None
        if parent_id is not None:
            parent = self._memo.get(parent_id)
            if parent is None:
                parent = self._chain(tokens(0, first_block * bs), 0, self._none_hash, lora)[-1]
        start = first_block * bs
        new_tokens = list(tokens(start, start + len(block_ids) * bs))
        hashes = self._chain(new_tokens, first_block, parent if parent is not None else self._none_hash, lora)
        memo = self._memo
        for block_id, digest in zip(block_ids, hashes, strict=True):
            memo[block_id] = digest
            memo.move_to_end(block_id)
        while len(memo) > self._memo_size:
            memo.popitem(last=False)
        lora_id = None
        if lora is not None and not self._sglang:
            lora_id = self._lora_ids.setdefault(lora, len(self._lora_ids) + 1)
        self._events.append(("BlockStored", hashes, parent, new_tokens, bs, lora_id, None if self._sglang else lora))
        self.stored_blocks += len(hashes)

    def block_removed(self, block_id: int) -> None:
        digest = self._memo.get(block_id)
        if digest is None:  # stored before this recorder listened: vLLM would know it; nothing to say here
            return
        self._events.append(("BlockRemoved", [digest]))
        self.removed_blocks += 1

    def all_cleared(self) -> None:
        self._events.append(("AllBlocksCleared",))

    # --- reading -----------------------------------------------------------------------------------------
    def take(self) -> list[RecordedEvent]:
        """The events since the last call, in order."""
        events, self._events = self._events, []
        return events

    def _chain(self, tokens: Sequence[int], first_block: int, parent: bytes | None, lora: str | None) -> list[bytes]:
        bs = self.block_size
        if self._sglang:
            return page_digests(tokens, bs, parent)
        out: list[bytes] = []
        fn = self._hash
        for i in range(len(tokens) // bs):
            extra = block_extra_keys(first_block + i, lora_name=lora)
            parent = fn((parent, tuple(tokens[i * bs : (i + 1) * bs]), extra))
            out.append(parent)
        return out


def _wire_hash(digest: bytes, as_int: bool) -> int | bytes:
    return external_hash(digest) if as_int else digest


def _sglang_event(event: RecordedEvent) -> list[Any]:
    tag = event[0]
    if tag == "BlockStored":
        _, hashes, parent, tokens, block_size, _lora_id, _lora_name = event  # type: ignore[misc]
        wire_parent = None if parent is None else sglang_event_hash(parent)
        return [tag, [sglang_event_hash(h) for h in hashes], wire_parent, tokens, block_size, None, MEDIUM_GPU]
    if tag == "BlockRemoved":
        return [tag, [sglang_event_hash(h) for h in event[1]], MEDIUM_GPU]  # type: ignore[misc]
    return [tag]


def _sglang_events(events: Sequence[RecordedEvent]) -> list[Any]:
    out: list[Any] = []
    for event in events:
        wire = _sglang_event(event)
        if wire[0] == "BlockRemoved" and out and out[-1][0] == "BlockRemoved":
            out[-1][1].extend(wire[1])  # SGLang's queue merges consecutive removals of one medium
        else:
            out.append(wire)
    return out


def _wire_event(event: RecordedEvent, options: KVEventsOptions) -> Any:
    as_int, as_map = options.int_hashes, options.encoding == "map"
    tag = event[0]
    if tag == "BlockStored":
        _, hashes, parent, tokens, block_size, lora_id, lora_name = event  # type: ignore[misc]
        wire_hashes = [_wire_hash(h, as_int) for h in hashes]
        wire_parent = None if parent is None else _wire_hash(parent, as_int)
        if as_map:
            out = {"type": tag, "block_hashes": wire_hashes, "parent_block_hash": wire_parent, "token_ids": tokens,
                   "block_size": block_size, "lora_id": lora_id, "medium": MEDIUM_GPU}  # fmt: skip
            if lora_name is not None:
                out["lora_name"] = lora_name
            return out
        fields: list[Any] = [tag, wire_hashes, wire_parent, tokens, block_size, lora_id, MEDIUM_GPU]
        if lora_name is not None:
            fields.append(lora_name)
        return fields
    if tag == "BlockRemoved":
        wire = [_wire_hash(h, as_int) for h in event[1]]  # type: ignore[misc]
        return {"type": tag, "block_hashes": wire, "medium": MEDIUM_GPU} if as_map else [tag, wire, MEDIUM_GPU]
    return {"type": tag} if as_map else [tag]


def encode_batch(ts: float, events: Sequence[RecordedEvent], options: KVEventsOptions) -> bytes:
    """One msgpack batch of ``events`` (see the module docstring)."""
    rank = options.data_parallel_rank
    if options.engine == "sglang":
        return msgspec.msgpack.encode([ts, _sglang_events(events), rank])  # attn_dp_rank, never left out
    wire = [_wire_event(e, options) for e in events]
    if options.encoding == "map":
        batch: dict[str, Any] = {"ts": ts, "events": wire}
        if rank is not None:
            batch["data_parallel_rank"] = rank
        return msgspec.msgpack.encode(batch)
    return msgspec.msgpack.encode([ts, wire] if rank is None else [ts, wire, rank])


# ------------------------------------------------------------------------------------------------ live


def _binds(endpoint: str) -> bool:
    """vLLM's rule: a wildcard host or an ipc/inproc address is bound, anything else connected to."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


class ZmqKVEventPublisher:
    """vLLM's ZMQ publisher (see the module docstring). :meth:`start` binds or connects; then
    :meth:`publish` from any thread."""

    def __init__(
        self,
        endpoint: str,
        *,
        replay_endpoint: str = "",
        topic: str = "",
        buffer_steps: int = 10_000,
        bind: bool | None = None,
    ) -> None:
        """``bind`` None: vLLM's rule (see the module docstring); True binds ``endpoint`` as given (e.g. a
        loopback address), False connects to it."""
        self.endpoint = endpoint
        self.bind = _binds(endpoint) if bind is None else bind
        self.replay_endpoint = replay_endpoint
        self.topic = topic
        self.buffer_steps = buffer_steps
        self.sent = 0
        self.replays = 0
        self._queue: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> ZmqKVEventPublisher:
        self._thread = threading.Thread(target=self._run, name="kv-events-publisher", daemon=True)
        self._thread.start()
        self._ready.wait(10)
        if self._error is not None:
            raise OSError(f"KV events publisher at {self.endpoint}: {self._error}") from self._error
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None

    def publish(self, payload: bytes) -> None:
        """Numbers, buffers and sends one batch."""
        self._queue.put(("batch", payload))

    def skip(self, n: int = 1) -> None:
        """The next ``n`` batches are numbered and buffered but not sent: subscribers see a gap."""
        self._queue.put(("skip", n))

    def send_raw(self, frames: Sequence[bytes]) -> None:
        """Sends ``frames`` as one message on the PUB socket, as they are (malformed input for tests)."""
        self._queue.put(("raw", list(frames)))

    def publish_raw_batch(self, payload: bytes) -> None:
        """Numbers and sends ``payload`` as if it were a batch (an undecodable one, for tests)."""
        self._queue.put(("batch", payload))

    def flush(self, timeout: float = 5.0) -> None:
        """Waits until everything queued so far has been sent."""
        done = threading.Event()
        self._queue.put(("flush", done))
        done.wait(timeout)

    def _run(self) -> None:
        ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        pub = ctx.socket(zmq.PUB)
        pub.setsockopt(zmq.LINGER, 0)
        pub.setsockopt(zmq.SNDHWM, 100_000)
        replay: zmq.Socket[bytes] | None = None
        try:
            if self.bind:
                pub.bind(self.endpoint)
                self.endpoint = pub.getsockopt_string(zmq.LAST_ENDPOINT)
            else:
                pub.connect(self.endpoint)
            if self.replay_endpoint:
                replay = ctx.socket(zmq.ROUTER)
                replay.setsockopt(zmq.LINGER, 0)
                replay.bind(self.replay_endpoint)
                self.replay_endpoint = replay.getsockopt_string(zmq.LAST_ENDPOINT)
        except zmq.ZMQError as e:
            self._error = e
            self._ready.set()
            pub.close(0)
            if replay is not None:
                replay.close(0)
            ctx.term()
            return
        self._ready.set()
        seq = itertools.count()
        buffer: deque[tuple[int, bytes]] = deque(maxlen=self.buffer_steps)
        topic = self.topic.encode()
        skipping = 0
        poller = zmq.Poller()
        if replay is not None:
            poller.register(replay, zmq.POLLIN)
        try:
            while not self._stop.is_set():
                if replay is not None and poller.poll(10):
                    self._serve_replay(replay, buffer)
                try:
                    kind, item = self._queue.get(timeout=0.0 if replay is not None else 0.01)
                except queue.Empty:
                    continue
                while True:
                    if kind == "batch":
                        n = next(seq)
                        buffer.append((n, item))
                        if skipping:
                            skipping -= 1
                        else:
                            pub.send_multipart((topic, SEQ.pack(n), item))
                            self.sent += 1
                    elif kind == "skip":
                        skipping += int(item)
                    elif kind == "raw":
                        pub.send_multipart(item)
                    elif kind == "flush":
                        item.set()
                    try:
                        kind, item = self._queue.get_nowait()
                    except queue.Empty:
                        break
        finally:
            pub.close(0)
            if replay is not None:
                replay.close(0)
            ctx.term()

    def _serve_replay(self, sock: zmq.Socket[bytes], buffer: deque[tuple[int, bytes]]) -> None:
        frames = sock.recv_multipart()
        if len(frames) != 3 or len(frames[2]) != 8:
            log.warning("kv_events_replay_bad_request frames=%d", len(frames))
            return
        client = frames[0]
        start = int.from_bytes(frames[2], "big")
        for n, payload in list(buffer):
            if n >= start:
                sock.send_multipart((client, b"", SEQ.pack(n), payload))
        sock.send_multipart((client, b"", _END_SEQ, b""))
        self.replays += 1


@dataclass(frozen=True, slots=True)
class PublisherConfig:
    """Where a live pod publishes (vLLM's ``--kv-events-config`` endpoint, replay_endpoint, topic)."""

    endpoint: str
    replay_endpoint: str = ""
    topic: str = ""  # "": kv@<pod ip:port>@<model>
    bind: bool | None = None
    options: KVEventsOptions = KVEventsOptions()


class LiveKVEvents:
    """A live pod's events on a ZMQ publisher: a recorder on its engine, flushed after every advance."""

    def __init__(self, pod: LivePod, config: PublisherConfig, topic: str) -> None:
        self.pod = pod
        self.options = config.options
        self.recorder = KVEventRecorder(pod.profile.block_size, config.options)
        self.publisher = ZmqKVEventPublisher(
            config.endpoint,
            replay_endpoint=config.replay_endpoint,
            topic=config.topic or topic,
            buffer_steps=config.options.buffer_steps,
            bind=config.bind,
        )

    def start(self) -> LiveKVEvents:
        self.publisher.start()
        self.pod.engine.kv_listener = self.recorder
        self.pod.after_advance = self.flush
        return self

    def stop(self) -> None:
        self.pod.after_advance = None
        self.pod.engine.kv_listener = None
        self.publisher.stop()

    def flush(self) -> None:
        events = self.recorder.take()
        if events:
            self.publisher.publish(encode_batch(time.time(), events, self.options))


# --------------------------------------------------------------------------------------------- virtual


class _VirtualIndex(InMemoryKVIndex):
    """An index fed by :class:`VirtualKVEvents` instead of sockets; a lookup first takes every batch due."""

    def __init__(self, name: str, settings: KVIndexSettings, events: VirtualKVEvents) -> None:
        super().__init__(name, settings, clock=lambda: events.clock())
        self.events = events

    def match(self, keys: Sequence[int], candidates: Collection[str]) -> PrefixLookup:
        self.events.deliver(self.events.clock())
        return super().match(keys, candidates)

    def follow(self, endpoints: Sequence[Endpoint]) -> None:
        if endpoints:
            self.index.retain_pods({e.hostport for e in endpoints})


class VirtualKVEvents:
    """KV events between the virtual cluster's pods and the router's precise indexes.

    Install it as the process's ``KVIndexService`` before building the router (the cluster does this);
    then :meth:`attach` gives every engine a recorder and the cluster calls :meth:`flush` after advancing
    a pod. A pod's batches reach the indexes ``delay`` virtual seconds later, in order, through the same
    decoder the ZMQ subscriber uses."""

    def __init__(
        self,
        clock: Callable[[], float],
        *,
        delay: float = 0.0,
        options: KVEventsOptions = KVEventsOptions(),
        model: str = "",
    ) -> None:
        if delay < 0:
            raise ValueError("delay must be >= 0")
        self.clock = clock
        self.delay = delay
        self.options = options
        self.model = model
        self.indexes: list[InMemoryKVIndex] = []
        self.decode = DecodeStats()
        self.batches = 0
        self._recorders: list[KVEventRecorder] = []
        self._pods: list[str] = []
        self._pending: list[tuple[float, int, int, bytes]] = []  # (due, order, pod, payload)
        self._order = itertools.count()
        self._timer: asyncio.TimerHandle | None = None

    # --- KVIndexService ----------------------------------------------------------------------------------
    def open(self, name: str, settings: KVIndexSettings) -> InMemoryKVIndex:
        index = _VirtualIndex(name, settings, self)
        self.indexes.append(index)
        return index

    # --- the cluster's side ------------------------------------------------------------------------------
    def attach(self, engines: Sequence[Any], pod_ids: Sequence[str]) -> None:
        """Listens to ``engines`` (pod ``i`` is ``pod_ids[i]``, its ``ip:port``)."""
        self._pods = list(pod_ids)
        self._recorders = []
        for engine in engines:
            recorder = KVEventRecorder(engine.profile.block_size, self.options)
            engine.kv_listener = recorder
            self._recorders.append(recorder)

    @property
    def recorders(self) -> Collection[KVEventRecorder]:
        return tuple(self._recorders)

    def flush(self, pod: int, now: float) -> None:
        """Sends what ``pod``'s engine did up to ``now``; delivers every batch now due."""
        if pod < len(self._recorders):
            events = self._recorders[pod].take()
            if events:
                payload = encode_batch(now, events, self.options)
                heapq.heappush(self._pending, (now + self.delay, next(self._order), pod, payload))
        self.deliver(now)

    def deliver(self, now: float) -> None:
        """Applies every batch due at or before ``now``; arms a timer for the next one."""
        pending = self._pending
        while pending and pending[0][0] <= now:
            _, _, pod, payload = heapq.heappop(pending)
            batch = decode_batch(payload, self.decode)
            self.batches += 1
            if batch is None:
                continue
            for index in self.indexes:
                index.index.apply(self._pods[pod], self.model, batch)
        self._arm()

    def _arm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._pending:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # outside a run: delivered at the next flush
        due = self._pending[0][0]
        self._timer = loop.call_at(due, lambda: self.deliver(self.clock()))
