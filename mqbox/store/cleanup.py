"""Retention and disk guard: delete old commit-log segments and what points into them; refuse
writes on a nearly full disk.

Owns: the retention decision (RocketMQ's CleanCommitLogService, CleanConsumeQueueService and the
index part of them) in two halves, `CommitLogRetention` (which commit-log segments go, and when)
and `DerivedRetention` (the consume-queue segments and index files below the commit log's new
minimum), joined by `RetentionService` for a store that runs in one process; the disk-usage
measure (`disk_used_ratio`, injectable everywhere so tests fake a full disk); and the cheap,
cached write guard `DiskSpaceGuard`. Never: deletes the segment being written, one holding
unflushed bytes or one the dispatcher has not read to its end; touches records; or decides
anything about a single message.

Where it runs. Each half runs in the process that owns the files it deletes. In the appliance the
store writer (the commit log's only owner) runs `CommitLogRetention.delete_segments` every
cleanResourceInterval ms in its housekeeping thread (server/roles/store_housekeeper.py) and
publishes the new minimum in shared memory before each unlink; the dispatcher (owner of the
consume queues and the index) reads that minimum and runs `DerivedRetention.delete_below`. In the
one-process MessageStore, `RetentionService.run_once` runs both, in that order.

Rules (RocketMQ 4.x keys; defaults from BrokerConfig):
- Age. A segment is as old as its newest record. Finding that record would mean scanning the
  segment, so the age used is the store time of the first record of the *next* segment: the
  writer appends that record right after the last one of this segment, so its time bounds the
  newest record here from above, and deleting on it is never early. The segment being written
  has no next segment, so it never ages out. A segment whose next one holds no readable first
  record falls back to its file's mtime (RocketMQ uses mtime for every file; a copied store
  resets mtimes, store times survive the copy).
- Time (fileReservedTime, 72 h; deleteWhen, "04", ';'-separated hours of the local day): at a
  deleteWhen hour, segments older than now - fileReservedTime are deleted, oldest first, at most
  `delete_segment_count_max` (10, RocketMQ's DELETE_FILES_BATCH_MAX) per run. fileReservedTime=0
  with every hour in deleteWhen deletes each segment once the writer has rolled past it (the
  integration test does that; RocketMQ's keys need nothing more).
- Space (diskMaxUsedSpaceRatio, 75 %): while the store's file system is fuller than that, the
  expired segments go at once, whatever the hour (RocketMQ's isSpaceToDelete). Above the force
  ratio (RocketMQ's diskSpaceCleanForciblyRatio, 85 % by default) and with
  cleanFileForciblyEnable (true), the oldest segments go whatever their age. Usage is measured
  again after each deletion; a run that only the disk started stops once usage is back at or
  below diskMaxUsedSpaceRatio (RocketMQ measures once a run and deletes the whole batch).
- Writes are refused (DiskFullError, answered SERVICE_NOT_AVAILABLE 14 as RocketMQ does) above
  the refuse ratio: diskMaxUsedSpaceRatio + 10 %, at least 90 % (RocketMQ's
  diskSpaceWarningLevelRatio) and at most 97 %, leaving the flush and the consume queues room
  to finish what was accepted. The force ratio is the refuse ratio - 5 %, at least
  diskMaxUsedSpaceRatio: 75 / 85 / 90 with the defaults, RocketMQ's three levels.
- Used ratio = 1 - available / total of shutil.disk_usage(store root): space reserved for root
  counts as used, as it is for the broker's user.
- After the commit log's minimum moved, consume-queue segments whose every entry points below it
  are deleted (never a queue's last segment) and each queue's min_queue_index moves to the first
  entry still in the log, so a PULL below it gets OFFSET_TOO_SMALL ("offset moved", 21 with
  nextBeginOffset = the new minimum), never bytes of a deleted segment; index files whose newest
  key is below it are deleted (never the newest).

Readers in other processes: a reader that still maps a deleted segment (or holds its descriptor
for sendfile) keeps reading the old, valid bytes: Linux frees an unlinked file's blocks only
when its last map and descriptor go. MessageStoreReader notices the new minimum itself (it checks
that the oldest segment it knows still exists, at most every 100 ms, and at once when a file it
looks up is gone) or when told (`observe_commit_log_min`, the published minimum), drops its maps
of deleted segments, and answers reads below the minimum with "offset moved".
"""

