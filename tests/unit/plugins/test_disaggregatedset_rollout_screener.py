"""disaggregatedset-rollout-screener: parameters as llm-d-router validates them, revision shares (sum, max-role),
the screen itself, response stamping, and the whole request path keeping prefill and decode on one revision."""

from __future__ import annotations

import json
import random
from collections import Counter
from typing import Any

import pytest

from llm_epp.composition import build_request_path
from llm_epp.framework import CycleState, Endpoint, EndpointKey, EndpointMetadata, EppError
from llm_epp.framework.registry import PluginParamsError
from llm_epp.framework.requestcontrol import RESPONSE_HEADERS_KEY, ResponseInfo
from llm_epp.plugins import builtin_registry
from llm_epp.plugins.disagg.disaggregatedset_rollout_screener import (
    TYPE,
    DisaggregatedsetRolloutScreener,
    Params,
    distribution,
    pick_weighted,
)
from llm_epp.plugins.disagg.label_selector import LabelSelector, LabelSelectorError
from llm_epp.requestcontrol.decision import RequestInput
from tests.unit.builders import FakeHandle, FakeRecorder, endpoint, request

REV = "disaggregatedset.x-k8s.io/revision"
ROLE = "disaggregatedset.x-k8s.io/role"
NAME = "disaggregatedset.x-k8s.io/name"
SLICE = "disaggregatedset.x-k8s.io/slice"
REGISTRY = builtin_registry()

PARAMS: dict[str, Any] = {
    "scope": {"labelSelector": f"{NAME}=my-set"},
    "headerSelectors": [
        {"name": "revision", "headerName": "X-Disagg-Revision", "labelKey": REV, "mode": "strict"},
        {"name": "slice", "headerName": "x-disagg-slice", "labelKey": SLICE, "mode": "prefer"},
    ],
    "revisionGating": {"mode": "max-role", "requireRoles": {"values": ["prefill", "decode"]}},
}


def _params(**over: Any) -> Params:
    return REGISTRY.parse_params(TYPE, {**PARAMS, **over})  # type: ignore[return-value]


def pod(name: str, revision: str, role: str, *, in_set: bool = True, slice_: str = "s0", i: int = 0) -> Endpoint:
    labels = {REV: revision, ROLE: role, "llm-d.ai/role": role, SLICE: slice_}
    if in_set:
        labels[NAME] = "my-set"
    return endpoint(name, address=f"10.0.{i // 250}.{i % 250 + 1}", labels=labels)


def rollout_pool() -> list[Endpoint]:
    """The 2P:10D rollout state of the upstream example: A has 2 prefill + 9 decode, B 1 + 1, C (incomplete)
    1 decode; one pod of A is outside the set."""
    pods = [pod(f"a-p{k}", "A", "prefill") for k in range(2)]
    pods += [pod(f"a-d{k}", "A", "decode") for k in range(9)]
    pods += [pod("b-p0", "B", "prefill", slice_="s1"), pod("b-d0", "B", "decode", slice_="s1")]
    pods += [pod("c-d0", "C", "decode"), pod("x-p0", "A", "prefill", in_set=False)]
    return [pod(p.key.name, p.metadata.labels[REV], p.metadata.labels[ROLE],
                in_set=NAME in p.metadata.labels, slice_=p.metadata.labels[SLICE], i=i)
            for i, p in enumerate(pods)]  # fmt: skip


def screener(pool: list[Endpoint], **over: Any) -> tuple[DisaggregatedsetRolloutScreener, FakeHandle]:
    handle = FakeHandle(pool=pool)
    return DisaggregatedsetRolloutScreener("rollout", _params(**over), handle, random.Random(1)), handle


