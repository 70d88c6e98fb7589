"""Goal: recovery keeps every valid record and serves nothing invalid. A clean reopen is exact
(same write position, queue offsets and keys; nothing dispatched twice); a tail torn at any byte
of the last record is cut back to the record before it; a CRC failure in the unflushed tail cuts
there; damage inside flushed data is refused unless the caller allows the cut; consume-queue
entries and index keys past the cut are dropped and the ones a crash lost are dispatched again,
so queues and index agree with the commit log; blanks carry the scan into the next segment; the
abort file marks unclean stops.

Method: tiny geometry (4 KiB commit-log segments, 8-entry consume-queue segments, a 64-slot
index) in tmp_path, a fake clock that moves 1 s per record, and crashes simulated by dropping the
store without closing it (tests/support/faulty_file.py) and then damaging files as a crash can:
zeros past a byte, garbage, flipped bits, lost consume-queue sectors, stale index slots. After
each recovery `check_store` compares every record, queue entry and key with the records the test
appended. The two recovery kernels (find_unfinished_record, index_slot_heads) are held to
plain-Python twins on hypothesis-built input.
"""

from __future__ import annotations

import dataclasses
import random
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqbox.errors import StoreError
from mqbox.message import (
    BLANK_MAGIC,
    MessageToStore,
    decode_record,
    encode_properties_str,
    encode_record,
    index_key_hash,
    java_string_hash,
    pack_host,
)
from mqbox.store.checkpoint import read_checkpoint
from mqbox.store.layout import (
    INDEX_HEADER_SIZE_BYTES,
    StoreGeometry,
    abort_path,
    checkpoint_path,
    consume_queue_dir,
    index_dir,
    segment_name,
)
from mqbox.store.message_store import MessageStore, StoreConfig
from mqbox.store.recovery import (
    RecoveryReport,
    abort_file_exists,
    create_abort_file,
    find_unfinished_record,
    index_slot_heads,
    recover_scan,
    remove_abort_file,
)
from tests.support.faulty_file import (
    abandon_store,
    commit_log_segment_path,
    garbage,
    mix_chunks,
    open_store_with_recovery,
    read_range,
    snapshot_files,
    tear_commit_log,
    write_range,
    zero_range,
)

HOST = pack_host("127.0.0.1", 10911)
SEGMENT_SIZE_BYTES = 4096
GEOMETRY = StoreGeometry(
    commit_log_segment_size_bytes=SEGMENT_SIZE_BYTES,
    cq_segment_entry_count=8,
    index_slot_count=64,
    index_entry_count_max=400,
)
CONFIG = StoreConfig(geometry=GEOMETRY, max_message_size_bytes=1024, store_host=HOST)
TOPIC = "TopicA"
QUEUE_COUNT = 3


class Clock:
    """A wall clock in ms that moves `step_ms` at every reading (so store times grow)."""

    def __init__(self, now_ms: int = 1_700_000_000_000, step_ms: int = 1000):
        self.now_ms = now_ms
        self.step_ms = step_ms

    def __call__(self) -> int:
        self.now_ms += self.step_ms
        return self.now_ms


@dataclasses.dataclass(frozen=True)
class Appended:
    """One record as the test appended it and the store placed it."""

    queue_id: int
    queue_index: int
    log_offset_bytes: int
    size_bytes: int
    key: str
    tags: str

    @property
    def end_log_offset_bytes(self) -> int:
        return self.log_offset_bytes + self.size_bytes


