"""Prefill/decode disaggregation in virtual time: aggregated pods vs a prefill/decode split, through the real
request path (the director, the disaggregation plugins and the sidecar's decision functions).

The workload has the shape of llm-d's P/D guide: random prompts (no shared prefix), a fixed input and output
length (5,000 / 250 tokens by default), arrivals at a constant rate.  On the same number of simulated pods
(``qwen3-32b-h100-tp2`` by default) it compares

* ``aggregated``: every pod ``both``, llm-epp's default configuration (no P/D plugin: nothing splits);
* ``always-disagg``: half the pods ``prefill``, half ``decode``, ``disagg-profile-handler`` with
  ``always-disagg-pd-decider`` (every request's prefill runs on a prefill pod, its KV moves to the decode pod);
* ``prefix-based``: the same split pods with ``prefix-based-pd-decider`` (``nonCachedTokens``): a request is
  split only when the part of its prompt the decode pod has not cached is that long.

and sweeps the input length (at a rate that keeps the prompt tokens offered per second the same), the load
(aggregated vs always-disagg) and the KV transfer bandwidth.  Per run: TTFT, per-request mean ITL and E2E
(mean, p50, p90, p95), requests/s, output tokens/s, the share of requests split, and the KV bytes moved.

    python -m benchmarks.pd                 # the full sweep (a few minutes)
    python -m benchmarks.pd --smoke         # seconds: tiny profile, for the test suite

Results: ``benchmarks/results/pd.md`` and ``pd.json`` (``pd_smoke.*`` with ``--smoke``)."""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from benchmarks.report import ROOT, command_line, machine
from llm_epp.sim.cluster import Cluster, RequestResult, percentile
from llm_epp.sim.disagg import DEFAULT_SETUP_LATENCY, KvTransfer
from llm_epp.sim.profiles import get_profile
from llm_epp.sim.routers import EppRouter
from llm_epp.sim.workload import Prompt, SharedPrefixWorkload

MODES = ("aggregated", "always-disagg", "prefix-based")


def pd_config(decider: str) -> str:
    """An EndpointPickerConfig shaped like llm-d's P/D sample (deploy/config/pd-epp-config.yaml): a decode and a
    prefill profile, prefix-cache and queue scorers, max-score picker; ``decider`` is the decider's YAML entry,
    named ``decider``."""
    return f"""
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: approx-prefix-cache-producer
- type: prefix-cache-scorer
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: prefill-filter
- type: decode-filter
- type: max-score-picker
{decider}
- type: disagg-profile-handler
  parameters:
    deciders:
      prefill: decider
schedulingProfiles:
- name: decode
  plugins:
  - pluginRef: decode-filter
  - pluginRef: max-score-picker
  - pluginRef: prefix-cache-scorer
    weight: 2
  - pluginRef: queue-scorer
    weight: 1
  - pluginRef: kv-cache-utilization-scorer
    weight: 1
- name: prefill
  plugins:
  - pluginRef: prefill-filter
  - pluginRef: max-score-picker
  - pluginRef: prefix-cache-scorer
    weight: 2
  - pluginRef: queue-scorer
    weight: 1
"""


ALWAYS_CONFIG = pd_config("- type: always-disagg-pd-decider\n  name: decider")


def prefix_based_config(non_cached_tokens: int) -> str:
    return pd_config(
        f"- type: prefix-based-pd-decider\n  name: decider\n  parameters:\n    nonCachedTokens: {non_cached_tokens}"
    )


@dataclass(frozen=True)
class Setup:
    profile: str = "qwen3-32b-h100-tp2"
    pods: int = 8
    prefill_pods: int = 4
    output_len: int = 250
    duration: float = 60.0
    """Seconds of arrivals per run."""
    load: float = 8.0 * 5000
    """Prompt tokens per second offered (rate = load / input length): the same prefill work at every length."""
    input_lens: tuple[int, ...] = (1000, 5000, 20000)
    load_factors: tuple[float, ...] = (0.5, 1.5)
    """Other loads (x ``load``) for aggregated vs always-disagg at the middle input length."""
    bandwidths_gbps: tuple[float, ...] = (1.0, 5.0, 25.0, 100.0)
    """GB/s of the bandwidth sweep (at the middle input length)."""
    default_bandwidth_gbps: float = 25.0
    setup_latency: float = DEFAULT_SETUP_LATENCY
    non_cached_tokens: int = 2048
    seed: int = 1
    smoke: bool = False


SMOKE = Setup(
    profile="tiny",
    pods=4,
    prefill_pods=2,
    output_len=16,
    duration=3.0,
    load=4.0 * 400,
    input_lens=(100, 400),
    load_factors=(2.0,),
    bandwidths_gbps=(0.1, 10.0),
    default_bandwidth_gbps=1.0,
    non_cached_tokens=200,
    smoke=True,
)