# --- parameters ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"scope": {"labelSelector": ""}}, "scope.labelSelector is required"),
        ({"scope": {"labelSelector": "a in (b"}}, "not a valid label selector"),
        ({"revisionGating": {"mode": "sum"}}, "requireRoles is required when revisionGating.mode=sum"),
        ({"revisionGating": {"mode": "sum", "requireRoles": {"values": []}}}, "at least one role"),
        ({"revisionGating": {"mode": "sum", "requireRoles": {"values": ["p", "p"]}}}, "duplicate role 'p'"),
        ({"revisionGating": {"mode": "newest"}}, "sum', 'max-role' or 'disabled"),
        ({"headerSelectors": [PARAMS["headerSelectors"][0]] * 2}, "duplicate name 'revision'"),
        (
            {"headerSelectors": [{"name": "x", "headerName": "h", "labelKey": "k", "mode": "soft"}]},
            "strict' or 'prefer",
        ),
    ],
    ids=["no-scope", "bad-selector", "no-roles", "empty-roles", "duplicate-role", "bad-mode", "dup-name", "bad-sel"],
)
def test_invalid_parameters_are_refused_with_the_reason(change: dict[str, Any], message: str) -> None:
    with pytest.raises(PluginParamsError, match=message):
        _params(**change)
    with pytest.raises(PluginParamsError, match="revisionGating"):
        REGISTRY.parse_params(TYPE, {"scope": PARAMS["scope"]})


def test_defaults_and_normalization() -> None:
    p = _params(revisionGating={"mode": "disabled"})
    assert p.revision_gating.revision_key == REV and p.revision_gating.role_key == ROLE
    assert p.header_selectors[0].header_name == "x-disagg-revision"  # request headers arrive lower-cased


@pytest.mark.parametrize(
    ("text", "labels", "matches"),
    [
        ("a=1,b!=2", {"a": "1", "b": "3"}, True),
        ("a==1", {"a": "2"}, False),
        ("env in (x, y),!legacy", {"env": "y"}, True),
        ("env notin (x,y)", {"env": "x"}, False),
        ("tier", {}, False),
        ("", {"anything": "x"}, True),
    ],
)
def test_label_selector(text: str, labels: dict[str, str], matches: bool) -> None:
    assert LabelSelector.parse(text).matches(labels) is matches


def test_label_selector_names_the_bad_term() -> None:
    with pytest.raises(LabelSelectorError, match="'a b c'"):
        LabelSelector.parse("x=1,a b c")


# --- shares ---------------------------------------------------------------------------------------------------


def test_shares_of_the_upstream_rollout_example() -> None:
    counts = {"A": {"prefill": 2, "decode": 9}, "B": {"prefill": 1, "decode": 1}, "C": {"decode": 1}}
    summed = distribution(counts, ("prefill", "decode"), "sum").shares
    assert summed == pytest.approx({"A": 11 / 13, "B": 2 / 13, "C": 0.0})
    by_role = distribution(counts, ("prefill", "decode"), "max-role").shares
    assert by_role == pytest.approx({"A": 0.9, "B": 0.1, "C": 0.0})
    tie = distribution({"A": {"p": 1, "d": 3}, "B": {"p": 3, "d": 1}}, ("p", "d"), "max-role").shares
    assert tie == pytest.approx({"A": 0.25, "B": 0.75})  # equal totals: the first role listed wins
    assert pick_weighted({"A": 0.9, "B": 0.1}, 0.89) == "A" and pick_weighted({"A": 0.9, "B": 0.1}, 0.95) == "B"
    assert pick_weighted({}, 0.5) == ""


# --- screening ------------------------------------------------------------------------------------------------


def test_screen_keeps_one_covered_revision_drawn_by_weight_and_reports_shares() -> None:
    pool = rollout_pool()
    s, handle = screener(pool)
    drawn: Counter[str] = Counter()
    for _ in range(400):
        kept = s.screen(request(), pool)
        revisions = {e.metadata.labels[REV] for e in kept}
        assert len(revisions) == 1 and revisions <= {"A", "B"}
        revision = revisions.pop()
        drawn[revision] += 1
        # every candidate of the drawn revision stays, the out-of-scope pod of A too (scope decides what counts)
        assert len(kept) == (12 if revision == "A" else 2)
    assert 300 < drawn["A"] < 400 and 10 < drawn["B"] < 80  # 90% / 10%
    assert handle.recorder.revision_shares[-1][1:] == ("max-role", pytest.approx({"A": 0.9, "B": 0.1, "C": 0.0}))
    assert len(handle.recorder.revision_shares) == 1  # recorded when the counts change, not per request


