"""LeaseTable: grant, take, expiry by the sweeper, release on shutdown."""

from __future__ import annotations

import asyncio

import pytest

from llm_epp.pickapi.leases import LeaseTable
from llm_epp.requestcontrol.lifecycle import RequestRecord


class FakeClock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


class Finisher:
    def __init__(self) -> None:
        self.finished: list[tuple[str, bool]] = []
        self.called = asyncio.Event()

    def finish(self, record: RequestRecord, complete: bool) -> None:
        self.finished.append((record.request_id, complete))
        self.called.set()


def record(request_id: str) -> RequestRecord:
    return RequestRecord(request_id, 0.0)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def finisher() -> Finisher:
    return Finisher()


@pytest.fixture
def table(finisher: Finisher, clock: FakeClock) -> LeaseTable:
    return LeaseTable(finisher, default_ttl_s=300, max_ttl_s=600, sweep_interval_s=0.01, clock=clock)


@pytest.mark.parametrize(("requested", "granted"), [(0, 300), (5, 5), (600, 600), (601, 600), (10**9, 600)], ids=str)
def test_ttl(table: LeaseTable, requested: int, granted: float) -> None:
    assert table.ttl(requested) == granted


@pytest.mark.parametrize(
    ("default", "maximum", "interval"), [(0, 10, 1), (20, 10, 1), (5, 10, 0)], ids=["zero", "over-max", "interval"]
)
def test_bad_settings_are_rejected(finisher: Finisher, default: float, maximum: float, interval: float) -> None:
    with pytest.raises(ValueError):
        LeaseTable(finisher, default_ttl_s=default, max_ttl_s=maximum, sweep_interval_s=interval)


def test_take_returns_the_record_once(table: LeaseTable, finisher: Finisher) -> None:
    rec = record("a")
    lease = table.grant(rec, 10)
    assert lease.lease_id in table
    assert table.expires_in(lease) == 10
    assert table.take(lease.lease_id) is rec
    assert table.take(lease.lease_id) is None
    assert table.take("unknown") is None
    assert len(table) == 0
    assert finisher.finished == []  # the caller of take() finishes the record


def test_lease_ids_are_unique(table: LeaseTable) -> None:
    ids = {table.grant(record(str(i))).lease_id for i in range(100)}
    assert len(ids) == 100


def test_sweep_expires_only_due_leases_as_incomplete(table: LeaseTable, finisher: Finisher, clock: FakeClock) -> None:
    table.grant(record("short"), 1)
    long = table.grant(record("long"), 100)
    taken = table.grant(record("taken"), 1)
    table.take(taken.lease_id)
    assert table.sweep() == 0
    clock.now += 1
    assert table.sweep() == 1
    assert finisher.finished == [("short", False)]
    assert len(table) == 1 and long.lease_id in table
    assert table.expires_in(long) == 99
    clock.now += 200
    assert table.expires_in(long) == 0
    assert table.sweep() == 1
    assert finisher.finished == [("short", False), ("long", False)]
    assert table.sweep() == 0


def test_release_all_finishes_every_outstanding_lease(table: LeaseTable, finisher: Finisher) -> None:
    a = table.grant(record("a"))
    table.grant(record("b"))
    table.take(a.lease_id)
    assert table.release_all() == 1
    assert finisher.finished == [("b", False)]
    assert len(table) == 0
    assert table.release_all() == 0


def test_taken_leases_do_not_pile_up_in_the_expiry_heap(table: LeaseTable, finisher: Finisher) -> None:
    keep = table.grant(record("keep"))
    for i in range(1000):
        table.take(table.grant(record(str(i))).lease_id)
    assert len(table._heap) <= 2 * len(table) + 65
    assert keep.lease_id in table
    assert table.release_all() == 1
    assert finisher.finished == [("keep", False)]


async def test_run_expires_leases_and_releases_the_rest_when_cancelled(
    table: LeaseTable, finisher: Finisher, clock: FakeClock
) -> None:
    table.grant(record("due"), 1)
    table.grant(record("later"), 100)
    sweeper = asyncio.create_task(table.run())
    clock.now += 2
    async with asyncio.timeout(10):  # a safety net against hangs, not a timing assertion
        await finisher.called.wait()
    assert finisher.finished == [("due", False)]
    assert len(table) == 1
    sweeper.cancel()
    with pytest.raises(asyncio.CancelledError):
        await sweeper
    assert finisher.finished == [("due", False), ("later", False)]
    assert len(table) == 0


# --- caps and reservations ---------------------------------------------------------------------------------
def capped(finisher: Finisher, clock: FakeClock) -> LeaseTable:
    return LeaseTable(finisher, clock=clock, max_leases=3, max_leases_per_caller=2)


def test_reservations_count_against_the_caps_and_grants_use_them(finisher: Finisher, clock: FakeClock) -> None:
    from llm_epp.pickapi.leases import CURRENT_RESERVATION, LeaseLimitError

    t = capped(finisher, clock)
    a1 = t.reserve("a")
    t.reserve("a")
    with pytest.raises(LeaseLimitError, match="--pick-api-max-leases-per-caller 2"):
        t.reserve("a")
    t.reserve("b")
    with pytest.raises(LeaseLimitError, match="--pick-api-max-leases 3"):
        t.reserve("c")
    token = CURRENT_RESERVATION.set(a1)
    try:
        lease = t.grant(record("r1"))
    finally:
        CURRENT_RESERVATION.reset(token)
    assert lease.caller == "a" and t.held_by("a") == 2
    t.unreserve(a1)  # already used by the grant: no effect
    assert t.held_by("a") == 2
    assert t.take(lease.lease_id) is not None
    assert t.held_by("a") == 1


def test_expiry_and_shutdown_free_the_callers_slots(finisher: Finisher, clock: FakeClock) -> None:
    t = capped(finisher, clock)
    t.grant(record("r1"), ttl_s=1)
    t.grant(record("r2"), ttl_s=100)
    assert t.held_by("") == 2
    clock.now += 2
    assert t.sweep() == 1 and t.held_by("") == 1
    assert t.release_all() == 1 and t.held_by("") == 0


@pytest.mark.parametrize(("total", "per_caller"), [(0, 0), (5, 6), (5, 0)], ids=str)
def test_invalid_caps_are_refused(finisher: Finisher, total: int, per_caller: int) -> None:
    with pytest.raises(ValueError, match="lease caps"):
        LeaseTable(finisher, max_leases=total, max_leases_per_caller=per_caller)
