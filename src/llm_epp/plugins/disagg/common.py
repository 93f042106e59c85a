"""Shared pieces of the disaggregation plugins: header and label names, the decider protocol, the prompt
size estimate the deciders use, and writing the routing headers into the request's CycleState."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any, Protocol, runtime_checkable

import orjson

from llm_epp.framework import (
    ApiKind,
    CycleState,
    Endpoint,
    Handle,
    InferenceRequest,
    Plugin,
    ProfileResult,
    StateKey,
    TypedName,
)
from llm_epp.framework.requestcontrol import REQUEST_HEADERS_KEY

log = logging.getLogger(__name__)

# Upstream request headers read by the decode pod's sidecar (llm-d's pkg/common/routing).
PREFILL_ENDPOINT_HEADER = "x-prefiller-host-port"
ENCODER_ENDPOINTS_HEADER = "x-encoder-hosts-ports"
DATA_PARALLEL_ENDPOINT_HEADER = "x-data-parallel-host-port"
ROUTING_HEADERS = (PREFILL_ENDPOINT_HEADER, ENCODER_ENDPOINTS_HEADER, DATA_PARALLEL_ENDPOINT_HEADER)
"""Headers only the EPP may set: a request path must drop every client-sent copy of them."""

ROLE_LABEL = "llm-d.ai/role"
ROLE_DECODE = "decode"
ROLE_PREFILL = "prefill"
ROLE_ENCODE = "encode"
ROLE_PREFILL_DECODE = "prefill-decode"
ROLE_ENCODE_PREFILL = "encode-prefill"
ROLE_ENCODE_PREFILL_DECODE = "encode-prefill-decode"
ROLE_BOTH = "both"  # deprecated spelling of prefill-decode

DEFAULT_DECODE_PROFILE = "decode"
DEFAULT_PREFILL_PROFILE = "prefill"
DEFAULT_ENCODE_PROFILE = "encode"

# Label values of the disagg/pd decision counters (upstream's decision_type).
DECISION_DECODE_ONLY = "decode-only"
DECISION_PREFILL_DECODE = "prefill-decode"
DECISION_ENCODE_DECODE = "encode-decode"
DECISION_ENCODE_PREFILL_DECODE = "encode-prefill-decode"

PEER_ENDPOINT_KEY: StateKey[Endpoint] = StateKey("peer-endpoint")
"""The endpoint an earlier disaggregation stage picked (the decode pod in decode-first order, the prefill pod
in prefill-first order), for plugins of a later profile to compare candidates against."""

AVERAGE_CHARS_PER_TOKEN = 4


@runtime_checkable
class Decider(Protocol):
    """Says whether a request should get a separate stage (prefill or encode). `endpoint` is the decode
    endpoint already picked (None when the stage runs before decode). Pure and synchronous."""

    @property
    def typed_name(self) -> TypedName: ...

    def disaggregate(self, cycle: CycleState, request: InferenceRequest, endpoint: Endpoint | None) -> bool: ...


class DeciderRef:
    """A decider named in a handler's parameters. Resolved when the handler is built if the decider is
    already there, otherwise on first use (configurations may declare the decider after the handler)."""

    __slots__ = ("_decider", "_handle", "_reported", "field", "name")

    def __init__(self, field: str, name: str, handle: Handle) -> None:
        self.field = field
        self.name = name
        self._handle = handle
        self._decider: Decider | None = None
        self._reported = False
        found = handle.plugin(name)
        if found is not None:
            self._decider = _as_decider(field, name, found)

    def requires(self) -> frozenset[str]:
        """The data keys the decider needs produced (empty while it cannot be resolved). The config loader
        asks once every plugin is built, so an unresolvable name is logged then, at load time."""
        try:
            decider = self.get()
        except (LookupError, ValueError) as e:
            if not self._reported:
                self._reported = True
                log.error("disagg_decider_unresolved %s; every request will fail until the config is fixed", e)
            return frozenset()
        return frozenset(getattr(decider, "requires", ()) or ())

    def get(self) -> Decider:
        if self._decider is None:
            found = self._handle.plugin(self.name)
            if found is None:
                raise LookupError(f"{self.field}: no plugin named {self.name!r} is configured; declare the decider")
            self._decider = _as_decider(self.field, self.name, found)
        return self._decider


def _as_decider(field: str, name: str, plugin: Plugin) -> Decider:
    if not isinstance(plugin, Decider):
        raise ValueError(
            f"{field}: plugin {name!r} ({plugin.typed_name.type}) is not a decider; use prefix-based-pd-decider, "
            "always-disagg-pd-decider or always-disagg-multimodal-decider"
        )
    return plugin


def prompt_chars(request: InferenceRequest) -> int:
    """Characters of the request's user input: the prompt text, or the JSON of chat messages / responses
    input / conversation items. 0 when the body carries none of them."""
    payload: Mapping[str, Any] = request.body.payload
    api = request.body.api
    value: Any
    if api is ApiKind.COMPLETIONS:
        value = payload.get("prompt")
    elif api in (ApiKind.CHAT_COMPLETIONS, ApiKind.MESSAGES):
        value = payload.get("messages")
    elif api is ApiKind.RESPONSES:
        value = payload.get("input")
    elif api is ApiKind.CONVERSATIONS:
        value = payload.get("items")
    elif api is ApiKind.EMBEDDINGS:
        value = payload.get("input")
    else:
        value = payload.get("prompt")
    if value is None:
        return 0
    if isinstance(value, str):
        return len(value)
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return len(" ".join(value))
    try:
        return len(orjson.dumps(value))
    except TypeError:
        return 0


def prompt_tokens(request: InferenceRequest) -> int:
    """The request's input length in tokens: the token ids when the body carries them, else characters / 4."""
    if request.body.token_ids:
        return len(request.body.token_ids)
    return prompt_chars(request) // AVERAGE_CHARS_PER_TOKEN


