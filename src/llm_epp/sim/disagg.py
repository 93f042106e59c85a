"""Prefill/decode disaggregation in the simulator: pod roles, the KV transfer, vLLM's NIXL parameters, and the
decode pods' routing sidecar in virtual time.

What a simulated pod does with ``kv_transfer_params`` (as vLLM's NIXL connector does):

* ``do_remote_decode: true`` (the sidecar's prefill leg): the pod prefills the prompt and produces the requested
  tokens (the sidecar asks for one) as usual; its answer carries ``kv_transfer_params`` naming where the KV
  blocks are (``do_remote_prefill: true``, ``remote_engine_id``, ``remote_request_id``, ``remote_block_ids``,
  ``remote_host``, ``remote_port``, ``tp_size``).  The block ids are synthetic (one per prompt block).
* ``do_remote_prefill: true`` with every field vLLM needs (non-empty ``remote_block_ids``, engine id, request
  id, host, port): the pod pulls the prompt's KV it does not hold in its own prefix cache (whole blocks) and
  then decodes without prefilling them (the last prompt token is recomputed).  The pull takes
  ``setup_latency + bytes / bandwidth``, ``bytes`` = pulled tokens x the profile's ``kv_bytes_per_token``.
  Parameters lacking a field are ignored (the prompt is prefilled locally), as vLLM ignores them.

Simplifications: a transfer starts as soon as the decode pod gets the request (vLLM first admits it, holding
its blocks, then pulls); transfers do not share bandwidth; the prefill pod does not keep the blocks pinned
until they are pulled (they stay in its prefix cache until evicted).

Roles are labelled with ``llm-d.ai/role`` as llm-d labels its pods: ``prefill``, ``decode``, and
``prefill-decode`` for a pod doing both (``both``)."""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from llm_epp.pdsidecar import decision as d
from llm_epp.pdsidecar import protocol as p
from llm_epp.sim.engine import RequestEvent, SimRequest

__all__ = [
    "DEFAULT_BANDWIDTH",
    "DEFAULT_SETUP_LATENCY",
    "ROLES",
    "ROLE_LABEL",
    "DecodeLeg",
    "KvTransfer",
    "LegRunner",
    "RemotePrefill",
    "SidecarRefusal",
    "VirtualSidecar",
    "is_remote_decode",
    "prefill_kv_transfer_params",
    "pulled_tokens",
    "role_labels",
]

ROLE_LABEL = "llm-d.ai/role"
ROLES = ("prefill", "decode", "both")
_ROLE_VALUES = {"prefill": "prefill", "decode": "decode", "both": "prefill-decode"}

DEFAULT_BANDWIDTH = 25e9
"""Bytes per second of a KV pull (a 200 Gb/s RDMA path)."""
DEFAULT_SETUP_LATENCY = 0.005
"""Seconds a pull costs before the first byte moves (notification, descriptor setup)."""


def role_labels(role: str) -> dict[str, str]:
    """The endpoint labels of a pod with ``role`` (one of :data:`ROLES`)."""
    try:
        return {ROLE_LABEL: _ROLE_VALUES[role]}
    except KeyError:
        raise ValueError(f"unknown pod role {role!r}; use one of {', '.join(ROLES)}") from None


@dataclass(frozen=True, slots=True)
class KvTransfer:
    """How fast a decode pod pulls KV blocks from a prefill pod."""

    bandwidth: float = DEFAULT_BANDWIDTH
    """Bytes per second."""
    setup_latency: float = DEFAULT_SETUP_LATENCY
    """Seconds per pull, whatever its size."""

    def __post_init__(self) -> None:
        if not self.bandwidth > 0 or not math.isfinite(self.bandwidth):
            raise ValueError("the KV transfer bandwidth must be a positive number of bytes per second")
        if self.setup_latency < 0:
            raise ValueError("the KV transfer setup latency must be >= 0")

    def duration(self, nbytes: int) -> float:
        return self.setup_latency + nbytes / self.bandwidth