class Harness:
    """A store in `root` and the records appended to it, in log order."""

    def __init__(self, root: Path):
        self.root = root
        self.clock = Clock()
        self.records: list[Appended] = []
        self.serial = 0
        self.store, self.report = self.open()

    def open(self, **options: object) -> tuple[MessageStore, RecoveryReport]:
        return open_store_with_recovery(self.root, CONFIG, clock_ms=self.clock, **options)

    def append(self, count: int, *, body_size_bytes: int = 60) -> list[Appended]:
        appended = []
        for _ in range(count):
            self.serial += 1
            queue_id = self.serial % QUEUE_COUNT
            key = f"K{self.serial}"
            tags = f"Tag{self.serial % 2}"
            properties = encode_properties_str({"KEYS": key, "TAGS": tags, "UNIQ_KEY": f"U{key}"})
            body = bytes((self.serial + index) % 251 for index in range(body_size_bytes))
            record = encode_record(MessageToStore(TOPIC, queue_id, body, properties=properties))
            result = self.store.append_record(record, TOPIC, queue_id)
            item = Appended(
                queue_id, result.queue_index, result.log_offset_bytes, len(record), key, tags
            )
            self.records.append(item)
            appended.append(item)
        return appended

    def crash(self) -> None:
        abandon_store(self.store)

    def reopen(self, **options: object) -> RecoveryReport:
        self.store, self.report = self.open(**options)
        end_bytes = self.store.commit_log.write_log_offset_bytes
        self.records = [item for item in self.records if item.end_log_offset_bytes <= end_bytes]
        return self.report


@pytest.fixture
def harness(tmp_path: Path) -> Harness:
    return Harness(tmp_path / "store")


def check_store(harness: Harness) -> None:
    """The store holds exactly harness.records: in the commit log, the queues and the index."""
    store = harness.store
    end_bytes = store.commit_log.write_log_offset_bytes
    assert store.dispatcher.dispatched_log_offset_bytes == end_bytes
    expected_end = harness.records[-1].end_log_offset_bytes if harness.records else 0
    assert expected_end <= end_bytes <= expected_end + SEGMENT_SIZE_BYTES
    per_queue: dict[int, list[Appended]] = {}
    for item in harness.records:
        per_queue.setdefault(item.queue_id, []).append(item)
        record = store.read_message(item.log_offset_bytes)
        assert record is not None
        message = decode_record(record)
        assert (message.queue_id, message.queue_index) == (item.queue_id, item.queue_index)
    for queue_id in range(QUEUE_COUNT):
        items = per_queue.get(queue_id, [])
        assert [item.queue_index for item in items] == list(range(len(items)))
        assert store.max_offset(TOPIC, queue_id) == len(items)
        queue = store.consume_queues.find_queue(TOPIC, queue_id)
        if queue is None:
            assert not items
            continue
        entries = queue.read(0, len(items) + 1)
        assert len(entries) == len(items)
        for entry, item in zip(entries, items, strict=True):
            assert int(entry["log_offset_bytes"]) == item.log_offset_bytes
            assert int(entry["size_bytes"]) == item.size_bytes
            assert int(entry["tag_hash"]) == java_string_hash(item.tags)
    for item in harness.records:
        found = store.query_by_key(TOPIC, item.key, 0, 2**62, 4)
        assert [message.log_offset_bytes for message in found] == [item.log_offset_bytes]
        found = store.query_by_key(TOPIC, f"U{item.key}", 0, 2**62, 4)
        assert [message.log_offset_bytes for message in found] == [item.log_offset_bytes]


def check_lost_keys(harness: Harness, lost: list[Appended]) -> None:
    for item in lost:
        assert harness.store.query_by_key(TOPIC, item.key, 0, 2**62, 4) == []


# --- The abort file -----------------------------------------------------------------------------


def test_abort_file_marks_a_running_store(tmp_path: Path) -> None:
    assert not abort_file_exists(tmp_path)
    assert create_abort_file(tmp_path) is False  # a fresh store: the last stop was clean
    assert abort_path(tmp_path).exists()
    assert create_abort_file(tmp_path) is True  # found at the next open: unclean
    remove_abort_file(tmp_path)
    assert not abort_file_exists(tmp_path)
    remove_abort_file(tmp_path)  # idempotent


def test_open_marks_running_and_clean_close_clears(harness: Harness) -> None:
    assert harness.report.was_clean
    assert abort_path(harness.root).exists()
    harness.append(3)
    harness.store.close()
    assert not abort_path(harness.root).exists()
    report = harness.reopen()
    assert report.was_clean
    assert not report.clean_path_failed
    harness.crash()
    report = harness.reopen()
    assert not report.was_clean


# --- Clean stop ---------------------------------------------------------------------------------


