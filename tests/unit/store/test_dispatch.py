"""Goal: dispatch builds exactly the consume-queue entries and index keys that a decode of every
record implies (tag hash or delivery time, UNIQ_KEY then each KEYS token, transaction types
honoured), checks every QUEUEOFFSET against the queue's count, stops where and why its contract
says, and a re-dispatch after a restart writes nothing twice; the kernel and its plain-Python
twin agree exactly.

Method: hypothesis builds segments of records from message.encode_record() with topics (ASCII,
non-ASCII, the schedule topic), queue ids, transaction types and raw property strings (valid
and broken UTF-8, duplicate names, empty values, runs of spaces in KEYS), registers a random
part of the topics and queues with nudged counts, cuts or scribbles the tail, and runs
dispatch_scan and its twin on the same bytes. End-to-end tests append through a real CommitLog
with tiny segments, dispatch into real consume queues and an index, then compare every entry
with decode_record() and message.index_key_hash().
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from numpy.typing import NDArray

from mqbox.errors import StoreError
from mqbox.message import (
    SYSFLAG_TRANSACTION_COMMIT_TYPE,
    SYSFLAG_TRANSACTION_PREPARED_TYPE,
    SYSFLAG_TRANSACTION_ROLLBACK_TYPE,
    MessageToStore,
    decode_properties,
    decode_record,
    encode_blank,
    encode_record,
    index_key_hash,
    java_utf8_decode,
    tag_hash,
)
from mqbox.store import dispatch_kernels as fast
from mqbox.store import dispatch_kernels_ref as ref
from mqbox.store.commit_log import CommitLog
from mqbox.store.consume_queue import ConsumeQueueTable
from mqbox.store.dispatch import (
    DELAY_LEVELS_MS_DEFAULT,
    SCHEDULE_TOPIC,
    Dispatcher,
    DispatchTables,
)
from mqbox.store.index import IndexService
from mqbox.store.layout import StoreGeometry

TOPICS = ["TopicA", "TopicB", SCHEDULE_TOPIC, "话题", "T" * 127]
TRANSACTIONS = [
    0,
    0,
    0,
    SYSFLAG_TRANSACTION_COMMIT_TYPE,
    SYSFLAG_TRANSACTION_PREPARED_TYPE,
    SYSFLAG_TRANSACTION_ROLLBACK_TYPE,
]
NOT_OR_COMMIT = (0, SYSFLAG_TRANSACTION_COMMIT_TYPE)
SENTINEL = -7
DELAYS = np.array(DELAY_LEVELS_MS_DEFAULT, dtype=np.int64)

# --- Building records ---------------------------------------------------------------------------

values = st.one_of(
    st.sampled_from(
        [b"TagA", b"k1 k2", b"  k1  k2 ", "中文 键".encode(), b"\xed\xa0\x80", b"\xff x", b" "]
    ),
    st.text(alphabet="ab c😀\x01", min_size=0, max_size=6).map(lambda text: text.encode()),
    st.binary(max_size=6),
)
names = st.sampled_from([b"TAGS", b"KEYS", b"UNIQ_KEY", b"WAIT", b"TAG", b"UNIQ_KEYS", b""])


def raw_properties(entries: list[tuple[bytes, bytes]], trailing: bool) -> bytes:
    """A properties string written by hand: duplicates and odd entries included."""
    parts = [name + b"\x01" + value.replace(b"\x02", b"") for name, value in entries]
    return b"\x02".join(parts) + (b"\x02" if trailing and parts else b"")


@dataclass(frozen=True)
class Spec:
    topic: str
    queue_id: int
    transaction: int
    properties: bytes
    body_size_bytes: int
    store_timestamp_ms: int


specs = st.builds(
    Spec,
    topic=st.sampled_from(TOPICS),
    queue_id=st.sampled_from([0, 1, 2, 17, 40]),
    transaction=st.sampled_from(TRANSACTIONS),
    properties=st.builds(
        raw_properties, st.lists(st.tuples(names, values), max_size=5), st.booleans()
    ),
    body_size_bytes=st.integers(0, 40),
    store_timestamp_ms=st.integers(0, 2**41),
)


def build_segment(
    items: list[Spec], base_log_offset_bytes: int, first_queue_index: int
) -> tuple[bytearray, list[int]]:
    """Records back to back with dense queue indexes (from first_queue_index) per queue."""
    data = bytearray()
    positions = []
    counts: dict[tuple[str, int], int] = {}
    for item in items:
        key = (item.topic, item.queue_id)
        queue_index = 0
        if item.transaction in NOT_OR_COMMIT:
            queue_index = counts.get(key, first_queue_index)
            counts[key] = queue_index + 1
        record = encode_record(
            MessageToStore(
                item.topic,
                item.queue_id,
                b"b" * item.body_size_bytes,
                properties=item.properties,
                sysflag=item.transaction,
            ),
            queue_index=queue_index,
            log_offset_bytes=base_log_offset_bytes + len(data),
            store_timestamp_ms=item.store_timestamp_ms,
        )
        positions.append(len(data))
        data += record
    return data, positions


# --- Running one implementation -----------------------------------------------------------------


@dataclass(frozen=True)
class Scan:
    reason: int
    info: list[int]
    records: list[list[int]]
    cq: bytes
    groups: list[list[int]]
    keys: list[tuple[int, ...]]
    next_queue_indexes: list[int]


def run_scan(
    implementation: ModuleType,
    segment: NDArray[np.uint8],
    start_bytes: int,
    end_bytes: int,
    base_log_offset_bytes: int,
    tables: DispatchTables,
    redispatch_end_log_offset_bytes: int,
    index_skip_through_log_offset_bytes: int,
    record_capacity: int,
) -> Scan:
    queues = tables.queues.copy()
    key_capacity = fast.KEY_COUNT_PER_RECORD_MAX
    out_records = np.full((record_capacity, fast.RECORD_COLUMN_COUNT), SENTINEL, dtype=np.int64)
    out_cq = np.zeros(record_capacity * 20, dtype=np.uint8)
    out_groups = np.full((record_capacity + 1, fast.GROUP_COLUMN_COUNT), SENTINEL, np.int64)
    out_keys = np.full((fast.KEY_ROW_COUNT, key_capacity), SENTINEL, dtype=np.int64)
    out_info = np.zeros(fast.INFO_SIZE, dtype=np.int64)
    reason = implementation.dispatch_scan(
        segment,
        start_bytes,
        end_bytes,
        base_log_offset_bytes,
        tables.topic_slots,
        tables.topics,
        tables.topic_bytes,
        tables.queue_slots,
        queues,
        DELAYS,
        redispatch_end_log_offset_bytes,
        index_skip_through_log_offset_bytes,
        out_records,
        out_cq,
        out_groups,
        out_keys,
        out_info,
    )
    assert not queues[:, fast.QUEUE_GROUP_COUNT].any()
    info = out_info.tolist()
    record_count = info[fast.INFO_RECORD_COUNT]
    group_count = info[fast.INFO_GROUP_COUNT]
    key_count = info[fast.INFO_KEY_COUNT]
    assert (out_records[record_count:] == SENTINEL).all()
    assert (out_keys[:, key_count:] == SENTINEL).all()
    return Scan(
        reason=reason,
        info=info,
        records=out_records[:record_count].tolist(),
        cq=out_cq[: info[fast.INFO_CQ_ENTRY_COUNT] * 20].tobytes(),
        groups=out_groups[: group_count + 1].tolist(),
        keys=[tuple(column) for column in out_keys[:, :key_count].T.tolist()],
        next_queue_indexes=queues[:, fast.QUEUE_NEXT_INDEX].tolist(),
    )


def register(tables: DispatchTables, topic: str, queue_id: int | None, next_index: int) -> None:
    topic_bytes = topic.encode()
    topic_id = tables.topic_id_of.get(topic_bytes)
    if topic_id is None:
        topic_id = tables.add_topic(topic_bytes)
    if queue_id is not None and (topic, queue_id) not in tables.queue_slot_of:
        tables.add_queue(topic_id, queue_id, next_index)


# --- Kernel and twin ----------------------------------------------------------------------------


@settings(max_examples=300)
@given(
    items=st.lists(specs, min_size=1, max_size=12),
    forget=st.lists(st.tuples(st.integers(0, 11), st.booleans()), max_size=2),
    nudge=st.tuples(st.integers(0, 11), st.sampled_from([0, 1, -1, 3])),
    first_queue_index=st.integers(0, 5),
    damage=st.sampled_from(["none", "none", "cut", "blank", "scribble", "offset"]),
    cut=st.integers(0, 4000),
    record_capacity=st.integers(1, 16),
    redispatch_from_end=st.booleans(),
    index_skip=st.one_of(st.just(-1), st.just(-1), st.integers(0, 3000)),
    base_log_offset_bytes=st.sampled_from([0, 1 << 30, 5 * (1 << 30)]),
)
def test_dispatch_scan_kernel_agrees_with_its_twin(
    items: list[Spec],
    forget: list[tuple[int, bool]],
    nudge: tuple[int, int],
    first_queue_index: int,
    damage: str,
    cut: int,
    record_capacity: int,
    redispatch_from_end: bool,
    index_skip: int,
    base_log_offset_bytes: int,
) -> None:
    data, positions = build_segment(items, base_log_offset_bytes, first_queue_index)
    end_bytes = len(data)
    if damage == "cut":
        end_bytes = min(cut, len(data))
    elif damage == "blank":
        data += encode_blank(64)
        end_bytes = len(data)
    elif damage == "scribble":
        data[cut % len(data)] ^= 0x5A
    elif damage == "offset":
        struct.pack_into(">q", data, positions[-1] + 28, 12345)
    segment = np.frombuffer(bytes(data) + bytes(64), dtype=np.uint8)
    # Register what the records use, but forget a topic or a queue now and then, and start one
    # queue's count off by `nudge` (a repeat below the re-dispatch end, or a gap).
    forgotten_topics = {items[index % len(items)].topic for index, whole in forget if whole}
    forgotten_queues = {
        (items[index % len(items)].topic, items[index % len(items)].queue_id)
        for index, whole in forget
        if not whole
    }
    nudged = (items[nudge[0] % len(items)].topic, items[nudge[0] % len(items)].queue_id)
    tables = DispatchTables(topic_capacity=2, queue_capacity=2)  # small: exercises growth
    for item in items:
        if item.topic in forgotten_topics:
            continue
        key = (item.topic, item.queue_id)
        queue_id = None if key in forgotten_queues else item.queue_id
        next_index = first_queue_index + (nudge[1] if key == nudged else 0)
        register(tables, item.topic, queue_id, max(next_index, 0))
    start_bytes = positions[len(positions) // 3] if damage != "cut" else 0
    redispatch_end = base_log_offset_bytes + end_bytes if redispatch_from_end else 0
    arguments = (
        segment,
        start_bytes,
        end_bytes,
        base_log_offset_bytes,
        tables,
        redispatch_end,
        base_log_offset_bytes + index_skip if index_skip >= 0 else -1,
        record_capacity,
    )
    kernel_scan = run_scan(fast, *arguments)
    assert kernel_scan == run_scan(ref, *arguments)
    event(f"stop {kernel_scan.reason}, reported {min(len(kernel_scan.records), 2)}")
    event(f"keys {min(len(kernel_scan.keys), 2)}")


def test_stop_reasons_of_the_kernel_match_the_twin_names() -> None:
    for name in dir(ref):
        if name.startswith("DISPATCH_STOP_"):
            assert getattr(fast, name) == getattr(ref, name)


# --- End to end through real files --------------------------------------------------------------

GEOMETRY = StoreGeometry(
    commit_log_segment_size_bytes=2048,
    cq_segment_entry_count=8,
    index_slot_count=16,
    index_entry_count_max=64,
)


@dataclass
class Store:
    commit_log: CommitLog
    queues: ConsumeQueueTable
    index: IndexService
    dispatcher: Dispatcher


def open_store(root: Path, record_count_max: int = 5) -> Store:
    queues = ConsumeQueueTable(root, GEOMETRY, writable=True)

    def initial(topic: str, queue_id: int) -> int:
        queue = queues.find_queue(topic, queue_id)
        return 0 if queue is None else queue.entry_count

    commit_log = CommitLog.open(
        root, GEOMETRY, writable=True, record_size_bytes_max=1024, initial_queue_index=initial
    )
    commit_log.set_write_position(commit_log.find_clean_write_end(0))
    index = IndexService(root, GEOMETRY, writable=True, clock_ms=iter(range(10**6)).__next__)
    index.load()
    dispatcher = Dispatcher(commit_log, queues, index, record_count_max=record_count_max)
    return Store(commit_log, queues, index, dispatcher)


def append(store: Store, item: Spec) -> int:
    record = encode_record(
        MessageToStore(
            item.topic,
            item.queue_id,
            b"b" * item.body_size_bytes,
            properties=item.properties,
            sysflag=item.transaction,
        )
    )
    result = store.commit_log.append_batch(
        np.frombuffer(record, dtype=np.uint8),
        np.array([len(record)], dtype=np.int32),
        item.topic,
        item.queue_id,
        item.store_timestamp_ms,
    )
    return result.log_offset_bytes


def expected_keys(topic: str, properties: bytes) -> list[int]:
    decoded = decode_properties(properties)
    keys = []
    if b"UNIQ_KEY" in decoded:
        keys.append(decoded[b"UNIQ_KEY"])
    keys.extend(token for token in decoded.get(b"KEYS", b"").split(b" ") if token)
    return [index_key_hash(topic, java_utf8_decode(key)) for key in keys]


def check_against_decode(store: Store, offsets: list[int]) -> None:
    """Every record's consume-queue entry and index keys are what its decode implies."""
    for log_offset_bytes in offsets:
        record = store.commit_log.read_record(
            log_offset_bytes, store.commit_log.write_log_offset_bytes
        )
        assert record is not None
        stored = decode_record(record)
        transaction = stored.sysflag & 0xC
        if transaction in NOT_OR_COMMIT:
            queue = store.queues.find_queue(stored.topic, stored.queue_id)
            assert queue is not None
            entry = queue.entry(stored.queue_index)
            assert entry is not None
            assert entry.log_offset_bytes == log_offset_bytes
            assert entry.size_bytes == stored.size_bytes
            if stored.topic == SCHEDULE_TOPIC:
                delay_ms = (
                    DELAY_LEVELS_MS_DEFAULT[stored.queue_id]
                    if stored.queue_id < len(DELAY_LEVELS_MS_DEFAULT)
                    else 1000
                )
                assert entry.tag_hash == stored.store_timestamp_ms + delay_ms
            else:
                assert entry.tag_hash == tag_hash(decode_properties(stored.properties).get(b"TAGS"))
        if transaction == SYSFLAG_TRANSACTION_ROLLBACK_TYPE:
            continue
        for key_hash in expected_keys(stored.topic, stored.properties):
            found = store.index.query(key_hash, 0, 2**62, 10_000)
            assert log_offset_bytes in found


