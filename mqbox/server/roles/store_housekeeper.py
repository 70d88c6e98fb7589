"""The store writer's housekeeping thread: commit-log retention and the checkpoint.

Owns, inside the store writer process: the thread that runs cleanup.CommitLogRetention every
cleanResourceInterval ms (RocketMQ's CleanCommitLogService schedule) and publishes the commit
log's new minimum (queue_counters.StorePositions) UNLINK_GRACE_MS before each unlink; and the
checkpoint file, which it alone writes while the broker runs, every flushIntervalConsumeQueue ms,
with the store writer's final write at the stop (`write_checkpoint`).

Never: appends, flushes the commit log (the flush thread does), deletes a consume-queue or index
file (the dispatcher follows the published minimum and deletes those), or blocks the writer's
main loop: the unlinks happen outside the commit log's lock (CommitLog.delete_segments_below).

The checkpoint's one owner. Its three store times come from three places, each published only
after the flush it describes returned: physic from this process's commit log
(`flushed_store_timestamp_ms`, set by the flush thread after its msync); logics and index from
the dispatcher (QueueCounters.publish_logics_flushed and publish_index_flushed, each after its
own flush; the index's comes far less often, so its position and time lag). So every checkpoint
this thread writes claims only durable data, which is all that recovery's unclean path needs of
it (recovery.py, point 3). One writer means no lost update between two processes replacing the
same file, and the store writer, which stops last (reverse START_ORDER), writes the final
checkpoint after the dispatcher's final flush.

A bug in the thread (anything but an operating error) ends the process with EXIT_BUG after
logging it: the supervisor then stops the broker and leaves `abort` for recovery, as for any
dead critical role; a thread that died quietly would stop retention and checkpoints unseen.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Final

from mqbox.clock import wall_clock_ms
from mqbox.errors import ConfigError, MqboxError
from mqbox.server.queue_counters import QueueCounters, StorePositions
from mqbox.store.checkpoint import Checkpoint
from mqbox.store.cleanup import (
    TRIGGER_DISK,
    CommitLogRetention,
    DiskUsage,
    RetentionConfig,
    disk_used_ratio,
)
from mqbox.store.commit_log import CommitLog

log = logging.getLogger("mqbox.store_housekeeper")

EXIT_BUG: Final = 70  # EX_SOFTWARE, as the supervisor's EXIT_ROLE_BUG
ERROR_RETRY_MS: Final = 1000
# Between publishing a new minimum and unlinking the segment below it. Readers elsewhere take the
# published minimum on every pull and look for deleted files at least every 100 ms
# (MessageStoreReader), and a reply planned just before the publish may still be on its way to
# the reactor's sendfile: the wait lets both see the minimum before the file is gone.
UNLINK_GRACE_MS: Final = 250


@dataclasses.dataclass(frozen=True, slots=True)
class HousekeeperStatistics:
    retention_runs: int
    segments_deleted: int
    checkpoint_writes: int
    errors: int
    min_log_offset_bytes: int


class StoreHousekeeper:
    """Retention of the commit log and the checkpoint, for one store writer (module docstring).

    `start()` runs `run_once()` in a thread; tests call `run_once()` themselves.
    """

    def __init__(
        self,
        store_root: Path,
        commit_log: CommitLog,
        checkpoint: Checkpoint,
        positions: StorePositions,
        counters_name: str,
        retention_config: RetentionConfig,
        checkpoint_interval_ms: int,
        *,
        disk_usage: DiskUsage = disk_used_ratio,
        timezone: datetime.tzinfo | None = None,
        clock_ms: Callable[[], int] = wall_clock_ms,
        unlink_grace_ms: int = UNLINK_GRACE_MS,
    ) -> None:
        """`counters_name` is the dispatcher's QueueCounters segment, attached once it exists
        (the dispatcher starts after the store writer). `unlink_grace_ms`: how long a published
        minimum stands before the segment below it is unlinked (the stop cuts it short)."""
        assert unlink_grace_ms >= 0
        self._unlink_grace_ms = unlink_grace_ms
        assert commit_log.writable
        assert checkpoint_interval_ms > 0
        self._commit_log = commit_log
        self.checkpoint = checkpoint
        self._positions = positions
        self._counters_name = counters_name
        self._counters: QueueCounters | None = None
        self._checkpoint_interval_ms = checkpoint_interval_ms
        self._retention_interval_ms = retention_config.clean_resource_interval_ms
        self._clock_ms = clock_ms
        self.retention = CommitLogRetention(
            store_root,
            commit_log,
            retention_config,
            dispatched_log_offset_bytes=self._dispatched_log_offset_bytes,
            disk_usage=disk_usage,
            timezone=timezone,
            on_min_log_offset_moving=self._publish_min_log_offset,
        )
        self._min_log_offset_bytes = commit_log.min_log_offset_bytes
        self._published_deletion_total = 0
        positions.publish_min_log_offset(self._min_log_offset_bytes, 0)
        self._retention_due_ms = 0
        self._checkpoint_due_ms = 0
        self._condition = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._retention_runs = 0
        self._checkpoint_writes = 0
        self._errors = 0

    # -- the thread -------------------------------------------------------------------------------

    def start(self) -> None:
        assert self._thread is None
        self._thread = threading.Thread(target=self._run, name="mqbox-housekeeping", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread (after the round it is in); the caller writes the last checkpoint."""
        thread = self._thread
        if thread is None:
            return
        with self._condition:
            self._stopping = True
            self._condition.notify()
        thread.join()
        self._thread = None

    def _run(self) -> None:
        try:
            while True:
                wait_ms = self.run_once()
                with self._condition:
                    if not self._stopping:
                        self._condition.wait(wait_ms / 1000)
                    if self._stopping:
                        return
        except BaseException:
            log.exception("the housekeeping thread met a bug; the store writer exits")
            logging.shutdown()
            os._exit(EXIT_BUG)

    # -- one round --------------------------------------------------------------------------------

    def run_once(self, now_ms: int | None = None) -> int:
        """Run retention and write the checkpoint if they are due at wall-clock `now_ms`;
        return the ms until the next is due. Operating errors (a full or failing disk) are
        logged and retried after ERROR_RETRY_MS."""
        if now_ms is None:
            now_ms = self._clock_ms()
        if now_ms >= self._retention_due_ms:
            self._retention_due_ms = now_ms + self._retention_interval_ms
            try:
                self.run_retention(now_ms)
            except (MqboxError, OSError):
                self._errors += 1
                log.exception("retention failed; retrying")
                self._retention_due_ms = now_ms + ERROR_RETRY_MS
        if now_ms >= self._checkpoint_due_ms:
            self._checkpoint_due_ms = now_ms + self._checkpoint_interval_ms
            try:
                self.write_checkpoint()
            except (MqboxError, OSError):
                self._errors += 1
                log.exception("writing the checkpoint failed; retrying")
                self._checkpoint_due_ms = now_ms + ERROR_RETRY_MS
        return max(1, min(self._retention_due_ms, self._checkpoint_due_ms) - now_ms)

    def run_retention(self, now_ms: int) -> int:
        """One run of the commit-log half of retention now; the segments it deleted."""
        trigger, used_ratio, deleted_count = self.retention.delete_segments(now_ms)
        self._retention_runs += 1
        if deleted_count > 0:
            log.info(
                "retention (%s, disk %.1f%% used): %d segment(s) deleted, minimum now %d",
                trigger,
                used_ratio * 100,
                deleted_count,
                self._commit_log.min_log_offset_bytes,
            )
        elif trigger == TRIGGER_DISK:
            # RocketMQ's "disk space will be full soon, but delete file failed".
            log.warning(
                "disk %.1f%% used, over diskMaxUsedSpaceRatio, and no segment may go yet",
                used_ratio * 100,
            )
        return deleted_count

    def write_checkpoint(self) -> bool:
        """Take the newest durable positions and store times (module docstring) and write the
        checkpoint if one changed; True if written."""
        physic_bytes = self._commit_log.flushed_log_offset_bytes
        physic_ms = self._commit_log.flushed_store_timestamp_ms
        counters = self._attached_counters()
        logics_ms = counters.logics_flushed_timestamp_ms if counters is not None else 0
        index_ms = counters.index_flushed_timestamp_ms if counters is not None else 0
        logics_bytes = counters.logics_flushed_log_offset_bytes if counters is not None else 0
        index_bytes = counters.index_flushed_log_offset_bytes if counters is not None else 0
        self.checkpoint.update(
            physic_msg_timestamp_ms=physic_ms if physic_ms > 0 else None,
            logics_msg_timestamp_ms=logics_ms if logics_ms > 0 else None,
            index_msg_timestamp_ms=index_ms if index_ms > 0 else None,
            physic_log_offset_bytes=physic_bytes,
            logics_log_offset_bytes=logics_bytes,
            index_log_offset_bytes=index_bytes,
        )
        written = self.checkpoint.flush()
        if written:
            self._checkpoint_writes += 1
        return written

    # -- helpers ----------------------------------------------------------------------------------

    def _attached_counters(self) -> QueueCounters | None:
        if self._counters is None:
            with contextlib.suppress(FileNotFoundError, ConfigError):
                self._counters = QueueCounters.attach(self._counters_name)
        return self._counters

    def _dispatched_log_offset_bytes(self) -> int:
        """The dispatcher's position; 0 (nothing deletable) until its counters exist."""
        counters = self._attached_counters()
        return 0 if counters is None else counters.dispatched_log_offset_bytes

    def _publish_min_log_offset(self, min_log_offset_bytes: int) -> None:
        assert min_log_offset_bytes > self._min_log_offset_bytes
        self._min_log_offset_bytes = min_log_offset_bytes
        self._published_deletion_total += 1
        self._positions.publish_min_log_offset(min_log_offset_bytes, self._published_deletion_total)
        if self._unlink_grace_ms:
            with self._condition:
                self._condition.wait_for(lambda: self._stopping, self._unlink_grace_ms / 1000)

    def close(self) -> None:
        """Stop the thread and release the counters' map (the store writer's close)."""
        self.stop()
        if self._counters is not None:
            self._counters.close()
            self._counters = None

    def statistics(self) -> HousekeeperStatistics:
        return HousekeeperStatistics(
            retention_runs=self._retention_runs,
            segments_deleted=self.retention.deleted_total,
            checkpoint_writes=self._checkpoint_writes,
            errors=self._errors,
            min_log_offset_bytes=self._min_log_offset_bytes,
        )
