"""The checkpoint file: how far each file type is known flushed, by log offset and by store time.

Owns: the encoding of the 4 KiB checkpoint page (layout drawn in layout.py) and its atomic
replacement. One writer per running store: the process that opened it for writing (the
one-process MessageStore's flush calls; in the appliance, the store writer role, whose
housekeeping thread copies in the consume-queue and index positions the dispatcher publishes:
server/roles/store_housekeeper.py). Read by recovery at start. Never: decide what the values mean
for recovery (recovery.py does), or write the page in place.

Invariants:
- The file on disk is always a whole page from one `flush()`: it is replaced by write-temp,
  fsync, rename, fsync-directory, so a crash leaves the old page or the new one, never a mix.
  RocketMQ rewrites its page in place through a map; a torn page there is possible, here not.
- Timestamps are ms since the epoch and never negative; 0 means "nothing known flushed".
- Offsets are commit-log bytes, never negative; each claims only what a flush made durable
  before the page was written. They are None when the page came from a writer that did not
  record them (an older mqbox, or RocketMQ): recovery then falls back on the times. A page whose
  offsets block fails its CRC reads as having none, so recovery checks more, never less.
- Bytes past the used fields are written as zero and ignored on read.
"""

from __future__ import annotations

import dataclasses
import struct
import zlib
from pathlib import Path

from mqbox.errors import StoreError
from mqbox.store.layout import (
    CHECKPOINT_FILE_SIZE_BYTES,
    CHECKPOINT_INDEX_LOG_OFFSET_POSITION_BYTES,
    CHECKPOINT_INDEX_MSG_TIMESTAMP_POSITION_BYTES,
    CHECKPOINT_LOGICS_LOG_OFFSET_POSITION_BYTES,
    CHECKPOINT_LOGICS_MSG_TIMESTAMP_POSITION_BYTES,
    CHECKPOINT_OFFSETS_CRC_POSITION_BYTES,
    CHECKPOINT_OFFSETS_MAGIC,
    CHECKPOINT_OFFSETS_MAGIC_POSITION_BYTES,
    CHECKPOINT_PHYSIC_LOG_OFFSET_POSITION_BYTES,
    CHECKPOINT_PHYSIC_MSG_TIMESTAMP_POSITION_BYTES,
)
from mqbox.store.mapped_file import store_error, write_file_atomically

_INT64_BE = struct.Struct(">q")
_TIMES = struct.Struct(">qqq")
_OFFSETS = struct.Struct(">8sqqq")
_CRC = struct.Struct(">I")
assert CHECKPOINT_PHYSIC_MSG_TIMESTAMP_POSITION_BYTES == 0
assert CHECKPOINT_LOGICS_MSG_TIMESTAMP_POSITION_BYTES == 8
assert CHECKPOINT_INDEX_MSG_TIMESTAMP_POSITION_BYTES == 16
assert CHECKPOINT_PHYSIC_LOG_OFFSET_POSITION_BYTES == CHECKPOINT_OFFSETS_MAGIC_POSITION_BYTES + 8
assert CHECKPOINT_LOGICS_LOG_OFFSET_POSITION_BYTES == CHECKPOINT_OFFSETS_MAGIC_POSITION_BYTES + 16
assert CHECKPOINT_INDEX_LOG_OFFSET_POSITION_BYTES == CHECKPOINT_OFFSETS_MAGIC_POSITION_BYTES + 24
assert (
    CHECKPOINT_OFFSETS_MAGIC_POSITION_BYTES + _OFFSETS.size == CHECKPOINT_OFFSETS_CRC_POSITION_BYTES
)


@dataclasses.dataclass(frozen=True)
class CheckpointState:
    """What is known flushed, per file type: store times (ms since the epoch, RocketMQ's three
    fields) and log offsets (bytes; None when the page did not record them)."""

    physic_msg_timestamp_ms: int = 0
    logics_msg_timestamp_ms: int = 0
    index_msg_timestamp_ms: int = 0
    physic_log_offset_bytes: int | None = None
    logics_log_offset_bytes: int | None = None
    index_log_offset_bytes: int | None = None

    def __post_init__(self) -> None:
        assert self.physic_msg_timestamp_ms >= 0
        assert self.logics_msg_timestamp_ms >= 0
        assert self.index_msg_timestamp_ms >= 0
        offsets = (
            self.physic_log_offset_bytes,
            self.logics_log_offset_bytes,
            self.index_log_offset_bytes,
        )
        assert all(offset is None for offset in offsets) or all(
            offset is not None and offset >= 0 for offset in offsets
        ), "the three offsets are recorded together"

    @property
    def has_offsets(self) -> bool:
        """True when recovery can go by offsets (see the module docstring)."""
        return self.physic_log_offset_bytes is not None


def encode_checkpoint(state: CheckpointState) -> bytes:
    """The 4 KiB page for `state`."""
    page = bytearray(CHECKPOINT_FILE_SIZE_BYTES)
    _TIMES.pack_into(
        page,
        CHECKPOINT_PHYSIC_MSG_TIMESTAMP_POSITION_BYTES,
        state.physic_msg_timestamp_ms,
        state.logics_msg_timestamp_ms,
        state.index_msg_timestamp_ms,
    )
    if state.has_offsets:
        assert state.physic_log_offset_bytes is not None
        assert state.logics_log_offset_bytes is not None
        assert state.index_log_offset_bytes is not None
        _OFFSETS.pack_into(
            page,
            CHECKPOINT_OFFSETS_MAGIC_POSITION_BYTES,
            CHECKPOINT_OFFSETS_MAGIC,
            state.physic_log_offset_bytes,
            state.logics_log_offset_bytes,
            state.index_log_offset_bytes,
        )
        block = page[CHECKPOINT_OFFSETS_MAGIC_POSITION_BYTES:CHECKPOINT_OFFSETS_CRC_POSITION_BYTES]
        _CRC.pack_into(page, CHECKPOINT_OFFSETS_CRC_POSITION_BYTES, zlib.crc32(block))
    assert len(page) == CHECKPOINT_FILE_SIZE_BYTES
    return bytes(page)


