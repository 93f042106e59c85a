"""A rolling restart of two `llm-epp serve` replicas behind one real Envoy (FailClose) under a steady
stream of requests: replica A gets SIGTERM, drains, exits and is started again on the same ports, then
B the same. No request may fail.

Envoy's `epp` cluster lists both replicas. It moves away from a draining replica through an active gRPC
health check against each replica's health port (`grpc.health.v1.Health`, which reports NOT_SERVING as
soon as the drain starts), with a zero panic threshold so an unhealthy replica gets no new streams.
The drain window (`--drain-timeout`) is longer than the health check interval, so the replica still
serves every stream Envoy opens before it has seen the check fail.
"""

from __future__ import annotations

import signal
import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from llm_epp.gateway.envoy_config import EPP_CLUSTER, EnvoyConfigOptions, build_bootstrap
from llm_epp.gateway.envoy_process import EnvoyProcess
from llm_epp.gateway.epp_process import EppProcess
from llm_epp.sim.stub import BackendPool
from tests.support.wait import wait_until

pytestmark = pytest.mark.envoy

DRAIN = "2s"
CLIENTS = 4


def two_replica_bootstrap(replicas: list[EppProcess], listen_port: int = 0) -> dict[str, Any]:
    """The generated bootstrap with the `epp` cluster widened to every replica, each health-checked over
    gRPC on its health port."""
    opts = EnvoyConfigOptions(
        listen_port=listen_port, admin_port=0, epp_port=replicas[0].grpc_port, epp_tls=False, failure_mode="FailClose"
    )
    doc = build_bootstrap(opts)
    (cluster,) = [c for c in doc["static_resources"]["clusters"] if c["name"] == EPP_CLUSTER]
    cluster["load_assignment"]["endpoints"] = [
        {
            "lb_endpoints": [
                {
                    "endpoint": {
                        "address": {"socket_address": {"address": "127.0.0.1", "port_value": r.grpc_port}},
                        "health_check_config": {"port_value": r.ports["health"]},
                    }
                }
                for r in replicas
            ]
        }
    ]
    cluster["health_checks"] = [
        {
            "timeout": "1s",
            "interval": "0.2s",
            "no_traffic_interval": "0.2s",
            "unhealthy_threshold": 1,
            "healthy_threshold": 1,
            "grpc_health_check": {},
        }
    ]
    cluster["common_lb_config"] = {"healthy_panic_threshold": {"value": 0}}
    return doc


def replica(backends: BackendPool, *ports: str) -> EppProcess:
    return EppProcess(
        "--endpoints", ",".join(backends.addresses), "--secure-serving=false", "--drain-timeout", DRAIN, *ports
    ).start()


def restart_on_same_ports(backends: BackendPool, old: EppProcess) -> EppProcess:
    grpc_port, health_port = old.grpc_port, old.ports["health"]
    proc = old.proc
    assert proc is not None
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    old.stop()
    return replica(backends, "--grpc-port", str(grpc_port), "--grpc-health-port", str(health_port))


@pytest.fixture
def backends() -> Iterator[BackendPool]:
    with BackendPool(3) as pool:
        yield pool


def test_rolling_restart_of_two_replicas_fails_no_request(backends: BackendPool) -> None:
    replicas = [replica(backends), replica(backends)]
    envoy = EnvoyProcess(two_replica_bootstrap(replicas))
    statuses: Counter[int | str] = Counter()
    lock = threading.Lock()
    stop = threading.Event()

    def client(n: int) -> None:
        with httpx.Client(timeout=30) as c:
            i = 0
            while not stop.is_set():
                i += 1
                try:
                    status: int | str = c.post(
                        envoy.url("/v1/completions"), json={"model": "m", "prompt": f"client {n} request {i}"}
                    ).status_code
                except httpx.HTTPError as e:
                    status = type(e).__name__
                with lock:
                    statuses[status] += 1

    try:
        envoy.start()
        envoy.wait_cluster_healthy(EPP_CLUSTER)
        threads = [threading.Thread(target=client, args=(n,)) for n in range(CLIENTS)]
        for t in threads:
            t.start()
        try:
            wait_until(lambda: sum(statuses.values()) >= 20, "load to flow", 20)
            for i in range(len(replicas)):
                replicas[i] = restart_on_same_ports(backends, replicas[i])
                envoy.wait_cluster_healthy(EPP_CLUSTER)  # both replicas back before the next one goes
                seen = sum(statuses.values())
                wait_until(lambda s=seen: sum(statuses.values()) >= s + 20, "load to flow again", 20)  # type: ignore[misc]
        finally:
            stop.set()
            for t in threads:
                t.join(60)
        sent = sum(statuses.values())
        print(f"rolling restart: sent={sent} ok={statuses[200]} other={sent - statuses[200]} {dict(statuses)}")
        assert statuses[200] == sent, dict(statuses)
        assert sent >= 60
        for r in replicas:  # the restarted replicas served traffic
            assert r.metric_value("inference_objective_request_total") > 0
    finally:
        envoy.stop()
        for r in replicas:
            r.stop()
