"""Endpoint discovery by a `dataLayer.discovery` plugin (`file-discovery`): the plugin says which file and
how to read it; this module reads it, applies the endpoints to the datastore, and (with `watchFile`)
reloads it when its modification time or size changes.

At start a file that cannot be read or parsed is fatal (`DiscoveryError`); entries the plugin skipped are
logged. On a reload the new list replaces the old one (endpoints no longer listed leave); a file that has
become unreadable or unparsable is logged and the last good endpoints stay."""

from __future__ import annotations

import logging
import os

from llm_epp.datalayer.datastore import Datastore
from llm_epp.datalayer.filewatch import WatchedFile
from llm_epp.framework.datalayer import DiscoveredEndpoints, EndpointDiscovery

log = logging.getLogger(__name__)

MAX_FILE_BYTES = 1 << 20


class DiscoveryError(ValueError):
    """The discovery plugin's file cannot be used; the message says which and why."""


class DiscoveryFileWatcher(WatchedFile[DiscoveredEndpoints]):
    kind = "discovery_file"
    error = DiscoveryError

    def __init__(self, plugin: EndpointDiscovery, datastore: Datastore, interval: float = 1.0) -> None:
        super().__init__(plugin.path, interval)
        self.plugin = plugin
        self.datastore = datastore

    @property
    def watching(self) -> bool:
        return self.plugin.watch_file

    def parse(self, text: str, source: str) -> DiscoveredEndpoints:
        try:
            return self.plugin.parse_endpoints(text)
        except ValueError as e:
            raise DiscoveryError(f"{self.plugin.typed_name}: {e}") from None

    def apply(self, value: DiscoveredEndpoints, initial: bool) -> str:
        for problem in value.problems:
            log.warning("discovery_entry_skipped plugin=%s path=%s %s", self.plugin.typed_name, self.path, problem)
        self.datastore.replace_all(value.endpoints)
        return f"endpoints={len(value.endpoints)} skipped={len(value.problems)}"

    def load(self) -> None:
        super().load()
        log.info(
            "discovery_loaded plugin=%s path=%s endpoints=%d watch=%s",
            self.plugin.typed_name,
            self.path,
            len(self.datastore),
            self.plugin.watch_file,
        )

    async def run(self) -> None:
        """Reloads on change with `watchFile`; otherwise the file is read once, at start."""
        if self.plugin.watch_file:
            await super().run()

    def _read(self) -> DiscoveredEndpoints:
        try:
            size = os.stat(self.path).st_size
        except OSError as e:
            raise DiscoveryError(f"{self.plugin.typed_name}: {self.path}: cannot read: {e.strerror}") from None
        if size > MAX_FILE_BYTES:
            raise DiscoveryError(f"{self.plugin.typed_name}: {self.path} exceeds the 1 MiB limit")
        return super()._read()
