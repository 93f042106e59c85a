"""Static InferenceObjectives and InferenceModelRewrites without Kubernetes: `--objectives-file`.

The file is reloaded when it changes; a broken edit is logged and the last good content is kept.
`ObjectivesStore` implements the director's `Objectives` protocol (`priority`, `rewrite`).

File shape (our own; the fields mirror the two CRDs' `spec`, with `name` for `metadata.name` and no
`poolRef`, since the file belongs to one EPP):

    objectives:                      # InferenceObjective; selected by the x-gateway-inference-objective header
    - name: critical-chat
      priority: 10                   # optional integer, may be negative (sheddable); unset means 0
    - name: batch
      priority: -1
    modelRewrites:                   # InferenceModelRewrite
    - name: canary                   # reported as the rewrite name in metrics
      rules:
      - matches:                     # OR'ed; empty or absent = matches every model
        - model: {type: Exact, value: food-review}    # type defaults to Exact (the only type)
        targets:                     # at least one
        - {modelRewrite: food-review-v1, weight: 90}
        - {modelRewrite: food-review-v2, weight: 10}

Weights are integers in 1..1000000 and, as in the CRD, either every target of a rule has one or none
has; a rule without weights splits uniformly. Names must be unique within each list.

Rule precedence (the reference's model-rewrite store): a rule that names the model exactly wins over a
generic rule (empty `matches`); among candidates of the same kind the oldest object wins, which in a
file is the object listed first; within one object the first rule in list order wins.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from llm_epp.datalayer.filewatch import WatchedFile

log = logging.getLogger(__name__)

MAX_WEIGHT = 1_000_000


class ObjectivesSourceError(ValueError):
    """A bad objectives file; the message names the file and the YAML path of each problem."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, strict=True)


class _ModelMatch(_Strict):
    type: Literal["Exact"] = "Exact"
    value: str = Field(min_length=1)


class _Match(_Strict):
    model: _ModelMatch


class _Target(_Strict):
    model_rewrite: str = Field(min_length=1, alias="modelRewrite")
    weight: int | None = Field(default=None, ge=1, le=MAX_WEIGHT)


class _Rule(_Strict):
    matches: list[_Match] = Field(default_factory=list)
    targets: list[_Target] = Field(min_length=1)

    @model_validator(mode="after")
    def _weights_all_or_none(self) -> _Rule:
        weighted = [t.weight is not None for t in self.targets]
        if any(weighted) and not all(weighted):
            raise ValueError("give every target a weight, or none (an even split)")
        return self


class _ModelRewrite(_Strict):
    name: str = Field(min_length=1)
    rules: list[_Rule] = Field(min_length=1)


class _Objective(_Strict):
    name: str = Field(min_length=1)
    priority: int | None = None


class _ObjectivesFile(_Strict):
    objectives: list[_Objective] = Field(default_factory=list)
    model_rewrites: list[_ModelRewrite] = Field(default_factory=list, alias="modelRewrites")


@dataclass(frozen=True, slots=True)
class RewriteRule:
    """One rule: the InferenceModelRewrite it belongs to and its (target model, weight) pairs."""

    rewrite_name: str
    targets: tuple[tuple[str, int], ...]

    @property
    def total_weight(self) -> int:
        return sum(w for _, w in self.targets)


@dataclass(frozen=True, slots=True)
class ObjectivesConfig:
    """The parsed file: priority per objective name, rewrite rules indexed for lookup."""

    priorities: dict[str, int] = field(default_factory=dict)
    exact_rules: dict[str, RewriteRule] = field(default_factory=dict)  # model -> the winning exact rule
    generic_rule: RewriteRule | None = None  # the winning rule with no matches


def _loc(parts: Sequence[int | str]) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts).lstrip(".")


def parse_objectives_file(text: str, source: str) -> ObjectivesConfig:
    try:
        raw: Any = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ObjectivesSourceError(f"{source}: not valid YAML: {e}") from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ObjectivesSourceError(f"{source}: expected a mapping with `objectives` and/or `modelRewrites`")
    try:
        doc = _ObjectivesFile.model_validate(raw)
    except ValidationError as err:
        problems = []
        for detail in err.errors():
            loc = _loc(detail["loc"]) or "(top level)"
            if detail["type"] == "extra_forbidden":
                msg = "unknown field"
            elif detail["type"] == "missing":
                msg = "required field is missing"
            else:
                msg = detail["msg"].removeprefix("Value error, ")
            problems.append(f"{loc}: {msg}")
        raise ObjectivesSourceError(f"{source}: " + "; ".join(problems)) from None

    priorities: dict[str, int] = {}
    for i, objective in enumerate(doc.objectives):
        if objective.name in priorities:
            raise ObjectivesSourceError(f"{source}: objectives[{i}].name {objective.name!r} is used twice")
        priorities[objective.name] = objective.priority or 0

    exact: dict[str, RewriteRule] = {}
    generic: RewriteRule | None = None
    names: set[str] = set()
    for i, rewrite in enumerate(doc.model_rewrites):
        if rewrite.name in names:
            raise ObjectivesSourceError(f"{source}: modelRewrites[{i}].name {rewrite.name!r} is used twice")
        names.add(rewrite.name)
        for r in rewrite.rules:
            rule = RewriteRule(rewrite.name, tuple((t.model_rewrite, t.weight or 0) for t in r.targets))
            if not r.matches:
                if generic is None:  # file order = age order: the first one listed is the oldest
                    generic = rule
                continue
            for m in r.matches:
                exact.setdefault(m.model.value, rule)
    return ObjectivesConfig(priorities, exact, generic)


class ObjectivesStore:
    """The director's `Objectives`: priority by objective name, weighted model rewrites. Reads are plain
    dictionary lookups on an immutable snapshot that `replace` swaps whole."""

    def __init__(self, config: ObjectivesConfig | None = None, rng: random.Random | None = None) -> None:
        self._config = config or ObjectivesConfig()
        self._rng = rng or random.Random()

    @property
    def config(self) -> ObjectivesConfig:
        return self._config

    def replace(self, config: ObjectivesConfig) -> None:
        self._config = config

    def priority(self, objective: str) -> int | None:
        return self._config.priorities.get(objective)

    def rewrite(self, model: str) -> tuple[str, str] | None:
        config = self._config
        rule = config.exact_rules.get(model) or config.generic_rule
        if rule is None:
            return None
        return self._choose(rule.targets), rule.rewrite_name

    def _choose(self, targets: tuple[tuple[str, int], ...]) -> str:
        if len(targets) == 1:
            return targets[0][0]
        total = sum(w for _, w in targets)
        if total <= 0:
            return targets[self._rng.randrange(len(targets))][0]
        point = self._rng.randrange(total)
        for model, weight in targets:
            point -= weight
            if point < 0:
                return model
        return targets[-1][0]  # unreachable: the weights sum to total


class ObjectivesFileWatcher(WatchedFile[ObjectivesConfig]):
    """Loads an objectives file into a store and reloads it when it changes."""

    kind = "objectives_file"
    error = ObjectivesSourceError

    def __init__(self, path: str | Path, store: ObjectivesStore, interval: float = 1.0) -> None:
        super().__init__(path, interval)
        self.store = store

    def parse(self, text: str, source: str) -> ObjectivesConfig:
        return parse_objectives_file(text, source)

    def apply(self, value: ObjectivesConfig, initial: bool) -> str:
        self.store.replace(value)
        return (
            f"objectives={len(value.priorities)} rewrite_models={len(value.exact_rules)} "
            f"generic_rewrite={value.generic_rule is not None}"
        )
