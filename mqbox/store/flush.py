"""When the commit log becomes durable: the one flush service, the positions acks wait on, and
the segment warmer.

Owns: `FlushService`, the flush thread of a writable CommitLog, both schedules of RocketMQ's
flushDiskType: ASYNC_FLUSH flushes every flushIntervalCommitLog ms while the log holds bytes no
flush covered (FlushRealTimeService), and with none sleeps until the writer's `note_written`,
so an idle broker's flush thread does not wake (issue 15); SYNC_FLUSH flushes whenever an
append asks for more than is flushed, and one flush covers every request made before it started
(GroupCommitService), so requests that arrive during a flush share the next one.
`DurablePositions`, the named log positions that only grow and the threads waiting on them.
`SegmentWarmer`, the thread that faults in segment pages ahead of the writer.
Used by the store writer role (server/roles/store_writer.py: its loop keeps the acks and releases
them by `covered_log_offset_bytes`, woken by the `on_flushed` callback, which also publishes the
flushed position and store time to shared memory for the checkpoint) and by MessageStore
(threads block in `wait_flushed`).

Never: decides what an append is or answers a client, flushes the consume queues or the index
(the dispatcher's), runs a thread its owner did not start, or moves a position back.

The seam for replication: an acknowledgement waits for the least of the named positions it
needs to cover its end, never for "flushed" as such. FLUSHED, advanced after each flush, is the
one this module keeps; SYNC_ACK_POSITIONS names it. The store writer adds REPLICATED (the slaves'
acknowledged offset, from the HA service) under SYNC_MASTER and releases each ack once the least
of its positions covers it (server/roles/store_writer.py). RocketMQ waits for the flush and then
for the slave's GroupTransferService, one after the other; the least of the two positions is the
same condition, checked once.

Threads: the flush itself runs outside every lock here, with the GIL released (CommitLog.flush
calls msync through ctypes), so the writer keeps appending; one condition guards the requested
end and the positions.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Final

from mqbox.errors import MqboxError
from mqbox.store.commit_log import CommitLog, populate_write
from mqbox.store.mapped_file import PAGE_SIZE_BYTES

log = logging.getLogger("mqbox.store.flush")

FLUSHED: Final = "flushed"  # every commit-log byte below it is durable (msync'd)
SYNC_ACK_POSITIONS: Final = (FLUSHED,)  # what a SYNC_FLUSH acknowledgement waits to cover it
FLUSH_INTERVAL_MS_DEFAULT: Final = 500  # flushIntervalCommitLog
FLUSH_ERROR_RETRY_S: Final = 0.1


class DurablePositions:
    """Named commit-log positions that only grow, and the threads waiting for them.

    `advance` moves one and wakes the waiters; a waiter names the positions its acknowledgement
    needs and is released once the least of them covers its end (module docstring: the
    replication seam).
    """

    def __init__(self, initial_log_offsets_bytes: Mapping[str, int]) -> None:
        assert initial_log_offsets_bytes
        assert all(offset_bytes >= 0 for offset_bytes in initial_log_offsets_bytes.values())
        self._log_offsets_bytes = dict(initial_log_offsets_bytes)
        self._condition = threading.Condition()

    def position(self, name: str) -> int:
        """The log offset position `name` has reached."""
        return self._log_offsets_bytes[name]

    def advance(self, name: str, log_offset_bytes: int) -> None:
        """Move position `name` up to `log_offset_bytes` (never back) and wake the waiters."""
        with self._condition:
            if log_offset_bytes > self._log_offsets_bytes[name]:
                self._log_offsets_bytes[name] = log_offset_bytes
                self._condition.notify_all()

    def covered_log_offset_bytes(self, names: Sequence[str]) -> int:
        """The least of the named positions: every byte below it is covered by all of them."""
        assert names
        offsets_bytes = self._log_offsets_bytes
        return min(offsets_bytes[name] for name in names)

    def wait_covered(
        self, end_log_offset_bytes: int, names: Sequence[str], timeout_s: float
    ) -> bool:
        """Block until every named position covers `end_log_offset_bytes`; False on timeout."""
        assert timeout_s >= 0
        deadline_ns = time.monotonic_ns() + int(timeout_s * 1e9)
        with self._condition:
            while self.covered_log_offset_bytes(names) < end_log_offset_bytes:
                remaining_ns = deadline_ns - time.monotonic_ns()
                if remaining_ns <= 0:
                    return False
                self._condition.wait(remaining_ns / 1e9)
        return True


@dataclasses.dataclass(frozen=True)
class FlushStatistics:
    """Counters of a FlushService since it was made."""

    flush_total: int  # flushes that returned (whether or not there was anything new)
    error_total: int  # flushes that raised; the thread retries
    waiter_total: int  # wait_flushed calls that had to wait
    waiting_count: int  # threads in wait_flushed now
    timeout_total: int  # wait_flushed calls that timed out


class FlushService:
    """The flush thread of one writable CommitLog (module docstring).

    `sync` picks the schedule: SYNC_FLUSH flushes when `request` or `wait_flushed` asks for more
    than is flushed; ASYNC_FLUSH every `interval_ms` while something is unflushed. After each
    flush, in the thread that ran it, FLUSHED advances and `on_flushed(flushed log offset,
    flushed store time)` runs, if set (the store writer sets it before `start()`).

    ASYNC_FLUSH's contract with the writer: after it appends, it calls `note_written()`; a
    thread that found every byte flushed sleeps until then, and the first flush after it comes
    one interval later, so a record is durable within an interval of its append either way.
    """

    def __init__(
        self,
        commit_log: CommitLog,
        *,
        sync: bool,
        interval_ms: int = FLUSH_INTERVAL_MS_DEFAULT,
        on_flushed: Callable[[int, int], None] | None = None,
    ) -> None:
        assert commit_log.writable
        assert interval_ms > 0
        self._commit_log = commit_log
        self.sync = sync
        self._interval_s = interval_ms / 1000
        self.on_flushed = on_flushed
        self.positions = DurablePositions({FLUSHED: commit_log.flushed_log_offset_bytes})
        self._condition = threading.Condition()
        self._requested_log_offset_bytes = 0
        self._stopping = False
        self._idle = False  # ASYNC_FLUSH: the thread sleeps until note_written
        self._thread: threading.Thread | None = None
        self._flush_total = 0
        self._error_total = 0
        self._waiter_total = 0
        self._waiting_count = 0
        self._timeout_total = 0
        self.last_flush_duration_ns = 0  # how long the last flush_now took

    # -- asking for a flush ----------------------------------------------------------------------

    def request(self, end_log_offset_bytes: int) -> None:
        """SYNC_FLUSH: ask for a flush that covers `end_log_offset_bytes`; returns at once."""
        with self._condition:
            if end_log_offset_bytes > self._requested_log_offset_bytes:
                self._requested_log_offset_bytes = end_log_offset_bytes
                self._condition.notify_all()

    def note_written(self) -> None:
        """ASYNC_FLUSH: the writer appended; wakes the thread if it sleeps with nothing to flush.

        Check-after-set, under the GIL's sequential order: the thread sets `_idle` and then
        looks at the write position, the writer moves the write position and then looks at
        `_idle`, so one of the two sees the other's store. One attribute read per call while
        the thread is awake."""
        if self._idle:
            with self._condition:
                if self._idle:
                    self._idle = False
                    self._condition.notify_all()

    def wait_flushed(self, end_log_offset_bytes: int, timeout_s: float) -> bool:
        """Ask for a flush that covers `end_log_offset_bytes` and block until one did; False on
        timeout (RocketMQ answers FLUSH_DISK_TIMEOUT then)."""
        if self.positions.position(FLUSHED) >= end_log_offset_bytes:
            return True
        with self._condition:
            self._waiter_total += 1
            self._waiting_count += 1
        covered = False
        try:
            self.request(end_log_offset_bytes)
            covered = self.positions.wait_covered(end_log_offset_bytes, (FLUSHED,), timeout_s)
        finally:
            with self._condition:
                self._waiting_count -= 1
                self._timeout_total += 0 if covered else 1
        return covered

    # -- flushing ----------------------------------------------------------------------------------

    def flush_now(self) -> int:
        """Flush in the calling thread; return the flushed log offset. Raises what
        CommitLog.flush raises (the thread retries; a caller at the stop lets it through)."""
        started_ns = time.monotonic_ns()
        flushed_bytes = self._commit_log.flush()
        # Read by on_flushed (the broker's flush-latency histogram), in this same thread.
        self.last_flush_duration_ns = time.monotonic_ns() - started_ns
        self.positions.advance(FLUSHED, flushed_bytes)
        with self._condition:
            self._flush_total += 1
        if self.on_flushed is not None:
            self.on_flushed(flushed_bytes, self._commit_log.flushed_store_timestamp_ms)
        return flushed_bytes

    def flush_once(self) -> int:
        """One group-commit round in the calling thread: flush if a request is not covered yet;
        return the flushed log offset."""
        with self._condition:
            needed = self._requested_log_offset_bytes > self.positions.position(FLUSHED)
        if not needed:
            return self.positions.position(FLUSHED)
        return self.flush_now()

    # -- the thread --------------------------------------------------------------------------------

    def start(self) -> None:
        """Run the flush thread (a daemon) until `stop()`."""
        assert self._thread is None
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="mqbox-flush", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the flush thread; no last flush (the owner's close flushes)."""
        thread = self._thread
        if thread is None:
            return
        with self._condition:
            self._stopping = True
            self._idle = False
            self._condition.notify_all()
        thread.join()
        self._thread = None

    def _run(self) -> None:
        while True:
            with self._condition:
                if self.sync:
                    while (
                        not self._stopping
                        and self._requested_log_offset_bytes <= self.positions.position(FLUSHED)
                    ):
                        self._condition.wait()
                elif not self._stopping:
                    self._idle = True
                    commit_log = self._commit_log
                    if commit_log.write_log_offset_bytes <= commit_log.flushed_log_offset_bytes:
                        while self._idle and not self._stopping:
                            self._condition.wait()
                    self._idle = False
                    if not self._stopping:
                        self._condition.wait(self._interval_s)
                if self._stopping:
                    return
            try:
                self.flush_now()
            except (MqboxError, OSError):
                # The disk refused (full, failing): keep the waiters waiting and try again;
                # they time out by their own deadlines.
                with self._condition:
                    self._error_total += 1
                log.exception("flushing the commit log failed; retrying")
                time.sleep(FLUSH_ERROR_RETRY_S)

    @property
    def waiting_count(self) -> int:
        """How many threads wait in wait_flushed right now."""
        return self._waiting_count

    def statistics(self) -> FlushStatistics:
        """Counters since creation."""
        with self._condition:
            return FlushStatistics(
                flush_total=self._flush_total,
                error_total=self._error_total,
                waiter_total=self._waiter_total,
                waiting_count=self._waiting_count,
                timeout_total=self._timeout_total,
            )