def is_remote_decode(params: Any) -> bool:
    """True for the parameters of a prefill leg (``do_remote_decode: true``)."""
    return isinstance(params, dict) and params.get("do_remote_decode") is True


def prefill_kv_transfer_params(
    *, engine_id: str, request_id: str, num_prompt_tokens: int, block_size: int, host: str, port: int
) -> dict[str, Any]:
    """What vLLM's NIXL connector returns for a finished prefill leg: where a decode pod pulls the KV from."""
    return {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_block_ids": list(range(-(-num_prompt_tokens // block_size))),
        "remote_engine_id": engine_id,
        "remote_request_id": request_id,
        "remote_host": host,
        "remote_port": port,
        "tp_size": 1,
    }


_REMOTE_FIELDS = ("remote_engine_id", "remote_request_id", "remote_host", "remote_port")


@dataclass(frozen=True, slots=True)
class RemotePrefill:
    """Usable ``do_remote_prefill`` parameters: the decode pod pulls the KV from ``host:port``."""

    host: str
    port: int
    engine_id: str
    request_id: str

    @staticmethod
    def parse(params: Any) -> RemotePrefill | None:
        """The pull these parameters ask for; None when they ask for none or lack a field vLLM needs."""
        if not isinstance(params, dict) or params.get("do_remote_prefill") is not True:
            return None
        if not params.get("remote_block_ids") or not all(params.get(k) is not None for k in _REMOTE_FIELDS):
            return None
        port = params["remote_port"]
        if not isinstance(port, int) or isinstance(port, bool):
            return None
        return RemotePrefill(
            str(params["remote_host"]), port, str(params["remote_engine_id"]), str(params["remote_request_id"])
        )


def pulled_tokens(num_prompt_tokens: int, locally_cached: int) -> int:
    """Prompt tokens a decode pod pulls: those it does not hold in its prefix cache."""
    return max(num_prompt_tokens - locally_cached, 0)


# --------------------------------------------------------------------------------------------- virtual time


class LegRunner(Protocol):
    """What the virtual-time sidecar needs of the cluster."""

    def run_leg(self, pod: int, request: SimRequest) -> Awaitable[RequestEvent]:
        """Submits ``request`` to ``pod`` now and resolves with its FINISHED event; raises ``ValueError`` when
        the pod rejects it (vLLM's HTTP 400)."""
        ...

    def cached_prefix_tokens(self, pod: int, token_ids: Sequence[int]) -> int:
        """Leading tokens of ``token_ids`` in ``pod``'s prefix cache now."""
        ...


@dataclass(frozen=True, slots=True)
class DecodeLeg:
    """A disaggregated request, ready for its decode pod: the KV of ``external_tokens`` prompt tokens arrived."""

    external_tokens: int
    prefill_pod: int
    cached_tokens: int
    """The prefill pod's prefix-cache hit, which the sidecar reports to the client as the cached tokens."""
    kv_bytes: int
    transfer_seconds: float


