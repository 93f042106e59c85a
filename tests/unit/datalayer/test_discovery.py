"""Endpoint discovery from a `dataLayer.discovery` plugin's file: loaded at start into the datastore,
reloaded on change with `watchFile` (entries added, changed and removed), a broken edit keeps the last good
endpoints, and the EPP's composition root runs without Kubernetes discovery when one is configured."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from llm_epp.app import StartupError, build
from llm_epp.config import load_config_text
from llm_epp.datalayer.datastore import Datastore
from llm_epp.datalayer.discovery import DiscoveryError, DiscoveryFileWatcher
from llm_epp.framework import EndpointKey, NullRecorder
from llm_epp.options import Options
from llm_epp.plugins import builtin_registry

CONFIG = """
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: file-discovery
  parameters:
    path: {path}
    watchFile: {watch}
- type: queue-scorer
dataLayer:
  discovery:
    pluginRef: file-discovery
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
"""


def write(path: Path, text: str, bump: int = 0) -> None:
    path.write_text(text)
    st = path.stat()
    os.utime(path, (st.st_atime + bump, st.st_mtime + bump))  # a distinct mtime even within one clock tick


def watcher(path: Path, watch: bool = True) -> tuple[DiscoveryFileWatcher, Datastore]:
    config = load_config_text(CONFIG.format(path=path, watch=str(watch).lower()), builtin_registry(), NullRecorder())
    assert config.discovery is not None
    ds = Datastore()
    return DiscoveryFileWatcher(config.discovery, ds), ds


def names(ds: Datastore) -> list[str]:
    return sorted(str(m.key) for m in ds.metadata())


def test_load_then_reload_on_change(tmp_path: Path) -> None:
    f = tmp_path / "endpoints.yaml"
    write(f, 'endpoints:\n- {name: a, address: 10.0.0.1, port: "8000"}\n- {name: b, address: 10.0.0.2, port: "8000"}\n')
    w, ds = watcher(f)
    w.load()
    assert names(ds) == ["default/a", "default/b"] and ds.synced
    assert not w.poll_once()  # unchanged
    write(
        f, 'endpoints:\n- {name: b, address: 10.0.0.9, port: "8001"}\n- {name: c, address: 10.0.0.3, port: "8000"}\n', 5
    )
    assert w.poll_once()
    assert names(ds) == ["default/b", "default/c"]
    b = next(m for m in ds.metadata() if m.key == EndpointKey("default", "b"))
    assert (b.address, b.port) == ("10.0.0.9", 8001)
    write(f, "endpoints: [broken", 10)
    assert not w.poll_once()
    assert names(ds) == ["default/b", "default/c"]  # the last good endpoints stay
    f.unlink()
    assert not w.poll_once()
    assert names(ds) == ["default/b", "default/c"]


def test_a_bad_entry_is_skipped_and_logged(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    f = tmp_path / "endpoints.yaml"
    write(f, 'endpoints:\n- {name: a, address: 10.0.0.1, port: "8000"}\n- {name: b, address: nope, port: "8000"}\n')
    w, ds = watcher(f)
    w.load()
    assert names(ds) == ["default/a"]
    assert "endpoint 'b': invalid IPv4 address \"nope\"" in caplog.text


def test_a_file_that_cannot_be_used_at_start_is_fatal(tmp_path: Path) -> None:
    w, _ = watcher(tmp_path / "missing.yaml")
    with pytest.raises(DiscoveryError, match="cannot read"):
        w.load()
    big = tmp_path / "big.yaml"
    write(big, "endpoints: []\n" + "#" * (1 << 20))
    w, _ = watcher(big)
    with pytest.raises(DiscoveryError, match="1 MiB"):
        w.load()


async def test_without_watch_file_the_file_is_read_once(tmp_path: Path) -> None:
    f = tmp_path / "endpoints.yaml"
    write(f, 'endpoints:\n- {name: a, address: 10.0.0.1, port: "8000"}\n')
    w, ds = watcher(f, watch=False)
    w.load()
    write(f, "endpoints: []\n", 5)
    await w.run()  # returns at once: nothing to watch
    assert names(ds) == ["default/a"]


def test_the_app_takes_its_endpoints_from_the_discovery_plugin(tmp_path: Path) -> None:
    f = tmp_path / "endpoints.yaml"
    write(f, 'endpoints:\n- {name: a, address: 10.0.0.1, port: "8000"}\n')
    text = CONFIG.format(path=f, watch="true")
    c = build(Options(config_text=text, pool_name="my-pool"))
    assert c.discovery is not None
    assert names(c.datastore) == ["default/a"]
    assert c.datastore.pool_name == "my-pool"
    assert build(Options(config_text=text)).datastore.pool_name == "epp"
    with pytest.raises(StartupError, match="remove --endpoints"):
        build(Options(config_text=text, endpoints="10.0.0.1:8000"))
    with pytest.raises(StartupError, match="no endpoint source"):
        build(Options(config_text="plugins: [{type: queue-scorer}]"))
    f.unlink()
    with pytest.raises(StartupError, match=r"dataLayer\.discovery"):
        build(Options(config_text=text))
