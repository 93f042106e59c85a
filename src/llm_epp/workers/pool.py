"""Spawns the front processes, restarts one that dies, and stops them on drain. To `app.serve` the pool
looks like one more gRPC server: `stop(grace)` refuses new streams and gives in-flight ones `grace`
seconds; `stop(None)` ends them at once."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from multiprocessing.process import BaseProcess
from pathlib import Path

from llm_epp.observability import HealthState
from llm_epp.options import Options
from llm_epp.requestcontrol.director import Director
from llm_epp.workers import front
from llm_epp.workers.hub import Hub
from llm_epp.workers.wire import TOKEN_BYTES

log = logging.getLogger("llm_epp.workers")

START_TIMEOUT_S = 60.0
MAX_QUICK_RESTARTS = 5  # a front dying this often within RESTART_WINDOW_S stops the EPP
RESTART_WINDOW_S = 60.0
FORCED_STOP_S = 5.0


class WorkerStartError(Exception):
    """A front could not start; the message says which and why."""


class WorkerPool:
    """`opts.workers` fronts on `opts.worker_ports()`: `opts.grpc_port` and the next ports above it that are not
    the EPP's other ports (any free port each when `opts.grpc_port` is 0).
    `on_fatal(message)` is called when the fronts cannot be kept running."""

    def __init__(
        self,
        opts: Options,
        director: Director,
        health: HealthState,
        on_fatal: Callable[[str], None],
    ) -> None:
        self.opts = opts
        self.director = director
        self.count = opts.workers
        self.on_fatal = on_fatal
        self.ports: list[int] = [0] * self.count
        self.procs: list[BaseProcess | None] = [None] * self.count
        self.failed = ""
        self._ctx = multiprocessing.get_context("spawn")
        self._dir = tempfile.mkdtemp(prefix="llm-epp-workers-")  # mode 0700: only this user can connect
        self._socket = str(Path(self._dir) / "scheduler.sock")
        self._token = os.urandom(TOKEN_BYTES)
        self._ready: dict[int, asyncio.Future[int]] = {}
        self._stopping = False
        self.stopped = False
        self._restarts: list[float] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._watch: dict[int, int] = {}  # index -> sentinel fd being watched
        # ResponseComplete hooks may add response metadata: then the end of a response waits for it.
        self._finish_metadata = bool(director.plugins.response_complete)
        self.hub = Hub(
            director,
            health,
            self._token,
            with_scores=opts.enable_explain or opts.emit_endpoint_scores,
            on_ready=self._front_ready,
            on_lost=self._front_lost,
        )

    @property
    def pids(self) -> list[int]:
        return [p.pid or 0 if p is not None else 0 for p in self.procs]

    async def start(self) -> list[int]:
        """Starts every front and waits until each listens; returns their ports. Raises WorkerStartError."""
        await self.hub.start(self._socket)
        try:
            ports = self.opts.worker_ports()
            await asyncio.gather(*(self._start_front(i, ports[i]) for i in range(self.count)))
        except BaseException:
            await self.stop(None)
            raise
        return list(self.ports)

    async def _start_front(self, index: int, port: int) -> None:
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[int] = loop.create_future()
        self._ready[index] = ready
        spec = front.FrontSpec(
            opts=self.opts,
            index=index,
            port=port,
            socket_path=self._socket,
            token=self._token,
            finish_metadata=self._finish_metadata,
            response_hooks=bool(self.director.plugins.response_received),
            max_held_request_bytes=max(self.opts.max_held_request_bytes // self.count, 1),
        )
        proc = self._ctx.Process(target=front.main, args=(spec,), name=f"llm-epp-worker-{index}", daemon=True)
        proc.start()
        self.procs[index] = proc
        exited = loop.create_future()
        sentinel = proc.sentinel

        def on_exit() -> None:
            if not exited.done():
                exited.set_result(None)

        loop.add_reader(sentinel, on_exit)
        try:
            done, _ = await asyncio.wait((ready, exited), timeout=START_TIMEOUT_S, return_when=asyncio.FIRST_COMPLETED)
        finally:
            loop.remove_reader(sentinel)
        address = f"{self.opts.bind_address}:{port}"
        if ready not in done:
            proc.kill()
            await asyncio.to_thread(proc.join, 5)
            why = f"exit code {proc.exitcode}" if exited in done else f"not listening after {START_TIMEOUT_S:g}s"
            raise WorkerStartError(f"ext_proc worker {index} could not listen on {address} ({why}; see its log above)")
        self.ports[index] = ready.result()
        loop.add_reader(sentinel, self._front_exited, index, proc)
        self._watch[index] = sentinel

    def _front_ready(self, index: int, port: int) -> None:
        fut = self._ready.get(index)
        if fut is not None and not fut.done():
            fut.set_result(port)

    def _front_lost(self, index: int) -> None:
        log.debug("worker_connection_closed worker=%d", index)

    def _front_exited(self, index: int, proc: BaseProcess) -> None:
        loop = asyncio.get_running_loop()
        fd = self._watch.pop(index, None)
        if fd is not None:
            loop.remove_reader(fd)
        proc.join(0)
        if self._stopping:
            return
        log.error("worker_died worker=%d pid=%s exit_code=%s: restarting it", index, proc.pid, proc.exitcode)
        now = time.monotonic()
        self._restarts = [t for t in self._restarts if now - t < RESTART_WINDOW_S] + [now]
        if len(self._restarts) > MAX_QUICK_RESTARTS:
            self._fail(f"ext_proc workers died {len(self._restarts)} times within {RESTART_WINDOW_S:g}s")
            return
        task = loop.create_task(self._restart(index))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _restart(self, index: int) -> None:
        try:
            await self._start_front(index, self.ports[index])
        except WorkerStartError as e:
            self._fail(str(e))
            return
        log.info("worker_restarted worker=%d port=%d", index, self.ports[index])

    def _fail(self, message: str) -> None:
        if not self.failed:
            self.failed = message
            log.error("workers_failed: %s; stopping", message)
            self.on_fatal(message)

    async def stop(self, grace: float | None) -> None:
        """Tells every front to stop (in-flight streams get `grace` seconds; None = none) and waits for
        them to exit; a front still running `grace` + 5 s later is killed."""
        if self._stopping and grace is None:  # a second signal during the drain: end the fronts now
            for proc in self.procs:
                if proc is not None and proc.exitcode is None:
                    proc.terminate()
            return
        self._stopping = True
        loop = asyncio.get_running_loop()
        for fd in self._watch.values():
            loop.remove_reader(fd)
        self._watch.clear()
        for f in list(self.hub.fronts):
            f.conn.send(("S", grace))
        limit = (grace or 0.0) + FORCED_STOP_S
        for proc in self.procs:
            if proc is None:
                continue
            await asyncio.to_thread(proc.join, limit)
            if proc.exitcode is None:
                log.warning("worker_killed pid=%s: it did not stop in %.1fs", proc.pid, limit)
                proc.kill()
                await asyncio.to_thread(proc.join, 5)
        await self.hub.stop()
        self.stopped = True
        with contextlib.suppress(OSError):
            shutil.rmtree(self._dir)
