"""ConnectionPair: a client codec and a broker codec joined by an in-memory link.

Owns: the two `Connection`s and the bytes between them; nothing else. It opens no socket. A test
sends commands from one side and reads what the other side decodes, the way h11's
tests/helpers.py joins two h11 connections. Bytes can be delivered whole or in chunks of a chosen
size, so the same helper checks that framing survives any split of the stream.
"""

from __future__ import annotations

from collections.abc import Iterable

from mqbox.protocol import (
    CLOSED,
    FRAME_SIZE_BYTES_MAX_DEFAULT,
    NEED_DATA,
    Connection,
    RemotingCommand,
    Role,
)


class ConnectionPair:
    """A client `Connection` and a broker `Connection` with a perfect link between them."""

    def __init__(self, *, frame_size_bytes_max: int = FRAME_SIZE_BYTES_MAX_DEFAULT) -> None:
        self.client = Connection(Role.CLIENT, frame_size_bytes_max)
        self.broker = Connection(Role.BROKER, frame_size_bytes_max)

    def connection(self, role: Role) -> Connection:
        return self.client if role is Role.CLIENT else self.broker

    def peer(self, role: Role) -> Connection:
        """The other end from `role`."""
        return self.broker if role is Role.CLIENT else self.client

    def send(
        self,
        role: Role,
        commands: RemotingCommand | Iterable[RemotingCommand],
        *,
        chunk_size_bytes: int | None = None,
        expect_equal: bool = True,
    ) -> list[RemotingCommand]:
        """Encode `commands` on `role`'s side, deliver them to the peer, return what it decoded.

        With `chunk_size_bytes` the bytes arrive in pieces of that size, and the peer is drained
        after each piece. With `expect_equal` (the default) the decoded commands must equal the
        sent ones: RemotingCommand equality compares extFields as strings.
        """
        if isinstance(commands, RemotingCommand):
            commands = [commands]
        sent = list(commands)
        wire = b"".join(self.connection(role).send(command) for command in sent)
        received = self.deliver(role, wire, chunk_size_bytes=chunk_size_bytes)
        if expect_equal:
            assert received == sent, (received, sent)
        return received

    def deliver(
        self, role: Role, wire: bytes, *, chunk_size_bytes: int | None = None
    ) -> list[RemotingCommand]:
        """Feed raw bytes from `role` to its peer; return every command the peer completes."""
        receiver = self.peer(role)
        step = chunk_size_bytes or max(len(wire), 1)
        assert step > 0
        received: list[RemotingCommand] = []
        for start in range(0, len(wire), step):
            receiver.receive_data(wire[start : start + step])
            received += drain(receiver)
        return received

    def close(self, role: Role) -> None:
        """`role` closes its end: the peer must see a clean end of stream."""
        receiver = self.peer(role)
        receiver.receive_data(b"")
        assert receiver.next_command() is CLOSED


def drain(connection: Connection) -> list[RemotingCommand]:
    """Every complete command `connection` holds now; stops at NEED_DATA, refuses CLOSED."""
    commands: list[RemotingCommand] = []
    while (command := connection.next_command()) is not NEED_DATA:
        assert command is not CLOSED
        commands.append(command)
    return commands
