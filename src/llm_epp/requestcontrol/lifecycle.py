"""Per-request domain state, from the first header to completion. No protobuf, no stream state."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from llm_epp.framework import CycleState, Endpoint, InferenceRequest, SchedulingResult
from llm_epp.framework.requestcontrol import Usage


@dataclass(slots=True)
class RequestRecord:
    request_id: str
    headers: dict[str, str]
    received_at: float = field(default_factory=time.monotonic)
    request_id_generated: bool = False
    path: str = ""
    incoming_model: str = ""
    target_model: str = ""
    request: InferenceRequest | None = None
    result: SchedulingResult | None = None
    endpoint: Endpoint | None = None
    candidates: Sequence[Endpoint] = ()
    destination: str = ""  # comma-joined host:port list, primary first
    body_out: bytes | None = None  # the body to send upstream when it differs from the one received
    request_bytes: int = 0
    response_status: int = 0
    response_streaming: bool = False
    response_bytes: int = 0
    served_endpoint: str = ""
    usage: Usage | None = None
    cycle: CycleState = field(default_factory=CycleState)
    reserved_tokens: int = 0
    scheduled: bool = False
    finished: bool = False

    @property
    def model_rewritten(self) -> bool:
        return bool(self.incoming_model) and self.target_model != self.incoming_model
