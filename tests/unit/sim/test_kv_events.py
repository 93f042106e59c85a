"""Simulated pods publish KV-cache events as vLLM does: hashes, evictions, resets, both encodings, a real ZMQ
PUB socket with the replay ROUTER, and delivery in virtual time to the router's precise index."""

from __future__ import annotations

import itertools
import time

import pytest
import zmq

from llm_epp.framework.kvindex import KVIndexSettings, install_kv_index_service
from llm_epp.kvcache.events import (
    END_OF_REPLAY,
    SEQ,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    DecodeStats,
    decode_batch,
    decode_seq,
)
from llm_epp.kvcache.index import KVBlockIndex
from llm_epp.kvcache.request_keys import RequestKeyHasher
from llm_epp.kvcache.subscriber import KVEventsRunner, PodSource
from llm_epp.kvcache.vllm_hashing import block_hashes, external_hash
from llm_epp.sim.cluster import Cluster, TraceRequest
from llm_epp.sim.engine import Engine, SimRequest
from llm_epp.sim.kv_events import (
    KVEventRecorder,
    KVEventsOptions,
    VirtualKVEvents,
    ZmqKVEventPublisher,
    encode_batch,
)
from llm_epp.sim.profiles import TINY
from llm_epp.sim.routers import SIM_MODEL, EppRouter
from llm_epp.sim.workload import Prompt

BS = TINY.block_size


def _run(engine: Engine, until: float = 10.0) -> None:
    while (t := engine.next_event_time()) is not None and t <= until:
        engine.advance(t)


def _decoded(recorder: KVEventRecorder, options: KVEventsOptions) -> list[object]:
    stats = DecodeStats()
    batch = decode_batch(encode_batch(1.0, recorder.take(), options), stats)
    assert batch is not None and stats.malformed_events == 0
    return list(batch.events)


@pytest.mark.parametrize("encoding", ["array", "map"])
@pytest.mark.parametrize("algorithm", ["sha256", "sha256_cbor", "xxhash", "xxhash_cbor"])
def test_stored_blocks_carry_vllm_hashes_of_their_tokens(encoding: str, algorithm: str) -> None:
    options = KVEventsOptions(encoding=encoding, hash_algorithm=algorithm, python_hash_seed="42")
    recorder = KVEventRecorder(BS, options)
    engine = Engine(TINY, kv_listener=recorder)
    prompt = tuple(range(1000, 1000 + 5 * BS + 3))
    engine.submit(SimRequest("a", prompt, max_tokens=1), 0.0)
    _run(engine)
    events = _decoded(recorder, options)
    stored = [e for e in events if isinstance(e, BlockStored)]
    expected = [external_hash(h) for h in block_hashes(prompt, BS, algorithm=algorithm, python_hash_seed="42")]
    assert [h for e in stored for h in e.block_hashes] == expected
    assert stored[0].parent_block_hash is None and stored[0].medium == "gpu" and stored[0].block_size == BS
    assert [t for e in stored for t in e.token_ids] == list(prompt[: 5 * BS])


def test_bytes_hashes_and_lora_extra_keys() -> None:
    options = KVEventsOptions(int_hashes=False)
    recorder = KVEventRecorder(BS, options)
    engine = Engine(TINY, kv_listener=recorder)
    prompt = tuple(range(2 * BS))
    engine.submit(SimRequest("a", prompt, max_tokens=1, lora="ad1"), 0.0)
    _run(engine)
    events = recorder.take()
    stored = [e for e in events if e[0] == "BlockStored"]
    digests = block_hashes(prompt, BS, python_hash_seed="0", lora_name="ad1")
    assert stored[0][1] == digests[:2] or [h for e in stored for h in e[1]] == digests
    decoded = decode_batch(encode_batch(0.0, events, options), DecodeStats())
    assert decoded is not None
    first = decoded.events[0]
    assert isinstance(first, BlockStored) and first.lora_name == "ad1" and first.lora_id == 1
    assert first.block_hashes[0] == external_hash(digests[0])


