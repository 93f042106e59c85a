"""Precise prefix-cache routing end to end: Envoy, `llm-epp serve` with `precise-prefix-cache-producer`, and
live simulated vLLM pods (and, in one pool, SGLang pods) that publish their KV-cache events over ZMQ on
127.0.0.1 (and tokenize through a render endpoint, as vLLM's render sidecar does).

Each case is one where guessing from past routing decisions goes wrong and the pods' own events get it
right: a pod restarted or reset its cache, a pod evicted the blocks; plus a lost batch recovered from the
replay socket and garbage on the socket counted and skipped."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from llm_epp.gateway.envoy_config import EnvoyConfigOptions, build_bootstrap
from llm_epp.gateway.envoy_process import EnvoyProcess
from llm_epp.gateway.epp_process import EppProcess
from llm_epp.sim import tokenizer
from tests.envoy.live_pods import MODEL, LivePods

pytestmark = pytest.mark.envoy

APPLIED = "llm_epp_kv_cache_events_applied_total"


class PreciseGateway:
    def __init__(self, pods: LivePods, tmp: Path) -> None:
        self.pods = pods
        pool = tmp / "pool.yaml"
        pool.write_text(pods.endpoints_yaml())
        cfg = tmp / "epp.yaml"
        cfg.write_text(pods.config())
        self.epp = EppProcess("--endpoints-file", str(pool), "--config-file", str(cfg), "--secure-serving=false")
        self.epp.start()
        opts = EnvoyConfigOptions(
            listen_port=0, admin_port=0, epp_port=self.epp.grpc_port, epp_tls=False, failure_mode="FailClose"
        )
        try:
            self.envoy = EnvoyProcess(build_bootstrap(opts)).start()
        except Exception:
            self.epp.stop()
            raise
        self.client = httpx.Client(timeout=30)

    def stop(self) -> None:
        self.client.close()
        self.envoy.stop()
        self.epp.stop()

    def post(self, prompt: str, max_tokens: int = 4) -> str:
        """Sends a completion through Envoy; the name of the pod that served it."""
        body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens}
        r = self.client.post(self.envoy.url("/v1/completions"), json=body)
        assert r.status_code == 200, r.text
        return r.headers["x-sim-pod"]

    def metric(self, name: str, **labels: str) -> float:
        return self.epp.metric_value(name, **labels)

    def wait(self, what: str, cond: Callable[[], bool], timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            assert time.monotonic() < deadline, f"timed out waiting for {what}\n{self.kv_metrics()}"
            time.sleep(0.05)

    def kv_metrics(self) -> str:
        return "\n".join(line for line in self.epp.metrics().splitlines() if "kv_cache" in line)

    def explain(self) -> str:
        """For a failed routing assertion: the index's counters and what the EPP logged about the endpoints
        and their event streams (reachability, restarts, gaps) and about tokenizing."""
        marks = ("endpoint_", "kv_events", "tokenize_")
        logged = [line for line in self.epp.log().splitlines() if any(m in line for m in marks)]
        return self.kv_metrics() + "\nEPP log:\n" + "\n".join(logged[-40:])

    def settle(self) -> None:
        """Waits until the applied-event counter stops moving (every published batch is in the index)."""
        last = -1.0
        while (now := self.metric(APPLIED)) != last:
            last = now
            time.sleep(0.3)


def _serve(pods: LivePods, workdir: Path) -> Iterator[PreciseGateway]:
    """A gateway in front of `pods` once every pod's events are subscribed; both stopped afterwards."""
    pods.start()
    try:
        gw = PreciseGateway(pods, workdir)
    except Exception:
        pods.stop()
        raise
    try:
        gw.wait("every pod subscribed", lambda: gw.metric("llm_d_router_epp_kv_cache_events_active_subscribers") == 3)
        yield gw
    finally:
        gw.stop()
        pods.stop()


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PreciseGateway]:
    # both of vLLM's encodings in one pool
    yield from _serve(LivePods(3, encodings=("array", "map")), tmp_path_factory.mktemp("precise"))


