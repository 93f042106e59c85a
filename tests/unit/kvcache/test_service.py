from __future__ import annotations

import asyncio

import pytest

from llm_epp.framework.kvindex import KVBlockIndexView, KVIndexSettings, install_kv_index_service, kv_index_service
from llm_epp.kvcache import InMemoryKVIndexService
from tests.unit.builders import endpoint


@pytest.fixture
def no_installed_service():
    install_kv_index_service(None)
    yield
    install_kv_index_service(None)


def test_the_default_service_comes_from_the_entry_point(no_installed_service) -> None:
    service = kv_index_service()
    assert isinstance(service, InMemoryKVIndexService)
    assert kv_index_service() is service
    own = InMemoryKVIndexService()
    install_kv_index_service(own)
    assert kv_index_service() is own
    index = own.open("p", KVIndexSettings(block_size=4))
    assert isinstance(index, KVBlockIndexView)
    assert own.indexes() == [index]


async def test_run_follows_the_pool_on_the_loop_and_stops_subscribers_when_cancelled() -> None:
    service = InMemoryKVIndexService()
    index = service.open("p", KVIndexSettings(block_size=4, socket_port=1))  # nothing listens there: fine
    pool = [endpoint("a", address="127.0.0.1", port=8000)]
    task = asyncio.create_task(service.run(lambda: pool, interval=0.01))
    try:
        for _ in range(500):
            if index.runner.subscribed() == ["127.0.0.1:8000"]:
                break
            await asyncio.sleep(0.01)
        assert index.runner.subscribed() == ["127.0.0.1:8000"]
        index.index.add([1], "127.0.0.1:8000")
        pool.clear()  # an empty snapshot drops nothing
        pool.append(endpoint("b", address="127.0.0.2", port=8000))
        for _ in range(500):
            if index.runner.subscribed() == ["127.0.0.2:8000"]:
                break
            await asyncio.sleep(0.01)
        assert index.runner.subscribed() == ["127.0.0.2:8000"]
        assert index.index.pods() == []  # the endpoint that left was dropped from the index
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert not index.runner.running()
