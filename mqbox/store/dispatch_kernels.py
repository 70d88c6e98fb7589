"""Dispatcher kernels (RocketMQ's reput): committed records -> consume-queue and index entries.

Owns: `dispatch_scan`, one pass over the records of one commit-log segment, and its steps, each a
small kernel: the record check (message_kernels.check_record), the table lookups
(`find_record_topic`, `find_record_queue`: open-addressing hash tables over the dispatcher's
topic and queue tables), the properties (`scan_properties`: TAGS's hash, where KEYS and
UNIQ_KEY are), the index keys (`put_keys`), and the grouping of consume-queue entries by queue
(`group_by_queue`), ready for one `ConsumeQueue.append` per queue; plus the hash-table helpers the
Python parent uses to register topics and queues. The per-record steps are `inline_kernel`s:
numba inlines them into dispatch_scan, which then runs as fast as the one long loop it was
(bench/store_dispatch.py). dispatch_kernels_ref.py restates `dispatch_scan` in plain Python, and
a hypothesis test holds the two to the same outputs.

The tables are a few 2-D arrays, one row per topic or queue (dispatch.DispatchTables owns them):
`topics` (int64, TOPIC_* columns), `topic_bytes` (uint8, a topic's bytes per row), `queues`
(int64, QUEUE_* columns), and the hash slots `topic_slots` and `queue_slots` (int32, a row
number or SLOT_EMPTY).

Never: allocates (every output array is the caller's), raises for bad bytes (it stops and says
why; dispatch.py decides), reads outside [start_bytes, end_bytes) of the segment, or writes
anything but its out arrays and the QUEUE_NEXT_INDEX and QUEUE_GROUP_COUNT columns of `queues`
(the second only during group_by_queue, which leaves it zero).

Contract of one record, in order (each failed check stops the scan at the record's start):
- message_kernels.check_record, with PHYSICALOFFSET checked, IPv6 hosts refused and no CRC
  (its STOP_BLANK, STOP_TRUNCATED, STOP_INVALID, STOP_OFFSET_MISMATCH);
- room in the out arrays: a record row, and properties_size // 2 + 2 key slots, a bound on the
  keys one record can hold (STOP_FULL);
- its topic bytes are registered (else UNKNOWN_TOPIC, detail = topic position and size);
- transaction type NOT or COMMIT makes a consume-queue entry (PREPARED and ROLLBACK do not, as
  RocketMQ's CommitLogDispatcherBuildConsumeQueue): its (topic, queue id) is registered (else
  UNKNOWN_QUEUE, detail = topic id and queue id) and QUEUEOFFSET equals the queue's
  QUEUE_NEXT_INDEX, which then counts up; a smaller QUEUEOFFSET below
  redispatch_end_log_offset_bytes is one dispatched before a restart, and is skipped; anything
  else is QUEUE_INDEX_MISMATCH (detail = expected and found): a gap or a repeat is a bug, never
  data to store;
- tag field: for a schedule topic, store time + delay of level queue_id + 1 (1000 ms for a level
  the table lacks); else Java String.hashCode of TAGS, 0 without TAGS;
- index keys, unless the record is ROLLBACK or its log offset is at or below
  index_skip_through_log_offset_bytes: UNIQ_KEY, then each non-empty space-separated token of
  KEYS; key hash = abs(hashCode(topic + "#" + key)), MIN_VALUE -> 0 (message.index_key_hash).
Properties follow message.decode_properties: entries split on 0x02, name up to the first 0x01,
empty names and values dropped, the last duplicate wins.

Java hashing of keys: the hash of topic + "#" is precomputed per topic (TOPIC_KEY_STATE, as an
unsigned 32-bit state); an ASCII key continues it byte by byte, four bytes a step. A key with any
byte >= 0x80 continues it over the key's UTF-8 decoding (message_kernels.java_hash_utf8_from).
That equals the hash of the decoded topic + "#" + key because Java's decoder never folds an
ASCII byte into a malformed sequence, and '#' and the 0x02/0x20 around a key are ASCII.
"""

from __future__ import annotations

from typing import Final

import numpy as np
from numpy.typing import NDArray

