"""An in-test Kubernetes API server speaking the real list/watch protocol for namespaced resources.

Serves core v1 `pods`, `inference.networking.k8s.io/v1` `inferencepools`, the x-k8s v1alpha2 objective resources
and `coordination.k8s.io/v1` `leases`; LIST answers `<Kind>List` with `metadata.resourceVersion`; `?watch=true`
streams newline-delimited JSON events with chunked transfer from an in-memory event log (resuming after
`resourceVersion`, honouring `timeoutSeconds` and `allowWatchBookmarks`); `labelSelector` (=, ==, != terms
joined by commas) and `fieldSelector` (metadata.name / metadata.namespace) filter both. Resuming from a
compacted version gets 410 Gone (an ERROR event inside the stream, as the real server sends, or an HTTP 410 when
`gone_as_http`). Clients may also GET one object (404 NotFound Status when absent), POST to a collection (409
AlreadyExists) and PUT one object (409 Conflict when the body's `metadata.resourceVersion` is stale), as leader
election does.

Test API: `create` / `update` / `delete` (each bumps the resourceVersion), `compact`, `drop_watches` (closes
open watch connections mid-stream without the terminating chunk), `send_bookmark`, `hidden_groups` (API groups
answered as not installed: absent from discovery, 404 on requests), `reject_writes` (a predicate
on a client's POST/PUT body; true answers 503 ServiceUnavailable). Binds 127.0.0.1 port 0.

Delegated authentication and authorization: POST `authentication.k8s.io/v1` `tokenreviews` authenticates the
tokens added with `add_token` (with its audiences, when given; anything else is unauthenticated), and POST
`authorization.k8s.io/v1` `subjectaccessreviews` allows a non-resource request when `grant` gave its verb on
its path to the user or one of its groups. `review_failures` > 0 answers that many review requests with 500.
Each review is counted in `requests` as (plural, "create").
"""

from __future__ import annotations

import copy
import json
import select
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from kubernetes import client


@dataclass(frozen=True)
class Resource:
    plural: str
    kind: str
    group: str  # "" = core
    version: str

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def prefix(self) -> str:
        return f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"


RESOURCES: dict[str, Resource] = {
    r.plural: r
    for r in (
        Resource("pods", "Pod", "", "v1"),
        Resource("inferencepools", "InferencePool", "inference.networking.k8s.io", "v1"),
        Resource("inferenceobjectives", "InferenceObjective", "inference.networking.x-k8s.io", "v1alpha2"),
        Resource("inferencemodelrewrites", "InferenceModelRewrite", "inference.networking.x-k8s.io", "v1alpha2"),
        Resource("leases", "Lease", "coordination.k8s.io", "v1"),
    )
}


@dataclass
class _Event:
    rv: int
    resource: str
    type: str
    obj: dict[str, Any]
    old: dict[str, Any] | None


def _parse_label_selector(raw: str) -> list[tuple[str, str, bool]]:
    """[(key, value, equal)]; raises ValueError on terms this fake does not understand."""
    terms = []
    for term in filter(None, (t.strip() for t in raw.split(","))):
        if "!=" in term:
            k, _, v = term.partition("!=")
            terms.append((k.strip(), v.strip(), False))
        elif "=" in term:
            k, _, v = term.replace("==", "=").partition("=")
            terms.append((k.strip(), v.strip(), True))
        else:
            raise ValueError(f"unsupported label selector term {term!r}")
    return terms


class _Filter:
    def __init__(self, namespace: str, query: dict[str, str]) -> None:
        self.namespace = namespace
        self.labels = _parse_label_selector(query.get("labelSelector", ""))
        self.fields: list[tuple[str, str]] = []
        for term in filter(None, query.get("fieldSelector", "").split(",")):
            k, _, v = term.replace("==", "=").partition("=")
            if k not in ("metadata.name", "metadata.namespace"):
                raise ValueError(f"field label not supported: {k}")
            self.fields.append((k, v))

    def matches(self, obj: dict[str, Any] | None) -> bool:
        if obj is None:
            return False
        meta = obj.get("metadata", {})
        if meta.get("namespace") != self.namespace:
            return False
        labels = meta.get("labels") or {}
        for k, v, equal in self.labels:
            if (labels.get(k) == v) != equal:
                return False
        return all(meta.get(k.split(".", 1)[1]) == v for k, v in self.fields)


