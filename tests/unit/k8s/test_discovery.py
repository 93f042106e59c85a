from __future__ import annotations

from typing import Any

import pytest

from llm_epp.framework.types import EndpointKey
from llm_epp.k8s.discovery import ACTIVE_PORTS_ANNOTATION, endpoints_for, is_pod_ready, pool_spec

NS = "default"


def make_pool(labels: dict[str, str] | None = None, ports: tuple[int, ...] = (8000,)) -> dict[str, Any]:
    return {
        "metadata": {"name": "pool", "namespace": NS},
        "spec": {
            "selector": {"matchLabels": {"app": "model"} if labels is None else labels},
            "targetPorts": [{"number": p} for p in ports],
        },
    }


def make_pod(
    name: str = "p1",
    ip: str = "127.0.0.2",
    labels: dict[str, str] | None = None,
    ready: str | None = "True",
    deleting: bool = False,
    annotations: dict[str, str] | None = None,
    namespace: str = NS,
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "labels": {"app": "model"} if labels is None else labels,
    }
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    if annotations:
        meta["annotations"] = annotations
    conditions = [{"type": "PodScheduled", "status": "True"}]
    if ready is not None:
        conditions.append({"type": "Ready", "status": ready})
    return {"metadata": meta, "status": {"podIP": ip, "conditions": conditions}}


@pytest.mark.parametrize(
    ("pod", "ready"),
    [
        (make_pod(), True),
        (make_pod(ready="False"), False),
        (make_pod(ready="Unknown"), False),
        (make_pod(ready=None), False),
        (make_pod(deleting=True), False),
    ],
)
def test_readiness(pod: dict[str, Any], ready: bool) -> None:
    assert is_pod_ready(pod) is ready


CASES: list[tuple[str, dict[str, Any], list[dict[str, Any]], list[tuple[str, str, int]]]] = [
    ("ready pod", make_pool(), [make_pod()], [("p1-rank-0", "127.0.0.2", 8000)]),
    ("not ready", make_pool(), [make_pod(ready="False")], []),
    ("being deleted", make_pool(), [make_pod(deleting=True)], []),
    ("label mismatch", make_pool(), [make_pod(labels={"app": "other"})], []),
    ("missing label", make_pool({"app": "model", "tier": "gpu"}), [make_pod()], []),
    (
        "extra labels fine",
        make_pool(),
        [make_pod(labels={"app": "model", "x": "y"})],
        [("p1-rank-0", "127.0.0.2", 8000)],
    ),
    ("other namespace", make_pool(), [make_pod(namespace="elsewhere")], []),
    ("empty selector selects nothing", make_pool({}), [make_pod()], []),
    (
        "ranks per target port",
        make_pool(ports=(8000, 8001, 8002)),
        [make_pod()],
        [("p1-rank-0", "127.0.0.2", 8000), ("p1-rank-1", "127.0.0.2", 8001), ("p1-rank-2", "127.0.0.2", 8002)],
    ),
    (
        "active ports narrow the ranks",
        make_pool(ports=(8000, 8001, 8002)),
        [make_pod(annotations={ACTIVE_PORTS_ANNOTATION: "8002, 8000,junk,9999"})],
        [("p1-rank-0", "127.0.0.2", 8000), ("p1-rank-2", "127.0.0.2", 8002)],
    ),
    (
        "empty active ports means all",
        make_pool(ports=(8000, 8001)),
        [make_pod(annotations={ACTIVE_PORTS_ANNOTATION: ""})],
        [("p1-rank-0", "127.0.0.2", 8000), ("p1-rank-1", "127.0.0.2", 8001)],
    ),
    (
        "active ports none matching",
        make_pool(ports=(8000,)),
        [make_pod(annotations={ACTIVE_PORTS_ANNOTATION: "9000"})],
        [],
    ),
    (
        "several pods sorted",
        make_pool(),
        [make_pod("p2", "127.0.0.3"), make_pod("p1"), make_pod("p3", "127.0.0.4", ready="False")],
        [("p1-rank-0", "127.0.0.2", 8000), ("p2-rank-0", "127.0.0.3", 8000)],
    ),
    (
        "no pod IP yet",
        make_pool(),
        [{**make_pod(), "status": {"conditions": [{"type": "Ready", "status": "True"}]}}],
        [],
    ),
]


@pytest.mark.parametrize(("pool", "pods", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_endpoints_for(pool: dict[str, Any], pods: list[dict[str, Any]], expected: list[tuple[str, str, int]]) -> None:
    got = endpoints_for(pool_spec(pool), pods)
    assert [(m.key.name, m.address, m.port) for m in got] == expected
    assert all(m.key.namespace == NS for m in got)


def test_engine_and_labels_come_from_the_pod() -> None:
    labels = {"app": "model", "inference.networking.k8s.io/engine-type": "sglang"}
    (sg,) = endpoints_for(pool_spec(make_pool()), [make_pod(labels=labels)])
    assert sg.engine == "sglang"
    assert dict(sg.labels) == labels
    assert sg.key == EndpointKey(NS, "p1-rank-0")
    assert sg.hostport == "127.0.0.2:8000"
    (default,) = endpoints_for(pool_spec(make_pool()), [make_pod()])
    assert default.engine == "vllm"


def test_pool_spec_skips_bad_and_duplicate_ports() -> None:
    pool = make_pool(ports=(8000,))
    pool["spec"]["targetPorts"] = [
        {"number": 8000},
        {"number": 0},
        {"number": "x"},
        {},
        {"number": 8000},
        {"number": 9},
    ]
    spec = pool_spec(pool)
    assert spec.target_ports == (8000, 9)
    assert spec.label_selector == "app=model"
    assert (spec.namespace, spec.name) == (NS, "pool")


def test_the_node_address_comes_from_the_pods_host_ip() -> None:
    pod = make_pod()
    pod["status"]["hostIP"] = "192.168.1.7"
    (md,) = endpoints_for(pool_spec(make_pool()), [pod])
    assert md.node_address == "192.168.1.7"
    (unknown,) = endpoints_for(pool_spec(make_pool()), [make_pod()])
    assert unknown.node_address == ""
