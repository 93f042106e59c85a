"""A short live P/D run on loopback: `llm-epp sim` pods with roles, `llm-epp pd-sidecar` in front of each decode
pod, the EPP and Envoy; aggregated pods vs a prefill/decode split on the same trace, one after the other.

The pods are the virtual-time benchmark's (``benchmarks.pd``) with their modelled times stretched by
``--time-scale``; the client streams every answer and measures TTFT, ITL and E2E in wall seconds, divided by the
time scale so they compare with the virtual-time figures. A smaller run than the virtual one (a 2-core machine
shared with other work carries it): it shows the same program working end to end, not new figures.

    python -m benchmarks.pd_live            # ~2 min: 4 pods, 5,000-token prompts, 2 req/s for 20 s
    python -m benchmarks.pd_live --smoke    # < 1 min: tiny pods

Results: ``benchmarks/results/pd_live.md`` (``pd_live_smoke.md`` with ``--smoke``)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
import yaml

from benchmarks.live import _die_with_parent, _stop, _wait_forwards, _wait_http, free_port
from benchmarks.loadgen import LiveResult, make_body, run_stage
from benchmarks.pd import ALWAYS_CONFIG, _prompts
from benchmarks.report import ROOT, command_line, machine
from llm_epp.datalayer.static import parse_endpoints_file
from llm_epp.gateway.envoy_config import EnvoyConfigOptions, build_bootstrap
from llm_epp.gateway.envoy_process import EnvoyProcess
from llm_epp.gateway.epp_process import EppProcess
from llm_epp.sim.cluster import percentile

MODEL = "sim-model"
ROLE_LABEL = "llm-d.ai/role"


@dataclass(frozen=True)
class LiveSetup:
    profile: str = "qwen3-32b-h100-tp2"
    pods: int = 4
    input_len: int = 5000
    output_len: int = 250
    rate: float = 2.0
    duration: float = 20.0
    time_scale: float = 1.0
    kv_bandwidth_gbps: float = 25.0
    seed: int = 1
    smoke: bool = False


SMOKE = LiveSetup(profile="tiny", input_len=400, output_len=16, rate=4.0, duration=3.0, smoke=True)


@contextlib.contextmanager
def _pods(setup: LiveSetup, roles: Sequence[str], workdir: Path) -> Iterator[list[dict[str, object]]]:
    """`llm-epp sim` with one role per pod; yields the endpoints-file entries."""
    endpoints = workdir / f"pods-{time.monotonic_ns()}.yaml"
    cmd = [
        sys.executable, "-m", "llm_epp", "sim", "--pods", str(setup.pods), "--profile", setup.profile,
        "--time-scale", str(setup.time_scale), "--model", MODEL, "--role", ",".join(roles),
        "--kv-transfer-bandwidth", str(setup.kv_bandwidth_gbps), "--endpoints-file", str(endpoints),
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


@contextlib.contextmanager
def _sidecars(entries: list[dict[str, object]], pool: Path, workdir: Path) -> Iterator[list[dict[str, object]]]:
    """One `llm-epp pd-sidecar` in front of each decode pod; yields the pool the EPP sees (decode pods reached
    through their sidecar). The sidecars allow only the pool's pods as prefill targets."""
    specs: list[tuple[list[str], int]] = []
    pool_entries: list[dict[str, object]] = []
    for e in entries:
        labels = e.get("labels")
        if isinstance(labels, dict) and labels.get(ROLE_LABEL) == "decode":
            port = free_port()
            cmd = [
                sys.executable, "-m", "llm_epp", "pd-sidecar", "--host", "127.0.0.1", "--port", str(port),
                "--model-server-host", "127.0.0.1", "--model-server-port", str(e["port"]),
                "--enable-ssrf-protection", "--endpoints-file", str(pool),
            ]  # fmt: skip
            specs.append((cmd, port))
            pool_entries.append({**e, "port": port})
        else:
            pool_entries.append(e)
    pool.write_text(yaml.safe_dump({"endpoints": pool_entries}, sort_keys=False))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for cmd, port in specs:
            with open(workdir / f"sidecar-{port}.log", "ab") as out:
                procs.append(subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent))
            _wait_http(f"http://127.0.0.1:{port}/health", deadline=time.monotonic() + 30)
        yield pool_entries
    finally:
        for proc in procs:
            _stop(proc)


def _pulls(entries: Sequence[dict[str, object]]) -> tuple[int, float]:
    """KV pulls and bytes the pods report (`vllm:nixl_xfer_time_seconds_count`, `vllm:nixl_bytes_transferred_sum`)."""
    pulls, nbytes = 0, 0.0
    for e in entries:
        text = httpx.get(f"http://{e['address']}:{e['port']}/metrics", timeout=10, trust_env=False).text
        for line in text.splitlines():
            if line.startswith("vllm:nixl_xfer_time_seconds_count{"):
                pulls += int(float(line.rsplit(" ", 1)[1]))
            elif line.startswith("vllm:nixl_bytes_transferred_sum{"):
                nbytes += float(line.rsplit(" ", 1)[1])
    return pulls, nbytes


