"""File names and byte layouts of the store: every constant, every box diagram, in one place.

Owns: the directory and file names under a store root, the 20-digit segment names and the
17-digit index file names (and their parse), the default sizes, the byte layouts of the
consume-queue entry, the index file and the checkpoint page (as offsets and numpy structured
dtypes), and `StoreGeometry`, the sizes one store runs with. Never: I/O, mmap, policy. Other
modules and documents point here instead of drawing a layout again (docs/style.md section 8).

Invariants, asserted at import: each dtype's itemsize equals its drawn size, each field sits
where its diagram puts it, and each default segment size is a whole number of entries. Every
integer on disk is big-endian, as RocketMQ's Java `ByteBuffer` writes it, so a RocketMQ operator's
tools read these files.

The layout mirrors RocketMQ 4.x (docs/protocol.md section 7):

    <store root>/
      commitlog/<20-digit log_offset_bytes of the segment's first byte>
      consumequeue/<topic>/<queue_id>/<20-digit byte offset of the segment's first entry>
      index/<yyyyMMddHHmmssSSS, the file's creation time>
      config/topics.json consumerOffset.json delayOffset.json subscriptionGroup.json (+ .bak)
      checkpoint
      abort          (exists while a broker runs; found at start, it means an unclean stop)
"""

from __future__ import annotations

import dataclasses
import datetime
import re
from pathlib import Path
from typing import Final

import numpy as np

from mqbox.errors import ConfigError

KiB: Final = 1 << 10
MiB: Final = 1 << 20
GiB: Final = 1 << 30
INT32_MAX: Final = (1 << 31) - 1
INT64_MAX: Final = (1 << 63) - 1

# ---------------------------------------------------------------------------------------------
# Names under the store root
# ---------------------------------------------------------------------------------------------

COMMIT_LOG_DIR_NAME: Final = "commitlog"
CONSUME_QUEUE_DIR_NAME: Final = "consumequeue"
INDEX_DIR_NAME: Final = "index"
CONFIG_DIR_NAME: Final = "config"
CHECKPOINT_FILE_NAME: Final = "checkpoint"
ABORT_FILE_NAME: Final = "abort"

TOPICS_FILE_NAME: Final = "topics.json"
CONSUMER_OFFSET_FILE_NAME: Final = "consumerOffset.json"
DELAY_OFFSET_FILE_NAME: Final = "delayOffset.json"
SUBSCRIPTION_GROUP_FILE_NAME: Final = "subscriptionGroup.json"

# Modes of what the store creates: readable by the broker's own user only (issue 9). The
# supervisor also sets the umask 077, which covers files made by libraries (logs, temp files).
FILE_MODE: Final = 0o600
DIRECTORY_MODE: Final = 0o700

# A file being replaced is first written beside its final name with this suffix; RocketMQ's
# ConfigManager also keeps the previous version under the backup suffix.
TEMP_SUFFIX: Final = ".tmp"
BACKUP_SUFFIX: Final = ".bak"


def commit_log_dir(store_root: Path) -> Path:
    """Directory of the commit-log segments."""
    return store_root / COMMIT_LOG_DIR_NAME


def consume_queue_root_dir(store_root: Path) -> Path:
    """Directory that holds one subdirectory per topic, each holding one per queue id."""
    return store_root / CONSUME_QUEUE_DIR_NAME


def consume_queue_dir(store_root: Path, topic: str, queue_id: int) -> Path:
    """Directory of the segments of one consume queue: consumequeue/<topic>/<queue_id>/."""
    assert is_safe_topic_dir_name(topic)
    assert queue_id >= 0
    return consume_queue_root_dir(store_root) / topic / str(queue_id)


def index_dir(store_root: Path) -> Path:
    """Directory of the index files."""
    return store_root / INDEX_DIR_NAME


def config_dir(store_root: Path) -> Path:
    """Directory of the JSON configuration files (topics, offsets, groups)."""
    return store_root / CONFIG_DIR_NAME