ascii_specs = st.builds(
    Spec,
    topic=st.sampled_from(TOPICS[:4]),
    queue_id=st.sampled_from([0, 1, 2, 17, 40]),
    transaction=st.sampled_from(TRANSACTIONS),
    properties=st.builds(
        raw_properties, st.lists(st.tuples(names, values), max_size=4), st.booleans()
    ),
    body_size_bytes=st.integers(0, 300),
    store_timestamp_ms=st.integers(1, 2**40),
)


@settings(max_examples=40)
@given(items=st.lists(ascii_specs, min_size=1, max_size=40), chunks=st.lists(st.integers(0, 40)))
def test_dispatch_matches_a_decode_of_every_record(
    tmp_path_factory: pytest.TempPathFactory, items: list[Spec], chunks: list[int]
) -> None:
    store = open_store(tmp_path_factory.mktemp("store"))
    store.dispatcher.start_at(0)
    offsets = [append(store, item) for item in items]
    # Dispatch in pieces ending at record boundaries, as a dispatcher that polls would.
    for chunk in sorted(chunks):
        if chunk < len(offsets):
            store.dispatcher.dispatch(offsets[chunk])
    store.dispatcher.dispatch(store.commit_log.write_log_offset_bytes)
    assert store.dispatcher.dispatched_log_offset_bytes == store.commit_log.write_log_offset_bytes
    check_against_decode(store, offsets)
    for slot, (topic, queue_id) in enumerate(store.dispatcher.tables.queue_keys):
        queue = store.queues.find_queue(topic, queue_id)
        assert queue is not None
        assert int(store.dispatcher.max_offsets_by_slot()[slot]) == queue.entry_count
        assert store.commit_log.queue_indexes.next_queue_index(topic, queue_id) == queue.entry_count


