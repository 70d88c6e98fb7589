"""Goal: recovery goes by the checkpoint's flushed offset, so acknowledged messages are never cut
and a crash never blocks the start: not by a NUL byte a client put in a property, not by a
wall clock that stepped back, not by a writer killed inside the append kernel, not by a flush
that ended exactly at a segment boundary whose next segment was lost. Damage inside flushed
bytes (a disk that broke its promise) still refuses to open, saying which file and offset and
which command repairs it, and the repair keeps a copy of every byte it cuts.

Method: one-process MessageStore with 4 KiB segments and a controllable clock; a crash is
`abandon_store` (no flush, no checkpoint, the abort file stays; dirty pages stay as after
SIGKILL), sometimes with the bytes a power loss would leave. Each scenario checks every record
by its bytes after recovery. The issue's reproductions are the first tests; the state machine
in test_store_state_machine.py explores the rest. Marked `crash`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from mqbox.errors import StoreError
from mqbox.message import MessageToStore, encode_properties_str, encode_record, pack_host
from mqbox.store.checkpoint import read_checkpoint, write_checkpoint
from mqbox.store.commit_log import WriterStoppedForTestError
from mqbox.store.layout import StoreGeometry, checkpoint_path, segment_name
from mqbox.store.message_store import MessageStore, StoreConfig
from tests.support.faulty_file import (
    abandon_store,
    commit_log_segment_path,
    open_store_with_recovery,
    write_range,
)

pytestmark = pytest.mark.crash

SEGMENT_SIZE_BYTES = 4096
CONFIG = StoreConfig(
    geometry=StoreGeometry(
        commit_log_segment_size_bytes=SEGMENT_SIZE_BYTES,
        cq_segment_entry_count=16,
        index_slot_count=16,
        index_entry_count_max=64,
    ),
    max_message_size_bytes=1024,
    store_host=pack_host("127.0.0.1", 10911),
)


class SteppingClock:
    """A wall clock that ticks 10 ms per reading and can be stepped by hand."""

    def __init__(self) -> None:
        self.now_ms = 1_700_000_000_000

    def __call__(self) -> int:
        self.now_ms += 10
        return self.now_ms


@dataclasses.dataclass
class Harness:
    root: Path
    clock: SteppingClock
    store: MessageStore
    sent: list[tuple[int, bytes]]  # (log offset, stored bytes) of every acknowledged record
    serial: int = 0
    last_keyed_at: int = -1  # log offset of the record whose UNIQ_KEY is f"u{serial}"

    def send(self, count: int, properties: dict[str, str] | None = None) -> None:
        for _ in range(count):
            self.serial += 1
            props = {"UNIQ_KEY": f"u{self.serial}", **(properties or {})}
            record = encode_record(
                MessageToStore("T", 0, f"body-{self.serial}".encode(), encode_properties_str(props))
            )
            result = self.store.append_record(record, "T", 0)
            end_bytes = self.store.commit_log.write_log_offset_bytes
            stored = self.store.commit_log.read_record(result.log_offset_bytes, end_bytes)
            assert stored is not None
            self.sent.append((result.log_offset_bytes, stored))
            self.last_keyed_at = result.log_offset_bytes

    def crash_and_reopen(self, **recover_options: object) -> None:
        abandon_store(self.store)
        self.store, report = open_store_with_recovery(
            self.root, CONFIG, clock_ms=self.clock, **recover_options
        )
        assert not report.was_clean

    def check_all_sent_are_stored(self) -> None:
        end_bytes = self.store.commit_log.write_log_offset_bytes
        assert end_bytes == self.sent[-1][0] + len(self.sent[-1][1])
        for log_offset_bytes, stored in self.sent:
            assert self.store.commit_log.read_record(log_offset_bytes, end_bytes) == stored
        self.store.dispatch()
        assert self.store.max_offset("T", 0) == len(self.sent)
        found = self.store.query_by_key("T", f"u{self.serial}", 0, 2**62, 4)
        assert [message.log_offset_bytes for message in found] == [self.last_keyed_at]


def rewrite_checkpoint(root: Path, **changes: int | None) -> None:
    """Replace some fields of the store's checkpoint, as another history would have left it."""
    state = read_checkpoint(checkpoint_path(root))
    assert state is not None
    write_checkpoint(checkpoint_path(root), dataclasses.replace(state, **changes))  # type: ignore[arg-type]


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    clock = SteppingClock()
    store, _ = open_store_with_recovery(tmp_path / "store", CONFIG, clock_ms=clock)
    h = Harness(tmp_path / "store", clock, store, [])
    yield h
    h.store.close()


