"""Prefill/decode disaggregation end to end: a real Envoy, `llm-epp serve` with llm-d-router's P/D
configuration, `llm-epp pd-sidecar` in front of the decode model server, and loopback stand-ins for the
prefill and decode vLLM instances. The client sends one ordinary request and gets one ordinary answer; the
EPP names the prefill pod, the sidecar runs the prefill there and hands its KV transfer parameters to the
decode server. Every test runs against llm-d-router v0.10's configuration (`disagg-profile-handler`) and
the shape of earlier releases (`pd-profile-handler` with `prefill-header-handler`)."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from llm_epp.gateway.envoy_config import EnvoyConfigOptions, build_bootstrap
from llm_epp.gateway.envoy_process import EnvoyProcess
from llm_epp.gateway.epp_process import EppProcess
from tests.envoy.pd_servers import REJECT_MARKER, Received, SidecarProcess, VllmStandin
from tests.support.wait import wait_until

pytestmark = pytest.mark.envoy

ROLE = "llm-d.ai/role"
PREFILL_HEADER = "x-prefiller-host-port"
NON_CACHED_TOKENS = 16
PREFILL_CACHED_TOKENS = 7  # what the prefill stand-in reports as cached; the client must see this number

PROFILES = """\
schedulingProfiles:
- name: prefill
  plugins:
  - pluginRef: prefill-filter
  - pluginRef: max-score-picker
  - pluginRef: prefix-cache-scorer
    weight: 2
  - pluginRef: queue-scorer
    weight: 1
- name: decode
  plugins:
  - pluginRef: decode-filter
  - pluginRef: max-score-picker
  - pluginRef: prefix-cache-scorer
    weight: 2
  - pluginRef: queue-scorer
    weight: 1
"""

# llm-d-router v0.10's P/D configuration (its deploy/config/pd-epp-config.yaml has this shape).
DISAGG_CONFIG = f"""\
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: approx-prefix-cache-producer
- type: prefix-cache-scorer
- type: queue-scorer
- type: prefill-filter
- type: decode-filter
- type: max-score-picker
- type: disagg-profile-handler
  parameters:
    deciders:
      prefill: prefix-based-pd-decider
- type: prefix-based-pd-decider
  parameters:
    nonCachedTokens: {NON_CACHED_TOKENS}
{PROFILES}"""

# The shape of earlier llm-d releases: the deprecated pd-profile-handler with a header handler.
PD_HANDLER_CONFIG = f"""\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: prefill-header-handler
- type: prefix-cache-scorer
- type: queue-scorer
- type: prefill-filter
- type: decode-filter
- type: max-score-picker
- type: prefix-based-pd-decider
  parameters:
    nonCachedTokens: {NON_CACHED_TOKENS}
