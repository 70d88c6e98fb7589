"""Goal: retention deletes whole old commit-log segments only when RocketMQ's rules say so (at a
deleteWhen hour once older than fileReservedTime, or at once when the disk is fuller than
diskMaxUsedSpaceRatio), never the segment being written nor one holding unflushed bytes; the
consume queues and the index follow, so a PULL below the new minimum answers "offset moved" and
never bytes of a deleted segment; and writes are refused with DiskFullError on a nearly full
disk.

Method: a store with tiny segments (4 KiB commit log, 8-entry consume queues, 11-key index files)
in tmp_path; records get store times one hour apart, so each segment covers a known span of a
fake calendar (UTC). Disk usage is a fake function of the number of commit-log segments, so
deleting a segment "frees space". Each run's report and the files left are compared with what
the rules predict.
"""

from __future__ import annotations

import dataclasses
import datetime
from pathlib import Path

import numpy as np
import pytest
from numpy.typing import NDArray

from mqbox.config import BrokerConfig
from mqbox.errors import ConfigError, DiskFullError, StoreError
from mqbox.message import (
    MessageToStore,
    decode_record,
    encode_properties_str,
    encode_record,
    pack_host,
)
from mqbox.store.cleanup import (
    DiskSpaceGuard,
    RetentionConfig,
    RetentionService,
    check_disk_writable,
    disk_used_ratio,
    parse_delete_when,
    refuse_ratio_percent_for,
)
from mqbox.store.layout import StoreGeometry, consume_queue_dir, index_dir
from mqbox.store.message_store import MessageStore, MessageStoreReader, StoreConfig
from mqbox.store.read_plan import PULL_OFFSET_MOVED, GetMessageStatus
from tests.support.faulty_file import open_store_with_recovery

SEGMENT_SIZE_BYTES = 4096
GEOMETRY = StoreGeometry(
    commit_log_segment_size_bytes=SEGMENT_SIZE_BYTES,
    cq_segment_entry_count=8,
    index_slot_count=64,
    index_entry_count_max=12,
)
CONFIG = StoreConfig(
    geometry=GEOMETRY, max_message_size_bytes=1024, store_host=pack_host("127.0.0.1", 10911)
)
TOPIC = "TopicA"
HOUR_MS = 3_600_000
# 2024-03-01 00:00 UTC: the first record's store time.
EPOCH_MS = int(datetime.datetime(2024, 3, 1, tzinfo=datetime.UTC).timestamp() * 1000)


def at_hour(day: int, hour: int) -> int:
    """Wall-clock ms of `hour` o'clock UTC, `day` days after EPOCH_MS's day."""
    return EPOCH_MS + (24 * day + hour) * HOUR_MS


@dataclasses.dataclass
class Filled:
    """A store filled with one record per hour, and where each record went."""

    store: MessageStore
    log_offsets: list[int]
    queue_ids: list[int]


def fill(root: Path, record_count: int, queue_count: int = 2) -> Filled:
    store, _report = open_store_with_recovery(root, CONFIG)
    log_offsets = []
    queue_ids = []
    for serial in range(record_count):
        queue_id = serial % queue_count
        properties = encode_properties_str({"KEYS": f"K{serial}", "TAGS": "T"})
        record = encode_record(MessageToStore(TOPIC, queue_id, b"x" * 300, properties=properties))
        result = append_at(store, record, queue_id, EPOCH_MS + serial * HOUR_MS)
        log_offsets.append(result)
        queue_ids.append(queue_id)
    store.dispatch()
    store.flush()
    return Filled(store, log_offsets, queue_ids)


def append_at(store: MessageStore, record: bytearray, queue_id: int, store_time_ms: int) -> int:
    """Append one record with a chosen store time; return its log offset."""
    data: NDArray[np.uint8] = np.frombuffer(bytes(record), dtype=np.uint8)
    sizes = np.array([len(record)], dtype=np.int32)
    result = store.append_batch(data, sizes, TOPIC, queue_id, store_timestamp_ms=store_time_ms)
    return result.log_offset_bytes


