"""Fit quality of the online latency predictor's model candidates, on held-out samples.

Two data sets: synthetic samples with a known TTFT/TPOT relationship, and samples from the simulator's
engine (`llm_epp.sim.engine`) driven by a Poisson workload with shared prompt prefixes, where the
features are what the EPP would see when it dispatches (the engine's metrics, the prompt length, the
cached prefix, the requests in flight) and the targets are the engine's TTFT and mean TPOT.

Run: python -m benchmarks.latency_predictor_fit [--requests N]. Prints MAE, MAPE and p90 coverage for
the plain linear ridge model and the ridge model with interaction features, each fitted on the first 80%
of the samples and evaluated on the last 20%.

With --compare (needs scikit-learn: `pip install -e .[bench]`) it also fits scikit-learn's
HistGradientBoostingRegressor (squared error for the estimate, a second model with the 0.9 quantile loss
for the upper estimate, as the reference trains quantile models; one OpenMP thread) on the same training
window the online predictor keeps (the most recent 2000 samples of the training part), and times fitting
both targets and predicting one request's candidates (8 rows), side by side with the ridge model."""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from llm_epp.latency import Features, fit_ridge
from llm_epp.latency.features import tpot_vector, ttft_vector
from llm_epp.sim.engine import Engine, EventKind, SimRequest
from llm_epp.sim.profiles import get_profile

Sample = tuple[Features, float]


def synthetic(n: int, seed: int = 7) -> tuple[list[Sample], list[Sample]]:
    rnd = random.Random(seed)
    ttft, tpot = [], []
    for _ in range(n):
        f = Features(
            kv_cache=rnd.random(),
            input_tokens=rnd.randint(16, 4000),
            waiting=rnd.randint(0, 6),
            running=rnd.randint(0, 16),
            prefix_score=rnd.random(),
            tokens_in_flight=rnd.randint(0, 50_000),
            dispatched=rnd.randint(0, 4),
        )
        noise = rnd.uniform(0.95, 1.05)
        ttft.append((f, noise * (15.0 + 0.04 * f.uncached_tokens * (1 + f.waiting) + 25.0 * f.running * f.kv_cache)))
        tpot.append((f, noise * (8.0 + 1.5 * f.running + 20.0 * f.kv_cache)))
    return ttft, tpot


def simulated(
    n: int, profile: str = "qwen3-32b-h100-tp2", rate: float = 6.0, seed: int = 11
) -> tuple[list[Sample], list[Sample]]:
    rnd = random.Random(seed)
    engine = Engine(get_profile(profile), token_events=False)
    prefixes = [tuple(rnd.randrange(1, 30000) for _ in range(rnd.choice((256, 1024, 2048)))) for _ in range(8)]
    pending: dict[str, tuple[Features, float]] = {}
    first: dict[str, float] = {}
    ttft: list[Sample] = []
    tpot: list[Sample] = []
    now = 0.0
    for i in range(n):
        now += rnd.expovariate(rate)
        for ev in engine.advance(now):
            _collect(ev, pending, first, ttft, tpot)
        prompt = rnd.choice(prefixes) + tuple(rnd.randrange(1, 30000) for _ in range(rnd.randint(16, 1500)))
        m = engine.metrics()
        cached = engine.cached_prefix_tokens(prompt)
        in_flight = len(pending)
        f = Features(
            kv_cache=m.kv_cache_usage_perc,
            input_tokens=len(prompt),
            waiting=m.num_requests_waiting,
            running=m.num_requests_running,
            prefix_score=cached / len(prompt),
            tokens_in_flight=sum(x.input_tokens for x, _ in pending.values()),
            dispatched=in_flight,
            prefill_tokens=round(sum(x.uncached_tokens for r, (x, _) in pending.items() if r not in first)),
        )
        rid = f"r{i}"
        pending[rid] = (f, now)
        engine.submit(SimRequest(rid, prompt, rnd.randint(16, 400)), now)
    while (t := engine.next_event_time()) is not None:
        for ev in engine.advance(t):
            _collect(ev, pending, first, ttft, tpot)
    return ttft, tpot


def _collect(ev, pending, first, ttft, tpot) -> None:  # type: ignore[no-untyped-def]
    if ev.kind is EventKind.FIRST_TOKEN and ev.request_id in pending:
        f, sent = pending[ev.request_id]
        first[ev.request_id] = ev.time
        ttft.append((f, (ev.time - sent) * 1000.0))
    elif ev.kind is EventKind.FINISHED and ev.request_id in pending:
        f, _ = pending.pop(ev.request_id)
        t0 = first.pop(ev.request_id, None)
        if t0 is not None and ev.completion_tokens > 1:
            tpot.append((f, (ev.time - t0) * 1000.0 / (ev.completion_tokens - 1)))


def evaluate(
    samples: Sequence[Sample], vector: Callable[[Features, bool], list[float]], linear: bool
) -> tuple[float, float, float]:
    cut = int(len(samples) * 0.8)
    train, test = samples[:cut], samples[cut:]
    model = fit_ridge([vector(f, linear) for f, _ in train], [y for _, y in train], quantile=0.9)
    abs_err = [abs(model.mean(vector(f, linear)) - y) for f, y in test]
    mae = sum(abs_err) / len(test)
    mape = sum(e / max(y, 1e-6) for e, (_, y) in zip(abs_err, test, strict=True)) / len(test)
    coverage = sum(model.predict(vector(f, linear)) >= y for f, y in test) / len(test)
    return mae, mape, coverage


