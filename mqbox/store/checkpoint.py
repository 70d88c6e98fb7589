"""The checkpoint file: three store timestamps that say how far each file type is known flushed.

Owns: the encoding of the 4 KiB checkpoint page (layout drawn in layout.py) and its atomic
replacement. One writer per running store: the process that opened it for writing (the
one-process MessageStore's flush calls; in the appliance, the store writer role, whose
housekeeping thread copies in the consume-queue and index times the dispatcher publishes:
server/store_housekeeper.py). Read by recovery at start. Never: decide what the timestamps mean
for recovery (recovery.py does), or write the page in place.

Invariants:
- The file on disk is always a whole page from one `flush()`: it is replaced by write-temp,
  fsync, rename, fsync-directory, so a crash leaves the old page or the new one, never a mix.
  RocketMQ rewrites its page in place through a map; a torn page there is possible, here not.
- Timestamps are ms since the epoch and never negative; 0 means "nothing known flushed".
- Bytes past the three fields are written as zero and ignored on read (RocketMQ 5 puts more
  fields there).
"""

from __future__ import annotations

import dataclasses
import struct
from pathlib import Path

from mqbox.errors import StoreError
from mqbox.store.layout import (
    CHECKPOINT_FILE_SIZE_BYTES,
    CHECKPOINT_INDEX_MSG_TIMESTAMP_POSITION_BYTES,
    CHECKPOINT_LOGICS_MSG_TIMESTAMP_POSITION_BYTES,
    CHECKPOINT_PHYSIC_MSG_TIMESTAMP_POSITION_BYTES,
)
from mqbox.store.mapped_file import store_error, write_file_atomically

_INT64_BE = struct.Struct(">q")


@dataclasses.dataclass(frozen=True)
class CheckpointTimestamps:
    """Store timestamps (ms since the epoch) of the newest data known flushed, per file type."""

    physic_msg_timestamp_ms: int = 0
    logics_msg_timestamp_ms: int = 0
    index_msg_timestamp_ms: int = 0

    def __post_init__(self) -> None:
        assert self.physic_msg_timestamp_ms >= 0
        assert self.logics_msg_timestamp_ms >= 0
        assert self.index_msg_timestamp_ms >= 0


def encode_checkpoint(timestamps: CheckpointTimestamps) -> bytes:
    """The 4 KiB page for `timestamps`."""
    page = bytearray(CHECKPOINT_FILE_SIZE_BYTES)
    _INT64_BE.pack_into(
        page, CHECKPOINT_PHYSIC_MSG_TIMESTAMP_POSITION_BYTES, timestamps.physic_msg_timestamp_ms
    )
    _INT64_BE.pack_into(
        page, CHECKPOINT_LOGICS_MSG_TIMESTAMP_POSITION_BYTES, timestamps.logics_msg_timestamp_ms
    )
    _INT64_BE.pack_into(
        page, CHECKPOINT_INDEX_MSG_TIMESTAMP_POSITION_BYTES, timestamps.index_msg_timestamp_ms
    )
    assert len(page) == CHECKPOINT_FILE_SIZE_BYTES
    return bytes(page)


def decode_checkpoint(page: bytes, path: Path) -> CheckpointTimestamps:
    """The timestamps in a checkpoint page read from `path`; StoreError if it is malformed."""
    if len(page) != CHECKPOINT_FILE_SIZE_BYTES:
        raise StoreError(f"{path}: {len(page)} bytes, expected {CHECKPOINT_FILE_SIZE_BYTES}")
    (physic_msg_timestamp_ms,) = _INT64_BE.unpack_from(
        page, CHECKPOINT_PHYSIC_MSG_TIMESTAMP_POSITION_BYTES
    )
    (logics_msg_timestamp_ms,) = _INT64_BE.unpack_from(
        page, CHECKPOINT_LOGICS_MSG_TIMESTAMP_POSITION_BYTES
    )
    (index_msg_timestamp_ms,) = _INT64_BE.unpack_from(
        page, CHECKPOINT_INDEX_MSG_TIMESTAMP_POSITION_BYTES
    )
    if min(physic_msg_timestamp_ms, logics_msg_timestamp_ms, index_msg_timestamp_ms) < 0:
        raise StoreError(f"{path}: negative timestamp in checkpoint")
    return CheckpointTimestamps(
        physic_msg_timestamp_ms=physic_msg_timestamp_ms,
        logics_msg_timestamp_ms=logics_msg_timestamp_ms,
        index_msg_timestamp_ms=index_msg_timestamp_ms,
    )


def read_checkpoint(path: Path) -> CheckpointTimestamps | None:
    """The timestamps stored at `path`, or None if there is no checkpoint file (a new store)."""
    try:
        page = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as error:
        raise store_error(error, "read", path) from error
    return decode_checkpoint(page, path)


def write_checkpoint(path: Path, timestamps: CheckpointTimestamps) -> None:
    """Replace the checkpoint at `path` with `timestamps`, atomically and durably."""
    write_file_atomically(path, encode_checkpoint(timestamps))


class Checkpoint:
    """The store's checkpoint: the current timestamps in memory, persisted by `flush()`.

    RocketMQ's StoreCheckpoint. The flush service sets a timestamp only after the data it
    describes is durable, then calls `flush()`.
    """

    def __init__(self, path: Path):
        self.path = path
        stored = read_checkpoint(path)
        self.existed = stored is not None
        self._timestamps = stored if stored is not None else CheckpointTimestamps()
        self._flushed = self._timestamps

    @property
    def timestamps(self) -> CheckpointTimestamps:
        """The current values (flushed or not)."""
        return self._timestamps

    @property
    def timestamps_flushed(self) -> CheckpointTimestamps:
        """The values last written to disk (or read from it)."""
        return self._flushed

    def update(
        self,
        *,
        physic_msg_timestamp_ms: int | None = None,
        logics_msg_timestamp_ms: int | None = None,
        index_msg_timestamp_ms: int | None = None,
    ) -> None:
        """Set some of the timestamps in memory; `flush()` persists them."""
        changes: dict[str, int] = {}
        if physic_msg_timestamp_ms is not None:
            changes["physic_msg_timestamp_ms"] = physic_msg_timestamp_ms
        if logics_msg_timestamp_ms is not None:
            changes["logics_msg_timestamp_ms"] = logics_msg_timestamp_ms
        if index_msg_timestamp_ms is not None:
            changes["index_msg_timestamp_ms"] = index_msg_timestamp_ms
        self._timestamps = dataclasses.replace(self._timestamps, **changes)

    def flush(self) -> bool:
        """Write the current values if they changed since the last write; True if written."""
        if self._timestamps == self._flushed and self.existed:
            return False
        write_checkpoint(self.path, self._timestamps)
        self._flushed = self._timestamps
        self.existed = True
        return True
