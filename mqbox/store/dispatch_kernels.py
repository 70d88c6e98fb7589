"""Dispatcher kernels (RocketMQ's reput): committed records -> consume-queue and index entries.

Owns: `dispatch_scan`, one pass over the records of one commit-log segment that validates each
record, finds its topic and queue in the dispatcher's tables (open-addressing hash tables over
plain numpy arrays), checks its QUEUEOFFSET against the queue's next index, computes its
consume-queue tag field and its index keys, and leaves consume-queue entries grouped by queue,
ready for one `ConsumeQueue.append` per queue; plus the small hash-table helpers the Python
parent uses to register topics and queues. dispatch_kernels_ref.py restates `dispatch_scan` in
plain Python, and a hypothesis test holds the two to the same outputs.

Never: allocates (every output array is the caller's), raises for bad bytes (it stops and says
why; dispatch.py decides), reads outside [start_bytes, end_bytes) of the segment, or writes
anything but its out arrays, `next_queue_indexes` and `group_counts` (which it leaves zero).

Contract of one record, in order (each failed check stops the scan at the record's start):
- message_kernels.check_record, with PHYSICALOFFSET checked, IPv6 hosts refused and no CRC
  (its STOP_BLANK, STOP_TRUNCATED, STOP_INVALID, STOP_OFFSET_MISMATCH);
- room in the out arrays: a record slot, and properties_size // 2 + 2 key slots, a bound on the
  keys one record can hold (STOP_FULL);
- its topic bytes are registered (else UNKNOWN_TOPIC, detail = topic position and size);
- transaction type NOT or COMMIT makes a consume-queue entry (PREPARED and ROLLBACK do not, as
  RocketMQ's CommitLogDispatcherBuildConsumeQueue): its (topic, queue id) is registered (else
  UNKNOWN_QUEUE, detail = topic id and queue id) and QUEUEOFFSET equals next_queue_indexes of
  its slot, which then counts up; a smaller QUEUEOFFSET below redispatch_end_log_offset_bytes is
  one dispatched before a restart, and is skipped; anything else is QUEUE_INDEX_MISMATCH
  (detail = expected and found): a gap or a repeat is a bug, never data to store;
- tag field: for a schedule topic, store time + delay of level queue_id + 1 (1000 ms for a level
  the table lacks); else Java String.hashCode of TAGS, 0 without TAGS;
- index keys, unless the record is ROLLBACK or its log offset is at or below
  index_skip_through_log_offset_bytes: UNIQ_KEY, then each non-empty space-separated token of
  KEYS; key hash = abs(hashCode(topic + "#" + key)), MIN_VALUE -> 0 (message.index_key_hash).
Properties follow message.decode_properties: entries split on 0x02, name up to the first 0x01,
empty names and values dropped, the last duplicate wins.

Java hashing of keys: the hash of topic + "#" is precomputed per topic (topic_key_states, as an
unsigned 32-bit state); an ASCII key continues it byte by byte. A key with any byte >= 0x80 is
hashed as the UTF-8 bytes topic + "#" + key through message_kernels.java_hash_utf8. Decoding the
concatenation equals decoding each part, because Java's decoder never folds an ASCII byte into
a malformed sequence, and '#' and the 0x02/0x20 around a key are ASCII.
"""

from __future__ import annotations

from typing import Final

import numpy as np
from numpy.typing import NDArray

from mqbox._jit import kernel
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
    read_s32_be,
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

# --- out_info slots -----------------------------------------------------------------------------

INFO_RECORD_COUNT: Final = 0  # records reported in out_records
INFO_STOP_POSITION: Final = 1  # file offset where the scan stopped (start of the unreported one)
INFO_STOP_REASON: Final = 2
INFO_GROUP_COUNT: Final = 3  # queues with entries in out_cq
INFO_KEY_COUNT: Final = 4  # index keys in the out_key_* arrays
INFO_CQ_ENTRY_COUNT: Final = 5  # entries in out_cq
INFO_DETAIL_A: Final = (
    6  # UNKNOWN_TOPIC: topic position; UNKNOWN_QUEUE: topic id; MISMATCH: expected
)
INFO_DETAIL_B: Final = 7  # UNKNOWN_TOPIC: topic size; UNKNOWN_QUEUE: queue id; MISMATCH: found
INFO_SIZE: Final = 8

# --- out_records columns, one row per record in log order ---------------------------------------

