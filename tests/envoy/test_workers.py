"""`llm-epp serve --workers 2` through a real Envoy: two ext_proc worker processes over one scheduling state
(TLS between Envoy and the workers unless a test says otherwise)."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from llm_epp.api.v1 import picker_pb2 as pb
from llm_epp.gateway.envoy_config import EnvoyConfigOptions, build_bootstrap
from llm_epp.gateway.envoy_process import EnvoyProcess
from llm_epp.gateway.epp_process import EppProcess
from llm_epp.sim.stub import BackendPool
from tests.envoy import test_flow_control as fc
from tests.support.pickapi import PickApiAccess
from tests.support.wait import wait_until

pytestmark = pytest.mark.envoy

SYSTEM = "You are a meticulous assistant for a travel agency. " * 120  # ~6,000 characters: many prefix blocks


class WorkersGateway:
    """Envoy -> `llm-epp serve --workers 2` (every worker port an endpoint of the EPP cluster) -> backends."""

    def __init__(
        self, backends: BackendPool, tmp: Path, *args: str, tls: bool = True, env: dict[str, str] | None = None
    ) -> None:
        self.pick_api = PickApiAccess(tmp)  # its --cert-path is also the workers' ext_proc certificate
        self.epp = EppProcess(
            "--endpoints",
            ",".join(backends.addresses),
            f"--secure-serving={str(tls).lower()}",
            "--workers",
            "2",
            *self.pick_api.args,
            *args,
            startup_timeout=120,  # three interpreters start (the serving process and two spawned workers)
            env=env,
        ).start()
        self.worker_ports: list[int] = self.epp.ports["grpc_workers"]  # type: ignore[assignment]
        opts = EnvoyConfigOptions(
            listen_port=0,
            admin_port=0,
            epp_port=self.worker_ports[0],
            epp_ports=tuple(self.worker_ports),
            epp_tls=tls,
            failure_mode="FailClose",
        )
        try:
            self.envoy = EnvoyProcess(build_bootstrap(opts)).start()
        except Exception:
            self.epp.stop()
            raise

    def post(self, client: httpx.Client, prompt: str) -> httpx.Response:
        return client.post(
            self.envoy.url("/v1/completions"), json={"model": "stub-model", "prompt": prompt, "max_tokens": 2}
        )

    def streams_per_worker(self) -> dict[int, int]:
        """ext_proc streams Envoy sent to each worker port (admin /clusters rq_total)."""
        counts = {port: 0 for port in self.worker_ports}
        for line in self.envoy.admin_get("/clusters").splitlines():
            parts = line.split("::")
            if len(parts) == 4 and parts[0] == "epp" and parts[2] == "rq_total":
                port = int(parts[1].rsplit(":", 1)[1])
                if port in counts:
                    counts[port] += int(parts[3])
        return counts

    def in_flight(self) -> dict[str, int]:
        """In-flight requests per endpoint as the serving process counts them (direct-routing API)."""
        with self.pick_api.channel() as ch:
            reply = self.pick_api.stub(ch).ListEndpoints(pb.ListEndpointsRequest(), timeout=10)
        return {e.hostport: e.in_flight_requests for e in reply.endpoints}

    def stop(self) -> None:
        self.envoy.stop()
        self.epp.stop()


@pytest.fixture(scope="module")
def backends() -> Iterator[BackendPool]:
    with BackendPool(3) as pool:
        yield pool


@pytest.fixture
def gateway(backends: BackendPool, tmp_path: Path) -> Iterator[WorkersGateway]:
    for b in backends:
        b.ttft_s = 0.0
    backends.reset()
    gw = WorkersGateway(backends, tmp_path)
    yield gw
    gw.stop()


def _delta(after: dict[int, int], before: dict[int, int]) -> dict[int, int]:
    return {port: after[port] - before[port] for port in after}


def test_both_workers_share_one_prefix_index(gateway: WorkersGateway) -> None:
    before = gateway.streams_per_worker()
    with httpx.Client(timeout=30) as c:
        served = []
        for i in range(30):
            r = gateway.post(c, f"{SYSTEM}Question {i}: where next?")
            assert r.status_code == 200, r.text
            served.append(r.headers["x-backend-name"])
    per_worker = _delta(gateway.streams_per_worker(), before)
    assert sorted(per_worker.values()) == [15, 15]  # Envoy alternated the streams between the two workers
    assert served.count(served[0]) == 30  # whichever worker took it, the follow-up went where the prefix is
    # One /metrics (the serving process's) counts the requests of both workers.
    assert gateway.epp.wait_metric("inference_objective_request_total", 30) == 30


def test_in_flight_load_is_counted_once_for_both_workers(gateway: WorkersGateway, backends: BackendPool) -> None:
    for b in backends:
        b.ttft_s = 3.0  # hold the requests at the model servers
    before = gateway.streams_per_worker()
    with httpx.Client(timeout=30) as c, ThreadPoolExecutor(6) as pool:
        held = [pool.submit(gateway.post, c, f"{i} distinct prompt {i} " * 50) for i in range(6)]
        wait_until(lambda: sum(b.in_flight for b in backends) == 6, "six requests at the model servers", timeout=10)
        counted = gateway.in_flight()
        at_servers = {b.address: b.in_flight for b in backends}
        assert [r.result().status_code for r in held] == [200] * 6
    assert counted == at_servers  # each request counted once, on the pod that holds it
    per_worker = _delta(gateway.streams_per_worker(), before)
    assert all(n > 0 for n in per_worker.values()), per_worker  # both workers routed some of the six
    wait_until(
        lambda: sum(gateway.in_flight().values()) == 0, "in-flight counts back to zero", timeout=10
    )  # released once each, by either worker


def test_a_worker_that_dies_is_restarted(gateway: WorkersGateway) -> None:
    old = gateway.epp.ports["worker_pids"]
    victim = old[1]  # type: ignore[index]
    os.kill(victim, signal.SIGKILL)
    wait_until(lambda: "worker_restarted worker=1" in gateway.epp.log(), "the worker restarted", timeout=30)
    gateway.envoy.wait_cluster_healthy("epp")  # both worker ports listen again
    before = gateway.streams_per_worker()
    with httpx.Client(timeout=30) as c:
        codes = [gateway.post(c, f"after the restart {i}").status_code for i in range(10)]
    assert codes == [200] * 10
    assert all(n > 0 for n in _delta(gateway.streams_per_worker(), before).values())
    assert gateway.epp.proc is not None and gateway.epp.proc.poll() is None


def test_sigterm_drains_in_flight_requests_on_every_worker(backends: BackendPool, tmp_path: Path) -> None:
    for b in backends:
        b.ttft_s = 1.5  # shorter than the drain (2 s serving, then 2 s for in-flight streams)
    gw = WorkersGateway(backends, tmp_path, "--drain-timeout", "2s", tls=False)
    try:
        with httpx.Client(timeout=30) as c, ThreadPoolExecutor(6) as pool:
            held = [pool.submit(gw.post, c, f"held {i}") for i in range(6)]
            wait_until(lambda: sum(b.in_flight for b in backends) == 6, "six requests held", timeout=10)
            assert gw.epp.proc is not None
            gw.epp.proc.send_signal(signal.SIGTERM)
            time.sleep(0.2)
            during = gw.post(c, "sent during the drain window")  # still served while not ready
            assert [r.result().status_code for r in held] == [200] * 6
            assert during.status_code == 200
        assert gw.epp.proc.wait(20) == 0
        log = gw.epp.log()
        assert log.count("worker_stopped") == 2
    finally:
        gw.stop()


def _taken_port_above_a_free_one() -> tuple[socket.socket, int]:
    """A listening socket on port p + 1 where p was free a moment ago."""
    for _ in range(50):
        taken = socket.socket()
        taken.bind(("127.0.0.1", 0))
        port: int = taken.getsockname()[1]
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port - 1))
            except OSError:
                taken.close()
                continue
        taken.listen()
        return taken, port
    raise AssertionError("no free port below a free port")


def test_a_worker_that_cannot_listen_stops_the_epp_with_the_reason(backends: BackendPool) -> None:
    taken, port = _taken_port_above_a_free_one()  # worker 1's port; worker 0 gets the one below
    with taken:
        epp = EppProcess(
            "--endpoints",
            ",".join(backends.addresses),
            "--secure-serving=false",
            "--workers",
            "2",
            "--grpc-port",
            str(port - 1),
            startup_timeout=120,
        )
        with pytest.raises(RuntimeError) as failed:
            epp.start()
    assert epp.proc is not None and epp.proc.returncode == 1
    assert f"llm-epp: ext_proc worker 1 could not listen on 127.0.0.1:{port}" in str(failed.value)


@pytest.fixture
def queued_stack(tmp_path: Path) -> Iterator[fc.Stack]:
    """The flow-control stack of `test_flow_control` (one pod saturated by one request) with two workers."""
    ref: list[fc.Pod] = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), fc._handler(ref))
    pod = fc.Pod(server)
    ref.append(pod)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    objectives = tmp_path / "objectives.yaml"
    objectives.write_text(fc.OBJECTIVES)
    epp = EppProcess(
        "--endpoints",
        pod.address,
        "--secure-serving=false",
        "--workers",
        "2",
        "--config-text",
        fc.CONFIG % "30s",
        "--objectives-file",
        str(objectives),
        startup_timeout=120,
    ).start()
    ports: list[int] = epp.ports["grpc_workers"]  # type: ignore[assignment]
    opts = EnvoyConfigOptions(listen_port=0, admin_port=0, epp_port=ports[0], epp_ports=tuple(ports), epp_tls=False)
    try:
        envoy = EnvoyProcess(build_bootstrap(opts)).start()
    except Exception:
        epp.stop()
        raise
    yield fc.Stack(pod, epp, envoy)
    for _ in range(20):
        pod.release.release()
    envoy.stop()
    epp.stop()
    server.shutdown()
    server.server_close()


def test_requests_from_both_workers_wait_in_one_queue_in_priority_order(queued_stack: fc.Stack) -> None:
    s = queued_stack
    with ThreadPoolExecutor(6) as pool:
        first = pool.submit(s.post, "first")
        assert s.pod.wait_arrivals(1) == ["first"]
        waiting = []
        for i, rid in enumerate(("low-1", "low-2")):  # Envoy alternates workers: each queues through another
            waiting.append(pool.submit(s.post, rid))
            assert s.epp.wait_metric(fc.QUEUE_SIZE, i + 1) == i + 1
        with pytest.raises(httpx.ReadTimeout):
            s.post("impatient", timeout=0.5)  # leaves while queued: its worker cancels it in the serving process
        assert s.epp.wait_metric(fc.QUEUE_SIZE, 2) == 2
        urgent = pool.submit(s.post, "urgent", "urgent")
        assert s.epp.wait_metric(fc.QUEUE_SIZE, 3) == 3
        for n in (2, 3, 4):
            s.pod.release.release()  # one finishes (on whichever worker): exactly one more is let through
            assert len(s.pod.wait_arrivals(n)) == n
        s.pod.release.release()
        assert [f.result(30).status_code for f in (first, *waiting, urgent)] == [200] * 4
    assert s.pod.arrived == ["first", "urgent", "low-1", "low-2"]
    assert s.queued() == 0


def test_a_second_signal_ends_the_drain_and_every_worker_stops_cleanly(backends: BackendPool, tmp_path: Path) -> None:
    gw = WorkersGateway(backends, tmp_path, "--drain-timeout", "10m", tls=False)
    try:
        proc = gw.epp.proc
        assert proc is not None
        proc.send_signal(signal.SIGTERM)
        wait_until(lambda: "draining" in gw.epp.log(), "the drain to start", 10)
        assert proc.poll() is None  # a 10-minute drain window: still serving
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
        log = gw.epp.log()
        assert log.count("worker_stopped") == 2  # each front stopped its server itself, none was killed
        assert "worker_killed" not in log
    finally:
        gw.stop()


def test_with_tracing_each_request_is_one_span_from_its_worker_with_the_directors_phases(
    backends: BackendPool, tmp_path: Path
) -> None:
    """The worker that serves a stream makes and exports its span (continuing the client's trace); the serving
    process's phases and plugin calls arrive as its children, and the pod joins the trace under that span."""
    from opentelemetry.proto.trace.v1.trace_pb2 import Span

    from tests.support.otlp_collector import running_collector

    trace_id, client_span = "5bf92f3577b34da6a3ce929d0e0e4736", "a0f067aa0ba902b7"
    backends.reset()
    with running_collector() as (collector, port):
        env = {
            "OTEL_TRACES_EXPORTER": "otlp",
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
            "OTEL_EXPORTER_OTLP_INSECURE": "true",
            "OTEL_BSP_SCHEDULE_DELAY": "100",
            "OTEL_TRACES_SAMPLER": "parentbased_always_on",
        }
        gw = WorkersGateway(backends, tmp_path, "--tracing=true", env=env)
        try:
            with httpx.Client(timeout=30) as client:
                r = client.post(
                    gw.envoy.url("/v1/completions"),
                    json={"model": "stub-model", "prompt": "trace me", "max_tokens": 2},
                    headers={"traceparent": f"00-{trace_id}-{client_span}-01"},
                )
            assert r.status_code == 200, r.text

            def ours(got: list[tuple[str, Span]]) -> dict[str, Span]:
                return {span.name: span for _, span in got if span.trace_id.hex() == trace_id}

            spans = ours(collector.wait_for(lambda got: {"gateway.request", "schedule"} <= set(ours(got))))
        finally:
            gw.stop()
    request = spans["gateway.request"]
    assert request.parent_span_id.hex() == client_span
    assert {"parse", "schedule"} <= set(spans) and any(n.startswith("plugin.") for n in spans), sorted(spans)
    for name, span in spans.items():
        if name != "gateway.request":
            assert span.parent_span_id == request.span_id, name
            assert request.start_time_unix_nano <= span.start_time_unix_nano, name  # within the stream's span
    served = [req for pod in backends.backends for req in pod.served_requests()]
    assert len(served) == 1
    _, pod_trace, parent, flags = served[0].headers["traceparent"].split("-")
    assert (pod_trace, parent, flags) == (trace_id, request.span_id.hex(), "01")
