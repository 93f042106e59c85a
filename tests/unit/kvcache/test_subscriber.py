"""The subscriber thread against a real in-test ZMQ publisher (PUB + ROUTER replay) on 127.0.0.1."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import msgspec
import pytest
import zmq

from llm_epp.kvcache.events import SEQ
from llm_epp.kvcache.index import KVBlockIndex
from llm_epp.kvcache.request_keys import RequestKeyHasher
from llm_epp.kvcache.subscriber import KVEventsRunner, PodSource, rank_of, sources_for
from tests.unit.builders import endpoint

POD = "127.0.0.1:8000"
MODEL = "m"
TOPIC = f"kv@{POD}@{MODEL}".encode()


def stored(hashes: list[int], tokens: list[int], parent: int | None = None) -> bytes:
    return msgspec.msgpack.encode([0.0, [["BlockStored", hashes, parent, tokens, 4]], 0])


class Publisher:
    """vLLM's publisher in miniature: PUB for live batches, ROUTER answering replay requests."""

    def __init__(self, ctx: zmq.Context) -> None:
        self.pub = ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.port = self.pub.bind_to_random_port("tcp://127.0.0.1")
        self.router = ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.replay_port = self.router.bind_to_random_port("tcp://127.0.0.1")
        self.buffer: list[tuple[int, bytes]] = []
        self.replay_requests: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            if not self.router.poll(50):
                continue
            identity, _, start = self.router.recv_multipart()
            first = SEQ.unpack(start)[0]
            self.replay_requests.append(first)
            for seq, payload in list(self.buffer):
                if seq >= first:
                    self.router.send_multipart([identity, b"", SEQ.pack(seq), payload])
            self.router.send_multipart([identity, b"", b"\xff" * 8, b""])

    def publish(self, seq: int, payload: bytes, *, send: bool = True) -> None:
        self.buffer.append((seq, payload))
        if send:
            self.pub.send_multipart([TOPIC, SEQ.pack(seq), payload])

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.pub.close(0)
        self.router.close(0)


