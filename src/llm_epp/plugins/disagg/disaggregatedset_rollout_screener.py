"""disaggregatedset-rollout-screener

Scheduling intent:
    During a `DisaggregatedSet` rollout, never pair a prefill pod of one revision with a decode pod of another
    (their KV formats, transfer libraries or drivers may not match). A Screener: it runs once per request,
    before PrepareData, admission and every scheduling profile, so the decode and prefill profiles choose from
    the same revision.

    Revision gating (`revisionGating.mode` `sum` or `max-role`): from the Ready pods that match
    `scope.labelSelector` and carry both the revision and the role label, count pods per revision and role.
    A revision lacking a Ready pod of any role in `requireRoles.values` gets no traffic. The others are
    weighted: `sum` = its Ready pods over the required roles; `max-role` = its Ready pods of the role with the
    largest total over all covered revisions (ties: the first role listed). Unless a strict header pins the
    revision, one revision is drawn at random by weight and only its endpoints go on; with one, the covered
    revisions' endpoints go on. Nothing left: HTTP 503. `disabled` skips gating.

    Header selectors: `strict` keeps only endpoints whose `labelKey` label equals the request's `headerName`
    header (when the request has it; no match fails closed with 503 and counts
    `llm_d_epp_disaggregatedset_strict_header_no_match_total`); `prefer` only stamps (pair it with
    `header-label-affinity-scorer`). When the response starts, every selector's header is set on the client's
    response to the serving endpoint's label value.

    Metric `llm_d_epp_disaggregatedset_revision_gating_share{plugin_type,plugin_name,mode,revision}`: each
    observed revision's current share (0 for an incomplete one; a revision no longer observed is removed).

    Difference from llm-d-router: upstream counts Pods from a Kubernetes Pod watch of the scope; llm-epp counts
    the pool's endpoints (the Ready pods the EPP routes to) that match the scope, so a pod in the scope but
    outside the InferencePool does not count. It also has no startup window without counts.

Inputs consumed:
    The pool's endpoints and their labels (revision, role, scope, selector labels); the request headers named
    by the selectors.

Configuration:
    scope.labelSelector (string, required): which pods count, e.g. "disaggregatedset.x-k8s.io/name=my-set".
    headerSelectors (list, default []): {name, headerName, labelKey, mode: strict | prefer}; names and
        header names unique.
    revisionGating (object, required): mode (sum | max-role | disabled, required); requireRoles.values
        (roles, required and non-empty for sum / max-role); revisionLabelKey (default
        "disaggregatedset.x-k8s.io/revision"); roleLabelKey (default "disaggregatedset.x-k8s.io/role").
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from pydantic import Field, field_validator, model_validator

from llm_epp.framework import CycleState, Endpoint, Handle, InferenceRequest, PluginParams, Recorder, TypedName
from llm_epp.framework.requestcontrol import RESPONSE_HEADERS_KEY, ResponseInfo
from llm_epp.plugins.disagg.label_selector import LabelSelector, LabelSelectorError

TYPE = "disaggregatedset-rollout-screener"
DEFAULT_REVISION_LABEL = "disaggregatedset.x-k8s.io/revision"
DEFAULT_ROLE_LABEL = "disaggregatedset.x-k8s.io/role"


class Scope(PluginParams):
    label_selector: str = Field(alias="labelSelector")

    @field_validator("label_selector")
    @classmethod
    def _valid(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("scope.labelSelector is required")
        try:
            LabelSelector.parse(value)
        except LabelSelectorError as e:
            raise ValueError(f"scope.labelSelector is not a valid label selector: {e}") from None
        return value


class HeaderSelector(PluginParams):
    name: str = Field(min_length=1)
    header_name: str = Field(alias="headerName", min_length=1)
    label_key: str = Field(alias="labelKey", min_length=1)
    mode: Literal["strict", "prefer"]

    @field_validator("header_name")
    @classmethod
    def _lower(cls, value: str) -> str:
        return value.lower()  # request headers arrive lower-cased


class RequireRoles(PluginParams):
    values: tuple[str, ...]


class RevisionGating(PluginParams):
    mode: Literal["sum", "max-role", "disabled"]
    require_roles: RequireRoles | None = Field(default=None, alias="requireRoles")
    revision_label_key: str = Field(default=DEFAULT_REVISION_LABEL, alias="revisionLabelKey")
    role_label_key: str = Field(default=DEFAULT_ROLE_LABEL, alias="roleLabelKey")

    @model_validator(mode="after")
    def _roles(self) -> RevisionGating:
        if self.mode == "disabled":
            return self
        if self.require_roles is None:
            raise ValueError(f"revisionGating.requireRoles is required when revisionGating.mode={self.mode}")
        roles = self.require_roles.values
        if not roles:
            raise ValueError("revisionGating.requireRoles.values must contain at least one role")
        for i, role in enumerate(roles):
            if not role:
                raise ValueError(f"revisionGating.requireRoles.values[{i}] must not be empty")
        duplicates = sorted({r for r in roles if roles.count(r) > 1})
        if duplicates:
            raise ValueError(f"revisionGating.requireRoles.values contains duplicate role {duplicates[0]!r}")
        return self

    @property
    def revision_key(self) -> str:
        return self.revision_label_key or DEFAULT_REVISION_LABEL

    @property
    def role_key(self) -> str:
        return self.role_label_key or DEFAULT_ROLE_LABEL


class Params(PluginParams):
    scope: Scope
    header_selectors: tuple[HeaderSelector, ...] = Field(default=(), alias="headerSelectors")
    revision_gating: RevisionGating = Field(alias="revisionGating")

    @model_validator(mode="after")
    def _unique(self) -> Params:
        for field, attr in (("name", "name"), ("headerName", "header_name")):
            seen: set[str] = set()
            for selector in self.header_selectors:
                value = getattr(selector, attr)
                if value in seen:
                    raise ValueError(f"headerSelectors: duplicate {field} {value!r}")
                seen.add(value)
        return self


@dataclass(frozen=True, slots=True)
class Distribution:
    """Ready pods per revision and role, and each revision's traffic share (0: not every role is covered)."""

    role_counts: Mapping[str, Mapping[str, int]]
    shares: Mapping[str, float]