@dataclass
class Row:
    mode: str
    input_len: int
    rate: float
    bandwidth_gbps: float
    requests: int
    failures: int
    split: float
    """Share of the finished requests whose prefill ran on a prefill pod."""
    req_per_s: float
    output_tokens_per_s: float
    ttft_mean: float
    ttft_p50: float
    ttft_p90: float
    ttft_p95: float
    itl_mean: float
    itl_p50: float
    itl_p90: float
    itl_p95: float
    e2e_mean: float
    e2e_p90: float
    e2e_p95: float
    kv_gb: float
    """KV-cache gigabytes moved from prefill to decode pods."""
    wall_s: float
    pods_used: list[int] = field(default_factory=list)


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def _prompts(n: int, length: int, output: int, seed: int) -> list[Prompt]:
    w = SharedPrefixWorkload(
        num_groups=n, prompts_per_group=1, system_prompt_len=0, question_len=length, output_len=output, seed=seed
    )
    return [w.next_prompt() for _ in range(n)]


def run_one(setup: Setup, mode: str, input_len: int, bandwidth_gbps: float, load_factor: float = 1.0) -> Row:
    profile = get_profile(setup.profile)
    rate = setup.load * load_factor / input_len
    n = max(round(rate * setup.duration), 1)
    prompts = _prompts(n, input_len, setup.output_len, setup.seed)
    if mode == "aggregated":
        roles = ("both",) * setup.pods
        config: str | None = None
    else:
        roles = ("prefill",) * setup.prefill_pods + ("decode",) * (setup.pods - setup.prefill_pods)
        config = ALWAYS_CONFIG if mode == "always-disagg" else prefix_based_config(setup.non_cached_tokens)
    transfer = KvTransfer(bandwidth=bandwidth_gbps * 1e9, setup_latency=setup.setup_latency)
    cluster = Cluster(profile, setup.pods, roles=roles, kv_transfer=transfer, seed=setup.seed)
    router = EppRouter(setup.pods, config, seed=setup.seed, pod_labels=cluster.pod_labels())
    t0 = time.perf_counter()
    results = cluster.run_trace([(i / rate, p) for i, p in enumerate(prompts)], router)
    wall = time.perf_counter() - t0
    return summarize(mode, input_len, rate, bandwidth_gbps, results, wall, setup.pods)


def summarize(
    mode: str,
    input_len: int,
    rate: float,
    bandwidth_gbps: float,
    results: Sequence[RequestResult],
    wall: float,
    pods: int,
) -> Row:
    done = [r for r in results if not r.failed]
    start = min((r.arrival for r in results), default=0.0)
    end = max((r.finish for r in done), default=start)
    window = end - start
    ttft = [r.ttft for r in done]
    itl = [r.itl for r in done if not math.isnan(r.itl)]
    e2e = [r.e2e for r in done]
    used = [0] * pods
    for r in done:
        used[r.pod] += 1
    return Row(
        mode=mode,
        input_len=input_len,
        rate=rate,
        bandwidth_gbps=bandwidth_gbps,
        requests=len(results),
        failures=len(results) - len(done),
        split=sum(1 for r in done if r.prefill_pod >= 0) / len(done) if done else math.nan,
        req_per_s=len(done) / window if window > 0 else math.nan,
        output_tokens_per_s=sum(r.completion_tokens for r in done) / window if window > 0 else math.nan,
        ttft_mean=_mean(ttft),
        ttft_p50=percentile(ttft, 50),
        ttft_p90=percentile(ttft, 90),
        ttft_p95=percentile(ttft, 95),
        itl_mean=_mean(itl),
        itl_p50=percentile(itl, 50),
        itl_p90=percentile(itl, 90),
        itl_p95=percentile(itl, 95),
        e2e_mean=_mean(e2e),
        e2e_p90=percentile(e2e, 90),
        e2e_p95=percentile(e2e, 95),
        kv_gb=sum(r.kv_bytes for r in done) / 1e9,
        wall_s=wall,
        pods_used=used,
    )


def _ms(v: float) -> str:
    return "-" if math.isnan(v) else f"{v * 1000:,.0f}"


def _s(v: float) -> str:
    return "-" if math.isnan(v) else f"{v:,.2f}"


HEADER = (
    "| mode | input | rate | GB/s | split | req/s | out tok/s | TTFT mean / p50 / p90 / p95 (ms) | "
    "ITL mean / p50 / p90 / p95 (ms) | E2E mean / p90 / p95 (s) | KV moved (GB) | failed |\n"
    "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
)


def table_row(r: Row) -> str:
    return (
        f"| {r.mode} | {r.input_len} | {r.rate:.2f} | {r.bandwidth_gbps:g} | {r.split:.0%} | {r.req_per_s:.2f} | "
        f"{r.output_tokens_per_s:,.0f} | {_ms(r.ttft_mean)} / {_ms(r.ttft_p50)} / {_ms(r.ttft_p90)} / "
        f"{_ms(r.ttft_p95)} | {_ms(r.itl_mean)} / {_ms(r.itl_p50)} / {_ms(r.itl_p90)} / {_ms(r.itl_p95)} | "
        f"{_s(r.e2e_mean)} / {_s(r.e2e_p90)} / {_s(r.e2e_p95)} | "
        f"{r.kv_gb:,.1f} | {r.failures} |"
    )


