"""The online latency predictor: it learns a known relationship, answers sensibly with few samples, fits
its models in the event loop's executor (never on the loop's thread on a real loop) and refits on the
clock it is given, so two runs of one virtual-time workload learn exactly the same models."""

from __future__ import annotations

import asyncio
import random
import threading

import pytest

from llm_epp.latency import Features, LatencyPredictor, PredictorSettings, fit_ridge
from llm_epp.latency.features import ttft_vector
from llm_epp.latency.predictor import settings_from_env
from llm_epp.sim.virtual_loop import VirtualEventLoop


def true_ttft(f: Features) -> float:
    # prefill cost grows with the uncached prompt and with the work queued ahead of it
    return 15.0 + 0.04 * f.uncached_tokens * (1 + f.waiting) + 25.0 * f.running * f.kv_cache


def true_tpot(f: Features) -> float:
    return 8.0 + 1.5 * f.running + 20.0 * f.kv_cache


def sample(rnd: random.Random) -> Features:
    return Features(
        kv_cache=rnd.random(),
        input_tokens=rnd.randint(16, 4000),
        waiting=rnd.randint(0, 6),
        running=rnd.randint(0, 16),
        prefix_score=rnd.random(),
        tokens_in_flight=rnd.randint(0, 50_000),
        dispatched=rnd.randint(0, 4),
    )


def settings(**kw: float) -> PredictorSettings:
    base = {"min_interval_s": 0.01, "quantile": 0.5}
    base.update(kw)
    return PredictorSettings(**base)  # type: ignore[arg-type]


def train(p: LatencyPredictor, n: int, seed: int = 1, noise: float = 0.05) -> None:
    rnd = random.Random(seed)
    for _ in range(n):
        f = sample(rnd)
        p.observe_ttft(f, true_ttft(f) * rnd.uniform(1 - noise, 1 + noise))
        p.observe_tpot(f, true_tpot(f) * rnd.uniform(1 - noise, 1 + noise))
    assert p.wait_fitted(10.0)


def mape(p: LatencyPredictor, seed: int) -> tuple[float, float]:
    rnd = random.Random(seed)
    errs_ttft, errs_tpot = [], []
    for _ in range(300):
        f = sample(rnd)
        pred = p.predict(f)
        assert pred is not None
        errs_ttft.append(abs(pred.ttft_ms - true_ttft(f)) / true_ttft(f))
        errs_tpot.append(abs(pred.tpot_ms - true_tpot(f)) / true_tpot(f))
    return sum(errs_ttft) / len(errs_ttft), sum(errs_tpot) / len(errs_tpot)


def test_learns_a_known_relationship_on_held_out_samples() -> None:
    # no event loop: fits run in the caller; a clock that stands still fits once, then once on wait_fitted
    p = LatencyPredictor(settings(), clock=lambda: 0.0)
    try:
        train(p, 1500)
        assert p.trained
        ttft_err, tpot_err = mape(p, seed=99)
        assert ttft_err < 0.15, ttft_err
        assert tpot_err < 0.05, tpot_err
        # and it ranks endpoints right: a loaded endpoint is predicted slower than an idle one
        idle = Features(kv_cache=0.05, input_tokens=2000, waiting=0, running=0)
        busy = Features(kv_cache=0.9, input_tokens=2000, waiting=5, running=14)
        pi, pb = p.predict(idle), p.predict(busy)
        assert pi is not None and pb is not None
        assert pb.ttft_ms > 3 * pi.ttft_ms and pb.tpot_ms > pi.tpot_ms
    finally:
        p.close()


def test_interaction_features_beat_a_plain_linear_model() -> None:
    rnd = random.Random(3)
    rows = [sample(rnd) for _ in range(1500)]
    test = [sample(rnd) for _ in range(300)]
    errors = {}
    for linear in (True, False):
        model = fit_ridge([ttft_vector(f, linear) for f in rows], [true_ttft(f) for f in rows], quantile=0.5)
        errors[linear] = sum(abs(model.mean(ttft_vector(f, linear)) - true_ttft(f)) for f in test)
    assert errors[False] < errors[True] / 2


def test_no_prediction_before_any_observation() -> None:
    p = LatencyPredictor(settings())
    assert p.predict(Features(0.1, 100, 0, 0)) is None
    p.close()


