"""HTTP fetch of model-server /metrics pages, on the minimal client of `http_client`.

A `Scraper` holds what all polls share (timeout, one TLS context built on first use); each endpoint's
poller opens its own `ScrapeSession`, which keeps that endpoint's connection alive between polls. The
client does only what a scrape needs, because the CPU of the fetch bounds how many endpoints one core
keeps fresh (benchmarks/scrape_cost.py: httpx cost ~1-2 ms per poll of a 100 KB vLLM page).

Each poll is bounded by a total deadline (1 s, as the reference). Every failure becomes a `ScrapeError`
whose `reason` is short and stable ("HTTP 500", "timeout after 1s", "connection refused", "connect timeout
after 1s", ...) so the runtime can log a failing endpoint once per change of reason, and tell an endpoint
nothing can connect to (`unreachable(reason)`) from one that answers badly.
"""

from __future__ import annotations

import errno
import socket
import ssl
from urllib.parse import urlsplit

from llm_epp.datalayer.http_client import (
    BodyTooLargeError,
    ConnectError,
    ConnectionClosedError,
    HTTPClientError,
    HTTPConnection,
    HTTPTimeoutError,
    ProtocolError,
    client_ssl_context,
)

__all__ = ["DEFAULT_POLL_TIMEOUT", "ScrapeError", "ScrapeSession", "Scraper", "unreachable"]

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
        if isinstance(cause, socket.gaierror):
            return "DNS lookup failed" if cause.errno == socket.EAI_AGAIN else "unknown host"
        cause = cause.__cause__ or cause.__context__
    text = str(err).lower()
    if "refused" in text:
        return "connection refused"
    if "name or service not known" in text or "nodename nor servname" in text:
        return "unknown host"
    code = getattr(err.__cause__, "errno", None)
    if isinstance(code, int) and code in errno.errorcode:
        return f"cannot connect ({errno.errorcode[code]})"  # EHOSTUNREACH, ETIMEDOUT, ...
    return f"cannot connect ({type(err.__cause__ or err).__name__})"


_UNREACHABLE_PREFIXES = ("connection refused", "connect timeout", "cannot connect")


def unreachable(reason: str) -> bool:
    """Whether a scrape failure means no connection can be made to the endpoint (refused, connect timeout,
    host or network unreachable), as opposed to a server that answers badly (HTTP errors, slow pages,
    TLS or DNS problems)."""
    return reason.startswith(_UNREACHABLE_PREFIXES)


class Scraper:
    """Shared settings of all polls. `verify=False` skips TLS verification (insecureSkipVerify)."""

    def __init__(self, *, timeout: float = DEFAULT_POLL_TIMEOUT, verify: bool = False) -> None:
        self.timeout = timeout
        self.verify = verify
        self._timeout_reason = f"timeout after {timeout:g}s"
        self._connect_timeout_reason = f"connect timeout after {timeout:g}s"
        self._ssl: ssl.SSLContext | None = None
        self._default: ScrapeSession | None = None

    @property
    def ssl_context(self) -> ssl.SSLContext:
        """Built once, on the first https endpoint (loading the CA store takes tens of milliseconds)."""
        if self._ssl is None:
            self._ssl = client_ssl_context(insecure_skip_verify=not self.verify)
        return self._ssl

    def session(self, *, accept: str = _ACCEPT, max_body: int = 0, text_plain: bool = True) -> ScrapeSession:
        """A client for one endpoint's polls (one kept-alive connection); close it with `aclose()`. The
        defaults fetch a metrics page (at most `MAX_PAGE_BYTES`); a JSON source asks for `application/json` and
        takes any content type."""
        return ScrapeSession(self, accept=accept, max_body=max_body, text_plain=text_plain)

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
    """One endpoint's polls. The connection follows the URL: a URL on another origin replaces it.
    `text_plain`: only a text/plain answer is a page (metrics); otherwise any content type is returned."""

    def __init__(self, scraper: Scraper, *, accept: str = _ACCEPT, max_body: int = 0, text_plain: bool = True) -> None:
        self._scraper = scraper
        self._accept = accept
        self._max_body = max_body or MAX_PAGE_BYTES
        self._text_plain = text_plain
        self._url: str | None = None
        self._origin: tuple[str, str, int] | None = None
        self._path = "/"
        self._conn: HTTPConnection | None = None

    async def fetch(self, url: str) -> bytes:
        """The body of a 200 (text/plain) answer from `url`; raises ScrapeError otherwise."""
        if url != self._url:
            self._target(url)
        conn = self._conn
        assert conn is not None
        try:
            response = await conn.get(self._path, self._scraper.timeout)
        except HTTPTimeoutError as e:
            if e.connecting:
                raise ScrapeError(self._scraper._connect_timeout_reason) from None
            raise ScrapeError(self._scraper._timeout_reason) from None
        except ConnectError as e:
            raise ScrapeError(_connect_reason(e)) from None
        except ConnectionClosedError:
            raise ScrapeError("connection closed before the page was complete") from None
        except BodyTooLargeError:
            raise ScrapeError(f"page larger than {self._max_body >> 20} MiB") from None
        except ProtocolError as e:
            raise ScrapeError(f"HTTP protocol error ({e})") from None
        except HTTPClientError as e:
            raise ScrapeError(f"transport error ({type(e).__name__})") from None
        if response.status != 200:
            raise ScrapeError(f"HTTP {response.status}")
        if not self._text_plain:
            return response.body
        ctype = response.headers.get("content-type", "")
        if ctype and not ctype.lower().startswith("text/plain"):
            raise ScrapeError(f"content type {ctype.split(';', 1)[0].strip()}, not text/plain")
        return response.body

    def _target(self, url: str) -> None:
        """Points the session at `url`, replacing the connection when the origin changes."""
        try:
            parts = urlsplit(url)
            scheme, host, port = parts.scheme.lower(), parts.hostname, parts.port
        except ValueError:
            raise ScrapeError(f"invalid URL {url!r}") from None
        if scheme not in ("http", "https") or not host:
            raise ScrapeError(f"invalid URL {url!r}")
        tls = scheme == "https"
        origin = (scheme, host, port or (443 if tls else 80))
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        try:
            conn = self._conn
            if conn is None or origin != self._origin:
                ctx = self._scraper.ssl_context if tls else None
                conn = HTTPConnection(host, origin[2], ssl_context=ctx, accept=self._accept, max_body=self._max_body)
            conn.request_bytes(path)  # checks the path
        except ValueError:  # a non-ASCII host, a path with spaces or control characters
            raise ScrapeError(f"invalid URL {url!r}") from None
        if conn is not self._conn:
            if self._conn is not None:
                self._conn.close()
            self._conn, self._origin = conn, origin
        self._url, self._path = url, path

    async def aclose(self) -> None:
        if self._conn is not None:
            await self._conn.aclose()
