"""`llm-epp serve` started with the arguments the reference chart renders (image swapped, nothing else changed)
reaches readiness against an in-test API server, and guards /metrics as the reference does."""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import httpx

from llm_epp.gateway.epp_process import EppProcess
from llm_epp.observability.health import SERVING, decode_check_response, encode_check_request
from tests.envoy.test_kubernetes_pool import kubeconfig, pod
from tests.support.fake_apiserver import FakeApiServer
from tests.support.wait import wait_until

NS = "llm"
SCRAPER = "system:serviceaccount:monitoring:prometheus"


def chart_args(config_file: Path) -> list[str]:
    """GIE v1.5.0 `config/charts/epplib` with default values (vLLM, one replica, tracing and auth as default)."""
    return [
        "--pool-name",
        "demo",
        "--pool-namespace",
        NS,
        "--pool-group",
        "inference.networking.k8s.io",
        "--zap-encoder",
        "json",
        "--config-file",
        str(config_file),
        "--v",
        "1",
        "--tracing=false",
    ]


def health(epp: EppProcess, service: str) -> int:
    """The health status of `service`, -1 while the server does not answer (a loaded machine starts slowly)."""
    with grpc.insecure_channel(f"127.0.0.1:{epp.ports['health']}") as channel:
        check = channel.unary_unary("/grpc.health.v1.Health/Check", request_serializer=None, response_deserializer=None)
        try:
            return decode_check_response(check(encode_check_request(service), timeout=5))
        except grpc.RpcError:
            return -1


def test_reference_chart_args_reach_readiness_with_metrics_auth(tmp_path: Path) -> None:
    config = tmp_path / "default-plugins.yaml"
    config.write_text("plugins:\n- type: queue-scorer\n- type: max-score-picker\n")
    with FakeApiServer() as api:
        api.create(
            "inferencepools",
            {
                "metadata": {"name": "demo", "namespace": NS},
                "spec": {
                    "selector": {"matchLabels": {"app": "vllm"}},
                    "targetPorts": [{"number": 8000}],
                    "endpointPickerRef": {"name": "demo-epp", "port": {"number": 9002}},
                },
            },
        )
        api.create("pods", pod("vllm-0"))
        api.add_token("scrape-token", SCRAPER)
        api.add_token("other-token", "system:serviceaccount:llm:someone")
        api.grant(SCRAPER, "/metrics")
        env = {"KUBECONFIG": str(kubeconfig(tmp_path / "kubeconfig", api.url))}
        with EppProcess(*chart_args(config), env=env) as epp:
            wait_until(lambda: health(epp, "inference-extension") == SERVING, "the chart's probe to pass")
            url = epp.metrics_url
            assert httpx.get(url, timeout=10).status_code == 401
            assert httpx.get(url, headers={"Authorization": "Bearer other-token"}, timeout=10).status_code == 403
            ok = httpx.get(url, headers={"Authorization": "Bearer scrape-token"}, timeout=10)
            assert ok.status_code == 200 and "inference_extension_info" in ok.text
            lines = [line for line in epp.log().splitlines() if line.startswith("{")]
            assert lines and all(json.loads(line)["level"] for line in lines)  # --zap-encoder json
        assert api.count("tokenreviews", "create") >= 2


def test_without_a_cluster_metrics_are_served_unauthenticated_with_a_warning() -> None:
    with EppProcess("--endpoints", "127.0.0.1:1", "--secure-serving=false") as epp:
        assert httpx.get(epp.metrics_url, timeout=10).status_code == 200
        log = epp.log()
        assert "metrics_endpoint_unauthenticated" in log and "--metrics-endpoint-auth=false" in log
    with EppProcess("--endpoints", "127.0.0.1:1", "--secure-serving=false", "--metrics-endpoint-auth=false") as epp:
        assert httpx.get(epp.metrics_url, timeout=10).status_code == 200
        assert "metrics_endpoint_unauthenticated" not in epp.log()