def checkpoint_path(store_root: Path) -> Path:
    """Path of the checkpoint page."""
    return store_root / CHECKPOINT_FILE_NAME


def abort_path(store_root: Path) -> Path:
    """Path of the abort marker."""
    return store_root / ABORT_FILE_NAME


def is_safe_topic_dir_name(topic: str) -> bool:
    """True when `topic` can name a directory without leaving consumequeue/.

    This is a path-safety check only. The processors validate topic names against RocketMQ's
    rules (characters, length) before anything reaches the store.
    """
    return topic not in ("", ".", "..") and "/" not in topic and "\0" not in topic


# ---------------------------------------------------------------------------------------------
# Segment names: 20 decimal digits, zero-padded, the absolute offset of the segment's first byte
# ---------------------------------------------------------------------------------------------

SEGMENT_NAME_DIGIT_COUNT: Final = 20
_SEGMENT_NAME = re.compile(r"[0-9]{20}")


def segment_name(start_offset_bytes: int) -> str:
    """File name of the segment whose first byte is at `start_offset_bytes` (absolute)."""
    assert start_offset_bytes >= 0
    assert start_offset_bytes <= INT64_MAX
    name = f"{start_offset_bytes:020d}"
    assert len(name) == SEGMENT_NAME_DIGIT_COUNT
    return name


def parse_segment_name(name: str) -> int | None:
    """Start offset (bytes) named by a segment file name, or None if `name` names no segment.

    Stray files (a temp file, an editor's backup) are not segments; callers skip them.
    """
    if _SEGMENT_NAME.fullmatch(name) is None:
        return None
    start_offset_bytes = int(name)
    if start_offset_bytes > INT64_MAX:
        return None
    return start_offset_bytes


# ---------------------------------------------------------------------------------------------
# Index file names: creation time as yyyyMMddHHmmssSSS
# ---------------------------------------------------------------------------------------------

INDEX_FILE_NAME_DIGIT_COUNT: Final = 17
_INDEX_FILE_NAME = re.compile(r"[0-9]{17}")

# RocketMQ formats the name in the JVM's local time zone. mqbox uses UTC: names then sort in
# creation order across daylight-saving changes, and the index service relies on that order.
_INDEX_NAME_ZONE: Final = datetime.UTC