def test_few_samples_give_the_observed_median_not_a_fit() -> None:
    p = LatencyPredictor(settings(min_samples=10))
    try:
        f = Features(0.1, 100, 0, 1)
        for ms in (100.0, 120.0, 400.0):
            p.observe_ttft(f, ms)
        assert p.wait_for_version(0, 5.0)
        while p.version < 1 or p._models.ttft_median != 120.0:
            assert p.wait_for_version(p.version, 5.0)
        pred = p.predict(Features(0.9, 5000, 9, 9))
        assert pred is not None
        assert pred.ttft_ms == 120.0 and not pred.ttft_trained
        assert pred.tpot_ms == 0.0 and not pred.tpot_trained
    finally:
        p.close()


def test_bad_observations_are_ignored_and_a_degenerate_fit_is_sane() -> None:
    p = LatencyPredictor(PredictorSettings(queue_size=1, min_samples=2, window=2))
    f = Features(0.1, 100, 0, 1)
    p.observe_ttft(f, float("nan"))
    p.observe_ttft(f, -1.0)
    p.observe_ttft(f, float("inf"))
    assert not p._pending and p.version == 0 and p.predict(f) is None
    # a single identical sample repeated: a degenerate fit must not crash or publish nonsense
    p2 = LatencyPredictor(settings(min_samples=2))
    for _ in range(20):
        p2.observe_ttft(f, 50.0)
    assert p2.wait_for_version(0, 5.0)
    while p2._models.ttft is None:
        assert p2.wait_for_version(p2.version, 5.0)
    pred = p2.predict(Features(0.5, 3000, 3, 3))
    assert pred is not None and abs(pred.ttft_ms - 50.0) < 1.0
    p2.close()


async def test_observations_beyond_the_queue_size_are_dropped_and_counted() -> None:
    p = LatencyPredictor(PredictorSettings(queue_size=2, min_samples=2, window=5, min_interval_s=0.0))
    f = Features(0.1, 100, 0, 1)
    p.observe_ttft(f, 1.0)  # submits a refit; its result comes back only once the loop runs again
    for ms in (2.0, 3.0, 4.0, 5.0):
        p.observe_ttft(f, ms)  # wait behind the refit in flight: two fit the queue, two are dropped
    assert len(p._pending) == 2 and p.dropped == 2
    assert await asyncio.to_thread(p.wait_fitted, 5.0)
    assert p._models.ttft_median == 2.0 and not p._pending  # the median of 1, 2 and 3
    p.close()
    p.observe_ttft(f, 9.0)  # closed: ignored
    assert not p._pending and p.dropped == 2


async def test_training_runs_off_the_event_loop_thread() -> None:
    p = LatencyPredictor(settings(min_samples=5))
    loop_thread = threading.get_ident()
    rnd = random.Random(5)
    for _ in range(40):
        f = sample(rnd)
        p.observe_ttft(f, true_ttft(f))  # returns at once: an append, at most a submission to the executor
    assert await asyncio.to_thread(p.wait_fitted, 5.0)
    assert p.trained and p._models.consumed == 40
    assert p.fit_thread not in (0, loop_thread)
    p.close()


def _virtual_run(seed: int) -> tuple[list[tuple[float, float, int]], LatencyPredictor, float]:
    """Observations and predictions at random virtual instants; the refit interval is in virtual seconds."""
    loop = VirtualEventLoop()
    p = LatencyPredictor(settings(min_samples=5, min_interval_s=0.5, quantile=0.9), clock=loop.time)
    seen: list[tuple[float, float, int]] = []
    probe = Features(kv_cache=0.5, input_tokens=2000, waiting=2, running=6)

    async def drive() -> None:
        rnd = random.Random(seed)
        for _ in range(400):
            f = sample(rnd)
            p.observe_ttft(f, true_ttft(f) * rnd.uniform(0.8, 1.2))
            p.observe_tpot(f, true_tpot(f) * rnd.uniform(0.8, 1.2))
            await asyncio.sleep(rnd.expovariate(50.0))
            pred = p.predict(probe)
            assert pred is not None
            seen.append((pred.ttft_ms, pred.tpot_ms, p.version))
        await asyncio.sleep(2.0)  # nothing observed any more: what still waits is fitted once the interval passes

    try:
        loop.run_until_complete(drive())
        return seen, p, loop.time()
    finally:
        p.close()
        loop.close()


