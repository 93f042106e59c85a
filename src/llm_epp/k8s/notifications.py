"""The watch behind `k8s-notification-source`: list-then-watch of one kind of Kubernetes object in one
namespace with the official `kubernetes` client, in a daemon worker thread, posting an `ObjectEvent` to the
event loop for every object added, changed or deleted.

The kind's plural and scope come from API discovery (`/api/v1`, `/apis/<group>/<version>`). A list gives an
`add-or-update` event per object whose resourceVersion is new, and a `delete` event per object known
before and absent now (so a relist after 410 Gone or a dropped watch loses nothing); watch events give the
same, and an update that does not change the resourceVersion gives none (as the reference's
ResourceVersionChanged predicate). Errors reconnect with capped exponential backoff."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
from collections.abc import Callable
from typing import Any

from kubernetes import client as _client

from llm_epp.framework.datalayer import EVENT_ADD_OR_UPDATE, EVENT_DELETE, GroupVersionKind, ObjectEvent

log = logging.getLogger(__name__)

client: Any = _client
HTTP_GONE = 410


class _Relist(Exception):
    """Start over with a fresh list (410 Gone)."""


class _HTTPError(Exception):
    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status
        self.body = body


class ObjectWatcher:
    """`start()` launches the watch thread; `stop()` closes the watch and joins it."""

    def __init__(
        self,
        api_client: Any,
        namespace: str,
        gvk: GroupVersionKind,
        loop: asyncio.AbstractEventLoop,
        on_event: Callable[[ObjectEvent], None],
        *,
        watch_timeout: int = 300,
        connect_timeout: float = 10.0,
        backoff_initial: float = 0.5,
        backoff_max: float = 30.0,
    ) -> None:
        self.api = api_client
        self.namespace = namespace
        self.gvk = gvk
        self.loop = loop
        self.on_event = on_event
        self.watch_timeout = watch_timeout
        self.connect_timeout = connect_timeout
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._resp: Any = None
        self._thread: threading.Thread | None = None
        self._known: dict[tuple[str, str], str] = {}  # (namespace, name) -> resourceVersion
        self._listed = False
        self.path = ""  # the collection's path, once discovered

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"k8s-notify-{self.gvk.kind.lower()}", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stopping.set()
        with self._lock:
            resp = self._resp
        if resp is not None:
            _shutdown(resp)
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    # --- the loop ----------------------------------------------------------------------------------------
    def _run(self) -> None:
        backoff = self.backoff_initial
        rv: str | None = None
        while not self._stopping.is_set():
            try:
                if not self.path:
                    self.path = self._discover()
                if rv is None:
                    rv = self._list()
                rv = self._watch(rv)
                backoff = self.backoff_initial
            except _Relist:
                log.info("k8s_notification_watch_expired gvk=%s; relisting", self.gvk)
                rv = None
            except Exception as e:  # API errors, dropped connections, timeouts, refused connects
                if self._stopping.is_set():
                    break
                log.warning(
                    "k8s_notification_watch_error gvk=%s error=%s retry_in=%.1fs", self.gvk, _describe(e), backoff
                )
                self._stopping.wait(backoff)
                backoff = min(backoff * 2, self.backoff_max)

    def _discover(self) -> str:
        g = self.gvk
        prefix = f"/apis/{g.group}/{g.version}" if g.group else f"/api/{g.version}"
        doc = json.loads(self._get(prefix, []).read())
        for res in doc.get("resources") or []:
            if res.get("kind") == g.kind and "/" not in str(res.get("name", "")):
                if res.get("namespaced", True):
                    return f"{prefix}/namespaces/{self.namespace}/{res['name']}"
                return f"{prefix}/{res['name']}"
        raise LookupError(f"the API server does not serve kind {g.kind} in {prefix}")

    def _list(self) -> str:
        doc = json.loads(self._get(self.path, []).read())
        seen: dict[tuple[str, str], str] = {}
        for obj in doc.get("items") or []:
            key, rv = _identity(obj)
            seen[key] = rv
            if self._known.get(key) != rv:
                self._post(ObjectEvent(EVENT_ADD_OR_UPDATE, obj))
        for key in [k for k in self._known if k not in seen]:
            self._post(ObjectEvent(EVENT_DELETE, {"metadata": {"namespace": key[0], "name": key[1]}}))
        first = not self._listed
        self._known, self._listed = seen, True
        if first:
            log.info("k8s_notification_source_synced gvk=%s path=%s objects=%d", self.gvk, self.path, len(seen))
        return str((doc.get("metadata") or {}).get("resourceVersion") or "")

    def _watch(self, rv: str) -> str:
        query = [
            ("watch", "true"),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", str(self.watch_timeout)),
        ]
        if rv:
            query.append(("resourceVersion", rv))
        resp = self._get(self.path, query, read_timeout=self.watch_timeout + 30)
        with self._lock:
            if self._stopping.is_set():
                _shutdown(resp)
                return rv
            self._resp = resp
        try:
            for line in _lines(resp.response):
                event = json.loads(line)
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == HTTP_GONE:
                        raise _Relist
                    raise _HTTPError(int(obj.get("code") or 500), json.dumps(obj).encode())
                new_rv = str((obj.get("metadata") or {}).get("resourceVersion") or "")
                if kind == "BOOKMARK":
                    rv = new_rv or rv
                    continue
                key, obj_rv = _identity(obj)
                if kind == "DELETED":
                    self._known.pop(key, None)
                    self._post(ObjectEvent(EVENT_DELETE, obj))
                elif kind in ("ADDED", "MODIFIED") and self._known.get(key) != obj_rv:
                    self._known[key] = obj_rv
                    self._post(ObjectEvent(EVENT_ADD_OR_UPDATE, obj))
                rv = new_rv or rv
        finally:
            with self._lock:
                self._resp = None
            resp.response.release_conn()
        return rv

    # --- helpers -----------------------------------------------------------------------------------------
    def _get(self, path: str, query: list[tuple[str, str]], read_timeout: float | None = None) -> Any:
        method, url, headers, _body, _post = self.api.param_serialize(
            "GET",
            path,
            query_params=query,
            header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"],
        )
        resp = self.api.call_api(
            method,
            url,
            header_params=headers,
            _request_timeout=(self.connect_timeout, read_timeout or self.connect_timeout * 3),
        )
        if resp.status == HTTP_GONE:
            raise _Relist
        if not 200 <= resp.status < 300:
            raise _HTTPError(resp.status, resp.read() or b"")
        return resp

    def _post(self, event: ObjectEvent) -> None:
        try:
            self.loop.call_soon_threadsafe(self.on_event, event)
        except RuntimeError:  # the loop is closed: shutting down
            pass


def _lines(response: Any) -> Any:
    """The newline-delimited JSON events of a watch response, as they arrive."""
    buf = b""
    for chunk in response.stream(4096, decode_content=True):
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            if line.strip():
                yield line
    if buf.strip():
        yield buf


def _identity(obj: Any) -> tuple[tuple[str, str], str]:
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    meta = meta if isinstance(meta, dict) else {}
    return (str(meta.get("namespace") or ""), str(meta.get("name") or "")), str(meta.get("resourceVersion") or "")


def _shutdown(resp: Any) -> None:
    """Unblocks the thread reading this response (closing alone does not interrupt a blocked read)."""
    raw = getattr(resp, "response", resp)
    sock = getattr(getattr(raw, "connection", None), "sock", None)
    if sock is None:
        fp = getattr(raw, "_fp", None)
        sock = getattr(getattr(fp, "raw", None), "_sock", None) or getattr(fp, "_sock", None)
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def _describe(err: Exception) -> str:
    if isinstance(err, _HTTPError):
        return f"HTTP {err.status}"
    return str(err) if isinstance(err, LookupError) else type(err).__name__
