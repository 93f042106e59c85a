"""A short live run of precise vs approximate prefix-cache routing on loopback: `llm-epp sim` pods publishing
vLLM's KV-cache events over ZMQ, `llm-epp serve` subscribed to them, and real Envoy in front.

Each configuration gets fresh pods and the same trace: the shared-prefix shape of the virtual-time benchmark
(``benchmarks.precise``) scaled down to ``tiny`` pods, sized so the groups' distinct prompt tokens are ~73% of
the pods' KV capacity, in two stages; between them (the pods idle) pod 0's prefix cache is reset through
vLLM's ``POST /reset_prefix_cache``, which publishes AllBlocksCleared, as a restarted pod starts empty. The
client streams every answer and measures TTFT in wall seconds divided by the time scale (modelled seconds);
hit rates are the pods' own ``vllm:prefix_cache_*`` counters. A small run on a shared 2-core machine: it
shows the program working end to end and the direction of the effect, not new figures.

    python -m benchmarks.precise_live            # ~6 min: 4 pods, two 10 s stages (modelled) per configuration
    python -m benchmarks.precise_live --smoke    # ~1 min: two pods, approximate and precise

Results: ``benchmarks/results/precise_live.md`` (``precise_live_smoke.md`` with ``--smoke``)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import random
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
import yaml

from benchmarks.live import _die_with_parent, _stop, _wait_forwards, _wait_http
from benchmarks.loadgen import LiveResult, PodCounters, make_body, run_stage, scrape_pods, stage_stats
from benchmarks.precise import ESTIMATED_CONFIG
from benchmarks.report import ROOT, command_line, machine
from llm_epp.gateway.envoy_config import EnvoyConfigOptions, build_bootstrap
from llm_epp.gateway.envoy_process import EnvoyProcess
from llm_epp.gateway.epp_process import EppProcess
from llm_epp.sim.cluster import StageStats
from llm_epp.sim.profiles import get_profile
from llm_epp.sim.workload import SharedPrefixWorkload, Stage, stage_offsets

MODEL = "sim-model"
CONFIGS = ("approximate", "approximate 1/1/1", "precise")


@dataclass(frozen=True)
class LiveSetup:
    profile: str = "tiny"
    pods: int = 4
    groups: int = 10
    prompts_per_group: int = 4
    system_len: int = 600
    question_len: int = 150
    output_len: int = 16
    stages: tuple[Stage, ...] = (Stage(30, 10), Stage(60, 10))
    time_scale: float = 4.0
    restart_pod: int = 0
    seed: int = 1
    smoke: bool = False

    def kv_share(self) -> float:
        p = get_profile(self.profile)
        distinct = self.groups * (self.system_len + self.prompts_per_group * self.question_len)
        return distinct / (self.pods * p.kv_capacity_tokens)


SMOKE = LiveSetup(pods=2, groups=4, stages=(Stage(10, 1), Stage(10, 1)), time_scale=2.0, smoke=True)


def precise_config(render_url: str, zmq_base: int, replay_base: int) -> str:
    """The precise configuration (weights 3/2/2, as llm-d-kv-cache's benchmark): the pods' tokens from a pod's
    render endpoint, their blocks from the pods' KV events (endpoints found by data-parallel rank offset)."""
    return f"""\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: token-producer
  parameters:
    modelName: {MODEL}
    vllm: {{url: "{render_url}"}}
- type: precise-prefix-cache-producer
  parameters:
    indexerConfig:
      kvBlockIndexConfig: {{enableMetrics: true}}
    kvEventsConfig:
      podDiscoveryConfig: {{socketPort: {zmq_base}, replaySocketPort: {replay_base}}}
- type: precise-prefix-cache-scorer
- type: kv-cache-utilization-scorer
- type: queue-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: precise-prefix-cache-scorer
    weight: 3
  - pluginRef: kv-cache-utilization-scorer
    weight: 2
  - pluginRef: queue-scorer
    weight: 2
  - pluginRef: max-score-picker
"""


def free_port_range(n: int) -> int:
    """A base port P with P..P+n-1 free on 127.0.0.1 right now."""
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(20000, 60000 - n)
        with contextlib.ExitStack() as stack:
            try:
                for port in range(base, base + n):
                    s = stack.enter_context(socket.socket())
                    s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return base
    raise RuntimeError(f"no {n} consecutive free ports found on 127.0.0.1")


@contextlib.contextmanager
def _pods(setup: LiveSetup, workdir: Path, zmq_base: int, replay_base: int) -> Iterator[list[dict[str, object]]]:
    """`llm-epp sim` pods publishing KV events (pod i on zmq_base + i, replay on replay_base + i)."""
    endpoints = workdir / f"pods-{time.monotonic_ns()}.yaml"
    cmd = [
        sys.executable, "-m", "llm_epp", "sim", "--pods", str(setup.pods), "--profile", setup.profile,
        "--time-scale", str(setup.time_scale), "--model", MODEL, "--endpoints-file", str(endpoints),
        "--kv-events-port", str(zmq_base), "--kv-events-replay-port", str(replay_base),
    ]  # fmt: skip
    with open(workdir / "pods.log", "ab") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)
    try:
        deadline = time.monotonic() + 30
        while not endpoints.exists() or not endpoints.read_text().strip():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the simulated pods did not start (see pods.log)")
            time.sleep(0.05)
        entries = yaml.safe_load(endpoints.read_text())["endpoints"]
        for e in entries:
            _wait_http(f"http://{e['address']}:{e['port']}/health", deadline=time.monotonic() + 30)
        yield entries
    finally:
        _stop(proc)


