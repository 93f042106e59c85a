"""Protocol-free domain objects shared by the scheduling core, plugins and the request director.

All are frozen: a scheduling cycle works on an immutable snapshot, so plugins never see a partial update.
"""

from __future__ import annotations

import enum
import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, NamedTuple

from llm_epp.framework.records import record

_EMPTY: Mapping[Any, Any] = MappingProxyType({})


def _empty() -> Mapping[Any, Any]:
    return _EMPTY


class EndpointKey(NamedTuple):
    """Identity of an endpoint: the reference's NamespacedName (`<pod>-rank-<idx>` in Kubernetes).
    A tuple, so hashing (every scorer returns a mapping keyed by it) runs in C."""

    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}" if self.namespace else self.name


def join_host_port(host: str, port: int) -> str:
    """`ip:port`, with IPv6 addresses bracketed (Go's net.JoinHostPort)."""
    if ":" in host and not host.startswith("["):
        return f"[{host}]:{port}"
    return f"{host}:{port}"


def split_host_port(value: str) -> tuple[str, int | None]:
    """Inverse of `join_host_port`; the port is None when absent. Raises ValueError on a bad port."""
    value = value.strip()
    if value.startswith("["):
        host, _, rest = value[1:].partition("]")
        return host, int(rest[1:]) if rest.startswith(":") else None
    if value.count(":") == 1:
        host, _, port = value.partition(":")
        return host, int(port)
    return value, None


def is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


@dataclass(frozen=True, slots=True)
class EndpointMetadata:
    """Where an endpoint is and what it runs. Changes only when discovery says so."""

    key: EndpointKey
    address: str
    port: int
    labels: Mapping[str, str] = field(default_factory=_empty)
    engine: str = "vllm"
    metrics_path: str = "/metrics"
    metrics_port: int | None = None
    node_address: str = ""  # IP of the node hosting the endpoint (a pod's status.hostIP), "" when unknown
    hostport: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "hostport", join_host_port(self.address, self.port))


@dataclass(frozen=True, slots=True)
class Metrics:
    """What the model server last reported. `update_time` is a monotonic timestamp (0 = never scraped)."""

    waiting_queue_size: int = 0
    running_requests: int = 0
    kv_cache_usage: float = 0.0
    active_models: frozenset[str] = frozenset()
    waiting_models: frozenset[str] = frozenset()
    max_active_models: int = 0
    cache_block_size: int = 0
    cache_num_blocks: int = 0
    update_time: float = 0.0


EMPTY_METRICS = Metrics()


class InFlightLoad:
    """What the EPP itself has sent to an endpoint and not yet seen finish: requests and estimated tokens.

    Reserved when a request is scheduled and released exactly once when it ends, so it is a fresh load
    signal between metric scrapes. The EPP updates it on the event loop between scheduling cycles; a
    cycle, which never yields, sees consistent values. Plugins must treat it as read-only."""

    __slots__ = ("requests", "tokens")

    def __init__(self, requests: int = 0, tokens: int = 0) -> None:
        self.requests = requests
        self.tokens = tokens

    def __repr__(self) -> str:
        return f"InFlightLoad(requests={self.requests}, tokens={self.tokens})"


@dataclass(frozen=True, slots=True)
class Endpoint:
    """A read-only view of one endpoint for one scheduling cycle: metadata, the last scraped metrics,
    the EPP's own in-flight load, and attributes produced by data-producer plugins (keyed by name)."""

    metadata: EndpointMetadata
    metrics: Metrics = EMPTY_METRICS
    load: InFlightLoad = field(default_factory=InFlightLoad)
    attributes: Mapping[str, Any] = field(default_factory=_empty)
    # copies of metadata.key / metadata.hostport: plain attributes, read in every scorer's inner loop
    key: EndpointKey = field(init=False, compare=False, repr=False)
    hostport: str = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", self.metadata.key)
        object.__setattr__(self, "hostport", self.metadata.hostport)


class ApiKind(enum.Enum):
    """The OpenAI-style API a request body belongs to (detected from the path, as the reference does)."""

    COMPLETIONS = "completions"
    CHAT_COMPLETIONS = "chat_completions"
    RESPONSES = "responses"
    CONVERSATIONS = "conversations"
    EMBEDDINGS = "embeddings"
    MESSAGES = "messages"  # Anthropic Messages API
    GENERATE = "generate"  # vLLM /inference/v1/generate, SGLang /generate, vLLM gRPC Generate (token ids)
    OPAQUE = "opaque"  # a body the parser does not interpret (passthrough): routed without payload signals
    NONE = "none"  # no body (GET /v1/models, health checks)


@record
class RequestBody:
    """The parsed request body. `payload` is the decoded JSON object (do not mutate it)."""

    api: ApiKind
    payload: Mapping[str, Any] = field(default_factory=_empty)
    stream: bool = False
    cache_salt: str = ""
    token_ids: tuple[int, ...] = ()  # pre-tokenized prompts (GENERATE), first prompt of a batch


@record
class InferenceRequest:
    """One inference request as the scheduler sees it."""

    request_id: str
    incoming_model: str
    target_model: str
    body: RequestBody
    headers: Mapping[str, str] = field(default_factory=_empty)
    priority: int = 0
    objective: str = ""
    fairness_id: str = "default-flow"
    size_bytes: int = 0


class ScoredEndpoint(NamedTuple):
    endpoint: Endpoint
    score: float


@record
class ProfileResult:
    """A profile's decision: target endpoints in order of preference (first = primary).

    `scores` holds, per endpoint key, the summed score under "total" and every scorer's weighted
    contribution under the scorer's name, for explaining decisions."""

    target_endpoints: tuple[Endpoint, ...]
    scores: Mapping[EndpointKey, Mapping[str, float]] = field(default_factory=_empty)


@record
class SchedulingResult:
    profile_results: Mapping[str, ProfileResult | None]
    primary_profile_name: str

    @property
    def primary(self) -> ProfileResult | None:
        return self.profile_results.get(self.primary_profile_name)
