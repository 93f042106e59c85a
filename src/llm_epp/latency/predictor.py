"""The online TTFT/TPOT predictor: samples in through a bounded queue, models fitted on a trainer thread.

The event loop calls `predict` (a few dozen multiply-adds per endpoint over the current models) and
`observe_ttft` / `observe_tpot` (a non-blocking enqueue; when the queue is full the sample is dropped and
counted). One daemon thread drains the queue into a sliding window of recent samples and refits both
models, at most once per `min_interval_s`; a new `_Models` object replaces the old one in a single
assignment, so a reader sees either the old models or the new ones, never a mix.

With no observation yet there is no prediction (`predict` returns None) and callers fall back to what
they do without predictions. With a few observations (fewer than `min_samples`) the prediction is the
median of what was observed, so the first requests still get a rough figure; from `min_samples` on the
fitted models answer."""

from __future__ import annotations

import logging
import math
import queue
import statistics
import threading
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, replace

from llm_epp.latency.features import Features, tpot_vector, ttft_vector
from llm_epp.latency.model import RidgeModel, fit_ridge

log = logging.getLogger(__name__)

_TTFT = 0
_TPOT = 1


@dataclass(frozen=True, slots=True)
class PredictorSettings:
    # observations before the fitted models answer (the reference's LATENCY_MIN_SAMPLES_FOR_RETRAIN_FRESH)
    min_samples: int = 10
    window: int = 2000  # most recent observations kept per target
    queue_size: int = 10000  # observations waiting for the trainer; more are dropped
    min_interval_s: float = 1.0  # at most one refit per interval (bounds the trainer's CPU and GIL use)
    alpha: float = 1.0  # ridge penalty on standardized features
    quantile: float = 0.9  # residual quantile added to the mean: predictions are p90 estimates
    linear: bool = False  # raw features only (no interaction terms)

    def __post_init__(self) -> None:
        if self.min_samples < 2 or self.window < self.min_samples or self.queue_size < 1:
            raise ValueError("PredictorSettings: need min_samples >= 2, window >= min_samples, queue_size >= 1")
        if not 0.5 <= self.quantile < 1.0:
            raise ValueError(f"PredictorSettings: quantile must be in [0.5, 1), got {self.quantile}")


# The reference's latency-predictor settings (its EPP and training-server environment) and what each does here.
ENV_APPLIED = {
    "LATENCY_RETRAINING_INTERVAL_SEC": "seconds between refits (min_interval_s)",
    "LATENCY_MIN_SAMPLES_FOR_RETRAIN_FRESH": "observations before the fitted models answer (min_samples)",
    "LATENCY_MAX_TRAINING_DATA_SIZE_PER_BUCKET": "observations kept per target (window: the most recent ones)",
    "LATENCY_OBJECTIVE_TYPE": "quantile: p-quantile estimates (LATENCY_QUANTILE_ALPHA); mean: median residual",
    "LATENCY_QUANTILE_ALPHA": "the quantile of the estimates (0.5 <= q < 1)",
    "LATENCY_MAX_SAMPLE_SIZE": "observations waiting for the trainer (queue_size)",
    "LATENCY_MODEL_TYPE": "bayesian_ridge: the in-process ridge model; xgboost / lightgbm: see model_type",
}
ENV_WITHOUT_EFFECT = {
    "LATENCY_MIN_SAMPLES_FOR_RETRAIN": "models are never persisted, so every start is fresh and "
    "LATENCY_MIN_SAMPLES_FOR_RETRAIN_FRESH applies (as the reference's training server on an empty volume)",
    "LATENCY_TTFT_MODEL_PATH": "models live in memory only",
    "LATENCY_TPOT_MODEL_PATH": "models live in memory only",
    "LATENCY_TTFT_SCALER_PATH": "models live in memory only",
    "LATENCY_TPOT_SCALER_PATH": "models live in memory only",
    "LATENCY_MAX_CONCURRENT_DISPATCHES": "there are no prediction servers to dispatch to",
    "LATENCY_COALESCE_WINDOW_MS": "there are no prediction servers to coalesce requests for",
}


def _env_number(env: Mapping[str, str], name: str, low: float, high: float = math.inf) -> float | None:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r}: expected a number in [{low}, {high})") from None
    if not (math.isfinite(value) and low <= value < high):
        raise ValueError(f"{name}={raw!r}: expected a number in [{low}, {high})")
    return value