def test_clean_reopen_is_exact(harness: Harness) -> None:
    harness.append(120)  # several segments, several index-free queue segments
    harness.store.dispatch()
    write_end = harness.store.commit_log.write_log_offset_bytes
    harness.store.close()
    report = harness.reopen()
    assert report.was_clean
    assert not report.clean_path_failed
    assert report.write_log_offset_bytes == write_end
    assert report.truncated_at_log_offset_bytes is None
    assert report.redispatch_from_log_offset_bytes == write_end
    statistics = harness.store.dispatcher.statistics()
    assert statistics.cq_entry_total == 0  # nothing dispatched twice
    assert statistics.key_total == 0
    check_store(harness)
    more = harness.append(5)
    assert more[0].log_offset_bytes == write_end
    harness.store.dispatch()
    check_store(harness)


def test_a_clean_stop_with_a_damaged_tail_takes_the_unclean_path(harness: Harness) -> None:
    harness.append(10)
    harness.store.close()
    end_bytes = harness.records[-1].end_log_offset_bytes
    path = commit_log_segment_path(harness.root, 0)
    write_range(path, end_bytes + 100, b"\x01stray")  # bytes after the end of a clean log
    report = harness.reopen()
    assert report.was_clean
    assert report.clean_path_failed
    assert report.truncated_at_log_offset_bytes == end_bytes
    assert read_range(path, end_bytes, end_bytes + 200) == bytes(200)
    check_store(harness)


# --- Torn and corrupt tails ---------------------------------------------------------------------


def crash_with_unflushed_tail(harness: Harness, flushed_count: int, tail_count: int) -> None:
    harness.append(flushed_count)
    harness.store.dispatch()
    harness.store.flush()
    harness.append(tail_count)
    harness.store.dispatch()
    harness.crash()


def tear_last_record_at(harness: Harness, tear_bytes: int) -> None:
    """Zero the last record from `tear_bytes` on (what never reached the disk reads as zeros)."""
    last = harness.records[-1]
    tear_commit_log(
        harness.root,
        SEGMENT_SIZE_BYTES,
        last.log_offset_bytes + tear_bytes,
        last.end_log_offset_bytes,
    )


@pytest.mark.parametrize("tear_bytes", [0, 1, 4, 7, 8, 20, 88, 91, 150])
def test_recovery_truncates_torn_tail_record(harness: Harness, tear_bytes: int) -> None:
    crash_with_unflushed_tail(harness, 12, 1)
    last = harness.records[-1]
    assert tear_bytes < last.size_bytes
    kept = read_range(
        commit_log_segment_path(harness.root, 0),
        last.log_offset_bytes,
        last.log_offset_bytes + tear_bytes,
    )
    tear_last_record_at(harness, tear_bytes)
    report = harness.reopen()
    assert not report.was_clean
    assert report.write_log_offset_bytes == last.log_offset_bytes
    # A cut is reported when the torn record left a non-zero byte (TOTALSIZE starts with 0).
    expected_cut = last.log_offset_bytes if any(kept) else None
    assert report.truncated_at_log_offset_bytes == expected_cut
    assert not report.flushed_damage
    check_store(harness)
    check_lost_keys(harness, [last])
    harness.append(3)  # the queue offset of the lost record is handed out again
    harness.store.dispatch()
    check_store(harness)


@settings(max_examples=25)
@given(tear_fraction=st.floats(0, 1, exclude_max=True), garbage_size_bytes=st.integers(0, 300))
def test_any_tear_of_the_last_record_cuts_back_to_the_previous_one(
    tmp_path_factory: pytest.TempPathFactory, tear_fraction: float, garbage_size_bytes: int
) -> None:
    harness = Harness(tmp_path_factory.mktemp("store"))
    crash_with_unflushed_tail(harness, 5, 1)
    last = harness.records[-1]
    tear_last_record_at(harness, int(tear_fraction * last.size_bytes))
    # Junk in space the writer never reached (a block that was not zeroed).
    write_range(
        commit_log_segment_path(harness.root, 0),
        last.end_log_offset_bytes + 50,
        garbage(garbage_size_bytes, garbage_size_bytes),
    )
    report = harness.reopen()
    assert report.write_log_offset_bytes == last.log_offset_bytes
    check_store(harness)
    check_lost_keys(harness, [last])


