"""Tests for the /metrics fetcher against real loopback servers: success, keep-alive, and one short,
stable reason per kind of failure."""

from __future__ import annotations

import asyncio
import socket
import ssl
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from llm_epp.datalayer import scrape
from llm_epp.datalayer.scrape import ScrapeError, Scraper
from llm_epp.security.tls import self_signed
from tests.unit.datalayer.page_server import PageServer, Route

TESTDATA = Path(__file__).parent / "testdata"
VLLM = (TESTDATA / "vllm.txt").read_bytes()


@pytest.fixture
async def server() -> AsyncIterator[PageServer]:
    async with PageServer() as srv:
        yield srv


@pytest.fixture
async def scraper() -> AsyncIterator[Scraper]:
    s = Scraper(timeout=0.3)
    yield s
    await s.aclose()


async def test_fetches_the_page_and_reuses_the_connection(server: PageServer, scraper: Scraper) -> None:
    server.routes["/metrics"] = Route(VLLM)
    assert await scraper.fetch(server.url("/metrics")) == VLLM
    assert await scraper.fetch(server.url("/metrics")) == VLLM
    assert server.hits["/metrics"] == 2
    assert server.connections == 1
    headers = server.request_headers[0]
    assert headers["accept-encoding"] == "identity"
    assert headers["accept"].startswith("text/plain")


async def test_each_session_keeps_its_own_connection(server: PageServer, scraper: Scraper) -> None:
    server.routes["/metrics"] = Route(b"m 1\n")
    first, second = scraper.session(), scraper.session()
    try:
        for _ in range(3):
            assert await first.fetch(server.url("/metrics")) == b"m 1\n"
            assert await second.fetch(server.url("/metrics")) == b"m 1\n"
    finally:
        await first.aclose()
        await second.aclose()
    assert server.hits["/metrics"] == 6
    assert server.connections == 2


async def test_a_page_without_content_type_is_accepted(server: PageServer, scraper: Scraper) -> None:
    server.routes["/metrics"] = Route(b"m 1\n", content_type=None)
    assert await scraper.fetch(server.url("/metrics")) == b"m 1\n"


async def test_http10_body_read_until_close(server: PageServer, scraper: Scraper) -> None:
    server.routes["/metrics"] = Route(b"m 1\nm 2", mode="http10")
    assert await scraper.fetch(server.url("/metrics")) == b"m 1\nm 2"


@pytest.mark.parametrize(
    ("route", "reason"),
    [
        (Route(b"<html>oops</html>", status=500, content_type="text/html"), "HTTP 500"),
        (Route(b"", status=404), "HTTP 404"),
        (Route(b"", status=302), "HTTP 302"),
        (Route(b"<html></html>", content_type="text/html; charset=utf-8"), "content type text/html, not text/plain"),
        (Route(b"{}", content_type="application/json"), "content type application/json, not text/plain"),
        (Route(VLLM, mode="short"), "connection closed before the page was complete"),
        (Route(VLLM, mode="hang"), "timeout after 0.3s"),
    ],
    ids=["500", "404", "redirect-not-followed", "html", "json", "cut-short", "never-answers"],
)
async def test_failures_have_short_reasons(server: PageServer, scraper: Scraper, route: Route, reason: str) -> None:
    server.routes["/metrics"] = route
    started = time.monotonic()
    with pytest.raises(ScrapeError) as info:
        await scraper.fetch(server.url("/metrics"))
    assert info.value.reason == reason
    assert str(info.value) == reason
    assert time.monotonic() - started < 1.0


async def test_a_page_over_the_cap(server: PageServer, scraper: Scraper, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scrape, "MAX_PAGE_BYTES", 1 << 20)
    server.routes["/metrics"] = Route(b"m 1\n" * (300 << 10))
    with pytest.raises(ScrapeError) as info:
        await scraper.fetch(server.url("/metrics"))
    assert info.value.reason == "page larger than 1 MiB"


async def test_a_malformed_answer(scraper: Scraper) -> None:
    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"SSH-2.0-OpenSSH_9.6\r\n\r\n")
        await writer.drain()
        writer.close()

    srv = await asyncio.start_server(garbage, "127.0.0.1", 0)
    try:
        with pytest.raises(ScrapeError) as info:
            await scraper.fetch(f"http://127.0.0.1:{srv.sockets[0].getsockname()[1]}/metrics")
        assert info.value.reason == "HTTP protocol error (malformed status line)"
    finally:
        srv.close()
        await srv.wait_closed()


async def test_a_session_follows_the_url_to_another_server(scraper: Scraper) -> None:
    b = Route(b"b 1\n")
    async with PageServer({"/a": Route(b"a 1\n")}) as one, PageServer({"/b": b, "/b?x=1": b}) as two:
        session = scraper.session()
        try:
            assert await session.fetch(one.url("/a")) == b"a 1\n"
            assert await session.fetch(two.url("/b")) == b"b 1\n"
            assert await session.fetch(two.url("/b?x=1")) == b"b 1\n"
        finally:
            await session.aclose()
        assert (one.connections, two.connections) == (1, 1)
        assert two.hits == {"/b": 1, "/b?x=1": 1}


async def test_connection_refused(scraper: Scraper) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ScrapeError) as info:
        await scraper.fetch(f"http://127.0.0.1:{port}/metrics")
    assert info.value.reason == "connection refused"


async def test_invalid_url(scraper: Scraper) -> None:
    with pytest.raises(ScrapeError) as info:
        await scraper.fetch("http://[::1/metrics")
    assert info.value.reason.startswith("invalid URL")


@pytest.fixture
def tls_context() -> ssl.SSLContext:
    cert, key = self_signed("127.0.0.1")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "tls.crt").write_bytes(cert)
        (Path(tmp) / "tls.key").write_bytes(key)
        ctx.load_cert_chain(Path(tmp) / "tls.crt", Path(tmp) / "tls.key")
    return ctx


async def test_https_with_insecure_skip_verify(tls_context: ssl.SSLContext) -> None:
    async with PageServer({"/metrics": Route(b"m 1\n")}, ssl_context=tls_context) as srv:
        insecure = Scraper(timeout=1.0, verify=False)
        verifying = Scraper(timeout=1.0, verify=True)
        try:
            assert await insecure.fetch(srv.url("/metrics")) == b"m 1\n"
            with pytest.raises(ScrapeError) as info:
                await verifying.fetch(srv.url("/metrics"))
            assert info.value.reason == "TLS error"
        finally:
            await insecure.aclose()
            await verifying.aclose()


async def test_a_connect_that_never_completes_is_a_connect_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    """A blackholed address (SYNs dropped) cannot be made on loopback, so the connect itself is made to hang."""
    from llm_epp.datalayer.scrape import unreachable

    loop = asyncio.get_running_loop()

    async def hang(*args: object, **kwargs: object) -> None:
        await asyncio.sleep(30)

    monkeypatch.setattr(loop, "create_connection", hang)
    scraper = Scraper(timeout=0.2)
    with pytest.raises(ScrapeError) as info:
        await scraper.fetch("http://127.0.0.1:9/metrics")
    await scraper.aclose()
    assert info.value.reason == "connect timeout after 0.2s"
    assert unreachable(info.value.reason)