def settings_from_env(
    env: Mapping[str, str], base: PredictorSettings | None = None
) -> tuple[PredictorSettings, list[str]]:
    """Settings from the reference's LATENCY_* environment (what its chart sets on the EPP and its training
    server), over `base`. Returns the settings and one note per variable that is set but has no effect
    here (the caller logs them). A malformed value raises ValueError naming the variable."""
    s = base or PredictorSettings()
    interval = _env_number(env, "LATENCY_RETRAINING_INTERVAL_SEC", 0.0)
    min_samples = _env_number(env, "LATENCY_MIN_SAMPLES_FOR_RETRAIN_FRESH", 2)
    window = _env_number(env, "LATENCY_MAX_TRAINING_DATA_SIZE_PER_BUCKET", 2)
    queue_size = _env_number(env, "LATENCY_MAX_SAMPLE_SIZE", 1)
    quantile = s.quantile
    objective = env.get("LATENCY_OBJECTIVE_TYPE", "").strip().lower()
    if objective not in ("", "quantile", "mean"):
        raise ValueError(f"LATENCY_OBJECTIVE_TYPE={objective!r}: expected quantile or mean")
    alpha = _env_number(env, "LATENCY_QUANTILE_ALPHA", 0.5, 1.0)
    if objective == "mean":
        quantile = 0.5
    elif alpha is not None:
        quantile = alpha
    model = env.get("LATENCY_MODEL_TYPE", "").strip().lower()
    if model not in ("", "bayesian_ridge", "xgboost", "lightgbm"):
        raise ValueError(f"LATENCY_MODEL_TYPE={model!r}: expected bayesian_ridge, xgboost or lightgbm")
    notes = [f"{name} has no effect: {why}" for name, why in ENV_WITHOUT_EFFECT.items() if env.get(name)]
    notes += [
        f"{name} has no effect: not a latency-predictor setting llm-epp knows"
        for name in sorted(env)
        if name.startswith("LATENCY_") and name not in ENV_APPLIED and name not in ENV_WITHOUT_EFFECT
    ]
    if model in ("xgboost", "lightgbm"):
        notes.append(
            f"LATENCY_MODEL_TYPE={model}: the in-process ridge model is used (the reference falls back to "
            "bayesian_ridge the same way when that library is missing)"
        )
    n_min = int(min_samples) if min_samples is not None else s.min_samples
    settings = replace(
        s,
        min_interval_s=interval if interval is not None else s.min_interval_s,
        min_samples=n_min,
        window=max(int(window) if window is not None else s.window, n_min),  # at least min_samples
        queue_size=int(queue_size) if queue_size is not None else s.queue_size,
        quantile=quantile,
    )
    return settings, notes


@dataclass(frozen=True, slots=True)
class Prediction:
    ttft_ms: float
    tpot_ms: float  # 0.0 when no TPOT has been observed yet
    ttft_trained: bool  # from a fitted model (False: the median of the few observations so far)
    tpot_trained: bool


@dataclass(frozen=True, slots=True)
class _Models:
    ttft: RidgeModel | None = None
    tpot: RidgeModel | None = None
    ttft_median: float | None = None
    tpot_median: float | None = None
    version: int = 0
    fit_thread: int = 0  # threading.get_ident() of the thread that fitted these models
    fit_seconds: float = 0.0
    consumed: int = 0  # observations the trainer had taken from the queue when it fitted these