from __future__ import annotations

import dataclasses
import datetime
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

from mqbox.config import BrokerConfig
from mqbox.errors import ConfigError, DiskFullError
from mqbox.store.commit_log import CommitLog
from mqbox.store.consume_queue import ConsumeQueueTable
from mqbox.store.index import IndexService
from mqbox.store.layout import segment_name
from mqbox.store.recovery import first_record_store_timestamp_ms

FILE_RESERVED_TIME_HOURS_DEFAULT: Final = 72
DELETE_WHEN_DEFAULT: Final = "04"
DISK_MAX_USED_SPACE_RATIO_PERCENT_DEFAULT: Final = 75
# RocketMQ's diskSpaceWarningLevelRatio: above it the broker refuses writes.
DISK_REFUSE_RATIO_PERCENT_MIN: Final = 90
DISK_REFUSE_RATIO_PERCENT_MAX: Final = 97
DISK_REFUSE_MARGIN_PERCENT: Final = 10
# RocketMQ's diskSpaceCleanForciblyRatio sits this far below the refuse ratio (85 below 90).
DISK_FORCE_MARGIN_PERCENT: Final = 5
# RocketMQ's DELETE_FILES_BATCH_MAX: segments one run deletes at most.
DELETE_SEGMENT_COUNT_MAX_DEFAULT: Final = 10
# RocketMQ's cleanResourceInterval: how often the store writer runs the commit-log half.
CLEAN_RESOURCE_INTERVAL_MS_DEFAULT: Final = 10_000
# How long check_disk_writable trusts one measurement.
DISK_CHECK_CACHE_NS_DEFAULT: Final = 1_000_000_000
HOUR_MS: Final = 3_600_000

TRIGGER_NONE: Final = "none"
TRIGGER_TIME: Final = "time"  # a deleteWhen hour
TRIGGER_DISK: Final = "disk"  # fuller than diskMaxUsedSpaceRatio

DiskUsage = Callable[[Path], float]
"""A function from a path to the used ratio (0.0 to 1.0) of the file system holding it."""


def disk_used_ratio(path: Path) -> float:
    """Used fraction of the file system holding `path`: 1 - available / total."""
    usage = shutil.disk_usage(path)
    if usage.total <= 0:
        return 1.0
    return 1.0 - usage.free / usage.total


def parse_delete_when(text: str) -> frozenset[int]:
    """The hours of deleteWhen ("04", "01;13"); ConfigError unless each is 0-23."""
    hours: set[int] = set()
    for item in text.split(";"):
        item = item.strip()
        if not item.isdigit() or not 0 <= int(item) <= 23:
            raise ConfigError(f"deleteWhen={text!r}: hours 00-23, ';'-separated")
        hours.add(int(item))
    return frozenset(hours)


def refuse_ratio_percent_for(disk_max_used_space_ratio_percent: int) -> int:
    """The used percentage above which writes are refused (the module docstring's rule)."""
    return min(
        max(
            disk_max_used_space_ratio_percent + DISK_REFUSE_MARGIN_PERCENT,
            DISK_REFUSE_RATIO_PERCENT_MIN,
        ),
        DISK_REFUSE_RATIO_PERCENT_MAX,
    )


def force_ratio_percent_for(disk_max_used_space_ratio_percent: int) -> int:
    """The used percentage above which segments go whatever their age (cleanFileForciblyEnable)."""
    return max(
        refuse_ratio_percent_for(disk_max_used_space_ratio_percent) - DISK_FORCE_MARGIN_PERCENT,
        disk_max_used_space_ratio_percent,
    )


