"""Byte layout of a ring segment and of the parcels inside it: the one place it is drawn.

Owns: every offset, size, magic number and reserved parcel type of the shared-memory rings in
mqbox/ipc. Never: code that touches memory (ring.py does), and no message formats (ipc knows no
messages; a parcel's payload is opaque bytes here). Other docs link to this file; they do not
copy the diagrams.

Invariants, asserted below at import: every counter sits on its own 128-byte line, so the
producer and the consumer never write the same line; every field is an aligned 8-byte word, so
one store publishes it whole; the data area starts on a line boundary; a parcel header is one
aligned 8-byte word.

Ring segment: one posix_ipc shared-memory object named `/mqbox.<instance>.<role>.<n>` (names.py),
`DATA_OFFSET_BYTES + capacity_bytes` long. Counters are int64, little-endian (x86-64).

```
byte 0     +------------------------------------------------------------------------+
           | descriptor line: written once by Ring.create, read-only afterwards     |
           |   +0 magic (stored last)   +8 version   +16 capacity_bytes             |
           |   +24 payload_size_bytes_max                                           |
byte 128   +------------------------------------------------------------------------+
           | producer line: written only by the producer                            |
           |   +0 head_bytes (monotonic: end of the last batch stored)              |
           |   +8 producer_pid   +16 parcel_count_written                           |
           |   +24 payload_size_bytes_written   +32 batch_count_written             |
           |   +40 padding_count_written   +48 full_count   +56 doorbell_count_rung |
byte 256   +------------------------------------------------------------------------+
           | consumer line: written only by the consumer                            |
           |   +0 tail_bytes (monotonic: start of the oldest unreleased parcel)     |
           |   +8 consumer_pid   +16 parcel_count_read                              |
           |   +24 payload_size_bytes_read   +32 batch_count_read                   |
           |   +40 doorbell_count_waited                                            |
byte 384   +------------------------------------------------------------------------+
           | doorbell line: written only by the consumer, read by the producer      |
           |   +0 waiting_sequence (odd while the consumer sleeps or is about to)   |
byte 512   +------------------------------------------------------------------------+
           | data: capacity_bytes (a power of two) of parcels, back to back; no     |
           | parcel straddles the end: a padding parcel fills the gap instead       |
           +------------------------------------------------------------------------+
```

A position in the data area is `counter & (capacity_bytes - 1)`: head and tail are 64-bit byte
counters that only grow, so `head_bytes - tail_bytes` is the number of bytes in use and no flag is
needed to tell a full ring from an empty one (2**63 bytes at 10 GB/s last 29 years).

Parcel, 8-byte aligned:

```
+0           +4           +8                                 +length     next multiple of 8
+------------+------------+----------------------------------+-----------+
| length i32 | type i32   | payload: length - 8 bytes        | zero fill |
+------------+------------+----------------------------------+-----------+
|<-- header: one int64 -->|  (type << 32) | length, aligned, stored last
```

`length` counts the header and the payload, so a published parcel never has length 0. The
producer zeroes a parcel's header word before it writes the payload, and it stores the whole header
word last: that store publishes the parcel. The consumer follows the chain from `tail_bytes` and
stops at the first header word that is still 0, so it never sees a parcel before its length. The
word just after the last published parcel is always 0 (the producer keeps it zero and counts it in
`END_RESERVE_BYTES`), so the chain always ends where the producer stopped, including when a
producer is killed between a payload and its header.

A padding parcel (type `PADDING_PARCEL_TYPE`, no payload) runs from its header to the end of the
data area. The producer writes one when the next parcel does not fit before the end; the consumer
skips it and carries on at the start of the data area.
"""

from __future__ import annotations

# Cache lines are 64 bytes on x86-64, but the L2 spatial prefetcher fetches lines in pairs, so two
# counters 64 bytes apart can still bounce between cores. 128 bytes keeps them apart (Agrona pads
# its ring counters to two lines for the same reason).
CACHE_LINE_SIZE_BYTES = 128
WORD_SIZE_BYTES = 8

RING_MAGIC = int.from_bytes(b"MQBXRING", "little")
RING_VERSION = 1