class FakeDisk:
    """Used ratio = base + per_segment * (commit-log segments on disk)."""

    def __init__(self, root: Path, base: float, per_segment: float):
        self.root = root
        self.base = base
        self.per_segment = per_segment
        self.calls = 0

    def __call__(self, path: Path) -> float:
        self.calls += 1
        segment_count = sum(1 for _ in (self.root / "commitlog").iterdir())
        return self.base + self.per_segment * segment_count


def service(
    filled: Filled,
    root: Path,
    disk: FakeDisk | None = None,
    **config: int | str,
) -> RetentionService:
    return RetentionService(
        root,
        filled.store.commit_log,
        filled.store.consume_queues,
        filled.store.index,
        RetentionConfig(**config),  # type: ignore[arg-type]
        disk_usage=disk or FakeDisk(root, 0.10, 0.0),
        dispatched_log_offset_bytes=lambda: filled.store.dispatcher.dispatched_log_offset_bytes,
        timezone=datetime.UTC,
        on_min_log_offset_moved=lambda _offset: filled.store.reader.refresh_commit_log_bounds(),
    )


def records_per_segment(filled: Filled) -> dict[int, list[int]]:
    per_segment: dict[int, list[int]] = {}
    for serial, log_offset_bytes in enumerate(filled.log_offsets):
        segment_start = log_offset_bytes - log_offset_bytes % SEGMENT_SIZE_BYTES
        per_segment.setdefault(segment_start, []).append(serial)
    return per_segment


# --- Rules --------------------------------------------------------------------------------------


def test_delete_when_and_refuse_ratio_rules() -> None:
    assert parse_delete_when("04") == {4}
    assert parse_delete_when("01;13; 23") == {1, 13, 23}
    for bad in ("", "24", "4;x", "-1"):
        with pytest.raises(ConfigError):
            parse_delete_when(bad)
    assert refuse_ratio_percent_for(75) == 90  # RocketMQ's diskSpaceWarningLevelRatio
    assert refuse_ratio_percent_for(85) == 95
    assert refuse_ratio_percent_for(95) == 97
    config = RetentionConfig.from_broker_config(BrokerConfig())
    assert (config.file_reserved_time_hours, config.delete_when) == (72, "04")
    assert config.disk_max_used_space_ratio_percent == 75
    with pytest.raises(ConfigError):
        RetentionConfig(delete_when="25")


# --- Time-based deletion ------------------------------------------------------------------------


def test_time_based_deletion_happens_at_the_delete_when_hour_only(tmp_path: Path) -> None:
    filled = fill(tmp_path, 120)  # records stored at hours 0..119, about 12 per segment
    per_segment = records_per_segment(filled)
    starts = sorted(per_segment)
    assert len(starts) >= 8
    retention = service(filled, tmp_path)
    # Day 9 (hour 219) at 03:00: every segment is old enough, but 03 is no deleteWhen hour.
    report = retention.run_once(at_hour(9, 3))
    assert report.trigger == "none"
    assert report.commit_log_segment_deleted_count == 0
    # Day 5 at 04:00 (hour 124): kept from hour 52 on. A segment is as old as the first record
    # of the next one, so those whose successor starts before hour 52 go.
    now_ms = at_hour(5, 4)
    report = retention.run_once(now_ms)
    assert report.trigger == "time"
    expected = [
        start
        for position, start in enumerate(starts[:-1])
        if EPOCH_MS + per_segment[starts[position + 1]][0] * HOUR_MS < now_ms - 72 * HOUR_MS
    ]
    assert 0 < len(expected) < len(starts) - 1
    assert report.commit_log_segment_deleted_count == len(expected)
    assert filled.store.commit_log.min_log_offset_bytes == expected[-1] + SEGMENT_SIZE_BYTES
    # At 05:00 nothing goes, though more segments aged meanwhile.
    report = retention.run_once(at_hour(5, 5))
    assert report.commit_log_segment_deleted_count == 0
    # Day 9 at 04:00: every segment but the one being written is old; ten go per run.
    report = retention.run_once(at_hour(9, 4))
    assert report.commit_log_segment_deleted_count == min(10, len(starts) - 1 - len(expected))
    assert filled.store.commit_log.segment_starts_bytes[-1] == starts[-1]  # the last stays
    filled.store.close()