def test_generated_blocks_chain_on_from_the_prompt() -> None:
    recorder = KVEventRecorder(BS)
    engine = Engine(TINY, kv_listener=recorder)
    prompt = tuple(range(BS + 4))
    engine.submit(SimRequest("a", prompt, max_tokens=3 * BS), 0.0)
    _run(engine)
    events = _decoded(recorder, KVEventsOptions())
    stored = [e for e in events if isinstance(e, BlockStored)]
    # every later event chains from the last hash of the event before it
    for before, after in itertools.pairwise(stored):
        assert after.parent_block_hash == before.block_hashes[-1]
    # the generated tokens are the ones that follow the prompt in each block
    tokens = [t for e in stored for t in e.token_ids]
    assert tokens[: len(prompt)] == list(prompt)
    all_hashes = [h for e in stored for h in e.block_hashes]
    assert all_hashes == [external_hash(h) for h in block_hashes(tokens, BS, python_hash_seed="0")]


def test_evictions_and_reset_are_published() -> None:
    recorder = KVEventRecorder(BS)
    engine = Engine(TINY, kv_listener=recorder)
    n = 0
    for i in range(40):  # 40 distinct 8-block prompts through a 256-block cache: the oldest get evicted
        engine.submit(SimRequest(f"r{i}", tuple(range(i * 1000, i * 1000 + 8 * BS)), max_tokens=1), engine.clock)
        _run(engine, 1e9)
        n += 1
    events = _decoded(recorder, KVEventsOptions())
    stored = {h for e in events if isinstance(e, BlockStored) for h in e.block_hashes}
    removed = [h for e in events if isinstance(e, BlockRemoved) for h in e.block_hashes]
    assert removed and set(removed) <= stored
    assert engine.metrics().evicted_blocks == len(removed)
    assert engine.reset_prefix_cache()
    assert _decoded(recorder, KVEventsOptions()) == [AllBlocksCleared()]
    assert engine.cached_prefix_tokens(tuple(range(39_000, 39_000 + 8 * BS))) == 0


def test_index_fed_by_the_recorder_tracks_the_engine_cache() -> None:
    """After stores and evictions, the index holds exactly the blocks the engine has cached."""
    recorder = KVEventRecorder(BS)
    engine = Engine(TINY, kv_listener=recorder)
    index = KVBlockIndex(RequestKeyHasher(BS))
    options = KVEventsOptions()
    prompts = [tuple(range(i * 1000, i * 1000 + 6 * BS)) for i in range(60)]
    for i, p in enumerate(prompts):
        engine.submit(SimRequest(f"r{i}", p, max_tokens=1), engine.clock)
        _run(engine, 1e9)
        batch = decode_batch(encode_batch(0.0, recorder.take(), options), DecodeStats())
        assert batch is not None
        index.apply("10.0.0.1:8000", SIM_MODEL, batch)
    for p in prompts:
        keys = index.hasher.keys(p, SIM_MODEL)
        held = len(index.lookup(keys, {"10.0.0.1:8000"}))
        assert held * BS == engine.cached_prefix_tokens(p)


def test_zmq_publisher_sends_numbered_batches_and_replays() -> None:
    pub = ZmqKVEventPublisher(
        "tcp://127.0.0.1:*", replay_endpoint="tcp://127.0.0.1:*", topic="kv@x@m", bind=True
    ).start()
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"kv@")
    sub.connect(pub.endpoint)
    try:
        deadline = time.monotonic() + 10
        got: list[list[bytes]] = []
        while not got:  # the slow-joiner: publish until the subscription is through
            assert time.monotonic() < deadline
            pub.publish(b"\x93\x00\x90\x00")
            pub.flush()
            if sub.poll(100):
                got.append(sub.recv_multipart())
        topic, seq, payload = got[0]
        assert topic == b"kv@x@m" and payload == b"\x93\x00\x90\x00"
        first = decode_seq(seq)
        assert first is not None
        pub.skip(1)
        pub.publish(b"lost")
        pub.publish(b"after")
        pub.flush()
        assert sub.poll(5000)
        _, seq2, payload2 = sub.recv_multipart()
        after = decode_seq(seq2)
        assert payload2 == b"after" and after is not None
        dealer = ctx.socket(zmq.DEALER)
        dealer.connect(pub.replay_endpoint)
        dealer.send_multipart([b"", SEQ.pack(after - 1)])
        replayed = []
        while True:
            assert dealer.poll(5000)
            _, s, p = dealer.recv_multipart()
            if decode_seq(s) == END_OF_REPLAY:
                break
            replayed.append((decode_seq(s), p))
        assert replayed == [(after - 1, b"lost"), (after, b"after")]
        dealer.close(0)
    finally:
        sub.close(0)
        ctx.term()
        pub.stop()


