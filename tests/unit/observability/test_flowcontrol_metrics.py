"""Flow-control metric families: GIE's and llm-d-router's names side by side, bounded client labels."""

from __future__ import annotations

import asyncio
import dataclasses

from prometheus_client import CollectorRegistry, generate_latest

from llm_epp.flowcontrol import FlowController, QueueOutcome
from llm_epp.flowcontrol.config import EvictionPolicies
from llm_epp.framework.flowpolicy import EvictionItem
from llm_epp.observability.flowcontrol_metrics import OTHER, QUEUE_DURATION_BUCKETS, FlowControlMetrics
from llm_epp.plugins.flowcontrol.priority_then_time_eviction_order_policy import PriorityThenTimeEvictionOrderPolicy
from llm_epp.plugins.flowcontrol.sheddable_eviction_filter import SheddableEvictionFilter
from tests.unit.builders import request
from tests.unit.flowcontrol.support import Saturation, config, controller, req, settle_loop


def _value(reg: CollectorRegistry, name: str, **labels: str) -> float:
    v = reg.get_sample_value(name, labels)
    return 0.0 if v is None else v


async def test_a_queued_then_dispatched_request_is_recorded_under_both_names() -> None:
    reg = CollectorRegistry()
    sat = Saturation(1.0)
    fc = controller(sat)
    fc = FlowController(fc.config, sat, fc._endpoints, FlowControlMetrics(reg, "pool-a"), poll_interval=0.01)
    task = asyncio.create_task(fc.enqueue_and_wait(req("a", fairness="tenant-1", size=42)))
    await settle_loop()
    flow = {"fairness_id": "tenant-1", "priority": "0", "inference_pool": "pool-a"}
    models = {"model_name": "m", "target_model_name": "m"}
    for prefix in ("inference_extension_", "llm_d_epp_"):
        assert _value(reg, f"{prefix}flow_control_queue_size", **flow, **models) == 1
        assert _value(reg, f"{prefix}flow_control_queue_bytes", **flow, **models) == 42
        assert (
            _value(
                reg,
                f"{prefix}flow_control_request_enqueue_duration_seconds_count",
                fairness_id="tenant-1",
                priority="0",
                outcome="NotYetFinalized",
            )
            == 1
        )
    assert _value(reg, "inference_extension_flow_control_pool_saturation", inference_pool="pool-a") == 1.0
    assert _value(reg, "llm_d_epp_flow_control_pool_saturation", inference_pool="pool-a", stage="effective") == 1.0
    sat.value = 0.0
    (await task).settle()
    for prefix in ("inference_extension_", "llm_d_epp_"):
        assert _value(reg, f"{prefix}flow_control_queue_size", **flow, **models) == 0
        assert _value(reg, f"{prefix}flow_control_queue_bytes", **flow, **models) == 0
        done = {**flow, **models, "outcome": "Dispatched"}
        assert _value(reg, f"{prefix}flow_control_request_queue_duration_seconds_count", **done) == 1
        assert _value(reg, f"{prefix}flow_control_dispatch_cycle_duration_seconds_count") >= 1
    text = generate_latest(reg).decode()
    assert f'le="{QUEUE_DURATION_BUCKETS[-1]}"' in text


async def test_capacity_rejections_are_counted_with_their_outcome() -> None:
    reg = CollectorRegistry()
    fc = controller(Saturation(1.0), config(max_requests=1))
    fc = FlowController(fc.config, fc.saturation, fc._endpoints, FlowControlMetrics(reg, "p"))
    task = asyncio.create_task(fc.enqueue_and_wait(req("a")))
    await settle_loop()
    try:
        await fc.enqueue_and_wait(req("b"))
    except Exception:
        pass
    labels = {"fairness_id": "default-flow", "priority": "0", "outcome": QueueOutcome.REJECTED_CAPACITY.value}
    assert _value(reg, "inference_extension_flow_control_request_enqueue_duration_seconds_count", **labels) == 1
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    cancelled = {
        "fairness_id": "default-flow",
        "priority": "0",
        "inference_pool": "p",
        "model_name": "m",
        "target_model_name": "m",
        "outcome": "EvictedContextCancelled",
    }
    assert _value(reg, "inference_extension_flow_control_request_queue_duration_seconds_count", **cancelled) == 1


def test_client_chosen_label_values_are_bounded() -> None:
    reg = CollectorRegistry()
    m = FlowControlMetrics(reg, "p", max_label_values=3)
    for i in range(50):
        r = dataclasses.replace(request(model=f"model-{i}"), fairness_id=f"tenant-{i}", size_bytes=1)
        m.queue_changed(r, 1, 1)
    series = [
        s for fam in reg.collect() if fam.name == "inference_extension_flow_control_queue_size" for s in fam.samples
    ]
    assert len(series) <= 4 * 4  # three kept values (plus `other`) per label
    assert (
        _value(
            reg,
            "inference_extension_flow_control_queue_size",
            fairness_id=OTHER,
            priority="0",
            inference_pool="p",
            model_name=OTHER,
            target_model_name=OTHER,
        )
        == 47
    )


async def test_an_eviction_is_recorded_in_the_revocation_families() -> None:
    reg = CollectorRegistry()
    sat = Saturation(1.0)
    cfg = dataclasses.replace(
        config(), eviction=EvictionPolicies(PriorityThenTimeEvictionOrderPolicy(), SheddableEvictionFilter())
    )
    fc = FlowController(cfg, sat, list, FlowControlMetrics(reg, "pool-a"), poll_interval=0.01)
    assert fc.evictor is not None
    signal = fc.evictor.track("h", EvictionItem("b", -1, fc.now(), "10.0.0.1:8000", req("b", priority=-1)))
    task = asyncio.create_task(fc.enqueue_and_wait(req("u", priority=10)))
    assert signal is not None
    await asyncio.wait_for(signal, 1)
    pool = {"inference_pool": "pool-a"}
    assert _value(reg, "llm_d_epp_flow_control_revocations_issued_total", priority="10", **pool) == 1
    assert _value(reg, "llm_d_epp_flow_control_pending_reclaim", **pool) == 1.0  # saturation 1.0 / 1 request
    assert _value(reg, "llm_d_epp_flow_control_reclaim_target", **pool) == 0.0
    fc.evictor.untrack("h")
    assert _value(reg, "llm_d_epp_flow_control_revocations_total", outcome="confirmed", **pool) == 1
    assert _value(reg, "llm_d_epp_flow_control_revocation_confirmation_seconds_count", **pool) == 1
    task.cancel()
    await settle_loop()