@dataclasses.dataclass(frozen=True)
class RetentionConfig:
    """Retention settings; RocketMQ key in the comment."""

    file_reserved_time_hours: int = FILE_RESERVED_TIME_HOURS_DEFAULT  # fileReservedTime
    delete_when: str = DELETE_WHEN_DEFAULT  # deleteWhen
    disk_max_used_space_ratio_percent: int = DISK_MAX_USED_SPACE_RATIO_PERCENT_DEFAULT
    delete_segment_count_max: int = DELETE_SEGMENT_COUNT_MAX_DEFAULT
    clean_resource_interval_ms: int = CLEAN_RESOURCE_INTERVAL_MS_DEFAULT  # cleanResourceInterval
    clean_file_forcibly_enable: bool = True  # cleanFileForciblyEnable

    def __post_init__(self) -> None:
        if self.file_reserved_time_hours < 0:
            raise ConfigError(f"fileReservedTime must be >= 0: {self.file_reserved_time_hours}")
        parse_delete_when(self.delete_when)
        if not 1 <= self.disk_max_used_space_ratio_percent <= 99:
            raise ConfigError(
                f"diskMaxUsedSpaceRatio must be 1-99: {self.disk_max_used_space_ratio_percent}"
            )
        if self.delete_segment_count_max < 1:
            raise ConfigError("delete_segment_count_max must be >= 1")
        if self.clean_resource_interval_ms < 1:
            raise ConfigError(
                f"cleanResourceInterval must be >= 1: {self.clean_resource_interval_ms}"
            )

    @classmethod
    def from_broker_config(cls, broker: BrokerConfig) -> RetentionConfig:
        """The retention settings of a broker."""
        return cls(
            file_reserved_time_hours=broker.file_reserved_time_hours,
            delete_when=broker.delete_when,
            disk_max_used_space_ratio_percent=broker.disk_max_used_space_ratio_percent,
            clean_resource_interval_ms=broker.clean_resource_interval_ms,
            clean_file_forcibly_enable=broker.clean_file_forcibly_enable,
        )

    @property
    def delete_hours(self) -> frozenset[int]:
        """Hours of the day at which expired segments are deleted."""
        return parse_delete_when(self.delete_when)

    @property
    def refuse_ratio_percent(self) -> int:
        """Used percentage above which writes are refused."""
        return refuse_ratio_percent_for(self.disk_max_used_space_ratio_percent)

    @property
    def force_ratio_percent(self) -> int:
        """Used percentage above which segments go whatever their age."""
        return force_ratio_percent_for(self.disk_max_used_space_ratio_percent)


# ---------------------------------------------------------------------------------------------
# The write guard
# ---------------------------------------------------------------------------------------------


class DiskSpaceGuard:
    """Refuses writes while the store's file system is fuller than `refuse_ratio_percent`.

    One measurement (a statvfs, about a microsecond) is trusted for `cache_ns`, so the append
    path may ask before every batch. Thread-safe: a race measures twice, nothing worse.
    """

    def __init__(
        self,
        store_root: Path,
        refuse_ratio_percent: int = DISK_REFUSE_RATIO_PERCENT_MIN,
        *,
        disk_usage: DiskUsage = disk_used_ratio,
        cache_ns: int = DISK_CHECK_CACHE_NS_DEFAULT,
        clock_ns: Callable[[], int] = time.monotonic_ns,
    ):
        assert 0 < refuse_ratio_percent <= 100
        assert cache_ns >= 0
        self.store_root = store_root
        self.refuse_ratio_percent = refuse_ratio_percent
        self._disk_usage = disk_usage
        self._cache_ns = cache_ns
        self._clock_ns = clock_ns
        self._measured_at_ns = 0
        self._used_ratio = 0.0
        self._measured = False
        self.refused_total = 0

    def used_ratio(self) -> float:
        """The used ratio, measured at most once per `cache_ns`."""
        now_ns = self._clock_ns()
        if not self._measured or now_ns - self._measured_at_ns >= self._cache_ns:
            self._used_ratio = self._disk_usage(self.store_root)
            self._measured_at_ns = now_ns
            self._measured = True
        return self._used_ratio

    def is_writable(self) -> bool:
        """False while the disk is fuller than the refuse ratio."""
        return self.used_ratio() * 100 <= self.refuse_ratio_percent

    def check_writable(self) -> None:
        """Raise DiskFullError while the disk is fuller than the refuse ratio."""
        if self.is_writable():
            return
        self.refused_total += 1
        raise DiskFullError(
            f"disk of {self.store_root} is {self._used_ratio:.1%} full, over the "
            f"{self.refuse_ratio_percent}% at which writes are refused; retention deletes old "
            "segments, or free space on the disk"
        )


