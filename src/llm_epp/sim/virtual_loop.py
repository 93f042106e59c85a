"""An asyncio event loop whose clock is virtual: simulated seconds pass only when nothing is ready to run.

``loop.time()`` returns the virtual clock.  When the loop would block (nothing ready, the next timer
``timeout`` seconds away), its selector advances the clock by ``timeout`` instead of waiting and reports
no I/O, so the next timer is due at once.  Code written for a real loop runs unchanged and as fast as the
CPU allows: ``asyncio.sleep``, ``asyncio.timeout``, ``call_at``, futures, queues and tasks all keep their
meaning in simulated seconds, and a run is deterministic (callbacks due at the same instant run in the
order they were scheduled, as on any loop).

Work handed to the default executor (``asyncio.to_thread``) runs inline and takes no virtual time.
Sockets and threads see wall time: the selector still polls real file descriptors, without blocking,
while timers are pending, and blocks on them only when nothing at all is scheduled (a thread handing a
result back through ``call_soon_threadsafe``).  A result that comes back from a thread therefore lands at
whatever virtual time the loop has reached; keep time-dependent work on the loop.

::

    loop = VirtualEventLoop()
    loop.run_until_complete(asyncio.sleep(3600))   # returns at once
    loop.time()                                    # 3600.0
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any, TypeVar, TypeVarTuple, Unpack

__all__ = ["VirtualClock", "VirtualEventLoop"]

_T = TypeVar("_T")
_Ts = TypeVarTuple("_Ts")

_IDLE_WAIT = 30.0
"""Wall seconds the loop waits for a thread's answer when no timer and no task is left before it gives up."""


class VirtualClock:
    """Simulated seconds; only moves forward."""

    __slots__ = ("now",)

    def __init__(self, start: float = 0.0) -> None:
        self.now = start

    def advance_to(self, t: float) -> None:
        if t > self.now:
            self.now = t

    def __call__(self) -> float:
        return self.now


class _VirtualSelector(selectors.BaseSelector):
    """A real selector, asked only for what is ready now; a wait becomes a jump of the virtual clock."""

    def __init__(self, clock: VirtualClock, idle_wait: float) -> None:
        self._clock = clock
        self._idle_wait = idle_wait
        self._real = selectors.DefaultSelector()

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._real.register(fileobj, events, data)

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._real.unregister(fileobj)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._real.modify(fileobj, events, data)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = self._real.select(0)
        if ready or timeout == 0:
            return ready
        if timeout is None:  # no timer at all: only another thread can still wake the loop
            ready = self._real.select(self._idle_wait)
            if not ready:
                raise RuntimeError(
                    "the virtual-time loop has nothing scheduled and nothing to wait for: a task awaits something "
                    "that will never happen"
                )
            return ready
        self._clock.now += timeout
        return []

    def close(self) -> None:
        self._real.close()

    def get_map(self) -> Any:
        return self._real.get_map()


class VirtualEventLoop(asyncio.SelectorEventLoop):
    """See the module docstring.  ``clock`` may be shared with code outside the loop (a plugin's
    ``handle.now()``).  With no timer and no task ready, the loop waits up to ``idle_wait`` wall seconds
    for another thread to wake it, then raises ``RuntimeError``: the run is stuck."""

    def __init__(self, clock: VirtualClock | None = None, idle_wait: float = _IDLE_WAIT) -> None:
        self.clock = clock or VirtualClock()
        super().__init__(_VirtualSelector(self.clock, idle_wait))

    def time(self) -> float:
        return self.clock.now

    def run_in_executor(
        self, executor: Executor | None, func: Callable[[Unpack[_Ts]], _T], *args: *_Ts
    ) -> asyncio.Future[_T]:
        """With the default executor (``asyncio.to_thread``), runs ``func`` at once on the loop's thread: work
        handed to a thread takes no virtual time and its result cannot lose a race against a virtual timer
        (a plugin's PrepareData deadline would otherwise expire while the thread runs, since the loop does
        not wait for threads while timers are pending). An explicit executor is used as given."""
        if executor is not None:
            return super().run_in_executor(executor, func, *args)
        future: asyncio.Future[_T] = self.create_future()
        try:
            future.set_result(func(*args))
        except BaseException as e:  # handed to the awaiting task, as the executor would
            future.set_exception(e)
        return future

    def idle_until(self, t: float) -> bool:
        """True when no callback is ready and no timer is due before virtual time ``t``: a caller inside a
        callback may then handle its own events up to ``t`` at once, exactly as if the loop had woken it for
        each (this spares a loop iteration per event; the simulator's engine steps are most of its events).
        Reads the loop's ready queue and timer heap, which every asyncio event loop keeps."""
        if self._ready:  # type: ignore[attr-defined]
            return False
        scheduled = self._scheduled  # type: ignore[attr-defined]
        return not scheduled or scheduled[0].when() >= t