# Descriptor line.
DESCRIPTOR_LINE_OFFSET_BYTES = 0
MAGIC_OFFSET_BYTES = DESCRIPTOR_LINE_OFFSET_BYTES + 0
VERSION_OFFSET_BYTES = DESCRIPTOR_LINE_OFFSET_BYTES + 8
CAPACITY_OFFSET_BYTES = DESCRIPTOR_LINE_OFFSET_BYTES + 16
PAYLOAD_SIZE_MAX_OFFSET_BYTES = DESCRIPTOR_LINE_OFFSET_BYTES + 24

# Producer line.
PRODUCER_LINE_OFFSET_BYTES = 128
HEAD_OFFSET_BYTES = PRODUCER_LINE_OFFSET_BYTES + 0
PRODUCER_PID_OFFSET_BYTES = PRODUCER_LINE_OFFSET_BYTES + 8
PARCEL_COUNT_WRITTEN_OFFSET_BYTES = PRODUCER_LINE_OFFSET_BYTES + 16
PAYLOAD_SIZE_WRITTEN_OFFSET_BYTES = PRODUCER_LINE_OFFSET_BYTES + 24
BATCH_COUNT_WRITTEN_OFFSET_BYTES = PRODUCER_LINE_OFFSET_BYTES + 32
PADDING_COUNT_WRITTEN_OFFSET_BYTES = PRODUCER_LINE_OFFSET_BYTES + 40
FULL_COUNT_OFFSET_BYTES = PRODUCER_LINE_OFFSET_BYTES + 48
DOORBELL_COUNT_RUNG_OFFSET_BYTES = PRODUCER_LINE_OFFSET_BYTES + 56

# Consumer line.
CONSUMER_LINE_OFFSET_BYTES = 256
TAIL_OFFSET_BYTES = CONSUMER_LINE_OFFSET_BYTES + 0
CONSUMER_PID_OFFSET_BYTES = CONSUMER_LINE_OFFSET_BYTES + 8
PARCEL_COUNT_READ_OFFSET_BYTES = CONSUMER_LINE_OFFSET_BYTES + 16
PAYLOAD_SIZE_READ_OFFSET_BYTES = CONSUMER_LINE_OFFSET_BYTES + 24
BATCH_COUNT_READ_OFFSET_BYTES = CONSUMER_LINE_OFFSET_BYTES + 32
DOORBELL_COUNT_WAITED_OFFSET_BYTES = CONSUMER_LINE_OFFSET_BYTES + 40

# Doorbell line.
DOORBELL_LINE_OFFSET_BYTES = 384
WAITING_SEQUENCE_OFFSET_BYTES = DOORBELL_LINE_OFFSET_BYTES + 0

DATA_OFFSET_BYTES = 512

# Parcels.
PARCEL_HEADER_SIZE_BYTES = 8
PARCEL_LENGTH_OFFSET_BYTES = 0
PARCEL_TYPE_OFFSET_BYTES = 4
PARCEL_ALIGNMENT_BYTES = 8
PARCEL_LENGTH_MASK = 0xFFFF_FFFF  # low half of the header word
PARCEL_TYPE_SHIFT = 32  # high half of the header word
PADDING_PARCEL_TYPE = -1
PARCEL_TYPE_MAX = 2**31 - 1  # callers use 0..PARCEL_TYPE_MAX; negative types are reserved
# The zero word the producer keeps after its last parcel: the end of the consumer's chain.
END_RESERVE_BYTES = PARCEL_HEADER_SIZE_BYTES

CAPACITY_BYTES_MIN = 4096
CAPACITY_BYTES_MAX = 2**30  # lengths are int32; a 1 GiB ring is already far past any L3 cache


def payload_size_bytes_max_default(capacity_bytes: int) -> int:
    """The largest payload a ring of `capacity_bytes` accepts unless configured lower: half the
    ring, header included, so one parcel can be in flight while the consumer holds another."""
    return capacity_bytes // 2 - PARCEL_HEADER_SIZE_BYTES


def parcel_size_bytes(payload_size_bytes: int) -> int:
    """Bytes a parcel with this payload occupies in the data area: header, payload, zero fill."""
    length = PARCEL_HEADER_SIZE_BYTES + payload_size_bytes
    return (length + PARCEL_ALIGNMENT_BYTES - 1) & -PARCEL_ALIGNMENT_BYTES


def segment_size_bytes(capacity_bytes: int) -> int:
    """Size of the whole shared-memory object for a data area of `capacity_bytes`."""
    return DATA_OFFSET_BYTES + capacity_bytes