def test_a_strict_header_pins_the_revision_and_fails_closed_without_a_match() -> None:
    pool = rollout_pool()
    s, handle = screener(pool)
    kept = s.screen(request(headers={"x-disagg-revision": "B"}), pool)
    assert sorted(e.key.name for e in kept) == ["b-d0", "b-p0"]
    assert s.screen(request(headers={"x-disagg-revision": "C"}), pool) == []  # C is not covered
    assert s.screen(request(headers={"x-disagg-revision": "Z"}), pool) == []
    assert [n for _, n in handle.recorder.strict_no_match] == ["revision", "revision"]
    # a prefer selector never screens
    assert {e.metadata.labels[SLICE] for e in s.screen(request(headers={"x-disagg-slice": "s9"}), pool)}


def test_no_covered_revision_leaves_nothing_and_disabled_gating_keeps_everything() -> None:
    only_c = [p for p in rollout_pool() if p.metadata.labels[REV] == "C"]
    s, _ = screener(only_c)
    assert s.screen(request(), only_c) == []
    pool = rollout_pool()
    s, handle = screener(pool, revisionGating={"mode": "disabled"})
    assert len(s.screen(request(), pool)) == len(pool)
    assert [e.key.name for e in s.screen(request(headers={"x-disagg-revision": "C"}), pool)] == ["c-d0"]
    assert handle.recorder.revision_shares == []


def test_the_response_carries_the_serving_endpoints_labels() -> None:
    pool = rollout_pool()
    s, _ = screener(pool)
    cycle = CycleState()
    s.response_received(cycle, request(), ResponseInfo(), pool[-3])  # b-d0
    assert cycle.read(RESPONSE_HEADERS_KEY) == {"x-disagg-revision": "B", "x-disagg-slice": "s1"}


# --- the request path -----------------------------------------------------------------------------------------

CONFIG = f"""
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: disaggregatedset-rollout-screener
  name: rollout
  parameters: {json.dumps(PARAMS)}
- type: prefill-filter
- type: decode-filter
- type: queue-scorer
- type: random-picker
- type: always-disagg-pd-decider
- type: disagg-profile-handler
  parameters:
    deciders:
      prefill: always-disagg-pd-decider
schedulingProfiles:
- name: decode
  plugins:
  - pluginRef: decode-filter
  - pluginRef: queue-scorer
  - pluginRef: random-picker
- name: prefill
  plugins:
  - pluginRef: prefill-filter
  - pluginRef: queue-scorer
  - pluginRef: random-picker
"""


async def test_through_the_director_prefill_and_decode_always_share_a_revision() -> None:
    path = build_request_path(recorder=FakeRecorder(), config_text=CONFIG, pool_name="p")
    assert not path.config.warnings
    pool = rollout_pool()
    path.datastore.replace_all(
        EndpointMetadata(EndpointKey("default", e.key.name), e.metadata.address, 8000, labels=e.metadata.labels)
        for e in pool
    )
    revision_of = {f"{e.metadata.address}:8000": e.metadata.labels[REV] for e in pool}
    body = json.dumps({"model": "m", "prompt": "hello", "max_tokens": 1}).encode()
    seen: Counter[str] = Counter()
    for k in range(60):
        decision = await path.director.route(RequestInput(f"r{k}", {":path": "/v1/completions"}, body))
        decode = decision.endpoint.metadata.labels[REV]
        assert revision_of[decision.upstream_headers["x-prefiller-host-port"]] == decode
        seen[decode] += 1
        path.director.finish(decision.handle, _done())
    assert set(seen) == {"A", "B"}
    # a strict header naming a revision with no decode pod: 503
    strict = {":path": "/v1/completions", "x-disagg-revision": "C"}
    with pytest.raises(EppError) as info:
        await path.director.route(RequestInput("r-c", strict, body))
    assert info.value.code.http_status == 503
    assert "screeners eliminated all endpoint candidates" in info.value.message


def _done() -> Any:
    from llm_epp.requestcontrol.decision import Outcome

    return Outcome(complete=True, status=200)
