"""RocketMQ's HA replication protocol, sans-IO: the slave's offset reports and the master's
transfer frames (docs/replication.md tells the whole exchange).

Owns: the two byte layouts below and their readers, which take bytes as they arrive and give
back whole reports and whole frames, any split of the stream giving the same result. Never:
sockets, clocks, logging, or what an offset means to the store (roles/ha_service.py and
roles/ha_client.py decide that).

The connection is raw TCP, big-endian, with no other framing (HAService, HAConnection):

    slave -> master, a report:         master -> slave, a transfer frame:
    +0                 +8              +0                 +8             +12
    | max_log_offset   |               | log_offset       | body_size    | body: body_size
    | i64: the slave's |               | i64: where the   | i32: 0 for a | bytes of the
    | commit-log end   |               | body starts      | heartbeat    | master's log |

Invariants:
- Every size from the peer is checked before it is waited for: a frame's body is at most
  `body_size_bytes_max` (RocketMQ's haTransferBatchSize is 32 KiB; a master may send less), and
  offsets are never negative. A violation is a RemoteProtocolError and the connection is dead.
- A reader keeps at most one frame (or seven bytes of a report) buffered.
"""

from __future__ import annotations

import struct
from typing import Final, NamedTuple

from mqbox.protocol.errors import RemoteProtocolError

REPORT: Final = struct.Struct(">q")
TRANSFER_HEADER: Final = struct.Struct(">qi")
REPORT_SIZE_BYTES: Final = REPORT.size  # 8
TRANSFER_HEADER_SIZE_BYTES: Final = TRANSFER_HEADER.size  # 12
TRANSFER_BATCH_SIZE_BYTES_DEFAULT: Final = 32 * 1024  # haTransferBatchSize
# The master reads reports in buffers of this size (HAConnection's 1 MiB read buffer); more than
# this unread at once is a peer that floods.
REPORT_BUFFER_SIZE_BYTES_MAX: Final = 1024 * 1024


def encode_report(max_log_offset_bytes: int) -> bytes:
    """The slave's report: its commit log's max offset (also its acknowledgement)."""
    assert max_log_offset_bytes >= 0
    return REPORT.pack(max_log_offset_bytes)


def encode_transfer_header(log_offset_bytes: int, body_size_bytes: int) -> bytes:
    """The master's 12-byte header; the body (raw commit-log bytes) follows it."""
    assert log_offset_bytes >= 0
    assert 0 <= body_size_bytes < 2**31
    return TRANSFER_HEADER.pack(log_offset_bytes, body_size_bytes)


class ReportReader:
    """The master's side of one slave connection: bytes in, the newest report out.

    RocketMQ's master reads whatever arrived and takes the last whole 8-byte value; reports only
    grow in meaning (an acknowledgement), so the older ones in the same read are skipped.
    """

    def __init__(self) -> None:
        self._pending = bytearray()
        self.report_total = 0

    def receive_data(self, data: bytes) -> int | None:
        """Feed what the socket gave; the newest whole report in it, or None if none ended."""
        pending = self._pending
        pending += data
        if len(pending) > REPORT_BUFFER_SIZE_BYTES_MAX:
            raise RemoteProtocolError(f"slave sent {len(pending)} unread bytes of reports")
        whole_bytes = len(pending) - len(pending) % REPORT_SIZE_BYTES
        if whole_bytes == 0:
            return None
        (value,) = REPORT.unpack_from(pending, whole_bytes - REPORT_SIZE_BYTES)
        self.report_total += whole_bytes // REPORT_SIZE_BYTES
        del pending[:whole_bytes]
        if value < 0:
            raise RemoteProtocolError(f"slave reported a negative offset {value}")
        return int(value)


class TransferFrame(NamedTuple):
    log_offset_bytes: int  # where `body` starts in the master's commit log
    body: bytes  # empty: a heartbeat, the master's next offset without data


class TransferReader:
    """The slave's side: bytes in, whole transfer frames out (`next_frame` until None)."""

    def __init__(self, body_size_bytes_max: int = TRANSFER_BATCH_SIZE_BYTES_DEFAULT) -> None:
        assert body_size_bytes_max > 0
        self.body_size_bytes_max = body_size_bytes_max
        self._pending = bytearray()
        self._start = 0
        self.frame_total = 0

    def receive_data(self, data: bytes) -> None:
        """Feed what the socket gave; take the frames with `next_frame`."""
        if self._start and self._start * 2 >= len(self._pending):
            del self._pending[: self._start]
            self._start = 0
        self._pending += data

    @property
    def buffered_size_bytes(self) -> int:
        return len(self._pending) - self._start

    def next_frame(self) -> TransferFrame | None:
        """The next whole frame, or None until more bytes arrive."""
        pending = self._pending
        start = self._start
        if len(pending) - start < TRANSFER_HEADER_SIZE_BYTES:
            return None
        log_offset_bytes, body_size_bytes = TRANSFER_HEADER.unpack_from(pending, start)
        if log_offset_bytes < 0:
            raise RemoteProtocolError(f"master sent a negative offset {log_offset_bytes}")
        if not 0 <= body_size_bytes <= self.body_size_bytes_max:
            raise RemoteProtocolError(
                f"master sent a {body_size_bytes}-byte body, the bound is "
                f"{self.body_size_bytes_max}"
            )
        end = start + TRANSFER_HEADER_SIZE_BYTES + body_size_bytes
        if len(pending) < end:
            return None
        with memoryview(pending)[start + TRANSFER_HEADER_SIZE_BYTES : end] as view:
            body = bytes(view)  # one copy (a bytearray slice would be a second)
        self._start = end
        if end == len(pending):
            pending.clear()
            self._start = 0
        self.frame_total += 1
        return TransferFrame(int(log_offset_bytes), body)
