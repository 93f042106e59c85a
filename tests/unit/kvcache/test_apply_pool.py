"""`kvEventsConfig.concurrency`: batches are applied by N workers, each endpoint always on the same one, so the
index ends the same as when one thread applies everything in order."""

from __future__ import annotations

import pytest

from llm_epp.kvcache.events import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch
from llm_epp.kvcache.index import KVBlockIndex
from llm_epp.kvcache.request_keys import RequestKeyHasher
from llm_epp.kvcache.subscriber import ApplyPool

PODS = [f"10.0.0.{i}:8000" for i in range(6)]


def _stream(pod: int) -> list[EventBatch]:
    """A pod's batches: chained stores, some removals, a clear, then more stores."""
    out: list[EventBatch] = []
    parent: int | None = None
    for step in range(30):
        h = pod * 1000 + step + 1
        tokens = tuple(range(h * 4, h * 4 + 4))
        out.append(EventBatch(0.0, (BlockStored((h,), parent, tokens, 4),)))
        parent = h
        if step % 7 == 6:
            out.append(EventBatch(0.0, (BlockRemoved((h - 3,)),)))
        if step == 20:
            out.append(EventBatch(0.0, (AllBlocksCleared(),)))
            parent = None
    return out


def _snapshot(index: KVBlockIndex) -> dict[str, list[int]]:
    return {pod: sorted(index._pod_keys.get(pod, {})) for pod in PODS}


def test_sharded_workers_reach_the_same_index_as_one_thread() -> None:
    streams = {pod: _stream(i) for i, pod in enumerate(PODS)}
    serial = KVBlockIndex(RequestKeyHasher(4))
    for pod, batches in streams.items():
        for b in batches:
            serial.apply(pod, "m", b)
    parallel = KVBlockIndex(RequestKeyHasher(4))
    pool = ApplyPool(parallel, 3)
    pool.start()
    for step in range(max(len(b) for b in streams.values())):  # interleaved, as messages arrive
        for pod, batches in streams.items():
            if step < len(batches):
                pool.apply(pod, "m", batches[step])
    pool.stop()  # the workers finish what was queued before they stop
    assert _snapshot(parallel) == _snapshot(serial)
    assert any(_snapshot(serial).values())
    assert parallel.stats.applied == serial.stats.applied


def test_a_clear_is_ordered_with_the_endpoints_batches() -> None:
    index = KVBlockIndex(RequestKeyHasher(4))
    pool = ApplyPool(index, 2)
    stored = EventBatch(0.0, (BlockStored((1,), None, (1, 2, 3, 4), 4),))
    pool.apply(PODS[0], "m", stored)
    pool.clear(PODS[0])
    pool.apply(PODS[1], "m", stored)
    pool.clear(PODS[1])
    pool.apply(PODS[1], "m", stored)
    pool.stop()
    assert index.pods() == [PODS[1]]


def test_at_least_one_worker() -> None:
    with pytest.raises(ValueError, match="concurrency must be at least 1"):
        ApplyPool(KVBlockIndex(RequestKeyHasher(4)), 0)
