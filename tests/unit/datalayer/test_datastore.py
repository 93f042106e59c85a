from __future__ import annotations

from llm_epp.datalayer import Datastore
from llm_epp.framework import EndpointKey, EndpointMetadata, Metrics


def md(name: str, port: int = 8000) -> EndpointMetadata:
    return EndpointMetadata(EndpointKey("ns", name), "10.0.0.1", port)


def test_snapshot_is_cached_until_a_change() -> None:
    ds = Datastore()
    ds.replace_all([md("a"), md("b", 8001)])
    s1 = ds.snapshot()
    assert ds.snapshot() is s1
    ds.update_metrics(EndpointKey("ns", "a"), Metrics(waiting_queue_size=3))
    s2 = ds.snapshot()
    assert s2 is not s1
    assert {e.key.name: e.metrics.waiting_queue_size for e in s2} == {"a": 3, "b": 0}


def test_metrics_survive_replace_for_kept_endpoints_and_are_dropped_for_removed() -> None:
    ds = Datastore()
    ds.replace_all([md("a"), md("b", 8001)])
    ds.update_metrics(EndpointKey("ns", "a"), Metrics(waiting_queue_size=3))
    ds.update_metrics(EndpointKey("ns", "b"), Metrics(waiting_queue_size=4))
    ds.replace_all([md("a")])
    assert [(e.key.name, e.metrics.waiting_queue_size) for e in ds.snapshot()] == [("a", 3)]
    ds.replace_all([md("a"), md("b", 8001)])
    assert {e.key.name: e.metrics.waiting_queue_size for e in ds.snapshot()} == {"a": 3, "b": 0}


def test_metrics_for_unknown_endpoints_are_ignored_and_lookups_by_address() -> None:
    ds = Datastore()
    ds.update_metrics(EndpointKey("ns", "ghost"), Metrics(waiting_queue_size=1))
    assert ds.snapshot() == ()
    ds.upsert(md("a"))
    assert ds.by_hostport("10.0.0.1:8000") is not None
    ds.delete(EndpointKey("ns", "a"))
    assert ds.by_hostport("10.0.0.1:8000") is None
    assert ds.random_endpoint() is None


def test_listeners_hear_membership_changes_only() -> None:
    ds = Datastore()
    calls: list[int] = []
    ds.add_listener(lambda: calls.append(len(ds)))
    ds.replace_all([md("a")])
    ds.update_metrics(EndpointKey("ns", "a"), Metrics())
    ds.upsert(md("a"))  # unchanged: no event
    ds.upsert(md("b", 8001))
    ds.clear()
    assert calls == [1, 2, 0]


def test_unreachable_endpoints_leave_the_snapshot_unless_all_are() -> None:
    from llm_epp.framework import EndpointKey, EndpointMetadata

    ds = Datastore()
    a, b = (EndpointMetadata(EndpointKey("ns", n), "10.0.0.1", p) for n, p in (("a", 1), ("b", 2)))
    ds.replace_all([a, b])
    ds.set_reachable(a.key, False)
    assert [e.key for e in ds.snapshot()] == [b.key]
    assert ds.by_hostport("10.0.0.1:1") is None
    ds.set_reachable(b.key, False)
    assert {e.key for e in ds.snapshot()} == {a.key, b.key}  # none reachable: keep them all
    ds.set_reachable(a.key, True)
    assert [e.key for e in ds.snapshot()] == [a.key]
    ds.delete(b.key)
    ds.upsert(b)  # a returning endpoint starts reachable
    assert {e.key for e in ds.snapshot()} == {a.key, b.key}
    ds.set_reachable(EndpointKey("ns", "gone"), False)  # unknown keys are ignored
    assert len(ds.snapshot()) == 2
