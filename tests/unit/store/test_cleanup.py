"""Goal: retention deletes whole old commit-log segments only when RocketMQ's rules say so (at a
deleteWhen hour once older than fileReservedTime; at any hour once older when the disk is fuller
than diskMaxUsedSpaceRatio; whatever their age above the force ratio, with
cleanFileForciblyEnable), never the segment being written nor one holding unflushed bytes; the
consume queues and the index follow, so a PULL below the new minimum answers "offset moved" and
never bytes of a deleted segment, also through another process's read-only reader, which notices
the deletion itself; and writes are refused with DiskFullError on a nearly full disk.

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
    CommitLogRetention,
    DiskSpaceGuard,
    RetentionConfig,
    RetentionService,
    check_disk_writable,
    disk_used_ratio,
    parse_delete_when,
    refuse_ratio_percent_for,
)
from mqbox.store.layout import StoreGeometry, consume_queue_dir, index_dir, segment_name
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
    **config: int | str | bool,
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


def test_a_nearly_full_disk_deletes_young_segments_down_to_the_force_ratio(
    tmp_path: Path,
) -> None:
    filled = fill(tmp_path, 100)
    starts = filled.store.commit_log.segment_starts_bytes
    assert 9 <= len(starts) <= 14
    # 60.5 % plus 3 % per segment: over the force ratio (85 %) while more than 8 segments are
    # left, over diskMaxUsedSpaceRatio (75 %) while more than 4 are.
    disk = FakeDisk(tmp_path, 0.605, 0.03)
    retention = service(filled, tmp_path, disk)
    assert retention.config.force_ratio_percent == 85
    report = retention.run_once(at_hour(0, 13))  # not a deleteWhen hour, nothing is 72 h old
    assert report.trigger == "disk"
    assert report.commit_log_segment_deleted_count == len(starts) - 8
    assert filled.store.commit_log.segment_starts_bytes == starts[-8:]
    assert 0.75 < report.disk_used_ratio < 0.85
    filled.store.close()


def test_a_disk_over_the_ratio_deletes_expired_segments_at_any_hour(tmp_path: Path) -> None:
    filled = fill(tmp_path, 100)
    per_segment = records_per_segment(filled)
    starts = sorted(per_segment)
    # 80 % whatever is left: over diskMaxUsedSpaceRatio, under the force ratio.
    retention = service(filled, tmp_path, FakeDisk(tmp_path, 0.80, 0.0))
    now_ms = at_hour(5, 13)  # hour 133: not a deleteWhen hour; kept from hour 61 on
    report = retention.run_once(now_ms)
    assert report.trigger == "disk"
    expected = [
        start
        for position, start in enumerate(starts[:-1])
        if EPOCH_MS + per_segment[starts[position + 1]][0] * HOUR_MS < now_ms - 72 * HOUR_MS
    ]
    assert 0 < len(expected) < len(starts) - 1
    assert report.commit_log_segment_deleted_count == len(expected)
    assert filled.store.commit_log.min_log_offset_bytes == expected[-1] + SEGMENT_SIZE_BYTES
    filled.store.close()


def test_without_clean_file_forcibly_a_full_disk_keeps_young_segments(tmp_path: Path) -> None:
    filled = fill(tmp_path, 60)
    segment_count = len(filled.store.commit_log.segment_starts_bytes)
    retention = service(
        filled, tmp_path, FakeDisk(tmp_path, 0.99, 0.0), clean_file_forcibly_enable=False
    )
    report = retention.run_once(at_hour(0, 13))
    assert report.trigger == "disk"
    assert report.commit_log_segment_deleted_count == 0
    assert len(filled.store.commit_log.segment_starts_bytes) == segment_count
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


def test_the_new_minimum_is_announced_while_the_segment_is_still_on_disk(tmp_path: Path) -> None:
    filled = fill(tmp_path, 40)
    starts = filled.store.commit_log.segment_starts_bytes
    announced: list[tuple[int, bool]] = []

    def announce(min_log_offset_bytes: int) -> None:
        oldest = filled.store.commit_log.directory / segment_name(
            min_log_offset_bytes - SEGMENT_SIZE_BYTES
        )
        announced.append((min_log_offset_bytes, oldest.exists()))

    retention = CommitLogRetention(
        tmp_path,
        filled.store.commit_log,
        RetentionConfig(),
        dispatched_log_offset_bytes=lambda: filled.store.dispatcher.dispatched_log_offset_bytes,
        disk_usage=FakeDisk(tmp_path, 0.10, 0.0),
        timezone=datetime.UTC,
        on_min_log_offset_moving=announce,
    )
    trigger, _used, deleted_count = retention.delete_segments(at_hour(9, 4))
    assert (trigger, deleted_count) == ("time", len(starts) - 1)
    assert announced == [(start + SEGMENT_SIZE_BYTES, True) for start in starts[:-1]]
    filled.store.close()


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


def expected_min_offsets(filled: Filled) -> dict[int, tuple[int, int]]:
    """Per queue: (its first queue index still in the log, that record's log offset)."""
    min_log_offset_bytes = filled.store.commit_log.min_log_offset_bytes
    found: dict[int, tuple[int, int]] = {}
    for queue_id in (0, 1):
        serials = [s for s, q in enumerate(filled.queue_ids) if q == queue_id]
        kept = [s for s in serials if filled.log_offsets[s] >= min_log_offset_bytes]
        found[queue_id] = (serials.index(kept[0]), filled.log_offsets[kept[0]])
    return found


def test_a_read_only_reader_notices_retention_by_itself(tmp_path: Path) -> None:
    filled = fill(tmp_path, 80)
    now_ns = [0]
    reader = MessageStoreReader.open(tmp_path, CONFIG, clock_ns=lambda: now_ns[0])
    assert [reader.min_offset(TOPIC, queue_id) for queue_id in (0, 1)] == [0, 0]
    assert reader.get_messages(TOPIC, 0, 0).status is GetMessageStatus.FOUND
    report = service(filled, tmp_path).run_once(at_hour(10, 4))
    assert report.commit_log_segment_deleted_count > 0
    expected = expected_min_offsets(filled)
    # Until its next look (every 100 ms) it answers from what it knew; then it follows.
    assert reader.min_offset(TOPIC, 0) == 0
    now_ns[0] += 100_000_000
    for queue_id, (min_queue_index, log_offset_bytes) in expected.items():
        assert reader.min_offset(TOPIC, queue_id) == min_queue_index
        plan = reader.get_messages(TOPIC, queue_id, 0)
        assert plan.status is GetMessageStatus.OFFSET_TOO_SMALL
        assert plan.pull_response_code == PULL_OFFSET_MOVED
        assert plan.next_queue_index == min_queue_index
        plan = reader.get_messages(TOPIC, queue_id, min_queue_index, count_max=1)
        assert plan.status is GetMessageStatus.FOUND
        assert decode_record(reader.read_plan_bytes(plan)).log_offset_bytes == log_offset_bytes
    assert reader.min_log_offset_bytes == filled.store.commit_log.min_log_offset_bytes
    reader.close()
    filled.store.close()


def test_a_reader_that_meets_a_deleted_consume_queue_segment_looks_at_once(
    tmp_path: Path,
) -> None:
    filled = fill(tmp_path, 80)
    # A clock that never moves: these readers look at the log only when something says so.
    frozen = MessageStoreReader.open(tmp_path, CONFIG, clock_ns=lambda: 0)
    assert frozen.get_messages(TOPIC, 0, 0).status is GetMessageStatus.FOUND
    told = MessageStoreReader.open(tmp_path, CONFIG, clock_ns=lambda: 0)
    assert told.min_offset(TOPIC, 1) == 0
    service(filled, tmp_path).run_once(at_hour(10, 4))
    expected = expected_min_offsets(filled)
    # Index 25 lies in the fourth consume-queue segment (8 entries each), which the reader's
    # first look (a binary search over entries 0-39) never mapped and which retention deleted:
    # looking it up finds it gone, so the reader looks at the log at once.
    min_queue_index = expected[0][0]
    assert min_queue_index >= 32
    plan = frozen.get_messages(TOPIC, 0, 25)
    assert plan.status is GetMessageStatus.OFFSET_TOO_SMALL
    assert plan.next_queue_index == min_queue_index
    assert frozen.get_messages(TOPIC, 0, min_queue_index).status is GetMessageStatus.FOUND
    # A queue read for the first time looks too (its files may show the deletion).
    assert frozen.min_offset(TOPIC, 1) == expected[1][0]
    # A process that reads the minimum the store writer publishes tells its reader.
    assert told.min_offset(TOPIC, 1) == 0
    told.observe_commit_log_min(filled.store.commit_log.min_log_offset_bytes)
    assert told.min_offset(TOPIC, 1) == expected[1][0]
    for reader in (frozen, told):
        reader.close()
    filled.store.close()


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
