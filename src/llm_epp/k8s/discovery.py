"""Pure translation of an InferencePool and its pods (JSON dicts as the API server sends them) into endpoint
metadata: one endpoint per (ready pod, active target port), named `<pod>-rank-<index in targetPorts>`."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from llm_epp.framework.types import EndpointKey, EndpointMetadata

DEFAULT_POOL_GROUP = "inference.networking.k8s.io"
POOL_VERSION = "v1"
POOL_PLURAL = "inferencepools"
ACTIVE_PORTS_ANNOTATION = "inference.networking.k8s.io/active-ports"
ENGINE_LABEL = "inference.networking.k8s.io/engine-type"
DEFAULT_ENGINE = "vllm"


@dataclass(frozen=True)
class PoolSpec:
    """What discovery needs from an InferencePool."""

    namespace: str
    name: str
    match_labels: tuple[tuple[str, str], ...]
    target_ports: tuple[int, ...]

    @property
    def label_selector(self) -> str:
        """The `labelSelector` query value (equality terms joined by commas)."""
        return ",".join(f"{k}={v}" for k, v in self.match_labels)

    def selects(self, labels: Mapping[str, str]) -> bool:
        """An empty selector selects nothing (the CRD requires at least one label)."""
        return bool(self.match_labels) and all(labels.get(k) == v for k, v in self.match_labels)


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def pool_spec(pool: Mapping[str, Any]) -> PoolSpec:
    """Extract selector and target ports; malformed entries are skipped, duplicate ports kept once."""
    meta = _dict(pool.get("metadata"))
    spec = _dict(pool.get("spec"))
    labels = _dict(_dict(spec.get("selector")).get("matchLabels"))
    ports: list[int] = []
    for entry in _list(spec.get("targetPorts")):
        number = _dict(entry).get("number")
        if isinstance(number, int) and not isinstance(number, bool) and 1 <= number <= 65535 and number not in ports:
            ports.append(number)
    return PoolSpec(
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name") or ""),
        match_labels=tuple(sorted((str(k), str(v)) for k, v in labels.items())),
        target_ports=tuple(ports),
    )


def is_pod_ready(pod: Mapping[str, Any]) -> bool:
    """Ready=True condition and not being deleted."""
    if _dict(pod.get("metadata")).get("deletionTimestamp"):
        return False
    for cond in _list(_dict(pod.get("status")).get("conditions")):
        cond = _dict(cond)
        if cond.get("type") == "Ready":
            return cond.get("status") == "True"
    return False


def active_ports(pod: Mapping[str, Any], target_ports: Iterable[int]) -> set[int]:
    """Target ports the pod serves: all of them unless the active-ports annotation narrows them down."""
    ports = set(target_ports)
    raw = _dict(_dict(pod.get("metadata")).get("annotations")).get(ACTIVE_PORTS_ANNOTATION)
    if not isinstance(raw, str) or not raw.strip():
        return ports
    wanted: set[int] = set()
    for item in raw.split(","):
        item = item.strip()
        if item.isdigit():
            wanted.add(int(item))
    return ports & wanted


def endpoints_for(spec: PoolSpec, pods: Iterable[Mapping[str, Any]]) -> list[EndpointMetadata]:
    """Endpoints of ready, selected pods in the pool's namespace, sorted by name for stable output."""
    out: list[EndpointMetadata] = []
    for pod in pods:
        meta = _dict(pod.get("metadata"))
        name = meta.get("name")
        namespace = meta.get("namespace") or spec.namespace
        labels = {str(k): str(v) for k, v in _dict(meta.get("labels")).items()}
        ip = _dict(pod.get("status")).get("podIP")
        if not name or not ip or namespace != spec.namespace or not spec.selects(labels) or not is_pod_ready(pod):
            continue
        active = active_ports(pod, spec.target_ports)
        engine = labels.get(ENGINE_LABEL) or DEFAULT_ENGINE
        host_ip = _dict(pod.get("status")).get("hostIP")
        node = host_ip if isinstance(host_ip, str) else ""
        for idx, port in enumerate(spec.target_ports):
            if port in active:
                out.append(
                    EndpointMetadata(
                        EndpointKey(namespace, f"{name}-rank-{idx}"),
                        str(ip),
                        port,
                        labels=labels,
                        engine=engine,
                        node_address=node,
                    )
                )
    out.sort(key=lambda m: m.key)
    return out