def baseline(samples: Sequence[Sample]) -> tuple[float, float]:
    """The fallback before any fit: the median of the training targets."""
    cut = int(len(samples) * 0.8)
    ys = sorted(y for _, y in samples[:cut])
    med = ys[len(ys) // 2]
    test = samples[cut:]
    mae = sum(abs(med - y) for _, y in test) / len(test)
    return mae, sum(abs(med - y) / max(y, 1e-6) for _, y in test) / len(test)


WINDOW = 2000  # the online predictor's default training window
CANDIDATES = 8  # rows predicted per request (one per candidate endpoint)


def _errors(pred_mean: Sequence[float], pred_upper: Sequence[float], test: Sequence[Sample]) -> tuple[float, ...]:
    ys = [y for _, y in test]
    abs_err = [abs(p - y) for p, y in zip(pred_mean, ys, strict=True)]
    mae = sum(abs_err) / len(ys)
    mape = sum(e / max(y, 1e-6) for e, y in zip(abs_err, ys, strict=True)) / len(ys)
    coverage = sum(u >= y for u, y in zip(pred_upper, ys, strict=True)) / len(ys)
    return mae, mape, coverage


def _timed(fn: Callable[[], Any], repeat: int) -> tuple[Any, float]:
    """The result of fn and its median wall time over `repeat` runs, in seconds."""
    times, out = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return out, statistics.median(times)


def compare(samples: Sequence[Sample], vector: Callable[[Features, bool], list[float]]) -> dict[str, tuple[float, ...]]:
    """Ridge (interaction features, as deployed) vs HistGradientBoostingRegressor on the raw and the
    interaction features. Each: (MAE, MAPE, p90 coverage, fit seconds, predict seconds per request)."""
    from sklearn.ensemble import HistGradientBoostingRegressor  # optional: the bench extra
    from threadpoolctl import threadpool_limits

    # one thread, as the ridge trainer (and the reference's prediction servers, OMP_NUM_THREADS=1): OpenMP
    # threads spinning on a shared, loaded machine made one fit take over a minute
    threadpool_limits(1)

    cut = int(len(samples) * 0.8)
    train, test = samples[max(cut - WINDOW, 0) : cut], samples[cut:]
    ys = [y for _, y in train]
    out: dict[str, tuple[float, ...]] = {}
    rows = [vector(f, False) for f, _ in train]
    model, fit_s = _timed(lambda: fit_ridge(rows, ys, quantile=0.9), 3)
    _, pred_s = _timed(lambda: [model.predict(vector(f, False)) for f, _ in test[:CANDIDATES]], 200)
    out["ridge"] = (
        *_errors(
            [model.mean(vector(f, False)) for f, _ in test], [model.predict(vector(f, False)) for f, _ in test], test
        ),
        fit_s,
        pred_s,
    )
    for label, linear in (("hgb raw", True), ("hgb interactions", False)):
        x = [vector(f, linear) for f, _ in train]
        xt = [vector(f, linear) for f, _ in test]

        def fit(x: list[list[float]] = x) -> tuple[Any, Any]:
            mean = HistGradientBoostingRegressor(max_iter=100, random_state=0).fit(x, ys)
            upper = HistGradientBoostingRegressor(loss="quantile", quantile=0.9, max_iter=100, random_state=0).fit(
                x, ys
            )
            return mean, upper

        (mean, upper), fit_s = _timed(fit, 3)
        one = xt[:CANDIDATES]
        _, pred_s = _timed(lambda m=mean, u=upper, x=one: (m.predict(x), u.predict(x)), 50)
        out[label] = (*_errors(list(mean.predict(xt)), list(upper.predict(xt)), test), fit_s, pred_s)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--rate", type=float, default=6.0, help="simulator arrivals per second")
    ap.add_argument("--compare", action="store_true", help="also gradient boosting (needs scikit-learn)")
    args = ap.parse_args()
    for name, (ttft, tpot) in (
        ("synthetic", synthetic(args.requests)),
        ("simulator", simulated(args.requests, rate=args.rate)),
    ):
        if args.compare:
            print(f"{name}: {len(ttft)} TTFT samples, {len(tpot)} TPOT samples (train window {WINDOW})")
            for target, samples, vector in (("TTFT", ttft, ttft_vector), ("TPOT", tpot, tpot_vector)):
                for label, (mae, mape, cov, fit_s, pred_s) in compare(samples, vector).items():
                    print(
                        f"  {target} {label:17s} MAE {mae:9.2f} ms  MAPE {mape * 100:6.1f}%  p90 coverage "
                        f"{cov * 100:5.1f}%  fit {fit_s * 1000:7.1f} ms  predict {pred_s * 1e6:7.1f} us/request"
                    )
            continue
        print(f"{name}: {len(ttft)} TTFT samples, {len(tpot)} TPOT samples")
        for target, samples, vector in (("TTFT", ttft, ttft_vector), ("TPOT", tpot, tpot_vector)):
            mae, mape = baseline(samples)
            print(f"  {target} median only  MAE {mae:9.2f} ms  MAPE {mape * 100:6.1f}%")
            for linear in (True, False):
                mae, mape, cov = evaluate(samples, vector, linear)
                label = "linear      " if linear else "interactions"
                print(f"  {target} {label} MAE {mae:9.2f} ms  MAPE {mape * 100:6.1f}%  p90 coverage {cov * 100:5.1f}%")


if __name__ == "__main__":
    main()
