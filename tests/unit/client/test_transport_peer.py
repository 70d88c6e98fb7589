"""The transport facing peers that break the rules, which a real broker never does on purpose.

Goal: transport.py's failure rules hold for what only a broken or hostile peer produces: a
refused connect raises RemotingConnectError; bytes that are not a frame, and a stream that ends
inside a frame, fail every outstanding call with RemotingClosedError and the next call connects
again; a peer that stops reading cuts a large request at its deadline (RemotingTimeoutError) and
fails the connection, since the stream is cut inside a frame; a request from the peer with no
handler installed is answered REQUEST_CODE_NOT_SUPPORTED.
Method: a listening socket on 127.0.0.1 port 0 in the test, driven by hand with the sans-IO
`Connection` in the broker's role. It is not a broker: it only sends what each test needs.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from mqbox.client.errors import RemotingClosedError, RemotingConnectError, RemotingTimeoutError
from mqbox.client.transport import Transport
from mqbox.protocol.codes import ResponseCode
from mqbox.protocol.command import RemotingCommand, encode_command, make_request
from mqbox.protocol.connection import NEED_DATA, Connection, Role

WAIT_S = 5.0


class Peer:
    """One accepted connection at a time, read and written by the test."""

    def __init__(self) -> None:
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(4)
        self.listener.settimeout(WAIT_S)
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.sockets: list[socket.socket] = []

    def accept(self) -> socket.socket:
        sock, _ = self.listener.accept()
        sock.settimeout(WAIT_S)
        self.sockets.append(sock)
        return sock

    def read_command(self, sock: socket.socket, connection: Connection) -> RemotingCommand:
        while True:
            command = connection.next_command()
            if command is not NEED_DATA:
                assert isinstance(command, RemotingCommand)
                return command
            connection.receive_data(sock.recv(65536))

    def close(self) -> None:
        for sock in self.sockets:
            sock.close()
        self.listener.close()


@pytest.fixture
def peer() -> Iterator[Peer]:
    peer = Peer()
    yield peer
    peer.close()


def in_thread(target: object) -> tuple[threading.Thread, list[BaseException]]:
    """Run `target` (a call expected to raise) in a thread; its exception lands in the list."""
    assert callable(target)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            target()
        except BaseException as error:  # handed to the test thread
            errors.append(error)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, errors


def test_a_refused_connect_raises_connect_error(peer: Peer) -> None:
    address = peer.address
    peer.close()
    with Transport(address) as transport, pytest.raises(RemotingConnectError):
        transport.invoke(34, {}, timeout_ms=1000)


@pytest.mark.parametrize(
    "reply",
    [b"\x00\x00\x00\x08\x05\x00\x00\x00garbage!", b"\x00\x00\x01\x00\x00\x00\x00\x10{"],
    ids=["not-a-frame", "ends-inside-a-frame"],
)
def test_a_broken_stream_fails_every_outstanding_call_and_the_next_call_reconnects(
    peer: Peer, reply: bytes
) -> None:
    with Transport(peer.address) as transport:
        future = transport.invoke_async(34, {}, b"", 4000)
        thread, errors = in_thread(lambda: transport.invoke(34, {}, timeout_ms=4000))
        first = peer.accept()
        connection = Connection(Role.BROKER)
        peer.read_command(first, connection)
        peer.read_command(first, connection)
        first.sendall(reply)
        if reply.startswith(b"\x00\x00\x01"):
            first.shutdown(socket.SHUT_WR)
        assert isinstance(future.exception(WAIT_S), RemotingClosedError)
        thread.join(WAIT_S)
        assert len(errors) == 1
        assert isinstance(errors[0], RemotingClosedError)
        # The next call connects again and gets its answer.
        thread, errors = in_thread(lambda: transport.invoke(34, {}, timeout_ms=4000))
        second = peer.accept()
        connection = Connection(Role.BROKER)
        request = peer.read_command(second, connection)
        second.sendall(encode_command(request.make_response(0, {})))
        thread.join(WAIT_S)
        assert errors == []
        assert transport.statistics().connects == 2


def test_a_peer_that_stops_reading_cuts_a_large_request_at_its_deadline(peer: Peer) -> None:
    with Transport(peer.address) as transport:
        outstanding = transport.invoke_async(34, {}, b"", 5000)
        thread, errors = in_thread(lambda: transport.invoke(10, {}, b"x" * (12 << 20), 500))
        peer.accept()  # and never read
        thread.join(WAIT_S)
        assert len(errors) == 1
        assert isinstance(errors[0], RemotingTimeoutError)
        assert "inside a frame" in str(errors[0])
        assert isinstance(outstanding.exception(WAIT_S), RemotingClosedError)
        assert transport.statistics().channel_failures == 1


def test_a_request_without_a_handler_is_answered_not_supported(peer: Peer) -> None:
    with Transport(peer.address) as transport:
        thread, errors = in_thread(lambda: transport.invoke(34, {}, timeout_ms=4000))
        sock = peer.accept()
        connection = Connection(Role.BROKER)
        call = peer.read_command(sock, connection)
        sock.sendall(encode_command(make_request(307, 99, {"consumerGroup": "G"})))
        answer = peer.read_command(sock, connection)
        assert (answer.code, answer.opaque, answer.is_response) == (
            ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
            99,
            True,
        )
        sock.sendall(encode_command(call.make_response(0, {})))
        thread.join(WAIT_S)
        assert errors == []
        assert transport.statistics().broker_requests == 1