RECORD_LOG_OFFSET: Final = 0
RECORD_SIZE: Final = 1
RECORD_TAG_HASH: Final = 2  # the consume-queue tag field (delivery time for schedule topics)
RECORD_QUEUE_SLOT: Final = 3  # -1: no consume-queue entry (PREPARED, ROLLBACK, re-dispatched)
RECORD_QUEUE_INDEX: Final = 4  # QUEUEOFFSET as stored
RECORD_STORE_TIMESTAMP: Final = 5
RECORD_KEY_COUNT: Final = 6  # index keys this record put in the out_key_* arrays
RECORD_COLUMN_COUNT: Final = 7

# --- out_groups columns: group g holds out_cq entries [start(g), start(g + 1)) ------------------

GROUP_QUEUE_SLOT: Final = 0
GROUP_START: Final = 1  # row group_count holds the end of the last group
GROUP_QUEUE_INDEX_FIRST: Final = 2
GROUP_COLUMN_COUNT: Final = 3

# Room for the keys of any one record: a properties string of p bytes holds at most p // 2 + 1
# KEYS tokens, plus UNIQ_KEY.
KEY_COUNT_PER_RECORD_MAX: Final = 32767 // 2 + 2
# Scratch for hashing topic + "#" + a non-ASCII key.
SCRATCH_SIZE_BYTES: Final = TOPIC_SIZE_BYTES_MAX + 1 + 32767
DELAY_MS_UNKNOWN_LEVEL: Final = 1000  # RocketMQ's computeDeliverTimestamp fallback
SLOT_EMPTY: Final = -1

