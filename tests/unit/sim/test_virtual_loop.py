"""The virtual-time event loop: asyncio code runs unchanged, simulated seconds pass only while idle."""

from __future__ import annotations

import asyncio

import pytest

from llm_epp.sim.virtual_loop import VirtualClock, VirtualEventLoop


def _run(coro, loop=None):
    loop = loop or VirtualEventLoop()
    try:
        return loop.run_until_complete(coro), loop
    finally:
        loop.close()


def test_sleeping_an_hour_takes_an_hour_of_virtual_time_and_none_of_the_wall() -> None:
    async def main() -> float:
        await asyncio.sleep(3600)
        return asyncio.get_running_loop().time()

    clock = VirtualClock(10.0)
    result, _ = _run(main(), VirtualEventLoop(clock))
    assert result == pytest.approx(3610.0)
    assert clock.now == pytest.approx(3610.0)


def test_timers_fire_in_time_order_and_same_instant_callbacks_in_scheduling_order() -> None:
    seen: list[tuple[str, float]] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        for name, at in (("c", 2.0), ("a", 1.0), ("b", 1.0), ("d", 1.0)):
            loop.call_at(at, lambda n=name: seen.append((n, loop.time())))
        await asyncio.sleep(3)

    _run(main())
    assert [n for n, _ in seen] == ["a", "b", "d", "c"]
    assert [t for _, t in seen] == pytest.approx([1.0, 1.0, 1.0, 2.0])


def test_asyncio_timeout_expires_in_virtual_seconds() -> None:
    async def main() -> tuple[bool, float]:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(0.4):
                await asyncio.sleep(10)
        except TimeoutError:
            return True, loop.time()
        return False, loop.time()

    (timed_out, at), _ = _run(main())
    assert timed_out and at == pytest.approx(0.4)


def test_tasks_ready_at_one_instant_all_run_before_time_moves() -> None:
    times: list[float] = []

    async def worker() -> None:
        loop = asyncio.get_running_loop()
        for _ in range(3):
            await asyncio.sleep(0)
            times.append(loop.time())

    async def main() -> None:
        await asyncio.sleep(5)
        await asyncio.gather(worker(), worker())

    _run(main())
    assert times == [5.0] * 6


def test_a_result_from_another_thread_wakes_the_loop() -> None:
    async def main() -> int:
        return await asyncio.get_running_loop().run_in_executor(None, lambda: 42)

    assert _run(main())[0] == 42


def test_a_run_waiting_for_something_that_never_happens_is_reported() -> None:
    async def main() -> None:
        await asyncio.get_running_loop().create_future()

    loop = VirtualEventLoop(idle_wait=0.01)
    with pytest.raises(RuntimeError, match="nothing scheduled"):
        _run(main(), loop)
