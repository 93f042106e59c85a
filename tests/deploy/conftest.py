"""Shared helpers for the deployment-asset tests (chart, manifests, examples, image, dashboard)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml

from tests.deploy.render_assets import ROOT

KUBE_VERSION = "1.33.0"
POOL_SCHEMA = json.loads((Path(__file__).parent / "inferencepool-v1.schema.json").read_text())


def validate_object(obj: dict[str, Any]) -> bool:
    """Validates one object; returns False when no schema exists for its kind (CRDs of other projects)."""
    if obj.get("apiVersion") == "inference.networking.k8s.io/v1" and obj.get("kind") == "InferencePool":
        jsonschema.validate(obj, POOL_SCHEMA)
        return True
    try:
        kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)
    except kubernetes_validate.SchemaNotFoundError:
        return False
    return True


def load_yaml_docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT
