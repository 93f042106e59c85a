"""Standalone mode: flag parsing, and SelectorWatcher against the in-test API server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from llm_epp.datalayer.datastore import Datastore
from llm_epp.k8s.discovery import PoolSpec
from llm_epp.k8s.selector import (
    EndpointSelectorError,
    SelectorWatcher,
    parse_endpoint_selector,
    parse_target_ports,
    standalone_pool_spec,
)
from tests.support.fake_apiserver import FakeApiServer
from tests.unit.k8s.test_watcher import NS, hostports, names, pod, wait_for


def test_parse_selector() -> None:
    assert parse_endpoint_selector("app=model") == (("app", "model"),)
    assert parse_endpoint_selector("tier=gpu,app=model,app=model") == (("app", "model"), ("tier", "gpu"))
    assert parse_endpoint_selector("example.com/role=serve,k=") == (("example.com/role", "serve"), ("k", ""))


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("", "must not be empty"),
        ("app = model", "whitespace"),
        ("app", "not of the form key=value"),
        ("=x", "not of the form key=value"),
        ("app==model", "not of the form key=value"),
        ("app!=model", "not of the form key=value"),
        ("app=model,", "not of the form key=value"),
        ("a=b=c", "not of the form key=value"),
        ("-app=x", "label key name"),
        ("Bad_Prefix/app=x", "DNS subdomain"),
        ("app=-x", "label value"),
        ("app=" + "x" * 64, "label value"),
        ("app=a,app=b", "given twice"),
    ],
)
def test_parse_selector_errors(text: str, fragment: str) -> None:
    with pytest.raises(EndpointSelectorError, match="--endpoint-selector") as info:
        parse_endpoint_selector(text)
    assert fragment in str(info.value)


def test_parse_ports() -> None:
    assert parse_target_ports("8000") == (8000,)
    assert parse_target_ports("8001,8000,8001") == (8001, 8000)
    assert parse_target_ports(["8000,8001", 8002]) == (8000, 8001, 8002)
    assert parse_target_ports(",".join(str(8000 + i % 8) for i in range(20))) == tuple(range(8000, 8008))
    assert parse_target_ports("1,65535") == (1, 65535)


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("", "empty entry"),
        ([], "at least one port"),
        ("8000,", "empty entry"),
        ("0", "not a port number"),
        ("65536", "not a port number"),
        ("-1", "not a port number"),
        ("http", "not a port number"),
        (",".join(str(8000 + i) for i in range(9)), "9 distinct ports given; at most 8"),
    ],
)
def test_parse_ports_errors(value: Any, fragment: str) -> None:
    with pytest.raises(EndpointSelectorError, match="--endpoint-target-ports") as info:
        parse_target_ports(value)
    assert fragment in str(info.value)


def test_standalone_pool_spec() -> None:
    spec = standalone_pool_spec("ns", "app=model", "8000,8001")
    assert spec == PoolSpec("ns", "", (("app", "model"),), (8000, 8001))
    assert spec.label_selector == "app=model"


@pytest.fixture
def fake() -> Any:
    with FakeApiServer() as server:
        yield server


@pytest.fixture
async def watched(fake: FakeApiServer) -> AsyncIterator[tuple[FakeApiServer, Datastore, SelectorWatcher]]:
    api = fake.api_client()
    ds = Datastore("standalone")
    watcher = SelectorWatcher(
        api,
        standalone_pool_spec(NS, "app=model,tier=gpu", "8000,8001"),
        ds,
        asyncio.get_running_loop(),
        watch_timeout=5,
        backoff_initial=0.05,
        backoff_max=0.2,
    )
    try:
        yield fake, ds, watcher
    finally:
        await asyncio.to_thread(watcher.stop)
        await wait_for(lambda: fake.open_watches() == 0, "watches closed after stop()")
        api.close()


async def test_selected_pods_become_endpoints(watched: tuple[FakeApiServer, Datastore, SelectorWatcher]) -> None:
    fake, ds, watcher = watched
    gpu = {"app": "model", "tier": "gpu"}
    fake.create("pods", pod("p1", "127.0.0.2", labels=gpu))
    fake.create("pods", pod("cpu", "127.0.0.3", labels={"app": "model", "tier": "cpu"}))
    fake.create("pods", pod("unready", "127.0.0.4", ready=False, labels=gpu))
    assert not ds.synced
    watcher.start()
    await wait_for(lambda: ds.synced and len(ds) == 2, "initial list")
    assert names(ds) == ["p1-rank-0", "p1-rank-1"]
    assert hostports(ds) == ["127.0.0.2:8000", "127.0.0.2:8001"]
    assert fake.count("inferencepools", "list") == 0 and fake.count("inferencepools", "watch") == 0

    fake.create("pods", pod("p2", "127.0.0.5", labels=gpu))
    await wait_for(lambda: len(ds) == 4, "new pod")
    fake.drop_watches()
    fake.delete("pods", NS, "p1")
    fake.update("pods", pod("unready", "127.0.0.4", labels=gpu))
    await wait_for(lambda: names(ds) == ["p2-rank-0", "p2-rank-1", "unready-rank-0", "unready-rank-1"], "changes")