def test_subscriber_fills_a_gap_from_the_replay_socket() -> None:
    """The EPP's real subscriber against the simulated publisher: a lost batch is replayed into the index."""
    options = KVEventsOptions(encoding="map")
    pub = ZmqKVEventPublisher(
        "tcp://127.0.0.1:*", replay_endpoint="tcp://127.0.0.1:*", topic="kv@p@m", bind=True
    ).start()
    index = KVBlockIndex(RequestKeyHasher(BS))
    runner = KVEventsRunner(index)
    runner.set_sources([PodSource("10.0.0.9:8000", pub.endpoint, pub.replay_endpoint)])
    runner.start()
    recorder = KVEventRecorder(BS, options)
    engine = Engine(TINY, kv_listener=recorder)
    try:
        deadline = time.monotonic() + 10
        i = 0
        while runner.stats.messages == 0:  # warm up until the subscription is through
            assert time.monotonic() < deadline
            engine.submit(SimRequest(f"w{i}", tuple(range(50_000 + i * 100, 50_000 + i * 100 + BS)), 1), engine.clock)
            _run(engine, 1e9)
            pub.publish(encode_batch(0.0, recorder.take(), options))
            pub.flush()
            i += 1
            time.sleep(0.05)
        lost = tuple(range(7000, 7000 + 4 * BS))
        engine.submit(SimRequest("lost", lost, 1), engine.clock)
        _run(engine, 1e9)
        pub.skip(1)
        pub.publish(encode_batch(0.0, recorder.take(), options))
        later = tuple(range(9000, 9000 + 2 * BS))
        engine.submit(SimRequest("later", later, 1), engine.clock)
        _run(engine, 1e9)
        pub.publish(encode_batch(0.0, recorder.take(), options))
        pub.flush()
        deadline = time.monotonic() + 10
        while len(index.lookup(index.hasher.keys(later, "m"))) < 2:
            assert time.monotonic() < deadline, runner.stats
            time.sleep(0.02)
        assert runner.stats.gaps >= 1 and runner.stats.replayed >= 1
        assert len(index.lookup(index.hasher.keys(lost, "m"))) == 4
    finally:
        runner.stop()
        pub.stop()


def _precise_config() -> str:
    return """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: precise-prefix-cache-producer
- type: precise-prefix-cache-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: precise-prefix-cache-scorer
  - pluginRef: max-score-picker
"""


def _precise_cluster(
    delay: float, options: KVEventsOptions | None = None
) -> tuple[Cluster, EppRouter, VirtualKVEvents]:
    cluster = Cluster(TINY, 4)
    events = VirtualKVEvents(lambda: cluster.clock, delay=delay, model=SIM_MODEL, options=options or KVEventsOptions())
    install_kv_index_service(events)
    try:
        router = EppRouter(4, _precise_config(), token_prompts=True)
    finally:
        install_kv_index_service(None)
    cluster.publish_kv_events(events)
    return cluster, router, events


def _prompt(text: str, group: int) -> Prompt:
    from llm_epp.sim import tokenizer

    return Prompt(group=group, index=0, text=text, token_ids=tokenizer.encode(text), max_tokens=2)


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_virtual_cluster_routes_follow_ups_to_the_pod_holding_their_blocks(engine: str) -> None:
    cluster, router, events = _precise_cluster(delay=0.05, options=KVEventsOptions(engine=engine))
    base = ["alpha " * 60, "bravo " * 60, "charlie " * 60]
    first = cluster.run_trace([TraceRequest(i * 0.5, _prompt(b, i)) for i, b in enumerate(base)], router)
    home = {r.group: r.pod for r in first}
    follow = [
        TraceRequest(1.0 + i * 0.2, _prompt(b + f"question {i}", g)) for i in range(3) for g, b in enumerate(base)
    ]
    results = cluster.run_trace(follow, router)
    assert all(r.pod == home[r.group] for r in results)
    assert events.batches > 0 and events.decode.malformed_messages == 0
    assert all(r.cached_tokens > 0 for r in results)