def distribution(role_counts: Mapping[str, Mapping[str, int]], required: Sequence[str], mode: str) -> Distribution:
    """The revisions' shares under `mode` (`sum` or `max-role`)."""
    covered = {rev: roles for rev, roles in role_counts.items() if all(roles.get(r, 0) > 0 for r in required)}
    if mode == "max-role":
        dominant, best = "", -1
        for role in required:  # the order given breaks ties
            total = sum(roles.get(role, 0) for roles in covered.values())
            if total > best:
                dominant, best = role, total
        weights = {rev: roles.get(dominant, 0) for rev, roles in covered.items()}
    else:
        weights = {rev: sum(roles.get(r, 0) for r in required) for rev, roles in covered.items()}
    total = sum(weights.values())
    shares = {rev: (weights.get(rev, 0) / total if total > 0 else 0.0) for rev in role_counts}
    return Distribution(role_counts, shares)


def pick_weighted(shares: Mapping[str, float], draw: float) -> str:
    """The revision whose cumulative share (revisions in name order) first exceeds `draw` x the total."""
    revisions = sorted(shares)
    total = sum(shares.values())
    if total <= 0:
        return ""
    if len(revisions) == 1:
        return revisions[0]
    x, cumulative = draw * total, 0.0
    for revision in revisions:
        cumulative += shares[revision]
        if x < cumulative:
            return revision
    return revisions[-1]


class DisaggregatedsetRolloutScreener:
    def __init__(self, name: str, params: Params, handle: Handle, rng: random.Random | None = None) -> None:
        self._typed_name = TypedName(TYPE, name)
        self._params = params
        self._scope = LabelSelector.parse(params.scope.label_selector)
        gating = params.revision_gating
        self._gating = gating.mode != "disabled"
        self._mode = gating.mode
        self._revision_key = gating.revision_key
        self._role_key = gating.role_key
        self._required = gating.require_roles.values if gating.require_roles is not None else ()
        self._strict = tuple(s for s in params.header_selectors if s.mode == "strict")
        self._handle = handle
        self._recorder: Recorder = handle.recorder
        self._rng = rng or random.Random()
        self._census: tuple[tuple[str, str], ...] | None = None
        self._distribution = Distribution({}, {})

    @property
    def typed_name(self) -> TypedName:
        return self._typed_name

    # --- the census of Ready pods ------------------------------------------------------------------------
    def current_distribution(self) -> Distribution:
        """Counts the pool's endpoints in scope by revision and role; recomputed when they change."""
        census = []
        for e in self._handle.endpoints():
            labels = e.metadata.labels
            revision, role = labels.get(self._revision_key, ""), labels.get(self._role_key, "")
            if revision and role and self._scope.matches(labels):
                census.append((revision, role))
        key = tuple(sorted(census))
        if key != self._census:
            counts: dict[str, dict[str, int]] = {}
            for revision, role in key:
                per_role = counts.setdefault(revision, {})
                per_role[role] = per_role.get(role, 0) + 1
            self._census = key
            self._distribution = distribution(counts, self._required, self._mode)
            self._recorder.rollout_revision_shares(self._typed_name, self._mode, self._distribution.shares)
        return self._distribution

    # --- Screener ----------------------------------------------------------------------------------------
    def screen(self, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> Sequence[Endpoint]:
        current = list(endpoints)
        if self._gating:
            shares = self.current_distribution().shares
            key = self._revision_key
            seen = {e.metadata.labels.get(key, "") for e in current} - {""}
            allowed = {rev: shares[rev] for rev in seen if shares.get(rev, 0.0) > 0}
            chosen = "" if self._has_strict_header(request) else pick_weighted(allowed, self._rng.random())
            current = [
                e
                for e in current
                if (rev := e.metadata.labels.get(key, "")) in allowed and (not chosen or rev == chosen)
            ]
            if not current:
                return current
        for selector in self._strict:
            requested = request.headers.get(selector.header_name, "")
            if not requested:
                continue
            current = [e for e in current if e.metadata.labels.get(selector.label_key) == requested]
            if not current:
                self._recorder.rollout_strict_no_match(self._typed_name, selector.name)
                return current
        return current

    def _has_strict_header(self, request: InferenceRequest) -> bool:
        return any(request.headers.get(s.header_name) for s in self._strict)

    # --- ResponseReceived: stamp the serving endpoint's labels -------------------------------------------
    def response_received(
        self, cycle: CycleState, request: InferenceRequest, response: ResponseInfo, endpoint: Endpoint | None
    ) -> None:
        if endpoint is None or not self._params.header_selectors:
            return
        headers = cycle.read(RESPONSE_HEADERS_KEY)
        for selector in self._params.header_selectors:
            value = endpoint.metadata.labels.get(selector.label_key)
            if value:
                if headers is None:
                    headers = {}
                    cycle.write(RESPONSE_HEADERS_KEY, headers)
                headers[selector.header_name] = value


def factory(name: str, params: Params, handle: Handle) -> DisaggregatedsetRolloutScreener:
    return DisaggregatedsetRolloutScreener(name, params, handle, handle.rng(name))
