"""The watch behind k8s-notification-source, with the real `kubernetes` client against the in-test API server:
pods listed, added, changed and deleted become object events on the event loop; an update that keeps the
resourceVersion gives none; after a dropped watch and a compaction the relist reports what changed meanwhile
(deletions too). Through the data layer, topology-extractor takes a ready pod's spec.hostname."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from llm_epp.config import load_config_text
from llm_epp.datalayer.datastore import Datastore
from llm_epp.datalayer.runtime import build_data_layer
from llm_epp.framework import EndpointKey, EndpointMetadata, NullRecorder
from llm_epp.framework.datalayer import GroupVersionKind, ObjectEvent
from llm_epp.k8s.notifications import ObjectWatcher
from llm_epp.plugins import builtin_registry
from llm_epp.plugins.datalayer.topology_extractor import Topology
from tests.support.fake_apiserver import FakeApiServer

POD = GroupVersionKind("", "v1", "Pod")


def pod(name: str, hostname: str = "", ready: bool = True, namespace: str = "ns") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": "vllm"}},
        "spec": {"hostname": hostname} if hostname else {},
        "status": {"podIP": "10.0.0.1", "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


async def until(check: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 10
    while not check():
        assert time.monotonic() < deadline, "condition never held"
        await asyncio.sleep(0.02)


async def test_list_watch_relist() -> None:
    with FakeApiServer() as server:
        server.create("pods", pod("p1"))
        server.create("pods", pod("elsewhere", namespace="other"))
        got: list[ObjectEvent] = []
        w = ObjectWatcher(server.api_client(), "ns", POD, asyncio.get_running_loop(), got.append, backoff_initial=0.05)
        w.start()
        try:
            await until(lambda: [(e.type, e.name) for e in got] == [("add-or-update", "p1")])
            assert w.path == "/api/v1/namespaces/ns/pods"
            server.create("pods", pod("p2", hostname="h2"))
            server.update("pods", pod("p1", hostname="h1"))
            server.delete("pods", "ns", "p2")
            await until(lambda: len(got) == 4)
            assert [(e.type, e.name) for e in got[1:]] == [
                ("add-or-update", "p2"),
                ("add-or-update", "p1"),
                ("delete", "p2"),
            ]
            assert got[2].object["spec"] == {"hostname": "h1"}  # the whole object
            # the watch drops; meanwhile p1 goes and p3 comes, and the versions are compacted: a relist
            server.drop_watches()
            server.delete("pods", "ns", "p1")
            server.create("pods", pod("p3"))
            server.compact()
            await until(lambda: {(e.type, e.name) for e in got[4:]} == {("delete", "p1"), ("add-or-update", "p3")})
            assert server.count("pods", "list") >= 2
        finally:
            await asyncio.to_thread(w.stop)


async def test_topology_from_pod_events_through_the_data_layer() -> None:
    text = (
        "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\n"
        "plugins:\n- {name: pods, type: k8s-notification-source, parameters: {version: v1, kind: Pod}}\n"
        "- type: topology-extractor\n- type: queue-scorer\n"
        "dataLayer:\n  sources:\n  - pluginRef: pods\n"
    )
    loaded = load_config_text(text, builtin_registry(), NullRecorder())
    ds = Datastore()
    layer = build_data_layer(ds, [(b.source, b.extractors) for b in loaded.data_sources])
    (pods,) = layer.object_events
    layer.start_events()
    key = EndpointKey("ns", "vllm-0-rank-0")
    ds.replace_all([EndpointMetadata(key, "10.0.0.1", 8000, labels={"topology.kubernetes.io/zone": "z1"})])
    assert ds.snapshot()[0].attributes == {"Topology/topology-extractor": Topology("", "", "z1", "")}
    with FakeApiServer() as server:
        server.create("pods", pod("vllm-0", hostname="node-7"))
        w = ObjectWatcher(server.api_client(), "ns", pods.source.gvk, asyncio.get_running_loop(), pods.dispatch)
        w.start()
        try:
            await until(
                lambda: (
                    ds.snapshot()[0].attributes.get("Topology/topology-extractor") == Topology("node-7", "", "z1", "")
                )
            )
        finally:
            await asyncio.to_thread(w.stop)
