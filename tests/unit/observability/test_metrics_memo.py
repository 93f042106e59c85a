"""The recorder's label memos change no sample: recorders that remember how raw values resolved (with known
models that can say they are unchanged, and with a plain mutable set, which cannot) expose exactly what one
that resolves every value again exposes, over random sequences of requests, changes of the known models,
learnt served models, sweeps and fairness-ID pressure."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest

from llm_epp.datalayer.objectives import ObjectivesConfig, ObjectivesStore, RewriteRule
from llm_epp.framework.types import Endpoint, EndpointKey, EndpointMetadata, Metrics
from llm_epp.observability.known_models import ConfiguredAndServedModels
from llm_epp.observability.metrics import PrometheusRecorder

MODELS = ("llama", "qwen", "mistral", "x" * 20, "")
FAIRNESS = ("", "team-a", "team-b", "team-c")


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class _Unremembering(PrometheusRecorder):
    """The reference: forgets its memos before every resolution, so every value is resolved again."""

    def _series(self, model: str, target_model: str, fairness_id: str, priority: int | str) -> Any:
        self._forget_memos()
        return super()._series(model, target_model, fairness_id, priority)

    def _model(self, model: str) -> str:
        self._forget_memos()
        return super()._model(model)

    def scheduler_attempt(self, success: bool, target_model: str, pod_name: str, namespace: str, port: str) -> None:
        self._forget_memos()
        super().scheduler_attempt(success, target_model, pod_name, namespace, port)


class _Versioned:
    """A known-models set that tells when it changes."""

    def __init__(self) -> None:
        self.names: set[str] = set()
        self.version = 0

    def __contains__(self, model: object, /) -> bool:
        return model in self.names

    def generation(self) -> int:
        return self.version


_op = st.one_of(
    st.tuples(
        st.just("request"),
        st.sampled_from(MODELS),
        st.sampled_from(MODELS),
        st.sampled_from(FAIRNESS),
        st.integers(min_value=-1, max_value=1),
        st.booleans(),
    ),
    st.tuples(st.just("know"), st.sampled_from(MODELS[:3])),
    st.tuples(st.just("forget"), st.sampled_from(MODELS[:3])),
    st.tuples(st.just("sweep"), st.floats(min_value=0.0, max_value=15.0)),
    st.tuples(st.just("error"), st.sampled_from(MODELS), st.sampled_from(FAIRNESS)),
)


def _recorder(known: object, clock: _Clock, kind: type[PrometheusRecorder] = PrometheusRecorder) -> PrometheusRecorder:
    return kind(
        CollectorRegistry(),
        known_models=known,  # type: ignore[arg-type]
        series_ttl=10,
        clock=clock,
        max_served_models=2,
        max_fairness_ids=2,
        max_label_length=12,
    )


def _apply(rec: PrometheusRecorder, op: tuple[object, ...]) -> None:
    kind = op[0]
    if kind == "request":
        _, model, target, fairness, priority, usage = op
        assert isinstance(model, str) and isinstance(target, str) and isinstance(fairness, str)
        assert isinstance(priority, int)
        rec.scheduler_attempt(True, target, "pod", "ns", "8000")
        rec.request_scheduled(model, target, priority, fairness_id=fairness)
        rec.running_requests(model, 1, target_model=target, fairness_id=fairness, priority=priority)
        rec.model_rewrite("rule", model, target)
        rec.running_requests(model, -1, target_model=target, fairness_id=fairness, priority=priority)
        tokens = 5 if usage else None
        rec.request_completed(model, target, 0.5, 100, 20, tokens, tokens, None, fairness_id=fairness)
        rec.request_ttft(model, target, 0.1, streaming=True, fairness_id=fairness, priority=priority)
    elif kind == "error":
        _, model, fairness = op
        assert isinstance(model, str) and isinstance(fairness, str)
        rec.request_error(model, model, "500", fairness_id=fairness)


@settings(max_examples=60, deadline=None)
@given(ops=st.lists(_op, max_size=40))
def test_memos_change_no_sample(ops: list[tuple[object, ...]]) -> None:
    clock = _Clock()
    versioned = _Versioned()
    plain: set[str] = set()  # no generation: only answers that do not depend on it are remembered
    reference = _recorder(versioned, clock, _Unremembering)
    recorders = [_recorder(versioned, clock), _recorder(plain, clock)]
    for op in ops:
        if op[0] == "know":
            versioned.names.add(str(op[1]))
            versioned.version += 1
            plain.add(str(op[1]))
        elif op[0] == "forget":
            versioned.names.discard(str(op[1]))
            versioned.version += 1
            plain.discard(str(op[1]))
        elif op[0] == "sweep":
            delta = op[1]
            assert isinstance(delta, float)
            clock.now += delta
            swept = reference.sweep()
            assert [r.sweep() for r in recorders] == [swept, swept]
        else:
            for r in (reference, *recorders):
                _apply(r, op)
        want = generate_latest(reference.registry)
        assert [generate_latest(r.registry) for r in recorders] == [want, want]


def _endpoint(models: frozenset[str]) -> Endpoint:
    return Endpoint(EndpointMetadata(EndpointKey("ns", "a"), "127.0.0.1", 8000), Metrics(active_models=models))


def test_generation_follows_rules_and_snapshots_naming_other_models() -> None:
    store = ObjectivesStore(ObjectivesConfig())
    snapshot = [(_endpoint(frozenset({"lora-x"})),)]
    known = ConfiguredAndServedModels(store, lambda: snapshot[0])
    first = known.generation()
    assert first is not None and known.generation() == first
    snapshot[0] = (_endpoint(frozenset({"lora-x"})),)  # new snapshot, same names (metrics update)
    assert known.generation() == first and "lora-x" in known
    snapshot[0] = (_endpoint(frozenset({"lora-y"})),)
    second = known.generation()
    assert second != first and "lora-y" in known and "lora-x" not in known
    store.replace(ObjectivesConfig(exact_rules={"chat": RewriteRule("r", (("chat-v1", 1),))}))
    assert known.generation() != second and "chat" in known
    assert ConfiguredAndServedModels(store, lambda: [_endpoint(frozenset())]).generation() is None  # mutable


def test_a_model_becoming_known_is_labelled_at_once_through_the_live_source() -> None:
    store = ObjectivesStore(ObjectivesConfig())
    snapshot = [(_endpoint(frozenset()),)]
    rec = PrometheusRecorder(CollectorRegistry(), known_models=ConfiguredAndServedModels(store, lambda: snapshot[0]))
    rec.request_scheduled("lora-x", "lora-x", 0)
    rec.request_scheduled("lora-x", "lora-x", 0)  # remembered as `other`
    snapshot[0] = (_endpoint(frozenset({"lora-x"})),)  # a pod loads the adapter
    rec.request_scheduled("lora-x", "lora-x", 0)
    get = rec.registry.get_sample_value
    total = "inference_objective_request_total"
    assert get(total, {"model_name": "other", "target_model_name": "other", "priority": "0"}) == 2
    assert get(total, {"model_name": "lora-x", "target_model_name": "lora-x", "priority": "0"}) == 1


def test_an_attempt_for_a_model_becoming_known_is_labelled_at_once() -> None:
    store = ObjectivesStore(ObjectivesConfig())
    snapshot = [(_endpoint(frozenset()),)]
    rec = PrometheusRecorder(CollectorRegistry(), known_models=ConfiguredAndServedModels(store, lambda: snapshot[0]))
    rec.scheduler_attempt(True, "lora-x", "pod", "ns", "8000")
    rec.scheduler_attempt(True, "lora-x", "pod", "ns", "8000")  # remembered as `other`
    snapshot[0] = (_endpoint(frozenset({"lora-x"})),)  # a pod loads the adapter
    rec.scheduler_attempt(True, "lora-x", "pod", "ns", "8000")
    get = rec.registry.get_sample_value
    attempts = "inference_extension_scheduler_attempts_total"
    labels = {"status": "success", "pod_name": "pod", "namespace": "ns", "port": "8000"}
    assert get(attempts, {**labels, "target_model_name": "other"}) == 2
    assert get(attempts, {**labels, "target_model_name": "lora-x"}) == 1


def test_memos_stay_bounded_under_invented_names() -> None:
    rec = PrometheusRecorder(CollectorRegistry(), known_models=frozenset({"m"}))
    for i in range(10_000):
        rec.request_scheduled(f"invented-{i}", f"invented-{i}", 0)
        rec.scheduler_attempt(True, f"invented-{i}", "pod", "ns", "8000")
    assert len(rec._series_memo) <= 4096 and len(rec._other_models) <= 4096 and len(rec._attempt_memo) <= 4096
    assert (
        rec.registry.get_sample_value(
            "inference_objective_request_total", {"model_name": "other", "target_model_name": "other", "priority": "0"}
        )
        == 10_000
    )
