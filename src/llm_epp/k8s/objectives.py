"""Watches InferenceObjectives and InferenceModelRewrites (`inference.networking.x-k8s.io/v1alpha2`) of this
EPP's pool and keeps an `ObjectivesStore` equal to what they say, like the reference EPP's two reconcilers.

On `start()`, API discovery decides which of the two resources the cluster serves; each one present gets a
list-then-watch daemon thread (resume from the last resourceVersion, relist on 410 Gone, capped exponential
backoff). Only objects whose `spec.poolRef` names this pool (name, and group defaulting to
`inference.networking.k8s.io`) count. After every change the whole `ObjectivesConfig` is rebuilt and posted to
the event loop as `store.replace(...)`. With neither CRD installed nothing starts (logged once at info)."""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from kubernetes import client as _client
from kubernetes import watch as _watch

from llm_epp.datalayer.objectives import ObjectivesConfig, ObjectivesStore, RewriteRule
from llm_epp.k8s.discovery import DEFAULT_POOL_GROUP

log = logging.getLogger(__name__)

client: Any = _client
watch: Any = _watch

OBJECTIVE_GROUP = "inference.networking.x-k8s.io"
OBJECTIVE_VERSION = "v1alpha2"
OBJECTIVES_PLURAL = "inferenceobjectives"
REWRITES_PLURAL = "inferencemodelrewrites"
HTTP_GONE = 410
HTTP_NOT_FOUND = 404


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def served_resources(api_client: Any, group: str, version: str) -> set[str]:
    """Plural names the API server serves in `group/version`; empty when the group/version is not installed."""
    try:
        result = client.CustomObjectsApi(api_client).get_api_resources(group, version, _request_timeout=(10, 30))
    except client.ApiException as e:
        if e.status == HTTP_NOT_FOUND:
            return set()
        raise
    return {str(r.name) for r in result.resources or []}


def pool_ref_matches(obj: Mapping[str, Any], pool_name: str, pool_group: str) -> bool:
    ref = _dict(_dict(obj.get("spec")).get("poolRef"))
    return ref.get("name") == pool_name and (ref.get("group") or DEFAULT_POOL_GROUP) == pool_group


def _created(obj: Mapping[str, Any]) -> datetime:
    raw = _dict(obj.get("metadata")).get("creationTimestamp")
    if isinstance(raw, str):
        try:
            parsed = datetime.fromisoformat(raw)
        except ValueError:
            pass
        else:
            return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)
    return datetime.max.replace(tzinfo=UTC)  # unknown age: after every dated object


def _age_key(obj: Mapping[str, Any]) -> tuple[datetime, str, str]:
    meta = _dict(obj.get("metadata"))
    return _created(obj), str(meta.get("namespace") or ""), str(meta.get("name") or "")


def build_config(objectives: Iterable[Mapping[str, Any]], rewrites: Iterable[Mapping[str, Any]]) -> ObjectivesConfig:
    """The `ObjectivesConfig` for these (already pool-filtered) objects. Priority = `spec.priority`, unset 0.
    Rewrite precedence as the reference: an exact model match beats a generic rule (no `matches`); among
    candidates of one kind the oldest object (creationTimestamp; then namespace/name) wins; within an object
    the first rule wins. Malformed matches, targets and rules (which the CRD schema rejects) are skipped."""
    priorities: dict[str, int] = {}
    for obj in objectives:
        name = _dict(obj.get("metadata")).get("name")
        if isinstance(name, str) and name:
            priorities[name] = _int(_dict(obj.get("spec")).get("priority")) or 0

    exact: dict[str, RewriteRule] = {}
    generic: RewriteRule | None = None
    for obj in sorted(rewrites, key=_age_key):
        rewrite_name = str(_dict(obj.get("metadata")).get("name") or "")
        for raw_rule in _list(_dict(obj.get("spec")).get("rules")):
            raw_rule = _dict(raw_rule)
            targets = tuple(
                (t["modelRewrite"], max(_int(t.get("weight")) or 0, 0))
                for t in map(_dict, _list(raw_rule.get("targets")))
                if isinstance(t.get("modelRewrite"), str) and t["modelRewrite"]
            )
            if not targets:
                continue
            rule = RewriteRule(rewrite_name, targets)
            matches = _list(raw_rule.get("matches"))
            if not matches:
                if generic is None:
                    generic = rule
                continue
            for match in matches:
                model = _dict(_dict(match).get("model"))
                value = model.get("value")
                if (model.get("type") or "Exact") == "Exact" and isinstance(value, str) and value:
                    exact.setdefault(value, rule)
    return ObjectivesConfig(priorities, exact, generic)


class _Restart(Exception):
    """Relist from scratch."""


