"""Connection: the sans-IO state machine of one remoting connection (h11's design).

Owns: the receive buffer of one connection, frame extraction, opaque allocation and counters.
Never: sockets, clocks, threads, logging (docs/style.md section 5). Whoever owns the socket pushes
bytes in with `receive_data` and takes commands out with `next_command`; `send` turns a command into
bytes for that owner to write.

Rules:

1. Any split of the byte stream gives the same commands. The buffer is read from an offset. When
   nothing is pending, a received `bytes` chunk becomes the buffer as it is, and header and body are
   sliced straight out of it: one copy each, which is the common case of whole frames per read.
   Bytes left over when more arrive move into a bytearray that grows by appending; consumed bytes
   are dropped from it only once they make up half of it. Each byte is therefore copied a bounded
   number of times however the stream is cut (no quadratic copying).
2. A frame's announced size is checked against `frame_size_bytes_max` as soon as its first four
   bytes arrive, before the rest is waited for.
3. After a RemoteProtocolError the connection is dead: every later `next_command` raises again, and
   the owner closes the socket. End of stream (`receive_data(b"")`) between frames is a clean close
   (CLOSED); inside a frame it is an error.
4. Both sides send requests (the broker sends NOTIFY_CONSUMER_IDS_CHANGED to its clients) and both
   answer them, so the codec does not police direction. Opaques start at 0 and keep the sign bit
   clear, as the C++ client's do.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Final, Literal

from mqbox.protocol.codes import FLAG_RESPONSE
from mqbox.protocol.command import (
    RemotingCommand,
    decode_command,
    decode_json_command,
    encode_command,
    encode_command_head,
    encode_response_header,
)
from mqbox.protocol.errors import LocalProtocolError, RemoteProtocolError
from mqbox.protocol.frame import (
    FRAME_LENGTH,
    FRAME_LENGTH_SIZE_BYTES,
    FRAME_PREFIX,
    FRAME_PREFIX_SIZE_BYTES,
    FRAME_SIZE_BYTES_MAX_DEFAULT,
    HEADER_LENGTH_MASK,
    HEADER_WORD_SIZE_BYTES,
    SERIALIZE_TYPE_SHIFT,
    check_frame_length,
    check_header_word,
)

_OPAQUE_MASK: Final = 0x7FFF_FFFF
# Dropping consumed bytes moves the unread tail; do it only when the consumed part is at least this
# big and at least half the buffer, so a buffer of many small frames is not shifted after each one.
_COMPACT_SIZE_BYTES_MIN: Final = 64 * 1024


class Role(enum.Enum):
    """Which end of the connection this codec serves."""

    CLIENT = "client"
    BROKER = "broker"  # also the name server: it plays the same part


class Sentinel(enum.Enum):
    """What `next_command` returns when it has no command to give."""

    NEED_DATA = "NEED_DATA"  # the buffer holds no complete frame: call receive_data
    CLOSED = "CLOSED"  # the peer ended the stream cleanly between frames

    def __repr__(self) -> str:
        return self.value


NEED_DATA: Final = Sentinel.NEED_DATA
CLOSED: Final = Sentinel.CLOSED


@dataclass(frozen=True, slots=True)
class ConnectionStatistics:
    """Counters of one connection since it was made."""

    commands_received: int
    bytes_received: int
    commands_sent: int
    bytes_sent: int
    bytes_buffered: int


class Connection:
    """The remoting codec of one TCP connection, client or broker side."""

    __slots__ = (
        "_buffer",
        "_bytes_received",
        "_bytes_sent",
        "_commands_received",
        "_commands_sent",
        "_eof",
        "_error",
        "_offset",
        "_opaque_next",
        "frame_size_bytes_max",
        "role",
    )

    def __init__(
        self, role: Role, frame_size_bytes_max: int = FRAME_SIZE_BYTES_MAX_DEFAULT
    ) -> None:
        assert FRAME_PREFIX_SIZE_BYTES <= frame_size_bytes_max <= 2**31 - 1
        self.role: Final = role
        self.frame_size_bytes_max: Final = frame_size_bytes_max
        # A received chunk while it is being read whole, or a bytearray once a frame spans chunks.
        self._buffer: bytes | bytearray = b""
        self._offset = 0  # the first unread byte of _buffer
        self._eof = False
        self._error: RemoteProtocolError | None = None
        self._opaque_next = 0
        self._commands_received = 0
        self._bytes_received = 0
        self._commands_sent = 0
        self._bytes_sent = 0

    # -- receiving --------------------------------------------------------------------------------

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        """Append bytes read from the socket; `b""` means the peer closed its end."""
        if not data or self._eof or self._error is not None:
            self._receive_unusual(data)
            return
        self._bytes_received += len(data)
        buffer = self._buffer
        offset = self._offset
        if offset == len(buffer):
            # Everything was read: read the new chunk in place. Only bytes are immutable, so a
            # bytearray or memoryview from the caller is copied, once.
            self._buffer = data if type(data) is bytes else bytes(data)
            self._offset = 0
        elif type(buffer) is bytes:
            # A frame spans chunks: move its start into a buffer that can grow.
            with memoryview(buffer) as view:
                grown = bytearray(view[offset:])
            grown += data
            self._buffer = grown
            self._offset = 0
        else:
            assert type(buffer) is bytearray
            if offset >= _COMPACT_SIZE_BYTES_MIN and offset * 2 >= len(buffer):
                del buffer[:offset]
                self._offset = 0
            buffer += data

    def _receive_unusual(self, data: bytes | bytearray | memoryview) -> None:
        if self._eof:
            raise LocalProtocolError("receive_data after end of stream")
        if not data:
            self._eof = True
        # Otherwise the connection is dead: keep nothing more from it.

    def next_command(self) -> RemotingCommand | Literal[Sentinel.NEED_DATA, Sentinel.CLOSED]:
        """The next complete command, or NEED_DATA, or CLOSED after a clean end of stream.

        Raises RemoteProtocolError when the peer broke the protocol; the connection is then dead.
        """
        if self._error is not None:
            raise RemoteProtocolError(f"connection already failed: {self._error}")
        buffer = self._buffer
        offset = self._offset
        available = len(buffer) - offset
        if available < FRAME_PREFIX_SIZE_BYTES:
            return self._next_command_short(available)
        frame_length, header_word = FRAME_PREFIX.unpack_from(buffer, offset)
        # One combined test for the usual case; the helpers below name whatever is wrong.
        header_size_bytes = header_word & HEADER_LENGTH_MASK
        serialize_type = header_word >> SERIALIZE_TYPE_SHIFT
        if (
            frame_length + FRAME_LENGTH_SIZE_BYTES > self.frame_size_bytes_max
            or header_size_bytes > frame_length - 4
            or serialize_type > 1
        ):
            self._fail_prefix(frame_length, header_word)
        frame_end = offset + FRAME_LENGTH_SIZE_BYTES + frame_length
        if frame_end > len(buffer):
            return self._need_data(available)
        header_start = offset + FRAME_PREFIX_SIZE_BYTES
        header_end = header_start + header_size_bytes
        if type(buffer) is bytes:
            header = buffer[header_start:header_end]
            body = buffer[header_end:frame_end]
        else:
            # A bytearray slice is a bytearray; going through a view copies the body only once.
            with memoryview(buffer) as view:
                header = view[header_start:header_end].tobytes()
                body = view[header_end:frame_end].tobytes()
        self._offset = frame_end
        try:
            if serialize_type == 0:  # JSON: skip decode_command's dispatch on the usual path
                command = decode_json_command(header, body)
            else:
                command = decode_command(serialize_type, header, body)
        except RemoteProtocolError as error:
            self._set_error(error)
            raise
        self._commands_received += 1
        return command

    def _next_command_short(self, available: int) -> Literal[Sentinel.NEED_DATA, Sentinel.CLOSED]:
        """Fewer than 8 bytes: check the length field if it is there, then wait or close."""
        if available >= FRAME_LENGTH_SIZE_BYTES:
            (frame_length,) = FRAME_LENGTH.unpack_from(self._buffer, self._offset)
            try:
                check_frame_length(frame_length, self.frame_size_bytes_max)
            except RemoteProtocolError as error:
                self._set_error(error)
                raise
        return self._need_data(available)

    def _need_data(self, available: int) -> Literal[Sentinel.NEED_DATA, Sentinel.CLOSED]:
        if not self._eof:
            return NEED_DATA
        if available == 0:
            return CLOSED
        error = RemoteProtocolError(f"end of stream inside a frame, {available} bytes into it")
        self._set_error(error)
        raise error

    def _fail_prefix(self, frame_length: int, header_word: int) -> None:
        try:
            check_frame_length(frame_length, self.frame_size_bytes_max)
            check_header_word(frame_length, header_word)
        except RemoteProtocolError as error:
            self._set_error(error)
            raise
        raise AssertionError("unreachable")

    def _set_error(self, error: RemoteProtocolError) -> None:
        self._error = error
        self._buffer = b""  # a dead connection holds no memory
        self._offset = 0

    # -- sending ----------------------------------------------------------------------------------

    def send(self, command: RemotingCommand) -> bytes:
        """The frame of `command`, to be written to the socket as it is."""
        frame = encode_command(command, self.frame_size_bytes_max)
        self._commands_sent += 1
        self._bytes_sent += len(frame)
        return frame

    def send_response(
        self,
        request: RemotingCommand,
        code: int,
        ext_fields: dict[str, str],
        *,
        remark: str | None = None,
        body: bytes = b"",
    ) -> bytes:
        """The frame of the response to `request`: the same bytes as
        `send(request.make_response(code, ext_fields, remark=remark, body=body))`, faster."""
        assert request.flag & FLAG_RESPONSE == 0
        serialize_type = request.serialize_type
        header = encode_response_header(request.opaque, serialize_type, code, ext_fields, remark)
        header_size_bytes = len(header)
        frame_length = HEADER_WORD_SIZE_BYTES + header_size_bytes + len(body)
        if frame_length + FRAME_LENGTH_SIZE_BYTES > self.frame_size_bytes_max:
            # Let the general encoder raise its precise LocalProtocolError.
            return self.send(request.make_response(code, ext_fields, remark=remark, body=body))
        frame = (
            FRAME_PREFIX.pack(
                frame_length, (serialize_type << SERIALIZE_TYPE_SHIFT) | header_size_bytes
            )
            + header
            + body
        )
        self._commands_sent += 1
        self._bytes_sent += FRAME_LENGTH_SIZE_BYTES + frame_length
        return frame

    def send_head(self, command: RemotingCommand, body_size_bytes: int) -> bytes:
        """Prefix and header of a frame whose `body_size_bytes` body the caller writes itself."""
        head = encode_command_head(command, body_size_bytes, self.frame_size_bytes_max)
        self._commands_sent += 1
        self._bytes_sent += len(head) + body_size_bytes
        return head

    def next_opaque(self) -> int:
        """A fresh request id: 0, 1, 2, ... with the sign bit kept clear, then round again."""
        opaque = self._opaque_next
        self._opaque_next = (opaque + 1) & _OPAQUE_MASK
        return opaque

    # -- inspection -------------------------------------------------------------------------------

    @property
    def failed(self) -> bool:
        """True once a RemoteProtocolError has been raised: the owner must close the socket."""
        return self._error is not None

    def statistics(self) -> ConnectionStatistics:
        return ConnectionStatistics(
            commands_received=self._commands_received,
            bytes_received=self._bytes_received,
            commands_sent=self._commands_sent,
            bytes_sent=self._bytes_sent,
            bytes_buffered=len(self._buffer) - self._offset,
        )