@dataclass
class ModeResult:
    label: str
    stages: list[StageStats]
    restart_requests: int
    """Second-stage requests the reset pod served."""
    restart_hit_rate: float
    """The reset pod's prefix cache hit rate over the second stage."""
    others_hit_rate: float
    reset_status: int
    events_received: float = math.nan


def _rescale(res: LiveResult, scale: float) -> None:
    res.start, res.first_token = res.start / scale, res.first_token / scale
    res.last_token, res.end = res.last_token / scale, res.end / scale


def _hit(after: PodCounters, before: PodCounters) -> tuple[float, float]:
    return after.hits - before.hits, after.queries - before.queries


def _epp_metric(url: str, name: str) -> float:
    text = httpx.get(url, timeout=10, trust_env=False).text
    return sum(float(line.rpartition(" ")[2]) for line in text.splitlines() if line.startswith(name))


def run_mode(setup: LiveSetup, label: str, workdir: Path) -> ModeResult:
    base = free_port_range(2 * setup.pods)
    zmq_base, replay_base = base, base + setup.pods
    workload = SharedPrefixWorkload(
        num_groups=setup.groups, prompts_per_group=setup.prompts_per_group, system_prompt_len=setup.system_len,
        question_len=setup.question_len, output_len=setup.output_len, seed=setup.seed,
    )  # fmt: skip
    offsets = stage_offsets(setup.stages, setup.seed)
    with _pods(setup, workdir, zmq_base, replay_base) as entries:
        urls = [f"http://{e['address']}:{e['port']}" for e in entries]
        names = [str(e["name"]) for e in entries]
        pool = workdir / f"pool-{label.replace(' ', '-').replace('/', '')}.yaml"
        pool.write_text(yaml.safe_dump({"endpoints": entries}, sort_keys=False))
        args = ["--endpoints-file", str(pool)]
        if label == "precise":
            args += ["--config-text", precise_config(urls[0], zmq_base, replay_base)]
        elif label == "approximate 1/1/1":
            args += ["--config-text", ESTIMATED_CONFIG]
        with EppProcess(*args, log_path=workdir / f"epp-{pool.stem}.log") as epp:
            opts = EnvoyConfigOptions(listen_port=0, admin_port=0, epp_port=epp.grpc_port, epp_tls=True)
            with EnvoyProcess(build_bootstrap(opts), workdir=workdir / f"envoy-{pool.stem}") as envoy:
                envoy.wait_cluster_healthy("epp", timeout=30)
                _wait_forwards(envoy.url(), timeout=30)

                async def go() -> ModeResult:
                    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
                    stages: list[StageStats] = []
                    async with httpx.AsyncClient(timeout=None, limits=limits, trust_env=False) as client:
                        url = envoy.url() + "/v1/completions"
                        reset_status = 0
                        before = after = await scrape_pods(client, urls)
                        at_reset = before
                        for k, stage in enumerate(setup.stages):
                            if k == len(setup.stages) - 1:  # the pods are idle: pod 0 "restarts" empty
                                r = await client.post(urls[setup.restart_pod] + "/reset_prefix_cache", timeout=10)
                                reset_status = r.status_code
                                await asyncio.sleep(0.5)  # the AllBlocksCleared batch reaches the subscriber
                                at_reset = await scrape_pods(client, urls)
                                before = at_reset
                            prompts = [workload.next_prompt() for _ in offsets[k]]
                            bodies = [make_body(MODEL, p) for p in prompts]
                            scaled = [o * setup.time_scale for o in offsets[k]]
                            timeout = 60 * setup.time_scale + 60
                            results: list[LiveResult] = await run_stage(
                                client, url, k, scaled, prompts, bodies, request_timeout=timeout
                            )
                            for res in results:  # modelled seconds
                                _rescale(res, setup.time_scale)
                            after = await scrape_pods(client, urls)
                            stages.append(stage_stats(stage, results, names, before, after))
                            before = after
                    hits, queries = _hit(after[setup.restart_pod], at_reset[setup.restart_pod])
                    others = [_hit(a, b) for i, (a, b) in enumerate(zip(after, at_reset, strict=True))
                              if i != setup.restart_pod]  # fmt: skip
                    oh, oq = sum(h for h, _ in others), sum(q for _, q in others)
                    return ModeResult(
                        label,
                        stages,
                        restart_requests=stages[-1].requests_per_pod[setup.restart_pod],
                        restart_hit_rate=hits / queries if queries else math.nan,
                        others_hit_rate=oh / oq if oq else math.nan,
                        reset_status=reset_status,
                    )

                result = asyncio.run(go())
                if label == "precise":
                    result.events_received = _epp_metric(
                        epp.metrics_url, "llm_d_router_epp_kv_cache_events_messages_received_total"
                    )
    return result


