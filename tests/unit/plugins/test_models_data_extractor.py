"""Tests for models-data-extractor (pure part): a vLLM `/v1/models` answer becomes the endpoint's model list."""

from __future__ import annotations

import pytest

from llm_epp.framework import EndpointKey, EndpointMetadata
from llm_epp.plugins.datalayer.models_data_extractor import KEY, ModelData, ModelsDataExtractor, parse_models

# vLLM's answer with one LoRA adapter loaded
VLLM = b"""{"object":"list","data":[
 {"id":"meta-llama/Llama-3.1-8B-Instruct","object":"model","created":1764547200,"owned_by":"vllm",
  "root":"meta-llama/Llama-3.1-8B-Instruct","parent":null,"max_model_len":8192,"permission":[]},
 {"id":"sql-lora","object":"model","created":1764547200,"owned_by":"vllm","root":"/adapters/sql",
  "parent":"meta-llama/Llama-3.1-8B-Instruct","max_model_len":null,"permission":[]}]}"""
MD = EndpointMetadata(EndpointKey("llm", "vllm-0"), "10.0.0.5", 8000)


def test_parse_vllm_listing() -> None:
    assert parse_models(VLLM) == (
        ModelData("meta-llama/Llama-3.1-8B-Instruct", "", "model", "vllm", 1764547200),
        ModelData("sql-lora", "meta-llama/Llama-3.1-8B-Instruct", "model", "vllm", 1764547200),
    )
    assert ModelsDataExtractor().extract_body(VLLM, MD).values[KEY] == parse_models(VLLM)
    assert KEY == "/v1/models/models-data-extractor"


def test_entries_without_an_id_are_skipped() -> None:
    assert parse_models(b'{"data":[{"id":3},{"parent":"x"},"s",{"id":"ok"}]}') == (ModelData("ok"),)


@pytest.mark.parametrize("body", [b"<html>", b"[]", b'{"data":{}}', b"\xff"], ids=["html", "list", "data-map", "bytes"])
def test_bad_bodies_are_problems(body: bytes) -> None:
    result = ModelsDataExtractor().extract_body(body, MD)
    assert not result.values
    assert result.problems and "llm/vllm-0" in result.problems[0]
