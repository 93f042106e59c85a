"""The sidecar's decisions as pure functions: whether a request is disaggregated, which prefill pod gets its
prefill leg, and what a prefill answer means for the request. The HTTP proxy (`proxy`) and the simulator's
virtual-time sidecar both call these, so the two cannot drift apart.

No I/O, no clock: inputs are the request line, the `x-prefiller-host-port` header values and the prefill
leg's HTTP status and decoded body."""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from llm_epp.framework.types import split_host_port
from llm_epp.pdsidecar import protocol as p

__all__ = [
    "Plan",
    "PlanKind",
    "PrefillOutcome",
    "PrefillVerdict",
    "classify_prefill",
    "plan_request",
    "prefill_targets",
    "valid_target",
]

RETRYABLE_STATUSES = frozenset({502, 503, 504})
"""Prefill answers that may succeed when the same pod is asked again."""


class PlanKind(enum.Enum):
    PASS_THROUGH = "pass-through"
    """Not a disaggregated request: forward it to the local model server as it is."""
    DENIED = "denied"
    """The named prefill pod is not a valid or allowed target (SSRF protection): answer 403."""
    DISAGGREGATE = "disaggregate"
    """Run the prefill leg on `target`, then decode locally."""


@dataclass(frozen=True, slots=True)
class Plan:
    kind: PlanKind
    target: str = ""
    style: p.ApiStyle | None = None


_PASS = Plan(PlanKind.PASS_THROUGH)


def prefill_targets(values: Iterable[str]) -> list[str]:
    """The prefill pods named by the header values (each may be a comma-separated list), in order."""
    out: list[str] = []
    for value in values:
        out.extend(t.strip() for t in value.split(",") if t.strip())
    return out


def valid_target(target: str) -> bool:
    """`host:port` with a port of 1-65535 and nothing that could turn the URL into another one."""
    try:
        host, port = split_host_port(target)
    except ValueError:
        return False
    return bool(host) and port is not None and 1 <= port <= 65535 and "/" not in host and "@" not in host


def plan_request(
    method: str,
    path: str,
    header_values: Iterable[str],
    *,
    sampling: bool,
    sampler: Callable[[int], int],
    allowed: Callable[[str], bool],
) -> Plan:
    """What the sidecar does with one request. A POST to an inference path with at least one prefill target is
    disaggregated on the first target (a random one when `sampling`), unless that target is malformed or
    `allowed` refuses it; everything else passes through."""
    style = p.DISAGGREGATED_PATHS.get(path) if method == "POST" else None
    if style is None:
        return _PASS
    targets = prefill_targets(header_values)
    if not targets:
        return _PASS
    target = targets[sampler(len(targets))] if sampling else targets[0]
    if not valid_target(target) or not allowed(target):
        return Plan(PlanKind.DENIED, target, style)
    return Plan(PlanKind.DISAGGREGATE, target, style)


class PrefillVerdict(enum.Enum):
    USE = "use"
    """The answer carries `kv_transfer_params`: decode with them."""
    REJECT = "reject"
    """HTTP 400-451: the request itself is bad; return the prefill pod's answer to the client."""
    RETRY = "retry"
    """A transient failure (no answer, 502-504): ask again if retries are left, else fall back."""
    FALLBACK = "fallback"
    """Any other failure: decode locally without disaggregation."""


@dataclass(frozen=True, slots=True)
class PrefillOutcome:
    verdict: PrefillVerdict
    reason: str = ""
    kv_transfer_params: dict[str, Any] | None = None
    cached_tokens: int = 0
    """Prompt tokens the prefill pod found in its prefix cache (folded into the client's usage)."""


def classify_prefill(status: int, answer: Any, *, failure: str = "") -> PrefillOutcome:
    """What the prefill leg's result means. `status` 0 with `failure` set: no HTTP answer at all; `answer` is
    the decoded JSON body (None when it was not JSON)."""
    if failure or status in RETRYABLE_STATUSES:
        return PrefillOutcome(PrefillVerdict.RETRY, failure or f"prefill answered HTTP {status}")
    if 400 <= status <= 451:
        return PrefillOutcome(PrefillVerdict.REJECT, f"prefill answered HTTP {status}")
    if not 200 <= status < 300:
        return PrefillOutcome(PrefillVerdict.FALLBACK, f"prefill answered HTTP {status}")
    if answer is None:
        return PrefillOutcome(PrefillVerdict.FALLBACK, "prefill answer is not JSON")
    params = answer.get(p.KV_TRANSFER_PARAMS) if isinstance(answer, dict) else None
    if not isinstance(params, dict):
        return PrefillOutcome(PrefillVerdict.FALLBACK, "prefill answer has no kv_transfer_params")
    return PrefillOutcome(PrefillVerdict.USE, kv_transfer_params=params, cached_tokens=p.cached_tokens(answer) or 0)
