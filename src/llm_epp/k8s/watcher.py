"""Watches one InferencePool and the pods its selector picks, keeping the datastore equal to the endpoint set
that `discovery.endpoints_for` computes from them.

Each watch runs list-then-watch in a daemon worker thread with the official `kubernetes` client: it resumes
from the last resourceVersion seen (events and bookmarks), relists on 410 Gone, and reconnects with capped
exponential backoff after errors or dropped connections. Every change recomputes the whole endpoint set and
posts `datastore.replace_all(...)` to the event loop with `loop.call_soon_threadsafe` (the datastore is only
touched on the loop), so a reconnect or relist can neither lose nor duplicate an endpoint. A deleted (or
deleting, or missing) pool clears the datastore and marks it not synced."""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

from kubernetes import client as _client
from kubernetes import config as _config
from kubernetes import watch as _watch

from llm_epp.datalayer.datastore import Datastore
from llm_epp.framework.types import EndpointMetadata
from llm_epp.k8s.discovery import DEFAULT_POOL_GROUP, POOL_PLURAL, POOL_VERSION, PoolSpec, endpoints_for, pool_spec

log = logging.getLogger(__name__)

# the client's partial annotations do not help here; treat it as untyped
client: Any = _client
config: Any = _config
watch: Any = _watch

HTTP_GONE = 410


def api_client_from_environment() -> Any:
    """An `ApiClient` from the in-cluster service account, else from kubeconfig ($KUBECONFIG or ~/.kube/config)."""
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    return client.ApiClient()


def _rv_of(obj: Any) -> str | None:
    if isinstance(obj, dict):
        meta = obj.get("metadata")
        if isinstance(meta, dict):
            rv = meta.get("resourceVersion")
            return str(rv) if rv else None
    return None


class _Restart(Exception):
    """The watch must start over with a fresh list (410 Gone or a new selector)."""


