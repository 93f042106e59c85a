"""Endpoint notification sources: the datastore's membership changes become endpoint events handed to the
extractors listed under `endpoint-notification-source` (the precise prefix-cache producer follows the pool
at once, subscribing to a joining pod's KV events before any request; topology-extractor publishes each
endpoint's topology), and an extractor that raises is isolated."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import zmq

from llm_epp.config import load_config_text
from llm_epp.datalayer.datastore import Datastore
from llm_epp.datalayer.notifications import EndpointEvents
from llm_epp.datalayer.runtime import build_data_layer
from llm_epp.framework import Endpoint, EndpointKey, EndpointMetadata, NullRecorder, TypedName
from llm_epp.framework.datalayer import EVENT_ADD_OR_UPDATE, EVENT_DELETE, EndpointEvent
from llm_epp.kvcache import InMemoryKVIndex
from llm_epp.plugins import builtin_registry
from llm_epp.plugins.datalayer.endpoint_notification_source import EndpointNotificationSource
from llm_epp.plugins.datalayer.topology_extractor import Topology
from llm_epp.plugins.requestcontrol.precise_prefix_cache_producer import Params, PrecisePrefixCacheProducer
from tests.unit.builders import FakeHandle

HEAD = "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\n"


def md(name: str, address: str = "10.0.0.1", port: int = 8000, **labels: str) -> EndpointMetadata:
    return EndpointMetadata(EndpointKey("ns", name), address, port, labels=labels)


@dataclass
class Recording:
    typed_name: TypedName = field(default_factory=lambda: TypedName("recording", "recording"))
    seen: list[tuple[str, str]] = field(default_factory=list)
    fail: bool = False

    def extract_endpoint_event(self, event: EndpointEvent) -> dict[EndpointKey, dict[str, object]]:
        self.seen.append((event.type, event.endpoint.key.name))
        if self.fail:
            raise RuntimeError("boom")
        return {event.endpoint.key: {"seen/recording": len(self.seen)}}


class Errors:
    def __init__(self) -> None:
        self.extract: list[tuple[str, str]] = []

    def datalayer_poll_error(self, source_type: str) -> None:
        raise AssertionError("no polls here")

    def datalayer_extract_error(self, source_type: str, extractor_type: str) -> None:
        self.extract.append((source_type, extractor_type))


def test_membership_changes_become_endpoint_events() -> None:
    ds = Datastore()
    ds.replace_all([md("a")])
    rec, broken = Recording(), Recording(TypedName("broken", "broken"), fail=True)
    errors = Errors()
    events = EndpointEvents(ds, [(EndpointNotificationSource(), [broken, rec])], errors)
    events.start()  # endpoints already known are announced
    assert rec.seen == [(EVENT_ADD_OR_UPDATE, "a")]
    ds.upsert(md("b"))
    ds.upsert(md("a", address="10.0.0.9"))  # changed metadata: an update
    ds.upsert(md("a", address="10.0.0.9"))  # unchanged: nothing
    ds.delete(EndpointKey("ns", "b"))
    assert rec.seen == [
        (EVENT_ADD_OR_UPDATE, "a"),
        (EVENT_ADD_OR_UPDATE, "b"),
        (EVENT_ADD_OR_UPDATE, "a"),
        (EVENT_DELETE, "b"),
    ]
    assert ds.snapshot()[0].attributes == {"seen/recording": 3}  # what the extractor returned is published
    assert errors.extract == [("endpoint-notification-source", "broken")] * 4  # the broken one did not stop it


def test_topology_extractor_stamps_endpoints_through_the_configured_source() -> None:
    text = HEAD + (
        "plugins:\n- type: endpoint-notification-source\n- type: topology-extractor\n- type: queue-scorer\n"
        "dataLayer:\n  sources:\n  - pluginRef: endpoint-notification-source\n"
    )
    loaded = load_config_text(text, builtin_registry(), NullRecorder())
    ds = Datastore()
    layer = build_data_layer(ds, [(b.source, b.extractors) for b in loaded.data_sources])
    assert layer.endpoint_events is not None
    assert [o.source.typed_name.name for o in layer.object_events] == ["topology-extractor/pod"]  # added by it
    layer.start_events()
    ds.replace_all([md("p-rank-0", **{"kubernetes.io/hostname": "n1", "topology.kubernetes.io/zone": "z"})])
    (e,) = ds.snapshot()
    assert e.attributes == {"Topology/topology-extractor": Topology("n1", "", "z", "")}


class PoolHandle(FakeHandle):
    def __init__(self, ds: Datastore) -> None:
        super().__init__()
        self.ds = ds

    def endpoints(self) -> Sequence[Endpoint]:
        return self.ds.snapshot()


async def test_the_precise_producer_subscribes_to_a_joining_pod_before_any_request() -> None:
    ctx = zmq.Context()
    pubs = [ctx.socket(zmq.PUB) for _ in range(2)]
    ports = []
    for pub in pubs:
        pub.setsockopt(zmq.LINGER, 0)
        ports.append(pub.bind_to_random_port("tcp://127.0.0.2" if ports else "tcp://127.0.0.1"))
    ds = Datastore()
    params = builtin_registry().parse_params(
        "precise-prefix-cache-producer", {"kvEventsConfig": {"podDiscoveryConfig": {"socketPort": ports[0]}}}
    )
    assert isinstance(params, Params)
    index = InMemoryKVIndex("x", params.settings())
    producer = PrecisePrefixCacheProducer("precise", params, PoolHandle(ds), index=index)
    events = EndpointEvents(ds, [(EndpointNotificationSource(), [producer])])
    try:
        events.start()
        ds.upsert(md("a", "127.0.0.1"))
        ds.upsert(md("b", "127.0.0.2"))
        await until(lambda: index.runner.subscribed() == ["127.0.0.1:8000", "127.0.0.2:8000"])
        ds.delete(EndpointKey("ns", "b"))  # leaves: its subscriber stops at once
        await until(lambda: index.runner.subscribed() == ["127.0.0.1:8000"])
    finally:
        index.stop()
        for pub in pubs:
            pub.close(0)
        ctx.destroy(0)


async def until(check: object) -> None:
    deadline = time.monotonic() + 5
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition never held"
        await asyncio.sleep(0.02)