def test_nul_in_a_property_never_cuts_flushed_messages(harness: Harness) -> None:
    """The issue's reproduction: one message with a NUL in a property value, then more, all
    flushed and acknowledged; a crash; every one of them is there after recovery."""
    harness.send(3)
    harness.send(1, {"note": "a\0b", "empty\0name": "\0"})
    harness.send(22)
    harness.store.flush()
    harness.crash_and_reopen()
    harness.check_all_sent_are_stored()


def test_nul_in_a_property_never_cuts_unflushed_messages_after_a_process_kill(
    harness: Harness,
) -> None:
    """Acknowledged under ASYNC_FLUSH but not flushed: a process kill keeps the page cache, so
    recovery must keep them too, NUL bytes and all."""
    harness.send(5)
    harness.store.flush()
    harness.send(2, {"note": "\0\0\0"})
    harness.send(5)
    harness.crash_and_reopen()
    harness.check_all_sent_are_stored()


def test_a_wall_clock_stepped_back_never_refuses_the_start(harness: Harness) -> None:
    """The checkpoint keeps the newest store time; a clock stepped back by a minute before an
    unclean stop used to make recovery see its own flushed records as damage."""
    harness.send(10)
    harness.store.flush()
    harness.clock.now_ms -= 60_000
    harness.send(40)  # rolls into new segments with older store times
    harness.store.flush()
    harness.clock.now_ms -= 60_000
    harness.send(5)
    harness.crash_and_reopen()
    harness.check_all_sent_are_stored()


def test_a_writer_killed_inside_the_append_kernel_leaves_whole_records_or_none(
    harness: Harness,
) -> None:
    """The kernel stores each record's size and magic last; a kill before that (here: the test
    hook stops after publishing some of a batch) leaves the earlier records whole and none of
    the later, which recovery drops without complaint."""
    harness.send(4)
    harness.store.flush()
    for published_count in (0, 2):
        harness.store.commit_log.publish_count_max_for_test = published_count
        records = [
            encode_record(MessageToStore("T", 0, f"batch-{n}".encode(), b"UNIQ_KEY\x01b\x02"))
            for n in range(5)
        ]
        sizes = np.array([len(record) for record in records], dtype=np.int32)
        start_bytes = harness.store.commit_log.write_log_offset_bytes
        with pytest.raises(WriterStoppedForTestError):
            harness.store.append_batch(
                np.frombuffer(b"".join(records), dtype=np.uint8), sizes, "T", 0
            )
        harness.crash_and_reopen()
        report = harness.store.recovery_report
        assert report is not None
        kept_bytes = int(sizes[:published_count].sum())
        assert report.write_log_offset_bytes == start_bytes + kept_bytes
        for n in range(published_count):
            at = start_bytes + int(sizes[:n].sum())
            stored = harness.store.commit_log.read_record(at, report.write_log_offset_bytes)
            assert stored is not None
            harness.sent.append((at, stored))
        harness.check_all_sent_are_stored()


def test_a_flush_that_ended_at_a_segment_boundary_survives_losing_the_next_segment(
    harness: Harness,
) -> None:
    """The state machine's example from the last session: the flushed position is exactly the
    start of a new segment, the crash loses that segment's directory entry, and the checkpoint
    stays. The log ends at the boundary; nothing flushed is missing, so the store opens."""
    while harness.store.commit_log.write_log_offset_bytes < SEGMENT_SIZE_BYTES:
        harness.send(1)
    # The last send rolled: the log now ends just past the boundary. Flush the first segment
    # only, as a flush that ran before the roll would have.
    boundary_sent = [item for item in harness.sent if item[0] < SEGMENT_SIZE_BYTES]
    harness.store.dispatch()
    harness.store.flush()
    rewrite_checkpoint(
        harness.root,
        physic_log_offset_bytes=SEGMENT_SIZE_BYTES,
        logics_log_offset_bytes=SEGMENT_SIZE_BYTES,
        index_log_offset_bytes=SEGMENT_SIZE_BYTES,
    )
    abandon_store(harness.store)
    commit_log_segment_path(harness.root, SEGMENT_SIZE_BYTES).unlink()
    harness.store, report = open_store_with_recovery(harness.root, CONFIG, clock_ms=harness.clock)
    assert report.write_log_offset_bytes == SEGMENT_SIZE_BYTES
    harness.sent = boundary_sent
    harness.serial = len(boundary_sent)
    end_bytes = harness.store.commit_log.write_log_offset_bytes
    for log_offset_bytes, stored in harness.sent:
        assert harness.store.commit_log.read_record(log_offset_bytes, end_bytes) == stored
    harness.send(3)  # and the store takes appends again
    harness.check_all_sent_are_stored()


