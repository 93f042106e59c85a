"""The sidecar's HTTP server: aiohttp in front of the local model server.

Every request goes to the local model server unchanged, except a POST to an OpenAI-style inference path
carrying `x-prefiller-host-port`: then the prefill leg runs first on that pod (see `protocol`). Prefill
answers with HTTP 400-451 are returned to the client as they are (the request itself is bad); any other
prefill failure (connection error, timeout, 5xx, an answer without `kv_transfer_params`) is logged and
the request is decoded locally without disaggregation."""

from __future__ import annotations

import asyncio
import logging
import random
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

from llm_epp.framework.types import split_host_port
from llm_epp.pdsidecar import decision as d
from llm_epp.pdsidecar import protocol as p
from llm_epp.pdsidecar.allowlist import Allowlist

log = logging.getLogger(__name__)

NIXLV2, SGLANG, KV_CONNECTORS = p.NIXLV2, p.SGLANG, p.KV_CONNECTORS
DEFAULT_SGLANG_BOOTSTRAP_PORT = p.DEFAULT_SGLANG_BOOTSTRAP_PORT

_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)
_ROUTING = frozenset({p.PREFILL_HEADER, p.ENCODER_HEADER, p.KV_CACHE_SOURCE_HEADER})
_JSON = {"Content-Type": "application/json"}


@dataclass(frozen=True)
class SidecarConfig:
    decoder_url: str  # e.g. http://127.0.0.1:8200
    kv_connector: str = NIXLV2
    enable_prefiller_sampling: bool = False
    allowlist: Allowlist = field(default_factory=Allowlist)
    sglang_bootstrap_port: int = DEFAULT_SGLANG_BOOTSTRAP_PORT
    prefill_scheme: str = "http"
    prefill_timeout_s: float = 600.0
    prefill_max_retries: int = 0
    prefill_retry_backoff_s: float = 0.2
    sampler: Callable[[int], int] = field(default=lambda n: random.randrange(n), repr=False)


def _forward_headers(headers: Mapping[str, str], drop: Iterable[str] = ()) -> CIMultiDict[str]:
    skip = _HOP_BY_HOP | _ROUTING | {d.lower() for d in drop}
    out: CIMultiDict[str] = CIMultiDict()
    for k, v in headers.items():
        if k.lower() not in skip:
            out.add(k, v)
    return out


def _response_headers(headers: CIMultiDictProxy[str], drop_encoding: bool = False) -> CIMultiDict[str]:
    out: CIMultiDict[str] = CIMultiDict()
    for k, v in headers.items():
        lk = k.lower()
        if lk in _HOP_BY_HOP or (drop_encoding and lk == "content-encoding"):
            continue
        out.add(k, v)
    return out


def _error(status: int, message: str, kind: str) -> web.Response:
    body = orjson.dumps({"object": "error", "message": message, "type": kind, "code": status})
    return web.Response(status=status, body=body, headers=_JSON)


class PrefillFallback(Exception):
    """The prefill leg failed in a way local decoding can absorb."""