def test_corrupt_crc_in_the_middle_of_the_unflushed_tail_truncates_there(
    harness: Harness,
) -> None:
    crash_with_unflushed_tail(harness, 10, 8)
    bad = harness.records[14]
    lost = harness.records[14:]
    segment_start_bytes = bad.log_offset_bytes - bad.log_offset_bytes % SEGMENT_SIZE_BYTES
    path = commit_log_segment_path(harness.root, segment_start_bytes)
    body_at = bad.log_offset_bytes - segment_start_bytes + 88 + 5
    flipped = bytes([read_range(path, body_at, body_at + 1)[0] ^ 0x40])
    write_range(path, body_at, flipped)
    report = harness.reopen()
    assert report.truncated_at_log_offset_bytes == bad.log_offset_bytes
    assert report.truncated_reason == "body CRC mismatch"
    assert report.write_log_offset_bytes == bad.log_offset_bytes
    check_store(harness)
    check_lost_keys(harness, lost)


def test_damage_inside_flushed_data_is_refused_unless_allowed(harness: Harness) -> None:
    harness.append(20)
    harness.store.dispatch()
    harness.store.flush()
    harness.crash()
    bad = harness.records[6]
    path = commit_log_segment_path(harness.root, 0)
    write_range(path, bad.log_offset_bytes + 90, b"\xff\xfe")
    with pytest.raises(StoreError, match="inside flushed data"):
        harness.reopen()
    report = harness.reopen(truncate_flushed_damage=True)
    assert report.flushed_damage
    assert report.truncated_at_log_offset_bytes == bad.log_offset_bytes
    check_store(harness)


def test_garbage_after_the_flushed_position_is_cut(harness: Harness) -> None:
    crash_with_unflushed_tail(harness, 6, 6)
    first_lost = harness.records[8]
    # Records 8.. never reached the disk, and junk fills their space.
    tear_commit_log(
        harness.root,
        SEGMENT_SIZE_BYTES,
        first_lost.log_offset_bytes,
        harness.records[-1].end_log_offset_bytes,
        garbage_size_bytes=700,
        seed=7,
    )
    report = harness.reopen()
    assert report.write_log_offset_bytes == first_lost.log_offset_bytes
    check_store(harness)


# --- Blanks and segment ends --------------------------------------------------------------------


def append_past_a_roll(harness: Harness) -> tuple[Appended, Appended]:
    """Append until a record lands in the second segment; (last of the first, first of the
    second)."""
    while not harness.records or harness.records[-1].log_offset_bytes < SEGMENT_SIZE_BYTES:
        harness.append(1, body_size_bytes=150)
    return harness.records[-2], harness.records[-1]


def test_blank_at_segment_end_and_next_segment_torn(harness: Harness) -> None:
    harness.append(3)
    harness.store.dispatch()
    harness.store.flush()
    before, after = append_past_a_roll(harness)
    harness.append(2)
    harness.store.dispatch()
    harness.crash()
    assert after.log_offset_bytes == SEGMENT_SIZE_BYTES
    second = harness.records[-2]
    tear_commit_log(
        harness.root, SEGMENT_SIZE_BYTES, second.log_offset_bytes + 10, second.end_log_offset_bytes
    )
    report = harness.reopen()
    assert report.write_log_offset_bytes == second.log_offset_bytes
    assert report.truncated_at_log_offset_bytes == second.log_offset_bytes
    check_store(harness)
    assert before.end_log_offset_bytes < SEGMENT_SIZE_BYTES