- type: pd-profile-handler
  parameters:
    deciderPluginName: prefix-based-pd-decider
{PROFILES}"""

CONFIGS = {
    "disagg-profile-handler": (DISAGG_CONFIG, "llm_d_epp_disagg_decision_total"),
    "pd-profile-handler": (PD_HANDLER_CONFIG, "llm_d_epp_pd_decision_total"),
}


@dataclass
class PdStack:
    prefill: VllmStandin
    decode: VllmStandin  # the decode pod's model server, reached only through the sidecar
    attacker: VllmStandin  # an address outside the pool that a client would like the sidecar to call
    sidecar: SidecarProcess
    epp: EppProcess
    envoy: EnvoyProcess
    decision_metric: str  # the handler's decision counter

    def url(self, path: str) -> str:
        return self.envoy.url(path)

    def reset(self) -> None:
        for standin in (self.prefill, self.decode, self.attacker):
            standin.reset()

    def decisions(self, decision: str) -> float:
        return self.epp.metric_value(self.decision_metric, decision_type=decision)

    def wait_decisions(self, decision: str, expected: float) -> float:
        return self.epp.wait_metric(self.decision_metric, expected, decision_type=decision)


def write_pool(path: Path, prefill: str, decode: str) -> None:
    def entry(name: str, hostport: str, role: str) -> dict[str, Any]:
        host, port = hostport.rsplit(":", 1)
        return {"name": name, "address": host, "port": int(port), "labels": {ROLE: role}}

    doc = {
        "poolName": "pd-pool",
        "endpoints": [entry("vllm-p-0", prefill, "prefill"), entry("vllm-d-0", decode, "decode")],
    }
    path.write_text(yaml.safe_dump(doc))


@pytest.fixture(scope="module", params=list(CONFIGS))
def pd(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PdStack]:
    config, decision_metric = CONFIGS[request.param]
    prefill = VllmStandin("prefill", cached_tokens=PREFILL_CACHED_TOKENS).start()
    decode = VllmStandin("decode").start()
    attacker = VllmStandin("attacker").start()
    started: list[Any] = [prefill, decode, attacker]
    try:
        pool = tmp_path_factory.mktemp("pd") / "pool.yaml"
        # one pool file for both: the EPP's endpoints, and the sidecar's allow-list of prefill targets
        sidecar = SidecarProcess(decode, "--enable-ssrf-protection", "--endpoints-file", str(pool))
        write_pool(pool, prefill.address, sidecar.address)
        sidecar.start()
        started.append(sidecar)
        epp = EppProcess("--endpoints-file", str(pool), "--secure-serving=false", "--config-text", config).start()
        started.append(epp)
        opts = EnvoyConfigOptions(
            listen_port=0,
            admin_port=0,
            epp_port=epp.grpc_port,
            epp_tls=False,
            response_body_mode="FULL_DUPLEX_STREAMED",
            failure_mode="FailClose",
        )
        envoy = EnvoyProcess(build_bootstrap(opts)).start()
        started.append(envoy)
        yield PdStack(prefill, decode, attacker, sidecar, epp, envoy, decision_metric)
    finally:
        for part in reversed(started):
            part.stop()


@pytest.fixture(autouse=True)
def _clean(pd: PdStack) -> None:
    pd.reset()


def long_prompt() -> str:
    """A prompt no pod has seen, well above the decider's threshold (about 250 tokens at 4 chars each)."""
    words = [uuid.uuid4().hex for _ in range(30)]
    return "Summarize the following notes: " + " ".join(words)


def short_prompt() -> str:
    return "hi " + uuid.uuid4().hex[:8]  # below nonCachedTokens (16 tokens, about 64 characters)


def request_body(path: str, prompt: str, **extra: Any) -> dict[str, Any]:
    if path == "/v1/chat/completions":
        return {"model": "m", "messages": [{"role": "user", "content": prompt}], "max_tokens": 5, **extra}
    return {"model": "m", "prompt": prompt, "max_tokens": 5, **extra}


def one(received: list[Received]) -> Received:
    assert len(received) == 1, received
    return received[0]


def sse_events(raw: bytes) -> list[str]:
    text = raw.decode()
    assert text.endswith("\n\n"), text[-200:]
    return [block[len("data: ") :] for block in text.split("\n\n") if block]


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_a_long_uncached_prompt_is_prefilled_remotely_and_decoded_with_its_kv_params(pd: PdStack, path: str) -> None:
    before = pd.decisions("prefill-decode")
    body = request_body(path, long_prompt(), temperature=0.3)
    r = httpx.post(pd.url(path), json=body, timeout=30)
    assert r.status_code == 200, r.text

    prefill_leg = one(pd.prefill.completions())
    assert prefill_leg.path == path
    assert prefill_leg.body["kv_transfer_params"]["do_remote_decode"] is True
    assert prefill_leg.body["stream"] is False
    assert prefill_leg.body["max_tokens"] == 1
    assert prefill_leg.body["temperature"] == 0.3  # otherwise the client's request
    decode_leg = one(pd.decode.completions())
    assert decode_leg.path == path
    assert decode_leg.body["kv_transfer_params"] == pd.prefill.kv_transfer_params()
    assert decode_leg.body["max_tokens"] == 5  # the client's own limit
    assert {k: v for k, v in decode_leg.body.items() if k != "kv_transfer_params"} == body
    assert decode_leg.headers["x-request-id"] == prefill_leg.headers["x-request-id"]
    assert PREFILL_HEADER not in decode_leg.headers  # routing headers stop at the sidecar
    assert not pd.attacker.received

    answer = r.json()
    assert answer["id"] == "cmpl-decode"  # the decode server's answer, one response
    assert "kv_transfer_params" not in answer
    assert answer["usage"]["completion_tokens"] == 5
    assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] == PREFILL_CACHED_TOKENS
    text = answer["choices"][0]["message"]["content"] if "chat" in path else answer["choices"][0]["text"]
    assert text == "t0 t1 t2 t3 t4 "
    assert pd.wait_decisions("prefill-decode", before + 1) == before + 1


