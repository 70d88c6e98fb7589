"""Goal: whatever a crash leaves on disk, recovery keeps everything a flush covered, and what
survives is a prefix of what was appended: the same records, byte for byte, with their queue
offsets; the consume queues and the index then agree with the commit log, record for record.

Method: a hypothesis RuleBasedStateMachine drives a store with a tiny geometry (2 KiB commit-log
segments, 4-entry consume-queue segments, 19-key index files) against a plain model: the list of
records appended (as read back from the log) and how many of them the last commit-log flush
covered. Rules append batches, dispatch, flush everything, flush only the commit log (a crash
between the log's flush and the checkpoint), flush everything but the index (the broker's turns
between two index flushes: the checkpoint's index position lags), close cleanly, and crash. A
crash drops the store without closing it and then damages every file type as a power loss may:
the commit log past the flushed position is torn at a chosen byte (zeros after it), optionally
with junk where no record was finished and with trailing segments whose directory entries were
lost; each consume-queue file and the newest index file become a chunk-by-chunk mix of their
last flushed and their newest content (chunk sizes from 4 bytes to a page, so entries tear inside
their fields); the checkpoint may be lost or have a half-written temp file beside it. The wall
clock may step back (NTP at boot, a VM snapshot restored) and properties may hold NUL bytes, as
Java strings may: neither may decide what recovery cuts. After recovery `check_store` compares
the whole store with the model. Marked `crash`; `TestStoreMachineMany` runs many more examples
behind the `slow` marker.
"""

from __future__ import annotations

import dataclasses
import os
import random
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule

from mqbox.message import (
    MessageToStore,
    encode_properties_str,
    encode_record,
    is_blank,
    java_string_hash,
    pack_host,
)
from mqbox.store.layout import StoreGeometry, checkpoint_path, index_dir, parse_segment_name
from mqbox.store.message_store import MessageStore, StoreConfig
from mqbox.store.recovery import RecoveryReport
from tests.support.faulty_file import (
    abandon_store,
    commit_log_segment_path,
    garbage,
    mix_chunks,
    open_store_with_recovery,
    snapshot_files,
    tear_commit_log,
    write_range,
)

pytestmark = pytest.mark.crash

SEGMENT_SIZE_BYTES = 2048
GEOMETRY = StoreGeometry(
    commit_log_segment_size_bytes=SEGMENT_SIZE_BYTES,
    cq_segment_entry_count=4,
    index_slot_count=16,
    index_entry_count_max=20,
)
CONFIG = StoreConfig(
    geometry=GEOMETRY, max_message_size_bytes=512, store_host=pack_host("127.0.0.1", 10911)
)
QUEUES = (("T", 0), ("T", 1), ("U", 0), ("U", 3))
CHUNK_SIZES_BYTES = (4, 6, 20, 64, 512, 4096)


class Clock:
    """Store time: 400 ms more at every reading, so checkpoint margins cover a few records;
    `step_ms` moves it like an NTP correction would."""

    def __init__(self) -> None:
        self.now_ms = 1_700_000_000_000

    def __call__(self) -> int:
        self.now_ms += 400
        return self.now_ms

    def step(self, step_ms: int) -> None:
        self.now_ms += step_ms


@dataclasses.dataclass(frozen=True)
class Stored:
    """One record as the model knows it."""

    topic: str
    queue_id: int
    queue_index: int
    log_offset_bytes: int
    data: bytes  # the stored bytes, read back after the append
    serial: int
    tags: str | None

    @property
    def end_log_offset_bytes(self) -> int:
        return self.log_offset_bytes + len(self.data)