class ObjectivesWatcher:
    """`start()` checks discovery and launches one watch thread per served resource; `stop()` joins them."""

    def __init__(
        self,
        api_client: Any,
        namespace: str,
        pool_name: str,
        pool_group: str,
        store: ObjectivesStore,
        loop: asyncio.AbstractEventLoop,
        *,
        on_change: Callable[[ObjectivesConfig], None] | None = None,
        watch_timeout: int = 300,
        connect_timeout: float = 10.0,
        backoff_initial: float = 0.5,
        backoff_max: float = 30.0,
    ) -> None:
        self.api_client = api_client
        self.namespace = namespace
        self.pool_name = pool_name
        self.pool_group = pool_group or DEFAULT_POOL_GROUP
        self.store = store
        self.loop = loop
        self.on_change = on_change
        self.watch_timeout = watch_timeout
        self.connect_timeout = connect_timeout
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self._custom = client.CustomObjectsApi(api_client)
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self._kinds: tuple[str, ...] = ()
        # guarded by _lock
        self._watches: dict[str, Any] = {}
        self._rvs: dict[str, str] = {}
        self._objects: dict[str, dict[str, dict[str, Any]]] = {}  # plural -> name -> object (this pool only)
        self._listed: set[str] = set()

    @property
    def kinds(self) -> tuple[str, ...]:
        """The resources being watched (empty when the CRDs are absent or before `start()`)."""
        return self._kinds

    # --- lifecycle -------------------------------------------------------------------------------------
    def start(self) -> None:
        served = served_resources(self.api_client, OBJECTIVE_GROUP, OBJECTIVE_VERSION)
        self._kinds = tuple(p for p in (OBJECTIVES_PLURAL, REWRITES_PLURAL) if p in served)
        if not self._kinds:
            log.info("k8s_objectives_disabled reason=crds_absent group=%s/%s", OBJECTIVE_GROUP, OBJECTIVE_VERSION)
            return
        for plural in self._kinds:
            t = threading.Thread(target=self._run, args=(plural,), name=f"k8s-watch-{plural}", daemon=True)
            self._threads.append(t)
            t.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stopping.set()
        with self._lock:
            watches = list(self._watches.values())
        for resp in watches:
            sock = getattr(getattr(resp, "connection", None), "sock", None)
            if sock is not None:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        for t in self._threads:
            t.join(timeout)
        self._threads.clear()

    def resource_versions(self) -> dict[str, str]:
        with self._lock:
            return dict(self._rvs)

    # --- state -------------------------------------------------------------------------------------------
    def _set_locked(self, plural: str, obj: Any, deleted: bool) -> None:
        meta = _dict(_dict(obj).get("metadata"))
        name = meta.get("name")
        if not isinstance(name, str):
            return
        objects = self._objects.setdefault(plural, {})
        if deleted or meta.get("deletionTimestamp") or not pool_ref_matches(obj, self.pool_name, self.pool_group):
            objects.pop(name, None)
        else:
            objects[name] = obj

    def _publish_locked(self) -> None:
        if not all(k in self._listed for k in self._kinds):
            return
        config = build_config(
            self._objects.get(OBJECTIVES_PLURAL, {}).values(), self._objects.get(REWRITES_PLURAL, {}).values()
        )
        try:
            self.loop.call_soon_threadsafe(self._apply, config)
        except RuntimeError:  # loop closed: shutting down
            pass

    def _apply(self, config: ObjectivesConfig) -> None:
        self.store.replace(config)
        if self.on_change is not None:
            self.on_change(config)

    # --- list/watch -------------------------------------------------------------------------------------
    def _list(self, plural: str) -> str:
        result = self._custom.list_namespaced_custom_object(
            OBJECTIVE_GROUP, OBJECTIVE_VERSION, self.namespace, plural, _request_timeout=(self.connect_timeout, 60)
        )
        with self._lock:
            self._objects[plural] = {}
            for item in _list(_dict(result).get("items")):
                self._set_locked(plural, item, deleted=False)
            self._listed.add(plural)
            self._publish_locked()
        return str(_dict(_dict(result).get("metadata")).get("resourceVersion") or "")

    def _watch(self, plural: str, rv: str) -> str:
        def call(*args: Any, **kw: Any) -> Any:
            resp = self._custom.list_namespaced_custom_object(*args, **kw)
            with self._lock:
                if not self._stopping.is_set():
                    self._watches[plural] = resp
                    return resp
            resp.close()
            resp.release_conn()
            raise _Restart

        w = watch.Watch(return_type="object")
        try:
            for event in w.stream(
                call,
                group=OBJECTIVE_GROUP,
                version=OBJECTIVE_VERSION,
                namespace=self.namespace,
                plural=plural,
                resource_version=rv,
                timeout_seconds=self.watch_timeout,
                allow_watch_bookmarks=True,
                _request_timeout=(self.connect_timeout, self.watch_timeout + 30),
            ):
                obj = event.get("raw_object")
                typ = event.get("type")
                with self._lock:
                    if typ in ("ADDED", "MODIFIED", "DELETED"):
                        self._set_locked(plural, obj, deleted=typ == "DELETED")
                        self._publish_locked()
                    rv = str(_dict(_dict(obj).get("metadata")).get("resourceVersion") or rv)
                    self._rvs[plural] = rv
        finally:
            with self._lock:
                self._watches.pop(plural, None)
        return rv

    def _forget_rv(self, plural: str) -> None:
        with self._lock:
            self._rvs.pop(plural, None)

    def _run(self, plural: str) -> None:
        backoff = self.backoff_initial
        rv: str | None = None
        while not self._stopping.is_set():
            try:
                rv = self._list(plural) if rv is None else self._watch(plural, rv)
                with self._lock:
                    self._rvs[plural] = rv
                backoff = self.backoff_initial
                continue
            except _Restart:
                self._forget_rv(plural)
                rv = None
                continue
            except client.ApiException as e:
                if self._stopping.is_set():
                    break
                if e.status == HTTP_GONE:
                    log.info("k8s_watch_expired resource=%s; relisting", plural)
                    self._forget_rv(plural)
                    rv = None
                    continue
                log.warning(
                    "k8s_watch_error resource=%s status=%s reason=%s retry_in=%.1fs",
                    plural,
                    e.status,
                    e.reason,
                    backoff,
                )
            except Exception as e:  # dropped connections, timeouts, refused connects
                if self._stopping.is_set():
                    break
                log.warning("k8s_watch_error resource=%s error=%s retry_in=%.1fs", plural, type(e).__name__, backoff)
            if rv is not None:
                with self._lock:  # resume from the last version the broken watch saw
                    rv = self._rvs.get(plural, rv)
            self._stopping.wait(backoff)
            backoff = min(backoff * 2, self.backoff_max)
