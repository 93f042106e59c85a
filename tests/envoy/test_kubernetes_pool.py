"""`llm-epp serve --pool-name`: endpoints discovered from an InferencePool and its pods (served by an in-test
API server that speaks the real list/watch protocol), routed through a real Envoy."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from llm_epp.gateway.envoy_config import EnvoyConfigOptions, build_bootstrap
from llm_epp.gateway.envoy_process import EnvoyProcess
from llm_epp.gateway.epp_process import EppProcess
from llm_epp.sim.stub import BackendPool
from tests.support.fake_apiserver import FakeApiServer
from tests.support.wait import wait_until

pytestmark = pytest.mark.envoy

NS = "llm"


def pool(ports: list[int]) -> dict[str, Any]:
    return {
        "metadata": {"name": "my-pool", "namespace": NS},
        "spec": {
            "selector": {"matchLabels": {"app": "vllm"}},
            "targetPorts": [{"number": p} for p in ports],
            "endpointPickerRef": {"name": "my-pool-epp", "port": {"number": 9002}},
        },
    }


def pod(name: str, ready: bool = True) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": NS, "labels": {"app": "vllm"}},
        "spec": {"containers": [{"name": "vllm", "image": "vllm"}]},
        "status": {"podIP": "127.0.0.1", "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def kubeconfig(path: Path, url: str) -> Path:
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "test", "cluster": {"server": url}}],
        "users": [{"name": "test", "user": {"token": "test"}}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test", "namespace": NS}}],
        "current-context": "test",
    }
    path.write_text(yaml.safe_dump(doc))
    return path


def served(envoy: EnvoyProcess, n: int) -> set[str]:
    with httpx.Client(timeout=30) as c:
        body = {"model": "m", "prompt": "hello", "max_tokens": 1}
        out = set()
        for _ in range(n):
            r = c.post(envoy.url("/v1/completions"), json=body)
            out.add(r.headers.get("x-backend-name", f"status-{r.status_code}"))
        return out


def test_pool_discovered_from_kubernetes_and_followed_when_pods_change(tmp_path: Path) -> None:
    with BackendPool(2, names=["rank0", "rank1"]) as backends, FakeApiServer() as api:
        ports = [b.port for b in backends]
        # one pod, two target ports: endpoints my-pod-rank-0 and my-pod-rank-1 (both on 127.0.0.1)
        api.create("inferencepools", pool(ports))
        api.create("pods", pod("my-pod"))
        epp = EppProcess(
            "--pool-name",
            "my-pool",
            "--pool-namespace",
            NS,
            "--secure-serving=false",
            "--metrics-endpoint-auth=false",  # the test scrapes /metrics without a token
            env={"KUBECONFIG": str(kubeconfig(tmp_path / "kubeconfig", api.url))},
        ).start()
        try:
            envoy = EnvoyProcess(
                build_bootstrap(EnvoyConfigOptions(listen_port=0, admin_port=0, epp_port=epp.grpc_port, epp_tls=False))
            ).start()
            try:
                wait_until(
                    lambda: epp.metric_value("inference_pool_ready_pods") >= 0 and served(envoy, 1) != set(),
                    "the first routed request",
                )
                wait_until(lambda: served(envoy, 20) == {"rank0", "rank1"}, "both ranks to take traffic")
                # the pod turns unready: the pool is empty, requests get 503
                api.update("pods", pod("my-pod", ready=False))
                with httpx.Client(timeout=30) as c:
                    wait_until(
                        lambda: (
                            c.post(envoy.url("/v1/completions"), json={"model": "m", "prompt": "x"}).status_code == 503
                        ),
                        "the unready pod to leave the pool",
                    )
                # the pool's target ports change: only rank0's port remains
                api.update("pods", pod("my-pod"))
                api.update("inferencepools", pool(ports[:1]))
                wait_until(lambda: served(envoy, 10) == {"rank0"}, "the pool edit to take effect")
            finally:
                envoy.stop()
        finally:
            epp.stop()
        assert "Traceback" not in epp.log()


def test_standalone_endpoint_selector_without_an_inference_pool(tmp_path: Path) -> None:
    with BackendPool(1, names=["only"]) as backends, FakeApiServer() as api:
        api.create("pods", pod("vllm-0"))
        api.create("pods", {**pod("other"), "metadata": {"name": "other", "namespace": NS, "labels": {"app": "x"}}})
        epp = EppProcess(
            "--endpoint-selector",
            "app=vllm",
            "--endpoint-target-ports",
            str(backends[0].port),
            "--pool-namespace",
            NS,
            "--secure-serving=false",
            env={"KUBECONFIG": str(kubeconfig(tmp_path / "kubeconfig", api.url))},
        ).start()
        try:
            envoy = EnvoyProcess(
                build_bootstrap(EnvoyConfigOptions(listen_port=0, admin_port=0, epp_port=epp.grpc_port, epp_tls=False))
            ).start()
            try:
                wait_until(lambda: served(envoy, 5) == {"only"}, "the selected pod to serve")
            finally:
                envoy.stop()
        finally:
            epp.stop()
        assert api.count("inferencepools", "list") == 0  # standalone mode never looks for a pool
