from __future__ import annotations

import os
from pathlib import Path

import pytest

from llm_epp.datalayer import Datastore
from llm_epp.datalayer.static import (
    EndpointsFileWatcher,
    EndpointSourceError,
    parse_endpoint_list,
    parse_endpoints_file,
)


def test_parse_endpoint_list() -> None:
    eps = parse_endpoint_list("127.0.0.1:8001, 127.0.0.1:8002,[::1]:9000")
    assert [e.hostport for e in eps] == ["127.0.0.1:8001", "127.0.0.1:8002", "[::1]:9000"]
    assert eps[2].address == "::1" and eps[2].port == 9000


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("127.0.0.1", "host:port"),
        ("a:b", "not a number"),
        ("h:70000", "1-65535"),
        ("h:1,h:1", "twice"),
        (",", "empty"),
    ],
)
def test_parse_endpoint_list_errors(value: str, fragment: str) -> None:
    with pytest.raises(EndpointSourceError, match=fragment):
        parse_endpoint_list(value)


def test_parse_endpoints_file() -> None:
    text = """
poolName: demo
endpoints:
- name: vllm-0
  address: 10.0.0.1
  port: 8000
  labels: {inference.networking.k8s.io/engine-type: sglang, app: x}
- address: 10.0.0.2
  port: 8000
  engine: vllm
  metricsPath: /custom
"""
    pool, eps = parse_endpoints_file(text, "pool.yaml")
    assert pool == "demo"
    assert eps[0].key.name == "vllm-0" and eps[0].engine == "sglang"
    assert eps[1].key.name == "10.0.0.2:8000" and eps[1].metrics_path == "/custom"


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("endpoints: [{address: a, port: 0}]", "endpoints[0].port"),
        ("endpoints: [{address: a, port: 1, prot: 2}]", "endpoints[0].prot: unknown field"),
        ("endpoints: [{address: a, port: 1, engine: tgi}]", "engine 'tgi'"),
        ("endpoints: [{name: x, address: a, port: 1}, {name: x, address: b, port: 1}]", "used twice"),
        ("endpoints: [", "not valid YAML"),
    ],
)
def test_parse_endpoints_file_errors(text: str, fragment: str) -> None:
    with pytest.raises(EndpointSourceError) as exc:
        parse_endpoints_file(text, "pool.yaml")
    assert fragment in str(exc.value) and "pool.yaml" in str(exc.value)


def _write(path: Path, text: str, bump: int) -> None:
    path.write_text(text)
    st = path.stat()
    os.utime(path, (st.st_atime, st.st_mtime + bump))


def test_watcher_reloads_on_change_and_keeps_last_good_pool(tmp_path: Path) -> None:
    f = tmp_path / "pool.yaml"
    _write(f, "endpoints: [{address: 10.0.0.1, port: 8000}]", 0)
    ds = Datastore()
    w = EndpointsFileWatcher(f, ds)
    w.load()
    assert [e.hostport for e in ds.snapshot()] == ["10.0.0.1:8000"]
    assert not w.poll_once()
    _write(f, "endpoints: [{address: 10.0.0.1, port: 8000}, {address: 10.0.0.2, port: 8000}]", 10)
    assert w.poll_once()
    assert len(ds) == 2
    _write(f, "endpoints: [{address: 10.0.0.1, port: nope}]", 20)
    assert not w.poll_once()
    assert len(ds) == 2
    f.unlink()
    assert not w.poll_once()
    assert len(ds) == 2


def test_the_files_pool_name_names_the_pool_and_follows_reloads(tmp_path: Path) -> None:
    f = tmp_path / "pool.yaml"
    _write(f, "poolName: demo\nendpoints: [{address: 10.0.0.1, port: 8000}]", 0)
    ds = Datastore(pool_name="static")  # what `llm-epp serve` starts with when no name is known
    w = EndpointsFileWatcher(f, ds)
    w.load()
    assert ds.pool_name == "demo"
    _write(f, "poolName: renamed\nendpoints: [{address: 10.0.0.1, port: 8000}]", 10)
    assert w.poll_once()
    assert ds.pool_name == "renamed"
    _write(f, "endpoints: [{address: 10.0.0.2, port: 8000}]", 20)  # no name given: the last one stays
    assert w.poll_once()
    assert ds.pool_name == "renamed"
