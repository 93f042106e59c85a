"""The online TTFT/TPOT predictor: samples collected on the event loop, models fitted in its executor.

The event loop calls `predict` (a few dozen multiply-adds per endpoint over the current models) and
`observe_ttft` / `observe_tpot` (an append to a bounded list of waiting observations; when it is full the
sample is dropped and counted). Refits follow the request path's clock (`clock`, the plugin handle's
`now`): when `min_interval_s` has passed on it since the last refit and no refit is in flight, the waiting
observations join a sliding window of recent samples and a copy of that window is fitted in the loop's
default executor (`loop.run_in_executor(None, ...)`), so under `llm-epp serve` the fit runs on a worker
thread and never blocks requests. When it completes, the loop publishes the new `_Models` in a single
assignment, so a reader sees either the old models or the new ones, never a mix. In the simulator the
clock is virtual and the default executor runs inline, so a refit happens at a fixed virtual instant and
two runs of the same workload learn the same models. Used with no running event loop (a script, a test),
the fit runs inline in the caller.

With no observation yet there is no prediction (`predict` returns None) and callers fall back to what
they do without predictions. With a few observations (fewer than `min_samples`) the prediction is the
median of what was observed, so the first requests still get a rough figure; from `min_samples` on the
fitted models answer."""

from __future__ import annotations

import asyncio
import logging
import math
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
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
    queue_size: int = 10000  # observations waiting for the next refit; more are dropped
    min_interval_s: float = 1.0  # at most one refit per interval on the clock (bounds fitting CPU and GIL use)
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
    "LATENCY_MAX_SAMPLE_SIZE": "observations waiting for the next refit (queue_size)",
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
    consumed: int = 0  # observations offered before these models, counting those dropped


_Rows = tuple[tuple[Features, float], ...]


