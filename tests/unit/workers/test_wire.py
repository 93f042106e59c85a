"""Frames between the fronts and the serving process."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from llm_epp.workers.wire import FrameConnection, encode


def test_frames_split_anywhere_are_decoded_in_order() -> None:
    got: list[tuple[Any, ...]] = []
    conn = FrameConnection(got.append, lambda: None, token=b"secret")
    data = b"secret" + encode(("a", 1, b"x" * 1000)) + encode(("b", {"k": "v"}, None))
    for i in range(0, len(data), 7):
        conn.data_received(data[i : i + 7])
    assert got == [("a", 1, b"x" * 1000), ("b", {"k": "v"}, None)]


async def test_a_wrong_token_closes_the_connection_before_anything_is_decoded(tmp_path: Path) -> None:
    got: list[tuple[Any, ...]] = []
    lost = asyncio.Event()
    loop = asyncio.get_running_loop()
    server = await loop.create_unix_server(
        lambda: FrameConnection(got.append, lost.set, token=b"x" * 32), str(tmp_path / "s")
    )
    client = FrameConnection(lambda m: None, lambda: None)
    await loop.create_unix_connection(lambda: client, str(tmp_path / "s"))
    client.send_raw(b"y" * 32 + encode(("r", 1)))
    await asyncio.wait_for(lost.wait(), 5)
    assert got == []
    client.close()
    server.close()
    await server.wait_closed()


async def test_messages_sent_in_one_loop_iteration_go_out_in_one_write(tmp_path: Path) -> None:
    got: list[tuple[Any, ...]] = []
    loop = asyncio.get_running_loop()
    accepted: list[FrameConnection] = []

    def accept() -> FrameConnection:
        accepted.append(FrameConnection(got.append, lambda: None))
        return accepted[-1]

    server = await loop.create_unix_server(accept, str(tmp_path / "s"))
    client = FrameConnection(lambda m: None, lambda: None)
    transport, _ = await loop.create_unix_connection(lambda: client, str(tmp_path / "s"))
    writes: list[bytes] = []
    real_write = transport.write

    def counting_write(data: bytes) -> None:
        writes.append(data)
        real_write(data)

    transport.write = counting_write  # type: ignore[method-assign]
    for i in range(10):
        client.send(("m", i))
    await asyncio.sleep(0.05)
    assert len(writes) == 1
    assert got == [("m", i) for i in range(10)]
    client.close()
    for conn in accepted:
        conn.close()
    server.close()
    await server.wait_closed()
