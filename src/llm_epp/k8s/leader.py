"""Active-passive leader election on a `coordination.k8s.io/v1` Lease, as the reference EPP does with
`--ha-enable-leader-election` (`pkg/epp/server/controller_manager.go`).

`LeaderElector` runs a small client-go style lease loop in a daemon thread:

* follower: every `retry_period` read the Lease; take it (optimistic concurrency: the PUT carries the
  resourceVersion that was read, so of two contenders only one wins) when it is absent, released (empty
  `holderIdentity`), already ours, or when its record has not changed for `lease_duration` on *this*
  replica's clock (the record's own timestamps are not compared across machines, as client-go);
* leader: renew `renewTime` every `retry_period`; when renewals keep failing for `renew_deadline`, or the
  Lease shows another holder, leadership is lost and the loop goes back to being a follower;
* `stop()` while leading releases the Lease (empty holder, `leaseDurationSeconds: 1`) so a follower takes
  over at once, like the reference's release-on-cancel.

`on_started_leading` / `on_stopped_leading` run on the asyncio loop (`call_soon_threadsafe`), in order.
The `kubernetes.leaderelection` package of the client was not used: its loop cannot be stopped, never
releases, and its lock builds its own API client from the global configuration.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import random
import socket
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from kubernetes import client

log = logging.getLogger(__name__)

LEASE_NAME_SUFFIX = "gateway-api-inference-extension.sigs.k8s.io"


def default_lease_name(namespace: str, pool: str) -> str:
    """The reference EPP's leader election ID for a pool: `epp-<ns>-<pool>.gateway-api-inference-extension...`."""
    return f"epp-{namespace}-{pool}.{LEASE_NAME_SUFFIX}"


def default_identity() -> str:
    """`$POD_NAME` (or the hostname) plus a random suffix, so two processes never share an identity."""
    base = os.environ.get("POD_NAME") or socket.gethostname() or "llm-epp"
    return f"{base}_{uuid.uuid4().hex[:8]}"


def _now() -> datetime:
    """Now, for a metav1.MicroTime. The client serialises datetimes with `isoformat()`, which drops the
    fraction when it is zero; the API server parses MicroTime with exactly six fractional digits."""
    now = datetime.now(UTC)
    return now if now.microsecond else now.replace(microsecond=1)