_LINES = (
    (DESCRIPTOR_LINE_OFFSET_BYTES, (MAGIC_OFFSET_BYTES, PAYLOAD_SIZE_MAX_OFFSET_BYTES)),
    (PRODUCER_LINE_OFFSET_BYTES, (HEAD_OFFSET_BYTES, DOORBELL_COUNT_RUNG_OFFSET_BYTES)),
    (CONSUMER_LINE_OFFSET_BYTES, (TAIL_OFFSET_BYTES, DOORBELL_COUNT_WAITED_OFFSET_BYTES)),
    (DOORBELL_LINE_OFFSET_BYTES, (WAITING_SEQUENCE_OFFSET_BYTES, WAITING_SEQUENCE_OFFSET_BYTES)),
)
for _line_offset_bytes, (_first_field, _last_field) in _LINES:
    assert _line_offset_bytes % CACHE_LINE_SIZE_BYTES == 0
    assert _first_field == _line_offset_bytes
    assert _last_field + WORD_SIZE_BYTES <= _line_offset_bytes + CACHE_LINE_SIZE_BYTES
assert PRODUCER_LINE_OFFSET_BYTES == DESCRIPTOR_LINE_OFFSET_BYTES + CACHE_LINE_SIZE_BYTES
assert CONSUMER_LINE_OFFSET_BYTES == PRODUCER_LINE_OFFSET_BYTES + CACHE_LINE_SIZE_BYTES
assert DOORBELL_LINE_OFFSET_BYTES == CONSUMER_LINE_OFFSET_BYTES + CACHE_LINE_SIZE_BYTES
assert DATA_OFFSET_BYTES == DOORBELL_LINE_OFFSET_BYTES + CACHE_LINE_SIZE_BYTES
assert HEAD_OFFSET_BYTES // CACHE_LINE_SIZE_BYTES != TAIL_OFFSET_BYTES // CACHE_LINE_SIZE_BYTES
assert DATA_OFFSET_BYTES % CACHE_LINE_SIZE_BYTES == 0
for _field_offset_bytes in (
    VERSION_OFFSET_BYTES,
    CAPACITY_OFFSET_BYTES,
    PRODUCER_PID_OFFSET_BYTES,
    PARCEL_COUNT_WRITTEN_OFFSET_BYTES,
    PAYLOAD_SIZE_WRITTEN_OFFSET_BYTES,
    BATCH_COUNT_WRITTEN_OFFSET_BYTES,
    PADDING_COUNT_WRITTEN_OFFSET_BYTES,
    FULL_COUNT_OFFSET_BYTES,
    CONSUMER_PID_OFFSET_BYTES,
    PARCEL_COUNT_READ_OFFSET_BYTES,
    PAYLOAD_SIZE_READ_OFFSET_BYTES,
    BATCH_COUNT_READ_OFFSET_BYTES,
):
    assert _field_offset_bytes % WORD_SIZE_BYTES == 0
assert PARCEL_HEADER_SIZE_BYTES == WORD_SIZE_BYTES
assert PARCEL_TYPE_OFFSET_BYTES == PARCEL_LENGTH_OFFSET_BYTES + 4
assert PARCEL_TYPE_SHIFT == 8 * PARCEL_TYPE_OFFSET_BYTES  # little-endian: type is the high half
assert PARCEL_ALIGNMENT_BYTES == WORD_SIZE_BYTES
assert END_RESERVE_BYTES % PARCEL_ALIGNMENT_BYTES == 0
assert CAPACITY_BYTES_MIN & (CAPACITY_BYTES_MIN - 1) == 0
assert CAPACITY_BYTES_MAX & (CAPACITY_BYTES_MAX - 1) == 0
assert CAPACITY_BYTES_MIN % CACHE_LINE_SIZE_BYTES == 0
# The largest parcel still has a length that fits in the int32 length field.
assert parcel_size_bytes(payload_size_bytes_max_default(CAPACITY_BYTES_MAX)) <= 2**31 - 1
assert parcel_size_bytes(payload_size_bytes_max_default(CAPACITY_BYTES_MIN)) <= (
    CAPACITY_BYTES_MIN // 2
)
assert PADDING_PARCEL_TYPE < 0
assert RING_MAGIC != 0  # attach tells an initialised segment from zeroed memory by the magic
