"""Builders shared by the disaggregation plugin tests: role-labelled pods and a real scheduler with a
decode and a prefill (and optionally encode) profile built from the real role filters."""

from __future__ import annotations

from collections.abc import Mapping

from llm_epp.framework import ApiKind, Endpoint, EndpointKey, InferenceRequest, ProfileHandler
from llm_epp.plugins.disagg.decode_filter import DecodeFilter
from llm_epp.plugins.disagg.encode_filter import EncodeFilter
from llm_epp.plugins.disagg.prefill_filter import PrefillFilter
from llm_epp.plugins.requestcontrol.approx_prefix_cache_producer import PrefixMatch
from llm_epp.plugins.scheduling.max_score_picker import MaxScorePicker
from llm_epp.scheduling import Scheduler, SchedulerProfile
from tests.unit.builders import FakeRecorder, endpoint, request

ROLE = "llm-d.ai/role"


def pod(name: str, role: str | None, address: str, port: int = 8000) -> Endpoint:
    return endpoint(name, address=address, port=port, labels={ROLE: role} if role is not None else {})


def pool() -> list[Endpoint]:
    return [
        pod("dec", "decode", "10.0.0.1"),
        pod("pre", "prefill", "10.0.0.2", 8200),
        pod("enc", "encode", "10.0.0.3", 8300),
    ]


def scheduler(handler: ProfileHandler, recorder: FakeRecorder, *, encode: bool = False) -> Scheduler:
    picker = MaxScorePicker("picker")
    profiles = {
        "decode": SchedulerProfile("decode", [DecodeFilter("decode-filter")], [], picker, recorder),
        "prefill": SchedulerProfile("prefill", [PrefillFilter("prefill-filter")], [], picker, recorder),
    }
    if encode:
        profiles["encode"] = SchedulerProfile("encode", [EncodeFilter("encode-filter")], [], picker, recorder)
    return Scheduler(handler, profiles, recorder)


def prompt_request(chars: int, model: str = "m") -> InferenceRequest:
    """A completions request whose prompt has `chars` characters (chars / 4 tokens)."""
    return request(model, api=ApiKind.COMPLETIONS, payload={"model": model, "prompt": "x" * chars})


def match(matches: Mapping[EndpointKey, int], total_blocks: int = 64, block_size_tokens: int = 16) -> PrefixMatch:
    return PrefixMatch(list(range(total_blocks)), dict(matches), block_size_tokens)