def check_store(store: MessageStore, records: list[Stored], lost: list[Stored]) -> None:
    """The commit log holds exactly `records`, back to back (blanks between segments), and the
    consume queues and the index point at exactly them; nothing of `lost` is found."""
    end_bytes = store.commit_log.write_log_offset_bytes
    assert store.dispatcher.dispatched_log_offset_bytes == end_bytes
    position_bytes = store.commit_log.min_log_offset_bytes
    for item in records:
        if position_bytes != item.log_offset_bytes:
            # Only a blank may lie between two records: the rest of a segment.
            segment_start_bytes = position_bytes - position_bytes % SEGMENT_SIZE_BYTES
            buffer = store.commit_log.segment_view(segment_start_bytes)
            assert buffer is not None
            assert is_blank(buffer.data, position_bytes - segment_start_bytes)
            assert item.log_offset_bytes == segment_start_bytes + SEGMENT_SIZE_BYTES
        assert store.read_message(item.log_offset_bytes) == item.data
        position_bytes = item.end_log_offset_bytes
    assert position_bytes <= end_bytes
    assert end_bytes - position_bytes < SEGMENT_SIZE_BYTES
    assert store.read_message(position_bytes) is None
    for topic, queue_id in QUEUES:
        items = [item for item in records if (item.topic, item.queue_id) == (topic, queue_id)]
        assert [item.queue_index for item in items] == list(range(len(items)))
        assert store.max_offset(topic, queue_id) == len(items)
        queue = store.consume_queues.find_queue(topic, queue_id)
        if queue is None:
            assert not items
            continue
        entries = queue.read(0, len(items) + 1)
        assert len(entries) == len(items)
        assert [int(value) for value in entries["log_offset_bytes"]] == [
            item.log_offset_bytes for item in items
        ]
        assert [int(value) for value in entries["size_bytes"]] == [len(item.data) for item in items]
        expected_tags = [0 if item.tags is None else java_string_hash(item.tags) for item in items]
        assert [int(value) for value in entries["tag_hash"]] == expected_tags
    for item in records:
        found = store.query_by_key(item.topic, f"u{item.serial}", 0, 2**62, 4)
        assert [message.log_offset_bytes for message in found] == [item.log_offset_bytes]
    for item in lost:
        assert store.query_by_key(item.topic, f"u{item.serial}", 0, 2**62, 4) == []