class LeaderElector:
    """`start()` launches the election thread; `stop()` ends it (releasing the Lease when leading)."""

    def __init__(
        self,
        api_client: Any,
        namespace: str,
        lease_name: str,
        identity: str | None,
        loop: asyncio.AbstractEventLoop,
        on_started_leading: Callable[[], None],
        on_stopped_leading: Callable[[], None],
        lease_duration: float = 15.0,
        renew_deadline: float = 10.0,
        retry_period: float = 2.0,
    ) -> None:
        if not 0 < retry_period < renew_deadline < lease_duration:
            raise ValueError("need 0 < retry_period < renew_deadline < lease_duration")
        self.namespace = namespace
        self.lease_name = lease_name
        self.identity = identity or default_identity()
        self.loop = loop
        self.on_started_leading = on_started_leading
        self.on_stopped_leading = on_stopped_leading
        self.lease_duration = lease_duration
        self.renew_deadline = renew_deadline
        self.retry_period = retry_period
        # Any: with `_preload_content=False` the calls return the raw response and take plain dict bodies
        self._api: Any = client.CoordinationV1Api(api_client)
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._leading = threading.Event()
        self._release = True
        # the last Lease spec seen, and when (monotonic) it last changed; only the election thread touches these
        self._observed: dict[str, Any] | None = None
        self._observed_at = 0.0

    @property
    def is_leader(self) -> bool:
        return self._leading.is_set()

    # --- lifecycle -------------------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("LeaderElector already started")
        self._thread = threading.Thread(target=self._run, name="k8s-leader-election", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0, *, release: bool = True) -> None:
        """End the election; a leader releases the Lease first unless `release` is false."""
        self._release = release
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout)

    # --- the loop --------------------------------------------------------------------------------------
    def _run(self) -> None:
        log.info("leader election lease=%s/%s identity=%s", self.namespace, self.lease_name, self.identity)
        while not self._stopping.is_set():
            if not self._try_acquire_or_renew():
                self._stopping.wait(self.retry_period * (1 + 0.2 * random.random()))
                continue
            log.info("became leader lease=%s/%s identity=%s", self.namespace, self.lease_name, self.identity)
            self._leading.set()
            self._post(self.on_started_leading)
            self._renew_loop()
            self._leading.clear()
            if self._stopping.is_set() and self._release:
                self._release_lease()
            else:
                log.warning("lost leadership lease=%s/%s identity=%s", self.namespace, self.lease_name, self.identity)
            self._post(self.on_stopped_leading)

    def _renew_loop(self) -> None:
        renewed = time.monotonic()
        while not self._stopping.wait(self.retry_period):
            if self._try_acquire_or_renew():
                renewed = time.monotonic()
                continue
            holder = (self._observed or {}).get("holderIdentity") or ""
            if holder and holder != self.identity:
                return  # someone else holds it now
            if time.monotonic() - renewed >= self.renew_deadline:
                return

    def _post(self, callback: Callable[[], None]) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is already closed at shutdown
            self.loop.call_soon_threadsafe(callback)

    @property
    def _timeout(self) -> float:
        return max(self.retry_period, self.renew_deadline / 2)

    def _read(self) -> dict[str, Any] | None:
        """The Lease, None when absent; raises ApiException on other errors."""
        try:
            resp = self._api.read_namespaced_lease(
                self.lease_name, self.namespace, _preload_content=False, _request_timeout=self._timeout
            )
        except client.ApiException as e:
            if e.status == 404:
                return None
            raise
        lease: dict[str, Any] = json.loads(resp.data)
        return lease

    def _observe(self, spec: dict[str, Any]) -> None:
        if spec != self._observed:
            self._observed = spec
            self._observed_at = time.monotonic()

    def _try_acquire_or_renew(self) -> bool:
        now = _now()
        record: dict[str, Any] = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": max(1, math.ceil(self.lease_duration)),
            "acquireTime": now,
            "renewTime": now,
            "leaseTransitions": 0,
        }
        try:
            lease = self._read()
            if lease is None:
                body = {
                    "apiVersion": "coordination.k8s.io/v1",
                    "kind": "Lease",
                    "metadata": {"name": self.lease_name, "namespace": self.namespace},
                    "spec": record,
                }
                resp = self._api.create_namespaced_lease(
                    self.namespace, body, _preload_content=False, _request_timeout=self._timeout
                )
                self._observe(json.loads(resp.data).get("spec") or {})
                return True
            spec = dict(lease.get("spec") or {})
            self._observe(spec)
            holder = spec.get("holderIdentity") or ""
            if holder and holder != self.identity and time.monotonic() < self._observed_at + self.lease_duration:
                return False  # held by someone else and not expired
            transitions = int(spec.get("leaseTransitions") or 0)
            if holder == self.identity:
                record["acquireTime"] = spec.get("acquireTime") or now
                record["leaseTransitions"] = transitions
            else:
                record["leaseTransitions"] = transitions + 1
            lease["spec"] = {**spec, **record}
            resp = self._api.replace_namespaced_lease(
                self.lease_name, self.namespace, lease, _preload_content=False, _request_timeout=self._timeout
            )
            self._observe(json.loads(resp.data).get("spec") or {})
            return True
        except client.ApiException as e:
            log.debug("lease %s/%s: %s %s", self.namespace, self.lease_name, e.status, e.reason)
            return False
        except Exception as e:  # connection errors, timeouts, bad JSON: try again next period
            log.debug("lease %s/%s: %s", self.namespace, self.lease_name, e)
            return False

    def _release_lease(self) -> None:
        """Give the Lease up (only if still ours) so a follower can take it without waiting for expiry."""
        try:
            lease = self._read()
            if lease is None:
                return
            spec = dict(lease.get("spec") or {})
            if spec.get("holderIdentity") != self.identity:
                return
            now = _now()
            spec.update(holderIdentity="", leaseDurationSeconds=1, acquireTime=now, renewTime=now)
            lease["spec"] = spec
            self._api.replace_namespaced_lease(
                self.lease_name, self.namespace, lease, _preload_content=False, _request_timeout=self._timeout
            )
            log.info("released lease %s/%s", self.namespace, self.lease_name)
        except Exception as e:
            log.warning("could not release lease %s/%s: %s", self.namespace, self.lease_name, e)
