"""The remoting frame: its byte layout, drawn once, and the checks on its 8-byte prefix.

Owns: the frame constants, the prefix encoder and the prefix checks. Never: header contents
(command.py), buffering (connection.py), I/O. Everything is big-endian.

     byte 0      4       5             8                  8 + H              4 + L
          +------+-------+-------------+------------------+----------------------+
          | L    | type  | H           | header           | body                 |
          | int32| uint8 | uint24      | H bytes: JSON    | L - 4 - H bytes,     |
          |      | 0 JSON| header      | text, or the     | meaning set by       |
          |      | 1 RMQ | length      | binary layout    | the command code     |
          +------+-------+-------------+------------------+----------------------+
                 |<--- header word --->|
                 |<-------------------------- L bytes -------------------------->|
          |<--------------- frame: 4 + L <= frame_size_bytes_max --------------->|

- `frame_length` L counts the bytes after its own field: 4 (the header word) + H + body.
- The header word is one int32: serialize type in the high byte, header length H in the low 24
  bits. C++ reads the whole word as the header length, so what goes to C++ must be JSON (type 0).
- `frame_size_bytes_max` bounds the whole frame, 4 + L bytes, as Netty's
  LengthFieldBasedFrameDecoder does in the Java broker (16 MiB there and here). The checks below run
  as soon as the prefix has arrived, before the connection buffers the rest of the frame: a peer
  cannot make us hold more than one maximal frame by announcing a huge one.
"""

from __future__ import annotations

import struct
from typing import Final

from mqbox.protocol.errors import LocalProtocolError, RemoteProtocolError

MiB: Final = 1 << 20

FRAME_LENGTH_SIZE_BYTES: Final = 4
HEADER_WORD_SIZE_BYTES: Final = 4
FRAME_PREFIX_SIZE_BYTES: Final = FRAME_LENGTH_SIZE_BYTES + HEADER_WORD_SIZE_BYTES
HEADER_LENGTH_MASK: Final = 0x00FF_FFFF
HEADER_SIZE_BYTES_MAX: Final = HEADER_LENGTH_MASK
SERIALIZE_TYPE_SHIFT: Final = 24
FRAME_SIZE_BYTES_MAX_DEFAULT: Final = 16 * MiB
# The smallest legal frame_length: a header word and nothing else.
FRAME_LENGTH_MIN: Final = HEADER_WORD_SIZE_BYTES

SERIALIZE_TYPE_JSON: Final = 0
SERIALIZE_TYPE_ROCKETMQ: Final = 1

# Unpacks (frame_length as int32, header word as uint32) in one call.
FRAME_PREFIX: Final = struct.Struct(">iI")
FRAME_LENGTH: Final = struct.Struct(">i")

assert FRAME_PREFIX.size == FRAME_PREFIX_SIZE_BYTES
assert FRAME_LENGTH.size == FRAME_LENGTH_SIZE_BYTES
assert FRAME_SIZE_BYTES_MAX_DEFAULT <= 2**31 - 1  # frame_length is a signed int32
assert HEADER_LENGTH_MASK >> SERIALIZE_TYPE_SHIFT == 0


def check_frame_length(frame_length: int, frame_size_bytes_max: int) -> None:
    """Raise RemoteProtocolError unless `frame_length` (field L) announces an acceptable frame."""
    if frame_length < FRAME_LENGTH_MIN:
        raise RemoteProtocolError(
            f"frame length {frame_length} is below the minimum {FRAME_LENGTH_MIN}"
        )
    if frame_length + FRAME_LENGTH_SIZE_BYTES > frame_size_bytes_max:
        raise RemoteProtocolError(
            f"frame of {frame_length + FRAME_LENGTH_SIZE_BYTES} bytes exceeds the maximum "
            f"{frame_size_bytes_max}"
        )


def check_header_word(frame_length: int, header_word: int) -> tuple[int, int]:
    """Split a header word into (serialize_type, header_size_bytes), checked against the frame.

    The caller has already checked `frame_length` with `check_frame_length`.
    """
    assert frame_length >= FRAME_LENGTH_MIN
    serialize_type = header_word >> SERIALIZE_TYPE_SHIFT
    header_size_bytes = header_word & HEADER_LENGTH_MASK
    if serialize_type != SERIALIZE_TYPE_JSON and serialize_type != SERIALIZE_TYPE_ROCKETMQ:
        raise RemoteProtocolError(f"unknown serialize type {serialize_type}")
    if header_size_bytes > frame_length - HEADER_WORD_SIZE_BYTES:
        raise RemoteProtocolError(
            f"header length {header_size_bytes} exceeds the {frame_length - 4} bytes of the frame"
        )
    return serialize_type, header_size_bytes


def encode_frame_prefix(
    serialize_type: int, header_size_bytes: int, body_size_bytes: int, frame_size_bytes_max: int
) -> bytes:
    """The 8 bytes that precede a header of `header_size_bytes` and a body of `body_size_bytes`.

    Raises LocalProtocolError when mqbox built a frame its peer would refuse: that is our bug.
    """
    assert serialize_type in (SERIALIZE_TYPE_JSON, SERIALIZE_TYPE_ROCKETMQ)
    assert header_size_bytes >= 0
    assert body_size_bytes >= 0
    if header_size_bytes > HEADER_SIZE_BYTES_MAX:
        raise LocalProtocolError(f"header of {header_size_bytes} bytes does not fit 24 bits")
    frame_length = HEADER_WORD_SIZE_BYTES + header_size_bytes + body_size_bytes
    if frame_length + FRAME_LENGTH_SIZE_BYTES > frame_size_bytes_max:
        raise LocalProtocolError(
            f"frame of {frame_length + FRAME_LENGTH_SIZE_BYTES} bytes exceeds the maximum "
            f"{frame_size_bytes_max}"
        )
    return FRAME_PREFIX.pack(
        frame_length, (serialize_type << SERIALIZE_TYPE_SHIFT) | header_size_bytes
    )
