"""Who may call the direct-routing API, and how many leases they may hold.

The API is off unless `--enable-pick-api` is given, and when it is on every call must authenticate:

- mTLS (`--pick-api-client-ca-file`): the API gets its own listener (`--pick-api-port`) that completes
  the TLS handshake only for client certificates signed by that CA. The caller is the certificate's
  common name (or its first subject alternative name).
- Kubernetes service-account tokens (`--pick-api-token-review`): the caller sends
  `authorization: Bearer <token>`; the EPP asks the API server (TokenReview) whether the token is
  valid, and accepts only the service accounts listed in `--pick-api-allowed-service-accounts`
  (`namespace/name`, or `namespace/*` for every account of a namespace). Answers are cached for a
  minute (rejections for a few seconds), keyed by a hash of the token.

With both configured, both must pass, and the caller is the service account. `PickApiGuard` is a gRPC
server interceptor: it wraps only the methods of `llm_epp.v1.EndpointPicker` (the ext_proc stream on
a shared port passes through untouched), authenticates each call, takes a lease slot for a real Pick
before the pipeline runs (RESOURCE_EXHAUSTED with the cap's name when the caller or the server is at its
limit) and gives the slot back when the Pick fails. The servicer itself does not change.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import grpc

from llm_epp.api.v1 import picker_pb2 as pb
from llm_epp.observability.logging import InfoOncePerInterval
from llm_epp.pickapi.leases import CURRENT_CALLER, CURRENT_RESERVATION, LeaseLimitError, LeaseTable, Reservation

log = logging.getLogger(__name__)
_log_rejection = InfoOncePerInterval(log).log  # any caller can cause these: one INFO line per 10 s

SERVICE = pb.DESCRIPTOR.services_by_name["EndpointPicker"].full_name
_PREFIX = f"/{SERVICE}/"
SERVICE_ACCOUNT_PREFIX = "system:serviceaccount:"
POSITIVE_CACHE_S = 60.0
NEGATIVE_CACHE_S = 5.0
MAX_CACHE_ENTRIES = 4096
MAX_CONCURRENT_REVIEWS = 8


class TokenReviewer(Protocol):
    """Validates a bearer token (blocking; the guard runs it in a worker thread). Returns the
    authenticated user name, or None when the token is not valid; raises when the answer is unknown
    (API server unreachable)."""

    def review(self, token: str) -> str | None: ...


class AuthError(Exception):
    def __init__(self, code: Any, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class AuthSettings:
    """What a caller must present. At least one mechanism must be on (the app refuses otherwise)."""

    require_client_cert: bool = False
    token_reviewer: TokenReviewer | None = None
    allowed_service_accounts: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.require_client_cert and self.token_reviewer is None:
            raise ValueError("the direct-routing API needs client authentication (mTLS and/or tokens)")
        if self.token_reviewer is not None:
            for entry in self.allowed_service_accounts:
                parse_service_account(entry)


def parse_service_account(entry: str) -> tuple[str, str]:
    """`namespace/name` or `namespace/*` -> (namespace, name); ValueError says what is wrong."""
    namespace, sep, name = entry.strip().partition("/")
    if not sep or not namespace or not name or "/" in name:
        raise ValueError(f"service account {entry!r} is not namespace/name (or namespace/* for all of a namespace)")
    return namespace, name


def service_account_allowed(username: str, allowed: Sequence[str]) -> bool:
    """Whether a TokenReview user name (`system:serviceaccount:<ns>:<name>`) is in the allowed list."""
    if not username.startswith(SERVICE_ACCOUNT_PREFIX):
        return False
    namespace, sep, name = username[len(SERVICE_ACCOUNT_PREFIX) :].partition(":")
    if not sep or not namespace or not name or ":" in name:
        return False
    for entry in allowed:
        ns, sa = parse_service_account(entry)
        if ns == namespace and sa in ("*", name):
            return True
    return False


def _cert_identity(auth_context: dict[str, list[bytes]]) -> str | None:
    for key in ("x509_common_name", "x509_subject_alternative_name"):
        values = auth_context.get(key)
        if values:
            return values[0].decode(errors="replace")
    return None


def _bearer(metadata: Sequence[tuple[str, str | bytes]] | None) -> str | None:
    for key, value in metadata or ():
        if key.lower() == "authorization":
            text = value.decode(errors="replace") if isinstance(value, bytes) else value
            scheme, _, token = text.strip().partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
    return None


class Authenticator:
    """Checks one call's credentials; returns the caller's identity or raises AuthError."""

    def __init__(
        self,
        settings: AuthSettings,
        *,
        clock: Callable[[], float] = time.monotonic,
        max_cache_entries: int = MAX_CACHE_ENTRIES,
    ) -> None:
        self.settings = settings
        self._clock = clock
        self._max_cache = max_cache_entries
        self._cache: OrderedDict[bytes, tuple[float, str | None]] = OrderedDict()
        self._reviews = asyncio.Semaphore(MAX_CONCURRENT_REVIEWS)
        self.reviews = 0  # TokenReview calls made (cache misses)

    async def authenticate(self, context: grpc.aio.ServicerContext) -> str:
        s = self.settings
        identity = ""
        if s.require_client_cert:
            cert = _cert_identity(context.auth_context())
            if cert is None:
                raise AuthError(
                    grpc.StatusCode.UNAUTHENTICATED,
                    "a client certificate signed by the CA of --pick-api-client-ca-file is required",
                )
            identity = f"cert:{cert}"
        if s.token_reviewer is not None:
            token = _bearer(context.invocation_metadata())
            if token is None:
                raise AuthError(
                    grpc.StatusCode.UNAUTHENTICATED,
                    "send the metadata 'authorization: Bearer <Kubernetes service-account token>'",
                )
            username = await self._review(s.token_reviewer, token)
            if username is None:
                raise AuthError(grpc.StatusCode.UNAUTHENTICATED, "the bearer token was rejected by the TokenReview")
            if not service_account_allowed(username, s.allowed_service_accounts):
                raise AuthError(
                    grpc.StatusCode.PERMISSION_DENIED,
                    f"{username} may not use the direct-routing API: add namespace/name of its service "
                    "account to --pick-api-allowed-service-accounts",
                )
            identity = username
        return identity

    async def _review(self, reviewer: TokenReviewer, token: str) -> str | None:
        key = hashlib.sha256(token.encode()).digest()
        now = self._clock()
        hit = self._cache.get(key)
        if hit is not None and hit[0] > now:
            self._cache.move_to_end(key)
            return hit[1]
        async with self._reviews:
            self.reviews += 1
            try:
                username = await asyncio.to_thread(reviewer.review, token)
            except Exception as e:  # the API server's answer is unknown: fail closed, cache nothing
                log.warning("token_review_failed reason=%r", e)
                raise AuthError(
                    grpc.StatusCode.UNAVAILABLE, "cannot verify the bearer token now (TokenReview failed); retry"
                ) from None
        ttl = POSITIVE_CACHE_S if username is not None else NEGATIVE_CACHE_S
        self._cache[key] = (self._clock() + ttl, username)
        self._cache.move_to_end(key)
        while len(self._cache) > self._max_cache:
            self._cache.popitem(last=False)
        return username


Behavior = Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]


class PickApiGuard(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Authenticates every EndpointPicker call and bounds leases; other services pass through."""

    def __init__(self, authenticator: Authenticator, leases: LeaseTable) -> None:
        self.authenticator = authenticator
        self.leases = leases
        self.rejected = 0

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        method: str = handler_call_details.method
        if handler is None or not method.startswith(_PREFIX) or handler.unary_unary is None:
            return handler
        return grpc.unary_unary_rpc_method_handler(
            self.guard(method[len(_PREFIX) :], handler.unary_unary),
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )

    def guard(self, name: str, inner: Behavior) -> Behavior:
        """Method `name` (Pick, Release, ListEndpoints) behind authentication and the lease caps; `context`
        is grpc.aio's, or what the asyncio server gives (abort, invocation_metadata, auth_context, peer)."""

        async def guarded(request: Any, context: grpc.aio.ServicerContext) -> Any:
            try:
                caller = await self.authenticator.authenticate(context)
            except AuthError as e:
                self.rejected += 1
                _log_rejection("pick_api_unauthorized method=%s peer=%s reason=%s", name, context.peer(), e.message)
                await context.abort(e.code, e.message)
                raise AssertionError("unreachable: context.abort raises") from None
            caller_token = CURRENT_CALLER.set(caller)
            reservation: Reservation | None = None
            try:
                if name == "Pick" and not request.dry_run:
                    try:
                        reservation = self.leases.reserve(caller)
                    except LeaseLimitError as e:
                        await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(e))
                    CURRENT_RESERVATION.set(reservation)
                return await inner(request, context)
            finally:
                if reservation is not None:
                    self.leases.unreserve(reservation)  # no-op once the grant used it
                    CURRENT_RESERVATION.set(None)
                CURRENT_CALLER.reset(caller_token)

        return guarded
