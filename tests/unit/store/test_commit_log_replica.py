"""CommitLog.append_replica: a slave's log becomes its master's, byte for byte.

Goal: (1) a master's log, cut at every record boundary and blank into appends, is copied
byte-identically, rolls included, with the same write position; (2) bytes that are not whole
records of this log (torn, wrong PHYSICALOFFSET, bytes after a blank) are refused and leave the
log as it was.
Method: a master CommitLog filled by append_batch (tests/unit/store/test_commit_log.py's
helpers); its bytes are read back between record boundaries and replayed into a second log.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from mqbox.errors import StoreError
from mqbox.store.commit_log import CommitLog
from mqbox.store.kernels import scan_records
from tests.unit.store.test_commit_log import (
    SEGMENT_SIZE_BYTES,
    TOPIC,
    batch,
    log_bytes,
    message,
    open_log,
)


def _master(root: Path, steps: int) -> CommitLog:
    log = open_log(root)
    rng = np.random.default_rng(3)
    for step in range(steps):
        items = [message(int(rng.integers(92, 300))) for _ in range(int(rng.integers(1, 4)))]
        data, sizes = batch(items)
        log.append_batch(data, sizes, TOPIC, 0, store_timestamp_ms=step + 1)
    return log


def _units(master: CommitLog) -> list[tuple[int, bytes]]:
    """(offset, bytes) of every record and end blank of the master, in log order."""
    units: list[tuple[int, bytes]] = []
    outs = tuple(np.empty(1, dtype=kind) for kind in ("<i8", "<i4", "<i4", "<i8", "<i8", "<i8"))
    position = 0
    while position < master.write_log_offset_bytes:
        start = position - position % SEGMENT_SIZE_BYTES
        view = master.segment_view(start)
        assert view is not None
        at = position - start
        count, _stop, _reason = scan_records(view, at, SEGMENT_SIZE_BYTES, start, False, *outs)
        size = int(outs[1][0]) if count else 8  # else a blank
        units.append((position, view[at : at + size].tobytes()))
        position = position + size if count else start + SEGMENT_SIZE_BYTES
    return units


def test_replica_appends_copy_the_master_byte_for_byte(tmp_path: Path) -> None:
    master = _master(tmp_path / "master", 150)
    slave = open_log(tmp_path / "slave")
    units = _units(master)
    rng = np.random.default_rng(5)
    index = 0
    while index < len(units):
        # Group a few consecutive units of one segment, as the HA client hands them.
        group = [units[index]]
        index += 1
        while index < len(units) and rng.random() < 0.6 and len(group[-1][1]) != 8:
            segment = units[index][0] // SEGMENT_SIZE_BYTES
            if segment != group[0][0] // SEGMENT_SIZE_BYTES:
                break
            group.append(units[index])
            index += 1
        assert slave.write_log_offset_bytes == group[0][0]
        data = np.frombuffer(b"".join(unit for _offset, unit in group), dtype=np.uint8)
        slave.append_replica(data)
    assert slave.write_log_offset_bytes == master.write_log_offset_bytes
    end = master.write_log_offset_bytes
    assert log_bytes(tmp_path / "slave")[:end] == log_bytes(tmp_path / "master")[:end]
    assert slave.last_store_timestamp_ms == master.last_store_timestamp_ms


@pytest.mark.parametrize("damage", ["torn", "offset", "after_blank"])
def test_replica_that_is_not_whole_records_is_refused(tmp_path: Path, damage: str) -> None:
    master = _master(tmp_path / "master", 60)
    units = _units(master)
    slave = open_log(tmp_path / "slave")
    first_offset, first = units[0]
    slave.append_replica(np.frombuffer(first, dtype=np.uint8))
    offset, record = units[1]
    if damage == "torn":
        data = record[:-5]
    elif damage == "offset":
        data = units[2][1]  # a record whose PHYSICALOFFSET names the next place
    else:
        blank_index = next(i for i, (_o, unit) in enumerate(units) if len(unit) == 8)
        slave = open_log(tmp_path / "slave2")
        for _offset, unit in units[:blank_index]:
            slave.append_replica(np.frombuffer(unit, dtype=np.uint8))
        data = units[blank_index][1] + units[blank_index + 1][1]
        offset = units[blank_index][0]
    before = slave.write_log_offset_bytes
    assert before == offset
    with pytest.raises(StoreError):
        slave.append_replica(np.frombuffer(data, dtype=np.uint8))
    assert slave.write_log_offset_bytes == before
    assert first_offset == 0
