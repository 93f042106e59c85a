"""Small plugins registered next to the built-in ones, to exercise loader rules no built-in type needs yet:
a parser, producers and consumers of made-up data keys."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import Field

from llm_epp.framework import (
    CycleState,
    Endpoint,
    EndpointKey,
    Handle,
    InferenceRequest,
    PluginParams,
    Registry,
    ScorerCategory,
    TypedName,
)
from llm_epp.framework.parsing import Claims, ParsedRequest, ResponseReader
from llm_epp.framework.types import RequestBody
from llm_epp.plugins import builtin_registry


class _Named:
    TYPE = ""

    def __init__(self, name: str) -> None:
        self._typed_name = TypedName(self.TYPE, name)

    @property
    def typed_name(self) -> TypedName:
        return self._typed_name


class NoParams(PluginParams):
    pass


class JsonParser(_Named):
    """A parser claiming one path."""

    TYPE = "test-json-parser"

    def claims(self) -> Claims:
        return Claims(paths=("v1/test",))

    def parse_request(self, path: str, headers: Mapping[str, str], body: bytes) -> ParsedRequest:
        return ParsedRequest(RequestBody(payload={}))

    def rewrite_model(self, parsed: ParsedRequest, body: bytes, model: str) -> bytes | None:
        return None

    def response_reader(self, parsed: ParsedRequest, headers: Mapping[str, str]) -> ResponseReader | None:
        return None


class ModelParams(PluginParams):
    model: str  # required


class ModelParser(JsonParser):
    TYPE = "test-model-parser"


class ProducerParams(PluginParams):
    scale: int = Field(default=1, alias="scale")


class ColourProducer(_Named):
    """PrepareData producing `colour` (its default producer in the test registry)."""

    TYPE = "test-colour-producer"
    produces = frozenset({"colour"})
    consumes: frozenset[str] = frozenset()

    def __init__(self, name: str, params: ProducerParams) -> None:
        super().__init__(name)
        self.params = params

    async def prepare_data(self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> None:
        return None


class ShadeProducer(_Named):
    """PrepareData consuming `colour` and producing `shade`: a producer that itself needs a producer."""

    TYPE = "test-shade-producer"
    produces = frozenset({"shade"})
    consumes = frozenset({"colour"})

    async def prepare_data(self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> None:
        return None


class ConsumerParams(ProducerParams):
    """Extends the producer's parameters, as prefix-cache-scorer's do: the loader passes them on."""


class ShadeScorer(_Named):
    TYPE = "test-shade-scorer"
    category = ScorerCategory.AFFINITY
    consumes = frozenset({"shade"})

    def score(
        self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Mapping[EndpointKey, float]:
        return {e.key: 0.0 for e in endpoints}


class ColourScorer(ShadeScorer):
    TYPE = "test-colour-scorer"
    consumes = frozenset({"colour"})


class ScentScorer(ShadeScorer):
    """Consumes a key nothing produces."""

    TYPE = "test-scent-scorer"
    consumes = frozenset({"scent"})


class LateProducer(ShadeScorer):
    """A scorer that produces `taste`: it runs while scheduling, too late for a PrepareData consumer."""

    TYPE = "test-late-producer"
    produces = frozenset({"taste"})
    consumes: frozenset[str] = frozenset()


class TasteConsumer(_Named):
    TYPE = "test-taste-consumer"
    produces: frozenset[str] = frozenset()
    consumes = frozenset({"taste"})

    async def prepare_data(self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> None:
        return None


class PingProducer(_Named):
    TYPE = "test-ping"
    produces = frozenset({"ping"})
    consumes = frozenset({"pong"})

    async def prepare_data(self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> None:
        return None


class PongProducer(PingProducer):
    TYPE = "test-pong"
    produces = frozenset({"pong"})
    consumes = frozenset({"ping"})


class RefParams(PluginParams):
    target: str = ""


class Referrer(_Named):
    """Names another plugin in its parameters (as P/D profile handlers name their deciders)."""

    TYPE = "test-referrer"

    async def prepare_data(self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> None:
        return None


def _simple(cls: Any) -> Any:
    def factory(name: str, params: NoParams, handle: Handle) -> Any:
        return cls(name)

    return factory


def compat_registry() -> Registry:
    """The built-in registry plus the plugins above; `colour` and `shade` have default producers."""
    registry = builtin_registry()
    registry.register(JsonParser.TYPE, NoParams, _simple(JsonParser))
    registry.register(ColourProducer.TYPE, ProducerParams, lambda name, params, handle: ColourProducer(name, params))
    registry.register(ShadeProducer.TYPE, NoParams, _simple(ShadeProducer))
    registry.register(ShadeScorer.TYPE, NoParams, _simple(ShadeScorer))
    registry.register(ColourScorer.TYPE, ConsumerParams, lambda name, params, handle: ColourScorer(name))
    registry.register(ScentScorer.TYPE, NoParams, _simple(ScentScorer))
    registry.register(LateProducer.TYPE, NoParams, _simple(LateProducer))
    registry.register(TasteConsumer.TYPE, NoParams, _simple(TasteConsumer))
    registry.register(PingProducer.TYPE, NoParams, _simple(PingProducer))
    registry.register(PongProducer.TYPE, NoParams, _simple(PongProducer))
    registry.register(ModelParser.TYPE, ModelParams, lambda name, params, handle: ModelParser(name))
    registry.register(Referrer.TYPE, RefParams, lambda name, params, handle: Referrer(name))
    registry.set_default_producer("colour", ColourProducer.TYPE)
    registry.set_default_producer("shade", ShadeProducer.TYPE)
    return registry
