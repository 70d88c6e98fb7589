"""Plain-Python twins of the idempotent window's kernels (store/idempotence.py), for tests.

Owns: a second statement of hash_record_keys (struct.unpack_from, message.decode_properties and a
hash loop written again), and of the tables' probing (table_find_first, table_find_next,
table_insert) over Python lists. It shares no helper with the kernels. A unit test feeds both
the same bytes and the same operations and asserts the same answers.

Never: used on the data plane, or changed without its kernel.
"""

from __future__ import annotations

import struct

from mqbox.message import BLANK_MAGIC, MESSAGE_MAGIC, decode_properties

HASH_STOP_END = 0
HASH_STOP_FULL = 1
HASH_STOP_BLANK = 2
HASH_STOP_DAMAGED = 3

_MASK64 = (1 << 64) - 1
_SIZE_AND_MAGIC = struct.Struct(">iI")  # TOTALSIZE at 0, MAGICCODE at 4
_BODY_LENGTH = struct.Struct(">i")  # at 84
_PROPERTIES_LENGTH = struct.Struct(">h")
_STORE_TIMESTAMP = struct.Struct(">q")  # at 56


def fnv1a_ref(data: bytes, value: int = 0xCBF29CE484222325) -> int:
    for byte in data:
        value = ((value ^ byte) * 0x100000001B3) & _MASK64
    return value


def finish_ref(value: int) -> int:
    """MurmurHash3's fmix64."""
    value ^= value >> 33
    value = (value * 0xFF51AFD7ED558CCD) & _MASK64
    value ^= value >> 33
    value = (value * 0xC4CEB9FE1A85EC53) & _MASK64
    value ^= value >> 33
    return value


def key_hash_ref(topic: bytes, uniq_key: bytes) -> int:
    return finish_ref(fnv1a_ref(topic + b"\x01" + uniq_key))


def hash_record_keys_ref(
    buffer: bytes, start: int, end: int, capacity: int
) -> tuple[list[tuple[int, int, int, int, bool]], int, int]:
    """([(position, key hash, topic hash, store timestamp, has key)], stop position, reason)."""
    found: list[tuple[int, int, int, int, bool]] = []
    position = start
    while True:
        if position == end:
            return found, position, HASH_STOP_END
        if len(found) == capacity:
            return found, position, HASH_STOP_FULL
        if end - position < 8:
            return found, position, HASH_STOP_DAMAGED
        size, magic = _SIZE_AND_MAGIC.unpack_from(buffer, position)
        if magic == BLANK_MAGIC:
            return found, position, HASH_STOP_BLANK
        if magic != MESSAGE_MAGIC or size < 91 or size > end - position:
            return found, position, HASH_STOP_DAMAGED
        (body_size,) = _BODY_LENGTH.unpack_from(buffer, position + 84)
        if body_size < 0 or body_size > size - 91:
            return found, position, HASH_STOP_DAMAGED
        topic_size = buffer[position + 88 + body_size]
        if 91 + body_size + topic_size > size:
            return found, position, HASH_STOP_DAMAGED
        topic_at = position + 89 + body_size
        topic = buffer[topic_at : topic_at + topic_size]
        (properties_size,) = _PROPERTIES_LENGTH.unpack_from(buffer, topic_at + topic_size)
        if 91 + body_size + topic_size + properties_size != size:
            return found, position, HASH_STOP_DAMAGED
        properties_at = topic_at + topic_size + 2
        properties = decode_properties(buffer[properties_at : properties_at + properties_size])
        uniq_key = properties.get(b"UNIQ_KEY")
        (store_timestamp_ms,) = _STORE_TIMESTAMP.unpack_from(buffer, position + 56)
        found.append(
            (
                position,
                0 if uniq_key is None else key_hash_ref(topic, uniq_key),
                finish_ref(fnv1a_ref(topic)),
                store_timestamp_ms,
                uniq_key is not None,
            )
        )
        position += size


class TableRef:
    """One generation's table as lists: linear probing over 2^k slots, offset + 1 (0 = empty)."""

    def __init__(self, slot_count: int) -> None:
        assert slot_count & (slot_count - 1) == 0
        self.hashes = [0] * slot_count
        self.offsets = [0] * slot_count

    def find_first(self, key_hash: int) -> int:
        mask = len(self.hashes) - 1
        slot = key_hash & mask
        while self.offsets[slot]:
            if self.hashes[slot] == key_hash:
                return slot
            slot = (slot + 1) & mask
        return -1

    def find_next(self, key_hash: int, after: int) -> int:
        mask = len(self.hashes) - 1
        slot = (after + 1) & mask
        while self.offsets[slot]:
            if self.hashes[slot] == key_hash:
                return slot
            slot = (slot + 1) & mask
        return -1

    def insert(self, key_hash: int, log_offset: int) -> None:
        mask = len(self.hashes) - 1
        slot = key_hash & mask
        while self.offsets[slot]:
            slot = (slot + 1) & mask
        self.hashes[slot] = key_hash
        self.offsets[slot] = log_offset + 1