def test_torn_blank_cuts_at_the_blank_and_drops_the_next_segment(harness: Harness) -> None:
    harness.append(3)
    harness.store.dispatch()
    harness.store.flush()
    before, _after = append_past_a_roll(harness)
    harness.store.dispatch()
    harness.crash()
    blank_at = before.end_log_offset_bytes
    zero_range(commit_log_segment_path(harness.root, 0), blank_at, blank_at + 8)
    report = harness.reopen()
    assert report.write_log_offset_bytes == blank_at
    assert not commit_log_segment_path(harness.root, SEGMENT_SIZE_BYTES).exists()
    check_store(harness)
    harness.append(4)  # the writer fills the first segment again and rolls cleanly
    append_past_a_roll(harness)
    harness.store.dispatch()
    check_store(harness)


def test_crash_right_after_a_roll_resumes_at_the_next_segment(harness: Harness) -> None:
    harness.append(3)
    harness.store.dispatch()
    harness.store.flush()
    append_past_a_roll(harness)
    harness.store.dispatch()
    harness.crash()
    first_in_second = harness.records[-1]
    tear_commit_log(
        harness.root,
        SEGMENT_SIZE_BYTES,
        first_in_second.log_offset_bytes,
        first_in_second.end_log_offset_bytes,
    )
    report = harness.reopen()
    assert report.write_log_offset_bytes == SEGMENT_SIZE_BYTES  # after the intact blank
    assert report.truncated_at_log_offset_bytes is None
    check_store(harness)
    harness.append(2)
    harness.store.dispatch()
    check_store(harness)


# --- Consume queues and index -------------------------------------------------------------------


def test_cq_entries_past_the_cut_are_dropped_and_missing_ones_redispatched(
    harness: Harness,
) -> None:
    crash_with_unflushed_tail(harness, 9, 9)
    # The commit log lost its last three records, while the consume queues kept their entries
    # (their pages reached the disk); queue 0 lost its unflushed entries instead.
    cut = harness.records[-3]
    tear_commit_log(
        harness.root,
        SEGMENT_SIZE_BYTES,
        cut.log_offset_bytes,
        harness.records[-1].end_log_offset_bytes,
    )
    queue_zero = [item for item in harness.records[:9] if item.queue_id == 0]
    flushed_entry_count = len(queue_zero)
    directory = consume_queue_dir(harness.root, TOPIC, 0)
    for path in sorted(directory.iterdir()):
        start_entry = int(path.name) // 20
        cut_in_file = max(flushed_entry_count - start_entry, 0) * 20
        zero_range(path, cut_in_file, path.stat().st_size)
    report = harness.reopen()
    assert report.write_log_offset_bytes == cut.log_offset_bytes
    assert report.cq_entry_dropped_count >= 2  # at least the two entries of cut records
    assert report.redispatched_record_count > 0
    check_store(harness)


def test_torn_consume_queue_entries_from_mixed_sectors_are_cut(harness: Harness) -> None:
    crash_with_unflushed_tail(harness, 12, 12)
    rng = random.Random(3)
    for path in sorted((harness.root / "consumequeue").rglob("0*")):
        if not path.is_file():
            continue
        # An old version with the unflushed entries as zeros, mixed 6 bytes at a time with the
        # newest: entries torn in the middle of their log offset, size or tag hash.
        current = path.read_bytes()
        start_entry = int(path.name) // 20
        keep_entries = sum(
            1 for item in harness.records[:12] if str(item.queue_id) == path.parent.name
        )
        keep_bytes = max(keep_entries - start_entry, 0) * 20
        old = current[:keep_bytes] + bytes(len(current) - keep_bytes)
        mix_chunks(path, old, 6, rng)
    report = harness.reopen()
    assert report.write_log_offset_bytes == harness.records[-1].end_log_offset_bytes
    check_store(harness)


def test_index_keys_past_the_cut_are_dropped_and_stale_slots_rebuilt(harness: Harness) -> None:
    crash_with_unflushed_tail(harness, 10, 10)
    # Every slot of the index points at an entry number the header does not count: the slot
    # pages reached the disk after a header page that did not.
    (index_path,) = sorted(index_dir(harness.root).iterdir())
    slots = np.frombuffer(
        read_range(index_path, INDEX_HEADER_SIZE_BYTES, INDEX_HEADER_SIZE_BYTES + 64 * 4), ">i4"
    ).copy()
    slots[slots > 0] += 1000
    write_range(index_path, INDEX_HEADER_SIZE_BYTES, slots.tobytes())
    lost = harness.records[-4:]
    tear_commit_log(
        harness.root,
        SEGMENT_SIZE_BYTES,
        lost[0].log_offset_bytes,
        lost[-1].end_log_offset_bytes,
    )
    report = harness.reopen()
    assert report.index_entry_dropped_count > 0
    check_store(harness)
    check_lost_keys(harness, lost)