def wait_for(cond: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


@pytest.fixture
def setup():
    ctx = zmq.Context()
    pub = Publisher(ctx)
    index = KVBlockIndex(RequestKeyHasher(4, ""))
    runner = KVEventsRunner(index, replay_timeout=5.0)
    yield pub, index, runner
    runner.stop()
    pub.close()
    ctx.destroy(0)


def held(index: KVBlockIndex, tokens: list[int]) -> float:
    return index.score(index.hasher.keys(tokens, MODEL)).get(POD, 0.0)


def test_live_events_gap_replay_restart_and_pod_removal(setup) -> None:
    pub, index, runner = setup
    source = PodSource(POD, f"tcp://127.0.0.1:{pub.port}", f"tcp://127.0.0.1:{pub.replay_port}")
    runner.set_sources([source])
    runner.start()
    wait_for(lambda: runner.subscribed() == [POD], "subscription")
    # a SUB socket receives nothing until its subscription reaches the publisher: resend seq 0 until seen
    first = stored([1], [1, 2, 3, 4])
    pub.publish(0, first)
    while held(index, [1, 2, 3, 4]) == 0:
        pub.pub.send_multipart([TOPIC, SEQ.pack(0), first])
        time.sleep(0.05)
    # seq 1 and 2 are lost on the wire; seq 3 reveals the gap and they come back through the replay socket
    pub.publish(1, stored([2], [5, 6, 7, 8], parent=1), send=False)
    pub.publish(2, stored([3], [9, 9, 9, 9], parent=2), send=False)
    pub.publish(3, stored([4], [1, 1, 1, 1]))
    wait_for(lambda: held(index, [1, 1, 1, 1]) == 1.0, "seq 3")
    assert held(index, [1, 2, 3, 4, 5, 6, 7, 8, 9, 9, 9, 9]) == 3.0
    assert pub.replay_requests == [0]  # from the last batch applied, to check it is still the same publisher
    assert runner.stats.gaps == 1 and runner.stats.replayed == 2 and runner.stats.restarts == 0
    # malformed messages are counted; the thread carries on
    pub.pub.send_multipart([TOPIC, b"\x00"])
    pub.pub.send_multipart([TOPIC, b"\x00\x01", b"x"])
    pub.pub.send_multipart([TOPIC, SEQ.pack(4), b"\xc1"])
    wait_for(lambda: runner.stats.decode.malformed_messages == 3, "malformed counted")
    # the engine restarts: its sequence starts again at 0 and its old blocks are gone
    pub.buffer.clear()
    pub.publish(0, stored([7], [2, 2, 2, 2]))
    wait_for(lambda: held(index, [2, 2, 2, 2]) == 1.0, "restart batch")
    assert runner.stats.restarts == 1
    assert held(index, [1, 2, 3, 4]) == 0
    # the endpoint leaves the pool: unsubscribed and dropped from the index
    runner.set_sources([])
    wait_for(lambda: runner.subscribed() == [], "unsubscribe")
    assert index.pods() == []
    assert runner.running()


def test_a_restart_whose_first_batches_were_lost_is_found_through_the_replay(setup) -> None:
    """The engine restarts and its first batches go out before the subscriber is back: the next one it sees
    carries a higher number than the last it applied (a gap, not a step back). The batch under the old
    number differs, so the endpoint's old blocks are dropped and the new buffer is applied from 0."""
    pub, index, runner = setup
    source = PodSource(POD, f"tcp://127.0.0.1:{pub.port}", f"tcp://127.0.0.1:{pub.replay_port}")
    runner.set_sources([source])
    runner.start()
    wait_for(lambda: runner.subscribed() == [POD], "subscription")
    old = stored([1], [1, 2, 3, 4])
    pub.publish(0, old)
    while held(index, [1, 2, 3, 4]) == 0:
        pub.pub.send_multipart([TOPIC, SEQ.pack(0), old])
        time.sleep(0.05)
    pub.publish(1, stored([2], [5, 6, 7, 8], parent=1))
    wait_for(lambda: held(index, [1, 2, 3, 4, 5, 6, 7, 8]) == 2.0, "seq 1")
    pub.buffer.clear()  # a new process: numbers from 0, seq 0 to 2 lost on the wire
    pub.publish(0, stored([10], [3, 3, 3, 3]), send=False)
    pub.publish(1, stored([11], [4, 4, 4, 4]), send=False)
    pub.publish(2, stored([12], [6, 6, 6, 6]), send=False)
    pub.publish(3, stored([13], [5, 5, 5, 5]))
    wait_for(lambda: held(index, [5, 5, 5, 5]) == 1.0, "seq 3")
    wait_for(
        lambda: held(index, [3, 3, 3, 3]) == 1.0 and held(index, [4, 4, 4, 4]) == 1.0,
        "new buffer applied",
    )
    assert runner.stats.restarts == 1 and held(index, [6, 6, 6, 6]) == 1.0
    assert held(index, [1, 2, 3, 4]) == 0  # the old process's blocks are gone
    assert pub.replay_requests == [1, 0]


def test_a_late_subscriber_catches_up_through_replay(setup) -> None:
    pub, index, runner = setup
    pub.publish(0, stored([1], [1, 2, 3, 4]), send=False)
    pub.publish(1, stored([2], [5, 6, 7, 8], parent=1), send=False)
    source = PodSource(POD, f"tcp://127.0.0.1:{pub.port}", f"tcp://127.0.0.1:{pub.replay_port}")
    runner.start(lambda: [source])
    wait_for(lambda: runner.subscribed() == [POD], "subscription")
    third = stored([3], [9, 9, 9, 9], parent=2)
    pub.publish(2, third)
    while held(index, [1, 2, 3, 4, 5, 6, 7, 8, 9, 9, 9, 9]) < 3.0:
        pub.pub.send_multipart([TOPIC, SEQ.pack(2), third])
        time.sleep(0.05)
    assert pub.replay_requests[0] == 0


def test_sources_follow_llm_d_discovery_conventions() -> None:
    eps = [endpoint("a", address="10.0.0.1", port=8000), endpoint("b-rank-1", address="10.0.0.2", port=8001)]
    assert rank_of(eps[1]) == 1
    assert sources_for(eps, 5557) == [
        PodSource("10.0.0.1:8000", "tcp://10.0.0.1:5557"),
        PodSource("10.0.0.2:8001", "tcp://10.0.0.2:5558"),
    ]
    assert sources_for(eps[:1], 5557, 5558)[0].replay_endpoint == "tcp://10.0.0.1:5558"


def test_central_mode_binds_and_takes_the_endpoint_from_the_topic() -> None:
    index = KVBlockIndex(RequestKeyHasher(4, ""))
    runner = KVEventsRunner(index, bind_endpoint="tcp://127.0.0.1:*")
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    try:
        runner.start()
        wait_for(lambda: runner.bound_endpoint != "", "bind")
        pub.connect(runner.bound_endpoint)
        payload = stored([1], [1, 2, 3, 4])
        keys = index.hasher.keys([1, 2, 3, 4], MODEL)
        while not index.score(keys):
            for pod in ("10.0.0.7:8000", "10.0.0.8:8000"):
                pub.send_multipart([f"kv@{pod}@{MODEL}".encode(), SEQ.pack(0), payload])
            time.sleep(0.05)
        wait_for(lambda: len(index.score(keys)) == 2, "both publishers")
        assert index.score(keys) == {"10.0.0.7:8000": 1.0, "10.0.0.8:8000": 1.0}
        # another topic prefix is not subscribed to
        pub.send_multipart([b"other@10.0.0.9:8000@m", SEQ.pack(0), payload])
        pub.send_multipart([f"kv@10.0.0.7:8000@{MODEL}".encode(), SEQ.pack(1), stored([2], [5, 5, 5, 5])])
        wait_for(lambda: bool(index.score(index.hasher.keys([5, 5, 5, 5], MODEL))), "seq 1")
        assert "10.0.0.9:8000" not in index.pods()
    finally:
        runner.stop()
        pub.close(0)
        ctx.destroy(0)


def test_malformed_input_is_reported_once_per_report(caplog) -> None:
    runner = KVEventsRunner(KVBlockIndex(RequestKeyHasher(4, "")))
    runner.stats.decode.count("message", "frames: expected 3, got 2")
    with caplog.at_level("WARNING", logger="llm_epp.kvcache.subscriber"):
        assert runner._report(0) == 1
        assert runner._report(1) == 1
    assert len(caplog.records) == 1 and "frames: expected 3" in caplog.records[0].getMessage()
