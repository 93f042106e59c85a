"""Calibration of the simulated pod against the published llm-d anchor (benchmarks.md, calibration rule).

Round-robin on the anchor workload must reproduce the published "Kubernetes Service" baseline within
±25%: Qwen3-32B, 8 pods x TP2 (profile ``qwen3-32b-h100-tp2``), inference-perf ``shared_prefix`` with
150 groups x 5 prompts, system prompt 6000 tokens, question 1200 tokens, output 1000 tokens (ignore_eos),
stage protocol: a warm-up stage (15 QPS x 50 s), then the 60 QPS stage (60 x 25 s = 1,500 requests, Poisson;
measured while the cluster drains: req/s = N / (last end - first start)).  Published at 60 QPS:
5.73 req/s, TTFT mean 34.9 s, ITL 70.4 ms.

The same run with the llm-epp default configuration (queue 2 / kv-cache 2 / prefix 3) is then printed
as a PREDICTION beside the published EPP figures (14.41 req/s, TTFT 0.12 s, ITL 67.7 ms).  The profile
constants are never tuned to the EPP's result.

    python -m benchmarks.calibrate            # full stages, both routers (about a minute)
    python -m benchmarks.calibrate --quick    # warm-up 15 QPS x 10 s, 60 QPS x 10 s (NOT comparable
                                              # with the published figures: a smaller burst drains faster)
    python -m benchmarks.calibrate --all-stages   # the anchor's whole sequence (warm-up, 3 -> 60 QPS)
    [--seed 42] [--output FILE]

Within this engine model the round-robin TTFT of the 60 QPS stage is set by queueing: a 1,500-request
burst drained FIFO at ~5.7 req/s waits on average ~(N - concurrency) / (2 x throughput); so the advice
printed for TTFT names what would have to change (per-pod concurrency), not a cost constant.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from benchmarks.report import command_line, machine
from llm_epp.sim.cluster import Cluster, RunResult, StageStats, make_router
from llm_epp.sim.profiles import QWEN3_32B_H100_TP2, Profile
from llm_epp.sim.workload import SharedPrefixWorkload, Stage

PODS = 8
WORKLOAD = {"num_groups": 150, "prompts_per_group": 5, "system_prompt_len": 6000, "question_len": 1200}
OUTPUT_LEN = 1000
FULL_STAGES = (Stage(15, 50), Stage(60, 25))
QUICK_STAGES = (Stage(15, 10), Stage(60, 10))
# The anchor's whole sequence: warm-up, then every stage up to 60 QPS (reference/llm-d.md §4.1).
ALL_STAGES = (
    Stage(15, 50),
    *(
        Stage(rate, seconds)
        for rate, seconds in (
            (3, 20), (10, 20), (15, 20), (20, 38), (22, 34), (25, 30), (30, 25), (35, 21),
            (40, 38), (43, 36), (46, 33), (49, 30), (52, 29), (55, 27), (57, 26), (60, 25),
        )
    ),
)  # fmt: skip
TOLERANCE = 0.25

# Published at the 60 QPS stage (llm-d v0.5 inference-scheduling guide; reference/llm-d.md §4.1).
BASELINE = {"req/s": 5.73, "TTFT mean (s)": 34.9, "ITL mean (ms)": 70.4}
BASELINE_E2E = 105.4
EPP = {"req/s": 14.41, "TTFT mean (s)": 0.12, "ITL mean (ms)": 67.7}


def run(router: str, stages: tuple[Stage, ...], seed: int, profile: Profile, log: bool = True) -> RunResult:
    workload = SharedPrefixWorkload(**WORKLOAD, output_len=OUTPUT_LEN, seed=seed)
    cluster = Cluster(profile, PODS)
    started = time.perf_counter()

    def progress(k: int, s: StageStats) -> None:
        if log:
            print(
                f"  {router}: stage {k + 1}/{len(stages)} ({s.rate:g} QPS x {s.duration:g} s, {s.requests} requests) "
                f"done: {s.req_per_s:.2f} req/s ({time.perf_counter() - started:.0f} s wall)",
                file=sys.stderr,
                flush=True,
            )

    return cluster.run(workload, stages, make_router(router, PODS, seed=seed), seed=seed, progress=progress)


def figures(s: StageStats) -> dict[str, float]:
    return {"req/s": s.req_per_s, "TTFT mean (s)": s.ttft_mean, "ITL mean (ms)": s.itl_mean * 1000}


def table(s: StageStats, published: dict[str, float], label: str) -> tuple[list[str], dict[str, float]]:
    sim = figures(s)
    ratios = {k: sim[k] / v for k, v in published.items()}
    out = [
        f"| {label} | simulated | published | sim / published |",
        "|---|---:|---:|---:|",
    ]
    for k, v in published.items():
        out.append(f"| {k} | {sim[k]:,.2f} | {v:,.2f} | {ratios[k]:.2f} |")
    return out, ratios


def details(name: str, s: StageStats) -> str:
    return (
        f"| {name} | {s.rate:g} x {s.duration:g} s | {s.requests} | {s.failures} | {s.req_per_s:.2f} | "
        f"{s.output_tokens_per_s:,.0f} | {s.ttft_mean:.2f} | {s.ttft_p50:.2f} | {s.ttft_p90:.2f} | {s.ttft_p99:.2f} | "
        f"{s.itl_mean * 1000:.1f} | {s.itl_p50 * 1000:.1f} | {s.e2e_p50:.1f} | {s.prefix_hit_rate:.3f} | "
        f"{s.mean_concurrency_per_pod:.1f} | {s.preemptions} | {min(s.requests_per_pod)}-{max(s.requests_per_pod)} |"
    )


def advice(ratios: dict[str, float]) -> list[str]:
    """Which constants would have to move, and which way, to bring round-robin within tolerance."""
    out = []
    rps, ttft, itl = ratios["req/s"], ratios["TTFT mean (s)"], ratios["ITL mean (ms)"]
    if abs(itl - 1) > TOLERANCE:
        way = "down" if itl > 1 else "up"
        out.append(
            f"- ITL is {itl:.2f}x the published one: move the per-step decode cost {way} "
            "(`step_base`, `kv_read_cost_per_token`, `decode_cost_per_seq`)."
        )
    if abs(rps - 1) > TOLERANCE:
        way = "down" if rps < 1 else "up"
        out.append(
            f"- req/s is {rps:.2f}x the published one: the pod serves too {'little' if rps < 1 else 'much'}; move "
            f"`prefill_cost_per_token` {way} (prefill dominates with 7,200-token prompts and few cache hits) "
            "or, if ITL is already right, the KV capacity / `max_num_seqs` (concurrency per pod)."
        )
    if abs(ttft - 1) > TOLERANCE:
        out.append(
            f"- TTFT mean is {ttft:.2f}x the published one: TTFT is queueing behind a full KV cache, so it follows "
            "throughput (fix req/s first). If req/s is right, no cost constant fixes it: a FIFO-drained burst waits "
            "~(N - concurrency) / (2 x req/s), so only more requests admitted per pod at once (a larger effective "
            "KV capacity per request, which is published and not tunable) would lower it, or the baseline is not "
            "request-level round-robin (a Kubernetes Service balances connections)."
        )
    return out or ["- Within ±25% on all three figures: no constant needs to move."]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="shorter stages (not comparable with the published run)")
    p.add_argument(
        "--all-stages", action="store_true", help="the anchor's whole sequence, 3 -> 60 QPS, after the warm-up"
    )
    p.add_argument(
        "--sensitivity",
        action="store_true",
        help="also move each constant by -30%% and +30%% and show how the headline ratio moves (~10 min)",
    )
    p.add_argument("--jobs", type=int, default=2, help="worker processes for --sensitivity (default 2)")
    p.add_argument("--seed", type=int, default=42, help="random seed (default 42)")
    p.add_argument("--output", help="also write the Markdown report here")
    args = p.parse_args(argv)
    stages = ALL_STAGES if args.all_stages else QUICK_STAGES if args.quick else FULL_STAGES
    profile = QWEN3_32B_H100_TP2
    command = command_line("benchmarks.calibrate", argv)
    out = [
        "## Simulator calibration against the llm-d anchor",
        "",
        f"`{command.strip()}`; seed {args.seed}; {machine()}",
        "",
        f"{PODS} pods, profile `{profile.name}`: " + ", ".join(f"{k}={getattr(profile, k)}" for k in _CONSTANTS) + ".",
        f"Workload: shared_prefix {WORKLOAD['num_groups']} groups x {WORKLOAD['prompts_per_group']} prompts, system "
        f"{WORKLOAD['system_prompt_len']} + question {WORKLOAD['question_len']} tokens, output {OUTPUT_LEN} "
        f"(ignore_eos). Stages: " + ", ".join(f"{s.rate:g} QPS x {s.duration:g} s" for s in stages) + "; figures are "
        "from the last stage." + (" --quick: NOT comparable with the published figures." if args.quick else ""),
        "",
    ]
    started = time.perf_counter()
    try:
        rr = run("round-robin", stages, args.seed, profile)
        rr_last = rr.stages[-1]
        rows, ratios = table(rr_last, BASELINE, "round-robin (CALIBRATION)")
        ok = all(abs(r - 1) <= TOLERANCE for r in ratios.values())
        out += rows
        out += ["", f"Calibration {'PASSES' if ok else 'FAILS'} (±{TOLERANCE:.0%} on every figure).", ""]
        out += advice(ratios)
        epp = run("llm-epp", stages, args.seed, profile)
        epp_last = epp.stages[-1]
        rows, _ = table(epp_last, EPP, "llm-epp default config (PREDICTION, not calibrated)")
        out += ["", *rows, ""]
        gain = epp_last.req_per_s / rr_last.req_per_s - 1
        ttft_drop = 1 - epp_last.ttft_mean / rr_last.ttft_mean
        out += [
            f"Predicted headline: req/s {gain:+.1%} (published +151.5%), TTFT mean {-ttft_drop:+.1%} "
            "(published -99.7%).",
            "",
            "| router | stage | n | fail | req/s | out tok/s | TTFT mean | p50 | p90 | p99 | ITL mean ms | ITL p50 ms "
            "| E2E p50 | prefix hit | conc/pod | preempt | req/pod |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
        ]
        for name, result in (("round-robin", rr), ("llm-epp", epp)):
            out += [details(name, s) for s in result.stages]
        out += ["", *tail_shape(rr_last)]
        if args.sensitivity:
            out += ["", *sensitivity(stages, args.seed, profile, args.jobs, rr_last, epp_last)]
    except KeyboardInterrupt:
        out.append("\n(interrupted: partial results)")
    out.append(f"\nTook {time.perf_counter() - started:.0f} s.")
    report = "\n".join(out)
    print(report)
    if args.output:
        Path(args.output).write_text(report + "\n")
    return 0


def tail_shape(s: StageStats) -> list[str]:
    """Why TTFT cannot be matched by a cost constant: the published figures imply front-loaded completions."""
    published_finish = BASELINE_E2E + s.duration / 2
    published_window = s.requests / BASELINE["req/s"]
    window = s.end - s.start
    sim_finish = s.e2e_mean + s.duration / 2
    return [
        "**Completion profile.** Arrivals are spread over the first "
        f"{s.duration:g} s (mean arrival ≈ {s.duration / 2:g} s). Published: {s.requests} requests at "
        f"{BASELINE['req/s']} req/s means the last one ended ≈ {published_window:.0f} s after the first start, and a "
        f"mean E2E of {BASELINE_E2E} s puts the mean completion at ≈ {published_finish:.0f} s, i.e. at "
        f"{published_finish / published_window:.0%} of the window. Simulated round-robin: window {window:.0f} s, "
        f"mean completion at {sim_finish:.0f} s ({sim_finish / window:.0%} of the window): its pods complete "
        "requests at a steady rate once full, as any work-conserving pod with a "
        "FIFO queue does, so TTFT ≈ (mean completion - mean arrival - decode time) follows from throughput. "
        "The published baseline finished most requests early and a few very late (a long tail sets its "
        "req/s); the engine model has no mechanism for such stragglers, so TTFT is not calibrated.",
    ]


def _sensitivity_run(router: str, stages: tuple[Stage, ...], seed: int, profile: Profile) -> StageStats:
    return run(router, stages, seed, profile, log=False).stages[-1]


def sensitivity(
    stages: tuple[Stage, ...], seed: int, profile: Profile, jobs: int, rr_base: StageStats, epp_base: StageStats
) -> list[str]:
    """The headline ratio (llm-epp vs round-robin) with each constant moved by -30% and +30%."""
    cases: list[tuple[str, float, Profile]] = []
    for name in _CONSTANTS:
        for factor in (0.7, 1.3):
            value = getattr(profile, name)
            moved = max(round(value * factor), 1) if isinstance(value, int) else value * factor
            cases.append((name, factor, dataclasses.replace(profile, **{name: moved})))
    print(f"  sensitivity: {len(cases) * 2} runs ...", file=sys.stderr, flush=True)
    with ProcessPoolExecutor(max_workers=max(jobs, 1)) as pool:
        futures = {
            (name, factor, router): pool.submit(_sensitivity_run, router, stages, seed, moved)
            for name, factor, moved in cases
            for router in ("round-robin", "llm-epp")
        }
        got = {k: f.result() for k, f in futures.items()}
    out = [
        "### Sensitivity: each constant moved by -30% / +30% (the others at their calibrated value)",
        "",
        "| constant | factor | RR req/s | RR TTFT mean s | RR ITL ms | llm-epp req/s | llm-epp TTFT mean s | "
        "llm-epp ITL ms | req/s gain | TTFT change |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def row(label: str, factor: str, rr: StageStats, epp: StageStats) -> str:
        return (
            f"| {label} | {factor} | {rr.req_per_s:.2f} | {rr.ttft_mean:.1f} | {rr.itl_mean * 1000:.1f} | "
            f"{epp.req_per_s:.2f} | {epp.ttft_mean:.2f} | {epp.itl_mean * 1000:.1f} | "
            f"{epp.req_per_s / rr.req_per_s - 1:+.1%} | {epp.ttft_mean / rr.ttft_mean - 1:+.2%} |"
        )

    out.append(row("(calibrated)", "1.0", rr_base, epp_base))
    for name, factor, _ in cases:
        out.append(row(f"`{name}`", f"{factor:g}", got[(name, factor, "round-robin")], got[(name, factor, "llm-epp")]))
    return out


_CONSTANTS = (
    "num_gpu_blocks",
    "max_num_seqs",
    "max_num_batched_tokens",
    "step_base",
    "prefill_cost_per_token",
    "decode_cost_per_seq",
    "kv_read_cost_per_token",
)

if __name__ == "__main__":
    raise SystemExit(main())
