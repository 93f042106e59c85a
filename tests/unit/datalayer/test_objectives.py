"""Tests for the static objectives and model-rewrite store (`--objectives-file`): parsing with errors that
name the YAML path, rewrite precedence, weighted target choice, and reload keeping the last good content."""

from __future__ import annotations

import asyncio
import logging
import os
import random
from collections import Counter
from pathlib import Path

import pytest

from llm_epp.datalayer.objectives import (
    ObjectivesConfig,
    ObjectivesFileWatcher,
    ObjectivesSourceError,
    ObjectivesStore,
    parse_objectives_file,
)
from llm_epp.requestcontrol.director import Objectives

EXAMPLE = """
objectives:
- name: critical-chat
  priority: 10
- name: batch
  priority: -1
- name: default-priority
modelRewrites:
- name: canary
  rules:
  - matches: [{model: {type: Exact, value: food-review}}]
    targets: [{modelRewrite: food-review-v1, weight: 90}, {modelRewrite: food-review-v2, weight: 10}]
"""


def _store(text: str, seed: int = 0) -> ObjectivesStore:
    return ObjectivesStore(parse_objectives_file(text, "objectives.yaml"), rng=random.Random(seed))


def test_the_store_implements_the_director_protocol() -> None:
    store: Objectives = _store(EXAMPLE)
    assert store.priority("critical-chat") == 10


@pytest.mark.parametrize(
    ("objective", "expected"),
    [("critical-chat", 10), ("batch", -1), ("default-priority", 0), ("unknown", None), ("", None)],
    ids=["positive", "negative-sheddable", "unset-means-zero", "unknown", "empty"],
)
def test_priority(objective: str, expected: int | None) -> None:
    assert _store(EXAMPLE).priority(objective) == expected


@pytest.mark.parametrize(
    "text", ["", "{}", "objectives: []\nmodelRewrites: []"], ids=["empty-file", "empty-map", "lists"]
)
def test_an_empty_file_has_no_objectives_and_no_rewrites(text: str) -> None:
    store = _store(text)
    assert store.priority("x") is None
    assert store.rewrite("m") is None


def test_an_empty_store_rewrites_nothing() -> None:
    assert ObjectivesStore().rewrite("m") is None
    assert ObjectivesStore().priority("x") is None


# --- precedence -----------------------------------------------------------------------------------------

PRECEDENCE = """
modelRewrites:
- name: oldest-generic
  rules:
  - targets: [{modelRewrite: generic-1}]
- name: first-exact
  rules:
  - matches: [{model: {value: other}}]
    targets: [{modelRewrite: other-1}]
  - matches: [{model: {value: m}}, {model: {value: alias}}]
    targets: [{modelRewrite: m-first-object-rule-2}]
  - matches: [{model: {value: m}}]
    targets: [{modelRewrite: m-first-object-rule-3}]
  - targets: [{modelRewrite: generic-2}]
- name: second-exact
  rules:
  - matches: [{model: {value: m}}, {model: {value: late}}]
    targets: [{modelRewrite: m-second-object}]
"""


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ("m", ("m-first-object-rule-2", "first-exact")),
        ("alias", ("m-first-object-rule-2", "first-exact")),
        ("other", ("other-1", "first-exact")),
        ("late", ("m-second-object", "second-exact")),
        ("unmatched", ("generic-1", "oldest-generic")),
    ],
    ids=[
        "exact-oldest-object-first-rule",
        "matches-are-ored",
        "exact-in-an-object-listed-after-a-generic",
        "exact-only-in-a-newer-object",
        "generic-oldest-object",
    ],
)
def test_rewrite_precedence(model: str, expected: tuple[str, str]) -> None:
    assert _store(PRECEDENCE).rewrite(model) == expected


def test_exact_match_beats_an_older_generic_rule() -> None:
    text = """
modelRewrites:
- name: old-catch-all
  rules: [{targets: [{modelRewrite: everything}]}]
- name: new-exact
  rules: [{matches: [{model: {type: Exact, value: m}}], targets: [{modelRewrite: m2}]}]
"""
    store = _store(text)
    assert store.rewrite("m") == ("m2", "new-exact")
    assert store.rewrite("n") == ("everything", "old-catch-all")


def test_without_a_generic_rule_unmatched_models_are_not_rewritten() -> None:
    assert _store(EXAMPLE).rewrite("something-else") is None


def test_exact_matching_is_case_sensitive() -> None:
    assert _store(EXAMPLE).rewrite("Food-Review") is None