def report(
    setup: Setup, length_rows: list[Row], load_rows: list[Row], bandwidth_rows: list[Row], argv: Sequence[str] | None
) -> str:
    profile = get_profile(setup.profile)
    lines = [
        "# Prefill/decode disaggregation (virtual time)" + (" (smoke)" if setup.smoke else ""),
        "",
        f"Command: `{command_line('benchmarks.pd', argv)}`  ",
        f"Machine: {machine()}",
        "",
        f"Pods: {setup.pods} x `{setup.profile}` (KV {profile.kv_capacity_tokens:,} tokens/pod, "
        f"{profile.kv_bytes_per_token / 1024:g} KiB of KV per token). Aggregated: all {setup.pods} `both`, the default "
        f"configuration. Split: {setup.prefill_pods} `prefill` + {setup.pods - setup.prefill_pods} `decode`, "
        f"`disagg-profile-handler` with `always-disagg-pd-decider` or `prefix-based-pd-decider` "
        f"(`nonCachedTokens: {setup.non_cached_tokens}`). Workload: random prompts (no shared prefix), "
        f"{setup.output_len} output tokens, constant arrivals for {setup.duration:g} s at "
        f"{setup.load:,.0f} prompt tokens/s (rate = that / input length); seed {setup.seed}. KV transfer: "
        f"setup {setup.setup_latency * 1000:g} ms + bytes / bandwidth, no sharing between transfers. ITL is each "
        "request's mean gap between output tokens; its p50/p90/p95 are over requests (llm-d's P/D guide reports "
        "mean and p95).",
        "",
        f"## Input length (KV bandwidth {setup.default_bandwidth_gbps:g} GB/s)",
        "",
        HEADER,
        *(table_row(r) for r in length_rows),
        "",
        f"## Load (input {setup.input_lens[len(setup.input_lens) // 2]} tokens, KV bandwidth "
        f"{setup.default_bandwidth_gbps:g} GB/s; x{' / x'.join(f'{f:g}' for f in setup.load_factors)} the load above)",
        "",
        HEADER,
        *(table_row(r) for r in load_rows),
        "",
        f"## KV transfer bandwidth (input {setup.input_lens[len(setup.input_lens) // 2]} tokens)",
        "",
        HEADER,
        *(table_row(r) for r in bandwidth_rows),
        "",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--smoke", action="store_true", help="tiny profile and sizes (seconds), for the test suite")
    ap.add_argument("--output", default=str(ROOT / "benchmarks" / "results"), help="directory for pd.md / pd.json")
    ap.add_argument("--duration", type=float, help="seconds of arrivals per run")
    ap.add_argument("--seed", type=int, help="workload and plugin seed")
    args = ap.parse_args(argv)
    setup = SMOKE if args.smoke else Setup()
    if args.duration is not None or args.seed is not None:
        duration = args.duration if args.duration is not None else setup.duration
        seed = args.seed if args.seed is not None else setup.seed
        setup = Setup(**{**asdict(setup), "duration": duration, "seed": seed})
    print(f"benchmarks.pd: {setup}", file=sys.stderr)
    length_rows: list[Row] = []
    load_rows: list[Row] = []
    bandwidth_rows: list[Row] = []
    middle = setup.input_lens[len(setup.input_lens) // 2]
    try:
        for length in setup.input_lens:
            for mode in MODES:
                row = run_one(setup, mode, length, setup.default_bandwidth_gbps)
                length_rows.append(row)
                print(table_row(row) + f" ({row.wall_s:.1f} s)", file=sys.stderr, flush=True)
        for factor in setup.load_factors:
            for mode in ("aggregated", "always-disagg"):
                row = run_one(setup, mode, middle, setup.default_bandwidth_gbps, factor)
                load_rows.append(row)
                print(table_row(row) + f" ({row.wall_s:.1f} s)", file=sys.stderr, flush=True)
        for gbps in setup.bandwidths_gbps:
            row = run_one(setup, "always-disagg", middle, gbps)
            bandwidth_rows.append(row)
            print(table_row(row) + f" ({row.wall_s:.1f} s)", file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        print("interrupted: writing the runs finished so far", file=sys.stderr)
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    stem = "pd_smoke" if setup.smoke else "pd"
    (out / f"{stem}.md").write_text(report(setup, length_rows, load_rows, bandwidth_rows, argv))
    data = {"setup": asdict(setup), "lengths": [asdict(r) for r in length_rows],
            "loads": [asdict(r) for r in load_rows], "bandwidths": [asdict(r) for r in bandwidth_rows]}  # fmt: skip
    (out / f"{stem}.json").write_text(json.dumps(data, indent=1, default=lambda v: None))
    print(f"wrote {out / (stem + '.md')}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
