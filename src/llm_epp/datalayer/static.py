"""Static discovery without Kubernetes: `--endpoints host:port,...` or `--endpoints-file pool.yaml`
(reloaded when the file changes; a broken edit is reported and the last good pool is kept)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from llm_epp.datalayer.datastore import Datastore
from llm_epp.datalayer.filewatch import WatchedFile
from llm_epp.framework.types import EndpointKey, EndpointMetadata, split_host_port

log = logging.getLogger(__name__)

ENGINE_LABEL = "inference.networking.k8s.io/engine-type"
ENGINES = ("vllm", "sglang", "trtllm-serve", "triton-tensorrt-llm")


class EndpointSourceError(ValueError):
    """A bad `--endpoints` value or endpoints file; the message says what and where."""


class _EndpointEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    name: str | None = None
    address: str = Field(min_length=1)
    port: int = Field(ge=1, le=65535)
    labels: dict[str, str] = Field(default_factory=dict)
    engine: str | None = None
    metrics_path: str = Field(default="/metrics", alias="metricsPath")
    metrics_port: int | None = Field(default=None, ge=1, le=65535, alias="metricsPort")


class _EndpointsFile(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    pool_name: str | None = Field(default=None, alias="poolName")
    namespace: str = ""
    endpoints: list[_EndpointEntry] = Field(default_factory=list)


def parse_endpoint_list(value: str, namespace: str = "") -> list[EndpointMetadata]:
    """Parse `127.0.0.1:8001,127.0.0.1:8002` into endpoint metadata named after their address."""
    out: list[EndpointMetadata] = []
    seen: set[str] = set()
    for i, raw in enumerate(value.split(",")):
        item = raw.strip()
        if not item:
            continue
        try:
            host, port = split_host_port(item)
        except ValueError:
            raise EndpointSourceError(f"--endpoints item {i + 1} {item!r}: the port is not a number") from None
        if port is None or not host:
            raise EndpointSourceError(f"--endpoints item {i + 1} {item!r}: expected host:port, e.g. 10.0.0.5:8000")
        if not 1 <= port <= 65535:
            raise EndpointSourceError(f"--endpoints item {i + 1} {item!r}: port must be 1-65535")
        if item in seen:
            raise EndpointSourceError(f"--endpoints lists {item} twice")
        seen.add(item)
        out.append(EndpointMetadata(EndpointKey(namespace, item), host, port))
    if not out:
        raise EndpointSourceError("--endpoints is empty; give host:port pairs separated by commas")
    return out


def parse_endpoints_file(text: str, source: str) -> tuple[str | None, list[EndpointMetadata]]:
    try:
        raw: Any = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise EndpointSourceError(f"{source}: not valid YAML: {e}") from None
    if raw is None:
        raw = {}
    if isinstance(raw, list):
        raw = {"endpoints": raw}
    try:
        doc = _EndpointsFile.model_validate(raw)
    except ValidationError as err:
        problems = []
        for detail in err.errors():
            loc = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in detail["loc"]).lstrip(".")
            msg = "unknown field" if detail["type"] == "extra_forbidden" else detail["msg"]
            problems.append(f"{loc}: {msg}")
        raise EndpointSourceError(f"{source}: " + "; ".join(problems)) from None
    out: list[EndpointMetadata] = []
    names: set[str] = set()
    for i, entry in enumerate(doc.endpoints):
        name = entry.name or f"{entry.address}:{entry.port}"
        if name in names:
            raise EndpointSourceError(f"{source}: endpoints[{i}].name {name!r} is used twice")
        names.add(name)
        engine = entry.engine or entry.labels.get(ENGINE_LABEL) or "vllm"
        if engine not in ENGINES:
            raise EndpointSourceError(f"{source}: endpoints[{i}].engine {engine!r} is not one of {', '.join(ENGINES)}")
        out.append(
            EndpointMetadata(
                EndpointKey(doc.namespace, name),
                entry.address,
                entry.port,
                labels=dict(entry.labels),
                engine=engine,
                metrics_path=entry.metrics_path,
                metrics_port=entry.metrics_port,
            )
        )
    return doc.pool_name, out


class EndpointsFileWatcher(WatchedFile[tuple[str | None, list[EndpointMetadata]]]):
    """Loads an endpoints file into the datastore and reloads it when it changes."""

    kind = "endpoints_file"
    error = EndpointSourceError

    def __init__(self, path: str | Path, datastore: Datastore, interval: float = 1.0) -> None:
        super().__init__(path, interval)
        self.datastore = datastore

    def parse(self, text: str, source: str) -> tuple[str | None, list[EndpointMetadata]]:
        return parse_endpoints_file(text, source)

    def apply(self, value: tuple[str | None, list[EndpointMetadata]], initial: bool) -> str:
        """The file's `poolName`, when it has one, names the pool (in the `inference_pool_*` gauges); a file
        without one leaves the name as it was."""
        pool, endpoints = value
        if pool:
            self.datastore.pool_name = pool
        self.datastore.replace_all(endpoints)
        return f"endpoints={len(endpoints)}" + (f" pool={pool}" if pool else "")