# --- weighted choice ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("targets", "share"),
    [
        ("[{modelRewrite: v1, weight: 90}, {modelRewrite: v2, weight: 10}]", {"v1": 0.9, "v2": 0.1}),
        ("[{modelRewrite: v1, weight: 1}, {modelRewrite: v2, weight: 1}]", {"v1": 0.5, "v2": 0.5}),
        ("[{modelRewrite: v1, weight: 3}, {modelRewrite: v2, weight: 1}]", {"v1": 0.75, "v2": 0.25}),
        (
            "[{modelRewrite: v1}, {modelRewrite: v2}, {modelRewrite: v3}, {modelRewrite: v4}]",
            dict.fromkeys(("v1", "v2", "v3", "v4"), 0.25),
        ),
        ("[{modelRewrite: only, weight: 7}]", {"only": 1.0}),
        ("[{modelRewrite: only}]", {"only": 1.0}),
    ],
    ids=["ninety-ten", "even-weights", "three-to-one", "no-weights-uniform", "single-weighted", "single"],
)
def test_weighted_target_choice(targets: str, share: dict[str, float]) -> None:
    text = f"modelRewrites: [{{name: split, rules: [{{matches: [{{model: {{value: m}}}}], targets: {targets}}}]}}]"
    store = _store(text, seed=2024)
    n = 20000
    counts: Counter[str] = Counter()
    for _ in range(n):
        result = store.rewrite("m")
        assert result is not None and result[1] == "split"
        counts[result[0]] += 1
    assert set(counts) == set(share)
    for model, expected in share.items():
        assert counts[model] / n == pytest.approx(expected, abs=0.015)


def test_a_seeded_store_is_reproducible() -> None:
    a, b = _store(EXAMPLE, seed=99), _store(EXAMPLE, seed=99)
    assert [a.rewrite("food-review") for _ in range(50)] == [b.rewrite("food-review") for _ in range(50)]


def test_weights_follow_the_cumulative_order() -> None:
    """Draws below the first weight pick the first target, the rest the next ones (the reference's walk)."""

    class Fixed(random.Random):
        def __init__(self, value: int) -> None:
            super().__init__(0)
            self.value = value

        def randrange(self, *args: object, **kwargs: object) -> int:  # type: ignore[override]
            return self.value

    config = parse_objectives_file(EXAMPLE, "objectives.yaml")
    assert ObjectivesStore(config, rng=Fixed(0)).rewrite("food-review") == ("food-review-v1", "canary")
    assert ObjectivesStore(config, rng=Fixed(89)).rewrite("food-review") == ("food-review-v1", "canary")
    assert ObjectivesStore(config, rng=Fixed(90)).rewrite("food-review") == ("food-review-v2", "canary")
    assert ObjectivesStore(config, rng=Fixed(99)).rewrite("food-review") == ("food-review-v2", "canary")


# --- errors ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("objectives: [", "not valid YAML"),
        ("[1, 2]", "expected a mapping"),
        ("objectivez: []", "objectivez: unknown field"),
        ("objectives: [{name: a, priority: high}]", "objectives[0].priority"),
        ("objectives: [{name: a, priority: '3'}]", "objectives[0].priority"),
        ("objectives: [{name: a, priority: 1.5}]", "objectives[0].priority"),
        ("objectives: [{priority: 1}]", "objectives[0].name: required field is missing"),
        ("objectives: [{name: '', priority: 1}]", "objectives[0].name"),
        ("objectives: [{name: a, prio: 1}]", "objectives[0].prio: unknown field"),
        ("objectives: [{name: a}, {name: a}]", "objectives[1].name 'a' is used twice"),
        ("modelRewrites: [{name: r}]", "modelRewrites[0].rules: required field is missing"),
        ("modelRewrites: [{name: r, rules: []}]", "modelRewrites[0].rules"),
        ("modelRewrites: [{name: r, rules: [{targets: []}]}]", "modelRewrites[0].rules[0].targets"),
        ("modelRewrites: [{name: r, rules: [{matches: []}]}]", "modelRewrites[0].rules[0].targets: required"),
        (
            "modelRewrites: [{name: r, rules: [{matches: [{model: {type: Prefix, value: m}}],"
            " targets: [{modelRewrite: x}]}]}]",
            "modelRewrites[0].rules[0].matches[0].model.type",
        ),
        (
            "modelRewrites: [{name: r, rules: [{matches: [{model: {value: ''}}], targets: [{modelRewrite: x}]}]}]",
            "modelRewrites[0].rules[0].matches[0].model.value",
        ),
        (
            "modelRewrites: [{name: r, rules: [{matches: [{}], targets: [{modelRewrite: x}]}]}]",
            "modelRewrites[0].rules[0].matches[0].model: required field is missing",
        ),
        (
            "modelRewrites: [{name: r, rules: [{targets: [{modelRewrite: x, weight: 0}]}]}]",
            "modelRewrites[0].rules[0].targets[0].weight",
        ),
        (
            "modelRewrites: [{name: r, rules: [{targets: [{modelRewrite: x, weight: 1000001}]}]}]",
            "modelRewrites[0].rules[0].targets[0].weight",
        ),
        (
            "modelRewrites: [{name: r, rules: [{targets: [{modelRewrite: x, weight: 5}, {modelRewrite: y}]}]}]",
            "modelRewrites[0].rules[0]: give every target a weight, or none",
        ),
        (
            "modelRewrites: [{name: r, rules: [{targets: [{model: x}]}]}]",
            "modelRewrites[0].rules[0].targets[0].model: unknown field",
        ),
        (
            "modelRewrites: [{name: r, rules: [{targets: [{modelRewrite: x}]}]},"
            " {name: r, rules: [{targets: [{modelRewrite: y}]}]}]",
            "modelRewrites[1].name 'r' is used twice",
        ),
        ("modelRewrites: [{name: r, poolRef: {name: p}, rules: [{targets: [{modelRewrite: x}]}]}]", "poolRef"),
    ],
    ids=[
        "bad-yaml",
        "not-a-mapping",
        "unknown-top-level",
        "priority-not-a-number",
        "priority-string",
        "priority-float",
        "objective-without-name",
        "objective-empty-name",
        "objective-unknown-field",
        "duplicate-objective",
        "rewrite-without-rules",
        "rewrite-empty-rules",
        "rule-empty-targets",
        "rule-without-targets",
        "unsupported-match-type",
        "empty-match-value",
        "match-without-model",
        "weight-zero",
        "weight-too-large",
        "weights-mixed",
        "target-unknown-field",
        "duplicate-rewrite",
        "pool-ref-not-in-file-shape",
    ],
)
def test_errors_name_the_file_and_yaml_path(text: str, fragment: str) -> None:
    with pytest.raises(ObjectivesSourceError) as info:
        parse_objectives_file(text, "objectives.yaml")
    message = str(info.value)
    assert message.startswith("objectives.yaml: ")
    assert fragment in message