class Sidecar:
    def __init__(self, config: SidecarConfig) -> None:
        if config.kv_connector not in KV_CONNECTORS:
            raise ValueError(
                f"--kv-connector {config.kv_connector!r} is not supported; use one of {', '.join(KV_CONNECTORS)}"
            )
        self.config = config
        self._decoder = config.decoder_url.rstrip("/")
        self._session: aiohttp.ClientSession | None = None
        self._background: set[asyncio.Task[None]] = set()

    # --- lifecycle --------------------------------------------------------------------------------
    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_get("/health", self._health)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        app.on_startup.append(self._start)
        app.on_cleanup.append(self._stop)
        return app

    async def _start(self, app: web.Application) -> None:
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
        connector = aiohttp.TCPConnector(limit=0)
        self._session = aiohttp.ClientSession(timeout=timeout, connector=connector, auto_decompress=False)

    async def _stop(self, app: web.Application) -> None:
        for task in list(self._background):
            task.cancel()
        if self._session is not None:
            await self._session.close()

    @property
    def session(self) -> aiohttp.ClientSession:
        assert self._session is not None, "the sidecar app is not running"
        return self._session

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    # --- routing ----------------------------------------------------------------------------------
    async def _handle(self, request: web.Request) -> web.StreamResponse:
        cfg = self.config
        plan = d.plan_request(
            request.method,
            request.path,
            request.headers.getall(p.PREFILL_HEADER, []),
            sampling=cfg.enable_prefiller_sampling,
            sampler=cfg.sampler,
            allowed=cfg.allowlist.allows,
        )
        if plan.kind is d.PlanKind.PASS_THROUGH:
            return await self._pass_through(request)
        target = plan.target
        if plan.kind is d.PlanKind.DENIED:
            log.warning(
                "pd_sidecar_prefill_target_denied target=%r client=%s path=%s user_agent=%r",
                target,
                request.remote,
                request.path,
                request.headers.get("User-Agent", ""),
            )
            return _error(403, "Forbidden: prefill target not allowed by SSRF protection", "Forbidden")
        raw = await request.read()
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError as e:
            return _error(400, f"request body is not valid JSON: {e}", "BadRequestError")
        if not isinstance(body, dict):
            return _error(400, "request body must be a JSON object", "BadRequestError")
        if cfg.kv_connector == SGLANG:
            return await self._sglang(request, body, target)
        assert plan.style is not None
        return await self._nixl(request, body, target, plan.style)

    def _url(self, hostport: str, path: str) -> str:
        return f"{self.config.prefill_scheme}://{hostport}{path}"

    def _decoder_down(self, error: Exception) -> web.Response:
        log.error("pd_sidecar_decoder_unreachable url=%s error=%s", self._decoder, error)
        return _error(503, "The decode node is not ready: the local model server did not answer", "ServiceUnavailable")

    # --- legs -------------------------------------------------------------------------------------
    async def _pass_through(self, request: web.Request, body: bytes | None = None) -> web.StreamResponse:
        data = await request.read() if body is None else body
        url = self._decoder + str(request.rel_url)
        try:
            upstream = await self.session.request(
                request.method, url, headers=_forward_headers(request.headers), data=data
            )
        except aiohttp.ClientError as e:
            log.error("pd_sidecar_decoder_unreachable url=%s error=%s", self._decoder, e)
            return _error(
                503, "The decode node is not ready: the local model server did not answer", "ServiceUnavailable"
            )
        async with upstream:
            return await self._relay(request, upstream)

    async def _relay(
        self, request: web.Request, upstream: aiohttp.ClientResponse, cached: int | None = None
    ) -> web.StreamResponse:
        """Streams the model server's answer to the client; with `cached` set, the usage's cached-token
        count is replaced (the body is decoded, so `Accept-Encoding: identity` was asked for)."""
        rewrite = cached is not None and 200 <= upstream.status < 300
        response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
        response.headers.extend(_response_headers(upstream.headers, drop_encoding=rewrite))
        ctype = upstream.headers.get("Content-Type", "")
        if rewrite and "text/event-stream" not in ctype:
            raw = await upstream.read()
            assert cached is not None
            data = p.rewrite_json(raw, cached)
            response.content_length = len(data)
            await response.prepare(request)
            await response.write(data)
            await response.write_eof()
            return response
        await response.prepare(request)
        sse = p.SseRewriter(cached) if rewrite and cached is not None else None
        async for chunk in upstream.content.iter_any():
            await response.write(sse.feed(chunk) if sse is not None else chunk)
        if sse is not None:
            tail = sse.flush()
            if tail:
                await response.write(tail)
        await response.write_eof()
        return response

    async def _nixl(
        self, request: web.Request, body: dict[str, Any], target: str, style: p.ApiStyle
    ) -> web.StreamResponse:
        request_id = str(uuid.uuid4())
        headers = _forward_headers(request.headers, drop=("accept-encoding", p.REQUEST_ID_HEADER))
        headers[p.REQUEST_ID_HEADER] = request_id
        headers["Accept-Encoding"] = "identity"
        prefill_body = orjson.dumps(p.nixl_prefill_body(body, style))
        try:
            answer = await self._prefill(target, request.path, headers, prefill_body, request_id)
        except PrefillFallback as e:
            log.warning("pd_sidecar_prefill_fallback target=%s request_id=%s reason=%s", target, request_id, e)
            return await self._pass_through(request, orjson.dumps(body))
        if isinstance(answer, web.Response):
            return answer
        cached = p.cached_tokens(answer) or 0
        decode_body = orjson.dumps(p.nixl_decode_body(body, answer[p.KV_TRANSFER_PARAMS]))
        try:
            upstream = await self.session.post(self._decoder + str(request.rel_url), headers=headers, data=decode_body)
        except aiohttp.ClientError as e:
            log.error("pd_sidecar_decoder_unreachable url=%s error=%s", self._decoder, e)
            return _error(
                503, "The decode node is not ready: the local model server did not answer", "ServiceUnavailable"
            )
        async with upstream:
            return await self._relay(request, upstream, cached)

    async def _prefill(
        self, target: str, path: str, headers: CIMultiDict[str], body: bytes, request_id: str
    ) -> dict[str, Any] | web.Response:
        """The prefill answer (a JSON object with `kv_transfer_params`), or the response to return to the
        client (prefill said 400-451). Raises PrefillFallback for failures local decoding absorbs."""
        timeout = aiohttp.ClientTimeout(total=self.config.prefill_timeout_s)
        attempt = 0
        while True:
            failure, raw, ctype, status = "", b"", "application/json", 0
            try:
                url = self._url(target, path)
                async with self.session.post(url, headers=headers, data=body, timeout=timeout) as resp:
                    raw = await resp.read()
                    status = resp.status
                    ctype = resp.headers.get("Content-Type", ctype)
            except (TimeoutError, aiohttp.ClientError) as e:
                failure = f"prefill request failed: {e!r}"
            answer: Any = None
            if not failure and 200 <= status < 300:
                try:
                    answer = orjson.loads(raw)
                except orjson.JSONDecodeError:
                    answer = None
            outcome = d.classify_prefill(status, answer, failure=failure)
            if outcome.verdict is not d.PrefillVerdict.RETRY:
                break
            if attempt >= self.config.prefill_max_retries:
                raise PrefillFallback(outcome.reason)
            attempt += 1
            log.info("pd_sidecar_prefill_retry target=%s request_id=%s attempt=%d", target, request_id, attempt)
            await asyncio.sleep(self.config.prefill_retry_backoff_s)
        if outcome.verdict is d.PrefillVerdict.REJECT:
            log.info("pd_sidecar_prefill_rejected target=%s request_id=%s status=%d", target, request_id, status)
            return web.Response(status=status, body=raw, headers={"Content-Type": ctype})
        if outcome.verdict is d.PrefillVerdict.FALLBACK:
            raise PrefillFallback(outcome.reason)
        assert isinstance(answer, dict)
        return answer

    async def _sglang(self, request: web.Request, body: dict[str, Any], target: str) -> web.StreamResponse:
        host, _ = split_host_port(target)
        room = random.getrandbits(63)
        both = orjson.dumps(p.sglang_body(body, host, self.config.sglang_bootstrap_port, room))
        headers = _forward_headers(request.headers)
        task = asyncio.create_task(self._sglang_prefill(target, request.path, headers, both, room))
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        try:
            upstream = await self.session.post(self._decoder + str(request.rel_url), headers=headers, data=both)
        except aiohttp.ClientError as e:
            log.error("pd_sidecar_decoder_unreachable url=%s error=%s", self._decoder, e)
            return _error(
                503, "The decode node is not ready: the local model server did not answer", "ServiceUnavailable"
            )
        async with upstream:
            return await self._relay(request, upstream)

    async def _sglang_prefill(self, target: str, path: str, headers: CIMultiDict[str], body: bytes, room: int) -> None:
        try:
            async with self.session.post(self._url(target, path), headers=headers, data=body) as resp:
                await resp.read()
                if not 200 <= resp.status < 300:
                    log.warning(
                        "pd_sidecar_sglang_prefill_failed target=%s room=%d status=%d", target, room, resp.status
                    )
        except (TimeoutError, aiohttp.ClientError) as e:
            log.warning("pd_sidecar_sglang_prefill_failed target=%s room=%d error=%r", target, room, e)