def test_a_streamed_disaggregated_request_is_one_sse_stream_with_usage(pd: PdStack) -> None:
    cached_before = pd.epp.metric_value("inference_objective_prompt_cached_tokens_sum")
    body = request_body(
        "/v1/chat/completions", long_prompt(), max_tokens=6, stream=True, stream_options={"include_usage": True}
    )
    with httpx.Client(timeout=30) as c, c.stream("POST", pd.url("/v1/chat/completions"), json=body) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        raw = r.read()

    prefill_leg = one(pd.prefill.completions())
    assert prefill_leg.body["stream"] is False
    assert "stream_options" not in prefill_leg.body
    decode_leg = one(pd.decode.completions())
    assert decode_leg.body["stream"] is True
    assert decode_leg.body["stream_options"] == {"include_usage": True}
    assert decode_leg.body["kv_transfer_params"]["remote_engine_id"] == pd.prefill.engine_id

    events = sse_events(raw)
    assert events[-1] == "[DONE]"
    assert "[DONE]" not in events[:-1]  # one stream, not the prefill answer followed by the decode one
    parsed = [json.loads(e) for e in events[:-1]]
    assert "".join(e["choices"][0]["delta"]["content"] for e in parsed if e["choices"]) == "t0 t1 t2 t3 t4 t5 "
    usage = [e["usage"] for e in parsed if e.get("usage")]
    assert len(usage) == 1
    assert usage[0]["completion_tokens"] == 6
    assert usage[0]["prompt_tokens_details"]["cached_tokens"] == PREFILL_CACHED_TOKENS
    # the EPP read the same usage from the stream it relayed
    expected = cached_before + PREFILL_CACHED_TOKENS
    assert pd.epp.wait_metric("inference_objective_prompt_cached_tokens_sum", expected) == expected


def test_a_prompt_below_the_threshold_is_decoded_without_a_prefill_leg(pd: PdStack) -> None:
    before = pd.decisions("decode-only")
    r = httpx.post(pd.url("/v1/completions"), json=request_body("/v1/completions", short_prompt()), timeout=30)
    assert r.status_code == 200, r.text
    assert not pd.prefill.completions()
    decode_leg = one(pd.decode.completions())
    assert "kv_transfer_params" not in decode_leg.body
    assert r.json()["usage"]["completion_tokens"] == 5
    assert pd.wait_decisions("decode-only", before + 1) == before + 1


def test_a_prompt_the_decode_pod_already_caches_is_not_split_but_a_longer_one_is(pd: PdStack) -> None:
    # 1024 characters: 256 tokens, 16 cache blocks of 16 tokens (64 characters) each
    prompt = (uuid.uuid4().hex * 32)[:1024]

    def send(text: str) -> None:
        pd.reset()
        r = httpx.post(pd.url("/v1/completions"), json=request_body("/v1/completions", text), timeout=30)
        assert r.status_code == 200, r.text
        assert one(pd.decode.completions())

    send(prompt)
    assert one(pd.prefill.completions())  # nothing cached yet: split
    send(prompt)
    assert not pd.prefill.completions()  # every block is on the decode pod now: 0 uncached tokens
    assert "kv_transfer_params" not in one(pd.decode.completions()).body
    send(prompt + "z" * (NON_CACHED_TOKENS * 4 * 2))  # 32 tokens past the cached prefix
    assert one(pd.prefill.completions())


def test_a_request_the_prefill_pod_rejects_gets_that_answer_and_no_decode(pd: PdStack) -> None:
    body = request_body("/v1/completions", REJECT_MARKER + " " + long_prompt())
    r = httpx.post(pd.url("/v1/completions"), json=body, timeout=30)
    assert r.status_code == 400
    assert r.json()["type"] == "BadRequestError"
    assert "maximum context length" in r.json()["message"]
    assert one(pd.prefill.completions()).body["kv_transfer_params"]["do_remote_decode"] is True
    assert not pd.decode.completions()


def test_the_epp_scrapes_the_decode_pods_metrics_through_the_sidecar(pd: PdStack) -> None:
    def scraped() -> bool:
        return any(r.method == "GET" and r.path.split("?", 1)[0] == "/metrics" for r in pd.decode.received)

    wait_until(scraped, "a scrape of the decode pod's /metrics", timeout=10)