def test_two_virtual_time_runs_learn_the_same_models() -> None:
    first, p1, span = _virtual_run(11)
    second, p2, _ = _virtual_run(11)
    assert first == second  # every prediction, and the refit it came from, identical
    assert p1.version == p2.version and p1._models.consumed == p2._models.consumed == 800
    # refits follow the virtual clock (the runs take a few wall milliseconds): about one per 0.5 s of it
    active = span - 2.0  # the last 2 s saw no observation: one refit by timer
    assert active / 0.5 - 1 <= p1.version <= active / 0.5 + 2
    assert p1.fit_thread == threading.get_ident()  # the virtual loop runs its default executor inline
    assert _virtual_run(12)[0] != first  # and the predictions do depend on the observations


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="quantile"):
        PredictorSettings(quantile=1.0)
    with pytest.raises(ValueError, match="min_samples"):
        PredictorSettings(min_samples=1)
    with pytest.raises(ValueError, match="as many targets"):
        fit_ridge([[1.0]], [])


def test_settings_from_the_reference_environment() -> None:
    env = {
        "LATENCY_RETRAINING_INTERVAL_SEC": "10",
        "LATENCY_MIN_SAMPLES_FOR_RETRAIN_FRESH": "25",
        "LATENCY_MIN_SAMPLES_FOR_RETRAIN": "100",
        "LATENCY_MAX_TRAINING_DATA_SIZE_PER_BUCKET": "500",
        "LATENCY_OBJECTIVE_TYPE": "quantile",
        "LATENCY_QUANTILE_ALPHA": "0.95",
        "LATENCY_MAX_SAMPLE_SIZE": "10000",
        "LATENCY_MODEL_TYPE": "xgboost",
        "LATENCY_COALESCE_WINDOW_MS": "1",
        "LATENCY_SOMETHING_NEW": "x",
        "PATH": "/bin",
    }
    s, notes = settings_from_env(env)
    assert (s.min_interval_s, s.min_samples, s.window, s.quantile, s.queue_size) == (10, 25, 500, 0.95, 10000)
    named = sorted(n.split(" ")[0].split("=")[0] for n in notes)
    assert named == [
        "LATENCY_COALESCE_WINDOW_MS", "LATENCY_MIN_SAMPLES_FOR_RETRAIN", "LATENCY_MODEL_TYPE", "LATENCY_SOMETHING_NEW",
    ]  # fmt: skip
    assert settings_from_env({"LATENCY_OBJECTIVE_TYPE": "mean"})[0].quantile == 0.5
    assert settings_from_env({}) == (PredictorSettings(), [])
    # a window below min_samples grows to it
    assert settings_from_env({"LATENCY_MAX_TRAINING_DATA_SIZE_PER_BUCKET": "5"})[0].window == 10
    for bad, name in (
        ({"LATENCY_RETRAINING_INTERVAL_SEC": "soon"}, "LATENCY_RETRAINING_INTERVAL_SEC"),
        ({"LATENCY_QUANTILE_ALPHA": "1.5"}, "LATENCY_QUANTILE_ALPHA"),
        ({"LATENCY_OBJECTIVE_TYPE": "median"}, "LATENCY_OBJECTIVE_TYPE"),
        ({"LATENCY_MODEL_TYPE": "forest"}, "LATENCY_MODEL_TYPE"),
        ({"LATENCY_MIN_SAMPLES_FOR_RETRAIN_FRESH": "1"}, "LATENCY_MIN_SAMPLES_FOR_RETRAIN_FRESH"),
    ):
        with pytest.raises(ValueError, match=name):
            settings_from_env(bad)


def test_the_producer_factory_reads_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from llm_epp.config.loader import load_config_text
    from llm_epp.framework import NullRecorder
    from llm_epp.plugins import builtin_registry

    monkeypatch.setenv("LATENCY_RETRAINING_INTERVAL_SEC", "7")
    text = """
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: predicted-latency-producer
- type: predicted-latency-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: predicted-latency-scorer
  - pluginRef: max-score-picker
"""
    loaded = load_config_text(text, builtin_registry(), NullRecorder())
    for name in ("predicted-latency-producer", "predicted-latency-scorer"):
        assert loaded.plugins[name].predictor.settings.min_interval_s == 7  # type: ignore[attr-defined]
    monkeypatch.setenv("LATENCY_RETRAINING_INTERVAL_SEC", "-1")
    with pytest.raises(Exception, match="LATENCY_RETRAINING_INTERVAL_SEC"):
        load_config_text(text, builtin_registry(), NullRecorder())
