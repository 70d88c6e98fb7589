"""The idempotent produce window: which UNIQ_KEYs this broker stored lately, so that a send that
asks for it is answered with the first result instead of being stored twice.

Owns: IdempotenceWindow (two generations of an open-addressing table from a 64-bit hash of
(topic, UNIQ_KEY) to the log offset of the record that carried it), the kernels that hash the
records of a batch (hash_record_keys) and search and fill a table (table_find_first,
table_find_next, table_insert), the rebuild of the window from the commit log at open
(rebuild_window), the check of a candidate against the stored record (stored_identity), and
`config/mqboxIdempotentTopics.json`, the topics that ever received an idempotent send. The store
writer is the only process that holds a window and the only writer of that file.

Never: decides what a duplicate is answered (the store writer does, from the stored record),
trusts a hash (a candidate counts only once the stored record's topic and UNIQ_KEY equal the new
one's, byte for byte), or allocates a table before the first idempotent send (a broker that is
never asked pays nothing).

Theory of operation (docs/idempotence.md has the whole design):

1. A send asks per request (the `mqboxIdempotent` header field, docs/protocol.md section 4.2).
   The store writer, the one process that appends, looks each record's key up and appends only
   the records it does not find; find-then-append needs no lock because one thread does both.
2. Generations. Inserts go to the current generation. It is retired when it holds
   `key_count_max` keys or when its first insert is `window_ms` old: the previous generation is
   dropped and the current one becomes the previous. Lookups search both. So a key is found for
   at least `window_ms` or until `key_count_max` newer keys were inserted, whichever ends first,
   and the tables never hold more than 2 x key_count_max keys: bounded, without deletions.
3. Tables: linear probing over 2^k slots, at most half full (slots >= 2 x key_count_max); a slot
   holds the 64-bit key hash and log offset + 1 (0 = empty, so np.zeros makes an empty table
   whose pages the kernel maps only when they are first written). Equal hashes may repeat; a
   lookup walks all of them (table_find_next) until the stored record matches.
4. Restarts. At open, the window is rebuilt from the commit log: every record of a topic named
   in mqboxIdempotentTopics.json that carries a UNIQ_KEY and was stored within the window (by
   STORETIMESTAMP), in log order, with the same generation rules. This is a superset of the keys
   the window held before (a plain send to such a topic is in it too): harmless, because a
   UNIQ_KEY names one message. The scan starts at the last segment whose first record is older
   than the window, so it reads the window's bytes and at most one segment before them.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import struct
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Final, Protocol

import numpy as np
from numpy.typing import NDArray

from mqbox._jit import kernel
from mqbox.errors import StoreError
from mqbox.message import (
    BLANK_MAGIC,
    BODY_LENGTH_POSITION_BYTES,
    BODY_POSITION_BYTES,
    MAGICCODE_POSITION_BYTES,
    MESSAGE_MAGIC,
    PROPERTIES_LENGTH_SIZE_BYTES,
    PROPERTY_NAME_VALUE_SEPARATOR,
    PROPERTY_SEPARATOR,
    PROPERTY_UNIQ_KEY,
    QUEUEID_POSITION_BYTES,
    QUEUEOFFSET_POSITION_BYTES,
    RECORD_SIZE_BYTES_MIN,
    STORETIMESTAMP_POSITION_BYTES,
    TOPIC_LENGTH_SIZE_BYTES,
    TOTALSIZE_POSITION_BYTES,
)
from mqbox.message_kernels import (
    find_property,
    read_s16_be,
    read_s32_be,
    read_s64_be,
    read_u8,
    read_u32_be,
)
from mqbox.store.layout import config_dir
from mqbox.store.mapped_file import write_file_atomically

log = logging.getLogger("mqbox.store.idempotence")

IDEMPOTENT_TOPICS_FILE_NAME: Final = "mqboxIdempotentTopics.json"
REBUILD_CHUNK_RECORD_COUNT: Final = 65_536

# The property name whose value is hashed, as the array find_property takes.
UNIQ_KEY_NAME = np.frombuffer(PROPERTY_UNIQ_KEY.encode("ascii"), dtype=np.uint8).copy()
UNIQ_KEY_NAME.flags.writeable = False
assert PROPERTY_NAME_VALUE_SEPARATOR not in UNIQ_KEY_NAME
assert PROPERTY_SEPARATOR not in UNIQ_KEY_NAME

# --- Hashes -------------------------------------------------------------------------------------
# FNV-1a over the topic, one 0x01 byte (a topic never holds it) and the UNIQ_KEY, then MurmurHash3's
# 64-bit finalizer, so the low bits that pick a slot depend on every byte. Constants are uint64:
# numba turns uint64 mixed with a plain int into float64.

_FNV_OFFSET: Final = np.uint64(0xCBF29CE484222325)
_FNV_PRIME: Final = np.uint64(0x100000001B3)
_MIX_1: Final = np.uint64(0xFF51AFD7ED558CCD)
_MIX_2: Final = np.uint64(0xC4CEB9FE1A85EC53)
_SHIFT: Final = np.uint64(33)
_SEPARATOR: Final = np.uint64(PROPERTY_NAME_VALUE_SEPARATOR)


@kernel
def _fnv1a(buffer: NDArray[np.uint8], start: int, end: int, value: np.uint64) -> np.uint64:
    for at in range(start, end):
        value = (value ^ np.uint64(buffer[at])) * _FNV_PRIME
    return value


@kernel
def _finish(value: np.uint64) -> np.uint64:
    value ^= value >> _SHIFT
    value *= _MIX_1
    value ^= value >> _SHIFT
    value *= _MIX_2
    value ^= value >> _SHIFT
    return value


# Why hash_record_keys stopped, its third result.
HASH_STOP_END = 0  # reached end_bytes after a whole record
HASH_STOP_FULL = 1  # the out arrays are full: call again from the stop position
HASH_STOP_BLANK = 2  # an end-of-segment blank starts at the stop position
HASH_STOP_DAMAGED = 3  # not a whole, consistent record (never below a recovered write position)


@kernel
def hash_record_keys(
    buffer: NDArray[np.uint8],
    start_bytes: int,
    end_bytes: int,
    out_position_bytes: NDArray[np.int64],
    out_key_hash: NDArray[np.uint64],
    out_topic_hash: NDArray[np.uint64],
    out_store_timestamp_ms: NDArray[np.int64],
    out_has_key: NDArray[np.bool_],
) -> tuple[int, int, int]:
    """Walk the stored records back to back in buffer[start_bytes:end_bytes].

    Returns (record_count, stop_position_bytes, stop_reason); entry i < record_count of each out
    array describes record i: where it starts, the hash of (topic, UNIQ_KEY) (0 and has_key
    False when it carries no UNIQ_KEY), the hash of its topic alone, its STORETIMESTAMP. Checks
    per record: 8 bytes left, the blank's magic (BLANK) or a message's (else DAMAGED), TOTALSIZE
    >= 91 and within end_bytes, body, topic and properties lengths adding up to TOTALSIZE.
    """
    assert 0 <= start_bytes <= end_bytes <= buffer.size
    capacity = out_position_bytes.size
    position = start_bytes
    count = 0
    reason = HASH_STOP_END
    while True:
        if position == end_bytes:
            reason = HASH_STOP_END
            break
        if count == capacity:
            reason = HASH_STOP_FULL
            break
        available = end_bytes - position
        if available < 8:
            reason = HASH_STOP_DAMAGED
            break
        magic = read_u32_be(buffer, position + MAGICCODE_POSITION_BYTES)
        if magic == BLANK_MAGIC:
            reason = HASH_STOP_BLANK
            break
        size = read_s32_be(buffer, position + TOTALSIZE_POSITION_BYTES)
        if magic != MESSAGE_MAGIC or size < RECORD_SIZE_BYTES_MIN or size > available:
            reason = HASH_STOP_DAMAGED
            break
        body_size = read_s32_be(buffer, position + BODY_LENGTH_POSITION_BYTES)
        if body_size < 0 or body_size > size - RECORD_SIZE_BYTES_MIN:
            reason = HASH_STOP_DAMAGED
            break
        topic_length_at = position + BODY_POSITION_BYTES + body_size
        topic_size = read_u8(buffer, topic_length_at)
        if RECORD_SIZE_BYTES_MIN + body_size + topic_size > size:
            reason = HASH_STOP_DAMAGED
            break
        topic_at = topic_length_at + TOPIC_LENGTH_SIZE_BYTES
        properties_length_at = topic_at + topic_size
        properties_size = read_s16_be(buffer, properties_length_at)
        if RECORD_SIZE_BYTES_MIN + body_size + topic_size + properties_size != size:
            reason = HASH_STOP_DAMAGED
            break
        properties_at = properties_length_at + PROPERTIES_LENGTH_SIZE_BYTES
        key_start, key_end = find_property(
            buffer, properties_at, properties_at + properties_size, UNIQ_KEY_NAME
        )
        topic_hash = _fnv1a(buffer, topic_at, topic_at + topic_size, _FNV_OFFSET)
        out_position_bytes[count] = position
        out_topic_hash[count] = _finish(topic_hash)
        out_store_timestamp_ms[count] = read_s64_be(
            buffer, position + STORETIMESTAMP_POSITION_BYTES
        )
        if key_start >= 0:
            key_hash = (topic_hash ^ _SEPARATOR) * _FNV_PRIME
            out_key_hash[count] = _finish(_fnv1a(buffer, key_start, key_end, key_hash))
            out_has_key[count] = True
        else:
            out_key_hash[count] = np.uint64(0)
            out_has_key[count] = False
        count += 1
        position += size
    return count, position, reason


@kernel
def _topic_hash(topic: NDArray[np.uint8]) -> np.uint64:
    return _finish(_fnv1a(topic, 0, topic.size, _FNV_OFFSET))


def topic_hash(topic: bytes) -> int:
    """The hash hash_record_keys reports for records of `topic` (rebuild's topic filter)."""
    return int(_topic_hash(np.frombuffer(topic, dtype=np.uint8)))


# --- Tables -------------------------------------------------------------------------------------


@kernel
def table_find_first(
    slot_hashes: NDArray[np.uint64],
    slot_offsets: NDArray[np.int64],
    key_hashes: NDArray[np.uint64],
    has_key: NDArray[np.bool_],
    out_slot: NDArray[np.int64],
) -> int:
    """For each key with has_key, the first slot in its probe sequence that holds its hash, or
    -1 when an empty slot comes first (out_slot[i] is -1 for keys without has_key too). Returns
    how many keys have a slot. slot_offsets[s] is 0 for an empty slot; the table has 2^k slots and
    at least one empty one."""
    mask = slot_hashes.size - 1
    found = 0
    for index in range(key_hashes.size):
        out_slot[index] = -1
        if not has_key[index]:
            continue
        key_hash = key_hashes[index]
        slot = np.int64(key_hash & np.uint64(mask))
        while slot_offsets[slot] != 0:
            if slot_hashes[slot] == key_hash:
                out_slot[index] = slot
                found += 1
                break
            slot = (slot + 1) & mask
    return found


@kernel
def table_find_next(
    slot_hashes: NDArray[np.uint64],
    slot_offsets: NDArray[np.int64],
    key_hash: np.uint64,
    after: int,
) -> int:
    """The next slot after `after` in the probe sequence of `key_hash` that holds it, or -1."""
    mask = slot_hashes.size - 1
    slot = (after + 1) & mask
    while slot_offsets[slot] != 0:
        if slot_hashes[slot] == key_hash:
            return slot
        slot = (slot + 1) & mask
    return -1


@kernel
def table_insert(
    slot_hashes: NDArray[np.uint64],
    slot_offsets: NDArray[np.int64],
    key_hashes: NDArray[np.uint64],
    log_offsets: NDArray[np.int64],
    has_key: NDArray[np.bool_],
    start: int,
    end: int,
) -> int:
    """Put key i (start <= i < end, has_key) with log_offsets[i] in the first empty slot of its
    probe sequence; return how many were put. The caller keeps the table at most half full."""
    mask = slot_hashes.size - 1
    inserted = 0
    for index in range(start, end):
        if not has_key[index]:
            continue
        key_hash = key_hashes[index]
        slot = np.int64(key_hash & np.uint64(mask))
        while slot_offsets[slot] != 0:
            slot = (slot + 1) & mask
        slot_hashes[slot] = key_hash
        slot_offsets[slot] = log_offsets[index] + 1
        inserted += 1
    return inserted


@dataclasses.dataclass(slots=True)
class _Generation:
    hashes: NDArray[np.uint64]
    offsets: NDArray[np.int64]  # log offset + 1; 0 = empty
    started_ms: int
    key_count: int = 0


@dataclasses.dataclass(frozen=True, slots=True)
class IdempotenceStatistics:
    keys_current: int
    keys_previous: int
    rotations: int
    slot_count: int  # per generation
    window_ms: int
    key_count_max: int


class IdempotenceWindow:
    """The window's tables (module docstring, rules 2 and 3). Pure: times are passed in."""

    def __init__(self, window_ms: int, key_count_max: int) -> None:
        assert window_ms > 0
        assert key_count_max > 0
        self.window_ms: Final = window_ms
        self.key_count_max: Final = key_count_max
        # At most half full: linear probing stays short and always meets an empty slot.
        self.slot_count: Final = 1 << max(4, (2 * key_count_max - 1).bit_length())
        assert self.slot_count >= 2 * key_count_max
        self._current: _Generation | None = None
        self._previous: _Generation | None = None
        self._rotations = 0

    def _new_generation(self, started_ms: int) -> _Generation:
        return _Generation(
            np.zeros(self.slot_count, dtype=np.uint64),
            np.zeros(self.slot_count, dtype=np.int64),
            started_ms,
        )

    def _rotate(self, started_ms: int) -> _Generation:
        self._previous = self._current
        self._current = self._new_generation(started_ms)
        self._rotations += 1
        return self._current

    def _generations(self) -> Iterator[_Generation]:
        if self._current is not None:
            yield self._current
        if self._previous is not None:
            yield self._previous

    def first_candidates(
        self, key_hashes: NDArray[np.uint64], has_key: NDArray[np.bool_]
    ) -> NDArray[np.bool_]:
        """Which keys have at least one entry of equal hash (a candidate to verify)."""
        found = np.zeros(key_hashes.size, dtype=np.bool_)
        out_slot = np.empty(key_hashes.size, dtype=np.int64)
        for generation in self._generations():
            if table_find_first(
                generation.hashes, generation.offsets, key_hashes, has_key, out_slot
            ):
                found |= out_slot >= 0
        return found

    def candidates(self, key_hash: int) -> Iterator[int]:
        """The log offsets of every entry with this hash, newest generation first."""
        one_hash = np.array([key_hash], dtype=np.uint64)
        wanted = one_hash[0]
        one_flag = np.ones(1, dtype=np.bool_)
        one_slot = np.empty(1, dtype=np.int64)
        for generation in self._generations():
            table_find_first(generation.hashes, generation.offsets, one_hash, one_flag, one_slot)
            slot = int(one_slot[0])
            while slot >= 0:
                yield int(generation.offsets[slot]) - 1
                slot = table_find_next(generation.hashes, generation.offsets, wanted, slot)

    def insert(
        self,
        key_hashes: NDArray[np.uint64],
        log_offsets: NDArray[np.int64],
        has_key: NDArray[np.bool_],
        times_ms: NDArray[np.int64],
    ) -> int:
        """Insert key i (has_key) at times_ms[i], in order, retiring generations as rule 2 says;
        return how many keys went in."""
        count = key_hashes.size
        assert log_offsets.size == count
        assert has_key.size == count
        assert times_ms.size == count
        inserted = 0
        keyed_before = np.concatenate(([0], np.cumsum(has_key, dtype=np.int64)))
        at = 0
        while at < count:
            generation = self._current
            first_ms = int(times_ms[at])
            if (
                generation is None
                or first_ms - generation.started_ms >= self.window_ms
                or generation.key_count >= self.key_count_max
            ):
                generation = self._rotate(first_ms)
            # This generation takes keys up to its count limit and before its time is up.
            room = self.key_count_max - generation.key_count
            end = int(np.searchsorted(keyed_before, keyed_before[at] + room, side="right")) - 1
            end = max(at + 1, min(end, count))
            late = times_ms[at:end] - generation.started_ms >= self.window_ms
            if late.any():
                end = at + max(1, int(np.argmax(late)))
            put = table_insert(
                generation.hashes, generation.offsets, key_hashes, log_offsets, has_key, at, end
            )
            generation.key_count += put
            inserted += put
            at = end
        return inserted

    def statistics(self) -> IdempotenceStatistics:
        return IdempotenceStatistics(
            0 if self._current is None else self._current.key_count,
            0 if self._previous is None else self._previous.key_count,
            self._rotations,
            self.slot_count,
            self.window_ms,
            self.key_count_max,
        )


# --- Hashing a batch, checking a candidate ------------------------------------------------------


@dataclasses.dataclass(slots=True)
class RecordKeys:
    """hash_record_keys' answer for a whole buffer: one entry per record."""

    position_bytes: NDArray[np.int64]
    key_hashes: NDArray[np.uint64]
    topic_hashes: NDArray[np.uint64]
    store_timestamps_ms: NDArray[np.int64]
    has_key: NDArray[np.bool_]

    @classmethod
    def empty(cls, capacity: int) -> RecordKeys:
        """Out arrays for hash_record_keys, room for `capacity` records."""
        return cls(
            np.empty(capacity, dtype=np.int64),
            np.empty(capacity, dtype=np.uint64),
            np.empty(capacity, dtype=np.uint64),
            np.empty(capacity, dtype=np.int64),
            np.empty(capacity, dtype=np.bool_),
        )

    def scan(
        self, buffer: NDArray[np.uint8], start_bytes: int, end_bytes: int
    ) -> tuple[int, int, int]:
        """hash_record_keys over buffer[start_bytes:end_bytes] into these arrays."""
        return hash_record_keys(
            buffer,
            start_bytes,
            end_bytes,
            self.position_bytes,
            self.key_hashes,
            self.topic_hashes,
            self.store_timestamps_ms,
            self.has_key,
        )


def record_keys(records: NDArray[np.uint8], record_count: int) -> RecordKeys:
    """Hash the `record_count` records laid back to back in `records` (an APPEND's records)."""
    keys = RecordKeys.empty(record_count)
    count, _stop, reason = keys.scan(records, 0, records.size)
    assert count == record_count, "an APPEND's records are whole"
    assert reason == HASH_STOP_END
    return keys


_INT32 = struct.Struct(">i")
_INT64 = struct.Struct(">q")


@dataclasses.dataclass(frozen=True, slots=True)
class RecordIdentity:
    """What decides whether two records are one message, and where the stored one is."""

    topic: bytes
    uniq_key: bytes | None
    queue_id: int
    queue_index: int


def record_identity(record: bytes | NDArray[np.uint8], position_bytes: int = 0) -> RecordIdentity:
    """Topic, UNIQ_KEY, queue id and queue index of the whole record at `position_bytes` (one the
    store wrote or an APPEND carries; the kernel or the commit log checked its lengths)."""
    buffer = np.frombuffer(record, dtype=np.uint8) if isinstance(record, bytes) else record
    data = buffer.data
    body_size = _INT32.unpack_from(data, position_bytes + BODY_LENGTH_POSITION_BYTES)[0]
    topic_length_at = position_bytes + BODY_POSITION_BYTES + body_size
    topic_size = int(buffer[topic_length_at])
    topic_at = topic_length_at + TOPIC_LENGTH_SIZE_BYTES
    properties_at = topic_at + topic_size + PROPERTIES_LENGTH_SIZE_BYTES
    properties_size = int.from_bytes(buffer[properties_at - 2 : properties_at].tobytes(), "big")
    key_start, key_end = find_property(
        buffer, properties_at, properties_at + properties_size, UNIQ_KEY_NAME
    )
    return RecordIdentity(
        buffer[topic_at : topic_at + topic_size].tobytes(),
        None if key_start < 0 else buffer[key_start:key_end].tobytes(),
        _INT32.unpack_from(data, position_bytes + QUEUEID_POSITION_BYTES)[0],
        _INT64.unpack_from(data, position_bytes + QUEUEOFFSET_POSITION_BYTES)[0],
    )


# --- The topics file ----------------------------------------------------------------------------


def idempotent_topics_path(store_root: Path) -> Path:
    return config_dir(store_root) / IDEMPOTENT_TOPICS_FILE_NAME


def load_idempotent_topics(store_root: Path) -> set[str]:
    """The topics of mqboxIdempotentTopics.json; none when it does not exist. StoreError when it
    cannot be read: a window rebuilt without them would let a replay through."""
    path = idempotent_topics_path(store_root)
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return set()
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise StoreError(f"{path}: cannot read the idempotent topics: {error}") from None
    topics = document.get("topics") if isinstance(document, dict) else None
    if not isinstance(topics, list) or not all(isinstance(topic, str) for topic in topics):
        raise StoreError(f"{path}: 'topics' is not a list of names")
    return set(topics)


def save_idempotent_topics(store_root: Path, topics: Iterable[str]) -> None:
    """Replace mqboxIdempotentTopics.json (atomically, fsynced) with `topics`."""
    document = {"topics": sorted(topics)}
    text = json.dumps(document, indent=2, ensure_ascii=False) + "\n"
    write_file_atomically(idempotent_topics_path(store_root), text.encode("utf-8"))


# --- The rebuild at open ------------------------------------------------------------------------


class SegmentSource(Protocol):
    """What rebuild_window reads of the commit log (store.commit_log.CommitLog is one)."""

    segment_size_bytes: int

    @property
    def segment_starts_bytes(self) -> tuple[int, ...]: ...

    def segment_view(self, segment_start_bytes: int) -> NDArray[np.uint8] | None: ...

    def store_timestamp_at(self, log_offset_bytes: int) -> int | None: ...


def rebuild_start_log_offset(
    segments: SegmentSource, write_log_offset_bytes: int, since_ms: int
) -> int | None:
    """Where a scan for records stored from `since_ms` on begins: the start of the last segment
    whose first record is older than since_ms, else of the first segment; None when the log
    holds no record."""
    starts = [start for start in segments.segment_starts_bytes if start < write_log_offset_bytes]
    if not starts:
        return None
    chosen = starts[0]
    for start in starts:
        first_ms = segments.store_timestamp_at(start)
        if first_ms is None or first_ms >= since_ms:
            break
        chosen = start
    return chosen


def rebuild_window(
    window: IdempotenceWindow,
    segments: SegmentSource,
    write_log_offset_bytes: int,
    topics: Iterable[str],
    now_ms: int,
) -> int:
    """Insert the keys of the records of `topics` stored within the window before `now_ms`, in
    log order (module docstring, rule 4); return how many went in."""
    wanted = np.array(
        sorted({topic_hash(topic.encode("utf-8")) for topic in topics}), dtype=np.uint64
    )
    if wanted.size == 0:
        return 0
    since_ms = now_ms - window.window_ms
    start = rebuild_start_log_offset(segments, write_log_offset_bytes, since_ms)
    if start is None:
        return 0
    keys = RecordKeys.empty(REBUILD_CHUNK_RECORD_COUNT)
    inserted = 0
    segment_size = segments.segment_size_bytes
    segment_start = start - start % segment_size
    at = start - segment_start
    while segment_start < write_log_offset_bytes:
        view = segments.segment_view(segment_start)
        end = min(segment_size, write_log_offset_bytes - segment_start)
        if view is None:  # deleted by retention meanwhile: the next one
            segment_start += segment_size
            at = 0
            continue
        count, stop, reason = keys.scan(view, at, end)
        if count:
            times = keys.store_timestamps_ms[:count]
            keep = (
                keys.has_key[:count]
                & (times >= since_ms)
                & np.isin(keys.topic_hashes[:count], wanted)
            )
            log_offsets = keys.position_bytes[:count] + segment_start
            inserted += window.insert(keys.key_hashes[:count], log_offsets, keep, times)
        if reason == HASH_STOP_FULL:
            at = stop
            continue
        if reason == HASH_STOP_DAMAGED:
            # Below the recovered write position every byte is whole records: a bug if not.
            raise StoreError(
                f"idempotence rebuild: no whole record at log offset {segment_start + stop}"
            )
        segment_start += segment_size  # END of the written part, or the segment's blank
        at = 0
    return inserted


def warm_up_kernels() -> None:
    """Compile the window's kernels (the supervisor's zygote runs this before forking)."""
    window = IdempotenceWindow(1000, 4)
    hashes = np.array([7, 7, 9], dtype=np.uint64)
    flags = np.ones(3, dtype=np.bool_)
    window.insert(hashes, np.arange(3, dtype=np.int64), flags, np.zeros(3, dtype=np.int64))
    assert window.first_candidates(hashes, flags).all()
    assert sorted(window.candidates(7)) == [0, 1]
    record_keys(np.zeros(0, dtype=np.uint8), 0)
    assert topic_hash(b"T") != 0