def index_file_name(timestamp_ms: int) -> str:
    """Name of an index file created at `timestamp_ms` (ms since the epoch, UTC)."""
    assert timestamp_ms >= 0
    moment = datetime.datetime.fromtimestamp(timestamp_ms // 1000, tz=_INDEX_NAME_ZONE)
    name = f"{moment:%Y%m%d%H%M%S}{timestamp_ms % 1000:03d}"
    assert len(name) == INDEX_FILE_NAME_DIGIT_COUNT
    return name


def parse_index_file_name(name: str) -> int | None:
    """Creation time (ms since the epoch) named by an index file name, or None if not one."""
    if _INDEX_FILE_NAME.fullmatch(name) is None:
        return None
    try:
        moment = datetime.datetime.strptime(name[:14], "%Y%m%d%H%M%S").replace(
            tzinfo=_INDEX_NAME_ZONE
        )
    except ValueError:
        return None
    return int(moment.timestamp()) * 1000 + int(name[14:])


# ---------------------------------------------------------------------------------------------
# Commit log
# ---------------------------------------------------------------------------------------------

COMMIT_LOG_SEGMENT_SIZE_BYTES_DEFAULT: Final = 1 * GiB

# ---------------------------------------------------------------------------------------------
# Consume queue entry: 20 bytes, big-endian, no padding
#
#    0                   8           12                  20
#    +-------------------+-----------+-------------------+
#    | log_offset_bytes  | size_bytes| tag_hash          |
#    | int64             | int32     | int64             |
#    +-------------------+-----------+-------------------+
#
# log_offset_bytes: where the record starts in the commit log (RocketMQ's commitLogOffset).
# size_bytes: the record's size in the commit log; always > 0, so a written entry is never all
#   zero and a zero size marks "not written" (length recovery relies on this).
# tag_hash: Java String.hashCode(TAGS) sign-extended, 0 without tags; for SCHEDULE_TOPIC_XXXX
#   the delivery time in ms instead.
# Entry number n of a queue (its queue_index) sits at byte n * 20 of the queue's byte space;
# the segment holding it is named by the byte offset of its first entry.
# ---------------------------------------------------------------------------------------------

CQ_ENTRY_SIZE_BYTES: Final = 20
CQ_ENTRY_LOG_OFFSET_POSITION_BYTES: Final = 0
CQ_ENTRY_SIZE_POSITION_BYTES: Final = 8
CQ_ENTRY_TAG_HASH_POSITION_BYTES: Final = 12
CQ_SEGMENT_ENTRY_COUNT_DEFAULT: Final = 300_000
CQ_SEGMENT_SIZE_BYTES_DEFAULT: Final = CQ_SEGMENT_ENTRY_COUNT_DEFAULT * CQ_ENTRY_SIZE_BYTES

CQ_ENTRY_DTYPE: Final = np.dtype(
    [("log_offset_bytes", ">i8"), ("size_bytes", ">i4"), ("tag_hash", ">i8")]
)

# ---------------------------------------------------------------------------------------------
# Index file: header, hash slots, entries (RocketMQ's IndexFile)
#
#    0          40                      40 + 4 * slot_count            file end
#    +----------+-----------------------+---------------------------------+
#    | header   | slot[0 .. slot_count) | entry[0 .. entry_count_max)     |
#    | 40 bytes | int32 each            | 20 bytes each; entry 0 unused   |
#    +----------+-----------------------+---------------------------------+
#
# Header, 40 bytes:
#
#    0                 8                 16                24                32      36      40
#    +-----------------+-----------------+-----------------+-----------------+-------+-------+
#    | begin_timestamp | end_timestamp   | begin_log_offset| end_log_offset  | slots | index |
#    | _ms       int64 | _ms       int64 | _bytes    int64 | _bytes    int64 | _used | _count|
#    |                 |                 |                 |                 | int32 | int32 |
#    +-----------------+-----------------+-----------------+-----------------+-------+-------+
#
#   begin_*: the first entry's store timestamp and log offset; end_*: the newest entry's.
#   slots_used (RocketMQ's hashSlotCount): how many slots are non-empty, not the table size.
#   index_count: the number of the next entry to write; it starts at 1, so entry 0 is never
#   used and a slot value of 0 means "empty".
#
# Slot s holds the number of the newest entry whose key_hash % slot_count == s (0 = empty).
#
# Entry n, 20 bytes, at 40 + 4 * slot_count + 20 * n:
#
#    0          4                   12          16          20
#    +----------+-------------------+-----------+-----------+
#    | key_hash | log_offset_bytes  | time_diff | prev_index|
#    | int32    | int64             | _s  int32 | int32     |
#    +----------+-------------------+-----------+-----------+
#
#   key_hash: abs(String.hashCode(topic + "#" + key)), MIN_VALUE mapped to 0, so in [0, 2^31).
#   time_diff_s: whole seconds from begin_timestamp_ms to the entry's store timestamp.
#   prev_index: the entry that the slot held before this one (0 = end of chain); chains run
#   newest to oldest, so prev_index < n for every well-formed entry n.
# ---------------------------------------------------------------------------------------------

INDEX_HEADER_SIZE_BYTES: Final = 40
INDEX_HEADER_BEGIN_TIMESTAMP_POSITION_BYTES: Final = 0
INDEX_HEADER_END_TIMESTAMP_POSITION_BYTES: Final = 8
INDEX_HEADER_BEGIN_LOG_OFFSET_POSITION_BYTES: Final = 16
INDEX_HEADER_END_LOG_OFFSET_POSITION_BYTES: Final = 24
INDEX_HEADER_SLOTS_USED_POSITION_BYTES: Final = 32
INDEX_HEADER_INDEX_COUNT_POSITION_BYTES: Final = 36
INDEX_HEADER_DTYPE: Final = np.dtype(
    [
        ("begin_timestamp_ms", ">i8"),
        ("end_timestamp_ms", ">i8"),
        ("begin_log_offset_bytes", ">i8"),
        ("end_log_offset_bytes", ">i8"),
        ("slots_used", ">i4"),
        ("index_count", ">i4"),
    ]
)

INDEX_SLOT_SIZE_BYTES: Final = 4
INDEX_SLOT_EMPTY: Final = 0
INDEX_SLOT_COUNT_DEFAULT: Final = 5_000_000

INDEX_ENTRY_SIZE_BYTES: Final = 20
INDEX_ENTRY_KEY_HASH_POSITION_BYTES: Final = 0
INDEX_ENTRY_LOG_OFFSET_POSITION_BYTES: Final = 4
INDEX_ENTRY_TIME_DIFF_POSITION_BYTES: Final = 12
INDEX_ENTRY_PREV_INDEX_POSITION_BYTES: Final = 16
INDEX_ENTRY_COUNT_MAX_DEFAULT: Final = 20_000_000
INDEX_COUNT_INITIAL: Final = 1
INDEX_ENTRY_DTYPE: Final = np.dtype(
    [
        ("key_hash", ">i4"),
        ("log_offset_bytes", ">i8"),
        ("time_diff_s", ">i4"),
        ("prev_index", ">i4"),
    ]
)


def index_file_size_bytes(slot_count: int, entry_count_max: int) -> int:
    """Size of an index file with `slot_count` slots and room for `entry_count_max` entries."""
    assert slot_count > 0
    assert entry_count_max > INDEX_COUNT_INITIAL
    return (
        INDEX_HEADER_SIZE_BYTES
        + slot_count * INDEX_SLOT_SIZE_BYTES
        + entry_count_max * INDEX_ENTRY_SIZE_BYTES
    )


def index_slots_position_bytes() -> int:
    """Position of slot 0 in an index file."""
    return INDEX_HEADER_SIZE_BYTES


def index_entries_position_bytes(slot_count: int) -> int:
    """Position of entry 0 in an index file with `slot_count` slots."""
    assert slot_count > 0
    return INDEX_HEADER_SIZE_BYTES + slot_count * INDEX_SLOT_SIZE_BYTES


INDEX_FILE_SIZE_BYTES_DEFAULT: Final = index_file_size_bytes(
    INDEX_SLOT_COUNT_DEFAULT, INDEX_ENTRY_COUNT_MAX_DEFAULT
)

# ---------------------------------------------------------------------------------------------
# Checkpoint: one 4 KiB page, the rest zero
#
#    0                       8                       16                      24        64
#    +-----------------------+-----------------------+-----------------------+---------+
#    | physic_msg_timestamp  | logics_msg_timestamp  | index_msg_timestamp   | zero    |
#    | _ms int64             | _ms int64             | _ms int64             | (RMQ 5) |
#    +-----------------------+-----------------------+-----------------------+---------+
#   64          72                  80                  88                  96      100   4096
#    +-----------+-------------------+-------------------+-------------------+-------+-----+
#    | "MQBXPOS1"| physic_log_offset | logics_log_offset | index_log_offset  | crc32 | zero|
#    |           | _bytes int64      | _bytes int64      | _bytes int64      | u32   |     |
#    +-----------+-------------------+-------------------+-------------------+-------+-----+
#
#   The three times are RocketMQ's (its tools read them): physic is the store timestamp of the
#   newest commit-log record known flushed; logics of the newest consume-queue entry; index of
#   the newest index file. mqbox's recovery goes by the offsets, which no clock step can move:
#   physic: every commit-log byte below it is durable; logics: every record below it has its
#   consume-queue entry durable; index: every record below it has its index keys durable. The
#   CRC32 covers [64, 96). RocketMQ 5 writes masterFlushedOffset and confirmPhyOffset at 24 and
#   32, below mqbox's block. A page without the magic (written before the offsets existed) is
#   recovered by its times.
# ---------------------------------------------------------------------------------------------

CHECKPOINT_FILE_SIZE_BYTES: Final = 4 * KiB
CHECKPOINT_PHYSIC_MSG_TIMESTAMP_POSITION_BYTES: Final = 0
CHECKPOINT_LOGICS_MSG_TIMESTAMP_POSITION_BYTES: Final = 8
CHECKPOINT_INDEX_MSG_TIMESTAMP_POSITION_BYTES: Final = 16
CHECKPOINT_OFFSETS_MAGIC: Final = b"MQBXPOS1"
CHECKPOINT_OFFSETS_MAGIC_POSITION_BYTES: Final = 64
CHECKPOINT_PHYSIC_LOG_OFFSET_POSITION_BYTES: Final = 72
CHECKPOINT_LOGICS_LOG_OFFSET_POSITION_BYTES: Final = 80
CHECKPOINT_INDEX_LOG_OFFSET_POSITION_BYTES: Final = 88
CHECKPOINT_OFFSETS_CRC_POSITION_BYTES: Final = 96
CHECKPOINT_USED_SIZE_BYTES: Final = 100


# ---------------------------------------------------------------------------------------------
# Geometry: the sizes one store runs with
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class StoreGeometry:
    """Segment and file sizes of one store. The defaults are RocketMQ's; tests use tiny ones.

    RocketMQ's keys: mapedFileSizeCommitLog (bytes), mapedFileSizeConsumeQueue (bytes, here
    given as entries), maxHashSlotNum, maxIndexNum. A store must be reopened with the geometry
    it was written with; segment names and index offsets depend on it.
    """

    commit_log_segment_size_bytes: int = COMMIT_LOG_SEGMENT_SIZE_BYTES_DEFAULT
    cq_segment_entry_count: int = CQ_SEGMENT_ENTRY_COUNT_DEFAULT
    index_slot_count: int = INDEX_SLOT_COUNT_DEFAULT
    index_entry_count_max: int = INDEX_ENTRY_COUNT_MAX_DEFAULT

    def __post_init__(self) -> None:
        # Geometry comes from configuration, so bad values are operating errors, not asserts.
        if self.commit_log_segment_size_bytes <= 0:
            raise ConfigError(
                f"commit_log_segment_size_bytes must be > 0: {self.commit_log_segment_size_bytes}"
            )
        if self.cq_segment_entry_count <= 0:
            raise ConfigError(f"cq_segment_entry_count must be > 0: {self.cq_segment_entry_count}")
        if not 0 < self.index_slot_count <= INT32_MAX:
            raise ConfigError(f"index_slot_count must be in (0, 2^31): {self.index_slot_count}")
        if not INDEX_COUNT_INITIAL < self.index_entry_count_max <= INT32_MAX:
            raise ConfigError(
                f"index_entry_count_max must be in (1, 2^31): {self.index_entry_count_max}"
            )

    @property
    def cq_segment_size_bytes(self) -> int:
        """Size of one consume-queue segment file."""
        return self.cq_segment_entry_count * CQ_ENTRY_SIZE_BYTES

    @property
    def index_file_size_bytes(self) -> int:
        """Size of one index file."""
        return index_file_size_bytes(self.index_slot_count, self.index_entry_count_max)


# ---------------------------------------------------------------------------------------------
# Relations between the constants, checked once at import
# ---------------------------------------------------------------------------------------------

assert CQ_ENTRY_DTYPE.itemsize == CQ_ENTRY_SIZE_BYTES
assert CQ_ENTRY_DTYPE.fields is not None
assert CQ_ENTRY_DTYPE.fields["log_offset_bytes"][1] == CQ_ENTRY_LOG_OFFSET_POSITION_BYTES
assert CQ_ENTRY_DTYPE.fields["size_bytes"][1] == CQ_ENTRY_SIZE_POSITION_BYTES
assert CQ_ENTRY_DTYPE.fields["tag_hash"][1] == CQ_ENTRY_TAG_HASH_POSITION_BYTES
assert CQ_SEGMENT_SIZE_BYTES_DEFAULT == 6_000_000
assert CQ_SEGMENT_SIZE_BYTES_DEFAULT % CQ_ENTRY_SIZE_BYTES == 0
assert COMMIT_LOG_SEGMENT_SIZE_BYTES_DEFAULT == 1_073_741_824

assert INDEX_HEADER_DTYPE.itemsize == INDEX_HEADER_SIZE_BYTES
assert INDEX_HEADER_DTYPE.fields is not None
assert INDEX_HEADER_DTYPE.fields["begin_timestamp_ms"][1] == (
    INDEX_HEADER_BEGIN_TIMESTAMP_POSITION_BYTES
)
assert INDEX_HEADER_DTYPE.fields["end_timestamp_ms"][1] == INDEX_HEADER_END_TIMESTAMP_POSITION_BYTES
assert INDEX_HEADER_DTYPE.fields["begin_log_offset_bytes"][1] == (
    INDEX_HEADER_BEGIN_LOG_OFFSET_POSITION_BYTES
)
assert INDEX_HEADER_DTYPE.fields["end_log_offset_bytes"][1] == (
    INDEX_HEADER_END_LOG_OFFSET_POSITION_BYTES
)
assert INDEX_HEADER_DTYPE.fields["slots_used"][1] == INDEX_HEADER_SLOTS_USED_POSITION_BYTES
assert INDEX_HEADER_DTYPE.fields["index_count"][1] == INDEX_HEADER_INDEX_COUNT_POSITION_BYTES
assert INDEX_ENTRY_DTYPE.itemsize == INDEX_ENTRY_SIZE_BYTES
assert INDEX_ENTRY_DTYPE.fields is not None
assert INDEX_ENTRY_DTYPE.fields["key_hash"][1] == INDEX_ENTRY_KEY_HASH_POSITION_BYTES
assert INDEX_ENTRY_DTYPE.fields["log_offset_bytes"][1] == INDEX_ENTRY_LOG_OFFSET_POSITION_BYTES
assert INDEX_ENTRY_DTYPE.fields["time_diff_s"][1] == INDEX_ENTRY_TIME_DIFF_POSITION_BYTES
assert INDEX_ENTRY_DTYPE.fields["prev_index"][1] == INDEX_ENTRY_PREV_INDEX_POSITION_BYTES
assert INDEX_FILE_SIZE_BYTES_DEFAULT == 420_000_040
assert INDEX_SLOT_EMPTY < INDEX_COUNT_INITIAL
assert INDEX_ENTRY_COUNT_MAX_DEFAULT <= INT32_MAX

assert CHECKPOINT_INDEX_MSG_TIMESTAMP_POSITION_BYTES + 8 <= CHECKPOINT_OFFSETS_MAGIC_POSITION_BYTES
assert len(CHECKPOINT_OFFSETS_MAGIC) == 8
assert CHECKPOINT_PHYSIC_LOG_OFFSET_POSITION_BYTES == CHECKPOINT_OFFSETS_MAGIC_POSITION_BYTES + 8
assert (
    CHECKPOINT_LOGICS_LOG_OFFSET_POSITION_BYTES == CHECKPOINT_PHYSIC_LOG_OFFSET_POSITION_BYTES + 8
)
assert CHECKPOINT_INDEX_LOG_OFFSET_POSITION_BYTES == CHECKPOINT_LOGICS_LOG_OFFSET_POSITION_BYTES + 8
assert CHECKPOINT_OFFSETS_CRC_POSITION_BYTES == CHECKPOINT_INDEX_LOG_OFFSET_POSITION_BYTES + 8
assert CHECKPOINT_USED_SIZE_BYTES == CHECKPOINT_OFFSETS_CRC_POSITION_BYTES + 4
assert CHECKPOINT_USED_SIZE_BYTES <= CHECKPOINT_FILE_SIZE_BYTES
assert len(segment_name(0)) == SEGMENT_NAME_DIGIT_COUNT