from mqbox._jit import inline_kernel, kernel
from mqbox.message import (
    PROPERTIES_LENGTH_SIZE_BYTES,
    PROPERTY_KEYS,
    PROPERTY_NAME_VALUE_SEPARATOR,
    PROPERTY_SEPARATOR,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_KEY,
    QUEUEID_POSITION_BYTES,
    QUEUEOFFSET_POSITION_BYTES,
    STORETIMESTAMP_POSITION_BYTES,
    SYSFLAG_POSITION_BYTES,
    SYSFLAG_TRANSACTION_COMMIT_TYPE,
    SYSFLAG_TRANSACTION_MASK,
    SYSFLAG_TRANSACTION_NOT_TYPE,
    SYSFLAG_TRANSACTION_ROLLBACK_TYPE,
    TOPIC_SIZE_BYTES_MAX,
)
from mqbox.message_kernels import (
    RECORD_WHOLE,
    STOP_END,
    STOP_FULL,
    STOP_REASON_COUNT,
    check_record,
    java_hash_utf8,
    java_hash_utf8_from,
    read_s32_be,
    read_s64_be,
    read_u8,
    read_u32_be,
    write_i32_be,
    write_i64_be,
)
from mqbox.store.layout import (
    CQ_ENTRY_LOG_OFFSET_POSITION_BYTES,
    CQ_ENTRY_SIZE_BYTES,
    CQ_ENTRY_SIZE_POSITION_BYTES,
    CQ_ENTRY_TAG_HASH_POSITION_BYTES,
)

# --- Stop reasons (out_info[INFO_STOP_REASON] and the return value) -----------------------------

# message_kernels' STOP_* (END, FULL, and check_record's BLANK, TRUNCATED, INVALID,
# OFFSET_MISMATCH; never CRC_MISMATCH, the dispatch checks no CRC), and the dispatch's own:
DISPATCH_STOP_UNKNOWN_TOPIC: Final = STOP_REASON_COUNT  # register the topic, call again
DISPATCH_STOP_UNKNOWN_QUEUE: Final = STOP_REASON_COUNT + 1  # register the queue, call again
# QUEUEOFFSET is not the queue's next index
DISPATCH_STOP_QUEUE_INDEX_MISMATCH: Final = STOP_REASON_COUNT + 2

# --- The tables: columns of `topics` and `queues`, one row per topic id or queue slot -----------

TOPIC_FINGERPRINT: Final = 0  # topic_fingerprint of its bytes
TOPIC_SIZE: Final = 1  # bytes of the topic in its topic_bytes row; -1 for an unused row
TOPIC_KEY_STATE: Final = 2  # Java hash state of topic + "#", unsigned 32-bit
TOPIC_IS_SCHEDULE: Final = 3  # 1 for SCHEDULE_TOPIC_XXXX: its tag field is a delivery time
TOPIC_COLUMN_COUNT: Final = 4
TOPIC_BYTES_WIDTH: Final = TOPIC_SIZE_BYTES_MAX + 1  # columns of topic_bytes

QUEUE_TOPIC_ID: Final = 0  # -1 for an unused row
QUEUE_ID: Final = 1
QUEUE_NEXT_INDEX: Final = 2  # the queue's next queue index: its consume queue's entry count
QUEUE_GROUP_COUNT: Final = 3  # group_by_queue's counter; zero between calls
QUEUE_COLUMN_COUNT: Final = 4

# --- out_info slots -----------------------------------------------------------------------------

INFO_RECORD_COUNT: Final = 0  # records reported in out_records
INFO_STOP_POSITION: Final = 1  # file offset where the scan stopped (start of the unreported one)
INFO_STOP_REASON: Final = 2
INFO_GROUP_COUNT: Final = 3  # queues with entries in out_cq
INFO_KEY_COUNT: Final = 4  # index keys in out_keys
INFO_CQ_ENTRY_COUNT: Final = 5  # entries in out_cq
# UNKNOWN_TOPIC: topic position; UNKNOWN_QUEUE: topic id; MISMATCH: expected
INFO_DETAIL_A: Final = 6
INFO_DETAIL_B: Final = 7  # UNKNOWN_TOPIC: topic size; UNKNOWN_QUEUE: queue id; MISMATCH: found
INFO_SIZE: Final = 8

# --- out_records columns, one row per record in log order ---------------------------------------

