"""Goal: the one flush service keeps RocketMQ's two schedules (SYNC_FLUSH: one flush covers every
waiter that asked before it started; ASYNC_FLUSH: a flush every interval), never lets a waiter go
before the flush that covers it, times a waiter out when no flush comes, sleeps through an idle
spell without flushing (ASYNC_FLUSH with nothing unflushed: no wake-up) and flushes within an
interval of the next `note_written`, survives a failing disk, and tells its owner after each
flush; its waiters wait for the least of the named positions they need, so a second position
(replication, issue 14) holds them back until it covers them too; the segment warmer runs ahead
of the writer.

Method: a real CommitLog on tiny segments in tmp_path, real threads that append and wait while
the test thread flushes once or the service's thread runs; a fake commit log whose flush fails
on demand for the retry; DurablePositions driven directly for the second position.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import cast

import numpy as np
import pytest

from mqbox.message import MessageToStore, encode_record
from mqbox.store.commit_log import CommitLog
from mqbox.store.flush import (
    FLUSHED,
    SYNC_ACK_POSITIONS,
    DurablePositions,
    FlushService,
    SegmentWarmer,
)
from mqbox.store.layout import StoreGeometry

TOPIC = "T"
REPLICATED = "replicated"  # issue 14's second position, as a test names it
RECORD = np.frombuffer(encode_record(MessageToStore(TOPIC, 0, b"x" * 50)), dtype=np.uint8)
SIZES = np.array([RECORD.size], dtype=np.int32)


def open_log(root: Path, segment_size_bytes: int = 1 << 16) -> CommitLog:
    log = CommitLog.open(
        root,
        StoreGeometry(commit_log_segment_size_bytes=segment_size_bytes),
        writable=True,
        record_size_bytes_max=1024,
    )
    log.set_write_position(0)
    return log


def append(log: CommitLog) -> int:
    """Append one record; return the end of what was written."""
    return log.append_batch(RECORD, SIZES, TOPIC, 0, store_timestamp_ms=7).end_log_offset_bytes


def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 30
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.001)


def test_one_flush_serves_every_waiter(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    service = FlushService(log, sync=True)
    results: list[bool] = []
    lock = threading.Lock()

    def append_and_wait() -> None:
        with lock:  # one writer at a time, as the store writer is
            end_bytes = append(log)
        covered = service.wait_flushed(end_bytes, timeout_s=30)
        with lock:
            results.append(covered)

    threads = [threading.Thread(target=append_and_wait) for _ in range(6)]
    for thread in threads:
        thread.start()
    wait_until(lambda: service.waiting_count == len(threads), "every waiter waits")
    assert service.flush_once() == log.write_log_offset_bytes
    for thread in threads:
        thread.join()
    assert results == [True] * len(threads)
    statistics = service.statistics()
    assert statistics.flush_total == 1
    assert statistics.waiter_total == len(threads)
    assert statistics.waiting_count == 0
    assert service.flush_once() == log.write_log_offset_bytes  # nothing asked: no flush
    assert service.statistics().flush_total == 1


def test_the_thread_serves_waiters_and_a_wait_times_out_without_it(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    flushed: list[tuple[int, int]] = []
    service = FlushService(
        log, sync=True, on_flushed=lambda offset, time_ms: flushed.append((offset, time_ms))
    )
    end_bytes = append(log)
    assert not service.wait_flushed(end_bytes, timeout_s=0.01)
    assert service.statistics().timeout_total == 1
    assert log.flushed_log_offset_bytes == 0  # nobody flushed
    service.start()
    try:
        for _ in range(20):
            end_bytes = append(log)
            assert service.wait_flushed(end_bytes, timeout_s=30)
            assert log.flushed_log_offset_bytes >= end_bytes
            assert service.positions.position(FLUSHED) >= end_bytes
    finally:
        service.stop()
    assert 1 <= service.statistics().flush_total <= 21
    assert flushed[-1] == (log.write_log_offset_bytes, 7)


def test_a_request_alone_gets_its_flush(tmp_path: Path) -> None:
    """The store writer's form: it asks and keeps its acks itself, woken by on_flushed."""
    log = open_log(tmp_path)
    woken = threading.Event()
    service = FlushService(log, sync=True, on_flushed=lambda _offset, _time_ms: woken.set())
    service.start()
    try:
        end_bytes = append(log)
        service.request(end_bytes)
        assert woken.wait(30)
        assert service.positions.covered_log_offset_bytes(SYNC_ACK_POSITIONS) >= end_bytes
    finally:
        service.stop()


