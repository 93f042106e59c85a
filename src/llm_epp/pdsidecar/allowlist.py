"""Which prefill targets the sidecar may contact (SSRF protection): only pods of the pool.

Sources: a static list (`host` allows any port of that host, `host:port` only that port) and/or an
endpoints file in llm-epp's `--endpoints-file` format (each endpoint's exact `address:port`), re-read when
it changes. A target is allowed when any source allows it. Without sources the check is off."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable
from pathlib import Path

from llm_epp.framework.types import join_host_port, split_host_port

log = logging.getLogger(__name__)

_RELOAD_INTERVAL_S = 1.0


class AllowlistError(ValueError):
    """A static allow-list entry or the endpoints file is unusable."""


def _normalize(target: str) -> tuple[str, int | None]:
    try:
        host, port = split_host_port(target)
    except ValueError:
        raise AllowlistError(f"{target!r}: expected host or host:port, e.g. 10.0.0.5:8000") from None
    if not host or (port is not None and not 1 <= port <= 65535):
        raise AllowlistError(f"{target!r}: expected host or host:port with a port of 1-65535")
    return host.lower(), port


class Allowlist:
    def __init__(self, static: Iterable[str] = (), endpoints_file: str | Path | None = None) -> None:
        self._hosts: set[str] = set()
        self._host_ports: set[tuple[str, int]] = set()
        for entry in static:
            entry = entry.strip()
            if not entry:
                continue
            host, port = _normalize(entry)
            if port is None:
                self._hosts.add(host)
            else:
                self._host_ports.add((host, port))
        self._file = Path(endpoints_file) if endpoints_file else None
        self._file_targets: frozenset[tuple[str, int]] = frozenset()
        self._file_mtime: float | None = None
        self._checked = 0.0
        if self._file is not None:
            self._load(initial=True)

    @property
    def enabled(self) -> bool:
        return bool(self._hosts or self._host_ports or self._file is not None)

    def _load(self, initial: bool = False) -> None:
        assert self._file is not None
        from llm_epp.datalayer.static import EndpointSourceError, parse_endpoints_file

        try:
            mtime = os.stat(self._file).st_mtime
            if mtime == self._file_mtime:
                return
            _, endpoints = parse_endpoints_file(self._file.read_text(), str(self._file))
        except (OSError, EndpointSourceError) as e:
            if initial:
                raise AllowlistError(f"endpoints file: {e}") from None
            log.error("pd_sidecar_allowlist_reload_failed file=%s error=%s (keeping the previous list)", self._file, e)
            return
        self._file_targets = frozenset((e.address.lower(), e.port) for e in endpoints)
        self._file_mtime = mtime
        log.info("pd_sidecar_allowlist_loaded file=%s targets=%d", self._file, len(self._file_targets))

    def allows(self, target: str) -> bool:
        if not self.enabled:
            return True
        try:
            host, port = _normalize(target)
        except AllowlistError:
            return False
        if port is None:
            return False
        if host in self._hosts or (host, port) in self._host_ports:
            return True
        if self._file is not None:
            now = time.monotonic()
            if now - self._checked >= _RELOAD_INTERVAL_S:
                self._checked = now
                self._load()
            return (host, port) in self._file_targets
        return False

    def describe(self) -> str:
        parts = sorted(self._hosts) + sorted(join_host_port(h, p) for h, p in self._host_ports)
        if self._file is not None:
            parts.append(f"file:{self._file}")
        return ",".join(parts) or "off"
