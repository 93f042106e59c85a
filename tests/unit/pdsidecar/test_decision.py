"""The sidecar's pure decisions: which requests split, which prefill target, what a prefill answer means."""

from __future__ import annotations

from typing import Any

import pytest

from llm_epp.pdsidecar import decision as d
from llm_epp.pdsidecar.protocol import ApiStyle


def _plan(method: str, path: str, values: list[str], *, sampling: bool = False, pick: int = 0, allow: Any = None):
    return d.plan_request(
        method,
        path,
        values,
        sampling=sampling,
        sampler=lambda n: pick % n,
        allowed=allow or (lambda target: True),
    )


@pytest.mark.parametrize(
    ("method", "path", "values", "kind", "target"),
    [
        ("POST", "/v1/chat/completions", [], d.PlanKind.PASS_THROUGH, ""),
        ("POST", "/v1/chat/completions", [" , "], d.PlanKind.PASS_THROUGH, ""),
        ("GET", "/v1/chat/completions", ["10.0.0.1:8000"], d.PlanKind.PASS_THROUGH, ""),
        ("POST", "/v1/embeddings", ["10.0.0.1:8000"], d.PlanKind.PASS_THROUGH, ""),
        ("POST", "/v1/completions", ["10.0.0.1:8000"], d.PlanKind.DISAGGREGATE, "10.0.0.1:8000"),
        ("POST", "/v1/completions", ["10.0.0.1:8000, 10.0.0.2:8000"], d.PlanKind.DISAGGREGATE, "10.0.0.1:8000"),
        ("POST", "/v1/completions", ["10.0.0.1"], d.PlanKind.DENIED, "10.0.0.1"),
        ("POST", "/v1/completions", ["user@10.0.0.1:80"], d.PlanKind.DENIED, "user@10.0.0.1:80"),
        ("POST", "/v1/completions", ["10.0.0.1:70000"], d.PlanKind.DENIED, "10.0.0.1:70000"),
    ],
    ids=["no-header", "empty-list", "get", "not-inference", "one", "first-of-two", "no-port", "userinfo", "bad-port"],
)
def test_plan(method: str, path: str, values: list[str], kind: d.PlanKind, target: str) -> None:
    plan = _plan(method, path, values)
    assert (plan.kind, plan.target) == (kind, target)


def test_sampling_picks_the_sampled_target_and_the_allow_list_applies_to_it() -> None:
    values = ["10.0.0.1:8000,10.0.0.2:8000,10.0.0.3:8000"]
    assert _plan("POST", "/v1/completions", values, sampling=True, pick=2).target == "10.0.0.3:8000"
    allowed = {"10.0.0.1:8000"}.__contains__
    assert _plan("POST", "/v1/completions", values, sampling=True, pick=1, allow=allowed).kind is d.PlanKind.DENIED
    plan = _plan("POST", "/v1/responses", values, allow=allowed)
    assert (plan.kind, plan.style) == (d.PlanKind.DISAGGREGATE, ApiStyle.RESPONSES)


@pytest.mark.parametrize(
    ("status", "answer", "failure", "verdict"),
    [
        (0, None, "connection refused", d.PrefillVerdict.RETRY),
        (503, None, "", d.PrefillVerdict.RETRY),
        (400, {"error": {}}, "", d.PrefillVerdict.REJECT),
        (451, None, "", d.PrefillVerdict.REJECT),
        (500, None, "", d.PrefillVerdict.FALLBACK),
        (200, None, "", d.PrefillVerdict.FALLBACK),
        (200, {"usage": {}}, "", d.PrefillVerdict.FALLBACK),
        (200, {"kv_transfer_params": "x"}, "", d.PrefillVerdict.FALLBACK),
    ],
    ids=["no-answer", "503", "400", "451", "500", "not-json", "no-params", "params-not-object"],
)
def test_classify_failures(status: int, answer: Any, failure: str, verdict: d.PrefillVerdict) -> None:
    outcome = d.classify_prefill(status, answer, failure=failure)
    assert outcome.verdict is verdict
    assert outcome.reason
    assert outcome.kv_transfer_params is None


def test_classify_a_usable_answer_carries_its_params_and_cached_tokens() -> None:
    params = {"do_remote_prefill": True, "remote_block_ids": [1, 2]}
    answer = {"kv_transfer_params": params, "usage": {"prompt_tokens_details": {"cached_tokens": 32}}}
    outcome = d.classify_prefill(200, answer)
    assert (outcome.verdict, outcome.kv_transfer_params, outcome.cached_tokens) == (d.PrefillVerdict.USE, params, 32)
    assert d.classify_prefill(200, {"kv_transfer_params": params}).cached_tokens == 0