def append_keyed(store: MessageStore, serials: range) -> list[int]:
    """Append one small record per serial with KEYS K<serial> and UNIQ_KEY UK<serial>, to the
    queues in turn; their log offsets."""
    offsets = []
    for serial in serials:
        properties = encode_properties_str({"KEYS": f"K{serial}", "UNIQ_KEY": f"UK{serial}"})
        queue_id = serial % QUEUE_COUNT
        record = encode_record(MessageToStore(TOPIC, queue_id, b"b", properties=properties))
        offsets.append(store.append_record(record, TOPIC, queue_id).log_offset_bytes)
    return offsets


def test_index_rolls_are_cut_across_files(tmp_path: Path) -> None:
    geometry = dataclasses.replace(GEOMETRY, index_entry_count_max=12)  # 11 keys per file
    config = dataclasses.replace(CONFIG, geometry=geometry)
    clock = Clock()
    store, _report = open_store_with_recovery(tmp_path, config, clock_ms=clock)
    offsets = append_keyed(store, range(6))
    store.dispatch()
    store.flush()
    offsets += append_keyed(store, range(6, 30))
    store.dispatch()
    abandon_store(store)
    assert len(list(index_dir(tmp_path).iterdir())) == 6  # 60 keys, 11 per file
    tear_commit_log(tmp_path, SEGMENT_SIZE_BYTES, offsets[20], offsets[-1] + 200)
    store, report = open_store_with_recovery(tmp_path, config, clock_ms=clock)
    assert report.write_log_offset_bytes == offsets[20]
    assert report.index_file_deleted_count >= 1
    for serial in range(30):
        found = store.query_by_key(TOPIC, f"K{serial}", 0, 2**62, 4)
        assert [message.log_offset_bytes for message in found] == (
            [offsets[serial]] if serial < 20 else []
        )
    store.close()


@pytest.mark.parametrize("entry_count_max", [400, 12])
def test_keys_past_the_last_index_flush_are_put_again_once_after_a_power_loss(
    tmp_path: Path, entry_count_max: int
) -> None:
    """The broker flushes the index far less often than the consume queues (roles/dispatcher.py),
    so the checkpoint's index position lags theirs. A power loss then leaves the newest index
    file as its last flush wrote it (zeros if it was created since; files a roll filled were
    flushed whole then): recovery cuts the index at its position and puts the keys of every
    record after it again, each key once. With 12 entries a file rolls four times meanwhile."""
    geometry = dataclasses.replace(GEOMETRY, index_entry_count_max=entry_count_max)
    config = dataclasses.replace(CONFIG, geometry=geometry)
    clock = Clock()
    store, _report = open_store_with_recovery(tmp_path, config, clock_ms=clock)
    offsets = append_keyed(store, range(6))
    store.dispatch()
    store.flush()  # the commit log, the consume queues and the index
    index_flushed = snapshot_files(index_dir(tmp_path))
    offsets += append_keyed(store, range(6, 30))
    store.dispatch()
    store.flush_commit_log()  # the broker's turns between two index flushes
    store.flush_consume_queues()
    end_bytes = store.commit_log.write_log_offset_bytes
    state = read_checkpoint(checkpoint_path(tmp_path))
    assert state is not None
    assert state.index_log_offset_bytes == offsets[6]
    assert state.logics_log_offset_bytes == end_bytes
    abandon_store(store)
    newest = sorted(index_dir(tmp_path).iterdir())[-1]
    flushed = index_flushed.get(newest, b"")
    write_range(newest, 0, flushed + bytes(newest.stat().st_size - len(flushed)))

    store, report = open_store_with_recovery(tmp_path, config, clock_ms=clock)
    try:
        assert not report.was_clean
        assert report.write_log_offset_bytes == end_bytes
        assert report.redispatch_from_log_offset_bytes == offsets[6]
        # 60 keys, 11 a file: the flush saw 12 (the second file's first); four files followed.
        assert report.index_file_deleted_count == (0 if entry_count_max == 400 else 4)
        for serial in range(30):
            for key in (f"K{serial}", f"UK{serial}"):
                # The raw candidates: a key put twice would show its offset twice.
                candidates = store.index.query(index_key_hash(TOPIC, key), 0, 2**62, 8)
                assert candidates == [offsets[serial]], key
                found = store.query_by_key(TOPIC, key, 0, 2**62, 4)
                assert [message.log_offset_bytes for message in found] == [offsets[serial]]
    finally:
        store.close()


