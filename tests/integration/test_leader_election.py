"""Two `llm-epp serve --ha-enable-leader-election` replicas against an in-test API server: exactly one is
ready and knows the pool; when it stops (releasing the Lease) the other takes over."""

from __future__ import annotations

from pathlib import Path

import grpc

from llm_epp.gateway.epp_process import EppProcess
from llm_epp.observability.health import SERVING, decode_check_response, encode_check_request
from tests.envoy.test_kubernetes_pool import NS, kubeconfig, pod, pool
from tests.support.fake_apiserver import FakeApiServer
from tests.support.wait import wait_until


def readiness(epp: EppProcess) -> int:
    with grpc.insecure_channel(f"127.0.0.1:{epp.ports['health']}") as channel:
        check = channel.unary_unary("/grpc.health.v1.Health/Check", request_serializer=None, response_deserializer=None)
        return decode_check_response(check(encode_check_request("readiness"), timeout=5))


def test_one_leader_is_ready_and_a_follower_takes_over(tmp_path: Path) -> None:
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
        )
        a = EppProcess(*args, env={**env, "POD_NAME": "epp-a"}, log_path=tmp_path / "a.log").start()
        b = EppProcess(*args, env={**env, "POD_NAME": "epp-b"}, log_path=tmp_path / "b.log").start()
        try:
            wait_until(lambda: [readiness(a), readiness(b)].count(SERVING) == 1, "exactly one ready replica")
            leader, follower = (a, b) if readiness(a) == SERVING else (b, a)
            lease = api.get("leases", NS, f"epp-{NS}-my-pool.gateway-api-inference-extension.sigs.k8s.io")
            assert lease is not None
            assert lease["spec"]["holderIdentity"].startswith("epp-a" if leader is a else "epp-b")
            assert readiness(follower) != SERVING
            leader.stop()  # releases the lease
            wait_until(lambda: readiness(follower) == SERVING, "the follower to take over")
        finally:
            a.stop()
            b.stop()