RECORD_LOG_OFFSET: Final = 0
RECORD_SIZE: Final = 1
RECORD_TAG_HASH: Final = 2  # the consume-queue tag field (delivery time for schedule topics)
RECORD_QUEUE_SLOT: Final = 3  # -1: no consume-queue entry (PREPARED, ROLLBACK, re-dispatched)
RECORD_QUEUE_INDEX: Final = 4  # QUEUEOFFSET as stored
RECORD_STORE_TIMESTAMP: Final = 5
RECORD_KEY_COUNT: Final = 6  # index keys this record put in out_keys
RECORD_COLUMN_COUNT: Final = 7

# --- out_groups columns: group g holds out_cq entries [start(g), start(g + 1)) ------------------

GROUP_QUEUE_SLOT: Final = 0
GROUP_START: Final = 1  # row group_count holds the end of the last group
GROUP_QUEUE_INDEX_FIRST: Final = 2
GROUP_COLUMN_COUNT: Final = 3

# --- out_keys rows: key k is column k, so each row is contiguous (IndexService.put_batch) ------

KEY_HASH: Final = 0
KEY_LOG_OFFSET: Final = 1
KEY_STORE_TIMESTAMP: Final = 2
KEY_ROW_COUNT: Final = 3

# Room for the keys of any one record: a properties string of p bytes holds at most p // 2 + 1
# KEYS tokens, plus UNIQ_KEY.
KEY_COUNT_PER_RECORD_MAX: Final = 32767 // 2 + 2
DELAY_MS_UNKNOWN_LEVEL: Final = 1000  # RocketMQ's computeDeliverTimestamp fallback
SLOT_EMPTY: Final = -1

# The property names the scan looks for, as big-endian 32-bit words of their bytes.
_TAGS_WORD: Final = int.from_bytes(PROPERTY_TAGS.encode("ascii"), "big")
_KEYS_WORD: Final = int.from_bytes(PROPERTY_KEYS.encode("ascii"), "big")
_UNIQ_WORD: Final = int.from_bytes(PROPERTY_UNIQ_KEY.encode("ascii")[:4], "big")
_UNIQ_KEY_SECOND_WORD: Final = int.from_bytes(PROPERTY_UNIQ_KEY.encode("ascii")[4:], "big")
# "TAGS\x01" and "KEYS\x01", "UNIQ_KEY\x01": where a wanted entry's value starts.
_TAGS_PREFIX_SIZE_BYTES: Final = len(PROPERTY_TAGS) + 1
_UNIQ_KEY_PREFIX_SIZE_BYTES: Final = len(PROPERTY_UNIQ_KEY) + 1
_SPACE: Final = 0x20
_HASH_SIGN: Final = 0x80000000
_HASH_MASK: Final = 0xFFFFFFFF
assert len(PROPERTY_TAGS) == len(PROPERTY_KEYS) == 4
assert len(PROPERTY_UNIQ_KEY) == 8
for _name in (PROPERTY_TAGS, PROPERTY_KEYS, PROPERTY_UNIQ_KEY):
    assert chr(PROPERTY_NAME_VALUE_SEPARATOR) not in _name
    assert chr(PROPERTY_SEPARATOR) not in _name

# --- Hash tables --------------------------------------------------------------------------------


@kernel
def topic_fingerprint(buf: NDArray[np.uint8], start: int, end: int) -> int:
    """FNV-1a (32-bit) of buf[start:end]: where a topic's bytes land in the topic hash table.

    Only a probe start: a lookup compares the bytes themselves, so collisions cost a probe,
    never a wrong match.
    """
    value = 0x811C9DC5
    for at in range(start, end):
        value = ((value ^ read_u8(buf, at)) * 0x01000193) & _HASH_MASK
    return value


@kernel
def queue_fingerprint(topic_id: int, queue_id: int) -> int:
    """A mix of (topic_id, queue_id): where a queue lands in the queue hash table."""
    value = (topic_id * 0x9E3779B1 + (queue_id & _HASH_MASK) * 0x85EBCA77) & _HASH_MASK
    value ^= value >> 15
    value = (value * 0x2C1B3C6D) & _HASH_MASK
    value ^= value >> 12
    return value


@kernel
def insert_slot(table_slots: NDArray[np.int32], fingerprint: int, value: int) -> None:
    """Put `value` into the first empty slot at or after fingerprint & mask (linear probing)."""
    mask = table_slots.size - 1
    slot = fingerprint & mask
    while table_slots[slot] != SLOT_EMPTY:
        slot = (slot + 1) & mask
    table_slots[slot] = value


