"""LeaderElector driven through the real `kubernetes` client against the in-test API server."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterator

import pytest
from kubernetes import client

from llm_epp.k8s import LeaderElector, default_identity, default_lease_name
from tests.support.fake_apiserver import FakeApiServer

NS = "default"
LEASE = default_lease_name(NS, "pool")
DEADLINE = 10.0


async def wait_for(cond: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


class Candidate:
    """An elector plus the leadership transitions its callbacks saw on the event loop."""

    def __init__(self, fake: FakeApiServer, identity: str, loop: asyncio.AbstractEventLoop) -> None:
        self.events: list[str] = []
        self.elector = LeaderElector(
            fake.api_client(),
            NS,
            LEASE,
            identity,
            loop,
            lambda: self.events.append("started"),
            lambda: self.events.append("stopped"),
            lease_duration=1.0,
            renew_deadline=0.7,
            retry_period=0.1,
        )

    @property
    def identity(self) -> str:
        return self.elector.identity

    @property
    def leading(self) -> bool:
        """Leader as the app sees it: the last callback that ran was on_started_leading."""
        return bool(self.events) and self.events[-1] == "started"


@pytest.fixture
def fake() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        yield server


@pytest.fixture
async def candidates(fake: FakeApiServer) -> AsyncIterator[Callable[[str], Candidate]]:
    loop = asyncio.get_running_loop()
    made: list[Candidate] = []

    def make(identity: str) -> Candidate:
        c = Candidate(fake, identity, loop)
        made.append(c)
        c.elector.start()
        return c

    yield make
    for c in made:
        await asyncio.to_thread(c.elector.stop)


def holder(fake: FakeApiServer) -> str | None:
    lease = fake.get("leases", NS, LEASE)
    return None if lease is None else lease["spec"].get("holderIdentity")


# --- the fake API server's Lease support ------------------------------------------------------------------
def test_fake_server_lease_crud(fake: FakeApiServer) -> None:
    api = client.CoordinationV1Api(fake.api_client())
    with pytest.raises(client.ApiException) as e:
        api.read_namespaced_lease("l", NS)
    assert e.value.status == 404 and '"code": 404' in (e.value.body or "")
    body = {"metadata": {"name": "l"}, "spec": {"holderIdentity": "a", "leaseDurationSeconds": 5}}
    created = api.create_namespaced_lease(NS, body)
    assert created.spec.holder_identity == "a" and created.metadata.namespace == NS
    with pytest.raises(client.ApiException) as e:
        api.create_namespaced_lease(NS, body)
    assert e.value.status == 409 and "AlreadyExists" in (e.value.body or "")
    stale = api.read_namespaced_lease("l", NS)
    created.spec.holder_identity = "b"
    replaced = api.replace_namespaced_lease("l", NS, created)
    assert replaced.spec.holder_identity == "b"
    assert int(replaced.metadata.resource_version) > int(created.metadata.resource_version)
    stale.spec.holder_identity = "c"
    with pytest.raises(client.ApiException) as e:
        api.replace_namespaced_lease("l", NS, stale)
    assert e.value.status == 409 and "Conflict" in (e.value.body or "")
    assert api.read_namespaced_lease("l", NS).spec.holder_identity == "b"
    with pytest.raises(client.ApiException) as e:
        api.replace_namespaced_lease("missing", NS, {"metadata": {"name": "missing"}})
    assert e.value.status == 404
    fake.reject_writes = lambda plural, obj: True
    with pytest.raises(client.ApiException) as e:
        api.replace_namespaced_lease("l", NS, replaced)
    assert e.value.status == 503


def test_fake_server_discovery_lists_coordination(fake: FakeApiServer) -> None:
    groups = client.ApisApi(fake.api_client()).get_api_versions()
    assert "coordination.k8s.io" in [g.name for g in groups.groups]
    resources = client.CoordinationV1Api(fake.api_client()).get_api_resources()
    assert [r.name for r in resources.resources] == ["leases"]


# --- names ------------------------------------------------------------------------------------------------
def test_default_lease_name() -> None:
    assert default_lease_name("ns", "p") == "epp-ns-p.gateway-api-inference-extension.sigs.k8s.io"


def test_default_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POD_NAME", "epp-7d9f-x2")
    a, b = default_identity(), default_identity()
    assert a.startswith("epp-7d9f-x2_") and a != b
    monkeypatch.delenv("POD_NAME")
    assert default_identity()


def test_rejects_inconsistent_durations(fake: FakeApiServer) -> None:
    loop = asyncio.new_event_loop()
    try:
        with pytest.raises(ValueError):
            LeaderElector(fake.api_client(), NS, LEASE, "a", loop, lambda: None, lambda: None, 1.0, 2.0, 0.1)
    finally:
        loop.close()


# --- election -----------------------------------------------------------------------------------------------
async def test_single_elector_acquires(fake: FakeApiServer, candidates: Callable[[str], Candidate]) -> None:
    a = candidates("a")
    await wait_for(lambda: a.leading, "a to lead")
    assert a.elector.is_leader
    lease = fake.get("leases", NS, LEASE)
    assert lease is not None
    assert lease["spec"]["holderIdentity"] == "a"
    assert lease["spec"]["leaseDurationSeconds"] == 1
    assert lease["spec"]["renewTime"].endswith("+00:00")  # a MicroTime with six fractional digits
    assert len(lease["spec"]["renewTime"].split(".")[1]) == len("000000+00:00")
    first_rv = int(lease["metadata"]["resourceVersion"])
    await wait_for(lambda: int(fake.get("leases", NS, LEASE)["metadata"]["resourceVersion"]) > first_rv, "a renewal")
    assert a.events == ["started"] and holder(fake) == "a"


async def test_contenders_have_one_leader(fake: FakeApiServer, candidates: Callable[[str], Candidate]) -> None:
    cs = [candidates(name) for name in ("a", "b", "c")]
    await wait_for(lambda: any(c.leading for c in cs), "a leader")
    end = time.monotonic() + 1.5  # > lease duration: followers keep polling and must not steal a renewed lease
    while time.monotonic() < end:
        leaders = [c for c in cs if c.leading]
        assert len(leaders) == 1, [c.identity for c in leaders]
        assert sum(c.elector.is_leader for c in cs) == 1
        await asyncio.sleep(0.02)
    (leader,) = [c for c in cs if c.leading]
    assert holder(fake) == leader.identity
    assert all(c.events == [] for c in cs if c is not leader)


async def test_released_lease_is_taken_over(fake: FakeApiServer, candidates: Callable[[str], Candidate]) -> None:
    a = candidates("a")
    await wait_for(lambda: a.leading, "a to lead")
    b = candidates("b")
    await asyncio.sleep(0.3)  # b is a follower now
    assert not b.leading
    await asyncio.to_thread(a.elector.stop)
    await wait_for(lambda: a.events == ["started", "stopped"], "a to step down")
    await wait_for(lambda: b.leading, "b to take over")
    assert holder(fake) == "b"
    assert fake.get("leases", NS, LEASE)["spec"]["leaseTransitions"] == 1


async def test_release_happens_before_expiry(fake: FakeApiServer, candidates: Callable[[str], Candidate]) -> None:
    a = candidates("a")
    await wait_for(lambda: a.leading, "a to lead")
    await asyncio.to_thread(a.elector.stop)
    lease = fake.get("leases", NS, LEASE)
    assert lease is not None and lease["spec"]["holderIdentity"] == ""


async def test_stalled_leader_expires(fake: FakeApiServer, candidates: Callable[[str], Candidate]) -> None:
    a = candidates("a")
    await wait_for(lambda: a.leading, "a to lead")
    b = candidates("b")
    await asyncio.sleep(0.3)
    await asyncio.to_thread(a.elector.stop, release=False)  # dies without giving the lease up
    assert holder(fake) == "a"
    await wait_for(lambda: b.leading, "b to take over after expiry")
    assert holder(fake) == "b"


async def test_leader_whose_renewals_fail_steps_down_and_rejoins(
    fake: FakeApiServer, candidates: Callable[[str], Candidate]
) -> None:
    a = candidates("a")
    await wait_for(lambda: a.leading, "a to lead")
    b = candidates("b")
    await asyncio.sleep(0.3)
    fake.reject_writes = lambda plural, obj: obj.get("spec", {}).get("holderIdentity") == "a"
    await wait_for(lambda: a.events == ["started", "stopped"], "a to lose leadership")
    assert not a.elector.is_leader
    await wait_for(lambda: b.leading, "b to take over")
    assert holder(fake) == "b"
    fake.reject_writes = None
    await asyncio.sleep(0.3)
    assert not a.leading and b.leading  # a is a follower again, b keeps renewing
    await asyncio.to_thread(b.elector.stop)
    await wait_for(lambda: a.events == ["started", "stopped", "started"], "a to lead again")
    assert holder(fake) == "a"


async def test_waits_for_the_api_server(candidates: Callable[[str], Candidate]) -> None:
    with FakeApiServer() as down:
        url = down.url
    loop = asyncio.get_running_loop()
    events: list[str] = []
    api = client.ApiClient(client.Configuration())
    api.configuration.host = url
    elector = LeaderElector(
        api, NS, LEASE, "a", loop, lambda: events.append("started"), lambda: events.append("stopped"), 1.0, 0.7, 0.1
    )
    elector.start()
    await asyncio.sleep(0.3)
    await asyncio.to_thread(elector.stop)
    assert events == [] and not elector.is_leader