def test_a_new_segment_whose_first_record_has_no_store_time_is_not_trusted_by_times(
    harness: Harness,
) -> None:
    """A checkpoint written before the offsets existed is recovered by times. A new segment's
    first record torn inside its header (STORETIMESTAMP 0) must not be taken as the place
    where the scan starts; the records before it are all kept."""
    while harness.store.commit_log.write_log_offset_bytes < SEGMENT_SIZE_BYTES + 200:
        harness.send(1)
    harness.store.flush()
    rewrite_checkpoint(  # as written before the offsets existed
        harness.root,
        physic_log_offset_bytes=None,
        logics_log_offset_bytes=None,
        index_log_offset_bytes=None,
    )
    abandon_store(harness.store)
    # The first record of the second segment loses its store time (unflushed, in this story).
    write_range(commit_log_segment_path(harness.root, SEGMENT_SIZE_BYTES), 56, bytes(8))
    harness.store, report = open_store_with_recovery(harness.root, CONFIG, clock_ms=harness.clock)
    assert report.write_log_offset_bytes == SEGMENT_SIZE_BYTES
    harness.sent = [item for item in harness.sent if item[0] < SEGMENT_SIZE_BYTES]
    harness.serial = len(harness.sent)
    harness.send(1)
    harness.check_all_sent_are_stored()


def test_damage_inside_flushed_bytes_refuses_and_names_the_file_and_the_repair(
    harness: Harness, tmp_path: Path
) -> None:
    harness.send(30)
    harness.store.flush()
    flushed_bytes = harness.store.commit_log.flushed_log_offset_bytes
    victim_at, victim = harness.sent[20]
    assert victim_at + len(victim) <= flushed_bytes
    abandon_store(harness.store)
    segment_start_bytes = victim_at - victim_at % SEGMENT_SIZE_BYTES
    path = commit_log_segment_path(harness.root, segment_start_bytes)
    write_range(path, victim_at - segment_start_bytes + 90, b"\xff")  # a flipped body byte
    with pytest.raises(StoreError) as refused:
        MessageStore.open(harness.root, CONFIG, clock_ms=harness.clock)
    message = str(refused.value)
    assert str(path) in message
    assert f"file offset {victim_at - segment_start_bytes}" in message
    assert f"log offset {victim_at}" in message
    assert "body CRC mismatch" in message
    assert f"mqbox store repair --store-root {harness.root}" in message
    # The repair cuts there and keeps a copy of every byte it cut.
    copy_dir = tmp_path / "cut"
    harness.store, report = open_store_with_recovery(
        harness.root,
        CONFIG,
        clock_ms=harness.clock,
        truncate_flushed_damage=True,
        cut_copy_directory=copy_dir,
    )
    assert report.flushed_damage
    assert report.write_log_offset_bytes == victim_at
    copies = sorted(copy_dir.iterdir())
    assert copies[0].name == segment_name(victim_at)
    assert copies[0].read_bytes()[: len(victim) - 1] != victim[: len(victim) - 1]  # the damage
    assert copies[0].read_bytes()[len(victim) : len(victim) + 4] == harness.sent[21][1][:4]
    state = read_checkpoint(checkpoint_path(harness.root))
    assert state is not None
    harness.store.flush()
    state = read_checkpoint(checkpoint_path(harness.root))
    assert state is not None
    assert state.physic_log_offset_bytes == victim_at  # clamped: claims nothing cut
    harness.sent = harness.sent[:20]
    harness.serial = 20
    harness.send(1)
    harness.check_all_sent_are_stored()