@inline_kernel
def _is_topic(
    buf: NDArray[np.uint8],
    topic_at: int,
    topic_size_bytes: int,
    topic_id: int,
    topics: NDArray[np.int64],
    topic_bytes: NDArray[np.uint8],
) -> bool:
    """True when buf[topic_at:topic_at + topic_size_bytes] are the bytes of topic `topic_id`."""
    if topics[topic_id, TOPIC_SIZE] != topic_size_bytes:
        return False
    for index in range(topic_size_bytes):
        if buf[topic_at + index] != topic_bytes[topic_id, index]:
            return False
    return True


@kernel
def find_topic(
    buf: NDArray[np.uint8],
    topic_at: int,
    topic_size_bytes: int,
    topic_slots: NDArray[np.int32],
    topics: NDArray[np.int64],
    topic_bytes: NDArray[np.uint8],
) -> int:
    """Topic id of the topic bytes buf[topic_at:topic_at + size], or -1 if not registered.

    `topic_slots` has a power-of-two size and is never full (the parent keeps it half empty).
    """
    fingerprint = topic_fingerprint(buf, topic_at, topic_at + topic_size_bytes)
    mask = topic_slots.size - 1
    slot = fingerprint & mask
    while True:
        topic_id = int(topic_slots[slot])
        if topic_id == SLOT_EMPTY:
            return -1
        if topics[topic_id, TOPIC_FINGERPRINT] == fingerprint and _is_topic(
            buf, topic_at, topic_size_bytes, topic_id, topics, topic_bytes
        ):
            return topic_id
        slot = (slot + 1) & mask


@kernel
def find_queue(
    topic_id: int, queue_id: int, queue_slots: NDArray[np.int32], queues: NDArray[np.int64]
) -> int:
    """Queue slot of (topic_id, queue_id), or -1 if not registered."""
    mask = queue_slots.size - 1
    slot = queue_fingerprint(topic_id, queue_id) & mask
    while True:
        queue_slot = int(queue_slots[slot])
        if queue_slot == SLOT_EMPTY:
            return -1
        if queues[queue_slot, QUEUE_TOPIC_ID] == topic_id and queues[queue_slot, QUEUE_ID] == (
            queue_id
        ):
            return queue_slot
        slot = (slot + 1) & mask


# --- Step: the record's topic and queue ---------------------------------------------------------


@inline_kernel
def find_record_topic(
    segment: NDArray[np.uint8],
    topic_at: int,
    topic_size_bytes: int,
    last_topic_id: int,
    topic_slots: NDArray[np.int32],
    topics: NDArray[np.int64],
    topic_bytes: NDArray[np.uint8],
) -> int:
    """find_topic, trying the previous record's topic first (-1: none): the records of a batch
    share one, and comparing bytes skips the fingerprint and the probe."""
    if last_topic_id >= 0 and _is_topic(
        segment, topic_at, topic_size_bytes, last_topic_id, topics, topic_bytes
    ):
        return last_topic_id
    return find_topic(segment, topic_at, topic_size_bytes, topic_slots, topics, topic_bytes)


@inline_kernel
def find_record_queue(
    topic_id: int,
    queue_id: int,
    last_queue_slot: int,
    queue_slots: NDArray[np.int32],
    queues: NDArray[np.int64],
) -> int:
    """find_queue, trying the previous record's queue slot first (-1: none)."""
    if (
        last_queue_slot >= 0
        and queues[last_queue_slot, QUEUE_TOPIC_ID] == topic_id
        and queues[last_queue_slot, QUEUE_ID] == queue_id
    ):
        return last_queue_slot
    return find_queue(topic_id, queue_id, queue_slots, queues)


# --- Step: properties ---------------------------------------------------------------------------

# Which wanted name a properties entry has.
NAME_OTHER: Final = 0
NAME_TAGS: Final = 1
NAME_KEYS: Final = 2
NAME_UNIQ_KEY: Final = 3


