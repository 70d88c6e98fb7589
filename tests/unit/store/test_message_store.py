"""Goal: the store facade answers like RocketMQ's DefaultMessageStore: every row of the PULL
result table (docs/protocol.md section 4.3), tag filtering, merged runs whose bytes are the
stored records, one record by offset, records by key, SEARCH_OFFSET_BY_TIMESTAMP's rules, queue
bounds and earliest store time; a clean close and reopen keeps write position, queue bounds and
queue offsets exactly, without dispatching anything twice; flushes write the checkpoint; SYNC_FLUSH
waits for a group commit; a read-only reader in another process reads what is published; 10,000
queues fit in one store.

Method: tiny geometry (4 KiB commit-log segments, 8-entry consume-queue segments) in tmp_path and a
fake clock that sets each record's store time. Each situation of the table is built directly
(moving a queue's minimum as retention would, deleting commit-log or consume-queue segments), and
every plan is compared with the records read back through read_message and decode_record.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from mqbox.config import BrokerConfig, FlushDiskType
from mqbox.errors import ConfigError, MessageTooLargeError
from mqbox.message import (
    MessageToStore,
    decode_record,
    encode_properties_str,
    encode_record,
    pack_host,
)
from mqbox.store.checkpoint import read_checkpoint
from mqbox.store.layout import StoreGeometry, abort_path, checkpoint_path
from mqbox.store.message_store import (
    MessageStore,
    MessageStoreReader,
    StoreConfig,
    warm_up_kernels,
)
from mqbox.store.read_plan import (
    PULL_NOT_FOUND,
    PULL_OFFSET_MOVED,
    PULL_RETRY_IMMEDIATELY,
    PULL_SUCCESS,
    GetMessageStatus,
    ReadPlan,
    tag_filter,
)
from tests.conftest import unique_name

HOST = pack_host("127.0.0.1", 10911)
GEOMETRY = StoreGeometry(
    commit_log_segment_size_bytes=4096,
    cq_segment_entry_count=8,
    index_slot_count=64,
    index_entry_count_max=400,
)
CONFIG = StoreConfig(geometry=GEOMETRY, max_message_size_bytes=1024, store_host=HOST)


class Clock:
    """A settable wall clock in ms."""

    def __init__(self, now_ms: int = 1_700_000_000_000):
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms


def record(
    topic: str,
    queue_id: int,
    body: bytes = b"body",
    *,
    tags: str | None = None,
    keys: str | None = None,
    uniq_key: str | None = None,
) -> bytearray:
    properties = {}
    if tags is not None:
        properties["TAGS"] = tags
    if keys is not None:
        properties["KEYS"] = keys
    if uniq_key is not None:
        properties["UNIQ_KEY"] = uniq_key
    return encode_record(
        MessageToStore(topic, queue_id, body, properties=encode_properties_str(properties))
    )


def open_store(
    root: Path, clock: Clock | None = None, config: StoreConfig = CONFIG
) -> MessageStore:
    return MessageStore.open(root, config, clock_ms=clock or Clock())


def fill(store: MessageStore, topic: str, queue_id: int, count: int, **fields: str) -> list[int]:
    offsets = [
        store.append_record(record(topic, queue_id, b"m%d" % index, **fields), topic, queue_id)
        for index in range(count)
    ]
    store.dispatch()
    return [result.log_offset_bytes for result in offsets]


def plan_records(store: MessageStore, plan: ReadPlan) -> list[bytes]:
    """The records a plan's runs hold, split by TOTALSIZE."""
    data = store.reader.read_plan_bytes(plan)
    records = []
    position = 0
    while position < len(data):
        size = int.from_bytes(data[position : position + 4], "big")
        records.append(data[position : position + size])
        position += size
    assert position == len(data)
    return records


# --- The PULL table -----------------------------------------------------------------------------