def test_events_not_yet_delivered_are_not_known() -> None:
    """With a long delay the follow-up arrives before the first request's BlockStored: no hit is known."""
    cluster, router, events = _precise_cluster(delay=30.0)
    (index,) = events.indexes
    cluster.run_trace([TraceRequest(0.0, _prompt("delta " * 60, 0))], router)
    keys = index.request_keys(_prompt("delta " * 60, 0).token_ids, SIM_MODEL)
    assert index.match(keys, [f"10.0.0.{i}:8000" for i in range(4)]).blocks == {}
    cluster.run_trace([TraceRequest(40.0, _prompt("echo " * 10, 1))], router)  # time passes: delivered
    assert max(index.match(keys, [f"10.0.0.{i}:8000" for i in range(4)]).blocks.values()) == len(keys)


def test_settings_of_a_virtual_index_are_the_plugins() -> None:
    events = VirtualKVEvents(lambda: 0.0)
    index = events.open("x", KVIndexSettings(block_size=32))
    assert index.block_size == 32 and events.indexes == [index]


def test_a_port_in_use_is_a_clear_startup_error() -> None:
    first = ZmqKVEventPublisher("tcp://127.0.0.1:*", bind=True).start()
    try:
        with pytest.raises(OSError, match=r"KV events publisher at tcp://127\.0\.0\.1:"):
            ZmqKVEventPublisher(first.endpoint, bind=True).start()
    finally:
        first.stop()


def test_options_are_checked() -> None:
    with pytest.raises(ValueError, match="encoding"):
        KVEventsOptions(encoding="json")
    with pytest.raises(ValueError, match="hash algorithm"):
        KVEventsOptions(hash_algorithm="md5")


def test_sglang_pods_publish_sglang_page_hashes_and_layout() -> None:
    """An SGLang pod's events: SHA-256 page chain as signed ints, SGLang's array layout and batch, merged
    removals; the index fed by them holds what the engine holds."""
    import msgspec

    from llm_epp.kvcache.sglang_hashing import event_hash, page_digests

    options = KVEventsOptions(engine="sglang")
    recorder = KVEventRecorder(BS, options)
    engine = Engine(TINY, kv_listener=recorder)
    index = KVBlockIndex(RequestKeyHasher(BS))
    prompts = [tuple(range(i * 1000, i * 1000 + 6 * BS)) for i in range(60)]
    saw_merged_removal = False
    for i, p in enumerate(prompts):
        engine.submit(SimRequest(f"r{i}", p, max_tokens=1, lora="ad1" if i % 2 else None), engine.clock)
        _run(engine, 1e9)
        payload = encode_batch(2.0, recorder.take(), options)
        ts, wire, rank = msgspec.msgpack.decode(payload)
        assert ts == 2.0 and rank == 0
        stored = [e for e in wire if e[0] == "BlockStored"]
        assert all(len(e) == 7 and e[4] == BS and e[5] is None and e[6] == "GPU" for e in stored)
        removed = [e for e in wire if e[0] == "BlockRemoved"]
        assert all(e[2] == "GPU" for e in removed)
        assert all(a[0] != "BlockRemoved" or b[0] != "BlockRemoved" for a, b in itertools.pairwise(wire))
        saw_merged_removal |= any(len(e[1]) > 1 for e in removed)
        if i == 0:
            expected = [event_hash(d) for d in page_digests(p, BS)]
            assert [h for e in stored for h in e[1]] == expected and stored[0][2] is None
        batch = decode_batch(payload, DecodeStats())
        assert batch is not None
        index.apply("10.0.0.1:30000", SIM_MODEL, batch)
    assert saw_merged_removal
    for i, p in enumerate(prompts):  # LoRA blocks are published without the adapter: found under the model
        held = len(index.lookup(index.hasher.keys(p, SIM_MODEL), {"10.0.0.1:30000"}))
        assert held * BS == engine.cached_prefix_tokens(p, "ad1" if i % 2 else None)


def test_sglang_options_refuse_vllm_only_shapes() -> None:
    with pytest.raises(ValueError, match="SGLang publishes array-encoded events"):
        KVEventsOptions(engine="sglang", encoding="map")
    with pytest.raises(ValueError, match="SGLang publishes array-encoded events"):
        KVEventsOptions(engine="sglang", int_hashes=False)
    with pytest.raises(ValueError, match="KV events engine 'trtllm'"):
        KVEventsOptions(engine="trtllm")
