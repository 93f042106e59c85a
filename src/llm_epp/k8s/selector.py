"""Standalone mode (`--endpoint-selector k=v[,k=v]` with `--endpoint-target-ports p1[,p2...]`): no
InferencePool and no CRDs; the pods matching a fixed label selector become endpoints exactly as in pool mode
(`<pod>-rank-<i>`, `i` = the port's index in the target port list).

`SelectorWatcher` is a `PoolWatcher` whose pool is fixed instead of watched: only the pod watch runs."""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Iterable
from typing import Any

from llm_epp.datalayer.datastore import Datastore
from llm_epp.k8s.discovery import PoolSpec
from llm_epp.k8s.watcher import PoolWatcher

MAX_TARGET_PORTS = 8

_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


class EndpointSelectorError(ValueError):
    """A bad `--endpoint-selector` or `--endpoint-target-ports` value; the message says which and why."""


def _check_key(key: str, term: str) -> None:
    prefix, slash, name = key.rpartition("/")
    if slash and (not prefix or len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)):
        raise EndpointSelectorError(
            f"--endpoint-selector: {term!r}: label key prefix {prefix!r} must be a DNS subdomain "
            "(lowercase alphanumerics, '-' and '.', at most 253 characters)"
        )
    if not _NAME.match(name):
        raise EndpointSelectorError(
            f"--endpoint-selector: {term!r}: label key name {name!r} must be 1-63 characters of alphanumerics, "
            "'-', '_' or '.', starting and ending with an alphanumeric"
        )


def parse_endpoint_selector(text: str) -> tuple[tuple[str, str], ...]:
    """`k=v[,k=v]` (no whitespace; `==` is not accepted) into sorted (key, value) pairs, as `PoolSpec` holds
    them. Keys and values follow Kubernetes label syntax; a key may appear once."""
    if not text:
        raise EndpointSelectorError("--endpoint-selector: must not be empty (expected k=v[,k=v])")
    if any(c.isspace() for c in text):
        raise EndpointSelectorError(f"--endpoint-selector: {text!r}: whitespace is not allowed (expected k=v[,k=v])")
    labels: dict[str, str] = {}
    for term in text.split(","):
        key, eq, value = term.partition("=")
        if not eq or not key or "=" in value or "!" in key:
            raise EndpointSelectorError(f"--endpoint-selector: {term!r} is not of the form key=value")
        _check_key(key, term)
        if value and not _NAME.match(value):
            raise EndpointSelectorError(
                f"--endpoint-selector: {term!r}: label value {value!r} must be at most 63 characters of "
                "alphanumerics, '-', '_' or '.', starting and ending with an alphanumeric"
            )
        if key in labels and labels[key] != value:
            raise EndpointSelectorError(f"--endpoint-selector: key {key!r} is given twice with different values")
        labels[key] = value
    return tuple(sorted(labels.items()))


def parse_target_ports(value: str | Iterable[str | int]) -> tuple[int, ...]:
    """`p1,p2,...` (or a list of such values, for a repeated flag) into 1..8 distinct ports in 1..65535, first
    occurrence order kept; duplicates are dropped before counting."""
    items: list[str] = []
    for part in [value] if isinstance(value, str) else value:
        items.extend(str(part).split(","))
    ports: list[int] = []
    for item in items:
        item = item.strip()
        if not item:
            raise EndpointSelectorError("--endpoint-target-ports: empty entry (expected p1[,p2...])")
        if not item.isdigit() or not 1 <= int(item) <= 65535:
            raise EndpointSelectorError(f"--endpoint-target-ports: {item!r} is not a port number in 1..65535")
        if int(item) not in ports:
            ports.append(int(item))
    if not ports:
        raise EndpointSelectorError("--endpoint-target-ports: at least one port is required")
    if len(ports) > MAX_TARGET_PORTS:
        raise EndpointSelectorError(
            f"--endpoint-target-ports: {len(ports)} distinct ports given; at most {MAX_TARGET_PORTS} are allowed"
        )
    return tuple(ports)


def standalone_pool_spec(
    namespace: str, selector: str, target_ports: str | Iterable[str | int], name: str = ""
) -> PoolSpec:
    """The synthetic pool standalone mode serves; raises `EndpointSelectorError` for bad flag values."""
    return PoolSpec(namespace, name, parse_endpoint_selector(selector), parse_target_ports(target_ports))


class SelectorWatcher(PoolWatcher):
    """Watches the pods a fixed `PoolSpec` selects (no InferencePool watch); same datastore updates, resume,
    410 relist and backoff as `PoolWatcher`. The datastore becomes synced after the first pod list."""

    def __init__(
        self,
        api_client: Any,
        spec: PoolSpec,
        datastore: Datastore,
        loop: asyncio.AbstractEventLoop,
        **kwargs: Any,
    ) -> None:
        super().__init__(api_client, spec.namespace, spec.name, "", datastore, loop, **kwargs)
        self.spec = spec

    def start(self) -> None:
        with self._cond:
            self._pool_listed = True
            self._pool = self.spec
            self._selector_gen += 1
            self._cond.notify_all()
        t = threading.Thread(target=self._run_pods, name="k8s-watch-pods", daemon=True)
        self._threads.append(t)
        t.start()