_GUARDS: dict[tuple[Path, int, DiskUsage], DiskSpaceGuard] = {}
_GUARDS_LOCK = threading.Lock()


def check_disk_writable(
    store_root: Path,
    refuse_ratio_percent: int = DISK_REFUSE_RATIO_PERCENT_MIN,
    *,
    disk_usage: DiskUsage = disk_used_ratio,
) -> None:
    """Raise DiskFullError if the disk holding `store_root` is fuller than the refuse ratio.

    The append path calls it before each batch; the answer is cached for about a second per
    (store root, ratio, measure), so the cost is a dict lookup and a clock read.
    """
    key = (store_root, refuse_ratio_percent, disk_usage)
    guard = _GUARDS.get(key)
    if guard is None:
        with _GUARDS_LOCK:
            guard = _GUARDS.setdefault(
                key, DiskSpaceGuard(store_root, refuse_ratio_percent, disk_usage=disk_usage)
            )
    guard.check_writable()


# ---------------------------------------------------------------------------------------------
# Retention
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class RetentionReport:
    """What one run of retention did."""

    trigger: str  # TRIGGER_NONE, TRIGGER_TIME or TRIGGER_DISK
    disk_used_ratio: float
    commit_log_segment_deleted_count: int
    cq_segment_deleted_count: int
    index_file_deleted_count: int
    min_log_offset_bytes: int  # the commit log's minimum after the run


@dataclasses.dataclass(frozen=True)
class RetentionStatistics:
    """Counters of a RetentionService since it was made."""

    run_total: int
    commit_log_segment_deleted_total: int
    cq_segment_deleted_total: int
    index_file_deleted_total: int
    disk_triggered_total: int