# --- Page warming -------------------------------------------------------------------------------


class SegmentWarmer:
    """Faults in the writer's segment pages ahead of the write position, in another thread.

    The first write to a page of a fresh file mapping costs a page fault that allocates and
    zeroes a page-cache page (measured here: 0.3 to 3 GB/s, far below memcpy). RocketMQ warms a
    new segment when it allocates it (warmMapedFileEnable). Here a daemon thread keeps up to
    `lead_bytes` past the write position populated with MADV_POPULATE_WRITE, which leaves the
    data as it is, and which runs without the GIL, so the fault cost moves to another core.
    Best effort: if the kernel refuses, the writer simply faults its pages itself.
    """

    def __init__(
        self,
        commit_log: CommitLog,
        *,
        lead_bytes: int = 256 * 1024 * 1024,
        chunk_bytes: int = 4 * 1024 * 1024,
        poll_interval_s: float = 0.001,
    ):
        assert chunk_bytes % PAGE_SIZE_BYTES == 0
        assert lead_bytes >= chunk_bytes
        self._commit_log = commit_log
        self.lead_bytes = lead_bytes
        self.chunk_bytes = chunk_bytes
        self.poll_interval_s = poll_interval_s
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.warmed_bytes_total = 0
        self.refused_total = 0

    def start(self) -> None:
        """Start the warming thread."""
        assert self._thread is None
        self._stopping.clear()
        self._thread = threading.Thread(target=self._run, name="mqbox-warmer", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the warming thread and wait for it."""
        if self._thread is None:
            return
        self._stopping.set()
        self._thread.join()
        self._thread = None

    def _run(self) -> None:
        commit_log = self._commit_log
        segment_size_bytes = commit_log.segment_size_bytes
        warmed_segment_start_bytes = -1
        warmed_end_bytes = 0
        while not self._stopping.is_set():
            position_bytes = commit_log.write_log_offset_bytes
            segment_start_bytes = position_bytes - position_bytes % segment_size_bytes
            buffer = commit_log.segment_view_if_mapped(segment_start_bytes)
            if buffer is None:
                self._stopping.wait(self.poll_interval_s)
                continue
            if segment_start_bytes != warmed_segment_start_bytes:
                warmed_segment_start_bytes = segment_start_bytes
                warmed_end_bytes = position_bytes - segment_start_bytes
            file_offset_bytes = position_bytes - segment_start_bytes
            target_bytes = min(file_offset_bytes + self.lead_bytes, segment_size_bytes)
            warmed_end_bytes = max(warmed_end_bytes, file_offset_bytes)
            if warmed_end_bytes >= target_bytes:
                self._stopping.wait(self.poll_interval_s)
                continue
            chunk_end_bytes = min(warmed_end_bytes + self.chunk_bytes, target_bytes)
            if populate_write(buffer, warmed_end_bytes, chunk_end_bytes):
                self.warmed_bytes_total += chunk_end_bytes - warmed_end_bytes
            else:
                self.refused_total += 1
            warmed_end_bytes = chunk_end_bytes