def _text(tag: str) -> str:
    return " ".join(f"{tag}-{i}" for i in range(80))  # ~170 tokens: ten 16-token blocks


def _place(gw: PreciseGateway, tag: str) -> tuple[str, str]:
    """Routes a new prompt through the gateway and waits until the index holds its blocks; (prompt, pod)."""
    prompt = _text(tag)
    before = gw.metric("llm_d_router_epp_kv_cache_index_admissions_total")
    pod = gw.post(prompt, max_tokens=40)
    gw.wait("the blocks indexed", lambda: gw.metric("llm_d_router_epp_kv_cache_index_admissions_total") > before)
    gw.settle()
    return prompt, pod


def _also_on(gw: PreciseGateway, prompt: str, home: str) -> int:
    """Puts `prompt` on a second pod too (sent to it directly); its index."""
    other = next(i for i in range(gw.pods.n) if gw.pods.servers[i].name != home)
    gw.pods.post_direct(other, prompt, max_tokens=40)
    gw.settle()
    return other


def test_follow_ups_land_on_the_pod_holding_their_blocks(gateway: PreciseGateway) -> None:
    gw = gateway
    prompt, home = _place(gw, "follow")
    served = [gw.post(prompt + f" question {i}") for i in range(6)]
    assert served == [home] * 6, gw.explain()
    assert gw.metric("llm_d_router_epp_kv_cache_events_messages_received_total") > 0
    assert gw.metric("llm_d_router_epp_kv_cache_events_pool_capacity") == 2  # kvEventsConfig.concurrency


def test_a_restarted_pod_is_forgotten(gateway: PreciseGateway) -> None:
    """Pod A and pod B both hold the prefix; A restarts (a new process: empty cache, sequence from 0). The
    index drops everything A held, whichever the EPP notices first: the pod unreachable for a moment
    (unsubscribed, its blocks dropped) or the new process's sequence starting again. Follow-ups then go
    to B only."""
    gw = gateway
    prompt, home = _place(gw, "restart")
    a = gw.pods.index_of(home)
    b = _also_on(gw, prompt, home)
    held = len(tokenizer.encode(prompt)) // 16
    evictions = gw.metric("llm_d_router_epp_kv_cache_index_evictions_total")
    gw.pods.restart(a)
    n = 0
    while gw.metric("llm_d_router_epp_kv_cache_index_evictions_total") < evictions + held:
        assert n < 60, gw.kv_metrics()
        gw.pods.post_direct(a, _text(f"warm-{n}"), max_tokens=2)  # the new process publishes from sequence 0
        n += 1
        time.sleep(0.1)
    gw.settle()
    assert gw.pods.cached_tokens(a, tokenizer.encode(prompt)) == 0
    served = [gw.post(prompt + f" after restart {i}") for i in range(6)]
    assert served == [gw.pods.servers[b].name] * 6, gw.explain()


def test_a_reset_cache_is_forgotten(gateway: PreciseGateway) -> None:
    """vLLM's /reset_prefix_cache publishes AllBlocksCleared: the pod's blocks leave the index."""
    gw = gateway
    prompt, home = _place(gw, "reset")
    a = gw.pods.index_of(home)
    b = _also_on(gw, prompt, home)
    gw.wait("pod idle", lambda: gw.pods.servers[a].pod.in_flight == 0)
    r = httpx.post(gw.pods.servers[a].url + "/reset_prefix_cache", timeout=10)
    assert r.status_code == 200
    gw.settle()
    served = [gw.post(prompt + f" after reset {i}") for i in range(6)]
    assert served == [gw.pods.servers[b].name] * 6, gw.explain()


def test_evicted_blocks_move_routing(gateway: PreciseGateway) -> None:
    """Pod A evicts the prefix under other traffic (BlockRemoved); pod B still holds it and gets the
    follow-ups."""
    gw = gateway
    prompt, home = _place(gw, "evict")
    a = gw.pods.index_of(home)
    b = _also_on(gw, prompt, home)
    ids = tokenizer.encode(prompt)
    n = 0
    while gw.pods.cached_tokens(a, ids) > 0:  # 256 blocks: a few dozen other prompts push it out
        assert n < 100
        gw.pods.post_direct(a, _text(f"filler-{n}"), max_tokens=2)
        n += 1
    gw.settle()
    assert gw.pods.cached_tokens(b, ids) > 0
    served = [gw.post(prompt + f" after eviction {i}") for i in range(6)]
    assert served == [gw.pods.servers[b].name] * 6, gw.explain()