class LatencyPredictor:
    def __init__(self, settings: PredictorSettings | None = None) -> None:
        self.settings = settings or PredictorSettings()
        self._models = _Models()
        self._queue: queue.Queue[tuple[int, Features, float] | None] = queue.Queue(self.settings.queue_size)
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self._published = threading.Condition()
        self._closed = False
        self._offered = 0  # observations enqueued (event-loop side)
        self.dropped = 0

    # --- event-loop side ---------------------------------------------------------------------------
    def predict(self, features: Features) -> Prediction | None:
        m = self._models
        if m.ttft is not None:
            ttft, ttft_trained = m.ttft.predict(ttft_vector(features, self.settings.linear)), True
        elif m.ttft_median is not None:
            ttft, ttft_trained = m.ttft_median, False
        else:
            return None
        if m.tpot is not None:
            tpot, tpot_trained = m.tpot.predict(tpot_vector(features, self.settings.linear)), True
        else:
            tpot, tpot_trained = (m.tpot_median or 0.0), False
        return Prediction(ttft, tpot, ttft_trained, tpot_trained)

    def observe_ttft(self, features: Features, ttft_ms: float) -> None:
        self._offer(_TTFT, features, ttft_ms)

    def observe_tpot(self, features: Features, tpot_ms: float) -> None:
        self._offer(_TPOT, features, tpot_ms)

    def _offer(self, kind: int, features: Features, value: float) -> None:
        if self._closed or not value >= 0.0 or value == float("inf"):
            return
        self._ensure_thread()
        try:
            self._queue.put_nowait((kind, features, value))
        except queue.Full:
            self.dropped += 1
        else:
            self._offered += 1

    # --- introspection ---------------------------------------------------------------------------------
    @property
    def version(self) -> int:
        """Increases every time new models (or medians) are published."""
        return self._models.version

    @property
    def fit_thread(self) -> int:
        return self._models.fit_thread

    @property
    def trained(self) -> bool:
        return self._models.ttft is not None

    def wait_for_version(self, version: int, timeout: float) -> bool:
        """Blocks (not for the event loop: run it in a thread) until models newer than `version` exist."""
        deadline = time.monotonic() + timeout
        with self._published:
            while self._models.version <= version:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._published.wait(left)
        return True

    def wait_fitted(self, timeout: float) -> bool:
        """Blocks (not for the event loop: run it in a thread) until every observation offered so far is
        part of the published models (or medians)."""
        target = self._offered
        deadline = time.monotonic() + timeout
        with self._published:
            while self._models.consumed < target:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._published.wait(left)
        return True

    def close(self) -> None:
        self._closed = True
        thread = self._thread
        if thread is not None:
            try:
                self._queue.put_nowait(None)
            except queue.Full:
                pass
            thread.join(timeout=2.0)

    # --- trainer thread ------------------------------------------------------------------------------
    def _ensure_thread(self) -> None:
        if self._thread is not None:
            return
        with self._start_lock:
            if self._thread is None:
                thread = threading.Thread(target=self._train_loop, name="latency-predictor-trainer", daemon=True)
                thread.start()
                self._thread = thread

    def _train_loop(self) -> None:
        s = self.settings
        samples: tuple[deque[tuple[Features, float]], deque[tuple[Features, float]]] = (
            deque(maxlen=s.window),
            deque(maxlen=s.window),
        )
        fresh = 0
        consumed = 0
        last_fit = 0.0
        while True:
            try:
                wait = max(last_fit + s.min_interval_s - time.monotonic(), 0.0) if fresh else None
                item = self._queue.get(timeout=wait)
            except queue.Empty:
                item = ()  # type: ignore[assignment]
            if item is None:
                return
            while item:
                if item is None:
                    return
                kind, features, value = item
                samples[kind].append((features, value))
                fresh += 1
                consumed += 1
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
            now = time.monotonic()
            if fresh and now - last_fit >= s.min_interval_s:
                try:
                    self._publish(samples, consumed)
                except Exception:  # a bad fit must not stop training: keep the old models
                    log.exception("latency_predictor_fit_failed")
                fresh = 0
                last_fit = time.monotonic()

    def _publish(
        self, samples: tuple[deque[tuple[Features, float]], deque[tuple[Features, float]]], consumed: int
    ) -> None:
        s = self.settings
        t0 = time.perf_counter()
        old = self._models
        ttft_rows, tpot_rows = samples
        ttft = tpot = None
        if len(ttft_rows) >= s.min_samples:
            ttft = fit_ridge(
                [ttft_vector(f, s.linear) for f, _ in ttft_rows], [v for _, v in ttft_rows], s.alpha, s.quantile
            )
        if len(tpot_rows) >= s.min_samples:
            tpot = fit_ridge(
                [tpot_vector(f, s.linear) for f, _ in tpot_rows], [v for _, v in tpot_rows], s.alpha, s.quantile
            )
        models = _Models(
            ttft=ttft,
            tpot=tpot,
            ttft_median=statistics.median(v for _, v in ttft_rows) if ttft_rows else None,
            tpot_median=statistics.median(v for _, v in tpot_rows) if tpot_rows else None,
            version=old.version + 1,
            fit_thread=threading.get_ident(),
            fit_seconds=time.perf_counter() - t0,
            consumed=consumed,
        )
        with self._published:
            self._models = models
            self._published.notify_all()
