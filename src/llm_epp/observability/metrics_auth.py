"""`--metrics-endpoint-auth`: who may read the metrics port, decided by the Kubernetes API server.

As the reference (controller-runtime's authentication-and-authorization filter): the request's bearer token is
checked with a TokenReview; the user it names (with its groups, uid and extra) must then be allowed, by a
SubjectAccessReview, the lowercased HTTP method as verb on the request's path as a non-resource URL — `get`
on `/metrics` for a scrape (the chart's ClusterRole grants exactly that), `get` on `/debug/pprof/profile`
for a profile. No token answers 401, a denied user 403, an API server failure 500.

Answers are cached as the reference does: tokens for a minute, allowed decisions for five minutes, denials
for 30 seconds. The caches are bounded (least recently used entries go first) and keyed by a hash of the
token, so a client sending endless made-up tokens costs one TokenReview each, not memory."""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

log = logging.getLogger(__name__)

TOKEN_TTL = 60.0
ALLOW_TTL = 300.0
DENY_TTL = 30.0
CACHE_SIZE = 4096
REVIEW_TIMEOUT = 10.0  # seconds per TokenReview / SubjectAccessReview call, as the reference

K = TypeVar("K")
V = TypeVar("V")


@dataclass(frozen=True)
class User:
    name: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: tuple[tuple[str, tuple[str, ...]], ...] = field(default=())


_REJECTED = User("")  # cached for tokens the API server did not authenticate


@dataclass(frozen=True)
class Decision:
    status: int  # 200 allowed, 401, 403, 500
    message: str


class _TtlCache(Generic[K, V]):
    def __init__(self, size: int = CACHE_SIZE, clock: Callable[[], float] = time.monotonic) -> None:
        self._items: OrderedDict[K, tuple[float, V]] = OrderedDict()
        self._size = size
        self._clock = clock
        self._lock = threading.Lock()

    def get(self, key: K) -> V | None:
        with self._lock:
            item = self._items.get(key)
            if item is None:
                return None
            if item[0] <= self._clock():
                del self._items[key]
                return None
            self._items.move_to_end(key)
            return item[1]

    def put(self, key: K, value: V, ttl: float) -> None:
        with self._lock:
            self._items[key] = (self._clock() + ttl, value)
            self._items.move_to_end(key)
            while len(self._items) > self._size:
                self._items.popitem(last=False)


class KubernetesAuthorizer:
    """Checks a request's `Authorization` header with TokenReview + SubjectAccessReview through `api_client`
    (a `kubernetes.client.ApiClient`). Thread-safe; called from the metrics server's request threads."""

    def __init__(self, api_client: Any, clock: Callable[[], float] = time.monotonic) -> None:
        from kubernetes import client

        self._authn = client.AuthenticationV1Api(api_client)
        self._authz = client.AuthorizationV1Api(api_client)
        self._tokens: _TtlCache[str, User] = _TtlCache(clock=clock)
        self._decisions: _TtlCache[tuple[User, str, str], bool] = _TtlCache(clock=clock)

    def check(self, authorization: str | None, method: str, path: str) -> Decision:
        scheme, _, token = (authorization or "").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return Decision(401, "Unauthorized")
        try:
            user = self._authenticate(token)
        except Exception as e:  # the API server could not answer: not the client's fault
            log.error("metrics_auth_tokenreview_failed error=%r", e)
            return Decision(500, "Authentication failed")
        if user is None:
            return Decision(401, "Unauthorized")
        verb = method.lower()
        try:
            allowed = self._authorize(user, verb, path)
        except Exception as e:
            log.error("metrics_auth_subjectaccessreview_failed user=%s error=%r", user.name, e)
            return Decision(500, f"Authorization for user {user.name} failed")
        if not allowed:
            log.debug("metrics_auth_denied user=%s verb=%s path=%s", user.name, verb, path)
            return Decision(403, f"Authorization denied for user {user.name}")
        return Decision(200, "")

    def _authenticate(self, token: str) -> User | None:
        key = hashlib.sha256(token.encode()).hexdigest()
        cached = self._tokens.get(key)
        if cached is not None:
            return None if cached is _REJECTED else cached
        from kubernetes import client

        review = self._authn.create_token_review(
            client.V1TokenReview(spec=client.V1TokenReviewSpec(token=token)), _request_timeout=REVIEW_TIMEOUT
        )
        status = review.status
        user: User | None = None
        if status is not None and status.authenticated and status.user is not None:
            u = status.user
            extra = tuple(sorted((k, tuple(v or ())) for k, v in (u.extra or {}).items()))
            user = User(u.username or "", u.uid or "", tuple(u.groups or ()), extra)
        self._tokens.put(key, _REJECTED if user is None else user, TOKEN_TTL)
        return user

    def _authorize(self, user: User, verb: str, path: str) -> bool:
        key = (user, verb, path)
        cached = self._decisions.get(key)
        if cached is not None:
            return cached
        from kubernetes import client

        review = self._authz.create_subject_access_review(
            client.V1SubjectAccessReview(
                spec=client.V1SubjectAccessReviewSpec(
                    user=user.name,
                    uid=user.uid or None,
                    groups=list(user.groups) or None,
                    extra={k: list(v) for k, v in user.extra} or None,
                    non_resource_attributes=client.V1NonResourceAttributes(path=path, verb=verb),
                )
            ),
            _request_timeout=REVIEW_TIMEOUT,
        )
        allowed = bool(review.status is not None and review.status.allowed)
        self._decisions.put(key, allowed, ALLOW_TTL if allowed else DENY_TTL)
        return allowed
