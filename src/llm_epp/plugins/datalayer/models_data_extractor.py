"""models-data-extractor

Scheduling intent:
    Turn an endpoint's `/v1/models` answer (from `models-data-source`) into the endpoint attribute
    `/v1/models` (producer `models-data-extractor`): the models the endpoint serves, each with its `id` and,
    for a LoRA adapter, the `parent` base model.

Inputs consumed:
    The JSON body `{"object": "list", "data": [{"id": ..., "parent": ..., "owned_by": ..., ...}]}`.
    Entries without a string `id` are skipped; at most 4096 entries are kept.

Configuration:
    No parameters.

"""

from __future__ import annotations

import json
from dataclasses import dataclass

from llm_epp.framework import EndpointMetadata, Handle, PluginParams, TypedName
from llm_epp.plugins.datalayer._attributes import AttributeExtraction, attribute_key

TYPE = "models-data-extractor"
KEY = attribute_key("/v1/models", TYPE)
MAX_MODELS = 4096


class Params(PluginParams):
    pass


@dataclass(frozen=True, slots=True)
class ModelData:
    id: str
    parent: str = ""
    object: str = ""
    owned_by: str = ""
    created: int = 0


def parse_models(body: bytes) -> tuple[ModelData, ...]:
    """The models of a `/v1/models` body. Raises ValueError when it is not that JSON shape."""
    try:
        doc = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"not JSON: {e}") from None
    data = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(data, list):
        raise ValueError('expected an object with a "data" list')
    out = []
    for item in data[:MAX_MODELS]:
        if not isinstance(item, dict) or not isinstance(item.get("id"), str):
            continue

        def text(k: str, item: dict[str, object] = item) -> str:
            v = item.get(k)
            return v if isinstance(v, str) else ""

        created = item.get("created")
        out.append(
            ModelData(
                item["id"],
                text("parent"),
                text("object"),
                text("owned_by"),
                created if isinstance(created, int) and not isinstance(created, bool) else 0,
            )
        )
    return tuple(out)


class ModelsDataExtractor:
    def __init__(self, name: str = TYPE) -> None:
        self._typed_name = TypedName(TYPE, name)

    @property
    def typed_name(self) -> TypedName:
        return self._typed_name

    def extract_body(self, body: bytes, endpoint: EndpointMetadata) -> AttributeExtraction:
        try:
            models = parse_models(body)
        except ValueError as e:
            return AttributeExtraction(problems=(f"/v1/models of {endpoint.key}: {e}",))
        return AttributeExtraction({KEY: models})


def factory(name: str, params: Params, handle: Handle) -> ModelsDataExtractor:
    return ModelsDataExtractor(name)