@inline_kernel
def _wanted_name(segment: NDArray[np.uint8], entry_at: int, properties_end: int) -> int:
    """NAME_* of the entry at entry_at: its name and the 0x01 after it, read as words."""
    if entry_at + len(PROPERTY_TAGS) >= properties_end:
        return NAME_OTHER
    first_word = read_u32_be(segment, entry_at)
    if first_word == _UNIQ_WORD:
        if (
            entry_at + len(PROPERTY_UNIQ_KEY) < properties_end
            and read_u32_be(segment, entry_at + 4) == _UNIQ_KEY_SECOND_WORD
            and segment[entry_at + len(PROPERTY_UNIQ_KEY)] == PROPERTY_NAME_VALUE_SEPARATOR
        ):
            return NAME_UNIQ_KEY
        return NAME_OTHER
    if segment[entry_at + len(PROPERTY_TAGS)] != PROPERTY_NAME_VALUE_SEPARATOR:
        return NAME_OTHER
    if first_word == _TAGS_WORD:
        return NAME_TAGS
    if first_word == _KEYS_WORD:
        return NAME_KEYS
    return NAME_OTHER


@inline_kernel
def _find_byte(segment: NDArray[np.uint8], start: int, end: int, byte: int) -> int:
    """Position of the first `byte` in segment[start:end], or end."""
    at = start
    while at < end and segment[at] != byte:
        at += 1
    return at


@inline_kernel
def _continue_hash(
    segment: NDArray[np.uint8], start: int, end: int, state: int
) -> tuple[int, bool]:
    """(Java's hash polynomial continued from `state` over segment[start:end], one term per
    byte, unsigned 32-bit; whether every byte is ASCII). For ASCII bytes this is
    String.hashCode, each byte being one UTF-16 unit. Four bytes a step, as state * 31**4 +
    b0 * 31**3 + b1 * 31**2 + b2 * 31 + b3: one dependent multiply per four bytes instead of
    four, which is most of the cost of hashing a UNIQ_KEY."""
    seen = 0
    at = start
    while at + 4 <= end:
        byte_0 = read_u8(segment, at)
        byte_1 = read_u8(segment, at + 1)
        byte_2 = read_u8(segment, at + 2)
        byte_3 = read_u8(segment, at + 3)
        seen |= byte_0 | byte_1 | byte_2 | byte_3
        terms = byte_0 * 29791 + byte_1 * 961 + byte_2 * 31 + byte_3
        state = (state * 923521 + terms) & _HASH_MASK
        at += 4
    while at < end:
        byte = read_u8(segment, at)
        seen |= byte
        state = (state * 31 + byte) & _HASH_MASK
        at += 1
    return state, seen < 0x80


@inline_kernel
def scan_properties(
    segment: NDArray[np.uint8], properties_at: int, properties_end: int
) -> tuple[int, int, int, int, int]:
    """One pass over the properties at segment[properties_at:properties_end].

    Returns (tag_hash, keys_start, keys_end, uniq_start, uniq_end): the Java hash of TAGS's
    value (0 without TAGS), and where KEYS's and UNIQ_KEY's values are (-1, -1 when absent).
    The last non-empty value of each name wins.
    """
    tag_hash = 0
    keys_start = -1
    keys_end = -1
    uniq_start = -1
    uniq_end = -1
    entry_at = properties_at
    while entry_at < properties_end:
        name = _wanted_name(segment, entry_at, properties_end)
        value_at = entry_at
        if name == NAME_UNIQ_KEY:
            value_at += _UNIQ_KEY_PREFIX_SIZE_BYTES
        elif name != NAME_OTHER:
            value_at += _TAGS_PREFIX_SIZE_BYTES
        entry_end = _find_byte(segment, value_at, properties_end, PROPERTY_SEPARATOR)
        if entry_end > value_at:  # an empty value does not count
            if name == NAME_TAGS:
                state, is_ascii = _continue_hash(segment, value_at, entry_end, 0)
                if is_ascii:
                    tag_hash = state - ((state & _HASH_SIGN) << 1)
                else:
                    tag_hash = java_hash_utf8(segment, value_at, entry_end)
            elif name == NAME_KEYS:
                keys_start = value_at
                keys_end = entry_end
            elif name == NAME_UNIQ_KEY:
                uniq_start = value_at
                uniq_end = entry_end
        entry_at = entry_end + 1
    return tag_hash, keys_start, keys_end, uniq_start, uniq_end


# --- Step: index keys ---------------------------------------------------------------------------