class PoolWatcher:
    """`start()` launches the pool and pod watch threads; `stop()` closes the watches and joins them."""

    def __init__(
        self,
        api_client: Any,
        namespace: str,
        pool_name: str,
        pool_group: str,
        datastore: Datastore,
        loop: asyncio.AbstractEventLoop,
        *,
        on_sync: Callable[[bool], None] | None = None,
        watch_timeout: int = 300,
        connect_timeout: float = 10.0,
        backoff_initial: float = 0.5,
        backoff_max: float = 30.0,
    ) -> None:
        self.api_client = api_client
        self.namespace = namespace
        self.pool_name = pool_name
        self.pool_group = pool_group or DEFAULT_POOL_GROUP
        self.datastore = datastore
        self.loop = loop
        self.on_sync = on_sync
        self.watch_timeout = watch_timeout
        self.connect_timeout = connect_timeout
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self._core = client.CoreV1Api(api_client)
        self._custom = client.CustomObjectsApi(api_client)
        self._cond = threading.Condition()
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self._watches: dict[str, Any] = {}
        self._rvs: dict[str, str] = {}
        # state below is guarded by _cond
        self._pool_listed = False
        self._pool: PoolSpec | None = None
        self._selector_gen = 0  # bumped whenever the pool's label selector changes (or the pool goes away)
        self._pods: dict[str, dict[str, Any]] = {}
        self._pods_gen = -1  # the selector generation `_pods` was listed with

    # --- lifecycle -------------------------------------------------------------------------------------
    def start(self) -> None:
        for name, target in (("pool", self._run_pool), ("pods", self._run_pods)):
            t = threading.Thread(target=target, name=f"k8s-watch-{name}", daemon=True)
            self._threads.append(t)
            t.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stopping.set()
        with self._cond:
            self._cond.notify_all()
            watches = list(self._watches.values())
        for resp in watches:
            self._shutdown(resp)
        for t in self._threads:
            t.join(timeout)
        self._threads.clear()

    def resource_versions(self) -> dict[str, str]:
        """The resourceVersion each watch would resume from (for diagnostics and tests)."""
        with self._cond:
            return dict(self._rvs)

    # --- publishing ------------------------------------------------------------------------------------
    def _publish_locked(self) -> None:
        """Post the endpoint set for the current state (caller holds `_cond`; posts keep state order)."""
        if not self._pool_listed:
            return
        endpoints: list[EndpointMetadata] | None
        if self._pool is None:
            endpoints = None
        elif self._pods_gen != self._selector_gen:
            return  # pods of the current selector not listed yet
        else:
            endpoints = endpoints_for(self._pool, self._pods.values())
        try:
            self.loop.call_soon_threadsafe(self._apply, endpoints)
        except RuntimeError:  # loop closed: shutting down
            pass

    def _apply(self, endpoints: list[EndpointMetadata] | None) -> None:
        if endpoints is None:
            self.datastore.clear()
            self.datastore.synced = False
        else:
            self.datastore.replace_all(endpoints)
        if self.on_sync is not None:
            self.on_sync(self.datastore.synced)

    # --- list/watch machinery --------------------------------------------------------------------------
    def _sleep(self, seconds: float) -> bool:
        """Interruptible sleep; False when stopping."""
        return not self._stopping.wait(seconds)

    def _stream(
        self, key: str, valid: Callable[[], bool], func: Callable[..., Any], rv: str, **kwargs: Any
    ) -> Iterator[dict[str, Any]]:
        """One watch connection from `rv`. Its response is registered under the lock once open, so `stop()` or a
        selector change can shut its socket down; `valid()` False (checked under the lock) raises `_Restart`."""
        w = watch.Watch(return_type="object")

        def call(*args: Any, **kw: Any) -> Any:
            resp = func(*args, **kw)
            with self._cond:
                stale = self._stopping.is_set() or not valid()
                if not stale:
                    self._watches[key] = resp
            if stale:
                resp.close()
                resp.release_conn()
                raise _Restart
            return resp

        try:
            yield from w.stream(
                call,
                resource_version=rv,
                timeout_seconds=self.watch_timeout,
                allow_watch_bookmarks=True,
                _request_timeout=(self.connect_timeout, self.watch_timeout + 30),
                **kwargs,
            )
        finally:
            with self._cond:
                self._watches.pop(key, None)

    @staticmethod
    def _shutdown(resp: Any) -> None:
        """Unblock a thread reading this watch response (closing alone does not interrupt a blocked read)."""
        sock = getattr(getattr(resp, "connection", None), "sock", None)
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _note_rv(self, key: str, rv: str) -> None:
        with self._cond:
            self._rvs[key] = rv

    def _loop(
        self,
        key: str,
        list_once: Callable[[], str],
        watch_once: Callable[[str], str],
    ) -> None:
        """Run list-then-watch until stopping. `list_once` returns the list's resourceVersion, `watch_once` the
        last resourceVersion it saw; either raises `_Restart` to relist."""
        backoff = self.backoff_initial
        with self._cond:
            self._rvs.pop(key, None)
        while not self._stopping.is_set():
            with self._cond:  # the last version seen (events and bookmarks), None = list first
                rv = self._rvs.get(key)
            try:
                if rv is None:
                    self._note_rv(key, list_once())
                    backoff = self.backoff_initial
                    continue
                self._note_rv(key, watch_once(rv))
                backoff = self.backoff_initial
            except _Restart:
                self._forget_rv(key)
            except client.ApiException as e:
                if self._stopping.is_set():
                    break
                if e.status == HTTP_GONE:
                    log.info("k8s_watch_expired resource=%s; relisting", key)
                    self._forget_rv(key)
                    continue
                log.warning(
                    "k8s_watch_error resource=%s status=%s reason=%s retry_in=%.1fs", key, e.status, e.reason, backoff
                )
                self._sleep(backoff)
                backoff = min(backoff * 2, self.backoff_max)
            except Exception as e:  # dropped connections, timeouts, refused connects
                if self._stopping.is_set():
                    break
                log.warning("k8s_watch_error resource=%s error=%s retry_in=%.1fs", key, type(e).__name__, backoff)
                self._sleep(backoff)
                backoff = min(backoff * 2, self.backoff_max)

    def _forget_rv(self, key: str) -> None:
        with self._cond:
            self._rvs.pop(key, None)

    # --- the pool ----------------------------------------------------------------------------------------
    def _set_pool_locked(self, obj: dict[str, Any] | None) -> None:
        meta = obj.get("metadata") if isinstance(obj, dict) else None
        if (
            obj is None
            or not isinstance(meta, dict)
            or meta.get("name") != self.pool_name
            or meta.get("deletionTimestamp")
        ):
            spec = None
        else:
            spec = pool_spec(obj)
        old = self._pool
        self._pool = spec
        if (old.label_selector if old else None) != (spec.label_selector if spec else None):
            self._selector_gen += 1
            if "pods" in self._watches:  # the pod thread relists with the new selector
                self._shutdown(self._watches["pods"])
            self._cond.notify_all()
        if old != spec:
            log.info("k8s_pool_changed pool=%s/%s present=%s", self.namespace, self.pool_name, spec is not None)

    def _run_pool(self) -> None:
        selector = f"metadata.name={self.pool_name}"
        args = (self.pool_group, POOL_VERSION, self.namespace, POOL_PLURAL)

        def list_once() -> str:
            result = self._custom.list_namespaced_custom_object(
                *args, field_selector=selector, _request_timeout=(self.connect_timeout, 60)
            )
            items = [i for i in result.get("items") or [] if isinstance(i, dict)]
            found = next((i for i in items if i.get("metadata", {}).get("name") == self.pool_name), None)
            with self._cond:
                self._pool_listed = True
                self._set_pool_locked(found)
                self._publish_locked()
            return str(result.get("metadata", {}).get("resourceVersion") or "")

        def watch_once(rv: str) -> str:
            for event in self._stream(
                "pool",
                lambda: True,
                self._custom.list_namespaced_custom_object,
                rv,
                group=args[0],
                version=args[1],
                namespace=args[2],
                plural=args[3],
                field_selector=selector,
            ):
                obj = event.get("raw_object")
                typ = event.get("type")
                if typ in ("ADDED", "MODIFIED", "DELETED"):
                    with self._cond:
                        self._set_pool_locked(None if typ == "DELETED" else obj)
                        self._publish_locked()
                rv = _rv_of(obj) or rv
                self._note_rv("pool", rv)
            return rv

        self._loop("pool", list_once, watch_once)

    # --- the pods ------------------------------------------------------------------------------------------
    def _run_pods(self) -> None:
        def current() -> tuple[int, str] | None:
            """Wait for a pool; its selector generation and label selector, or None when stopping."""
            with self._cond:
                while not self._stopping.is_set():
                    if self._pool is not None and self._pool.match_labels:
                        return self._selector_gen, self._pool.label_selector
                    self._cond.wait(1.0)
            return None

        state: dict[str, Any] = {}

        def list_once() -> str:
            sel = current()
            if sel is None:
                return ""
            gen, selector = sel
            result = self._core.list_namespaced_pod(
                self.namespace, label_selector=selector, _request_timeout=(self.connect_timeout, 60)
            )
            pods = {p["metadata"]["name"]: p for p in map(self.api_client.sanitize_for_serialization, result.items)}
            with self._cond:
                if gen != self._selector_gen:
                    raise _Restart
                self._pods = pods
                self._pods_gen = gen
                self._publish_locked()
            state["gen"], state["selector"] = gen, selector
            return str(result.metadata.resource_version or "")

        def watch_once(rv: str) -> str:
            if self._stopping.is_set():
                return rv
            gen = state["gen"]

            def valid() -> bool:
                return bool(gen == self._selector_gen)

            try:
                for event in self._stream(
                    "pods",
                    valid,
                    self._core.list_namespaced_pod,
                    rv,
                    namespace=self.namespace,
                    label_selector=state["selector"],
                ):
                    obj = event.get("raw_object")
                    typ = event.get("type")
                    with self._cond:
                        if not valid():
                            raise _Restart
                        if typ in ("ADDED", "MODIFIED", "DELETED") and isinstance(obj, dict):
                            name = obj.get("metadata", {}).get("name")
                            if typ == "DELETED":
                                self._pods.pop(name, None)
                            else:
                                self._pods[name] = obj
                            self._publish_locked()
                    rv = _rv_of(obj) or rv
                    self._note_rv("pods", rv)
            except _Restart:
                raise
            except Exception:
                with self._cond:  # closed because the selector changed: relist rather than back off
                    if not valid():
                        raise _Restart from None
                raise
            with self._cond:
                if gen != self._selector_gen:
                    raise _Restart
            return rv

        self._loop("pods", list_once, watch_once)
