"""topology-extractor

Scheduling intent:
    Stamp every endpoint with where it runs (host, rack, zone, region), as the endpoint attribute
    `Topology/<plugin name>`, so `topology-affinity-filter` / `-scorer` can keep a P/D pair close (the
    prefill pod on the decode pod's host for NVLink, else its rack, zone or region).

Inputs consumed:
    Endpoint events (from an `endpoint-notification-source`): the endpoint's labels named by the
    parameters. When the hostname label is absent, Pod events (from a `k8s-notification-source` of core/v1
    Pod): a ready pod's `spec.hostname` is used for all endpoints of that pod; a deleted or not-ready pod's
    is forgotten. Zone, rack and region have no such fallback. An endpoint with none of the four gets no
    attribute.

    Both sources are wired by the plugin itself: a configured source of each type is used (the Kubernetes
    one only if it watches Pods), otherwise one is added. Without Kubernetes discovery (`--endpoints`,
    endpoint files, `file-discovery`) the added Pod source does not run and only labels count.

Configuration:
    hostname (default `kubernetes.io/hostname`), rack (default `topology.kubernetes.io/rack`), zone (default
    `topology.kubernetes.io/zone`), region (default `topology.kubernetes.io/region`): the endpoint label
    holding each level; an empty value means the default.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from llm_epp.framework import EndpointKey, EndpointMetadata, Handle, PluginParams, TypedName
from llm_epp.framework.datalayer import (
    EVENT_DELETE,
    AttributeUpdates,
    DataDependency,
    EndpointEvent,
    GroupVersionKind,
    ObjectEvent,
)
from llm_epp.plugins.datalayer import endpoint_notification_source, k8s_notification_source
from llm_epp.plugins.datalayer._attributes import attribute_key
from llm_epp.plugins.datalayer.dcgm_extractor import pod_name

TYPE = "topology-extractor"
ATTRIBUTE = "Topology"
HOSTNAME_LABEL = "kubernetes.io/hostname"
RACK_LABEL = "topology.kubernetes.io/rack"
ZONE_LABEL = "topology.kubernetes.io/zone"
REGION_LABEL = "topology.kubernetes.io/region"
POD = GroupVersionKind("", "v1", "Pod")


@dataclass(frozen=True, slots=True)
class Topology:
    """Where an endpoint runs; "" where unknown."""

    hostname: str = ""
    rack: str = ""
    zone: str = ""
    region: str = ""


def topology_key(producer: str = TYPE) -> str:
    """The attribute the topology of `producer` (a topology-extractor's name) is stored under."""
    return attribute_key(ATTRIBUTE, producer or TYPE)


class Params(PluginParams):
    hostname: str = ""
    rack: str = ""
    zone: str = ""
    region: str = ""


def _pod_ready(obj: Mapping[str, object]) -> bool:
    status = obj.get("status")
    conditions = status.get("conditions") if isinstance(status, Mapping) else None
    for cond in conditions if isinstance(conditions, list) else []:
        if isinstance(cond, Mapping) and cond.get("type") == "Ready":
            return cond.get("status") == "True"
    return False


class _PodHandler:
    """The Pod-event side of the extractor (listed under the Pod notification source)."""

    def __init__(self, owner: TopologyExtractor) -> None:
        self._owner = owner
        self._typed_name = TypedName(TYPE, f"{owner.typed_name.name}/pod")

    @property
    def typed_name(self) -> TypedName:
        return self._typed_name

    @property
    def gvk(self) -> GroupVersionKind:
        return POD

    def extract_object_event(self, event: ObjectEvent) -> AttributeUpdates:
        return self._owner.pod_event(event)


class TopologyExtractor:
    def __init__(self, name: str, params: Params) -> None:
        self._typed_name = TypedName(TYPE, name)
        self.hostname_label = params.hostname or HOSTNAME_LABEL
        self.rack_label = params.rack or RACK_LABEL
        self.zone_label = params.zone or ZONE_LABEL
        self.region_label = params.region or REGION_LABEL
        self.key = topology_key(name)
        self.pods = _PodHandler(self)
        # endpoints without the hostname label, by pod: they take the pod's spec.hostname
        self._waiting: dict[tuple[str, str], dict[EndpointKey, Topology]] = {}
        self._hostnames: dict[tuple[str, str], str] = {}  # ready pods' spec.hostname

    @property
    def typed_name(self) -> TypedName:
        return self._typed_name

    def data_dependencies(self) -> tuple[DataDependency, ...]:
        return (
            DataDependency(
                endpoint_notification_source.TYPE,
                self,
                endpoint_notification_source.EndpointNotificationSource(),
            ),
            DataDependency(
                k8s_notification_source.TYPE,
                self.pods,
                k8s_notification_source.K8sNotificationSource(f"{self._typed_name.name}/pod", POD),
                POD,
            ),
        )

    def extract_endpoint_event(self, event: EndpointEvent) -> AttributeUpdates:
        md = event.endpoint
        pod = _pod_of(md)
        if event.type == EVENT_DELETE:
            waiting = self._waiting.get(pod)
            if waiting is not None:
                waiting.pop(md.key, None)
                if not waiting:
                    del self._waiting[pod]
            return {}
        labels = md.labels
        topo = Topology(
            labels.get(self.hostname_label, ""),
            labels.get(self.rack_label, ""),
            labels.get(self.zone_label, ""),
            labels.get(self.region_label, ""),
        )
        if not topo.hostname:
            self._waiting.setdefault(pod, {})[md.key] = topo
            topo = Topology(self._hostnames.get(pod, ""), topo.rack, topo.zone, topo.region)
        else:
            self._drop_waiting(pod, md.key)
        if topo == Topology():
            return {md.key: {self.key: None}}
        return {md.key: {self.key: topo}}

    def pod_event(self, event: ObjectEvent) -> AttributeUpdates:
        pod = (event.namespace, event.name)
        if event.type == EVENT_DELETE or not _pod_ready(event.object):
            self._hostnames.pop(pod, None)
            return {}
        spec = event.object.get("spec")
        hostname = spec.get("hostname") if isinstance(spec, Mapping) else None
        if not isinstance(hostname, str) or not hostname:
            return {}
        self._hostnames[pod] = hostname
        return {
            key: {self.key: Topology(hostname, t.rack, t.zone, t.region)}
            for key, t in self._waiting.get(pod, {}).items()
        }

    def _drop_waiting(self, pod: tuple[str, str], key: EndpointKey) -> None:
        waiting = self._waiting.get(pod)
        if waiting is not None and waiting.pop(key, None) is not None and not waiting:
            del self._waiting[pod]


def _pod_of(md: EndpointMetadata) -> tuple[str, str]:
    return (md.key.namespace, pod_name(md))


def factory(name: str, params: Params, handle: Handle) -> TopologyExtractor:
    return TopologyExtractor(name, params)