def decode_checkpoint(page: bytes, path: Path) -> CheckpointState:
    """The state in a checkpoint page read from `path`; StoreError if the times are malformed.

    An offsets block with a bad CRC or a negative offset is dropped, not trusted (recovery then
    goes by the times, which checks more)."""
    if len(page) != CHECKPOINT_FILE_SIZE_BYTES:
        raise StoreError(f"{path}: {len(page)} bytes, expected {CHECKPOINT_FILE_SIZE_BYTES}")
    times = _TIMES.unpack_from(page, CHECKPOINT_PHYSIC_MSG_TIMESTAMP_POSITION_BYTES)
    if min(times) < 0:
        raise StoreError(f"{path}: negative timestamp in checkpoint")
    physic_ms, logics_ms, index_ms = times
    magic, physic_bytes, logics_bytes, index_bytes = _OFFSETS.unpack_from(
        page, CHECKPOINT_OFFSETS_MAGIC_POSITION_BYTES
    )
    block = page[CHECKPOINT_OFFSETS_MAGIC_POSITION_BYTES:CHECKPOINT_OFFSETS_CRC_POSITION_BYTES]
    (crc,) = _CRC.unpack_from(page, CHECKPOINT_OFFSETS_CRC_POSITION_BYTES)
    offsets_valid = (
        magic == CHECKPOINT_OFFSETS_MAGIC
        and crc == zlib.crc32(block)
        and min(physic_bytes, logics_bytes, index_bytes) >= 0
    )
    if not offsets_valid:
        return CheckpointState(physic_ms, logics_ms, index_ms)
    return CheckpointState(physic_ms, logics_ms, index_ms, physic_bytes, logics_bytes, index_bytes)


def read_checkpoint(path: Path) -> CheckpointState | None:
    """The state stored at `path`, or None if there is no checkpoint file (a new store)."""
    try:
        page = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as error:
        raise store_error(error, "read", path) from error
    return decode_checkpoint(page, path)


def write_checkpoint(path: Path, state: CheckpointState) -> None:
    """Replace the checkpoint at `path` with `state`, atomically and durably."""
    write_file_atomically(path, encode_checkpoint(state))


class Checkpoint:
    """The store's checkpoint: the current state in memory, persisted by `flush()`.

    RocketMQ's StoreCheckpoint. The flush service sets a value only after the data it describes
    is durable, then calls `flush()`. Offsets start at 0 for a new store and at the stored ones
    for an existing store that recorded them; for a store that did not, they start at 0, which
    claims nothing, until the first flushes after recovery set them.
    """

    def __init__(self, path: Path):
        self.path = path
        stored = read_checkpoint(path)
        self.existed = stored is not None
        self._flushed = stored if stored is not None else CheckpointState()
        self._state = self._flushed
        if not self._state.has_offsets:
            self._state = dataclasses.replace(
                self._state,
                physic_log_offset_bytes=0,
                logics_log_offset_bytes=0,
                index_log_offset_bytes=0,
            )

    @property
    def state(self) -> CheckpointState:
        """The current values (flushed or not)."""
        return self._state

    @property
    def state_flushed(self) -> CheckpointState:
        """The values last written to disk (or read from it)."""
        return self._flushed

    def update(
        self,
        *,
        physic_msg_timestamp_ms: int | None = None,
        logics_msg_timestamp_ms: int | None = None,
        index_msg_timestamp_ms: int | None = None,
        physic_log_offset_bytes: int | None = None,
        logics_log_offset_bytes: int | None = None,
        index_log_offset_bytes: int | None = None,
    ) -> None:
        """Set some of the values in memory; `flush()` persists them. Offsets never move back:
        an older report (a flush that finished after a newer one) is ignored."""
        changes: dict[str, int] = {}
        if physic_msg_timestamp_ms is not None:
            changes["physic_msg_timestamp_ms"] = physic_msg_timestamp_ms
        if logics_msg_timestamp_ms is not None:
            changes["logics_msg_timestamp_ms"] = logics_msg_timestamp_ms
        if index_msg_timestamp_ms is not None:
            changes["index_msg_timestamp_ms"] = index_msg_timestamp_ms
        offsets = (
            ("physic_log_offset_bytes", physic_log_offset_bytes),
            ("logics_log_offset_bytes", logics_log_offset_bytes),
            ("index_log_offset_bytes", index_log_offset_bytes),
        )
        for name, value in offsets:
            current = getattr(self._state, name)
            if value is not None and (current is None or value > current):
                changes[name] = value
        if changes:
            self._state = dataclasses.replace(self._state, **changes)

    def clamp_offsets(self, end_log_offset_bytes: int) -> None:
        """Recovery cut the log at `end_log_offset_bytes` (only ever below the stored physic
        offset when an operator asked for a repair): no offset may claim bytes past it."""
        assert end_log_offset_bytes >= 0
        changes = {
            name: end_log_offset_bytes
            for name in (
                "physic_log_offset_bytes",
                "logics_log_offset_bytes",
                "index_log_offset_bytes",
            )
            if (getattr(self._state, name) or 0) > end_log_offset_bytes
        }
        if changes:
            self._state = dataclasses.replace(self._state, **changes)

    def flush(self) -> bool:
        """Write the current values if they changed since the last write; True if written."""
        if self._state == self._flushed and self.existed:
            return False
        write_checkpoint(self.path, self._state)
        self._flushed = self._state
        self.existed = True
        return True
