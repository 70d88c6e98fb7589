"""The producer's data plane: one numba pass that writes a batch body of plain messages.

Owns: encode_plain_batch, the kernel that lays out a SEND_BATCH_MESSAGE body (message.py draws
the element layout) for elements that are bodies alone, each with its own UNIQ_KEY property and
nothing else, and writes the elements' UNIQ_KEYs joined by commas (the SendResult's msg_id); and
the sizes the parent allocates. Its twin is the general path, message.encode_batch_elements over
message.UniqKeyGenerator.next_keys's keys (outgoing.encode_batch), which shares no code with it;
tests/unit/client/test_batch_kernels.py feeds both the same bodies and asserts equal bytes.

Never: imports anything but mqbox._jit, mqbox.message and mqbox.message_kernels; allocates (the
caller passes `out` and `out_keys`, sized by plain_batch_size_bytes and joined_keys_size_bytes),
checks sizes against limits (the parent did), or holds the GIL
(`nogil`, _jit.py): the transport's reading thread runs while a big batch is encoded.

A UNIQ_KEY is 32 uppercase hex characters: a head of 28 the whole batch shares (the client's
IP, pid and salt, and the ms since the start of the month: UniqKeyGenerator.reserve) and the
element's 16-bit counter, `counter_start + i` wrapping at 65536, as 4 hex digits.
"""

from __future__ import annotations

from typing import Final

import numpy as np
from numpy.typing import NDArray

from mqbox._jit import kernel
from mqbox.message import (
    BATCH_BODY_LENGTH_POSITION_BYTES,
    BATCH_BODY_POSITION_BYTES,
    BATCH_ELEMENT_SIZE_BYTES_MIN,
    PROPERTY_SEPARATOR,
    PROPERTY_UNIQ_KEY,
    UNIQ_KEY_SIZE_CHARS,
)
from mqbox.message_kernels import write_i32_be

UNIQ_KEY_COUNTER_SIZE_CHARS: Final = 4
UNIQ_KEY_HEAD_SIZE_CHARS: Final = UNIQ_KEY_SIZE_CHARS - UNIQ_KEY_COUNTER_SIZE_CHARS
_PROPERTY_PREFIX: Final = np.frombuffer(PROPERTY_UNIQ_KEY.encode() + b"\x01", dtype=np.uint8)
# The element's properties: UNIQ_KEY 0x01 <32 hex> 0x02.
UNIQ_KEY_PROPERTIES_SIZE_BYTES: Final = len(_PROPERTY_PREFIX) + UNIQ_KEY_SIZE_CHARS + 1
PLAIN_ELEMENT_OVERHEAD_BYTES: Final = BATCH_ELEMENT_SIZE_BYTES_MIN + UNIQ_KEY_PROPERTIES_SIZE_BYTES
_HEX_DIGITS: Final = np.frombuffer(b"0123456789ABCDEF", dtype=np.uint8)
_COMMA: Final = ord(",")

assert UNIQ_KEY_PROPERTIES_SIZE_BYTES == 42
assert PLAIN_ELEMENT_OVERHEAD_BYTES == 64


def plain_batch_size_bytes(body_size_bytes_total: int, count: int) -> int:
    """The size of the batch body encode_plain_batch writes."""
    return body_size_bytes_total + count * PLAIN_ELEMENT_OVERHEAD_BYTES


def joined_keys_size_bytes(count: int) -> int:
    """The size of the comma-joined UNIQ_KEYs encode_plain_batch writes."""
    return count * (UNIQ_KEY_SIZE_CHARS + 1) - 1


@kernel
def encode_plain_batch(
    bodies: NDArray[np.uint8],
    body_sizes: NDArray[np.int64],
    key_head: NDArray[np.uint8],
    counter_start: int,
    out: NDArray[np.uint8],
    out_keys: NDArray[np.uint8],
) -> int:
    """Write the batch body of `len(body_sizes)` elements into `out` and their UNIQ_KEYs,
    joined by commas, into `out_keys`; the bytes written to `out`.

    `bodies` holds the element bodies back to back (body i has body_sizes[i] bytes); `key_head`
    the 28 shared ASCII hex characters of every UNIQ_KEY. Each element: TOTALSIZE, MAGIC 0,
    BODYCRC 0, FLAG 0, BODYLEN (big-endian int32s), the body, PROPSLEN (int16, 42), then
    `UNIQ_KEY 0x01 <head><counter as 4 hex digits> 0x02`."""
    position = 0
    body_at = 0
    key_at = 0
    prefix_size = _PROPERTY_PREFIX.shape[0]
    head_size = key_head.shape[0]
    for index in range(body_sizes.shape[0]):
        size = body_sizes[index]
        write_i32_be(
            out, position, BATCH_ELEMENT_SIZE_BYTES_MIN + size + UNIQ_KEY_PROPERTIES_SIZE_BYTES
        )
        for zero in range(4, BATCH_BODY_LENGTH_POSITION_BYTES):  # MAGIC, BODYCRC, FLAG
            out[position + zero] = 0
        write_i32_be(out, position + BATCH_BODY_LENGTH_POSITION_BYTES, size)
        position += BATCH_BODY_POSITION_BYTES
        for offset in range(size):
            out[position + offset] = bodies[body_at + offset]
        position += size
        body_at += size
        out[position] = 0
        out[position + 1] = UNIQ_KEY_PROPERTIES_SIZE_BYTES
        position += 2
        for offset in range(prefix_size):
            out[position + offset] = _PROPERTY_PREFIX[offset]
        position += prefix_size
        if index > 0:
            out_keys[key_at] = _COMMA
            key_at += 1
        for offset in range(head_size):
            out[position + offset] = key_head[offset]
            out_keys[key_at + offset] = key_head[offset]
        position += head_size
        key_at += head_size
        counter = (counter_start + index) & 0xFFFF
        for digit in range(4):
            hexed = _HEX_DIGITS[(counter >> (12 - 4 * digit)) & 0xF]
            out[position + digit] = hexed
            out_keys[key_at + digit] = hexed
        position += 4
        key_at += 4
        out[position] = PROPERTY_SEPARATOR
        position += 1
    return position
