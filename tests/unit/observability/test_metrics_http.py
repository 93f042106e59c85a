"""The metrics port: /metrics behind TokenReview + SubjectAccessReview (against the in-test API server),
pprof, HTTPS and client certificates."""

from __future__ import annotations

import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from cryptography.hazmat.primitives import serialization
from prometheus_client import CollectorRegistry, Counter

from llm_epp.observability.metrics_auth import KubernetesAuthorizer
from llm_epp.observability.metrics_http import CertDirWatch, MetricsHttpServer, server_tls_context
from tests.support.certs import issue_cert as _cert
from tests.support.certs import write_pair as _write
from tests.support.fake_apiserver import FakeApiServer


@pytest.fixture
def registry() -> CollectorRegistry:
    reg = CollectorRegistry()
    Counter("llm_epp_test_total", "test counter", registry=reg).inc(3)
    return reg


@pytest.fixture
def fake() -> Iterator[FakeApiServer]:
    with FakeApiServer() as f:
        f.add_token("scraper-token", "system:serviceaccount:monitoring:prometheus", ("system:serviceaccounts",))
        f.add_token("other-token", "system:serviceaccount:default:nobody")
        f.grant("system:serviceaccount:monitoring:prometheus", "/metrics")
        yield f


@pytest.fixture
def guarded(registry: CollectorRegistry, fake: FakeApiServer) -> Iterator[tuple[MetricsHttpServer, FakeApiServer]]:
    api = fake.api_client()
    with MetricsHttpServer(registry, "127.0.0.1", 0, authorizer=KubernetesAuthorizer(api), enable_pprof=True) as server:
        yield server, fake
    api.close()


def _get(server: MetricsHttpServer, path: str, token: str | None = None, **headers: str) -> httpx.Response:
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return httpx.get(f"http://127.0.0.1:{server.port}{path}", headers=headers, timeout=30)


def test_scrape_needs_a_token_the_api_server_authenticates_and_authorizes(
    guarded: tuple[MetricsHttpServer, FakeApiServer],
) -> None:
    server, fake = guarded
    assert _get(server, "/metrics").status_code == 401
    assert _get(server, "/metrics", "made-up").status_code == 401
    denied = _get(server, "/metrics", "other-token")
    assert denied.status_code == 403
    assert "system:serviceaccount:default:nobody" in denied.text
    ok = _get(server, "/metrics", "scraper-token")
    assert ok.status_code == 200
    assert "llm_epp_test_total 3.0" in ok.text
    # the grant is for /metrics only: the profile path is its own non-resource URL, as the reference checks it
    assert _get(server, "/debug/pprof/goroutine", "scraper-token").status_code == 403
    fake.grant("system:serviceaccounts", "/debug/pprof/goroutine")  # a group grant works too
    assert _get(server, "/debug/pprof/goroutine", "scraper-token").status_code == 403  # denial cached 30 s
    assert _get(server, "/nothing", "scraper-token").status_code == 404


def test_answers_are_cached(guarded: tuple[MetricsHttpServer, FakeApiServer]) -> None:
    server, fake = guarded
    for _ in range(3):
        assert _get(server, "/metrics", "scraper-token").status_code == 200
        assert _get(server, "/metrics", "made-up").status_code == 401
    assert fake.count("tokenreviews", "create") == 2  # one per distinct token
    assert fake.count("subjectaccessreviews", "create") == 1


def test_api_server_failure_is_a_500_not_an_open_door(guarded: tuple[MetricsHttpServer, FakeApiServer]) -> None:
    server, fake = guarded
    fake.review_failures = 10
    failed = _get(server, "/metrics", "scraper-token")
    assert failed.status_code == 500
    assert "llm_epp_test_total" not in failed.text


def test_group_grant_and_gzip(guarded: tuple[MetricsHttpServer, FakeApiServer]) -> None:
    server, fake = guarded
    fake.add_token("team-token", "alice", ("observers",))
    fake.grant("observers", "/metrics")
    resp = _get(server, "/metrics", "team-token", **{"Accept-Encoding": "gzip"})
    assert resp.status_code == 200 and resp.headers["content-encoding"] == "gzip"
    assert "llm_epp_test_total 3.0" in resp.text  # httpx decompressed it


