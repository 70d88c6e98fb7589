"""Goal: the shared counters hold what their single writers publish: the queue table finds every
queue it was given (ten thousand and more by default), tells apart queues whose 64-bit keys
collide by their stored topic bytes and queue id, refuses queues beyond its capacity without
harm to the others, and another attachment of the segment reads the same counts and positions
(the commit log's minimum, the flushed store times for the checkpoint included).

Method: QueueCounters and StorePositions segments under unique instance names in /dev/shm,
created and attached twice in this process (an attachment maps the segment again, as another
process does); collisions are forced by replacing the key function.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from mqbox.server import queue_counters
from mqbox.server.queue_counters import (
    QUEUE_CAPACITY_DEFAULT,
    QueueCounters,
    StorePositions,
    queue_counters_name,
    queue_key,
    store_positions_name,
)


@pytest.fixture
def counters(shm_instance: str) -> Iterator[QueueCounters]:
    created = QueueCounters.create(queue_counters_name(shm_instance), 64)
    try:
        yield created
    finally:
        created.close()
        created.unlink()


def test_published_counts_are_read_by_another_attachment(counters: QueueCounters) -> None:
    reader = QueueCounters.attach(counters.name)
    try:
        slot = counters.insert(b"TopicA", 3, 5)
        assert reader.find_slot(b"TopicA", 3) == slot
        assert reader.entry_count(b"TopicA", 3) == 5
        assert reader.entry_count(b"TopicA", 2) is None
        assert reader.entry_count(b"TopicB", 3) is None
        counters.publish_counts(np.array([slot]), np.array([9]))
        assert reader.entry_count_at(slot) == 9
        counters.publish_dispatched(1234)
        assert reader.dispatched_log_offset_bytes == 1234
        assert reader.change_sequence == 1
        assert counters.insert(b"TopicA", 3, 0) == slot  # known: the same slot, count kept
        assert reader.entry_count_at(slot) == 9
    finally:
        reader.close()


def test_ten_thousand_queues_fit_the_default_table(shm_instance: str) -> None:
    assert QUEUE_CAPACITY_DEFAULT >= 16_384
    table = QueueCounters.create(queue_counters_name(shm_instance))
    try:
        slots = [table.insert(f"T{n // 8}".encode(), n % 8, n) for n in range(10_000)]
        assert min(slots) >= 0
        assert len(set(slots)) == 10_000
        table.publish_counts(np.array(slots), np.arange(10_000) + 1)
        reader = QueueCounters.attach(table.name)
        try:
            for n in range(0, 10_000, 97):
                assert reader.entry_count(f"T{n // 8}".encode(), n % 8) == n + 1
            assert reader.statistics().queue_count == 10_000
            assert reader.statistics().overflow_count == 0
        finally:
            reader.close()
    finally:
        table.close()
        table.unlink()


def test_colliding_keys_are_told_apart_by_topic_and_queue(
    counters: QueueCounters, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(queue_counters, "queue_key", lambda topic, queue_id: 42)
    first = counters.insert(b"Alpha", 0, 1)
    second = counters.insert(b"Beta", 0, 2)
    third = counters.insert(b"Alpha", 1, 3)
    assert len({first, second, third}) == 3
    assert counters.entry_count(b"Alpha", 0) == 1
    assert counters.entry_count(b"Beta", 0) == 2
    assert counters.entry_count(b"Alpha", 1) == 3
    assert counters.entry_count(b"Gamma", 0) is None


def test_a_full_table_refuses_new_queues_and_keeps_the_old(counters: QueueCounters) -> None:
    slots = [counters.insert(f"Q{n}".encode(), 0, n) for n in range(counters.queue_capacity)]
    assert min(slots) >= 0
    assert counters.insert(b"OneTooMany", 0, 1) == -1
    assert counters.statistics().overflow_count == 1
    assert counters.entry_count(b"OneTooMany", 0) is None
    assert counters.entry_count(b"Q7", 0) == 7


def test_keys_are_stable_and_never_empty() -> None:
    assert queue_key(b"TopicA", 0) == queue_key(b"TopicA", 0)
    assert queue_key(b"TopicA", 0) != queue_key(b"TopicA", 1)
    assert queue_key(b"TopicA", 0) != queue_counters.EMPTY_KEY


def test_store_positions_are_published_by_the_writer(shm_instance: str) -> None:
    positions = StorePositions.create(store_positions_name(shm_instance))
    try:
        reader = StorePositions.attach(positions.name)
        ready_at_first = reader.ready
        assert not ready_at_first
        positions.publish_write(4096, 10)
        positions.publish_flushed(2048, 1_700_000_000_000)
        positions.publish_ready(1024)
        assert reader.ready
        assert reader.write_log_offset_bytes == 4096
        assert reader.appended_record_total == 10
        assert reader.flushed_log_offset_bytes == 2048
        assert reader.flushed_store_timestamp_ms == 1_700_000_000_000
        assert reader.dispatch_start_log_offset_bytes == 1024
        reader.close()
    finally:
        positions.close()
        positions.unlink()


def test_retention_and_checkpoint_words_reach_another_attachment(
    shm_instance: str, counters: QueueCounters
) -> None:
    positions = StorePositions.create(store_positions_name(shm_instance))
    other_positions = StorePositions.attach(positions.name)
    other_counters = QueueCounters.attach(counters.name)
    try:
        positions.publish_min_log_offset(1 << 30, 1)  # the writer, before the unlink
        assert (other_positions.min_log_offset_bytes, other_positions.deleted_segment_total) == (
            1 << 30,
            1,
        )
        counters.publish_logics_flushed(4096, 1_700_000_000_123)
        counters.publish_index_flushed(2048, 1_700_000_000_100)  # the index flushes less often
        counters.publish_logics_flushed(8192, 0)
        counters.publish_logics_flushed(0, 0)  # an older report never moves an offset back
        counters.publish_index_flushed(1024, 0)
        assert other_counters.logics_flushed_timestamp_ms == 1_700_000_000_123
        assert other_counters.index_flushed_timestamp_ms == 1_700_000_000_100
        assert other_counters.logics_flushed_log_offset_bytes == 8192
        assert other_counters.index_flushed_log_offset_bytes == 2048
        counters.publish_derived_min_log_offset(1 << 30)
        assert other_counters.derived_min_log_offset_bytes == 1 << 30
    finally:
        other_counters.close()
        other_positions.close()
        positions.close()
        positions.unlink()


def test_attaching_a_missing_segment_fails_clearly(shm_instance: str) -> None:
    with pytest.raises(FileNotFoundError):
        QueueCounters.attach(queue_counters_name(shm_instance))
