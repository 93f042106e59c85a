"""Tests for topology-extractor (pure part): topology from endpoint labels, the spec.hostname fallback from Pod
events, and the sources it wires itself."""

from __future__ import annotations

from typing import Any

from llm_epp.framework import EndpointKey, EndpointMetadata
from llm_epp.framework.datalayer import (
    EVENT_ADD_OR_UPDATE,
    EVENT_DELETE,
    EndpointEvent,
    EndpointEventExtractor,
    ObjectEvent,
    ObjectEventExtractor,
)
from llm_epp.plugins.datalayer.topology_extractor import POD, Params, Topology, TopologyExtractor, topology_key

KEY = "Topology/topology-extractor"
LABELS = {
    "kubernetes.io/hostname": "node-a",
    "topology.kubernetes.io/rack": "r1",
    "topology.kubernetes.io/zone": "z1",
    "topology.kubernetes.io/region": "eu",
}


def md(name: str, labels: dict[str, str] | None = None) -> EndpointMetadata:
    return EndpointMetadata(EndpointKey("ns", name), "10.0.0.1", 8000, labels=labels or {})


def add(ex: TopologyExtractor, m: EndpointMetadata) -> Any:
    return ex.extract_endpoint_event(EndpointEvent(EVENT_ADD_OR_UPDATE, m))


def pod(name: str, hostname: str, ready: str = "True") -> ObjectEvent:
    return ObjectEvent(
        EVENT_ADD_OR_UPDATE,
        {
            "metadata": {"name": name, "namespace": "ns"},
            "spec": {"hostname": hostname},
            "status": {"conditions": [{"type": "Ready", "status": ready}]},
        },
    )


def test_topology_from_the_standard_labels() -> None:
    ex = TopologyExtractor("topology-extractor", Params())
    assert isinstance(ex, EndpointEventExtractor) and isinstance(ex.pods, ObjectEventExtractor)
    assert topology_key() == KEY == ex.key
    assert add(ex, md("p-rank-0", LABELS)) == {
        EndpointKey("ns", "p-rank-0"): {KEY: Topology("node-a", "r1", "z1", "eu")}
    }
    assert add(ex, md("q-rank-0")) == {EndpointKey("ns", "q-rank-0"): {KEY: None}}  # nothing known: no attribute


def test_custom_labels_and_the_instance_name_in_the_key() -> None:
    ex = TopologyExtractor("topo", Params(hostname="example.com/node", zone="example.com/az"))
    updates = add(ex, md("p", {"example.com/node": "n7", "example.com/az": "az-2", "kubernetes.io/hostname": "x"}))
    assert updates == {EndpointKey("ns", "p"): {"Topology/topo": Topology("n7", "", "az-2", "")}}


def test_without_the_hostname_label_the_ready_pods_spec_hostname_is_used() -> None:
    ex = TopologyExtractor("topology-extractor", Params())
    zone_only = {"topology.kubernetes.io/zone": "z1"}
    r0, r1 = md("vllm-0-rank-0", zone_only), md("vllm-0-rank-1", zone_only)
    assert add(ex, r0) == {r0.key: {KEY: Topology("", "", "z1", "")}}
    add(ex, r1)
    # the pod turns ready: both ranks get its hostname, zone kept
    assert ex.pods.extract_object_event(pod("vllm-0", "host-7")) == {
        r0.key: {KEY: Topology("host-7", "", "z1", "")},
        r1.key: {KEY: Topology("host-7", "", "z1", "")},
    }
    # an endpoint of that pod added later takes the cached hostname at once
    r2 = md("vllm-0-rank-2")
    assert add(ex, r2) == {r2.key: {KEY: Topology("host-7", "", "", "")}}
    assert ex.extract_endpoint_event(EndpointEvent(EVENT_DELETE, r2)) == {}
    # a pod that is not ready, or deleted, is forgotten
    assert ex.pods.extract_object_event(pod("vllm-0", "host-7", ready="False")) == {}
    assert add(ex, md("vllm-0-rank-3")) == {EndpointKey("ns", "vllm-0-rank-3"): {KEY: None}}
    assert ex.pods.extract_object_event(pod("other", "")) == {}


def test_it_wires_an_endpoint_source_and_a_pod_source() -> None:
    ex = TopologyExtractor("topo", Params())
    endpoint_dep, pod_dep = ex.data_dependencies()
    assert (endpoint_dep.source_type, endpoint_dep.extractor) == ("endpoint-notification-source", ex)
    assert (pod_dep.source_type, pod_dep.extractor, pod_dep.gvk) == ("k8s-notification-source", ex.pods, POD)
    assert pod_dep.default_source.gvk == POD
    assert pod_dep.default_source.typed_name.name == "topo/pod"