class FakeApiServer:
    """Start with `start()` (or use as a context manager); `api_client()` returns a client pointed at it."""

    def __init__(self, initial_rv: int = 100) -> None:
        self._cond = threading.Condition()
        self._rv = initial_rv
        self._floor = 0  # watches resuming from a version below this get 410 Gone
        self._objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self._log: list[_Event] = []
        self._drop_gen = 0
        self._bookmark_gen = 0
        self._closing = False
        self.gone_as_http = False
        self.hidden_groups: set[str] = set()  # API groups discovery and requests treat as not installed
        # (plural, body) -> True to answer a client's POST/PUT with 503 instead of storing it
        self.reject_writes: Callable[[str, dict[str, Any]], bool] | None = None
        self.requests: dict[tuple[str, str], int] = {}  # (plural, "list"|"watch"|"create") -> count
        self.tokens: dict[str, dict[str, Any]] = {}  # bearer token -> TokenReview status.user
        self.token_audiences: dict[str, list[str]] = {}  # bearer token -> audiences it is valid for
        self.grants: set[tuple[str, str, str]] = set()  # (user or group, verb, non-resource path)
        self.review_failures = 0
        self._open: dict[tuple[str, str], int] = {}
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # --- lifecycle -------------------------------------------------------------------------------------
    def start(self) -> FakeApiServer:
        fake = self

        class Handler(_Handler):
            server_fake = fake

        httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        httpd.daemon_threads = True
        self._httpd = httpd
        self._thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(5)

    def __enter__(self) -> FakeApiServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        assert self._httpd is not None, "start() first"
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def api_client(self) -> Any:
        config = client.Configuration()
        config.host = self.url
        return client.ApiClient(config)

    # --- test API --------------------------------------------------------------------------------------
    @property
    def resource_version(self) -> int:
        with self._cond:
            return self._rv

    def create(self, plural: str, obj: dict[str, Any]) -> dict[str, Any]:
        return self._write(plural, obj, create=True)

    def update(self, plural: str, obj: dict[str, Any]) -> dict[str, Any]:
        """Replace the stored object (whole object, as a PUT)."""
        return self._write(plural, obj, create=False)

    def apply(self, plural: str, obj: dict[str, Any]) -> dict[str, Any]:
        """Create or replace."""
        meta = obj["metadata"]
        with self._cond:
            exists = (plural, meta.get("namespace", "default"), meta["name"]) in self._objects
        return self._write(plural, obj, create=not exists)

    def get(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        with self._cond:
            obj = self._objects.get((plural, namespace, name))
            return copy.deepcopy(obj) if obj is not None else None

    def delete(self, plural: str, namespace: str, name: str) -> None:
        with self._cond:
            key = (plural, namespace, name)
            old = self._objects.pop(key)
            self._rv += 1
            obj = copy.deepcopy(old)
            obj["metadata"]["resourceVersion"] = str(self._rv)
            self._log.append(_Event(self._rv, plural, "DELETED", obj, old))
            self._cond.notify_all()

    def compact(self) -> None:
        """Forget history: resuming a watch from any version older than the current one gets 410 Gone."""
        with self._cond:
            self._floor = self._rv
            self._log = [e for e in self._log if e.rv > self._floor]

    def drop_watches(self) -> None:
        """Abruptly close every open watch connection (no terminating chunk)."""
        with self._cond:
            self._drop_gen += 1
            self._cond.notify_all()

    def send_bookmark(self) -> None:
        """Every open watch that asked for bookmarks gets a BOOKMARK at the current resourceVersion."""
        with self._cond:
            self._bookmark_gen += 1
            self._cond.notify_all()

    def open_watches(self, plural: str | None = None) -> int:
        with self._cond:
            return sum(n for (p, kind), n in self._open.items() if plural in (None, p) and kind == "watch")

    def _write(self, plural: str, obj: dict[str, Any], *, create: bool) -> dict[str, Any]:
        res = RESOURCES[plural]
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        meta.setdefault("namespace", "default")
        obj["apiVersion"] = res.api_version
        obj["kind"] = res.kind
        with self._cond:
            key = (plural, meta["namespace"], meta["name"])
            old = self._objects.get(key)
            if create and old is not None:
                raise KeyError(f"{plural} {key[1]}/{key[2]} already exists")
            if not create and old is None:
                raise KeyError(f"{plural} {key[1]}/{key[2]} not found")
            self._rv += 1
            meta["resourceVersion"] = str(self._rv)
            if old is None:
                meta["uid"] = str(uuid.uuid4())
                meta["creationTimestamp"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            else:
                meta["uid"] = old["metadata"]["uid"]
                meta["creationTimestamp"] = old["metadata"]["creationTimestamp"]
            self._objects[key] = obj
            self._log.append(_Event(self._rv, plural, "ADDED" if old is None else "MODIFIED", obj, old))
            self._cond.notify_all()
            return copy.deepcopy(obj)

    def _client_write(
        self, plural: str, namespace: str, name: str | None, body: dict[str, Any]
    ) -> tuple[int, dict[str, Any]]:
        """A client's POST (name None) or PUT: (HTTP status, response body)."""
        res = RESOURCES[plural]
        group = f"{plural}.{res.group}" if res.group else plural
        if self.reject_writes is not None and self.reject_writes(plural, body):
            return 503, _status(503, "ServiceUnavailable", "the server is currently unable to handle the request")
        meta = body.get("metadata")
        if not isinstance(meta, dict) or not meta.get("name"):
            return 422, _status(422, "Invalid", f"{plural}: metadata.name: Required value")
        if name is not None and meta["name"] != name:
            return 400, _status(400, "BadRequest", "the name of the object does not match the name on the URL")
        if meta.get("namespace", namespace) != namespace:
            return 400, _status(
                400, "BadRequest", "the namespace of the object does not match the namespace on the URL"
            )
        meta["namespace"] = namespace
        key = (plural, namespace, meta["name"])
        with self._cond:  # check and write atomically; the condition wraps an RLock, so _write re-enters it
            current = self._objects.get(key)
            if name is None and current is not None:
                return 409, _status(409, "AlreadyExists", f'{group} "{meta["name"]}" already exists')
            if name is not None and current is None:
                return 404, _status(404, "NotFound", f'{group} "{name}" not found')
            want = meta.get("resourceVersion")
            if current is not None and want and want != current["metadata"]["resourceVersion"]:
                return 409, _status(
                    409,
                    "Conflict",
                    f'Operation cannot be fulfilled on {group} "{name}": the object has been modified; '
                    "please apply your changes to the latest version and try again",
                )
            created = self._write(plural, body, create=current is None)
        return (201 if current is None else 200), created

    def add_token(
        self, token: str, username: str, groups: tuple[str, ...] = (), uid: str = "", audiences: tuple[str, ...] = ()
    ) -> None:
        with self._cond:
            uid = uid or str(uuid.uuid5(uuid.NAMESPACE_OID, username))
            self.tokens[token] = {"username": username, "uid": uid, "groups": list(groups)}
            if audiences:
                self.token_audiences[token] = list(audiences)

    def grant(self, subject: str, path: str, verb: str = "get") -> None:
        """Lets the user or group `subject` use `verb` on the non-resource URL `path`."""
        with self._cond:
            self.grants.add((subject, verb, path))

    def _review(self, plural: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        self._count(plural, "create")
        with self._cond:
            if self.review_failures > 0:
                self.review_failures -= 1
                return 500, _status(500, "InternalError", "review backend unavailable")
            spec = body.get("spec") or {}
            if plural == "tokenreviews":
                token = str(spec.get("token", ""))
                user = self.tokens.get(token)
                wanted = spec.get("audiences") or []
                audiences = self.token_audiences.get(token, [])
                if user is not None and wanted and not set(wanted) & set(audiences):
                    user = None  # not issued for any audience the reviewer asked for
                status: dict[str, Any] = {"authenticated": user is not None}
                if user is not None:
                    status["user"] = copy.deepcopy(user)
                    status["audiences"] = wanted or audiences
                else:
                    status["error"] = "invalid bearer token"
                kind, version = "TokenReview", "authentication.k8s.io/v1"
            else:
                attrs = spec.get("nonResourceAttributes") or {}
                subjects = {spec.get("user", ""), *(spec.get("groups") or [])}
                allowed = any((s, attrs.get("verb"), attrs.get("path")) in self.grants for s in subjects)
                status = {"allowed": allowed}
                kind, version = "SubjectAccessReview", "authorization.k8s.io/v1"
        return 201, {"kind": kind, "apiVersion": version, "metadata": {}, "spec": spec, "status": status}

    def _count(self, plural: str, kind: str) -> None:
        with self._cond:
            self.requests[(plural, kind)] = self.requests.get((plural, kind), 0) + 1

    def count(self, plural: str, kind: str) -> int:
        with self._cond:
            return self.requests.get((plural, kind), 0)


_REVIEWS = {
    "/apis/authentication.k8s.io/v1/tokenreviews": "tokenreviews",
    "/apis/authorization.k8s.io/v1/subjectaccessreviews": "subjectaccessreviews",
}


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_fake: FakeApiServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _send_json(self, code: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _write_request(self, post: bool) -> None:
        path = urlsplit(self.path).path.rstrip("/")
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        review = _REVIEWS.get(path)
        if post and review is not None:
            try:
                body = json.loads(raw)
            except ValueError as e:
                self._send_json(400, _status(400, "BadRequest", f"invalid body: {e}"))
                return
            self._send_json(*self.server_fake._review(review, body))
            return
        for res in RESOURCES.values():
            head = res.prefix + "/namespaces/"
            if not path.startswith(head):
                continue
            rest = path[len(head) :].split("/")
            if len(rest) != (2 if post else 3) or rest[1] != res.plural:
                continue
            try:
                body = json.loads(raw)
                if not isinstance(body, dict):
                    raise ValueError("not an object")
            except ValueError as e:
                self._send_json(400, _status(400, "BadRequest", f"invalid body: {e}"))
                return
            code, answer = self.server_fake._client_write(res.plural, rest[0], None if post else rest[2], body)
            self._send_json(code, answer)
            return
        self._send_json(404, _status(404, "NotFound", "the server could not find the requested resource"))

    def do_POST(self) -> None:
        self._write_request(post=True)

    def do_PUT(self) -> None:
        self._write_request(post=False)

    def do_GET(self) -> None:
        parts = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        path = parts.path.rstrip("/")
        if path == "/api":
            self._send_json(200, {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []})
            return
        if path == "/apis":
            self._send_json(200, self._group_list())
            return
        for res in RESOURCES.values():
            if res.group in self.server_fake.hidden_groups:
                continue
            if path == res.prefix:
                self._send_json(200, self._resource_list(res.group, res.version))
                return
            head = res.prefix + "/namespaces/"
            if not path.startswith(head):
                continue
            rest = path[len(head) :].split("/")
            if len(rest) >= 2 and rest[1] == res.plural:
                if len(rest) == 2:
                    self._collection(res, rest[0], query)
                    return
                if len(rest) == 3:
                    obj = self.server_fake.get(res.plural, rest[0], rest[2])
                    if obj is None:
                        self._send_json(404, _status(404, "NotFound", f'{res.plural} "{rest[2]}" not found'))
                    else:
                        self._send_json(200, obj)
                    return
        self._send_json(404, _status(404, "NotFound", "the server could not find the requested resource"))

    def _group_list(self) -> dict[str, Any]:
        groups: dict[str, list[str]] = {}
        for res in RESOURCES.values():
            if res.group in self.server_fake.hidden_groups:
                continue
            if res.group and res.version not in groups.setdefault(res.group, []):
                groups[res.group].append(res.version)
        return {
            "kind": "APIGroupList",
            "apiVersion": "v1",
            "groups": [
                {
                    "name": g,
                    "versions": [{"groupVersion": f"{g}/{v}", "version": v} for v in vs],
                    "preferredVersion": {"groupVersion": f"{g}/{vs[0]}", "version": vs[0]},
                }
                for g, vs in groups.items()
            ],
        }

    def _resource_list(self, group: str, version: str) -> dict[str, Any]:
        gv = f"{group}/{version}" if group else version
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": gv,
            "resources": [
                {
                    "name": r.plural,
                    "singularName": r.kind.lower(),
                    "namespaced": True,
                    "kind": r.kind,
                    "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"],
                }
                for r in RESOURCES.values()
                if r.group == group and r.version == version
            ],
        }

    def _collection(self, res: Resource, namespace: str, query: dict[str, str]) -> None:
        fake = self.server_fake
        try:
            flt = _Filter(namespace, query)
        except ValueError as e:
            self._send_json(400, _status(400, "BadRequest", str(e)))
            return
        if query.get("watch") in ("true", "1"):
            self._watch(res, flt, query)
            return
        fake._count(res.plural, "list")
        with fake._cond:
            items = [copy.deepcopy(o) for (p, _, _), o in sorted(fake._objects.items()) if p == res.plural]
            rv = fake._rv
        self._send_json(
            200,
            {
                "kind": f"{res.kind}List",
                "apiVersion": res.api_version,
                "metadata": {"resourceVersion": str(rv)},
                "items": [o for o in items if flt.matches(o)],
            },
        )

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _event(self, typ: str, obj: dict[str, Any]) -> None:
        self._chunk(json.dumps({"type": typ, "object": obj}).encode() + b"\n")

    def _watch(self, res: Resource, flt: _Filter, query: dict[str, str]) -> None:
        fake = self.server_fake
        fake._count(res.plural, "watch")
        timeout = float(query.get("timeoutSeconds") or 1800)
        bookmarks = query.get("allowWatchBookmarks") in ("true", "1")
        raw_rv = query.get("resourceVersion") or "0"
        try:
            since = int(raw_rv)
        except ValueError:
            self._send_json(400, _status(400, "BadRequest", f"invalid resourceVersion {raw_rv!r}"))
            return
        with fake._cond:
            gone = since != 0 and since < fake._floor
            drop_gen, bookmark_gen = fake._drop_gen, fake._bookmark_gen
            initial: list[dict[str, Any]] = []
            if since == 0:  # "any": synthetic ADDED events for the current state, then changes
                since = fake._rv
                initial = [copy.deepcopy(o) for (p, _, _), o in sorted(fake._objects.items()) if p == res.plural]
                initial = [o for o in initial if flt.matches(o)]
        message = f"too old resource version: {raw_rv} ({fake._floor})"
        if gone and fake.gone_as_http:
            self._send_json(410, _status(410, "Expired", message))
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        if gone:
            self._event("ERROR", _status(410, "Expired", message))
            self._chunk(b"")
            return
        for obj in initial:
            self._event("ADDED", obj)
        key = (res.plural, "watch")
        with fake._cond:
            fake._open[key] = fake._open.get(key, 0) + 1
        try:
            self._stream(res, flt, since, time.monotonic() + timeout, bookmarks, drop_gen, bookmark_gen)
        except OSError:
            pass
        finally:
            with fake._cond:
                fake._open[key] -= 1

    def _client_gone(self) -> bool:
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    def _stream(
        self, res: Resource, flt: _Filter, since: int, deadline: float, bookmarks: bool, drop_gen: int, bm_gen: int
    ) -> None:
        fake = self.server_fake
        sent = since
        while True:
            with fake._cond:
                while True:
                    pending = [e for e in fake._log if e.rv > sent and e.resource == res.plural]
                    remaining = deadline - time.monotonic()
                    if (
                        pending
                        or remaining <= 0
                        or fake._closing
                        or fake._drop_gen != drop_gen
                        or fake._bookmark_gen != bm_gen
                    ):
                        break
                    fake._cond.wait(min(remaining, 0.1))
                    if self._client_gone():
                        return
                dropped = fake._drop_gen != drop_gen or fake._closing
                bookmark_due = fake._bookmark_gen != bm_gen
                bm_gen = fake._bookmark_gen
                current = fake._rv
            if dropped:
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            for e in pending:
                sent = e.rv
                old_match, new_match = flt.matches(e.old), flt.matches(e.obj)
                if e.type == "DELETED":
                    typ = "DELETED" if old_match else None
                elif old_match and new_match:
                    typ = "MODIFIED"
                elif new_match:
                    typ = "ADDED"
                elif old_match:
                    typ = "DELETED"  # stopped matching the selector
                else:
                    typ = None
                if typ is not None:
                    self._event(typ, copy.deepcopy(e.obj))
            if bookmark_due and bookmarks:
                sent = max(sent, current)
                self._event(
                    "BOOKMARK",
                    {"kind": res.kind, "apiVersion": res.api_version, "metadata": {"resourceVersion": str(current)}},
                )
            if not pending and time.monotonic() >= deadline:
                self._chunk(b"")  # clean end of the watch
                return
