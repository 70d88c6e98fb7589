"""CommitLog.count_records: how many records lie between two record boundaries of the log.

Goal: between any two record boundaries (a segment's start after a blank included) the count is
the number of records there, across segments; an end that is not a boundary, or a segment that
is gone, gives None rather than a wrong count.
Method: a master log of random record sizes over 1 KiB segments (test_commit_log_replica's
helpers), its records and blanks listed one by one; counts compared with that list.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tests.unit.store.test_commit_log import SEGMENT_SIZE_BYTES
from tests.unit.store.test_commit_log_replica import _master, _units


def test_counts_the_records_between_any_two_boundaries(tmp_path: Path) -> None:
    log = _master(tmp_path, 120)
    units = _units(log)
    # Every boundary, with the records before it; a blank's end is its next segment's start.
    boundaries = [0]
    records_before = [0]
    for offset, unit in units:
        blank = len(unit) == 8
        end = (
            offset - offset % SEGMENT_SIZE_BYTES + SEGMENT_SIZE_BYTES
            if blank
            else offset + len(unit)
        )
        boundaries.append(end)
        records_before.append(records_before[-1] + (0 if blank else 1))
    assert boundaries[-1] == log.write_log_offset_bytes
    rng = np.random.default_rng(11)
    for _ in range(300):
        i, j = sorted(int(k) for k in rng.integers(0, len(boundaries), 2))
        expected = records_before[j] - records_before[i]
        assert log.count_records(boundaries[i], boundaries[j]) == expected
    assert log.count_records(0, log.write_log_offset_bytes) == records_before[-1]
    # Not a boundary: the walk does not end there.
    first_end = boundaries[1]
    assert log.count_records(0, first_end - 1) is None
    assert log.count_records(1, first_end) is None


def test_a_span_whose_segment_is_gone_has_no_count(tmp_path: Path) -> None:
    log = _master(tmp_path, 120)
    end = log.write_log_offset_bytes
    assert end > 2 * SEGMENT_SIZE_BYTES
    log.flush()
    assert log.delete_segments_below(SEGMENT_SIZE_BYTES) == 1
    assert log.count_records(0, end) is None
    assert log.count_records(SEGMENT_SIZE_BYTES, end) is not None
