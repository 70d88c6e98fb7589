"""Plain-Python twin of dispatch_kernels.dispatch_scan: the same contract, restated for tests.

Owns: a second statement of the dispatch scan in struct.unpack_from and plain loops. It shares no
helper with the kernel: each record is checked by message_kernels_ref.check_record (the twin of
the record check), tables (their column numbers are the kernel's, a layout both follow) are
searched linearly instead of through their hash slots,
properties come from message.decode_properties, the tag hash from message.tag_hash and the key
hash from message.index_key_hash over message.java_utf8_decode'd strings. A unit test feeds both
the same segment and tables and asserts identical outputs.

Never: used on the data plane, or changed without its kernel.
"""

from __future__ import annotations

import struct

import numpy as np
from numpy.typing import NDArray

from mqbox.message import decode_properties, index_key_hash, java_utf8_decode, tag_hash
from mqbox.message_kernels_ref import RECORD_WHOLE, STOP_END, STOP_FULL, check_record
from mqbox.store.dispatch_kernels import (
    QUEUE_ID,
    QUEUE_NEXT_INDEX,
    QUEUE_TOPIC_ID,
    TOPIC_IS_SCHEDULE,
    TOPIC_SIZE,
)

# The dispatch's own stop reasons, after the record check's (message_kernels_ref.STOP_*).
DISPATCH_STOP_UNKNOWN_TOPIC = 7
DISPATCH_STOP_UNKNOWN_QUEUE = 8
DISPATCH_STOP_QUEUE_INDEX_MISMATCH = 9

# Restated from message.py's record diagram and layout.py's consume-queue entry.
_QUEUE_ID = struct.Struct(">i")  # at 12
_QUEUE_INDEX = struct.Struct(">q")  # at 20
_SYSFLAG = struct.Struct(">i")  # at 36
_STORE_TIMESTAMP = struct.Struct(">q")  # at 56
_CQ_ENTRY = struct.Struct(">qiq")
_KEY_ROOM_EXTRA = 2
_UNKNOWN_LEVEL_DELAY_MS = 1000
_NOT, _PREPARED, _COMMIT, _ROLLBACK = 0x0, 0x4, 0x8, 0xC


def _find_topic(topic: bytes, topics: NDArray[np.int64], topic_bytes: NDArray[np.uint8]) -> int:
    for topic_id in range(topics.shape[0]):
        size = int(topics[topic_id, TOPIC_SIZE])
        if size == len(topic) and topic_bytes[topic_id, :size].tobytes() == topic:
            return topic_id
    return -1


def _find_queue(topic_id: int, queue_id: int, queues: NDArray[np.int64]) -> int:
    for slot in range(queues.shape[0]):
        if (
            int(queues[slot, QUEUE_TOPIC_ID]) == topic_id
            and int(queues[slot, QUEUE_ID]) == queue_id
        ):
            return slot
    return -1


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
    """Same contract as dispatch_kernels.dispatch_scan (the hash slots and the fingerprint and
    key state columns are accepted and ignored: the twin searches and hashes afresh)."""
    del topic_slots, queue_slots
    data = segment.tobytes()
    record_capacity = out_records.shape[0]
    key_capacity = out_keys.shape[1]
    position = start_bytes
    records: list[tuple[int, int, int, int, int, int, int]] = []
    keys: list[tuple[int, int, int]] = []
    group_slots: list[int] = []
    group_first_index: dict[int, int] = {}
    reason = STOP_END
    detail_a = detail_b = 0
    while True:
        if position == end_bytes:
            reason = STOP_END
            break
        if len(records) == record_capacity:
            reason = STOP_FULL
            break
        verdict, size, _body_at, topic_position, properties_position = check_record(
            segment, position, end_bytes, base_log_offset_bytes, False, False
        )
        if verdict != RECORD_WHOLE:
            reason = verdict
            break
        log_offset = base_log_offset_bytes + position
        (sysflag,) = _SYSFLAG.unpack_from(data, position + 36)
        topic = data[topic_position : properties_position - 2]
        properties_size = position + size - properties_position
        if len(keys) + properties_size // 2 + _KEY_ROOM_EXTRA > key_capacity:
            reason = STOP_FULL
            break
        topic_id = _find_topic(topic, topics, topic_bytes)
        if topic_id < 0:
            reason = DISPATCH_STOP_UNKNOWN_TOPIC
            detail_a, detail_b = topic_position, len(topic)
            break
        (queue_id,) = _QUEUE_ID.unpack_from(data, position + 12)
        (queue_index,) = _QUEUE_INDEX.unpack_from(data, position + 20)
        transaction = sysflag & 0xC
        slot = -1
        if transaction in (_NOT, _COMMIT):
            slot = _find_queue(topic_id, queue_id, queues)
            if slot < 0:
                reason = DISPATCH_STOP_UNKNOWN_QUEUE
                detail_a, detail_b = topic_id, queue_id
                break
            expected = int(queues[slot, QUEUE_NEXT_INDEX])
            if queue_index != expected:
                if queue_index < expected and log_offset < redispatch_end_log_offset_bytes:
                    slot = -1
                else:
                    reason = DISPATCH_STOP_QUEUE_INDEX_MISMATCH
                    detail_a, detail_b = expected, queue_index
                    break
        (store_timestamp,) = _STORE_TIMESTAMP.unpack_from(data, position + 56)
        properties = decode_properties(
            data[properties_position : properties_position + properties_size]
        )
        if topics[topic_id, TOPIC_IS_SCHEDULE]:
            if 0 <= queue_id < delay_levels_ms.size:
                tag = store_timestamp + int(delay_levels_ms[queue_id])
            else:
                tag = store_timestamp + _UNKNOWN_LEVEL_DELAY_MS
        else:
            tag = tag_hash(properties.get(b"TAGS"))
        record_keys: list[bytes] = []
        if transaction != _ROLLBACK and log_offset > index_skip_through_log_offset_bytes:
            if b"UNIQ_KEY" in properties:
                record_keys.append(properties[b"UNIQ_KEY"])
            record_keys.extend(token for token in properties.get(b"KEYS", b"").split(b" ") if token)
        topic_text = java_utf8_decode(topic)
        keys.extend(
            (index_key_hash(topic_text, java_utf8_decode(key)), log_offset, store_timestamp)
            for key in record_keys
        )
        records.append(
            (log_offset, size, tag, slot, queue_index, store_timestamp, len(record_keys))
        )
        if slot >= 0:
            queues[slot, QUEUE_NEXT_INDEX] = queue_index + 1
            if slot not in group_first_index:
                group_first_index[slot] = queue_index
                group_slots.append(slot)
        position += size
    for row, record in enumerate(records):
        out_records[row, :] = record
    start = 0
    for group, slot in enumerate(group_slots):
        out_groups[group, 0] = slot
        out_groups[group, 1] = start
        out_groups[group, 2] = group_first_index[slot]
        for record in records:
            if record[3] == slot:
                entry = _CQ_ENTRY.pack(record[0], record[1], record[2])
                out_cq[start * 20 : start * 20 + 20] = np.frombuffer(entry, dtype=np.uint8)
                start += 1
    out_groups[len(group_slots), 1] = start
    for column, key in enumerate(keys):
        out_keys[:, column] = key
    out_info[:] = [
        len(records),
        position,
        reason,
        len(group_slots),
        len(keys),
        start,
        detail_a,
        detail_b,
    ]
    return reason
