"""Goal: the commit log stores exactly the records it is given, at the positions RocketMQ's rules
give them (back to back, a blank and a roll when L + 8 > bytes left, a batch whole in one
segment), with QUEUEOFFSET dense per queue and the store fields patched; it refuses what is too
large before writing a byte; flushes cover what was written, even racing the writer; and a
clean reopen finds the same write end (test_flush.py has the flush service).

Method: tiny segments (1 KiB) in tmp_path so rolls happen every few records. The reference
for every byte is message.encode_record() called with the queue index, log offset, store time
and store host the rules predict (a plain-Python model of the log), compared with the segment
files; hypothesis drives random batch sequences through both.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.typing import NDArray

from mqbox.errors import MessageIllegalError, MessageTooLargeError, StoreError
from mqbox.message import (
    BLANK_MAGIC,
    SYSFLAG_TRANSACTION_COMMIT_TYPE,
    SYSFLAG_TRANSACTION_PREPARED_TYPE,
    SYSFLAG_TRANSACTION_ROLLBACK_TYPE,
    MessageToStore,
    decode_record,
    encode_record,
    pack_host,
)
from mqbox.store.commit_log import CommitLog, record_log_offsets
from mqbox.store.layout import StoreGeometry, commit_log_dir, segment_name

SEGMENT_SIZE_BYTES = 1024
RECORD_SIZE_BYTES_MAX = 512
HOST = pack_host("127.0.0.1", 10911)
TOPIC = "T"  # one byte: a record is 92 + body + properties bytes


def open_log(
    root: Path,
    *,
    initial: dict[tuple[str, int], int] | None = None,
    position_bytes: int | None = 0,
) -> CommitLog:
    table = initial or {}
    log = CommitLog.open(
        root,
        StoreGeometry(commit_log_segment_size_bytes=SEGMENT_SIZE_BYTES),
        writable=True,
        record_size_bytes_max=RECORD_SIZE_BYTES_MAX,
        store_host=HOST,
        initial_queue_index=lambda topic, queue_id: table.get((topic, queue_id), 0),
    )
    if position_bytes is not None:
        log.set_write_position(position_bytes)
    return log


def message(
    size_bytes: int, queue_id: int = 0, topic: str = TOPIC, sysflag: int = 0
) -> MessageToStore:
    """A message whose record is exactly `size_bytes` long."""
    body_size_bytes = size_bytes - 91 - len(topic.encode())
    assert body_size_bytes >= 0
    return MessageToStore(
        topic, queue_id, bytes([65 + queue_id % 26]) * body_size_bytes, sysflag=sysflag
    )


def batch(messages: list[MessageToStore]) -> tuple[NDArray[np.uint8], NDArray[np.int32]]:
    records = [encode_record(item) for item in messages]
    data = np.frombuffer(b"".join(records), dtype=np.uint8)
    return data, np.array([len(record) for record in records], dtype=np.int32)


def log_bytes(root: Path) -> bytes:
    paths = sorted(commit_log_dir(root).iterdir())
    return b"".join(path.read_bytes() for path in paths)


class LogModel:
    """Plain-Python statement of where records go and what they hold."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.position_bytes = 0
        self.next_queue_index: dict[tuple[str, int], int] = {}

    def append(self, messages: list[MessageToStore], store_timestamp_ms: int) -> list[int]:
        sizes = [len(encode_record(item)) for item in messages]
        total = sum(sizes)
        left = SEGMENT_SIZE_BYTES - self.position_bytes % SEGMENT_SIZE_BYTES
        if total + 8 > left:
            self._pad_to(self.position_bytes)
            self.data[self.position_bytes : self.position_bytes + 8] = left.to_bytes(
                4, "big"
            ) + BLANK_MAGIC.to_bytes(4, "big")
            self.position_bytes += left
        offsets = []
        for item in messages:
            key = (item.topic, item.queue_id)
            queue_index = 0
            if item.sysflag & 0xC not in (0x4, 0xC):
                queue_index = self.next_queue_index.get(key, 0)
                self.next_queue_index[key] = queue_index + 1
            record = encode_record(
                item,
                queue_index=queue_index,
                log_offset_bytes=self.position_bytes,
                store_timestamp_ms=store_timestamp_ms,
                store_host=HOST,
            )
            self._pad_to(self.position_bytes + len(record))
            self.data[self.position_bytes : self.position_bytes + len(record)] = record
            offsets.append(self.position_bytes)
            self.position_bytes += len(record)
        return offsets

    def _pad_to(self, end_bytes: int) -> None:
        if len(self.data) < end_bytes + 8:
            self.data.extend(bytes(end_bytes + 8 - len(self.data)))

    def expected_file_bytes(self) -> bytes:
        segment_count = -(-self.position_bytes // SEGMENT_SIZE_BYTES)
        padded = bytes(self.data[: self.position_bytes]) + bytes(
            segment_count * SEGMENT_SIZE_BYTES - self.position_bytes
        )
        return padded


def test_append_batch_patches_store_fields_and_counts_queue_indexes(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    data, sizes = batch([message(120, queue_id=3) for _ in range(4)])
    result = log.append_batch(data, sizes, TOPIC, 3, store_timestamp_ms=1_700_000_000_123)
    assert result.log_offset_bytes == 0
    assert result.queue_index == 0
    assert result.record_count == 4
    assert result.end_log_offset_bytes == 480
    offsets = record_log_offsets(result, sizes)
    assert offsets.tolist() == [0, 120, 240, 360]
    for queue_index, log_offset_bytes in enumerate(offsets.tolist()):
        record = log.read_record(log_offset_bytes, log.write_log_offset_bytes)
        assert record is not None
        stored = decode_record(record)
        assert stored.queue_index == queue_index
        assert stored.log_offset_bytes == log_offset_bytes
        assert stored.store_timestamp_ms == 1_700_000_000_123
        assert stored.store_host == HOST
        assert stored.queue_id == 3
    second = log.append_batch(data, sizes, TOPIC, 3, store_timestamp_ms=5)
    assert second.queue_index == 4
    assert second.log_offset_bytes == 480
    assert log.queue_indexes.next_queue_index(TOPIC, 3) == 8
    assert log.last_store_timestamp_ms == 5


def test_append_records_of_several_queues_counts_each_queue_densely(tmp_path: Path) -> None:
    log = open_log(tmp_path, initial={(TOPIC, 1): 10})
    queue_ids = [0, 1, 0, 2, 1, 1]
    data, sizes = batch([message(100, queue_id=queue_id) for queue_id in queue_ids])
    slots = np.array([log.queue_slot(TOPIC, queue_id) for queue_id in queue_ids], dtype=np.int32)
    out = np.full(len(queue_ids), -1, dtype=np.int64)
    result = log.append_records(data, sizes, slots, out, store_timestamp_ms=1)
    assert result.queue_index == -1
    assert out.tolist() == [0, 10, 1, 0, 11, 12]
    offsets = record_log_offsets(result, sizes).tolist()
    for log_offset_bytes, queue_index in zip(offsets, out.tolist(), strict=True):
        record = log.read_record(log_offset_bytes, log.write_log_offset_bytes)
        assert record is not None
        assert decode_record(record).queue_index == queue_index


@pytest.mark.parametrize("rolls", [False, True])
def test_record_goes_in_only_if_eight_bytes_stay_free(tmp_path: Path, rolls: bool) -> None:
    log = open_log(tmp_path)
    first, first_sizes = batch([message(300), message(220)])
    log.append_batch(first, first_sizes, TOPIC, 0, store_timestamp_ms=1)
    left_bytes = SEGMENT_SIZE_BYTES - 520
    size_bytes = left_bytes - 8 + int(rolls)  # L + 8 == left fits; one byte more does not
    data, sizes = batch([message(size_bytes)])
    result = log.append_batch(data, sizes, TOPIC, 0, store_timestamp_ms=1)
    if rolls:
        assert result.log_offset_bytes == SEGMENT_SIZE_BYTES
        segment = (commit_log_dir(tmp_path) / segment_name(0)).read_bytes()
        assert int.from_bytes(segment[520:524], "big") == left_bytes
        assert int.from_bytes(segment[524:528], "big") == BLANK_MAGIC
        assert log.statistics().roll_total == 1
    else:
        assert result.log_offset_bytes == 520
        assert result.end_log_offset_bytes == SEGMENT_SIZE_BYTES - 8
        assert log.statistics().roll_total == 0


def test_multi_segment_log_rolls_and_every_record_reads_back(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    model = LogModel()
    rng = np.random.default_rng(7)
    offsets: list[int] = []
    for step in range(120):
        queue_id = int(rng.integers(0, 3))
        items = [
            message(int(rng.integers(92, 300)), queue_id=queue_id)
            for _ in range(int(rng.integers(1, 4)))
        ]
        data, sizes = batch(items)
        result = log.append_batch(data, sizes, TOPIC, items[0].queue_id, store_timestamp_ms=step)
        expected = model.append(items, step)
        assert record_log_offsets(result, sizes).tolist() == expected
        offsets.extend(expected)
    assert log.write_log_offset_bytes == model.position_bytes
    assert len(log.segment_starts_bytes) >= 10
    assert log_bytes(tmp_path) == model.expected_file_bytes()
    for log_offset_bytes in offsets:
        record = log.read_record(log_offset_bytes, log.write_log_offset_bytes)
        assert record is not None
        assert decode_record(record).log_offset_bytes == log_offset_bytes


def test_batch_that_does_not_fit_the_rest_moves_whole_to_the_next_segment(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    data, sizes = batch([message(400)])
    log.append_batch(data, sizes, TOPIC, 0, store_timestamp_ms=1)
    data, sizes = batch([message(310), message(310)])  # the first alone would fit
    result = log.append_batch(data, sizes, TOPIC, 0, store_timestamp_ms=1)
    assert result.log_offset_bytes == SEGMENT_SIZE_BYTES
    assert result.queue_index == 1


def test_batch_larger_than_a_segment_is_refused_before_writing(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    data, sizes = batch([message(300, queue_id=0)])
    log.append_batch(data, sizes, TOPIC, 0, store_timestamp_ms=1)
    before = log_bytes(tmp_path)
    data, sizes = batch([message(400)] * 3)
    with pytest.raises(MessageTooLargeError):
        log.append_batch(data, sizes, TOPIC, 0, store_timestamp_ms=1)
    assert log.write_log_offset_bytes == 300
    assert log.queue_indexes.next_queue_index(TOPIC, 0) == 1
    assert log_bytes(tmp_path) == before


def test_record_over_max_size_is_refused_before_writing_anything(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    data, sizes = batch([message(100), message(RECORD_SIZE_BYTES_MAX + 1)])
    with pytest.raises(MessageTooLargeError, match="maxMessageSize"):
        log.append_batch(data, sizes, TOPIC, 0, store_timestamp_ms=1)
    assert log.write_log_offset_bytes == 0
    assert log.queue_indexes.next_queue_index(TOPIC, 0) == 0
    assert log.segment_starts_bytes == ()  # not even the first segment was made


def test_record_that_is_not_what_the_caller_says_is_a_programmer_error(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    data, sizes = batch([message(100, queue_id=1)])
    with pytest.raises(AssertionError):
        log.append_batch(data, sizes, TOPIC, 2, store_timestamp_ms=1)  # QUEUEID is 1
    data, sizes = batch([message(100, topic="Other")])
    with pytest.raises(AssertionError):
        log.append_batch(data, sizes, TOPIC, 0, store_timestamp_ms=1)
    with pytest.raises(MessageIllegalError):
        log.append_batch(data, sizes, "../escape", 0, store_timestamp_ms=1)
    assert log.write_log_offset_bytes == 0


def test_prepared_and_rollback_records_get_no_queue_index(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    flags = [
        0,
        SYSFLAG_TRANSACTION_PREPARED_TYPE,
        SYSFLAG_TRANSACTION_COMMIT_TYPE,
        SYSFLAG_TRANSACTION_ROLLBACK_TYPE,
        0,
    ]
    data, sizes = batch([message(100, sysflag=flag) for flag in flags])
    result = log.append_batch(data, sizes, TOPIC, 0, store_timestamp_ms=1)
    indexes = []
    for log_offset_bytes in record_log_offsets(result, sizes).tolist():
        record = log.read_record(log_offset_bytes, log.write_log_offset_bytes)
        assert record is not None
        indexes.append(decode_record(record).queue_index)
    assert indexes == [0, 0, 1, 0, 2]
    assert log.queue_indexes.next_queue_index(TOPIC, 0) == 3


def test_flush_covers_written_bytes_and_records_their_store_time(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    assert log.flush() == 0
    data, sizes = batch([message(300)] * 3)
    for step in range(3):
        log.append_batch(data, sizes, TOPIC, 0, store_timestamp_ms=100 + step)
    assert log.flushed_log_offset_bytes == 0
    flushed_bytes = log.flush()
    assert flushed_bytes == log.write_log_offset_bytes
    assert log.flushed_log_offset_bytes == flushed_bytes
    assert log.flushed_store_timestamp_ms == 102
    assert log.statistics().flush_total == 1
    assert log.flush() == flushed_bytes  # nothing new: no msync
    assert log.statistics().flush_total == 1


def test_flushes_from_two_threads_race_safely_with_the_writer(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    data, sizes = batch([message(150)] * 2)
    stop = threading.Event()
    errors: list[BaseException] = []

    def flush_until_stopped() -> None:
        try:
            while not stop.is_set():
                assert log.flush() <= log.write_log_offset_bytes
        except BaseException as error:  # the test thread reports it
            errors.append(error)

    flushers = [threading.Thread(target=flush_until_stopped) for _ in range(2)]
    for flusher in flushers:
        flusher.start()
    try:
        for step in range(100):
            log.append_batch(data, sizes, TOPIC, 0, store_timestamp_ms=step)
    finally:
        stop.set()
        for flusher in flushers:
            flusher.join()
    assert errors == []
    assert log.flush() == log.write_log_offset_bytes
    assert log.flushed_store_timestamp_ms == 99


def test_clean_reopen_finds_the_same_write_end(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    data, sizes = batch([message(150)] * 3)
    first_end = 0
    for step in range(12):
        result = log.append_batch(data, sizes, TOPIC, 0, store_timestamp_ms=step)
        if step == 0:
            first_end = result.end_log_offset_bytes
    log.flush()
    end_bytes = log.write_log_offset_bytes
    log.close()
    reopened = open_log(tmp_path, position_bytes=None)
    assert reopened.find_clean_write_end(0) == end_bytes
    assert reopened.find_clean_write_end(first_end) == end_bytes
    assert reopened.last_store_timestamp_ms == 11
    reopened.set_write_position(end_bytes)
    more = reopened.append_batch(data, sizes, TOPIC, 0, store_timestamp_ms=99)
    assert more.log_offset_bytes >= end_bytes


def test_clean_reopen_after_a_blank_continues_in_the_next_segment(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    data, sizes = batch([message(510)])
    log.append_batch(data, sizes, TOPIC, 0, store_timestamp_ms=1)
    log.append_batch(data, sizes, TOPIC, 0, store_timestamp_ms=1)  # rolls
    log.close()
    reopened = open_log(tmp_path, position_bytes=None)
    assert reopened.find_clean_write_end(0) == SEGMENT_SIZE_BYTES + 510


def test_clean_reopen_refuses_bytes_after_the_end(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    data, sizes = batch([message(150)])
    log.append_batch(data, sizes, TOPIC, 0, store_timestamp_ms=1)
    log.close()
    path = commit_log_dir(tmp_path) / segment_name(0)
    raw = bytearray(path.read_bytes())
    raw[400] = 0x7F  # noise past the last record: not a clean end
    path.write_bytes(bytes(raw))
    reopened = open_log(tmp_path, position_bytes=None)
    with pytest.raises(StoreError, match="recovery"):
        reopened.find_clean_write_end(0)


def test_read_record_rejects_offsets_that_start_no_record(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    data, sizes = batch([message(200)] * 2)
    log.append_batch(data, sizes, TOPIC, 0, store_timestamp_ms=1)
    end_bytes = log.write_log_offset_bytes
    assert log.read_record(0, end_bytes) is not None
    assert log.read_record(200, end_bytes) is not None
    for bad in (-1, 1, 100, 199, 400, 10_000, SEGMENT_SIZE_BYTES):
        assert log.read_record(bad, end_bytes) is None
    assert log.read_record(200, 399) is None  # beyond the readable end


def test_delete_segments_below_keeps_the_segment_being_written(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    data, sizes = batch([message(510)])
    for _ in range(6):
        log.append_batch(data, sizes, TOPIC, 0, store_timestamp_ms=1)
    assert len(log.segment_starts_bytes) == 6
    assert log.delete_segments_below(2 * SEGMENT_SIZE_BYTES) == 0  # nothing is flushed yet
    log.flush()
    assert log.delete_segments_below(2 * SEGMENT_SIZE_BYTES) == 2
    assert log.min_log_offset_bytes == 2 * SEGMENT_SIZE_BYTES
    assert log.read_record(0, log.write_log_offset_bytes) is None
    assert log.read_record(2 * SEGMENT_SIZE_BYTES, log.write_log_offset_bytes) is not None
    assert log.delete_segments_below(10**9) == 3
    assert list(log.segment_starts_bytes) == [5 * SEGMENT_SIZE_BYTES]


batches = st.lists(
    st.tuples(
        st.integers(0, 2),  # queue id
        st.lists(st.integers(92, 250), min_size=1, max_size=4),  # record sizes
        st.sampled_from([0, 0, 0, SYSFLAG_TRANSACTION_PREPARED_TYPE]),
    ),
    min_size=1,
    max_size=25,
)


@settings(max_examples=40)
@given(batches)
def test_append_kernel_writes_what_encode_record_predicts(
    tmp_path_factory: pytest.TempPathFactory,
    steps: list[tuple[int, list[int], int]],
) -> None:
    root = tmp_path_factory.mktemp("log")
    log = open_log(root)
    model = LogModel()
    for step, (queue_id, record_sizes, sysflag) in enumerate(steps):
        items = [message(size, queue_id=queue_id, sysflag=sysflag) for size in record_sizes]
        data, sizes = batch(items)
        result = log.append_batch(data, sizes, TOPIC, queue_id, store_timestamp_ms=1000 + step)
        assert record_log_offsets(result, sizes).tolist() == model.append(items, 1000 + step)
    assert log.write_log_offset_bytes == model.position_bytes
    assert log_bytes(root) == model.expected_file_bytes()
    log.close()