def test_segments_younger_than_the_reserved_time_stay(tmp_path: Path) -> None:
    filled = fill(tmp_path, 60)
    retention = service(filled, tmp_path)
    report = retention.run_once(at_hour(3, 4))  # hour 76: only hours < 4 are older than 72 h
    first_of_second = records_per_segment(filled)[SEGMENT_SIZE_BYTES][0]
    expected_count = 1 if first_of_second * HOUR_MS < 4 * HOUR_MS else 0
    assert report.commit_log_segment_deleted_count == expected_count
    filled.store.close()


# --- Disk-based deletion ------------------------------------------------------------------------


def test_a_full_disk_forces_deletion_at_any_hour_until_below_the_ratio(tmp_path: Path) -> None:
    filled = fill(tmp_path, 100)
    segment_count = len(filled.store.commit_log.segment_starts_bytes)
    assert 6 <= segment_count <= 14
    # 60.5 % plus 3 % per segment: over 75 % while more than 4 segments are left.
    disk = FakeDisk(tmp_path, 0.605, 0.03)
    retention = service(filled, tmp_path, disk)
    report = retention.run_once(at_hour(0, 13))  # not a deleteWhen hour, nothing is 72 h old
    assert report.trigger == "disk"
    assert report.commit_log_segment_deleted_count == segment_count - 4
    assert len(filled.store.commit_log.segment_starts_bytes) == 4
    assert report.disk_used_ratio < 0.75
    report = retention.run_once(at_hour(0, 13) + 10_000)
    assert report.trigger == "none"
    filled.store.close()


def test_never_the_last_segment_nor_unflushed_or_undispatched_ones(tmp_path: Path) -> None:
    filled = fill(tmp_path, 40)
    disk = FakeDisk(tmp_path, 0.99, 0.0)  # always full
    retention = service(filled, tmp_path, disk, delete_segment_count_max=100)
    # Records appended after the flush: their segments hold unflushed bytes.
    store = filled.store
    unflushed_from = store.commit_log.write_log_offset_bytes
    for serial in range(12):
        record = encode_record(MessageToStore(TOPIC, 0, b"y" * 300))
        append_at(store, record, 0, EPOCH_MS + (100 + serial) * HOUR_MS)
    report = retention.run_once(at_hour(30, 4))
    assert report.trigger == "disk"
    flushed_segment = unflushed_from - unflushed_from % SEGMENT_SIZE_BYTES
    assert store.commit_log.min_log_offset_bytes == flushed_segment
    store.flush()  # flushed now, but not dispatched yet: the dispatcher still needs them
    report = retention.run_once(at_hour(30, 5))
    assert report.commit_log_segment_deleted_count == 0
    store.dispatch()
    report = retention.run_once(at_hour(30, 6))
    assert store.commit_log.segment_starts_bytes == (
        store.commit_log.write_log_offset_bytes
        - store.commit_log.write_log_offset_bytes % SEGMENT_SIZE_BYTES,
    )
    store.close()


# --- What follows the commit log ----------------------------------------------------------------