def _f(v: float, d: int = 3) -> str:
    return "n/a" if v != v else f"{v:.{d}f}"


def report(setup: LiveSetup, results: Sequence[ModeResult], argv: Sequence[str] | None, header: str) -> str:
    rows = []
    for m in results:
        for k, s in enumerate(m.stages):
            rows.append(
                f"| {m.label} | {k} | {s.rate:g} | {s.requests} | {s.failures} | {_f(s.ttft_mean)} | "
                f"{_f(s.ttft_p50)} | {_f(s.ttft_p90)} | {_f(s.prefix_hit_rate)} | "
                f"{' / '.join(map(str, s.requests_per_pod))} |"
            )
    restart_rows = [
        f"| {m.label} | {m.reset_status} | {m.restart_requests} ({m.stages[-1].requests}) | {_f(m.restart_hit_rate)} | "
        f"{_f(m.others_hit_rate)} |"
        for m in results
    ]
    stages = ", ".join(f"{s.rate:g} req/s for {s.duration:g} s" for s in setup.stages)
    events = [f"{m.events_received:,.0f}" for m in results if not math.isnan(m.events_received)]
    return "\n".join(
        [
            "# Precise vs approximate prefix-cache routing, live on loopback" + (" (smoke)" if setup.smoke else ""),
            "",
            f"Command: `{command_line('benchmarks.precise_live', argv)}`  ",
            f"Machine: {header}",
            "",
            f"{setup.pods} `llm-epp sim` pods (`{setup.profile}`, time scale {setup.time_scale:g}) publishing KV "
            "events over ZMQ, behind real Envoy and `llm-epp serve`; fresh pods per configuration. Trace: shared "
            "prefix "
            f"{setup.groups} groups x {setup.prompts_per_group} prompts, system {setup.system_len} + question "
            f"{setup.question_len} tokens -> {setup.output_len} output tokens (distinct prompt tokens "
            f"{setup.kv_share():.0%} of the pods' KV capacity), streamed, Poisson stages (modelled): {stages}; seed "
            f"{setup.seed}. Before the last stage, pod {setup.restart_pod}'s prefix cache is reset (vLLM's "
            "`/reset_prefix_cache`, AllBlocksCleared published). Configurations: `approximate` is llm-epp's default "
            "(prefix 3 / kv-cache 2 / queue 2 over the EPP's own index), `approximate 1/1/1` llm-d-kv-cache's "
            "published estimated-scheduling, `precise` the KV-event index with the 3/2/2 weights. TTFT is wall "
            "time / time scale (modelled seconds); hit rates are the pods' `vllm:prefix_cache_hits/queries`.",
            "",
            "| configuration | stage | req/s | requests | failed | TTFT mean (s) | TTFT p50 (s) | TTFT p90 (s) "
            "| prefix hit rate | requests per pod |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
            *rows,
            "",
            f"After the reset of pod {setup.restart_pod}:",
            "",
            "| configuration | reset answer | last-stage requests to it (of all) | its prefix hit rate "
            "| other pods' hit rate |",
            "|---|---:|---:|---:|---:|",
            *restart_rows,
            "",
            f"KV-event messages the precise EPP received: {', '.join(events) or 'n/a'}.",
            "",
        ]
    )


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true", help="two tiny pods, a few requests (< 1 min)")
    ap.add_argument("--configs", default=None, help=f"configurations: {', '.join(CONFIGS)} (smoke: the first and last)")
    ap.add_argument("--output", default=str(ROOT / "benchmarks" / "results"), help="directory for precise_live.md")
    args = ap.parse_args(argv)
    setup = SMOKE if args.smoke else LiveSetup()
    default = (CONFIGS[0], CONFIGS[-1]) if args.smoke else CONFIGS
    labels = [c.strip() for c in (args.configs or ",".join(default)).split(",") if c.strip()]
    if unknown := [c for c in labels if c not in CONFIGS]:
        ap.error(f"unknown configuration(s) {unknown}; known: {', '.join(CONFIGS)}")
    print(f"benchmarks.precise_live: {setup}", file=sys.stderr)
    header = machine()
    results: list[ModeResult] = []
    with tempfile.TemporaryDirectory(prefix="precise-live-") as tmp:
        for label in labels:
            results.append(run_mode(setup, label, Path(tmp)))
            for k, s in enumerate(results[-1].stages):
                print(
                    f"  {label} stage {k}: TTFT p90 {s.ttft_p90:.3f} s, hit {s.prefix_hit_rate:.3f}, "
                    f"failed {s.failures}, per pod {s.requests_per_pod}",
                    file=sys.stderr,
                    flush=True,
                )
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    name = "precise_live_smoke.md" if setup.smoke else "precise_live.md"
    (out / name).write_text(report(setup, results, argv, header))
    print(f"wrote {out / name}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