_MULTIMODAL_BLOCKS = frozenset({"image_url", "video_url", "input_audio", "image", "input_image", "audio_url"})


def has_multimodal_content(request: InferenceRequest) -> bool:
    """True when a chat message (or responses input item) carries an image, video or audio content block."""
    payload = request.body.payload
    for field in ("messages", "input"):
        items = payload.get(field)
        if not isinstance(items, list):
            continue
        for item in items:
            content = item.get("content") if isinstance(item, dict) else None
            if not isinstance(content, list):
                continue
            for block in content:
                if isinstance(block, dict) and (block.get("type") in _MULTIMODAL_BLOCKS):
                    return True
    return False


def request_headers(cycle: CycleState) -> dict[str, str]:
    """The request's upstream-header map in the CycleState, created on first use."""
    headers = cycle.read(REQUEST_HEADERS_KEY)
    if headers is None:
        headers = {}
        cycle.write(REQUEST_HEADERS_KEY, headers)
    return headers


def host_ports(endpoints: Iterable[Endpoint]) -> list[str]:
    return [e.metadata.hostport for e in endpoints]


def set_disagg_headers(
    cycle: CycleState, results: Mapping[str, ProfileResult | None], prefill_profile: str, encode_profile: str
) -> None:
    """Writes `x-prefiller-host-port` (first prefill target) and `x-encoder-hosts-ports` (every encode
    target, comma-separated) for the profiles that produced targets; removes stale values otherwise."""
    headers = request_headers(cycle)
    prefill = results.get(prefill_profile)
    if prefill is not None and prefill.target_endpoints:
        headers[PREFILL_ENDPOINT_HEADER] = prefill.target_endpoints[0].metadata.hostport
    else:
        headers.pop(PREFILL_ENDPOINT_HEADER, None)
    encode = results.get(encode_profile)
    if encode is not None and encode.target_endpoints:
        headers[ENCODER_ENDPOINTS_HEADER] = ",".join(host_ports(encode.target_endpoints))
    else:
        headers.pop(ENCODER_ENDPOINTS_HEADER, None)


def decision_type(encode_used: bool, prefill_used: bool) -> str:
    if encode_used and prefill_used:
        return DECISION_ENCODE_PREFILL_DECODE
    if encode_used:
        return DECISION_ENCODE_DECODE
    if prefill_used:
        return DECISION_PREFILL_DECODE
    return DECISION_DECODE_ONLY


def model_label(request: InferenceRequest) -> str:
    return request.target_model or "unknown"