class CommitLogRetention:
    """The commit-log half (RocketMQ's CleanCommitLogService): which segments go, and when.

    Runs where the writable CommitLog lives (the store writer); not thread-safe, one caller.
    """

    def __init__(
        self,
        store_root: Path,
        commit_log: CommitLog,
        config: RetentionConfig | None = None,
        *,
        dispatched_log_offset_bytes: Callable[[], int],
        disk_usage: DiskUsage = disk_used_ratio,
        timezone: datetime.tzinfo | None = None,
        on_min_log_offset_moving: Callable[[int], None] | None = None,
    ):
        """`dispatched_log_offset_bytes` gives the dispatcher's position (a segment it has not
        dispatched to its end is never deleted); `timezone` gives the deleteWhen hours, None
        being the host's local time (RocketMQ's); `on_min_log_offset_moving(new_min)` is called
        just before each segment is unlinked (the appliance publishes the minimum there, so
        readers stop planning reads in a segment before it goes)."""
        assert commit_log.writable
        self.store_root = store_root
        self.config = config or RetentionConfig()
        self._commit_log = commit_log
        self._dispatched_log_offset_bytes = dispatched_log_offset_bytes
        self._disk_usage = disk_usage
        self._timezone = timezone
        self._on_min_log_offset_moving = on_min_log_offset_moving
        self._delete_hours = self.config.delete_hours
        self.deleted_total = 0
        self.disk_triggered_total = 0

    def is_delete_hour(self, now_ms: int) -> bool:
        """True when `now_ms` falls in one of the deleteWhen hours."""
        moment = datetime.datetime.fromtimestamp(now_ms / 1000, tz=self._timezone)
        return moment.hour in self._delete_hours

    def segment_age_timestamp_ms(self, segment_start_bytes: int) -> int | None:
        """When the segment's newest record was stored, bounded from above (module docstring);
        None for the last segment, which never ages out."""
        starts_bytes = self._commit_log.segment_starts_bytes
        next_start_bytes = segment_start_bytes + self._commit_log.segment_size_bytes
        if not starts_bytes or next_start_bytes > starts_bytes[-1]:
            return None
        timestamp_ms = first_record_store_timestamp_ms(self._commit_log, next_start_bytes)
        if timestamp_ms is not None:
            return timestamp_ms
        path = self._commit_log.directory / segment_name(segment_start_bytes)
        try:
            return int(path.stat().st_mtime * 1000)
        except FileNotFoundError:
            return None

    def delete_segments(self, now_ms: int) -> tuple[str, float, int]:
        """Delete the segments the rules allow at wall-clock time `now_ms`; (trigger, used
        ratio, segments deleted)."""
        config = self.config
        used_ratio = self._disk_usage(self.store_root)
        over_ratio = used_ratio * 100 > config.disk_max_used_space_ratio_percent
        delete_hour = self.is_delete_hour(now_ms)
        if over_ratio:
            self.disk_triggered_total += 1
            trigger = TRIGGER_DISK
        elif delete_hour:
            trigger = TRIGGER_TIME
        else:
            return TRIGGER_NONE, used_ratio, 0
        expire_before_ms = now_ms - config.file_reserved_time_hours * HOUR_MS
        commit_log = self._commit_log
        segment_size_bytes = commit_log.segment_size_bytes
        deleted_count = 0
        while deleted_count < config.delete_segment_count_max:
            starts_bytes = commit_log.segment_starts_bytes
            if len(starts_bytes) <= 1:
                break  # the segment being written stays
            oldest_end_bytes = starts_bytes[0] + segment_size_bytes
            if oldest_end_bytes > self._dispatched_log_offset_bytes():
                break  # the dispatcher still reads it
            if oldest_end_bytes > commit_log.deletable_end_log_offset_bytes:
                break  # it holds bytes not flushed yet
            forced = (
                config.clean_file_forcibly_enable and used_ratio * 100 > config.force_ratio_percent
            )
            if not forced:
                age_ms = self.segment_age_timestamp_ms(starts_bytes[0])
                if age_ms is None or age_ms >= expire_before_ms:
                    break  # segments age in order: the next one is younger still
            if self._on_min_log_offset_moving is not None:
                self._on_min_log_offset_moving(oldest_end_bytes)
            deleted = commit_log.delete_segments_below(oldest_end_bytes)
            assert deleted == 1, f"segment {starts_bytes[0]} was deletable, {deleted} went"
            deleted_count += 1
            if over_ratio:
                used_ratio = self._disk_usage(self.store_root)
                if not delete_hour and used_ratio * 100 <= config.disk_max_used_space_ratio_percent:
                    break
        self.deleted_total += deleted_count
        return trigger, used_ratio, deleted_count


class DerivedRetention:
    """The consume-queue and index half (RocketMQ's CleanConsumeQueueService): follow the
    commit log's minimum. Runs where the writable consume queues and index live (the
    dispatcher); one caller."""

    def __init__(
        self,
        consume_queues: ConsumeQueueTable,
        index: IndexService,
        *,
        min_log_offset_bytes: int = -1,
        on_min_log_offset_moved: Callable[[int], None] | None = None,
    ):
        """`min_log_offset_bytes`: a minimum the files already follow (delete_below does
        nothing up to it)."""
        assert consume_queues.writable
        assert index.writable
        self._consume_queues = consume_queues
        self._index = index
        self._on_min_log_offset_moved = on_min_log_offset_moved
        self.min_log_offset_bytes = min_log_offset_bytes  # what the files last followed
        self.cq_segment_deleted_total = 0
        self.index_file_deleted_total = 0

    def delete_below(self, min_log_offset_bytes: int) -> tuple[int, int]:
        """Delete consume-queue segments and index files below the commit log's minimum and
        move each queue's min_queue_index; (queue segments, index files) deleted. Does nothing
        while the minimum has not moved since the last call."""
        if min_log_offset_bytes <= self.min_log_offset_bytes:
            return 0, 0
        cq_deleted_count = self._consume_queues.delete_below_log_offset(min_log_offset_bytes)
        index_deleted_count = self._index.delete_below_log_offset(min_log_offset_bytes)
        self.min_log_offset_bytes = min_log_offset_bytes
        self.cq_segment_deleted_total += cq_deleted_count
        self.index_file_deleted_total += index_deleted_count
        if self._on_min_log_offset_moved is not None:
            self._on_min_log_offset_moved(min_log_offset_bytes)
        return cq_deleted_count, index_deleted_count