def test_consume_queue_min_moves_and_a_read_below_it_says_offset_moved(tmp_path: Path) -> None:
    filled = fill(tmp_path, 80)
    store = filled.store
    cq_files_before = sorted(consume_queue_dir(tmp_path, TOPIC, 0).iterdir())
    reader = MessageStoreReader.open(tmp_path, CONFIG)  # another process's view, opened early
    assert reader.get_messages(TOPIC, 0, 0).status is GetMessageStatus.FOUND
    retention = service(filled, tmp_path)
    report = retention.run_once(at_hour(10, 4))
    assert report.commit_log_segment_deleted_count > 0
    assert report.cq_segment_deleted_count > 0
    min_log_offset_bytes = store.commit_log.min_log_offset_bytes
    for queue_id in (0, 1):
        serials = [s for s, q in enumerate(filled.queue_ids) if q == queue_id]
        kept = [s for s in serials if filled.log_offsets[s] >= min_log_offset_bytes]
        min_queue_index = serials.index(kept[0])
        assert store.min_offset(TOPIC, queue_id) == min_queue_index
        plan = store.get_messages(TOPIC, queue_id, 0)
        assert plan.status is GetMessageStatus.OFFSET_TOO_SMALL
        assert plan.pull_response_code == PULL_OFFSET_MOVED
        assert plan.next_queue_index == min_queue_index
        plan = store.get_messages(TOPIC, queue_id, min_queue_index, count_max=1)
        assert plan.status is GetMessageStatus.FOUND
        record = store.reader.read_plan_bytes(plan)
        assert decode_record(record).log_offset_bytes == filled.log_offsets[kept[0]]
    assert len(sorted(consume_queue_dir(tmp_path, TOPIC, 0).iterdir())) < len(cq_files_before)
    # Another process's reader never gets bytes of the wrong record: a segment it still maps
    # keeps its old, valid bytes; one it looks up anew is gone ("not found" or an error).
    queue_zero = [s for s, q in enumerate(filled.queue_ids) if q == 0]
    for queue_index in range(0, 40, 3):
        plan = reader.get_messages(TOPIC, 0, queue_index, count_max=1)
        if plan.status is not GetMessageStatus.FOUND:
            continue
        try:
            raw = reader.read_plan_bytes(plan)
        except StoreError:
            continue  # the segment is gone: not found
        expected_offset = filled.log_offsets[queue_zero[queue_index]]
        assert decode_record(raw).log_offset_bytes == expected_offset
    reader.close()
    store.close()


def test_index_files_below_the_minimum_are_deleted(tmp_path: Path) -> None:
    filled = fill(tmp_path, 80)  # 80 keys, 11 per index file
    store = filled.store
    index_files_before = sorted(index_dir(tmp_path).iterdir())
    assert len(index_files_before) >= 7
    retention = service(filled, tmp_path)
    report = retention.run_once(at_hour(10, 4))
    assert report.index_file_deleted_count > 0
    index_files_after = sorted(index_dir(tmp_path).iterdir())
    assert index_files_after == index_files_before[report.index_file_deleted_count :]
    min_log_offset_bytes = store.commit_log.min_log_offset_bytes
    for serial, log_offset_bytes in enumerate(filled.log_offsets):
        found = store.query_by_key(TOPIC, f"K{serial}", 0, 2**62, 4)
        expected = [log_offset_bytes] if log_offset_bytes >= min_log_offset_bytes else []
        assert [message.log_offset_bytes for message in found] == expected
    store.close()


def test_retention_survives_a_restart(tmp_path: Path) -> None:
    filled = fill(tmp_path, 80)
    retention = service(filled, tmp_path)
    retention.run_once(at_hour(10, 4))
    min_log_offset_bytes = filled.store.commit_log.min_log_offset_bytes
    min_offsets = [filled.store.min_offset(TOPIC, queue_id) for queue_id in (0, 1)]
    filled.store.close()
    store, report = open_store_with_recovery(tmp_path, CONFIG)
    assert report.was_clean
    assert store.commit_log.min_log_offset_bytes == min_log_offset_bytes
    assert [store.min_offset(TOPIC, queue_id) for queue_id in (0, 1)] == min_offsets
    store.close()


# --- The write guard ----------------------------------------------------------------------------


def test_writes_are_refused_when_the_disk_is_nearly_full(tmp_path: Path) -> None:
    used = [0.50]
    now_ns = [0]
    guard = DiskSpaceGuard(
        tmp_path,
        refuse_ratio_percent_for(75),
        disk_usage=lambda _path: used[0],
        clock_ns=lambda: now_ns[0],
    )
    guard.check_writable()
    used[0] = 0.95
    guard.check_writable()  # the answer is cached for a second
    now_ns[0] += 1_000_000_000
    with pytest.raises(DiskFullError, match=r"95\.0% full"):
        guard.check_writable()
    assert guard.refused_total == 1
    used[0] = 0.89
    now_ns[0] += 1_000_000_000
    guard.check_writable()
    assert guard.is_writable()


def test_check_disk_writable_uses_the_real_disk_and_an_injected_one(tmp_path: Path) -> None:
    assert 0.0 <= disk_used_ratio(tmp_path) <= 1.0
    check_disk_writable(tmp_path, 100)
    with pytest.raises(DiskFullError):
        check_disk_writable(tmp_path, 90, disk_usage=lambda _path: 0.999)
