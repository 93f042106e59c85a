"""Where the core reports what happened: plugin and scheduler timings, plugin failures and per-request
outcomes. The observability package implements it with Prometheus (reference metric names); tests use
`NullRecorder` or a fake. Implementations must be cheap: these are called on the hot path."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from llm_epp.framework.plugin import TypedName


class Recorder(Protocol):
    # --- scheduling core -------------------------------------------------------------------------
    def plugin_duration(self, extension_point: str, plugin: TypedName, seconds: float) -> None: ...

    def plugin_error(self, extension_point: str, plugin: TypedName) -> None: ...

    def scheduler_duration(self, seconds: float) -> None: ...

    def score_out_of_range(self, plugin: TypedName) -> None: ...

    # --- per request (labels as in the reference: model_name, target_model_name, ...) ---------------
    def scheduler_attempt(self, success: bool, target_model: str, pod_name: str, namespace: str, port: str) -> None: ...

    def request_scheduled(self, model: str, target_model: str, priority: int) -> None: ...

    # --- prefix-cache index (reference: inference_extension_prefix_indexer_*) ---------------------------
    def prefix_index_size(self, entries: int) -> None: ...

    def prefix_match(self, hit_ratio: float, hit_chars: int) -> None: ...

    def model_rewrite(self, rule: str, model: str, target_model: str) -> None: ...

    def request_error(self, model: str, target_model: str, error_code: str) -> None: ...

    def running_requests(self, model: str, delta: int) -> None: ...

    # --- disaggregation (reference: llm_d_epp_disagg_decision_total, llm_d_epp_pd_decision_total) -------
    def disagg_decision(self, plugin: TypedName, model: str, decision_type: str) -> None: ...

    def pd_decision(self, plugin: TypedName, model: str, decision_type: str) -> None: ...

    def rollout_strict_no_match(self, plugin: TypedName, selector: str) -> None:
        """A strict header selector of a rollout screener matched no endpoint (the request failed closed)."""
        ...

    def rollout_revision_shares(self, plugin: TypedName, mode: str, shares: Mapping[str, float]) -> None:
        """A rollout screener's current traffic share per observed revision (0 for an incomplete one); a
        revision missing from `shares` is no longer observed."""
        ...

    def request_completed(
        self,
        model: str,
        target_model: str,
        duration_s: float,
        request_bytes: int,
        response_bytes: int,
        prompt_tokens: int | None,
        completion_tokens: int | None,
        cached_tokens: int | None,
    ) -> None: ...


class NullRecorder:
    """Discards everything."""

    def plugin_duration(self, extension_point: str, plugin: TypedName, seconds: float) -> None:
        pass

    def plugin_error(self, extension_point: str, plugin: TypedName) -> None:
        pass

    def scheduler_duration(self, seconds: float) -> None:
        pass

    def score_out_of_range(self, plugin: TypedName) -> None:
        pass

    def scheduler_attempt(self, success: bool, target_model: str, pod_name: str, namespace: str, port: str) -> None:
        pass

    def request_scheduled(self, model: str, target_model: str, priority: int) -> None:
        pass

    def prefix_index_size(self, entries: int) -> None:
        pass

    def prefix_match(self, hit_ratio: float, hit_chars: int) -> None:
        pass

    def model_rewrite(self, rule: str, model: str, target_model: str) -> None:
        pass

    def request_error(self, model: str, target_model: str, error_code: str) -> None:
        pass

    def running_requests(self, model: str, delta: int) -> None:
        pass

    def disagg_decision(self, plugin: TypedName, model: str, decision_type: str) -> None:
        pass

    def pd_decision(self, plugin: TypedName, model: str, decision_type: str) -> None:
        pass

    def rollout_strict_no_match(self, plugin: TypedName, selector: str) -> None:
        pass

    def rollout_revision_shares(self, plugin: TypedName, mode: str, shares: Mapping[str, float]) -> None:
        pass

    def request_completed(
        self,
        model: str,
        target_model: str,
        duration_s: float,
        request_bytes: int,
        response_bytes: int,
        prompt_tokens: int | None,
        completion_tokens: int | None,
        cached_tokens: int | None,
    ) -> None:
        pass
