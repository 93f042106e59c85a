"""`llm-epp serve --grpc-max-connections N`: the ext_proc port serves N connections at once; one more is sent
GOAWAY (ENHANCE_YOUR_CALM) and closed, and once one ends another is served."""

from __future__ import annotations

import socket
import time

from llm_epp.extproc import http2
from llm_epp.gateway.epp_process import EppProcess


class Client:
    """A raw HTTP/2 client: the preface and an empty SETTINGS, then frames read one by one."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.sock.sendall(http2.PREFACE + http2._frame(http2.SETTINGS, 0, 0))
        self.buf = b""

    def frame(self) -> tuple[int, int, bytes] | None:
        """(type, flags, payload) of the server's next frame, or None once it has closed the connection."""
        while len(self.buf) < 9 or len(self.buf) < 9 + int.from_bytes(self.buf[:3], "big"):
            data = self.sock.recv(65536)
            if not data:
                return None
            self.buf += data
        n = int.from_bytes(self.buf[:3], "big")
        got = (self.buf[3], self.buf[4], self.buf[9 : 9 + n])
        self.buf = self.buf[9 + n :]
        return got

    def until(self, kind: int) -> tuple[int, bytes] | None:
        while (got := self.frame()) is not None:
            if got[0] == kind:
                return got[1], got[2]
        return None

    def close(self) -> None:
        self.sock.close()


def test_a_connection_past_the_limit_is_sent_goaway_and_closed() -> None:
    with EppProcess("--endpoints", "127.0.0.1:1", "--secure-serving=false", "--grpc-max-connections", "1") as epp:
        first = Client(epp.grpc_port)
        assert first.until(http2.SETTINGS) is not None
        second = Client(epp.grpc_port)
        goaway = second.until(http2.GOAWAY)
        assert goaway is not None and int.from_bytes(goaway[1][4:8], "big") == http2.ENHANCE_YOUR_CALM
        assert second.frame() is None  # and closed
        second.close()

        first.sock.sendall(http2._frame(http2.PING, 0, 0, b"12345678"))  # the first is still served
        assert first.until(http2.PING) == (http2.ACK, b"12345678")
        first.close()
        for _ in range(100):  # the server sees the first one end, then serves a new one
            third = Client(epp.grpc_port)
            third.sock.sendall(http2._frame(http2.PING, 0, 0, b"87654321"))
            while (got := third.frame()) is not None and got[0] not in (http2.PING, http2.GOAWAY):
                pass
            third.close()
            if got is not None and got[0] == http2.PING:
                break
            time.sleep(0.05)
        else:
            raise AssertionError("no connection was served after the first one ended")


def test_a_stream_past_the_servers_limit_is_refused() -> None:
    """`--grpc-max-streams 1`: while one ext_proc stream is open (its request headers not yet sent), a second,
    on another connection, is refused with REFUSED_STREAM."""
    from hpack import Encoder

    headers = [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", "/envoy.service.ext_proc.v3.ExternalProcessor/Process"),
        (":authority", "epp"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ]
    with EppProcess("--endpoints", "127.0.0.1:1", "--secure-serving=false", "--grpc-max-streams", "1") as epp:
        first, second = Client(epp.grpc_port), Client(epp.grpc_port)
        for client in (first, second):
            client.sock.sendall(http2._frame(http2.SETTINGS, http2.ACK, 0))
        first.sock.sendall(http2._frame(http2.HEADERS, http2.END_HEADERS, 1, Encoder().encode(headers)))
        first.sock.sendall(http2._frame(http2.PING, 0, 0, b"first..."))  # answered once the stream is open
        assert first.until(http2.PING) == (http2.ACK, b"first...")
        second.sock.sendall(http2._frame(http2.HEADERS, http2.END_HEADERS, 1, Encoder().encode(headers)))
        reset = second.until(http2.RST_STREAM)
        assert reset is not None and int.from_bytes(reset[1], "big") == http2.REFUSED_STREAM
        first.close()
        second.close()