class SidecarRefusal(Exception):
    """The sidecar answered the client itself (403 for a denied prefill target, the prefill pod's 400)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class VirtualSidecar:
    """The routing sidecar of every decode pod, in virtual time.  Its decisions (pass through or split, which
    prefill target, what the prefill answer means) are :mod:`llm_epp.pdsidecar.decision`'s, and the legs'
    bodies :mod:`llm_epp.pdsidecar.protocol`'s, the functions ``llm-epp pd-sidecar`` runs.

    ``addresses`` maps each pod's ``ip:port`` to its index; as with the sidecar's endpoints-file allow-list,
    only those are allowed targets."""

    def __init__(
        self,
        addresses: Mapping[str, int],
        *,
        block_size: int,
        kv_bytes_per_token: int,
        transfer: KvTransfer,
        enable_prefiller_sampling: bool = False,
        seed: int = 0,
    ) -> None:
        self._pods = dict(addresses)
        self._address = {i: a for a, i in self._pods.items()}
        self._block_size = block_size
        self._kv_bytes = kv_bytes_per_token
        self.transfer = transfer
        self._sampling = enable_prefiller_sampling
        self._rng = random.Random(seed)
        self.split = 0
        """Requests run as a prefill leg plus a decode leg."""
        self.fallbacks = 0
        """Requests that fell back to a local prefill."""

    async def handle(
        self,
        runner: LegRunner,
        request_id: str,
        decode_pod: int,
        path: str,
        headers: Mapping[str, str],
        body: dict[str, Any],
        token_ids: Sequence[int],
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> DecodeLeg | None:
        """Runs what the sidecar in front of ``decode_pod`` does before its model server gets the request:
        None to pass it through (or to decode locally after a failed prefill), a :class:`DecodeLeg` when the
        prefill ran elsewhere and the KV has arrived.  Raises :class:`SidecarRefusal` for what it answers
        itself."""
        header = headers.get(p.PREFILL_HEADER)
        plan = d.plan_request(
            "POST",
            path,
            [header] if header is not None else [],
            sampling=self._sampling,
            sampler=self._rng.randrange,
            allowed=self._pods.__contains__,
        )
        if plan.kind is d.PlanKind.PASS_THROUGH:
            return None
        if plan.kind is d.PlanKind.DENIED:
            raise SidecarRefusal(403, f"prefill target {plan.target!r} not allowed by SSRF protection")
        assert plan.style is not None
        prefill_pod = self._pods[plan.target]
        prefill_body = p.nixl_prefill_body(body, plan.style)
        answer: dict[str, Any] | None
        try:
            status, answer = 200, await self._prefill(runner, request_id, prefill_pod, prefill_body, token_ids)
        except ValueError as e:
            status, answer = 400, {"error": {"message": str(e)}}
        outcome = d.classify_prefill(status, answer)
        if outcome.verdict is d.PrefillVerdict.REJECT:
            raise SidecarRefusal(status, outcome.reason)
        if outcome.verdict is not d.PrefillVerdict.USE:  # no retries configured: decode locally
            self.fallbacks += 1
            return None
        decode_body = p.nixl_decode_body(body, outcome.kv_transfer_params)
        remote = RemotePrefill.parse(decode_body.get(p.KV_TRANSFER_PARAMS))
        if remote is None:
            self.fallbacks += 1
            return None
        local = runner.cached_prefix_tokens(decode_pod, token_ids)
        nbytes = pulled_tokens(len(token_ids), local) * self._kv_bytes
        seconds = self.transfer.duration(nbytes)
        await sleep(seconds)
        self.split += 1
        return DecodeLeg(len(token_ids), prefill_pod, outcome.cached_tokens, nbytes, seconds)

    async def _prefill(
        self, runner: LegRunner, request_id: str, pod: int, body: dict[str, Any], token_ids: Sequence[int]
    ) -> dict[str, Any]:
        """The prefill pod's answer to the prefill leg (a vLLM completion with ``kv_transfer_params``)."""
        max_tokens = body.get("max_tokens", 1)
        leg_id = f"{request_id}-prefill"
        event = await runner.run_leg(pod, SimRequest(leg_id, tuple(token_ids), int(max_tokens)))
        host, _, port = self._address[pod].rpartition(":")
        answer: dict[str, Any] = {
            "id": f"cmpl-{leg_id}",
            "object": "text_completion",
            "choices": [{"index": 0, "text": " t0", "finish_reason": "length"}],
            "usage": {
                "prompt_tokens": event.prompt_tokens,
                "completion_tokens": event.completion_tokens,
                "total_tokens": event.prompt_tokens + event.completion_tokens,
                "prompt_tokens_details": {"cached_tokens": event.cached_tokens},
            },
        }
        if is_remote_decode(body.get(p.KV_TRANSFER_PARAMS)):
            answer[p.KV_TRANSFER_PARAMS] = prefill_kv_transfer_params(
                engine_id=f"sim-engine-{pod}",
                request_id=leg_id,
                num_prompt_tokens=event.prompt_tokens,
                block_size=self._block_size,
                host=host,
                port=int(port),
            )
        return answer