def test_with_the_prefill_pod_down_the_request_is_decoded_locally(pd: PdStack) -> None:
    split_before, local_before = pd.decisions("prefill-decode"), pd.decisions("decode-only")
    pd.prefill.stop()
    try:
        body = request_body("/v1/completions", long_prompt())
        r = httpx.post(pd.url("/v1/completions"), json=body, timeout=30)
    finally:
        pd.prefill.start()  # the same port again, for the other tests
    assert r.status_code == 200, r.text
    # Either the EPP had not yet seen the prefill pod fail (it chose P/D and the sidecar, finding the prefill pod
    # unreachable, decoded the request as sent), or a failed scrape had already taken the pod out of the
    # candidates (the EPP chose decode-only): both end in one local decode of the unchanged body.
    deadline = time.monotonic() + 10
    while pd.decisions("prefill-decode") + pd.decisions("decode-only") < split_before + local_before + 1:
        assert time.monotonic() < deadline, "the EPP recorded no decision for the request"
        time.sleep(0.02)
    split = pd.decisions("prefill-decode") - split_before
    assert split + pd.decisions("decode-only") - local_before == 1
    decode_leg = one(pd.decode.completions())
    assert decode_leg.body == body
    assert r.json()["id"] == "cmpl-decode"
    assert r.json()["usage"]["completion_tokens"] == 5
    fell_back = f"pd_sidecar_prefill_fallback target={pd.prefill.address}" in pd.sidecar.log()
    # a P/D decision with the dead pod already out of the prefill candidates names no prefill pod at all
    assert fell_back or not split or PREFILL_HEADER not in decode_leg.headers
    assert not pd.prefill.completions()  # nothing reached the dead pod


def test_a_client_sent_prefill_header_never_reaches_the_sidecar(pd: PdStack) -> None:
    spoofed = {PREFILL_HEADER: pd.attacker.address}
    body = request_body("/v1/completions", short_prompt())
    # Sent straight to the sidecar, the header would be acted on: the sidecar refuses a target outside the
    # pool (so a header the EPP let through would fail the request below).
    direct = httpx.post(pd.sidecar.url("/v1/completions"), json=body, headers=spoofed, timeout=30)
    assert direct.status_code == 403
    assert not pd.decode.completions()

    # Through the gateway the EPP drops it: a short prompt goes to the decode server with no prefill at all.
    r = httpx.post(pd.url("/v1/completions"), json=body, headers=spoofed, timeout=30)
    assert r.status_code == 200, r.text
    decode_leg = one(pd.decode.completions())
    assert "kv_transfer_params" not in decode_leg.body
    assert not pd.prefill.completions()
    assert not pd.attacker.received

    # A long prompt: the EPP's own choice replaces the client's.
    r = httpx.post(
        pd.url("/v1/completions"), json=request_body("/v1/completions", long_prompt()), headers=spoofed, timeout=30
    )
    assert r.status_code == 200, r.text
    assert one(pd.prefill.completions()).body["kv_transfer_params"]["do_remote_decode"] is True
    assert not pd.attacker.received


def test_client_sent_kv_transfer_params_never_reach_a_model_server(pd: PdStack) -> None:
    # A client naming its own KV peer: the decode server would pull KV blocks from that address.
    host, port = pd.attacker.address.rsplit(":", 1)
    peer = {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_engine_id": "evil",
        "remote_request_id": "evil",
        "remote_block_ids": [1, 2, 3],
        "remote_host": host,
        "remote_port": int(port),
    }
    sglang = {"bootstrap_host": host, "bootstrap_port": int(port), "bootstrap_room": 42}

    # Decoded without a split: the body reaches the decode server without the client's fields.
    body = request_body("/v1/completions", short_prompt(), kv_transfer_params=peer, **sglang)
    r = httpx.post(pd.url("/v1/completions"), json=body, timeout=30)
    assert r.status_code == 200, r.text
    decode_leg = one(pd.decode.completions())
    assert decode_leg.body == request_body("/v1/completions", body["prompt"])

    # Split: both legs carry the sidecar's parameters, never the client's.
    pd.reset()
    body = request_body("/v1/chat/completions", long_prompt(), kv_transfer_params=peer)
    r = httpx.post(pd.url("/v1/chat/completions"), json=body, timeout=30)
    assert r.status_code == 200, r.text
    assert one(pd.prefill.completions()).body["kv_transfer_params"]["do_remote_decode"] is True
    assert one(pd.decode.completions()).body["kv_transfer_params"] == pd.prefill.kv_transfer_params()
    assert not pd.attacker.received
