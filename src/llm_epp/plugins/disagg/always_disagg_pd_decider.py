"""always-disagg-pd-decider

Scheduling intent:
    A decider for `disagg-profile-handler` (`deciders.prefill`) / `pd-profile-handler`
    (`deciderPluginName`): every request gets a separate prefill stage.

Inputs consumed:
    None.

Configuration:
    No parameters. Referenced by name from a profile handler; it runs no hook of its own.
"""

from __future__ import annotations

from llm_epp.framework import CycleState, Endpoint, Handle, InferenceRequest, PluginParams, TypedName

TYPE = "always-disagg-pd-decider"


class Params(PluginParams):
    pass


class AlwaysDisaggPdDecider:
    def __init__(self, name: str = TYPE) -> None:
        self._typed_name = TypedName(TYPE, name)

    @property
    def typed_name(self) -> TypedName:
        return self._typed_name

    def disaggregate(self, cycle: CycleState, request: InferenceRequest, endpoint: Endpoint | None) -> bool:
        return True


def factory(name: str, params: Params, handle: Handle) -> AlwaysDisaggPdDecider:
    return AlwaysDisaggPdDecider(name)
