"""PoolWatcher driven through the real `kubernetes` client against the in-test API server."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from llm_epp.datalayer.datastore import Datastore
from llm_epp.k8s.watcher import PoolWatcher
from tests.support.fake_apiserver import FakeApiServer

NS = "default"
DEADLINE = 10.0


def pool(labels: dict[str, str] | None = None, ports: tuple[int, ...] = (8000,), name: str = "pool") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "selector": {"matchLabels": labels or {"app": "model"}},
            "targetPorts": [{"number": p} for p in ports],
            "endpointPickerRef": {"name": "epp", "port": {"number": 9002}},
        },
    }


def pod(name: str, ip: str, ready: bool = True, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": NS, "labels": labels or {"app": "model"}},
        "spec": {"containers": [{"name": "server", "image": "model:latest"}]},
        "status": {
            "podIP": ip,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def hostports(ds: Datastore) -> list[str]:
    return sorted(m.hostport for m in ds.metadata())


def names(ds: Datastore) -> list[str]:
    return sorted(m.key.name for m in ds.metadata())


async def wait_for(cond: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


class Env:
    def __init__(self, fake: FakeApiServer, ds: Datastore, watcher: PoolWatcher) -> None:
        self.fake, self.ds, self.watcher = fake, ds, watcher
        self.sync_states: list[bool] = []


@pytest.fixture
def fake() -> Any:
    with FakeApiServer() as server:
        yield server


@pytest.fixture
async def env(fake: FakeApiServer) -> AsyncIterator[Env]:
    api = fake.api_client()
    ds = Datastore("pool")
    states: list[bool] = []
    watcher = PoolWatcher(
        api,
        NS,
        "pool",
        "inference.networking.k8s.io",
        ds,
        asyncio.get_running_loop(),
        on_sync=states.append,
        watch_timeout=5,
        backoff_initial=0.05,
        backoff_max=0.2,
    )
    e = Env(fake, ds, watcher)
    e.sync_states = states
    try:
        yield e
    finally:
        await asyncio.to_thread(watcher.stop)
        await wait_for(lambda: fake.open_watches() == 0, "watches closed after stop()")
        api.close()


async def test_initial_sync(env: Env) -> None:
    env.fake.create("inferencepools", pool(ports=(8000, 8001)))
    env.fake.create("pods", pod("p1", "127.0.0.2"))
    env.fake.create("pods", pod("p2", "127.0.0.3", ready=False))
    env.fake.create("pods", pod("other", "127.0.0.9", labels={"app": "else"}))
    assert not env.ds.synced
    env.watcher.start()
    await wait_for(lambda: env.ds.synced, "synced")
    assert names(env.ds) == ["p1-rank-0", "p1-rank-1"]
    assert hostports(env.ds) == ["127.0.0.2:8000", "127.0.0.2:8001"]
    assert env.sync_states[-1] is True


async def test_scale_up_down_readiness_and_ip_change(env: Env) -> None:
    env.fake.create("inferencepools", pool())
    env.fake.create("pods", pod("p1", "127.0.0.2"))
    env.watcher.start()
    await wait_for(lambda: hostports(env.ds) == ["127.0.0.2:8000"], "initial pod")

    env.fake.create("pods", pod("p2", "127.0.0.3"))
    env.fake.create("pods", pod("p3", "127.0.0.4"))
    await wait_for(lambda: len(env.ds) == 3, "scale up")
    env.fake.delete("pods", NS, "p3")
    await wait_for(lambda: hostports(env.ds) == ["127.0.0.2:8000", "127.0.0.3:8000"], "scale down")

    env.fake.update("pods", pod("p2", "127.0.0.3", ready=False))
    await wait_for(lambda: hostports(env.ds) == ["127.0.0.2:8000"], "p2 unready")
    env.fake.update("pods", pod("p2", "127.0.0.3", ready=True))
    await wait_for(lambda: len(env.ds) == 2, "p2 ready again")

    env.fake.update("pods", pod("p1", "127.0.0.5"))
    await wait_for(lambda: hostports(env.ds) == ["127.0.0.3:8000", "127.0.0.5:8000"], "p1 new IP")
    assert names(env.ds) == ["p1-rank-0", "p2-rank-0"]

    env.fake.update("pods", pod("p1", "127.0.0.5", labels={"app": "moved"}))
    await wait_for(lambda: names(env.ds) == ["p2-rank-0"], "p1 relabelled out of the pool")


async def test_dropped_watch_resumes_without_loss_or_duplication(env: Env) -> None:
    env.fake.create("inferencepools", pool())
    for i in range(3):
        env.fake.create("pods", pod(f"p{i}", f"127.0.0.{i + 2}"))
    env.watcher.start()
    await wait_for(lambda: len(env.ds) == 3, "initial pods")
    await wait_for(lambda: env.fake.open_watches("pods") == 1, "pod watch open")
    lists, watches = env.fake.count("pods", "list"), env.fake.count("pods", "watch")

    env.fake.drop_watches()
    env.fake.create("pods", pod("p9", "127.0.0.20"))
    env.fake.delete("pods", NS, "p0")
    env.fake.update("pods", pod("p1", "127.0.0.21"))
    expected = ["127.0.0.20:8000", "127.0.0.21:8000", "127.0.0.4:8000"]
    await wait_for(lambda: hostports(env.ds) == expected, "changes made while disconnected")
    await wait_for(lambda: env.fake.count("pods", "watch") > watches, "reconnected")
    assert env.fake.count("pods", "list") == lists, "resumed from the last resourceVersion, no relist"
    assert len({m.key for m in env.ds.metadata()}) == len(env.ds) == 3

    env.fake.drop_watches()  # again, with nothing changing meanwhile
    await wait_for(lambda: env.fake.count("pods", "watch") > watches + 1, "reconnected again")
    env.fake.create("pods", pod("p10", "127.0.0.22"))
    await wait_for(lambda: len(env.ds) == 4, "event after the second reconnect")


@pytest.mark.parametrize("gone_as_http", [False, True], ids=["error-event", "http-410"])
async def test_gone_relists(env: Env, gone_as_http: bool) -> None:
    env.fake.gone_as_http = gone_as_http
    env.fake.create("inferencepools", pool())
    env.fake.create("pods", pod("p1", "127.0.0.2"))
    env.fake.create("pods", pod("p2", "127.0.0.3"))
    env.watcher.start()
    await wait_for(lambda: len(env.ds) == 2, "initial pods")
    await wait_for(lambda: env.fake.open_watches() == 2, "watches open")
    lists = env.fake.count("pods", "list")

    # a change the watches never see (another namespace) moves the version on; then history is compacted
    env.fake.create("pods", {**pod("elsewhere", "127.0.0.9"), "metadata": {"name": "x", "namespace": "other"}})
    env.fake.compact()
    env.fake.drop_watches()
    env.fake.delete("pods", NS, "p1")
    env.fake.create("pods", pod("p3", "127.0.0.4"))
    await wait_for(lambda: env.fake.count("pods", "list") > lists, "relist after 410")
    await wait_for(lambda: hostports(env.ds) == ["127.0.0.3:8000", "127.0.0.4:8000"], "state after relist")
    assert env.ds.synced


async def test_bookmark_moves_the_resume_point(env: Env) -> None:
    env.fake.create("inferencepools", pool())
    env.fake.create("pods", pod("p1", "127.0.0.2"))
    env.watcher.start()
    await wait_for(lambda: len(env.ds) == 1, "initial pod")
    await wait_for(lambda: env.fake.open_watches() == 2, "watches open")
    lists = env.fake.count("pods", "list")
    env.fake.create("pods", {**pod("x", "127.0.0.9"), "metadata": {"name": "x", "namespace": "other"}})
    env.fake.send_bookmark()
    await wait_for(lambda: env.watcher.resource_versions().get("pods") == str(env.fake.resource_version), "bookmark")
    env.fake.compact()
    env.fake.drop_watches()
    env.fake.create("pods", pod("p2", "127.0.0.3"))
    await wait_for(lambda: len(env.ds) == 2, "event after reconnect")
    assert env.fake.count("pods", "list") == lists, "bookmark version was current: no 410, no relist"


async def test_selector_edit_reselects_pods(env: Env) -> None:
    env.fake.create("inferencepools", pool({"app": "a"}))
    env.fake.create("pods", pod("a1", "127.0.0.2", labels={"app": "a"}))
    env.fake.create("pods", pod("b1", "127.0.0.3", labels={"app": "b"}))
    env.watcher.start()
    await wait_for(lambda: names(env.ds) == ["a1-rank-0"], "selector a")
    env.fake.update("inferencepools", pool({"app": "b"}))
    await wait_for(lambda: names(env.ds) == ["b1-rank-0"], "selector b")
    env.fake.create("pods", pod("b2", "127.0.0.4", labels={"app": "b"}))
    env.fake.create("pods", pod("a2", "127.0.0.5", labels={"app": "a"}))
    await wait_for(lambda: names(env.ds) == ["b1-rank-0", "b2-rank-0"], "new b pod watched")
    env.fake.update("inferencepools", pool({"app": "b"}, ports=(8000, 8001)))
    await wait_for(lambda: len(env.ds) == 4, "target ports added")


async def test_pool_deleted_clears_and_pool_created_later(env: Env) -> None:
    env.fake.create("pods", pod("p1", "127.0.0.2"))
    env.watcher.start()
    await wait_for(lambda: env.fake.count("inferencepools", "list") >= 1 and env.sync_states == [False], "no pool")
    assert len(env.ds) == 0 and not env.ds.synced

    env.fake.create("inferencepools", pool())
    await wait_for(lambda: names(env.ds) == ["p1-rank-0"], "pool created later")
    assert env.ds.synced

    env.fake.delete("inferencepools", NS, "pool")
    await wait_for(lambda: len(env.ds) == 0 and not env.ds.synced, "pool deleted")
    assert env.sync_states[-1] is False

    env.fake.create("inferencepools", pool(ports=(8001,)))
    await wait_for(lambda: hostports(env.ds) == ["127.0.0.2:8001"], "pool recreated")


async def test_other_pools_are_ignored(env: Env) -> None:
    env.fake.create("inferencepools", pool({"app": "other"}, name="another"))
    env.fake.create("pods", pod("p1", "127.0.0.2", labels={"app": "other"}))
    env.watcher.start()
    await wait_for(lambda: env.sync_states == [False], "pool missing")
    env.fake.create("inferencepools", pool())
    env.fake.create("pods", pod("p2", "127.0.0.3"))
    await wait_for(lambda: names(env.ds) == ["p2-rank-0"], "own pool only")