@inline_kernel
def _positive_key_hash(state: int) -> int:
    """abs() of the signed 32-bit hash whose unsigned state is `state`, MIN_VALUE -> 0."""
    signed = state - ((state & _HASH_SIGN) << 1)
    positive = -signed if signed < 0 else signed
    if positive == _HASH_SIGN:  # Math.abs(Integer.MIN_VALUE) is negative; RocketMQ uses 0
        positive = 0
    return positive


@inline_kernel
def _put_key(
    segment: NDArray[np.uint8],
    key_start: int,
    key_end: int,
    topic_key_state: int,
    log_offset_bytes: int,
    store_timestamp_ms: int,
    out_keys: NDArray[np.int64],
    key_count: int,
) -> None:
    """Column key_count of out_keys: the index key hash of segment[key_start:key_end] (the Java
    hash of topic + "#" + key: topic_key_state continued over the key, byte by byte for an
    ASCII key, else over its UTF-8 decoding), the log offset and the store time."""
    state, is_ascii = _continue_hash(segment, key_start, key_end, topic_key_state)
    if not is_ascii:
        state = java_hash_utf8_from(segment, key_start, key_end, topic_key_state)
    out_keys[KEY_HASH, key_count] = _positive_key_hash(state)
    out_keys[KEY_LOG_OFFSET, key_count] = log_offset_bytes
    out_keys[KEY_STORE_TIMESTAMP, key_count] = store_timestamp_ms


@inline_kernel
def put_keys(
    segment: NDArray[np.uint8],
    uniq_start: int,
    uniq_end: int,
    keys_start: int,
    keys_end: int,
    topic_key_state: int,
    log_offset_bytes: int,
    store_timestamp_ms: int,
    out_keys: NDArray[np.int64],
    key_count: int,
) -> int:
    """Put a record's index keys into out_keys from column key_count on: UNIQ_KEY (when
    uniq_start >= 0), then each non-empty space-separated token of KEYS (when keys_start >= 0).
    Returns the new key count; the caller made room."""
    if uniq_start >= 0:
        _put_key(
            segment,
            uniq_start,
            uniq_end,
            topic_key_state,
            log_offset_bytes,
            store_timestamp_ms,
            out_keys,
            key_count,
        )
        key_count += 1
    token_at = keys_start
    while 0 <= token_at < keys_end:
        token_end = _find_byte(segment, token_at, keys_end, _SPACE)
        if token_end > token_at:
            _put_key(
                segment,
                token_at,
                token_end,
                topic_key_state,
                log_offset_bytes,
                store_timestamp_ms,
                out_keys,
                key_count,
            )
            key_count += 1
        token_at = token_end + 1
    return key_count


# --- Step: group by queue -----------------------------------------------------------------------


@kernel
def group_by_queue(
    out_records: NDArray[np.int64],
    record_count: int,
    queues: NDArray[np.int64],
    out_groups: NDArray[np.int64],
    out_cq: NDArray[np.uint8],
) -> int:
    """Write the consume-queue entries of the first record_count rows of out_records into out_cq
    (20 bytes each, big-endian, CQ_ENTRY_DTYPE's layout), grouped by queue slot in first-seen
    order, log order inside a group; out_groups[g] = (slot, start, first queue index) and
    out_groups[group_count, GROUP_START] = the entry count. Returns group_count.

    A counting sort: QUEUE_GROUP_COUNT counts each queue's entries, then becomes its group's
    write cursor, and is zero again on return (as on entry)."""
    group_count = 0
    for record in range(record_count):
        queue_slot = int(out_records[record, RECORD_QUEUE_SLOT])
        if queue_slot < 0:
            continue
        if queues[queue_slot, QUEUE_GROUP_COUNT] == 0:
            out_groups[group_count, GROUP_QUEUE_SLOT] = queue_slot
            out_groups[group_count, GROUP_QUEUE_INDEX_FIRST] = out_records[
                record, RECORD_QUEUE_INDEX
            ]
            group_count += 1
        queues[queue_slot, QUEUE_GROUP_COUNT] += 1
    running = 0
    for group in range(group_count):
        queue_slot = int(out_groups[group, GROUP_QUEUE_SLOT])
        count = int(queues[queue_slot, QUEUE_GROUP_COUNT])
        out_groups[group, GROUP_START] = running
        queues[queue_slot, QUEUE_GROUP_COUNT] = running
        running += count
    out_groups[group_count, GROUP_START] = running
    for record in range(record_count):
        queue_slot = int(out_records[record, RECORD_QUEUE_SLOT])
        if queue_slot < 0:
            continue
        entry = int(queues[queue_slot, QUEUE_GROUP_COUNT])
        queues[queue_slot, QUEUE_GROUP_COUNT] = entry + 1
        at = entry * CQ_ENTRY_SIZE_BYTES
        write_i64_be(
            out_cq,
            at + CQ_ENTRY_LOG_OFFSET_POSITION_BYTES,
            int(out_records[record, RECORD_LOG_OFFSET]),
        )
        write_i32_be(
            out_cq, at + CQ_ENTRY_SIZE_POSITION_BYTES, int(out_records[record, RECORD_SIZE])
        )
        write_i64_be(
            out_cq, at + CQ_ENTRY_TAG_HASH_POSITION_BYTES, int(out_records[record, RECORD_TAG_HASH])
        )
    for group in range(group_count):
        queues[out_groups[group, GROUP_QUEUE_SLOT], QUEUE_GROUP_COUNT] = 0
    return group_count