class LatencyPredictor:
    """See the module docstring. `clock` (seconds) times the refits; everything but `wait_for_version`
    and `wait_fitted` is meant for the event loop's thread."""

    def __init__(self, settings: PredictorSettings | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings or PredictorSettings()
        self.clock = clock
        self._models = _Models()
        self._published = threading.Condition()
        self._closed = False
        # event-loop side: observations waiting for the next refit, and the window the refits copy
        self._pending: deque[tuple[int, Features, float]] = deque()
        self._window: tuple[deque[tuple[Features, float]], deque[tuple[Features, float]]] = (
            deque(maxlen=self.settings.window),
            deque(maxlen=self.settings.window),
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._in_flight = False
        self._flush = False  # refit what is waiting as soon as no refit is in flight, interval or not
        self._timer: asyncio.TimerHandle | None = None
        self._last_fit = -math.inf
        self._offered = 0  # observations accepted or dropped (event-loop side)
        self._taken = 0  # of those, how many the last submitted refit accounts for
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
        if self._loop is None or self._loop.is_closed():
            self._bind_loop()
        self._offered += 1
        if len(self._pending) >= self.settings.queue_size:
            self.dropped += 1
            return
        self._pending.append((kind, features, value))
        self._maybe_fit()

    def _bind_loop(self) -> None:
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is not self._loop:  # a refit in flight on a closed loop will never report back
            self._loop, self._in_flight, self._timer = loop, False, None

    def _maybe_fit(self, arm: bool = True) -> None:
        """Submits a refit when one is due; otherwise (with `arm`) sets a timer for when it will be."""
        if self._in_flight or self._closed or not self._pending:
            return
        now = self.clock()
        due_in = self._last_fit + self.settings.min_interval_s - now
        if due_in <= 0 or self._flush:
            self._submit(now)
        elif arm and self._timer is None and self._loop is not None:
            self._timer = self._loop.call_later(due_in, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._maybe_fit(arm=False)  # the next observation sets a new timer if the clock has not moved enough

    def _submit(self, now: float) -> None:
        self._last_fit = now
        self._flush = False
        while self._pending:
            kind, features, value = self._pending.popleft()
            self._window[kind].append((features, value))
        self._taken = self._offered
        ttft_rows, tpot_rows = tuple(self._window[_TTFT]), tuple(self._window[_TPOT])
        loop = self._loop
        if loop is None:  # no event loop: fit in the caller
            try:
                models = self._fit(ttft_rows, tpot_rows, self._taken)
            except Exception:  # a bad fit must not stop training: keep the old models
                log.exception("latency_predictor_fit_failed")
            else:
                self._publish(models)
            return
        self._in_flight = True
        future = loop.run_in_executor(None, self._fit, ttft_rows, tpot_rows, self._taken)
        future.add_done_callback(self._fitted)

    def _fitted(self, future: asyncio.Future[_Models]) -> None:
        self._in_flight = False
        if future.cancelled():
            return
        error = future.exception()
        if error is not None:  # a bad fit must not stop training: keep the old models
            log.error("latency_predictor_fit_failed", exc_info=error)
        else:
            self._publish(future.result())
        self._maybe_fit()

    def _request_flush(self) -> None:
        if self._pending:  # what a refit in flight already covers needs no other
            self._flush = True
            self._maybe_fit()

    # --- introspection ---------------------------------------------------------------------------------
    @property
    def version(self) -> int:
        """Increases every time new models (or medians) are published."""
        return self._models.version

    @property
    def fit_thread(self) -> int:
        """`threading.get_ident()` of the thread that fitted the current models (0: none yet)."""
        return self._models.fit_thread

    @property
    def trained(self) -> bool:
        return self._models.ttft is not None

    def _ask_for_flush(self) -> None:
        """Has the observations that wait be fitted now, whatever the interval (for the waits below)."""
        loop = self._loop
        if loop is None:
            self._request_flush()
            return
        try:
            loop.call_soon_threadsafe(self._request_flush)
        except RuntimeError:  # the loop is closed: nothing will publish any more
            pass

    def wait_for_version(self, version: int, timeout: float) -> bool:
        """Blocks (not for the event loop: run it in a thread) until models newer than `version` exist;
        observations waiting for a refit are fitted at once."""
        if self._models.version <= version:
            self._ask_for_flush()
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
        part of the published models (or medians); observations waiting for a refit are fitted at once."""
        target = self._offered
        if self._models.consumed < target:
            self._ask_for_flush()
        deadline = time.monotonic() + timeout
        with self._published:
            while self._models.consumed < target:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._published.wait(left)
        return True

    def close(self) -> None:
        """Stops training: later observations are ignored and no refit is submitted; a refit in flight
        finishes in its executor."""
        self._closed = True
        self._pending.clear()
        timer, self._timer = self._timer, None
        if timer is not None:
            try:
                timer.cancel()
            except RuntimeError:
                pass

    # --- the fit (in the executor) ---------------------------------------------------------------------
    def _fit(self, ttft_rows: _Rows, tpot_rows: _Rows, consumed: int) -> _Models:
        s = self.settings
        t0 = time.perf_counter()
        ttft = tpot = None
        if len(ttft_rows) >= s.min_samples:
            ttft = fit_ridge(
                [ttft_vector(f, s.linear) for f, _ in ttft_rows], [v for _, v in ttft_rows], s.alpha, s.quantile
            )
        if len(tpot_rows) >= s.min_samples:
            tpot = fit_ridge(
                [tpot_vector(f, s.linear) for f, _ in tpot_rows], [v for _, v in tpot_rows], s.alpha, s.quantile
            )
        return _Models(
            ttft=ttft,
            tpot=tpot,
            ttft_median=statistics.median(v for _, v in ttft_rows) if ttft_rows else None,
            tpot_median=statistics.median(v for _, v in tpot_rows) if tpot_rows else None,
            fit_thread=threading.get_ident(),
            fit_seconds=time.perf_counter() - t0,
            consumed=consumed,
        )

    # --- event-loop side again -------------------------------------------------------------------------
    def _publish(self, models: _Models) -> None:
        with self._published:
            self._models = replace(models, version=self._models.version + 1)
            self._published.notify_all()
