"""What `session-affinity-scorer` and `session-affinity-filter` share: their parameters, the session
token (`encoded_endpoint_header`) and the server-side session bindings (`session_id`).

A session resolves to at most one *session endpoint* among the candidates; the scorer gives it 1.0, the
filter keeps only it. Both write the token of the serving endpoint on the response (token strategy) or
bind the session to the endpoint the request was routed to (session-id strategy)."""

from __future__ import annotations

import base64
import binascii
from collections import OrderedDict
from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from llm_epp.framework import (
    CycleState,
    Endpoint,
    EndpointKey,
    Handle,
    InferenceRequest,
    PluginParams,
    SchedulingResult,
    StateKey,
)
from llm_epp.framework.requestcontrol import RESPONSE_HEADERS_KEY, ResponseInfo
from llm_epp.plugins.requestcontrol._attributes import get_attribute

DEFAULT_TOKEN_HEADER = "x-session-token"
DEFAULT_SESSION_ID_HEADER = "x-session-id"
ENCODED_ENDPOINT_HEADER = "encoded_endpoint_header"
SESSION_ID = "session_id"
MAX_BINDINGS = 100_000
"""At most this many live session bindings per plugin instance; the least recently used goes first, so
clients inventing session ids cannot grow memory without bound."""


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)


class EncodedEndpointHeaderConfig(_Model):
    header: str = DEFAULT_TOKEN_HEADER


class SessionIdSource(_Model):
    header: str = ""
    attribute: str = ""
    producer: str = ""

    @model_validator(mode="after")
    def _exactly_one(self) -> SessionIdSource:
        if bool(self.header) == bool(self.attribute):
            raise ValueError("exactly one of header or attribute must be set")
        return self


class SessionIdConfig(_Model):
    sources: tuple[SessionIdSource, ...] = ()
    eviction_ttl_seconds: float = Field(default=0.0, alias="evictionTtlSeconds")
    eviction_sweep_seconds: float = Field(default=0.0, alias="evictionSweepSeconds")

    @model_validator(mode="after")
    def _positive(self) -> SessionIdConfig:
        # 0 means "not set" (the reference's Go zero value), replaced by the default
        if self.eviction_ttl_seconds < 0:
            raise ValueError(f"evictionTtlSeconds must be > 0, got {self.eviction_ttl_seconds}")
        if self.eviction_sweep_seconds < 0:
            raise ValueError(f"evictionSweepSeconds must be > 0, got {self.eviction_sweep_seconds}")
        return self

    def effective_sources(self) -> tuple[SessionIdSource, ...]:
        return self.sources or (SessionIdSource(header=DEFAULT_SESSION_ID_HEADER),)

    def ttl(self) -> float:
        return self.eviction_ttl_seconds or 300.0

    def sweep(self) -> float:
        return self.eviction_sweep_seconds or 10.0


class SessionAffinityParams(PluginParams):
    strategy: Literal["encoded_endpoint_header", "session_id"] = "encoded_endpoint_header"
    encoded_endpoint_header_config: EncodedEndpointHeaderConfig = Field(
        default_factory=EncodedEndpointHeaderConfig, alias="encodedEndpointHeaderConfig"
    )
    session_id_config: SessionIdConfig = Field(default_factory=SessionIdConfig, alias="sessionIdConfig")
    profile_name: str = Field(default="", alias="profileName")


def normalize_header(name: str, default: str = DEFAULT_TOKEN_HEADER) -> str:
    return name.strip().lower() or default


def encode_token(key: EndpointKey) -> str:
    """The session token naming `key`: base64 of `namespace/name`, as llm-d writes it."""
    return base64.b64encode(f"{key.namespace}/{key.name}".encode()).decode("ascii")