class RetentionService:
    """Both halves in one process (the one-process MessageStore): `run_once` deletes what
    retention allows, commit-log segments first, then what followed them."""

    def __init__(
        self,
        store_root: Path,
        commit_log: CommitLog,
        consume_queues: ConsumeQueueTable,
        index: IndexService,
        config: RetentionConfig | None = None,
        *,
        dispatched_log_offset_bytes: Callable[[], int],
        disk_usage: DiskUsage = disk_used_ratio,
        timezone: datetime.tzinfo | None = None,
        on_min_log_offset_moved: Callable[[int], None] | None = None,
    ):
        """The arguments of CommitLogRetention and DerivedRetention; `on_min_log_offset_moved`
        is called once the consume queues and the index follow a new minimum."""
        self.store_root = store_root
        self.config = config or RetentionConfig()
        self._commit_log = commit_log
        self.commit_log_retention = CommitLogRetention(
            store_root,
            commit_log,
            self.config,
            dispatched_log_offset_bytes=dispatched_log_offset_bytes,
            disk_usage=disk_usage,
            timezone=timezone,
        )
        self.derived_retention = DerivedRetention(
            consume_queues, index, on_min_log_offset_moved=on_min_log_offset_moved
        )
        self._run_total = 0

    def run_once(self, now_ms: int) -> RetentionReport:
        """One round at wall-clock time `now_ms`: commit-log segments, then what follows them."""
        trigger, used_ratio, deleted_count = self.commit_log_retention.delete_segments(now_ms)
        min_log_offset_bytes = self._commit_log.min_log_offset_bytes
        cq_deleted_count, index_deleted_count = self.derived_retention.delete_below(
            min_log_offset_bytes
        )
        self._run_total += 1
        return RetentionReport(
            trigger=trigger,
            disk_used_ratio=used_ratio,
            commit_log_segment_deleted_count=deleted_count,
            cq_segment_deleted_count=cq_deleted_count,
            index_file_deleted_count=index_deleted_count,
            min_log_offset_bytes=min_log_offset_bytes,
        )

    def is_delete_hour(self, now_ms: int) -> bool:
        """True when `now_ms` falls in one of the deleteWhen hours."""
        return self.commit_log_retention.is_delete_hour(now_ms)

    def segment_age_timestamp_ms(self, segment_start_bytes: int) -> int | None:
        """CommitLogRetention.segment_age_timestamp_ms."""
        return self.commit_log_retention.segment_age_timestamp_ms(segment_start_bytes)

    def delete_commit_log_segments(self, now_ms: int) -> tuple[str, float, int]:
        """CommitLogRetention.delete_segments."""
        return self.commit_log_retention.delete_segments(now_ms)

    def delete_derived_below(self, min_log_offset_bytes: int) -> tuple[int, int]:
        """DerivedRetention.delete_below."""
        return self.derived_retention.delete_below(min_log_offset_bytes)

    def statistics(self) -> RetentionStatistics:
        """Counters since creation."""
        return RetentionStatistics(
            run_total=self._run_total,
            commit_log_segment_deleted_total=self.commit_log_retention.deleted_total,
            cq_segment_deleted_total=self.derived_retention.cq_segment_deleted_total,
            index_file_deleted_total=self.derived_retention.index_file_deleted_total,
            disk_triggered_total=self.commit_log_retention.disk_triggered_total,
        )