def test_all_problems_are_reported_at_once() -> None:
    text = "objectives: [{name: a, priority: x}, {priority: 2}]"
    with pytest.raises(ObjectivesSourceError) as info:
        parse_objectives_file(text, "o.yaml")
    assert "objectives[0].priority" in str(info.value) and "objectives[1].name" in str(info.value)


# --- file watching --------------------------------------------------------------------------------------


def _write(path: Path, text: str, bump: int) -> None:
    path.write_text(text)
    st = path.stat()
    os.utime(path, (st.st_atime, st.st_mtime + bump))


def test_watcher_reloads_on_change_and_keeps_the_last_good_content(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    f = tmp_path / "objectives.yaml"
    _write(f, "objectives: [{name: chat, priority: 1}]", 0)
    store = ObjectivesStore(rng=random.Random(0))
    watcher = ObjectivesFileWatcher(f, store)
    watcher.load()
    assert store.priority("chat") == 1
    assert not watcher.poll_once()

    _write(f, EXAMPLE, 10)
    assert watcher.poll_once()
    assert store.priority("chat") is None
    assert store.priority("batch") == -1
    assert store.rewrite("food-review") is not None

    with caplog.at_level(logging.ERROR):
        _write(f, "objectives: [{name: batch, priority: low}]", 20)
        assert not watcher.poll_once()
    assert "objectives_file_invalid" in caplog.text and "objectives[0].priority" in caplog.text
    assert store.priority("batch") == -1

    f.unlink()
    assert not watcher.poll_once()
    assert store.priority("batch") == -1

    _write(f, "objectives: [{name: chat, priority: 5}]", 30)
    assert watcher.poll_once()
    assert store.priority("chat") == 5
    assert store.rewrite("food-review") is None


def test_initial_load_errors_are_fatal(tmp_path: Path) -> None:
    f = tmp_path / "objectives.yaml"
    f.write_text("objectives: [{name: a, priority: nope}]")
    with pytest.raises(ObjectivesSourceError, match=r"objectives\[0\]\.priority"):
        ObjectivesFileWatcher(f, ObjectivesStore()).load()
    with pytest.raises(ObjectivesSourceError, match="cannot read"):
        ObjectivesFileWatcher(tmp_path / "missing.yaml", ObjectivesStore()).load()


async def test_run_polls_until_cancelled(tmp_path: Path) -> None:
    f = tmp_path / "objectives.yaml"
    _write(f, "objectives: [{name: a, priority: 1}]", 0)
    store = ObjectivesStore()
    watcher = ObjectivesFileWatcher(f, store, interval=0.01)
    watcher.load()
    task = asyncio.create_task(watcher.run())
    _write(f, "objectives: [{name: a, priority: 2}]", 10)
    for _ in range(200):
        if store.priority("a") == 2:
            break
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert store.priority("a") == 2


def test_replace_swaps_the_whole_snapshot() -> None:
    store = _store(EXAMPLE)
    store.replace(ObjectivesConfig())
    assert store.priority("critical-chat") is None
    assert store.rewrite("food-review") is None
