"""Leader election with `--workers 2`: two replicas against an in-test API server; readiness on the health
port and on every worker's ext_proc port (`--health-checking`) follows the serving process's leadership."""

from __future__ import annotations

from pathlib import Path

import grpc

from llm_epp.gateway.epp_process import EppProcess
from llm_epp.observability.health import SERVING, decode_check_response, encode_check_request
from tests.envoy.test_kubernetes_pool import NS, kubeconfig, pod, pool
from tests.support.fake_apiserver import FakeApiServer
from tests.support.wait import wait_until


def readiness(port: int) -> int:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        check = channel.unary_unary("/grpc.health.v1.Health/Check", request_serializer=None, response_deserializer=None)
        return decode_check_response(check(encode_check_request("readiness"), timeout=5))


def every_port(epp: EppProcess) -> list[int]:
    workers: list[int] = epp.ports["grpc_workers"]  # type: ignore[assignment]
    return [epp.ports["health"], *workers]


def ready_everywhere(epp: EppProcess) -> bool:
    return all(readiness(p) == SERVING for p in every_port(epp))


def ready_nowhere(epp: EppProcess) -> bool:
    return not any(readiness(p) == SERVING for p in every_port(epp))


def test_readiness_on_every_port_follows_leadership_with_workers(tmp_path: Path) -> None:
    with FakeApiServer() as api:
        api.create("inferencepools", pool([8000]))
        api.create("pods", pod("vllm-0"))
        env = {"KUBECONFIG": str(kubeconfig(tmp_path / "kubeconfig", api.url))}
        args = (
            "--pool-name",
            "my-pool",
            "--pool-namespace",
            NS,
            "--secure-serving=false",
            "--ha-enable-leader-election",
            "--health-checking",
            "--workers",
            "2",
        )
        a = EppProcess(*args, env={**env, "POD_NAME": "epp-a"}, log_path=tmp_path / "a.log", startup_timeout=120)
        b = EppProcess(*args, env={**env, "POD_NAME": "epp-b"}, log_path=tmp_path / "b.log", startup_timeout=120)
        a.start()
        b.start()
        try:
            wait_until(
                lambda: sorted([ready_everywhere(a), ready_everywhere(b)]) == [False, True],
                "exactly one replica ready, on all its ports",
            )
            leader, follower = (a, b) if ready_everywhere(a) else (b, a)
            assert ready_nowhere(follower)
            leader.stop()  # releases the lease
            wait_until(lambda: ready_everywhere(follower), "the follower to take over, on every port")
        finally:
            a.stop()
            b.stop()