# --- dispatch_scan ------------------------------------------------------------------------------


@kernel
def dispatch_scan(
    segment: NDArray[np.uint8],
    start_bytes: int,
    end_bytes: int,
    base_log_offset_bytes: int,
    topic_slots: NDArray[np.int32],
    topics: NDArray[np.int64],
    topic_bytes: NDArray[np.uint8],
    queue_slots: NDArray[np.int32],
    queues: NDArray[np.int64],
    delay_levels_ms: NDArray[np.int64],
    redispatch_end_log_offset_bytes: int,
    index_skip_through_log_offset_bytes: int,
    out_records: NDArray[np.int64],
    out_cq: NDArray[np.uint8],
    out_groups: NDArray[np.int64],
    out_keys: NDArray[np.int64],
    out_info: NDArray[np.int64],
) -> int:
    """Dispatch the records of segment[start_bytes:end_bytes]; return the stop reason.

    Per record (module docstring for the checks): a row of out_records; when it makes a
    consume-queue entry, that entry in out_cq (group_by_queue has the layout); its index keys
    in out_keys, in log order. out_info gets the counts, the stop position and reason and the
    detail of an UNKNOWN_* or MISMATCH stop. The tables are the parent's (module docstring);
    QUEUE_GROUP_COUNT must be zero on entry, and is on return.
    """
    record_capacity = out_records.shape[0]
    key_capacity = out_keys.shape[1]
    assert 0 <= start_bytes <= end_bytes <= segment.size
    assert out_cq.size >= record_capacity * CQ_ENTRY_SIZE_BYTES
    assert out_groups.shape[0] >= record_capacity + 1
    assert out_keys.shape[0] == KEY_ROW_COUNT
    assert key_capacity >= KEY_COUNT_PER_RECORD_MAX
    assert topics.shape[0] == topic_bytes.shape[0]
    position_bytes = start_bytes
    record_count = 0
    key_count = 0
    cq_entry_count = 0
    stop_reason = STOP_END
    detail_a = 0
    detail_b = 0
    last_topic_id = -1
    last_queue_slot = -1
    while True:
        if position_bytes == end_bytes:
            stop_reason = STOP_END
            break
        if record_count == record_capacity:
            stop_reason = STOP_FULL
            break
        # Validate.
        verdict, size_bytes, _body_at, topic_at, properties_at = check_record(
            segment, position_bytes, end_bytes, base_log_offset_bytes, False, False
        )
        if verdict != RECORD_WHOLE:
            stop_reason = verdict
            break
        record_end_bytes = position_bytes + size_bytes
        if key_count + (record_end_bytes - properties_at) // 2 + 2 > key_capacity:
            stop_reason = STOP_FULL
            break
        # Topic and queue.
        topic_size_bytes = properties_at - PROPERTIES_LENGTH_SIZE_BYTES - topic_at
        topic_id = find_record_topic(
            segment, topic_at, topic_size_bytes, last_topic_id, topic_slots, topics, topic_bytes
        )
        if topic_id < 0:
            stop_reason = DISPATCH_STOP_UNKNOWN_TOPIC
            detail_a = topic_at
            detail_b = topic_size_bytes
            break
        log_offset_bytes = base_log_offset_bytes + position_bytes
        queue_id = read_s32_be(segment, position_bytes + QUEUEID_POSITION_BYTES)
        queue_index = read_s64_be(segment, position_bytes + QUEUEOFFSET_POSITION_BYTES)
        sysflag = read_s32_be(segment, position_bytes + SYSFLAG_POSITION_BYTES)
        transaction_type = sysflag & SYSFLAG_TRANSACTION_MASK
        queue_slot = -1
        if transaction_type in (SYSFLAG_TRANSACTION_NOT_TYPE, SYSFLAG_TRANSACTION_COMMIT_TYPE):
            queue_slot = find_record_queue(topic_id, queue_id, last_queue_slot, queue_slots, queues)
            if queue_slot < 0:
                stop_reason = DISPATCH_STOP_UNKNOWN_QUEUE
                detail_a = topic_id
                detail_b = queue_id
                break
            last_queue_slot = queue_slot
            expected_queue_index = int(queues[queue_slot, QUEUE_NEXT_INDEX])
            if queue_index != expected_queue_index:
                if (
                    queue_index < expected_queue_index
                    and log_offset_bytes < redispatch_end_log_offset_bytes
                ):
                    queue_slot = -1  # dispatched before the restart
                else:
                    stop_reason = DISPATCH_STOP_QUEUE_INDEX_MISMATCH
                    detail_a = expected_queue_index
                    detail_b = queue_index
                    break
        last_topic_id = topic_id
        # Every check passed: from here on the record is reported. Properties.
        store_timestamp_ms = read_s64_be(segment, position_bytes + STORETIMESTAMP_POSITION_BYTES)
        tag_hash, keys_start, keys_end, uniq_start, uniq_end = scan_properties(
            segment, properties_at, record_end_bytes
        )
        if topics[topic_id, TOPIC_IS_SCHEDULE] != 0:
            delay_ms = DELAY_MS_UNKNOWN_LEVEL
            if 0 <= queue_id < delay_levels_ms.size:
                delay_ms = int(delay_levels_ms[queue_id])
            tag_hash = store_timestamp_ms + delay_ms
        # Keys.
        record_key_count = 0
        if (
            transaction_type != SYSFLAG_TRANSACTION_ROLLBACK_TYPE
            and log_offset_bytes > index_skip_through_log_offset_bytes
        ):
            new_key_count = put_keys(
                segment,
                uniq_start,
                uniq_end,
                keys_start,
                keys_end,
                int(topics[topic_id, TOPIC_KEY_STATE]),
                log_offset_bytes,
                store_timestamp_ms,
                out_keys,
                key_count,
            )
            record_key_count = new_key_count - key_count
            key_count = new_key_count
        out_records[record_count, RECORD_LOG_OFFSET] = log_offset_bytes
        out_records[record_count, RECORD_SIZE] = size_bytes
        out_records[record_count, RECORD_TAG_HASH] = tag_hash
        out_records[record_count, RECORD_QUEUE_SLOT] = queue_slot
        out_records[record_count, RECORD_QUEUE_INDEX] = queue_index
        out_records[record_count, RECORD_STORE_TIMESTAMP] = store_timestamp_ms
        out_records[record_count, RECORD_KEY_COUNT] = record_key_count
        if queue_slot >= 0:
            queues[queue_slot, QUEUE_NEXT_INDEX] = queue_index + 1
            cq_entry_count += 1
        record_count += 1
        position_bytes = record_end_bytes
    # Group by queue.
    group_count = group_by_queue(out_records, record_count, queues, out_groups, out_cq)
    assert out_groups[group_count, GROUP_START] == cq_entry_count
    out_info[INFO_RECORD_COUNT] = record_count
    out_info[INFO_STOP_POSITION] = position_bytes
    out_info[INFO_STOP_REASON] = stop_reason
    out_info[INFO_GROUP_COUNT] = group_count
    out_info[INFO_KEY_COUNT] = key_count
    out_info[INFO_CQ_ENTRY_COUNT] = cq_entry_count
    out_info[INFO_DETAIL_A] = detail_a
    out_info[INFO_DETAIL_B] = detail_b
    return stop_reason
