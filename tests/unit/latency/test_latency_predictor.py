"""The online latency predictor: it learns a known relationship, answers sensibly with few samples, and
fits its models on its trainer thread, never on the caller's (event-loop) thread."""

from __future__ import annotations

import asyncio
import random
import threading

import pytest

from llm_epp.latency import Features, LatencyPredictor, PredictorSettings, fit_ridge
from llm_epp.latency.features import ttft_vector
from llm_epp.latency.predictor import settings_from_env


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
    p = LatencyPredictor(settings())
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


def test_bad_observations_are_ignored_and_a_full_queue_drops() -> None:
    p = LatencyPredictor(PredictorSettings(queue_size=1, min_samples=2, window=2))
    try:
        f = Features(0.1, 100, 0, 1)
        p.observe_ttft(f, float("nan"))
        p.observe_ttft(f, -1.0)
        p.observe_ttft(f, float("inf"))
        assert p._queue.qsize() == 0 and p._thread is None
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
        with p._start_lock:  # hold the trainer from starting: fill the one-slot queue
            p._thread = threading.current_thread()
            p.observe_ttft(f, 1.0)
            p.observe_ttft(f, 2.0)
        assert p.dropped == 1
    finally:
        p._thread = None


async def test_training_runs_off_the_event_loop_thread() -> None:
    p = LatencyPredictor(settings(min_samples=5))
    loop_thread = threading.get_ident()
    rnd = random.Random(5)
    for _ in range(40):
        f = sample(rnd)
        p.observe_ttft(f, true_ttft(f))  # returns at once: only an enqueue
    assert await asyncio.to_thread(p.wait_for_version, 0, 5.0)
    while p._models.ttft is None:
        assert await asyncio.to_thread(p.wait_for_version, p.version, 5.0)
    assert p.fit_thread not in (0, loop_thread)
    assert p._thread is not None and p.fit_thread == p._thread.ident
    p.close()


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