def test_a_lost_batch_is_replayed(gateway: PreciseGateway) -> None:
    """The batch announcing the prefix's blocks never reaches the subscriber; the next batch shows the gap,
    the subscriber asks the pod's replay socket, and the follow-ups still find the pod."""
    gw = gateway
    gaps, replayed = (
        gw.metric("llm_epp_kv_cache_events_gaps_total"),
        gw.metric("llm_epp_kv_cache_events_replayed_total"),
    )
    for i in range(gw.pods.n):
        gw.pods.publisher(i).skip(1)
    prompt = _text("replay")
    home = gw.post(prompt, max_tokens=40)
    # the pod's next batch (its clock may have run the whole request in one step of the driver) shows the gap
    gw.pods.post_direct(gw.pods.index_of(home), _text("next"), max_tokens=2)
    gw.wait("the gap replayed", lambda: gw.metric("llm_epp_kv_cache_events_replayed_total") > replayed)
    gw.settle()
    assert gw.metric("llm_epp_kv_cache_events_gaps_total") > gaps
    served = [gw.post(prompt + f" after replay {i}") for i in range(6)]
    assert served == [home] * 6, gw.explain()


def test_garbage_on_the_socket_is_counted_and_skipped(gateway: PreciseGateway) -> None:
    gw = gateway
    before = gw.metric("llm_epp_kv_cache_events_malformed_total")
    pub = gw.pods.publisher(0)
    pub.send_raw([b"kv@x@m", b"\x00\x01"])  # two frames
    pub.send_raw([b"kv@x@m", b"\x01", b"\x90"])  # a sequence shorter than 8 bytes
    pub.publish_raw_batch(b"\xc1\xc1 not msgpack")  # numbered, undecodable
    pub.publish_raw_batch(b"\x93\xcb\x00\x00\x00\x00\x00\x00\x00\x00\x91\x92\xa7Unknown\x01\x00")  # unknown tag
    gw.wait("garbage counted", lambda: gw.metric("llm_epp_kv_cache_events_malformed_total") >= before + 4)
    by_kind = {k: gw.metric("llm_epp_kv_cache_events_malformed_total", kind=k) for k in ("message", "unknown_event")}
    assert by_kind["message"] >= 3 and by_kind["unknown_event"] >= 1
    prompt, home = _place(gw, "after-garbage")  # the subscriber is still running
    assert [gw.post(prompt + f" q{i}") for i in range(4)] == [home] * 4


@pytest.fixture(scope="module")
def sglang_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PreciseGateway]:
    yield from _serve(LivePods(3, engine="sglang"), tmp_path_factory.mktemp("precise-sglang"))


def test_sglang_pods_events_place_follow_ups_and_evictions_move_them(sglang_gateway: PreciseGateway) -> None:
    """SGLang's stream (signed page hashes, its own layout): follow-ups find the pod holding the prefix;
    after that pod evicts it (BlockRemoved by signed hash), they go to the other pod holding it."""
    gw = sglang_gateway
    prompt, home = _place(gw, "sglang")
    assert [gw.post(prompt + f" question {i}") for i in range(4)] == [home] * 4
    a = gw.pods.index_of(home)
    b = _also_on(gw, prompt, home)
    ids = tokenizer.encode(prompt)
    n = 0
    while gw.pods.cached_tokens(a, ids) > 0:
        assert n < 100
        gw.pods.post_direct(a, _text(f"sglang-filler-{n}"), max_tokens=2)
        n += 1
    gw.settle()
    assert gw.pods.cached_tokens(b, ids) > 0
    assert [gw.post(prompt + f" after eviction {i}") for i in range(4)] == [gw.pods.servers[b].name] * 4
    assert gw.metric("llm_epp_kv_cache_events_malformed_total") == 0
