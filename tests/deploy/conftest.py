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


# Flags the chart renders for some values that `llm-epp serve` is still gaining (they exist upstream). A
# render may pass them; the chart's default render must not. Matched with fnmatch against the flag name.
FLAGS_IN_FLIGHT: tuple[str, ...] = ()


def parse_epp_args(args: list[str], *, allow_in_flight: bool = False) -> Any:
    """Parses container args with the real `llm-epp` parser and runs its option checks; returns the
    namespace. With allow_in_flight, flags of FLAGS_IN_FLIGHT that the parser does not know yet are left
    out (any other unknown flag still fails)."""
    from fnmatch import fnmatch

    from llm_epp import cli

    parser = cli.build_parser()
    ns, unknown = parser.parse_known_args(args)
    if unknown:
        names = [u.split("=", 1)[0] for u in unknown]
        stray = [n for n in names if not (allow_in_flight and any(fnmatch(n, p) for p in FLAGS_IN_FLIGHT))]
        assert not stray, f"llm-epp serve does not accept {stray} (args {args})"
    problems = cli.check_options(cli._options(ns))
    assert not problems, problems
    return ns
