"""Plain-Python twin of read_plan.plan_read: the same contract, restated for tests.

Owns: a second statement of the read-plan scan over consume-queue bytes, with struct and lists
instead of a kernel. It shares no helper with the kernel. A unit test feeds both the same entries,
filter and limits and asserts the same result and runs.

Never: used on the data plane, or changed without its kernel.
"""

from __future__ import annotations

import struct

import numpy as np
from numpy.typing import NDArray

_ENTRY = struct.Struct(">qiq")  # log offset, size, tag hash (docs section 7.1)
PLAN_BAD_ENTRY = -1


def plan_read(
    cq_segment: NDArray[np.uint8],
    first_entry: int,
    entry_count: int,
    tag_hashes: NDArray[np.int64],
    count_max: int,
    size_bytes_max: int,
    commit_log_segment_size_bytes: int,
    commit_log_min_offset_bytes: int,
    out_runs: NDArray[np.int64],
) -> tuple[int, int, int, int, int, int, int, int]:
    """Same contract as read_plan.plan_read."""
    data = cq_segment.tobytes()
    wanted = {int(value) for value in tag_hashes}
    runs: list[list[int]] = []  # [log offset, size]
    scanned = taken = total = removed = 0
    for entry in range(first_entry, first_entry + entry_count):
        log_offset, size, tag = _ENTRY.unpack_from(data, entry * 20)
        if size <= 0 or log_offset < 0:
            return PLAN_BAD_ENTRY, scanned, 0, 0, 0, 0, 0, 0
        if taken and (taken >= count_max or total + size > size_bytes_max):
            break
        scanned += 1
        if wanted and tag not in wanted:
            continue
        if log_offset < commit_log_min_offset_bytes:
            removed += 1
            continue
        taken += 1
        total += size
        if runs:
            last_offset, last_size = runs[-1]
            same_segment = (
                last_offset // commit_log_segment_size_bytes
                == log_offset // commit_log_segment_size_bytes
            )
            if last_offset + last_size == log_offset and same_segment:
                runs[-1][1] += size
                continue
        runs.append([log_offset, size])
    for row, (log_offset, size) in enumerate(runs):
        segment_start = log_offset // commit_log_segment_size_bytes * commit_log_segment_size_bytes
        out_runs[row] = (segment_start, log_offset - segment_start, size)
    if not runs:
        return 0, scanned, 0, 0, removed, 0, 0, 0
    first = [int(value) for value in out_runs[0]]
    return len(runs), scanned, taken, total, removed, first[0], first[1], first[2]
