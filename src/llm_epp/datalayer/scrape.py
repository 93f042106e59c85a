"""HTTP fetch of model-server /metrics pages: the only module that imports httpx.

A `Scraper` holds what all polls share (timeouts, one TLS context, headers); each endpoint's poller
opens its own `ScrapeSession`, an `httpx.AsyncClient` that keeps that endpoint's connection alive
between polls. One client per endpoint rather than one for all: httpcore's pool walks every pooled
connection under a lock on each request, so with one shared client the CPU per poll grows with the
number of endpoints (measured by benchmarks/scrape_cost.py: ~2 ms per poll at 10 endpoints, ~8 ms at
100; with per-endpoint clients it stays ~2 ms).

Each poll is bounded by a total deadline (1 s, as the reference). Every failure becomes a `ScrapeError`
whose `reason` is short and stable ("HTTP 500", "timeout after 1s", "connection refused", ...) so the
runtime can log a failing endpoint once per change of reason.
"""

from __future__ import annotations

import asyncio
import errno
import importlib.util
import ssl
import sys

import httpx

if importlib.util.find_spec("sniffio") is None:
    # httpcore runs `import sniffio` on every connection-pool lock operation (4 per request); without the
    # package each attempt searches sys.path again (~1 ms of CPU per scrape). A cached "absent" entry makes
    # the failed import free; httpcore then assumes asyncio, which is what runs here.
    sys.modules["sniffio"] = None  # type: ignore[assignment]

__all__ = ["DEFAULT_POLL_TIMEOUT", "ScrapeError", "ScrapeSession", "Scraper"]

DEFAULT_POLL_TIMEOUT = 1.0
MAX_PAGE_BYTES = 16 << 20
_ACCEPT = "text/plain;version=0.0.4;q=1,*/*;q=0.1"


class ScrapeError(Exception):
    """A poll that produced no page. `reason` is short and stable across repeats of the same failure."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _connect_reason(err: BaseException) -> str:
    cause: BaseException | None = err
    while cause is not None:
        if isinstance(cause, ConnectionRefusedError) or getattr(cause, "errno", None) == errno.ECONNREFUSED:
            return "connection refused"
        if isinstance(cause, ssl.SSLError):
            return "TLS error"
        cause = cause.__cause__ or cause.__context__
    text = str(err).lower()
    if "refused" in text:
        return "connection refused"
    if "name or service not known" in text or "nodename nor servname" in text:
        return "unknown host"
    return f"cannot connect ({type(err).__name__})"


class Scraper:
    """Shared settings of all polls. `verify=False` skips TLS verification (insecureSkipVerify)."""

    def __init__(self, *, timeout: float = DEFAULT_POLL_TIMEOUT, verify: bool = False) -> None:
        self.timeout = timeout
        self._timeout_reason = f"timeout after {timeout:g}s"
        self._ssl = httpx.create_ssl_context(verify=verify)  # built once: loading the CA bundle takes ~50 ms
        self._default: ScrapeSession | None = None

    def session(self) -> ScrapeSession:
        """A client for one endpoint's polls (one kept-alive connection); close it with `aclose()`."""
        return ScrapeSession(self)

    async def fetch(self, url: str) -> bytes:
        """One-off fetch through a session shared by all callers (tests, tools)."""
        if self._default is None:
            self._default = self.session()
        return await self._default.fetch(url)

    async def aclose(self) -> None:
        if self._default is not None:
            await self._default.aclose()
            self._default = None


class ScrapeSession:
    def __init__(self, scraper: Scraper) -> None:
        self._scraper = scraper
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(scraper.timeout),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=2, keepalive_expiry=10.0),
            verify=scraper._ssl,
            follow_redirects=False,
            trust_env=False,
            # Metrics travel on the cluster network; decompressing them would cost more CPU than it saves.
            headers={"Accept": _ACCEPT, "Accept-Encoding": "identity"},
        )

    async def fetch(self, url: str) -> bytes:
        """The body of a 200 text/plain answer from `url`; raises ScrapeError otherwise."""
        try:
            async with asyncio.timeout(self._scraper.timeout):
                return await self._get(url)
        except TimeoutError:
            raise ScrapeError(self._scraper._timeout_reason) from None
        except httpx.TimeoutException:
            raise ScrapeError(self._scraper._timeout_reason) from None
        except httpx.ConnectError as e:
            raise ScrapeError(_connect_reason(e)) from None
        except httpx.RemoteProtocolError as e:
            text = str(e).lower()
            if "incomplete" in text or "peer closed" in text:
                raise ScrapeError("connection closed before the page was complete") from None
            raise ScrapeError("HTTP protocol error") from None
        except httpx.TransportError as e:
            raise ScrapeError(f"transport error ({type(e).__name__})") from None
        except httpx.InvalidURL:
            raise ScrapeError(f"invalid URL {url!r}") from None

    async def _get(self, url: str) -> bytes:
        response = await self._client.send(self._client.build_request("GET", url), stream=True)
        try:
            if response.status_code != 200:
                raise ScrapeError(f"HTTP {response.status_code}")
            ctype = response.headers.get("content-type", "")
            if ctype and not ctype.lower().startswith("text/plain"):
                raise ScrapeError(f"content type {ctype.split(';', 1)[0].strip()}, not text/plain")
            length = response.headers.get("content-length")
            if length is not None and length.isdigit() and int(length) > MAX_PAGE_BYTES:
                raise ScrapeError(f"page larger than {MAX_PAGE_BYTES >> 20} MiB")
            return await response.aread()
        finally:
            await response.aclose()

    async def aclose(self) -> None:
        await self._client.aclose()
