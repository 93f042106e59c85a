"""Static discovery without Kubernetes: `--endpoints host:port,...` or `--endpoints-file pool.yaml`
(reloaded when the file changes; a broken edit is reported and the last good pool is kept)."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from llm_epp.datalayer.datastore import Datastore
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


class EndpointsFileWatcher:
    """Loads an endpoints file into the datastore and reloads it when its modification time changes."""

    def __init__(self, path: str | Path, datastore: Datastore, interval: float = 1.0) -> None:
        self.path = Path(path)
        self.datastore = datastore
        self.interval = interval
        self._stamp: tuple[float, int] | None = None

    def load(self) -> None:
        """Initial load: errors propagate (a bad file at startup is fatal)."""
        self._stamp = self._stat()
        pool, endpoints = self._read()
        if pool and not self.datastore.pool_name:
            self.datastore.pool_name = pool
        self.datastore.replace_all(endpoints)

    def _stat(self) -> tuple[float, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_mtime, st.st_size)

    def _read(self) -> tuple[str | None, Sequence[EndpointMetadata]]:
        try:
            text = self.path.read_text()
        except OSError as e:
            raise EndpointSourceError(f"{self.path}: cannot read: {e.strerror}") from None
        return parse_endpoints_file(text, str(self.path))

    def poll_once(self) -> bool:
        """Reload if the file changed; returns True when the pool was replaced."""
        stamp = self._stat()
        if stamp == self._stamp:
            return False
        self._stamp = stamp
        if stamp is None:
            log.error("endpoints_file_missing path=%s; keeping the last good pool", self.path)
            return False
        try:
            _, endpoints = self._read()
        except EndpointSourceError as e:
            log.error("endpoints_file_invalid %s; keeping the last good pool", e)
            return False
        self.datastore.replace_all(endpoints)
        log.info("endpoints_file_reloaded path=%s endpoints=%d", self.path, len(endpoints))
        return True

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            self.poll_once()