def test_pprof_profile_and_heap(registry: CollectorRegistry) -> None:
    stop = threading.Event()

    def busy_loop_for_the_profile() -> None:
        while not stop.is_set():
            sum(i * i for i in range(2000))

    worker = threading.Thread(target=busy_loop_for_the_profile, name="busy-worker", daemon=True)
    worker.start()
    try:
        with MetricsHttpServer(registry, "127.0.0.1", 0, enable_pprof=True) as server:
            profile = _get(server, "/debug/pprof/profile?seconds=0.3")
            assert profile.status_code == 200
            busy = [line for line in profile.text.splitlines() if line.startswith("busy-worker;")]
            assert any("busy_loop_for_the_profile" in line for line in busy), profile.text[:2000]
            stack, count = busy[0].rsplit(" ", 1)
            assert int(count) >= 1 and stack.count(";") >= 2
            held: list[bytes] = []

            def allocate_during_the_window() -> None:
                time.sleep(0.05)
                held.extend(bytes(4096) for _ in range(256))

            threading.Thread(target=allocate_during_the_window).start()
            heap = _get(server, "/debug/pprof/heap?seconds=0.4")
            assert heap.status_code == 200
            assert heap.text.startswith("# heap: ")
            assert "test_metrics_http.py" in heap.text  # the allocation site of `held`
            assert _get(server, "/debug/pprof/profile?seconds=0").status_code == 400
            assert _get(server, "/debug/pprof/profile?seconds=9999").status_code == 400
            assert _get(server, "/debug/pprof/nope").status_code == 404
            assert "profile?seconds=N" in _get(server, "/debug/pprof/").text
        with MetricsHttpServer(registry, "127.0.0.1", 0, enable_pprof=False) as server:
            assert _get(server, "/debug/pprof/profile?seconds=0.1").status_code == 404
            assert _get(server, "/metrics").status_code == 200  # no authorizer: open
    finally:
        stop.set()
        worker.join()


def test_one_profile_at_a_time(registry: CollectorRegistry) -> None:
    with MetricsHttpServer(registry, "127.0.0.1", 0, enable_pprof=True) as server:
        results: list[int] = []
        first = threading.Thread(
            target=lambda: results.append(_get(server, "/debug/pprof/profile?seconds=1").status_code)
        )
        first.start()
        time.sleep(0.3)
        assert _get(server, "/debug/pprof/heap?seconds=0.1").status_code == 409
        first.join()
        assert results == [200]


# --- HTTPS and client certificates -------------------------------------------------------------------
def test_https_with_required_client_certificates(registry: CollectorRegistry, tmp_path: Path) -> None:
    ca = _cert("metrics-ca")
    (tmp_path / "ca.crt").write_bytes(ca[0].public_bytes(serialization.Encoding.PEM))
    _write(tmp_path / "server", *_cert("localhost", ca))
    _write(tmp_path / "client", *_cert("prometheus", ca))
    _write(tmp_path / "stranger", *_cert("stranger"))  # self-signed: not from the CA
    tls = server_tls_context(str(tmp_path / "server"), str(tmp_path / "ca.crt"))
    with MetricsHttpServer(registry, "127.0.0.1", 0, tls=tls) as server:
        assert server.scheme == "https"
        url = f"https://localhost:{server.port}/metrics"

        def client(cert_dir: str | None) -> ssl.SSLContext:
            ctx = ssl.create_default_context(cafile=str(tmp_path / "ca.crt"))
            if cert_dir:
                ctx.load_cert_chain(str(tmp_path / cert_dir / "tls.crt"), str(tmp_path / cert_dir / "tls.key"))
            return ctx

        ok = httpx.get(url, verify=client("client"), timeout=10)
        assert ok.status_code == 200 and "llm_epp_test_total 3.0" in ok.text
        for refused in (None, "stranger"):
            with pytest.raises((httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError)):
                httpx.get(url, verify=client(refused), timeout=10)
        with pytest.raises(httpx.RemoteProtocolError):  # plain HTTP to the TLS port gets no answer
            httpx.get(f"http://127.0.0.1:{server.port}/metrics", timeout=10)


def test_replaced_metrics_certificate_is_served_to_new_connections(registry: CollectorRegistry, tmp_path: Path) -> None:
    import socket

    from cryptography import x509

    first, second = _cert("localhost"), _cert("localhost")
    _write(tmp_path, *first)
    tls = server_tls_context(str(tmp_path))
    watch = CertDirWatch(tls, str(tmp_path))

    def served(port: int) -> x509.Certificate:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, ctx.wrap_socket(raw) as conn:
            der = conn.getpeercert(binary_form=True)
        assert der is not None
        return x509.load_der_x509_certificate(der)

    with MetricsHttpServer(registry, "127.0.0.1", 0, tls=tls, cert_watch=watch) as server:
        assert served(server.port) == first[0]
        _write(tmp_path, *second)
        assert served(server.port) == second[0]
        (tmp_path / "tls.key").write_text("not a key")
        assert served(server.port) == second[0]  # a broken pair is not taken
        assert watch.reloads == 1