def decode_token(token: str) -> EndpointKey | None:
    """The endpoint a session token names, or None when it is not a valid token."""
    try:
        text = base64.b64decode(token.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None
    namespace, slash, name = text.partition("/")
    if not slash or not name:
        return None
    return EndpointKey(namespace, name)


def _profile_target(result: SchedulingResult, profile: str) -> EndpointKey | None:
    found = result.profile_results.get(profile or result.primary_profile_name)
    if found is None or not found.target_endpoints:
        return None
    return found.target_endpoints[0].key


class SessionAffinity:
    """One strategy instance, shared by the scorer and the filter. `choose` names the session endpoint
    among the candidates (or None); `pre_request` and `response_received` do the bookkeeping."""

    def __init__(self, plugin_id: str, params: SessionAffinityParams, handle: Handle | None) -> None:
        self.strategy = params.strategy
        self.profile_name = params.profile_name
        self.header = normalize_header(params.encoded_endpoint_header_config.header)
        config = params.session_id_config
        self.sources = config.effective_sources()
        self.ttl = config.ttl()
        self.sweep_every = config.sweep()
        self._handle = handle
        self._bindings: OrderedDict[str, tuple[EndpointKey, float]] = OrderedDict()
        self._last_sweep = 0.0
        # per request: the profile's pick (for the response token) and whether the bound endpoint was a candidate
        self._picked: StateKey[EndpointKey] = StateKey(f"{plugin_id}/picked")
        self._present: StateKey[bool] = StateKey(f"{plugin_id}/bound-present")

    # --- scheduling -------------------------------------------------------------------------------------
    def choose(self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> Endpoint | None:
        if not endpoints:
            return None
        if self.strategy == ENCODED_ENDPOINT_HEADER:
            token = request.headers.get(self.header)
            wanted = decode_token(token) if token else None
            if wanted is None:
                return None
            return next((e for e in endpoints if e.key == wanted), None)
        session = self.session_id(cycle, request)
        if not session:
            return None
        bound = self._bound(session)
        if bound is None:
            return None
        target = next((e for e in endpoints if e.key == bound), None)
        cycle.write(self._present, target is not None)
        return target

    # --- request control --------------------------------------------------------------------------------
    def pre_request(self, cycle: CycleState, request: InferenceRequest, result: SchedulingResult) -> None:
        picked = _profile_target(result, self.profile_name)
        if picked is None:
            return
        cycle.write(self._picked, picked)
        if self.strategy != SESSION_ID:
            return
        session = self.session_id(cycle, request)
        if not session:
            return
        now = self._now()
        self._maybe_sweep(now)
        existing = self._bound(session)
        if existing is not None and existing != picked and cycle.read(self._present) is not False:
            return  # the bound endpoint was a candidate (or unknown): keep the session where it is
        self._bindings[session] = (picked, now)
        self._bindings.move_to_end(session)
        while len(self._bindings) > MAX_BINDINGS:
            self._bindings.popitem(last=False)

    def response_received(self, cycle: CycleState, response: ResponseInfo, endpoint: Endpoint | None) -> None:
        if self.strategy != ENCODED_ENDPOINT_HEADER:
            return  # the session-id strategy writes nothing back to the client
        if self.profile_name:
            served = cycle.read(self._picked)
        else:
            served = self._served(response, endpoint)
        if served is None:
            return
        headers = cycle.read(RESPONSE_HEADERS_KEY)
        if headers is None:
            headers = {}
            cycle.write(RESPONSE_HEADERS_KEY, headers)
        headers[self.header] = encode_token(served)

    # --- helpers ----------------------------------------------------------------------------------------
    def session_id(self, cycle: CycleState, request: InferenceRequest) -> str:
        """The request's session id: the first non-empty source, in configured order."""
        for source in self.sources:
            if source.header:
                value = request.headers.get(normalize_header(source.header), "").strip()
            else:
                found = get_attribute(cycle, source.attribute, source.producer)
                value = found.strip() if isinstance(found, str) else ""
            if value:
                return value
        return ""

    def _bound(self, session: str) -> EndpointKey | None:
        found = self._bindings.get(session)
        if found is None:
            return None
        if self._now() - found[1] > self.ttl:
            return None  # expired, swept later
        return found[0]

    def _now(self) -> float:
        return self._handle.now() if self._handle is not None else 0.0

    def _maybe_sweep(self, now: float) -> None:
        if now - self._last_sweep < self.sweep_every:
            return
        self._last_sweep = now
        bindings = self._bindings
        # bindings are kept in last-use order, so the expired ones are at the front
        while bindings:
            session, (_, seen) = next(iter(bindings.items()))
            if now - seen <= self.ttl:
                break
            del bindings[session]

    def binding_count(self) -> int:
        return len(self._bindings)

    def _served(self, response: ResponseInfo, endpoint: Endpoint | None) -> EndpointKey | None:
        """The endpoint that served the response: Envoy may have fallen back to another endpoint of the
        target list, so prefer the served address when it names a pool endpoint."""
        served = response.served_endpoint
        if served and (endpoint is None or served != endpoint.hostport) and self._handle is not None:
            for e in self._handle.endpoints():
                if e.hostport == served:
                    return e.key
        return endpoint.key if endpoint is not None else None