def test_unknown_and_empty_queues(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    plan = store.get_messages("Nobody", 0, 0)
    assert plan.status is GetMessageStatus.NO_MATCHED_LOGIC_QUEUE
    assert plan.pull_response_code == PULL_NOT_FOUND
    plan = store.get_messages("Nobody", 0, 5)
    assert (plan.next_queue_index, plan.pull_response_code) == (0, PULL_OFFSET_MOVED)
    store.consume_queues.queue("Empty", 0)  # a queue that exists and holds nothing
    plan = store.get_messages("Empty", 0, 0)
    assert plan.status is GetMessageStatus.NO_MESSAGE_IN_QUEUE
    assert (plan.next_queue_index, plan.pull_response_code) == (0, PULL_NOT_FOUND)
    plan = store.get_messages("Empty", 0, 3)
    assert (plan.next_queue_index, plan.pull_response_code) == (0, PULL_OFFSET_MOVED)
    store.close()


def test_found_overflow_one_and_overflow_badly(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    fill(store, "TopicA", 0, 10)
    plan = store.get_messages("TopicA", 0, 0, count_max=4)
    assert plan.status is GetMessageStatus.FOUND
    assert plan.pull_response_code == PULL_SUCCESS
    assert (plan.message_count, plan.next_queue_index) == (4, 4)
    assert (plan.min_queue_index, plan.max_queue_index) == (0, 10)
    assert [decode_record(raw).queue_index for raw in plan_records(store, plan)] == [0, 1, 2, 3]
    assert len(plan.runs) == 1  # one queue written alone: its records are adjacent
    plan = store.get_messages("TopicA", 0, 10)
    assert plan.status is GetMessageStatus.OFFSET_OVERFLOW_ONE
    assert (plan.next_queue_index, plan.pull_response_code) == (10, PULL_NOT_FOUND)
    plan = store.get_messages("TopicA", 0, 11)
    assert plan.status is GetMessageStatus.OFFSET_OVERFLOW_BADLY
    assert (plan.next_queue_index, plan.pull_response_code) == (0, PULL_OFFSET_MOVED)
    store.close()


def test_offset_too_small_and_overflow_badly_with_a_minimum(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    offsets = fill(store, "TopicA", 0, 10)
    queue = store.consume_queues.find_queue("TopicA", 0)
    assert queue is not None
    queue.correct_min_queue_index(offsets[3])  # retention moved the minimum to index 3
    plan = store.get_messages("TopicA", 0, 1)
    assert plan.status is GetMessageStatus.OFFSET_TOO_SMALL
    assert (plan.next_queue_index, plan.pull_response_code) == (3, PULL_OFFSET_MOVED)
    plan = store.get_messages("TopicA", 0, 12)
    assert plan.status is GetMessageStatus.OFFSET_OVERFLOW_BADLY
    assert plan.next_queue_index == 10  # minOffset is not 0: maxOffset
    assert store.min_offset("TopicA", 0) == 3
    store.close()


def test_entries_scanned_without_a_match(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    for index in range(6):
        tags = "TagA" if index in (1, 4) else "TagB"
        store.append_record(record("TopicA", 0, tags=tags), "TopicA", 0)
    store.dispatch()
    plan = store.get_messages("TopicA", 0, 0, tag_hashes=tag_filter(["TagA"]))
    assert plan.status is GetMessageStatus.FOUND
    assert plan.message_count == 2
    assert plan.next_queue_index == 6
    assert len(plan.runs) == 2  # not adjacent: two runs
    assert [decode_record(raw).queue_index for raw in plan_records(store, plan)] == [1, 4]
    plan = store.get_messages("TopicA", 0, 5, tag_hashes=tag_filter(["TagA"]))
    assert plan.status is GetMessageStatus.NO_MATCHED_MESSAGE
    assert (plan.next_queue_index, plan.pull_response_code) == (6, PULL_RETRY_IMMEDIATELY)
    plan = store.get_messages("TopicA", 0, 0, tag_hashes=tag_filter(["TagA", "TagB"]))
    assert plan.message_count == 6
    store.close()


def test_commit_log_data_already_deleted(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    fill(store, "TopicA", 0, 60, tags="x" * 40)  # several commit-log segments
    assert len(store.commit_log.segment_starts_bytes) >= 3
    store.flush()
    assert store.commit_log.delete_segments_below(4096) == 1
    store.reader.refresh_commit_log_bounds()
    plan = store.get_messages("TopicA", 0, 0, count_max=2)
    assert plan.status is GetMessageStatus.MESSAGE_WAS_REMOVING
    assert plan.pull_response_code == PULL_RETRY_IMMEDIATELY
    assert plan.next_queue_index == 8  # the rest of the consume-queue segment was scanned
    assert store.read_message(0) is None
    store.close()


def test_consume_queue_segment_gone_under_a_reader(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    fill(store, "TopicA", 0, 40)  # five consume-queue segments; a reader's open maps the last 3
    reader = MessageStoreReader.open(tmp_path, CONFIG)
    assert reader.get_messages("TopicA", 0, 0).status is GetMessageStatus.FOUND
    queue = store.consume_queues.find_queue("TopicA", 0)
    assert queue is not None
    entry = queue.entry(16)
    assert entry is not None
    queue.delete_below_log_offset(entry.log_offset_bytes)  # retention in the writer
    # The reader finds the segment of index 9 gone, looks at the queue's files again, and
    # answers as below any minimum: offset moved, to the first entry left.
    plan = reader.get_messages("TopicA", 0, 9)
    assert plan.status is GetMessageStatus.OFFSET_TOO_SMALL
    assert (plan.next_queue_index, plan.pull_response_code) == (16, PULL_OFFSET_MOVED)
    assert reader.min_offset("TopicA", 0) == 16
    reader.close()
    store.close()


# --- Runs, records, keys, time ------------------------------------------------------------------


def test_plan_runs_hold_the_stored_records_across_segments(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    results = []
    for index in range(40):
        queue_id = index % 2
        results.append(
            store.append_record(record("TopicA", queue_id, b"x" * 150), "TopicA", queue_id)
        )
    store.dispatch()
    expected = [
        store.read_message(result.log_offset_bytes)
        for result in results
        if result.queue_index >= 0 and results.index(result) % 2 == 1
    ]
    collected: list[bytes] = []
    queue_index = 0
    while True:
        plan = store.get_messages("TopicA", 1, queue_index, count_max=32)
        if plan.status is not GetMessageStatus.FOUND:
            assert plan.status is GetMessageStatus.OFFSET_OVERFLOW_ONE
            break
        collected.extend(plan_records(store, plan))
        queue_index = plan.next_queue_index
    assert collected == expected
    assert queue_index == 20


def test_read_message_by_log_offset(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    result = store.append_record(record("TopicA", 2, b"hello"), "TopicA", 2)
    raw = store.read_message(result.log_offset_bytes)
    assert raw is not None
    stored = decode_record(raw)
    assert (stored.topic, stored.queue_id, stored.body) == ("TopicA", 2, b"hello")
    assert stored.store_host == HOST
    assert store.read_message(result.log_offset_bytes + 1) is None
    assert store.read_message(10**9) is None
    store.close()


def test_query_by_key_confirms_topic_key_and_time(tmp_path: Path) -> None:
    clock = Clock(1_000_000)
    store = open_store(tmp_path, clock)
    for index in range(6):
        clock.now_ms = 1_000_000 + index * 10_000
        store.append_record(
            record("TopicA", 0, b"%d" % index, keys=f"order-{index % 2} all", uniq_key=f"U{index}"),
            "TopicA",
            0,
        )
    store.append_record(record("TopicB", 0, keys="order-0"), "TopicB", 0)
    store.dispatch()
    found = store.query_by_key("TopicA", "order-0", 0, 2**62, 10)
    assert [message.body for message in found] == [b"4", b"2", b"0"]  # newest first
    assert all(message.topic == "TopicA" for message in found)
    assert [m.body for m in store.query_by_key("TopicA", "U3", 0, 2**62, 10)] == [b"3"]
    assert len(store.query_by_key("TopicA", "all", 0, 2**62, 4)) == 4
    in_range = store.query_by_key("TopicA", "all", 1_010_000, 1_030_000, 10)
    assert [message.body for message in in_range] == [b"3", b"2", b"1"]
    assert store.query_by_key("TopicA", "missing", 0, 2**62, 10) == []
    assert [m.body for m in store.query_by_key("TopicB", "order-0", 0, 2**62, 10)] == [b"body"]
    records = store.query_records_by_key("TopicA", "order-1", 0, 2**62, 10)
    assert [decode_record(raw).body for _offset, raw in records] == [b"5", b"3", b"1"]
    assert all(store.read_message(offset) == raw for offset, raw in records)
    store.close()


def test_search_offset_by_timestamp(tmp_path: Path) -> None:
    clock = Clock()
    store = open_store(tmp_path, clock)
    assert store.search_offset_by_timestamp("TopicA", 0, 123) == 0  # no data
    for store_ms in (100, 200, 200, 300, 500):
        clock.now_ms = store_ms
        store.append_record(record("TopicA", 0), "TopicA", 0)
    store.dispatch()
    cases = {
        200: 1,  # exact: the first of equals
        500: 4,
        250: 2,  # a tie between 200 (index 2) and 300: the earlier
        260: 3,  # nearer to 300
        120: 0,
        50: 0,  # every entry later: the first
        900: 4,  # every entry earlier: the last entry, not the max offset
    }
    for timestamp_ms, queue_index in cases.items():
        assert store.search_offset_by_timestamp("TopicA", 0, timestamp_ms) == queue_index
    assert store.earliest_message_store_timestamp_ms("TopicA", 0) == 100
    assert store.earliest_message_store_timestamp_ms("TopicA", 9) == -1
    assert (store.min_offset("TopicA", 0), store.max_offset("TopicA", 0)) == (0, 5)
    assert (store.min_offset("Nobody", 0), store.max_offset("Nobody", 0)) == (0, 0)
    store.close()


# --- Lifecycle ----------------------------------------------------------------------------------


def test_clean_reopen_keeps_positions_bounds_and_queue_offsets(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    for index in range(30):
        queue_id = index % 3
        store.append_record(
            record("TopicA", queue_id, b"x" * 100, keys=f"k{index}", uniq_key=f"U{index}"),
            "TopicA",
            queue_id,
        )
    store.close()
    statistics = store.statistics()
    assert not abort_path(tmp_path).exists()
    reopened = open_store(tmp_path)
    assert not reopened.found_abort_at_open
    assert abort_path(tmp_path).exists()
    assert reopened.commit_log.write_log_offset_bytes == statistics.write_log_offset_bytes
    assert reopened.dispatcher.dispatched_log_offset_bytes == statistics.write_log_offset_bytes
    assert reopened.dispatcher.statistics().cq_entry_total == 0  # nothing dispatched twice
    assert reopened.dispatcher.statistics().key_total == 0
    for queue_id in range(3):
        assert reopened.max_offset("TopicA", queue_id) == 10
    result = reopened.append_record(record("TopicA", 1, uniq_key="U-new"), "TopicA", 1)
    assert result.queue_index == 10
    assert result.log_offset_bytes == statistics.write_log_offset_bytes
    reopened.dispatch()
    assert reopened.max_offset("TopicA", 1) == 11
    for index in range(30):
        assert len(reopened.query_by_key("TopicA", f"U{index}", 0, 2**62, 10)) == 1
    reopened.close()


def test_an_unclosed_store_is_noticed_at_the_next_open(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    store.append_record(record("TopicA", 0), "TopicA", 0)
    store.flush()
    reopened = open_store(tmp_path)  # the first was never closed
    assert reopened.found_abort_at_open
    assert reopened.max_offset("TopicA", 0) == 1
    reopened.close()


def test_flush_writes_the_checkpoint_timestamps(tmp_path: Path) -> None:
    clock = Clock(5_000)
    store = open_store(tmp_path, clock)
    store.append_record(record("TopicA", 0, uniq_key="U1"), "TopicA", 0)
    clock.now_ms = 6_000
    result = store.append_record(record("TopicA", 0, uniq_key="U2"), "TopicA", 0)
    store.dispatch()
    assert store.flush() == result.end_log_offset_bytes
    stored = read_checkpoint(checkpoint_path(tmp_path))
    assert stored is not None
    assert stored.physic_msg_timestamp_ms == 6_000
    assert stored.logics_msg_timestamp_ms == 6_000
    assert stored.index_msg_timestamp_ms == 6_000
    store.close()


def test_every_store_file_is_0600_and_every_directory_0700(tmp_path: Path) -> None:
    """Issue 9: whatever the umask, only the broker's user may read the store."""
    previous_umask = os.umask(0o022)
    try:
        store = open_store(tmp_path / "store")
        fill(store, "TopicA", 0, 3, uniq_key="U1")
        store.flush()
        store.close()
    finally:
        os.umask(previous_umask)
    created = [
        Path(root) / name for root, dirs, files in os.walk(tmp_path) for name in dirs + files
    ]
    assert {"commitlog", "consumequeue", "index", "checkpoint"} <= {path.name for path in created}
    loose = [f"{path} {stat.S_IMODE(path.stat().st_mode):o}" for path in created]
    assert [entry for entry in loose if int(entry.rsplit(" ", 1)[1], 8) & 0o077] == []


def test_sync_flush_waits_for_a_group_commit(tmp_path: Path) -> None:
    config = StoreConfig(
        geometry=GEOMETRY,
        max_message_size_bytes=1024,
        store_host=HOST,
        flush_disk_type=FlushDiskType.SYNC_FLUSH,
    )
    store = open_store(tmp_path, config=config)
    store.start_background_threads()
    try:
        lock = threading.Lock()
        covered: list[bool] = []

        def send() -> None:
            with lock:
                result = store.append_record(record("TopicA", 0), "TopicA", 0)
            flushed = store.wait_flushed(result.end_log_offset_bytes, timeout_s=30)
            with lock:
                covered.append(flushed)

        threads = [threading.Thread(target=send) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert covered == [True] * 8
        assert store.commit_log.flushed_log_offset_bytes == store.commit_log.write_log_offset_bytes
        assert store.flush_service.statistics().flush_total <= 8
    finally:
        store.close()
    async_store = open_store(tmp_path / "async")
    result = async_store.append_record(record("TopicA", 0), "TopicA", 0)
    assert async_store.wait_flushed(result.end_log_offset_bytes, timeout_s=0)
    async_store.close()


def test_reader_of_another_process_reads_what_is_published(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    fill(store, "TopicA", 0, 3)
    store.flush()
    reader = MessageStoreReader.open(tmp_path, CONFIG)
    assert reader.max_offset("TopicA", 0) == 3  # what was on disk at first use
    results = fill(store, "TopicA", 0, 4)
    assert reader.max_offset("TopicA", 0) == 3  # not published yet
    reader.observe_max_offset("TopicA", 0, store.max_offset("TopicA", 0))
    reader.observe_commit_log_end(store.commit_log.write_log_offset_bytes)
    plan = reader.get_messages("TopicA", 0, 3)
    assert plan.status is GetMessageStatus.FOUND
    assert plan.message_count == 4
    assert reader.read_message(results[-1]) == store.read_message(results[-1])
    reader.close()
    store.close()


@pytest.fixture
def memory_dir(tmp_path: Path) -> Iterator[Path]:
    """A directory on tmpfs when there is one: the 10,000-queue test measures the store's own
    bookkeeping, and 20,000 mkdir/create calls on a journaled disk take far longer than it."""
    shm = Path("/dev/shm")
    if not shm.is_dir():
        yield tmp_path
        return
    directory = Path(tempfile.mkdtemp(prefix=f"mqbox-{unique_name('store')}-", dir=shm))
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def test_ten_thousand_queues_in_one_store(memory_dir: Path) -> None:
    config = StoreConfig(
        geometry=StoreGeometry(
            commit_log_segment_size_bytes=1 << 20,
            cq_segment_entry_count=4,
            index_slot_count=1024,
            index_entry_count_max=4096,
        ),
        max_message_size_bytes=1024,
        store_host=HOST,
        cq_map_count_max=256,
    )
    store = MessageStore.open(memory_dir, config)
    queue_count = 10_000
    template = [record("Wide", queue_id) for queue_id in range(queue_count)]
    for _round in range(2):
        for first in range(0, queue_count, 1000):
            chunk = template[first : first + 1000]
            data = np.frombuffer(b"".join(chunk), dtype=np.uint8)
            sizes = np.array([len(item) for item in chunk], dtype=np.int32)
            slots = np.array(
                [store.queue_slot("Wide", queue_id) for queue_id in range(first, first + 1000)],
                dtype=np.int32,
            )
            out = np.zeros(1000, dtype=np.int64)
            store.append_records(data, sizes, slots, out)
            assert (out == _round).all()
    assert store.dispatch() == 2 * queue_count
    assert store.dispatcher.statistics().queue_count == queue_count
    assert store.consume_queues.statistics().map_open_count <= 256
    for queue_id in (0, 1, 4999, 9999):
        assert store.max_offset("Wide", queue_id) == 2
        plan = store.get_messages("Wide", queue_id, 0)
        assert (plan.status, plan.message_count, len(plan.runs)) == (GetMessageStatus.FOUND, 2, 2)
        assert [decode_record(raw).queue_id for raw in plan_records(store, plan)] == [queue_id] * 2
    store.close()


# --- Configuration and limits -------------------------------------------------------------------


def test_store_config_is_checked_and_built_from_broker_config() -> None:
    with pytest.raises(ConfigError):
        StoreConfig(store_host=b"short")
    with pytest.raises(ConfigError):
        StoreConfig(geometry=GEOMETRY, max_message_size_bytes=4096)  # no room in a segment
    with pytest.raises(ConfigError):
        StoreConfig(delay_levels_ms=())
    broker = BrokerConfig(
        flush_disk_type=FlushDiskType.SYNC_FLUSH,
        message_delay_level="1s 2m",
        max_message_size_bytes=1000,
    )
    config = StoreConfig.from_broker_config(broker, HOST)
    assert config.flush_disk_type is FlushDiskType.SYNC_FLUSH
    assert config.delay_levels_ms == (1000, 120_000)
    assert config.max_message_size_bytes == 1000
    assert config.geometry.commit_log_segment_size_bytes == 1 << 30


def test_a_record_over_max_message_size_is_refused(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    with pytest.raises(MessageTooLargeError):
        store.append_record(record("TopicA", 0, b"x" * 2000), "TopicA", 0)
    assert store.commit_log.write_log_offset_bytes == 0
    store.close()


def test_warm_up_compiles_every_store_kernel() -> None:
    warm_up_kernels()