# The property names the scan looks for, as big-endian 32-bit words of their bytes.
_TAGS_WORD: Final = int.from_bytes(PROPERTY_TAGS.encode("ascii"), "big")
_KEYS_WORD: Final = int.from_bytes(PROPERTY_KEYS.encode("ascii"), "big")
_UNIQ_WORD: Final = int.from_bytes(PROPERTY_UNIQ_KEY.encode("ascii")[:4], "big")
_UNIQ_KEY_SECOND_WORD: Final = int.from_bytes(PROPERTY_UNIQ_KEY.encode("ascii")[4:], "big")
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
def find_topic(
    buf: NDArray[np.uint8],
    topic_at: int,
    topic_size_bytes: int,
    topic_slots: NDArray[np.int32],
    topic_fingerprints: NDArray[np.int64],
    topic_bytes: NDArray[np.uint8],
    topic_sizes: NDArray[np.int32],
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
        if topic_fingerprints[topic_id] == fingerprint and topic_sizes[topic_id] == (
            topic_size_bytes
        ):
            same = True
            for index in range(topic_size_bytes):
                if buf[topic_at + index] != topic_bytes[topic_id, index]:
                    same = False
                    break
            if same:
                return topic_id
        slot = (slot + 1) & mask


@kernel
def find_queue(
    topic_id: int,
    queue_id: int,
    queue_slots: NDArray[np.int32],
    queue_topic_ids: NDArray[np.int32],
    queue_ids: NDArray[np.int32],
) -> int:
    """Queue slot of (topic_id, queue_id), or -1 if not registered."""
    mask = queue_slots.size - 1
    slot = queue_fingerprint(topic_id, queue_id) & mask
    while True:
        queue_slot = int(queue_slots[slot])
        if queue_slot == SLOT_EMPTY:
            return -1
        if queue_topic_ids[queue_slot] == topic_id and queue_ids[queue_slot] == queue_id:
            return queue_slot
        slot = (slot + 1) & mask


@kernel
def insert_slot(table_slots: NDArray[np.int32], fingerprint: int, value: int) -> None:
    """Put `value` into the first empty slot at or after fingerprint & mask (linear probing)."""
    mask = table_slots.size - 1
    slot = fingerprint & mask
    while table_slots[slot] != SLOT_EMPTY:
        slot = (slot + 1) & mask
    table_slots[slot] = value


# --- Hashes -------------------------------------------------------------------------------------


@kernel
def _positive_key_hash(state: int) -> int:
    """abs() of the signed 32-bit hash whose unsigned state is `state`, MIN_VALUE -> 0."""
    signed = state - ((state & _HASH_SIGN) << 1)
    positive = -signed if signed < 0 else signed
    if positive == _HASH_SIGN:  # Math.abs(Integer.MIN_VALUE) is negative; RocketMQ uses 0
        positive = 0
    return positive


@kernel
def _key_hash_utf8(
    segment: NDArray[np.uint8],
    key_start: int,
    key_end: int,
    topic_id: int,
    topic_bytes: NDArray[np.uint8],
    topic_size_bytes: int,
    scratch: NDArray[np.uint8],
) -> int:
    """Index key hash of a key holding non-ASCII bytes: Java hashCode of the decoded
    topic + "#" + key, computed over the concatenated UTF-8 bytes (module docstring)."""
    size = 0
    for index in range(topic_size_bytes):
        scratch[size] = topic_bytes[topic_id, index]
        size += 1
    scratch[size] = 0x23  # '#'
    size += 1
    for at in range(key_start, key_end):
        scratch[size] = segment[at]
        size += 1
    return _positive_key_hash(java_hash_utf8(scratch, 0, size) & _HASH_MASK)


# --- dispatch_scan ------------------------------------------------------------------------------


@kernel
def dispatch_scan(
    segment: NDArray[np.uint8],
    start_bytes: int,
    end_bytes: int,
    base_log_offset_bytes: int,
    topic_slots: NDArray[np.int32],
    topic_fingerprints: NDArray[np.int64],
    topic_bytes: NDArray[np.uint8],
    topic_sizes: NDArray[np.int32],
    topic_key_states: NDArray[np.int64],
    topic_is_schedule: NDArray[np.uint8],
    queue_slots: NDArray[np.int32],
    queue_topic_ids: NDArray[np.int32],
    queue_ids: NDArray[np.int32],
    next_queue_indexes: NDArray[np.int64],
    delay_levels_ms: NDArray[np.int64],
    redispatch_end_log_offset_bytes: int,
    index_skip_through_log_offset_bytes: int,
    group_counts: NDArray[np.int64],
    scratch: NDArray[np.uint8],
    out_records: NDArray[np.int64],
    out_cq: NDArray[np.uint8],
    out_groups: NDArray[np.int64],
    out_key_hashes: NDArray[np.int64],
    out_key_log_offsets: NDArray[np.int64],
    out_key_store_timestamps: NDArray[np.int64],
    out_info: NDArray[np.int64],
) -> int:
    """Dispatch the records of segment[start_bytes:end_bytes]; return the stop reason.

    Per record (module docstring for the checks): a row of out_records; when it makes a
    consume-queue entry, that entry (20 bytes, big-endian, CQ_ENTRY_DTYPE's layout) in out_cq,
    grouped by queue slot in first-seen order, with out_groups[g] = (slot, start, first queue
    index) and out_groups[group_count, GROUP_START] = the entry count; its index keys in the
    out_key_* arrays, in log order. out_info gets the counts, the stop position and reason and
    the detail of an UNKNOWN_* or MISMATCH stop. `group_counts` (one per queue slot) must be
    all zero on entry and is zero again on return.
    """
    record_capacity = out_records.shape[0]
    key_capacity = out_key_hashes.size
    assert 0 <= start_bytes <= end_bytes <= segment.size
    assert out_cq.size >= record_capacity * CQ_ENTRY_SIZE_BYTES
    assert out_groups.shape[0] >= record_capacity + 1
    assert out_key_log_offsets.size == key_capacity
    assert out_key_store_timestamps.size == key_capacity
    assert key_capacity >= KEY_COUNT_PER_RECORD_MAX
    assert scratch.size >= SCRATCH_SIZE_BYTES
    assert group_counts.size >= next_queue_indexes.size
    position_bytes = start_bytes
    record_count = 0
    key_count = 0
    group_count = 0
    cq_entry_count = 0
    stop_reason = STOP_END
    detail_a = 0
    detail_b = 0
    last_topic_id = -1
    last_queue_topic_id = -1
    last_queue_id = -1
    last_queue_slot = -1
    while True:
        if position_bytes == end_bytes:
            stop_reason = STOP_END
            break
        if record_count == record_capacity:
            stop_reason = STOP_FULL
            break
        verdict, size_bytes, _body_at, topic_at, properties_at = check_record(
            segment, position_bytes, end_bytes, base_log_offset_bytes, False, False
        )
        if verdict != RECORD_WHOLE:
            stop_reason = verdict
            break
        log_offset_bytes = base_log_offset_bytes + position_bytes
        sysflag = read_s32_be(segment, position_bytes + SYSFLAG_POSITION_BYTES)
        topic_size_bytes = properties_at - PROPERTIES_LENGTH_SIZE_BYTES - topic_at
        properties_end = position_bytes + size_bytes
        properties_size_bytes = properties_end - properties_at
        if key_count + properties_size_bytes // 2 + 2 > key_capacity:
            stop_reason = STOP_FULL
            break
        # Records of one batch share a topic: compare with the previous record's topic
        # first, which skips the fingerprint and the probe.
        topic_id = -1
        if last_topic_id >= 0 and topic_sizes[last_topic_id] == topic_size_bytes:
            same = True
            for index in range(topic_size_bytes):
                if segment[topic_at + index] != topic_bytes[last_topic_id, index]:
                    same = False
                    break
            if same:
                topic_id = last_topic_id
        if topic_id < 0:
            topic_id = find_topic(
                segment,
                topic_at,
                topic_size_bytes,
                topic_slots,
                topic_fingerprints,
                topic_bytes,
                topic_sizes,
            )
        if topic_id < 0:
            stop_reason = DISPATCH_STOP_UNKNOWN_TOPIC
            detail_a = topic_at
            detail_b = topic_size_bytes
            break
        queue_id = read_s32_be(segment, position_bytes + QUEUEID_POSITION_BYTES)
        queue_index = read_s32_be(
            segment, position_bytes + QUEUEOFFSET_POSITION_BYTES
        ) << 32 | read_u32_be(segment, position_bytes + QUEUEOFFSET_POSITION_BYTES + 4)
        transaction_type = sysflag & SYSFLAG_TRANSACTION_MASK
        queue_slot = -1
        if transaction_type in (SYSFLAG_TRANSACTION_NOT_TYPE, SYSFLAG_TRANSACTION_COMMIT_TYPE):
            if topic_id == last_queue_topic_id and queue_id == last_queue_id:
                queue_slot = last_queue_slot
            else:
                queue_slot = find_queue(topic_id, queue_id, queue_slots, queue_topic_ids, queue_ids)
            if queue_slot < 0:
                stop_reason = DISPATCH_STOP_UNKNOWN_QUEUE
                detail_a = topic_id
                detail_b = queue_id
                break
            last_queue_topic_id = topic_id
            last_queue_id = queue_id
            last_queue_slot = queue_slot
            expected_queue_index = int(next_queue_indexes[queue_slot])
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
        # Every check passed: from here on the record is reported.
        store_timestamp_ms = read_s32_be(
            segment, position_bytes + STORETIMESTAMP_POSITION_BYTES
        ) << 32 | read_u32_be(segment, position_bytes + STORETIMESTAMP_POSITION_BYTES + 4)
        # One pass over the properties finds TAGS, KEYS and UNIQ_KEY (the last of each wins)
        # and hashes the TAGS and UNIQ_KEY values as it scans them: an ASCII value's Java hash
        # is the plain polynomial of its bytes; a value with any byte >= 0x80 is hashed again
        # by the UTF-8-aware routines below.
        key_state = int(topic_key_states[topic_id])
        tags_found = False
        tags_hash = 0
        keys_start = -1
        keys_end = -1
        uniq_found = False
        uniq_key_hash = 0
        entry_at = properties_at
        while entry_at < properties_end:
            first_word = -1
            if entry_at + 4 <= properties_end:
                first_word = read_u32_be(segment, entry_at)
            name_id = 0  # 1 TAGS, 2 KEYS, 3 UNIQ_KEY
            value_at = entry_at
            if first_word == _TAGS_WORD and (
                entry_at + 4 < properties_end
                and segment[entry_at + 4] == PROPERTY_NAME_VALUE_SEPARATOR
            ):
                name_id = 1
                value_at = entry_at + 5
            elif first_word == _KEYS_WORD and (
                entry_at + 4 < properties_end
                and segment[entry_at + 4] == PROPERTY_NAME_VALUE_SEPARATOR
            ):
                name_id = 2
                value_at = entry_at + 5
            elif (
                first_word == _UNIQ_WORD
                and entry_at + 8 <= properties_end
                and read_u32_be(segment, entry_at + 4) == _UNIQ_KEY_SECOND_WORD
                and (
                    entry_at + 8 < properties_end
                    and segment[entry_at + 8] == PROPERTY_NAME_VALUE_SEPARATOR
                )
            ):
                name_id = 3
                value_at = entry_at + 9
            entry_end = value_at
            if name_id == 1 or name_id == 3:
                state = 0 if name_id == 1 else key_state
                is_ascii = True
                while entry_end < properties_end:
                    byte = read_u8(segment, entry_end)
                    if byte == PROPERTY_SEPARATOR:
                        break
                    if byte >= 0x80:
                        is_ascii = False
                    state = (state * 31 + byte) & _HASH_MASK
                    entry_end += 1
                if entry_end > value_at:  # an empty value does not count
                    if name_id == 1:
                        tags_found = True
                        if is_ascii:
                            tags_hash = state - ((state & _HASH_SIGN) << 1)
                        else:
                            tags_hash = java_hash_utf8(segment, value_at, entry_end)
                    else:
                        uniq_found = True
                        if is_ascii:
                            uniq_key_hash = _positive_key_hash(state)
                        else:
                            uniq_key_hash = _key_hash_utf8(
                                segment,
                                value_at,
                                entry_end,
                                topic_id,
                                topic_bytes,
                                topic_size_bytes,
                                scratch,
                            )
            else:
                while entry_end < properties_end and (
                    read_u8(segment, entry_end) != PROPERTY_SEPARATOR
                ):
                    entry_end += 1
                if name_id == 2 and entry_end > value_at:
                    keys_start = value_at
                    keys_end = entry_end
            entry_at = entry_end + 1
        if topic_is_schedule[topic_id] != 0:
            delay_ms = DELAY_MS_UNKNOWN_LEVEL
            if 0 <= queue_id < delay_levels_ms.size:
                delay_ms = int(delay_levels_ms[queue_id])
            tag_hash = store_timestamp_ms + delay_ms
        elif tags_found:
            tag_hash = tags_hash
        else:
            tag_hash = 0
        record_key_count = 0
        if (
            transaction_type != SYSFLAG_TRANSACTION_ROLLBACK_TYPE
            and log_offset_bytes > index_skip_through_log_offset_bytes
        ):
            if uniq_found:
                out_key_hashes[key_count] = uniq_key_hash
                out_key_log_offsets[key_count] = log_offset_bytes
                out_key_store_timestamps[key_count] = store_timestamp_ms
                key_count += 1
                record_key_count += 1
            # KEYS: split on spaces and hash each token in the same pass.
            token_at = keys_start
            state = key_state
            is_ascii = True
            at = keys_start
            while at <= keys_end and keys_start >= 0:
                byte = _SPACE if at == keys_end else read_u8(segment, at)
                if byte == _SPACE:
                    if at > token_at:
                        if is_ascii:
                            key_hash = _positive_key_hash(state)
                        else:
                            key_hash = _key_hash_utf8(
                                segment,
                                token_at,
                                at,
                                topic_id,
                                topic_bytes,
                                topic_size_bytes,
                                scratch,
                            )
                        out_key_hashes[key_count] = key_hash
                        out_key_log_offsets[key_count] = log_offset_bytes
                        out_key_store_timestamps[key_count] = store_timestamp_ms
                        key_count += 1
                        record_key_count += 1
                    token_at = at + 1
                    state = key_state
                    is_ascii = True
                else:
                    if byte >= 0x80:
                        is_ascii = False
                    state = (state * 31 + byte) & _HASH_MASK
                at += 1
        out_records[record_count, RECORD_LOG_OFFSET] = log_offset_bytes
        out_records[record_count, RECORD_SIZE] = size_bytes
        out_records[record_count, RECORD_TAG_HASH] = tag_hash
        out_records[record_count, RECORD_QUEUE_SLOT] = queue_slot
        out_records[record_count, RECORD_QUEUE_INDEX] = queue_index
        out_records[record_count, RECORD_STORE_TIMESTAMP] = store_timestamp_ms
        out_records[record_count, RECORD_KEY_COUNT] = record_key_count
        if queue_slot >= 0:
            next_queue_indexes[queue_slot] = queue_index + 1
            if group_counts[queue_slot] == 0:
                out_groups[group_count, GROUP_QUEUE_SLOT] = queue_slot
                out_groups[group_count, GROUP_QUEUE_INDEX_FIRST] = queue_index
                group_count += 1
            group_counts[queue_slot] += 1
            cq_entry_count += 1
        record_count += 1
        position_bytes += size_bytes
    # Counting sort of the entries by queue: counts become start cursors, entries are placed,
    # and the counts go back to zero for the next call.
    running = 0
    for group in range(group_count):
        queue_slot = int(out_groups[group, GROUP_QUEUE_SLOT])
        count = int(group_counts[queue_slot])
        out_groups[group, GROUP_START] = running
        group_counts[queue_slot] = running
        running += count
    out_groups[group_count, GROUP_START] = running
    assert running == cq_entry_count
    for record in range(record_count):
        queue_slot = int(out_records[record, RECORD_QUEUE_SLOT])
        if queue_slot < 0:
            continue
        entry = int(group_counts[queue_slot])
        group_counts[queue_slot] = entry + 1
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
        group_counts[out_groups[group, GROUP_QUEUE_SLOT]] = 0
    out_info[INFO_RECORD_COUNT] = record_count
    out_info[INFO_STOP_POSITION] = position_bytes
    out_info[INFO_STOP_REASON] = stop_reason
    out_info[INFO_GROUP_COUNT] = group_count
    out_info[INFO_KEY_COUNT] = key_count
    out_info[INFO_CQ_ENTRY_COUNT] = cq_entry_count
    out_info[INFO_DETAIL_A] = detail_a
    out_info[INFO_DETAIL_B] = detail_b
    return stop_reason
