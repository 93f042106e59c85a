"""ObjectivesWatcher driven through the real `kubernetes` client against the in-test API server, and the pure
CRD-to-config translation."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from llm_epp.datalayer.objectives import ObjectivesConfig, ObjectivesStore, RewriteRule
from llm_epp.k8s.objectives import (
    OBJECTIVE_GROUP,
    OBJECTIVES_PLURAL,
    REWRITES_PLURAL,
    ObjectivesWatcher,
    build_config,
    pool_ref_matches,
)
from tests.support.fake_apiserver import FakeApiServer

NS = "default"
POOL_GROUP = "inference.networking.k8s.io"
DEADLINE = 10.0


def pool_ref(name: str = "pool", group: str | None = None) -> dict[str, Any]:
    ref: dict[str, Any] = {"name": name, "kind": "InferencePool"}
    if group is not None:
        ref["group"] = group
    return ref


def objective(name: str, priority: int | None = None, ref: dict[str, Any] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"poolRef": ref or pool_ref()}
    if priority is not None:
        spec["priority"] = priority
    return {"metadata": {"name": name, "namespace": NS}, "spec": spec}


def rewrite(
    name: str, rules: list[dict[str, Any]], ref: dict[str, Any] | None = None, created: str | None = None
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": NS}
    if created is not None:
        meta["creationTimestamp"] = created
    return {"metadata": meta, "spec": {"poolRef": ref or pool_ref(), "rules": rules}}


def rule(models: list[str], *targets: tuple[str, int | None]) -> dict[str, Any]:
    return {
        "matches": [{"model": {"type": "Exact", "value": m}} for m in models],
        "targets": [{"modelRewrite": t} if w is None else {"modelRewrite": t, "weight": w} for t, w in targets],
    }


async def wait_for(cond: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


class Env:
    def __init__(self, fake: FakeApiServer, store: ObjectivesStore, watcher: ObjectivesWatcher) -> None:
        self.fake, self.store, self.watcher = fake, store, watcher
        self.changes: list[ObjectivesConfig] = []

    @property
    def config(self) -> ObjectivesConfig:
        return self.store.config


@pytest.fixture
def fake() -> Any:
    with FakeApiServer() as server:
        yield server


@pytest.fixture
async def env(fake: FakeApiServer) -> AsyncIterator[Env]:
    api = fake.api_client()
    store = ObjectivesStore()
    changes: list[ObjectivesConfig] = []
    watcher = ObjectivesWatcher(
        api,
        NS,
        "pool",
        POOL_GROUP,
        store,
        asyncio.get_running_loop(),
        on_change=changes.append,
        watch_timeout=5,
        backoff_initial=0.05,
        backoff_max=0.2,
    )
    e = Env(fake, store, watcher)
    e.changes = changes
    try:
        yield e
    finally:
        await asyncio.to_thread(watcher.stop)
        await wait_for(lambda: fake.open_watches() == 0, "watches closed after stop()")
        api.close()


async def test_objectives_of_this_pool_apply_others_ignored(env: Env) -> None:
    env.fake.create(OBJECTIVES_PLURAL, objective("critical", 10))
    env.fake.create(OBJECTIVES_PLURAL, objective("unset"))
    env.fake.create(OBJECTIVES_PLURAL, objective("explicit-group", -1, pool_ref(group=POOL_GROUP)))
    env.fake.create(OBJECTIVES_PLURAL, objective("other-pool", 5, pool_ref("another")))
    env.fake.create(OBJECTIVES_PLURAL, objective("other-group", 5, pool_ref(group="example.com")))
    env.fake.create(REWRITES_PLURAL, rewrite("mine", [rule(["m"], ("m-v1", None))]))
    env.fake.create(REWRITES_PLURAL, rewrite("theirs", [rule(["x"], ("x-v1", None))], pool_ref("another")))
    env.watcher.start()
    assert env.watcher.kinds == (OBJECTIVES_PLURAL, REWRITES_PLURAL)
    await wait_for(lambda: bool(env.changes), "first config")
    assert env.config.priorities == {"critical": 10, "unset": 0, "explicit-group": -1}
    assert env.store.priority("other-pool") is None
    assert env.store.rewrite("m") == ("m-v1", "mine")
    assert env.store.rewrite("x") is None

    # a new object for another pool arrives on the watch: still ignored; one moved to this pool counts
    env.fake.create(OBJECTIVES_PLURAL, objective("late-other", 1, pool_ref("another")))
    env.fake.update(OBJECTIVES_PLURAL, objective("other-pool", 5))
    await wait_for(lambda: env.store.priority("other-pool") == 5, "object moved to this pool")
    assert env.store.priority("late-other") is None
    env.fake.update(OBJECTIVES_PLURAL, objective("critical", 10, pool_ref("another")))
    await wait_for(lambda: env.store.priority("critical") is None, "object moved away from this pool")


async def test_update_and_delete(env: Env) -> None:
    env.fake.create(OBJECTIVES_PLURAL, objective("chat", 1))
    env.fake.create(REWRITES_PLURAL, rewrite("split", [rule(["m"], ("a", 50), ("b", 50))]))
    env.watcher.start()
    await wait_for(lambda: env.store.priority("chat") == 1, "initial")
    rules = env.config.exact_rules
    assert rules["m"] == RewriteRule("split", (("a", 50), ("b", 50)))

    env.fake.update(OBJECTIVES_PLURAL, objective("chat", 7))
    env.fake.update(REWRITES_PLURAL, rewrite("split", [rule([], ("c", None))]))
    await wait_for(lambda: env.store.priority("chat") == 7, "priority updated")
    await wait_for(lambda: env.config.generic_rule is not None, "rewrite updated")
    assert env.config.exact_rules == {}
    assert env.store.rewrite("anything") == ("c", "split")

    env.fake.delete(OBJECTIVES_PLURAL, NS, "chat")
    env.fake.delete(REWRITES_PLURAL, NS, "split")
    await wait_for(lambda: env.config == ObjectivesConfig(), "both deleted")


async def test_rewrite_precedence_by_age(env: Env) -> None:
    env.fake.create(REWRITES_PLURAL, rewrite("older", [rule([], ("old-generic", None)), rule(["m"], ("old-m", None))]))
    await asyncio.sleep(1.05)  # creationTimestamp has one-second resolution
    env.fake.create(
        REWRITES_PLURAL,
        rewrite("newer", [rule(["m"], ("new-m", None)), rule(["n"], ("new-n", None)), rule([], ("new-generic", None))]),
    )
    env.watcher.start()
    await wait_for(lambda: len(env.config.exact_rules) == 2, "both rewrites")
    assert env.store.rewrite("m") == ("old-m", "older")  # the oldest object wins among exact matches
    assert env.store.rewrite("n") == ("new-n", "newer")  # exact (newer) beats generic (older)
    assert env.store.rewrite("zzz") == ("old-generic", "older")
    env.fake.delete(REWRITES_PLURAL, NS, "older")
    await wait_for(lambda: env.store.rewrite("m") == ("new-m", "newer"), "older removed")
    assert env.store.rewrite("zzz") == ("new-generic", "newer")


async def test_crds_absent_starts_nothing(env: Env, caplog: pytest.LogCaptureFixture) -> None:
    env.fake.hidden_groups.add(OBJECTIVE_GROUP)
    caplog.set_level("INFO", logger="llm_epp.k8s.objectives")
    env.watcher.start()
    assert env.watcher.kinds == ()
    assert env.watcher._threads == []
    assert env.fake.count(OBJECTIVES_PLURAL, "list") == 0
    assert [r.levelname for r in caplog.records] == ["INFO"]
    assert "crds_absent" in caplog.records[0].getMessage()
    await asyncio.sleep(0.1)
    assert env.changes == []


async def test_dropped_watch_no_loss(env: Env) -> None:
    env.fake.create(OBJECTIVES_PLURAL, objective("a", 1))
    env.watcher.start()
    await wait_for(lambda: env.store.priority("a") == 1, "initial")
    await wait_for(lambda: env.fake.open_watches() == 2, "watches open")
    lists = env.fake.count(OBJECTIVES_PLURAL, "list")
    watches = env.fake.count(OBJECTIVES_PLURAL, "watch")

    env.fake.drop_watches()
    env.fake.create(OBJECTIVES_PLURAL, objective("b", 2))
    env.fake.update(OBJECTIVES_PLURAL, objective("a", 3))
    env.fake.create(REWRITES_PLURAL, rewrite("r", [rule(["m"], ("m2", None))]))
    await wait_for(
        lambda: env.config.priorities == {"a": 3, "b": 2} and env.store.rewrite("m") == ("m2", "r"),
        "changes made while disconnected",
    )
    await wait_for(lambda: env.fake.count(OBJECTIVES_PLURAL, "watch") > watches, "reconnected")
    assert env.fake.count(OBJECTIVES_PLURAL, "list") == lists, "resumed, no relist"


@pytest.mark.parametrize("gone_as_http", [False, True], ids=["error-event", "http-410"])
async def test_gone_relists(env: Env, gone_as_http: bool) -> None:
    env.fake.gone_as_http = gone_as_http
    env.fake.create(OBJECTIVES_PLURAL, objective("a", 1))
    env.watcher.start()
    await wait_for(lambda: env.store.priority("a") == 1, "initial")
    await wait_for(lambda: env.fake.open_watches() == 2, "watches open")
    lists = env.fake.count(OBJECTIVES_PLURAL, "list")
    env.fake.create("pods", {"metadata": {"name": "x", "namespace": "other"}})  # moves the version on
    env.fake.compact()
    env.fake.drop_watches()
    env.fake.delete(OBJECTIVES_PLURAL, NS, "a")
    env.fake.create(OBJECTIVES_PLURAL, objective("b", 2))
    await wait_for(lambda: env.fake.count(OBJECTIVES_PLURAL, "list") > lists, "relist after 410")
    await wait_for(lambda: env.config.priorities == {"b": 2}, "state after relist")


def test_build_config_precedence_and_tolerance() -> None:
    newer = rewrite("newer", [rule(["m"], ("new", None))], created="2026-01-02T00:00:00Z")
    older = rewrite(
        "older",
        [
            {"matches": [{"model": {"type": "Regex", "value": "m"}}], "targets": [{"modelRewrite": "bad"}]},
            {"matches": [], "targets": []},  # no targets: skipped
            rule(["m", "k"], ("old", 3), ("old2", 1)),
            rule(["m"], ("shadowed", None)),
        ],
        created="2026-01-01T00:00:00Z",
    )
    undated = rewrite("undated", [rule([], ("g", None))])
    config = build_config([objective("o", True)], [newer, undated, older])
    assert config.priorities == {"o": 0}  # a bool is not a priority
    assert config.exact_rules == {
        "m": RewriteRule("older", (("old", 3), ("old2", 1))),
        "k": RewriteRule("older", (("old", 3), ("old2", 1))),
    }
    assert config.generic_rule == RewriteRule("undated", (("g", 0),))


def test_pool_ref_matching() -> None:
    assert pool_ref_matches(objective("a"), "pool", POOL_GROUP)
    assert not pool_ref_matches(objective("a"), "pool", "example.com")
    assert pool_ref_matches(objective("a", ref=pool_ref(group="example.com")), "pool", "example.com")
    assert not pool_ref_matches(objective("a", ref=pool_ref("other")), "pool", POOL_GROUP)
    assert not pool_ref_matches({"spec": {}}, "pool", POOL_GROUP)
