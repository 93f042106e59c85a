"""The director's own per-request state, handed to adapters as an opaque handle: no protobuf, no stream
state, and no request bytes (so a request held for a long time, e.g. under a lease, keeps no body)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from llm_epp.framework import CycleState, Endpoint, InferenceRequest
from llm_epp.framework.parsing import ParsedRequest, Parser


@dataclass(slots=True, eq=False)
class RequestHandle:
    """Created by `Director.route`; adapters only pass it back. Written by the director alone."""

    request_id: str
    received_at: float
    request: InferenceRequest | None = None
    cycle: CycleState = field(default_factory=CycleState)
    endpoint: Endpoint | None = None
    parser: Parser | None = None
    parsed: ParsedRequest | None = None
    forwarded_bytes: int = 0
    reserved_tokens: int = 0
    scheduled: bool = False
    finished: bool = False
    status: int = 0
    served_endpoint: str = ""
    streaming: bool = False
    first_body_at: float | None = None  # when the first response body bytes arrived (director's clock)
    eviction: asyncio.Future[None] | None = None
    """Resolved when flow control evicts the dispatched request: the adapter ends it at once (ext_proc: 429
    "request evicted by flow control"). None when the request cannot be evicted."""


# The name the lease table knows the handle by.
RequestRecord = RequestHandle