class StoreMachine(RuleBasedStateMachine):
    """The store and its model; one temporary directory per example."""

    def __init__(self) -> None:
        super().__init__()
        self.directory = Path(tempfile.mkdtemp(prefix="mqbox-crash-"))
        self.root = self.directory / "store"
        self.clock = Clock()
        self.store, _report = open_store_with_recovery(self.root, CONFIG, clock_ms=self.clock)
        self.records: list[Stored] = []
        self.serial = 0
        self.flushed_count = 0
        self.cq_flushed: dict[Path, bytes] = {}
        self.index_flushed: dict[Path, bytes] = {}
        self.crash_count = 0

    def teardown(self) -> None:
        try:
            self.store.close()
        finally:
            shutil.rmtree(self.directory, ignore_errors=True)

    # -- the model ---------------------------------------------------------------------------

    def next_queue_index(self, topic: str, queue_id: int) -> int:
        return sum(1 for item in self.records if (item.topic, item.queue_id) == (topic, queue_id))

    def note_flushed(self) -> None:
        flushed_bytes = self.store.commit_log.flushed_log_offset_bytes
        self.flushed_count = sum(
            1 for item in self.records if item.end_log_offset_bytes <= flushed_bytes
        )

    def take_snapshots(self) -> None:
        self.cq_flushed = snapshot_files(self.root / "consumequeue")
        self.index_flushed = snapshot_files(index_dir(self.root))

    def adopt_recovery(self, report: RecoveryReport) -> None:
        end_bytes = report.write_log_offset_bytes
        survivors = [item for item in self.records if item.end_log_offset_bytes <= end_bytes]
        assert survivors == self.records[: len(survivors)]
        assert len(survivors) >= self.flushed_count, "a flushed record was lost"
        event(f"records lost: {min(len(self.records) - len(survivors), 3)}+")
        lost = self.records[len(survivors) :]
        check_store(self.store, survivors, lost)
        self.records = survivors

    # -- rules -------------------------------------------------------------------------------

    @initialize()
    def start(self) -> None:
        self.take_snapshots()

    @rule(
        queue=st.sampled_from(QUEUES),
        bodies=st.lists(
            st.tuples(
                st.binary(max_size=120),
                st.sampled_from([None, "TagA", "TagB"]),
                st.sampled_from([None, "\0", "a\0", "\0\0\0"]),
            ),
            min_size=1,
            max_size=4,
        ),
    )
    def append(
        self, queue: tuple[str, int], bodies: list[tuple[bytes, str | None, str | None]]
    ) -> None:
        topic, queue_id = queue
        encoded = []
        serials = []
        for body, tags, nul_value in bodies:
            self.serial += 1
            properties = {"KEYS": f"k{self.serial}", "UNIQ_KEY": f"u{self.serial}"}
            if tags is not None:
                properties["TAGS"] = tags
            if nul_value is not None:  # Java strings may hold NUL; it must not look torn
                properties["zz"] = nul_value
            message = MessageToStore(
                topic, queue_id, body, properties=encode_properties_str(properties)
            )
            encoded.append(bytes(encode_record(message)))
            serials.append((self.serial, tags))
        sizes = np.array([len(record) for record in encoded], dtype=np.int32)
        data = np.frombuffer(b"".join(encoded), dtype=np.uint8)
        result = self.store.append_batch(data, sizes, topic, queue_id)
        assert result.queue_index == self.next_queue_index(topic, queue_id)
        log_offset_bytes = result.log_offset_bytes
        end_bytes = self.store.commit_log.write_log_offset_bytes
        for position, (serial, tags) in enumerate(serials):
            stored = self.store.commit_log.read_record(log_offset_bytes, end_bytes)
            assert stored is not None
            self.records.append(
                Stored(
                    topic,
                    queue_id,
                    result.queue_index + position,
                    log_offset_bytes,
                    stored,
                    serial,
                    tags,
                )
            )
            log_offset_bytes += len(stored)

    @rule()
    def dispatch(self) -> None:
        self.store.dispatch()

    @rule(step_ms=st.sampled_from([-60_000, -3_500, 5_000]))
    def step_clock(self, step_ms: int) -> None:
        self.clock.step(step_ms)

    @rule(dispatch_first=st.booleans())
    def flush(self, dispatch_first: bool) -> None:
        if dispatch_first:
            self.store.dispatch()
        self.store.flush()
        self.note_flushed()
        self.take_snapshots()

    @rule()
    def flush_commit_log_only(self) -> None:
        self.store.flush_commit_log()
        self.note_flushed()

    @rule(dispatch_first=st.booleans())
    def flush_all_but_the_index(self, dispatch_first: bool) -> None:
        if dispatch_first:
            self.store.dispatch()
        self.store.flush_commit_log()
        self.store.flush_consume_queues()  # writes the checkpoint; its index position stays
        self.note_flushed()
        self.cq_flushed = snapshot_files(self.root / "consumequeue")

    @rule()
    def close_and_reopen(self) -> None:
        self.store.close()
        self.store, report = open_store_with_recovery(self.root, CONFIG, clock_ms=self.clock)
        assert report.was_clean
        assert not report.clean_path_failed
        self.adopt_recovery(report)
        assert self.store.dispatcher.statistics().cq_entry_total == 0
        self.flushed_count = len(self.records)
        self.take_snapshots()

    @rule(
        tear_fraction=st.floats(0, 1),
        junk=st.sampled_from(["none", "at_record_start", "past_the_end"]),
        junk_size_bytes=st.integers(1, 600),
        drop_new_segments=st.booleans(),
        checkpoint_fate=st.sampled_from(["kept", "kept", "lost", "temp_file"]),
        cq_chunk_size_bytes=st.sampled_from(CHUNK_SIZES_BYTES),
        index_chunk_size_bytes=st.sampled_from(CHUNK_SIZES_BYTES),
        seed=st.integers(0, 2**32 - 1),
        crash_again=st.booleans(),
    )
    def crash_and_recover(
        self,
        tear_fraction: float,
        junk: str,
        junk_size_bytes: int,
        drop_new_segments: bool,
        checkpoint_fate: str,
        cq_chunk_size_bytes: int,
        index_chunk_size_bytes: int,
        seed: int,
        crash_again: bool,
    ) -> None:
        self.crash_count += 1
        rng = random.Random(seed)
        flushed_bytes = self.store.commit_log.flushed_log_offset_bytes
        written_bytes = self.store.commit_log.write_log_offset_bytes
        abandon_store(self.store)
        self.tear_commit_log(
            flushed_bytes, written_bytes, tear_fraction, junk, junk_size_bytes, seed
        )
        if drop_new_segments:
            self.drop_trailing_segments(flushed_bytes, tear_fraction, written_bytes)
        for path in sorted((self.root / "consumequeue").rglob("*")):
            if path.is_file():
                mix_chunks(path, self.cq_flushed.get(path, b""), cq_chunk_size_bytes, rng)
        index_files = (
            sorted(index_dir(self.root).iterdir()) if index_dir(self.root).is_dir() else []
        )
        if index_files:
            newest = index_files[-1]
            mix_chunks(newest, self.index_flushed.get(newest, b""), index_chunk_size_bytes, rng)
        if checkpoint_fate == "lost":
            checkpoint_path(self.root).unlink(missing_ok=True)
        elif checkpoint_fate == "temp_file":
            (self.root / "checkpoint.tmp").write_bytes(garbage(1000, seed))
        self.store, report = open_store_with_recovery(self.root, CONFIG, clock_ms=self.clock)
        assert not report.was_clean
        event(f"commit log cut: {report.truncated_reason}")
        event(f"consume-queue entries dropped: {min(report.cq_entry_dropped_count, 3)}+")
        event(f"index keys dropped: {min(report.index_entry_dropped_count, 3)}+")
        self.adopt_recovery(report)
        if crash_again:  # a second crash before anything is flushed: recovery again
            abandon_store(self.store)
            self.store, report = open_store_with_recovery(self.root, CONFIG, clock_ms=self.clock)
            assert report.truncated_at_log_offset_bytes is None
            self.adopt_recovery(report)
        self.store.flush()
        self.flushed_count = len(self.records)
        self.take_snapshots()

    # -- damage ------------------------------------------------------------------------------

    def record_start_at_or_after(self, log_offset_bytes: int, written_bytes: int) -> int:
        for item in self.records:
            if item.log_offset_bytes >= log_offset_bytes:
                return item.log_offset_bytes
        return written_bytes

    def tear_commit_log(
        self,
        flushed_bytes: int,
        written_bytes: int,
        tear_fraction: float,
        junk: str,
        junk_size_bytes: int,
        seed: int,
    ) -> None:
        tear_bytes = flushed_bytes + int(tear_fraction * (written_bytes - flushed_bytes))
        tear_commit_log(self.root, SEGMENT_SIZE_BYTES, tear_bytes, written_bytes)
        if junk == "none":
            return
        # Junk only where the writer had not finished a record: at the start of the first
        # record that did not reach the disk whole, or past everything written.
        at_bytes = written_bytes
        if junk == "at_record_start":
            at_bytes = self.record_start_at_or_after(tear_bytes, written_bytes)
        segment_start_bytes = at_bytes - at_bytes % SEGMENT_SIZE_BYTES
        path = commit_log_segment_path(self.root, segment_start_bytes)
        size_bytes = min(junk_size_bytes, SEGMENT_SIZE_BYTES - (at_bytes - segment_start_bytes))
        if path.exists() and size_bytes > 0:
            write_range(path, at_bytes - segment_start_bytes, garbage(size_bytes, seed))

    def drop_trailing_segments(
        self, flushed_bytes: int, tear_fraction: float, written_bytes: int
    ) -> None:
        """Segments created after the last flush whose every byte lies past the tear may have
        lost their directory entries; the newest go first."""
        tear_bytes = flushed_bytes + int(tear_fraction * (written_bytes - flushed_bytes))
        directory = self.root / "commitlog"
        if not directory.is_dir():
            return
        starts = sorted(
            start
            for path in directory.iterdir()
            if (start := parse_segment_name(path.name)) is not None
        )
        for start in reversed(starts[1:]):
            if start < tear_bytes or start < flushed_bytes:
                break
            commit_log_segment_path(self.root, start).unlink()


TestStoreMachine = StoreMachine.TestCase
TestStoreMachine.settings = settings(
    max_examples=80,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@pytest.mark.slow
class TestStoreMachineMany(StoreMachine.TestCase):  # type: ignore[valid-type,misc]
    """The same machine with many more examples, run before a submission (`-m slow`)."""

    settings = settings(
        max_examples=int(os.environ.get("MQBOX_STORE_MACHINE_EXAMPLES", "3000")),
        stateful_step_count=60,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