# --- Checkpoint, queue offsets, idempotence -----------------------------------------------------


def test_a_lost_checkpoint_rebuilds_everything_from_the_log(harness: Harness) -> None:
    crash_with_unflushed_tail(harness, 15, 3)
    checkpoint_path(harness.root).unlink()
    (harness.root / "checkpoint.tmp").write_bytes(garbage(100, 1))  # a rename that never ran
    report = harness.reopen()
    assert report.scan_start_log_offset_bytes == 0
    assert report.redispatch_from_log_offset_bytes == 0
    check_store(harness)


def test_a_queue_offset_gap_is_refused_not_renumbered(harness: Harness) -> None:
    harness.append(12)
    harness.store.dispatch()
    harness.store.flush()
    harness.append(3)
    harness.store.dispatch()
    harness.crash()
    # Queue 1 loses entries the checkpoint says were durable: the file system broke its word.
    for path in consume_queue_dir(harness.root, TOPIC, 1).iterdir():
        zero_range(path, 0, path.stat().st_size)
    with pytest.raises(StoreError, match="QUEUEOFFSET"):
        harness.reopen()


def test_recovering_twice_changes_nothing_more(harness: Harness) -> None:
    crash_with_unflushed_tail(harness, 10, 5)
    tear_last_record_at(harness, 30)
    first = harness.reopen()
    harness.crash()  # crash again before any flush
    second = harness.reopen()
    assert second.write_log_offset_bytes == first.write_log_offset_bytes
    assert second.truncated_at_log_offset_bytes is None
    check_store(harness)


def test_an_empty_store_recovers_to_nothing(tmp_path: Path) -> None:
    store, report = open_store_with_recovery(tmp_path, CONFIG)
    assert report.write_log_offset_bytes == 0
    store.close()
    create_abort_file(tmp_path)
    store, report = open_store_with_recovery(tmp_path, CONFIG)
    assert not report.was_clean
    assert report.write_log_offset_bytes == 0
    store.close()


def test_recover_scan_joins_segments_scanned_in_parallel(harness: Harness) -> None:
    harness.append(80)
    harness.store.dispatch()
    for thread_count in (1, 2, 4):
        outcome = recover_scan(harness.store.commit_log, 0, thread_count=thread_count)
        assert outcome.record_count == 80
        assert outcome.end_log_offset_bytes == harness.records[-1].end_log_offset_bytes
        assert not outcome.damaged
    path = commit_log_segment_path(harness.root, SEGMENT_SIZE_BYTES)
    assert path.name == segment_name(SEGMENT_SIZE_BYTES)
    harness.store.close()


# --- Kernels against their plain-Python twins ---------------------------------------------------