def test_async_flush_runs_on_its_timer(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    service = FlushService(log, sync=False, interval_ms=5)
    service.start()
    try:
        end_bytes = append(log)  # nobody asks
        service.note_written()
        wait_until(lambda: log.flushed_log_offset_bytes >= end_bytes, "the timer flushes")
    finally:
        service.stop()
    assert service.positions.position(FLUSHED) >= end_bytes


def flushed_past(log: CommitLog, end_bytes: int) -> Callable[[], bool]:
    return lambda: log.flushed_log_offset_bytes >= end_bytes


def test_async_flush_sleeps_while_nothing_is_unflushed(tmp_path: Path) -> None:
    """Forty intervals with every byte flushed cost no flush (the thread does not wake); bytes
    written after them are flushed once `note_written` says so, and each append keeps the
    timer going."""
    log = open_log(tmp_path)
    service = FlushService(log, sync=False, interval_ms=5)
    service.start()
    try:
        first_end_bytes = append(log)
        service.note_written()
        wait_until(lambda: log.flushed_log_offset_bytes >= first_end_bytes, "the first flush")
        wait_until(lambda: service.statistics().flush_total >= 1, "the first flush counted")
        flush_total = service.statistics().flush_total
        time.sleep(0.2)
        assert service.statistics().flush_total == flush_total
        for _ in range(3):
            end_bytes = append(log)
            service.note_written()
            wait_until(flushed_past(log, end_bytes), "a flush after idle")
    finally:
        service.stop()
    assert service.statistics().flush_total > flush_total


class FailingLog:
    """Enough of a CommitLog for the flush thread, whose disk refuses the first flushes."""

    writable = True
    flushed_log_offset_bytes = 0
    flushed_store_timestamp_ms = 0

    def __init__(self, failure_count: int) -> None:
        self.failure_count = failure_count

    def flush(self) -> int:
        if self.failure_count > 0:
            self.failure_count -= 1
            raise OSError(5, "Input/output error")
        self.flushed_log_offset_bytes = 100
        return 100


def test_a_failing_disk_is_retried_and_waiters_wait(caplog: pytest.LogCaptureFixture) -> None:
    disk = FailingLog(failure_count=2)
    service = FlushService(cast(CommitLog, disk), sync=True)
    service.start()
    try:
        assert service.wait_flushed(100, timeout_s=30)
    finally:
        service.stop()
    assert service.statistics().error_total == 2
    assert "retrying" in caplog.text


def test_a_second_position_holds_waiters_until_it_covers_them_too() -> None:
    positions = DurablePositions({FLUSHED: 0, REPLICATED: 0})
    both = (FLUSHED, REPLICATED)
    released = threading.Event()

    def wait() -> None:
        if positions.wait_covered(500, both, timeout_s=30):
            released.set()

    waiter = threading.Thread(target=wait)
    waiter.start()
    positions.advance(FLUSHED, 800)
    assert not released.wait(0.05)  # flushed, not yet replicated
    assert positions.covered_log_offset_bytes(both) == 0
    assert positions.covered_log_offset_bytes((FLUSHED,)) == 800
    positions.advance(REPLICATED, 500)
    waiter.join()
    assert released.is_set()
    positions.advance(FLUSHED, 300)  # never back
    assert positions.position(FLUSHED) == 800
    assert not positions.wait_covered(900, both, timeout_s=0.01)


def test_segment_warmer_runs_ahead_of_the_writer(tmp_path: Path) -> None:
    log = open_log(tmp_path, segment_size_bytes=1 << 20)
    warmer = SegmentWarmer(log, lead_bytes=256 * 1024, chunk_bytes=64 * 1024)
    warmer.start()
    try:
        append(log)
        wait_until(lambda: warmer.warmed_bytes_total + warmer.refused_total > 0, "it warms")
    finally:
        warmer.stop()
    assert warmer.warmed_bytes_total <= 256 * 1024 + 64 * 1024
