"""file-discovery

Scheduling intent:
    Discover the pool's endpoints from a YAML (or JSON) file instead of a Kubernetes InferencePool: for
    deployments without a cluster (bare metal, Slurm, Ray, a laptop). Named by `dataLayer.discovery`; the
    EPP then starts without Kubernetes discovery, as the reference does.

Inputs consumed:
    The file at `path`: `endpoints: [{name, namespace, address, port, labels}]`. `name` (required), `address`
    (required, an IPv4 literal), `port` (required, 1-65535, a string as upstream writes it, or a number),
    `namespace` (default "default"), `labels` (map, default empty). The file is capped at 1 MiB. An entry
    that is invalid is skipped and logged; the others load. A file that cannot be read or parsed at start
    stops the EPP; on a reload the last good endpoints stay.

Configuration:
    path (string, required): the endpoints file.
    watchFile (bool, default false): reload the file when it changes (checked every second by modification
        time and size, which also catches atomic renames and ConfigMap symlink swaps); endpoints no longer
        listed are removed. false: read once at start.

    `--pool-name` / `--pool-namespace` still name the pool (metrics labels); `--endpoints`,
    `--endpoints-file` and `--endpoint-selector` cannot be combined with a discovery plugin.
"""

from __future__ import annotations

import ipaddress
import json
from typing import Any

import yaml
from pydantic import Field

from llm_epp.framework import EndpointKey, EndpointMetadata, Handle, PluginParams, TypedName
from llm_epp.framework.datalayer import DiscoveredEndpoints

TYPE = "file-discovery"
DEFAULT_NAMESPACE = "default"
MAX_FILE_BYTES = 1 << 20
ENGINE_LABEL = "inference.networking.k8s.io/engine-type"
_FIELDS = frozenset({"name", "namespace", "address", "port", "labels"})


class Params(PluginParams):
    path: str = Field(min_length=1)
    watch_file: bool = Field(default=False, alias="watchFile")


class FileDiscovery:
    def __init__(self, name: str, params: Params) -> None:
        self._typed_name = TypedName(TYPE, name)
        self._path = params.path
        self._watch = params.watch_file

    @property
    def typed_name(self) -> TypedName:
        return self._typed_name

    @property
    def path(self) -> str:
        return self._path

    @property
    def watch_file(self) -> bool:
        return self._watch

    def parse_endpoints(self, text: str) -> DiscoveredEndpoints:
        if len(text.encode()) > MAX_FILE_BYTES:
            raise ValueError(f"endpoints file {self._path} exceeds the 1 MiB limit")
        try:
            doc: Any = yaml.safe_load(text) if text.strip() else {}
        except yaml.YAMLError as e:
            raise ValueError(f"{self._path}: not valid YAML or JSON: {e}") from None
        if doc is None:
            doc = {}
        if not isinstance(doc, dict):
            raise ValueError(f"{self._path}: expected a mapping with an `endpoints` list")
        entries = doc.get("endpoints") or []
        if not isinstance(entries, list):
            raise ValueError(f"{self._path}: `endpoints` must be a list")
        out: dict[EndpointKey, EndpointMetadata] = {}
        problems: list[str] = []
        for i, entry in enumerate(entries):
            where = f"endpoints[{i}]"
            try:
                md, unknown = _entry(entry)
            except ValueError as e:
                problems.append(f"{where}: {e}; entry skipped")
                continue
            if unknown:
                problems.append(f"{where}: unknown field(s) {', '.join(sorted(unknown))} ignored")
            if md.key in out:
                problems.append(f"{where}: endpoint {md.key} is listed again; the later entry wins")
            out[md.key] = md
        return DiscoveredEndpoints(tuple(out.values()), tuple(problems))


def _entry(raw: object) -> tuple[EndpointMetadata, set[str]]:
    if not isinstance(raw, dict):
        raise ValueError("not a mapping")
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError("`name` is required")
    namespace = raw.get("namespace") or DEFAULT_NAMESPACE
    if not isinstance(namespace, str):
        raise ValueError("`namespace` must be a string")
    address = raw.get("address")
    try:
        ipaddress.IPv4Address(address if isinstance(address, str) else "")
    except ValueError:
        raise ValueError(f"endpoint {name!r}: invalid IPv4 address {json.dumps(address)}") from None
    port = raw.get("port")
    text = str(port) if isinstance(port, int | str) and not isinstance(port, bool) else ""
    if not text.strip().isdigit() or not 1 <= int(text) <= 65535:
        raise ValueError(f"endpoint {name!r}: invalid port {json.dumps(port)} (1-65535)")
    labels = raw.get("labels") or {}
    if not isinstance(labels, dict):
        raise ValueError(f"endpoint {name!r}: `labels` must be a map of strings")
    labels = {str(k): str(v) for k, v in labels.items()}
    engine = labels.get(ENGINE_LABEL) or "vllm"
    md = EndpointMetadata(EndpointKey(namespace, name), str(address), int(text), labels=labels, engine=engine)
    return md, set(raw) - _FIELDS


def factory(name: str, params: Params, handle: Handle) -> FileDiscovery:
    return FileDiscovery(name, params)