def run_mode(setup: LiveSetup, mode: str, workdir: Path) -> tuple[list[LiveResult], int, float]:
    half = setup.pods // 2
    roles = ["both"] * setup.pods if mode == "aggregated" else ["prefill"] * half + ["decode"] * (setup.pods - half)
    n = max(round(setup.rate * setup.duration), 1)
    prompts = _prompts(n, setup.input_len, setup.output_len, setup.seed)
    offsets = [i / setup.rate * setup.time_scale for i in range(n)]
    pool = workdir / f"pool-{mode}.yaml"
    with _pods(setup, roles, workdir) as entries, _sidecars(entries, pool, workdir):
        parse_endpoints_file(pool.read_text(), str(pool))  # what the EPP reads must be valid
        args = ["--endpoints-file", str(pool)]
        if mode != "aggregated":
            args += ["--config-text", ALWAYS_CONFIG]
        with EppProcess(*args, log_path=workdir / f"epp-{mode}.log") as epp:
            opts = EnvoyConfigOptions(listen_port=0, admin_port=0, epp_port=epp.grpc_port, epp_tls=True)
            with EnvoyProcess(build_bootstrap(opts), workdir=workdir / f"envoy-{mode}") as envoy:
                envoy.wait_cluster_healthy("epp", timeout=30)
                _wait_forwards(envoy.url(), timeout=30)
                bodies = [make_body(MODEL, p) for p in prompts]
                pulls_before, bytes_before = _pulls(entries)  # the warm-up request may have been split

                async def go() -> list[LiveResult]:
                    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
                    async with httpx.AsyncClient(timeout=None, limits=limits, trust_env=False) as client:
                        url = envoy.url() + "/v1/completions"
                        timeout = 120 * setup.time_scale + 60
                        return await run_stage(client, url, 0, offsets, prompts, bodies, request_timeout=timeout)

                results = asyncio.run(go())
        pulls, nbytes = _pulls(entries)
    return results, pulls - pulls_before, nbytes - bytes_before


def _row(mode: str, results: Sequence[LiveResult], scale: float, pulls: int, nbytes: float) -> str:
    done = [r for r in results if not r.failed]
    ttft = [r.ttft / scale for r in done]
    itl = [r.itl / scale for r in done if not math.isnan(r.itl)]
    e2e = [r.e2e / scale for r in done]

    def ms(values: list[float], q: float) -> str:
        return f"{percentile(values, q) * 1000:,.0f}" if values else "-"

    def mean(values: list[float]) -> float:
        return sum(values) / len(values) if values else math.nan

    return (
        f"| {mode} | {len(results)} | {len(results) - len(done)} | {mean(ttft) * 1000:,.0f} / {ms(ttft, 50)} / "
        f"{ms(ttft, 90)} / {ms(ttft, 95)} | {mean(itl) * 1000:,.1f} / {ms(itl, 50)} / {ms(itl, 90)} / {ms(itl, 95)} | "
        f"{mean(e2e):,.2f} / {percentile(e2e, 90) if e2e else math.nan:,.2f} / "
        f"{percentile(e2e, 95) if e2e else math.nan:,.2f} | {pulls} | {nbytes / 1e9:,.2f} |"
    )


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true", help="tiny pods, a few requests (< 1 min)")
    ap.add_argument("--output", default=str(ROOT / "benchmarks" / "results"), help="directory for pd_live.md")
    args = ap.parse_args(argv)
    setup = SMOKE if args.smoke else LiveSetup()
    print(f"benchmarks.pd_live: {setup}", file=sys.stderr)
    header = machine()
    rows: list[str] = []
    with tempfile.TemporaryDirectory(prefix="pd-live-") as tmp:
        for mode in ("aggregated", "always-disagg"):
            results, pulls, nbytes = run_mode(setup, mode, Path(tmp))
            rows.append(_row(mode, results, setup.time_scale, pulls, nbytes))
            print(rows[-1], file=sys.stderr, flush=True)
    half = setup.pods // 2
    text = "\n".join(
        [
            "# Prefill/decode disaggregation, live on loopback" + (" (smoke)" if setup.smoke else ""),
            "",
            f"Command: `{command_line('benchmarks.pd_live', argv)}`  ",
            f"Machine: {header}",
            "",
            f"{setup.pods} `llm-epp sim` pods (`{setup.profile}`, time scale {setup.time_scale:g}) behind real "
            f"Envoy and `llm-epp serve`: all `both` with the default configuration, vs {half} `prefill` + "
            f"{setup.pods - half} `decode` with `llm-epp pd-sidecar` in front of each decode pod and "
            "`always-disagg-pd-decider`. "
            f"{round(setup.rate * setup.duration)} streamed requests of {setup.input_len} random prompt tokens and "
            f"{setup.output_len} output tokens at a constant {setup.rate:g} req/s (modelled), KV pulls at "
            f"{setup.kv_bandwidth_gbps:g} GB/s; seed {setup.seed}. Times are wall times / time scale, as the "
            "client saw them (ITL: each request's mean gap between streamed chunks; percentiles over requests). "
            "KV pulls and bytes are what the decode pods report in `vllm:nixl_*`.",
            "",
            "| mode | requests | failed | TTFT mean / p50 / p90 / p95 (ms) | ITL mean / p50 / p90 / p95 (ms) "
            "| E2E mean / p90 / p95 (s) | KV pulls | KV moved (GB) |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
            *rows,
            "",
        ]
    )
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    name = "pd_live_smoke.md" if setup.smoke else "pd_live.md"
    (out / name).write_text(text)
    print(f"wrote {out / name}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
