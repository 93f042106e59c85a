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


def test_a_metric_update_replaces_only_its_endpoint_and_never_changes_a_snapshot_already_taken() -> None:
    ds = Datastore()
    ds.replace_all([md("a"), md("b", 8001), md("c", 8002)])
    before = ds.snapshot()
    ds.update_metrics(EndpointKey("ns", "b"), Metrics(waiting_queue_size=7))
    ds.update_metrics(EndpointKey("ns", "b"), Metrics(waiting_queue_size=8))  # the latest one wins
    after = ds.snapshot()
    assert [e.metrics.waiting_queue_size for e in before] == [0, 0, 0]  # what a running cycle holds
    assert [e.metrics.waiting_queue_size for e in after] == [0, 8, 0]
    assert after[0] is before[0] and after[2] is before[2]  # unchanged endpoints are shared, not rebuilt
    assert after[1].load is before[1].load  # the in-flight counter is the same object
    assert ds.snapshot() is after
    assert ds.by_hostport("10.0.0.1:8001") is after[1]


def test_membership_changes_after_metric_updates_rebuild_the_snapshot() -> None:
    ds = Datastore()
    ds.replace_all([md("a"), md("b", 8001)])
    ds.snapshot()
    ds.update_metrics(EndpointKey("ns", "a"), Metrics(waiting_queue_size=2))
    ds.delete(EndpointKey("ns", "b"))
    assert [(e.key.name, e.metrics.waiting_queue_size) for e in ds.snapshot()] == [("a", 2)]
    ds.update_metrics(EndpointKey("ns", "a"), Metrics(waiting_queue_size=5))
    ds.upsert(md("c", 8002))
    assert [(e.key.name, e.metrics.waiting_queue_size) for e in ds.snapshot()] == [("a", 5), ("c", 0)]


def test_a_removed_endpoint_keeps_its_in_flight_load_while_requests_hold_it() -> None:
    ds = Datastore()
    ds.replace_all([md("a"), md("b", 8001)])
    load = ds.snapshot()[0].load
    load.requests, load.tokens = 2, 300  # two requests scheduled on "a" are still running
    ds.delete(EndpointKey("ns", "a"))
    ds.upsert(md("a"))  # back (a readiness flap) while they run
    back = next(e for e in ds.snapshot() if e.key.name == "a")
    assert back.load is load and (load.requests, load.tokens) == (2, 300)
    load.requests, load.tokens = 0, 0  # both finished
    ds.delete(EndpointKey("ns", "a"))
    ds.upsert(md("b", 8002))  # any later membership change drops the idle counter of the gone endpoint
    ds.upsert(md("a"))
    fresh = next(e for e in ds.snapshot() if e.key.name == "a")
    assert fresh.load is not load and fresh.load.requests == 0


def test_removed_endpoints_without_requests_leave_no_counter_behind() -> None:
    ds = Datastore()
    for i in range(100):  # churn: every endpoint seen once, none holding requests
        ds.replace_all([md(f"pod-{i}", 8000 + i)])
        ds.snapshot()
    assert len(ds._load) == 1
