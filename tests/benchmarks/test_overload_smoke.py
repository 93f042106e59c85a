"""`make bench-smoke` for the overload benchmark: a tiny run writes a row per load, router and tenant, and the
summary table. Shape only, never the numbers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.overload import ROUTERS, SMOKE, TENANTS
from llm_epp.sim.profiles import get_profile

ROOT = Path(__file__).resolve().parents[2]
SMOKE_STEP_BASE_MS = 1000 * get_profile(SMOKE.profile).step_base


def test_overload_smoke_writes_a_row_per_load_router_and_tenant(tmp_path: Path) -> None:
    out_file = tmp_path / "overload.md"
    out = subprocess.run(
        [
            *(sys.executable, "-m", "benchmarks.overload", "--smoke", "--seed", "3", "--output", str(out_file)),
            *("--json", str(tmp_path / "overload.json")),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    text = out_file.read_text()
    assert "seed 3" in text
    rows = [
        [c.strip() for c in line.strip().strip("|").split("|")]
        for line in text.splitlines()
        if line.startswith(("| 1.5x", "| 3x"))
    ]
    detail = [r for r in rows if len(r) == 14]
    summary = [r for r in rows if len(r) == 9]
    assert [(r[0], r[1], r[2]) for r in detail] == [
        (load, router, tenant) for load in ("1.5x", "3x") for router in ROUTERS for tenant in TENANTS
    ]
    assert [(r[0], r[1]) for r in summary] == [(load, router) for load in ("1.5x", "3x") for router in ROUTERS]
    for r in detail:
        assert int(r[4]) > 0, "requests were measured"
        assert float(r[5].replace(",", "")) >= 0
        # prompt tokens the pods computed: per second = per completed request x completions per second (both
        # printed rounded), and never more per request than a whole prompt
        computed, per_request = (float(v.replace(",", "")) for v in r[7].rstrip(")").split(" ("))
        done = float(r[5].replace(",", ""))
        assert 0 <= per_request <= SMOKE.system_prompt_len + SMOKE.question_len
        assert abs(computed - per_request * done) <= 0.5 * done + 0.5
        assert (computed > 0) == (done > 0)
        assert int(r[12]) >= 0 and int(r[13]) >= 0
    # the JSON list feeds the means over seeds: one row per load and router, paired against the reference
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.overload", "--summarize", str(tmp_path / "overload.json")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    summary_text, steps_text = out.stdout.strip().split("\n\n")  # the means, then where the pods' time went
    for text, seeds in ((summary_text, "3"), (steps_text, "1")):  # the seeds run, then how many
        means = [line.split("|")[1:4] for line in text.splitlines() if line.startswith(("| 1.5x", "| 3x"))]
        assert [(m[0].strip(), m[1].strip(), m[2].strip()) for m in means] == [
            (load, router, seeds) for load in ("1.5x", "3x") for router in ROUTERS
        ]
    assert "| 1.5x | reference default | 3 |" in summary_text and "+0.0%" in summary_text
    assert "| in prefill |" in steps_text
    # the pods generated tokens in the window, and each run's ITL floor is the one that rate implies on the smoke
    # pods; the JSON keeps the rate for the means over seeds
    from benchmarks.overload import itl_floor_ms

    for r in summary:
        generated, floor = (float(r[i].replace(",", "")) for i in (7, 8))
        assert generated > 0
        assert floor == pytest.approx(itl_floor_ms(SMOKE, generated), rel=0.01, abs=0.051)
    saved = json.loads((tmp_path / "overload.json").read_text())
    assert all(e["generated_tokens_per_s"] > 0 for e in saved)
    # where the pods' time went: one row per run; shares of the window, the prefill share within the busy one
    steps = [r for r in rows if len(r) == 8 and r[2].endswith("%")]
    assert [(r[0], r[1]) for r in steps] == [(load, router) for load in ("1.5x", "3x") for router in ROUTERS]
    for e in saved:
        st = e["steps"]
        assert 0 < st["prefill_share"] <= st["busy_share"] <= 1.02  # a step that starts in the window may end after it
        assert st["decode_tokens_per_pod_s"] > 0 and st["mean_decode_batch"] > 0
        assert st["token_weighted_step_ms"] >= SMOKE_STEP_BASE_MS


def test_the_twin_gives_the_epp_what_the_deployment_gives_it() -> None:
    from benchmarks.overload import QueueTimes, _router
    from llm_epp.sim.routers import EppRouter

    deployed = _router("llm-epp kv-headroom", 2, 1, QueueTimes())
    ideal = _router("llm-epp kv-headroom", 2, 1, QueueTimes(), twin="ideal")
    assert isinstance(deployed, EppRouter) and isinstance(ideal, EppRouter)
    assert (deployed._headers_at_arrival, deployed._response_usage) == (True, False)  # response bodies NONE
    assert (ideal._headers_at_arrival, ideal._response_usage) == (False, True)


@pytest.mark.parametrize("label", ["round-robin", "reference default"])
def test_counting_the_generated_tokens_changes_no_run(label: str) -> None:
    from benchmarks.overload import GeneratedTokens, QueueTimes, _router, trace
    from llm_epp.sim.cluster import Cluster
    from llm_epp.sim.profiles import get_profile

    requests, _ = trace(SMOKE, 3.0, 4.0, 5)
    plain = Cluster(get_profile(SMOKE.profile), SMOKE.pods).run_trace(
        requests, _router(label, SMOKE.pods, 5, QueueTimes())
    )
    router = _router(label, SMOKE.pods, 5, QueueTimes())
    counted = GeneratedTokens(router, 1.0, 4.0)
    metered = Cluster(get_profile(SMOKE.profile), SMOKE.pods).run_trace(requests, router)
    assert [(r.id, r.finish, r.completion_tokens) for r in metered] == [
        (r.id, r.finish, r.completion_tokens) for r in plain
    ]
    # the counters moved by what the pods emitted inside the window
    emitted = sum(r.completion_tokens for r in plain)
    assert 0 < counted.per_s() * 3.0 <= emitted
