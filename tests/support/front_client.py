"""A remoting client over a plain socket for the broker front's tests.

Owns: one TCP connection to 127.0.0.1, its client-side protocol.Connection, and waits with
deadlines. `pump` is called while waiting: the in-process front turns its roles there; against
real processes it just sleeps a little. Never: retries, or hides a closed connection.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import Final

from mqbox.protocol import NEED_DATA, Connection, RemotingCommand, Role, make_request

WAIT_S: Final = 15.0


def _sleep_briefly() -> None:
    time.sleep(0.0005)


class FrontClient:
    def __init__(
        self,
        host: str,
        port: int,
        *,
        pump: Callable[[], object] = _sleep_briefly,
        receive_buffer_size_bytes: int | None = None,
        source_host: str | None = None,
    ) -> None:
        """`source_host`: the local address to connect from (any 127.x.y.z works on Linux),
        so a test can be a peer that a server's address rules treat differently."""
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if receive_buffer_size_bytes is not None:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer_size_bytes)
        if source_host is not None:
            self.sock.bind((source_host, 0))
        self.sock.connect((host, port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.setblocking(False)
        self.connection = Connection(Role.CLIENT)
        self.pump = pump
        self.eof = False

    def send(self, command: RemotingCommand) -> None:
        self.send_raw(self.connection.send(command))

    def request(self, code: int, ext: dict[str, str] | None = None, body: bytes = b"") -> int:
        """Send a request; returns its opaque."""
        opaque = self.connection.next_opaque()
        self.send(make_request(code, opaque, ext or {}, body=body))
        return opaque

    def send_raw(self, data: bytes) -> None:
        view = memoryview(data)
        deadline = time.monotonic() + WAIT_S
        while view:
            try:
                sent = self.sock.send(view)
            except BlockingIOError:
                sent = 0
            view = view[sent:]
            if view:
                assert time.monotonic() < deadline, "the broker stopped reading"
                self.pump()

    def responses(self, count: int) -> list[RemotingCommand]:
        """The next `count` commands from the broker, waiting up to WAIT_S."""
        found: list[RemotingCommand] = []
        deadline = time.monotonic() + WAIT_S
        while len(found) < count:
            command = self.connection.next_command()
            if isinstance(command, RemotingCommand):
                found.append(command)
                continue
            if command is not NEED_DATA or self.eof:
                raise ConnectionClosedError(f"connection closed after {len(found)} of {count}")
            assert time.monotonic() < deadline, f"only {len(found)} of {count} responses came"
            self._receive()
        return found

    def call(
        self, code: int, ext: dict[str, str] | None = None, body: bytes = b""
    ) -> RemotingCommand:
        opaque = self.request(code, ext, body)
        (response,) = self.responses(1)
        assert response.opaque == opaque
        return response

    def wait_closed(self) -> None:
        """Wait until the broker closed the connection (end of stream or reset)."""
        deadline = time.monotonic() + WAIT_S
        while not self.eof:
            assert time.monotonic() < deadline, "the broker did not close the connection"
            self._receive()

    def _receive(self) -> None:
        try:
            data = self.sock.recv(1 << 20)
        except BlockingIOError:
            self.pump()
            return
        except ConnectionResetError:
            data = b""
        if not data:
            self.eof = True
            return
        self.connection.receive_data(data)

    def close(self) -> None:
        self.sock.close()


class ConnectionClosedError(AssertionError):
    """The broker closed the connection while the test waited for something else."""