def find_unfinished_record_ref(
    segment: bytes,
    start_bytes: int,
    check_from_bytes: int,
    end_bytes: int,
    check_properties_end: bool,
) -> tuple[int, int, int]:
    """find_unfinished_record restated with decode_record: the first record at or after
    check_from whose store time is not positive, whose topic holds a zero byte, or (when
    asked) whose properties are not empty and do not end with 0x02."""
    position_bytes = start_bytes
    good_count = 0
    last_ms = -1
    while position_bytes + 91 <= end_bytes:
        size_bytes, magic = struct.unpack_from(">iI", segment, position_bytes)
        if magic == BLANK_MAGIC:
            break
        message = decode_record(
            segment[position_bytes : position_bytes + size_bytes], check_crc=False
        )
        unfinished = (
            message.store_timestamp_ms <= 0
            or b"\0" in message.topic.encode("utf-8", "surrogateescape")
            or (
                check_properties_end
                and message.properties != b""
                and not message.properties.endswith(b"\x02")
            )
        )
        if position_bytes >= check_from_bytes and unfinished:
            return position_bytes, good_count, last_ms
        good_count += 1
        last_ms = message.store_timestamp_ms
        position_bytes += size_bytes
    return end_bytes, good_count, last_ms


record_specs = st.lists(
    st.tuples(
        st.binary(max_size=40),
        st.sampled_from(["T", "Topic", "T\0p"]),
        # NUL inside a value is a client's choice and must not count; a missing final 0x02 or a
        # zero last byte is what a lost last page leaves.
        st.sampled_from([b"", b"a\x01b\x02", b"a\x01\x00\x02", b"a\x01b", b"a\x01\x00", b"\x00"]),
        st.sampled_from([0, -5, 1, 1_700_000_000_000]),
    ),
    min_size=1,
    max_size=8,
)


def encode_raw_record(
    topic: str, body: bytes, properties: bytes, log_offset_bytes: int, store_timestamp_ms: int
) -> bytearray:
    """A record with any properties bytes, even ones encode_record refuses (as damage makes)."""
    placeholder = properties[:-1] + b"\x02" if properties else b""
    record = encode_record(
        MessageToStore(topic, 0, body, properties=placeholder),
        log_offset_bytes=log_offset_bytes,
        store_timestamp_ms=max(store_timestamp_ms, 0),
    )
    if properties:
        record[-1] = properties[-1]
    if store_timestamp_ms < 0:  # a negative time can only come from damage
        struct.pack_into(">q", record, 56, store_timestamp_ms)
    return record


@settings(max_examples=80)
@given(
    specs=record_specs,
    check_from_position=st.integers(0, 8),
    with_blank=st.booleans(),
    check_properties_end=st.booleans(),
)
def test_find_unfinished_record_agrees_with_its_twin(
    specs: list[tuple[bytes, str, bytes, int]],
    check_from_position: int,
    with_blank: bool,
    check_properties_end: bool,
) -> None:
    data = bytearray()
    starts = []
    for body, topic, properties, store_timestamp_ms in specs:
        starts.append(len(data))
        data += encode_raw_record(topic, body, properties, len(data), store_timestamp_ms)
    end_bytes = len(data)
    if with_blank:
        data += struct.pack(">iI", 16, BLANK_MAGIC) + bytes(8)
        end_bytes = len(data)
    check_from_bytes = starts[min(check_from_position, len(starts) - 1)]
    segment = np.frombuffer(bytes(data), dtype=np.uint8)
    expected = find_unfinished_record_ref(
        bytes(data), 0, check_from_bytes, end_bytes, check_properties_end
    )
    found = find_unfinished_record(segment, 0, check_from_bytes, end_bytes, check_properties_end)
    assert found == expected


@settings(max_examples=40)
@given(key_hashes=st.lists(st.integers(0, 2**31 - 1), max_size=60), slot_count=st.integers(1, 9))
def test_index_slot_heads_agrees_with_its_twin(key_hashes: list[int], slot_count: int) -> None:
    entries = np.zeros((len(key_hashes) + 1) * 20, dtype=np.uint8)
    for number, key_hash in enumerate(key_hashes, start=1):
        entries[number * 20 : number * 20 + 4] = np.frombuffer(
            struct.pack(">i", key_hash), np.uint8
        )
    expected = [0] * slot_count
    for number, key_hash in enumerate(key_hashes, start=1):
        expected[key_hash % slot_count] = number
    heads = np.empty(slot_count, dtype=np.int64)
    used_count = index_slot_heads(entries, slot_count, len(key_hashes) + 1, heads)
    assert heads.tolist() == expected
    assert used_count == sum(1 for head in expected if head)