def test_dispatch_crosses_blanks_into_later_segments(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    store.dispatcher.start_at(0)
    item = Spec("TopicA", 0, 0, b"TAGS\x01TagA\x02KEYS\x01a b\x02", 600, 1_000)
    offsets = [append(store, item) for _ in range(9)]
    assert len(store.commit_log.segment_starts_bytes) >= 4
    assert store.dispatcher.dispatch(store.commit_log.write_log_offset_bytes) == 9
    check_against_decode(store, offsets)
    queue = store.queues.find_queue("TopicA", 0)
    assert queue is not None
    assert queue.entry_count == 9


def test_schedule_topic_entries_hold_the_delivery_time(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    store.dispatcher.start_at(0)
    for level in (1, 3, 18, 19):
        append(store, Spec(SCHEDULE_TOPIC, level - 1, 0, b"TAGS\x01TagA\x02", 0, 1_000_000))
    store.dispatcher.dispatch(store.commit_log.write_log_offset_bytes)
    expected = {0: 1_001_000, 2: 1_010_000, 17: 1_000_000 + 7_200_000, 18: 1_001_000}
    for queue_id, delivery_ms in expected.items():
        queue = store.queues.find_queue(SCHEDULE_TOPIC, queue_id)
        assert queue is not None
        entry = queue.entry(0)
        assert entry is not None
        assert entry.tag_hash == delivery_ms


def test_a_queue_index_gap_stops_dispatch(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    store.dispatcher.start_at(0)
    append(store, Spec("TopicA", 0, 0, b"", 10, 1))
    store.dispatcher.dispatch(store.commit_log.write_log_offset_bytes)
    # The writer's count jumps (a bug): the next record says 5 where the queue holds 1.
    slot = store.commit_log.queue_slot("TopicA", 0)
    store.commit_log.queue_indexes.next_queue_indexes[slot] = 5
    append(store, Spec("TopicA", 0, 0, b"", 10, 1))
    with pytest.raises(StoreError, match="QUEUEOFFSET"):
        store.dispatcher.dispatch(store.commit_log.write_log_offset_bytes)
    queue = store.queues.find_queue("TopicA", 0)
    assert queue is not None
    assert queue.entry_count == 1


def test_redispatch_after_a_restart_writes_nothing_twice(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    store.dispatcher.start_at(0)
    properties = b"UNIQ_KEY\x01U1\x02KEYS\x01k1 k2\x02"
    for queue_id in (0, 1, 0, 1, 2):
        append(store, Spec("TopicA", queue_id, 0, properties, 50, 7))
    end_bytes = store.commit_log.write_log_offset_bytes
    store.dispatcher.dispatch(end_bytes)
    keys_before = store.index.query(index_key_hash("TopicA", "k1"), 0, 2**62, 100)
    # A second dispatcher over the same files, told that everything below end_bytes may exist.
    again = Dispatcher(store.commit_log, store.queues, store.index)
    again.start_at(
        0,
        redispatch_end_log_offset_bytes=end_bytes,
        index_skip_through_log_offset_bytes=store.index.end_log_offset_bytes,
    )
    assert again.dispatch(end_bytes) == 5
    assert again.statistics().cq_entry_total == 0
    assert again.statistics().key_total == 0
    assert store.index.query(index_key_hash("TopicA", "k1"), 0, 2**62, 100) == keys_before
    for queue_id, count in ((0, 2), (1, 2), (2, 1)):
        queue = store.queues.find_queue("TopicA", queue_id)
        assert queue is not None
        assert queue.entry_count == count
    # New records after the re-dispatch go on as usual.
    append(store, Spec("TopicA", 2, 0, properties, 50, 8))
    assert again.dispatch(store.commit_log.write_log_offset_bytes) == 1
    assert again.max_offset("TopicA", 2) == 2


def test_many_topics_and_queues_grow_the_tables(tmp_path: Path) -> None:
    store = open_store(tmp_path, record_count_max=64)
    store.dispatcher.start_at(0)
    offsets = []
    for topic_number in range(40):
        for queue_id in range(5):
            offsets.append(append(store, Spec(f"T{topic_number}", queue_id, 0, b"", 0, 1)))
            store.dispatcher.dispatch(store.commit_log.write_log_offset_bytes)
    statistics = store.dispatcher.statistics()
    assert statistics.topic_count == 40
    assert statistics.queue_count == 200
    assert statistics.record_total == 200
    check_against_decode(store, offsets)


def test_hash_helpers_are_deterministic() -> None:
    raw = np.frombuffer(b"TopicA", dtype=np.uint8)
    assert fast.topic_fingerprint(raw, 0, 6) == fast.topic_fingerprint(raw.copy(), 0, 6)
    assert 0 <= fast.queue_fingerprint(2**31 - 1, 2**31 - 1) < 2**32
    slots: NDArray[np.int32] = np.full(8, fast.SLOT_EMPTY, dtype=np.int32)
    fast.insert_slot(slots, 5, 0)
    fast.insert_slot(slots, 5, 1)
    assert slots[5] == 0
    assert slots[6] == 1
