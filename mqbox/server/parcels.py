"""What travels on the broker's rings: parcel types and their byte layouts.

Owns: the parcel type numbers, the layouts drawn below (each as a numpy structured dtype, the
layout of a parcel, plus a `struct.Struct` twin, `<NAME>_STRUCT`, that the hot path packs and
unpacks with, checked against each other at import), the spill files of payloads too big for a
ring, and the batching/sleeping helpers of the roles. Never: what a command means (processors),
sockets (reactor.py), the ring protocol itself (mqbox/ipc/ring.py), or deciding routes
(worker.py).

Invariants, asserted at import: each struct twin has its dtype's size and field offsets; every
fixed head is a multiple of 8 bytes long, so the variable part that follows starts 8-byte aligned
in the ring as the head does; parcel types fit below SPILLED_FLAG.

Byte order: little-endian (x86-64, like the ring's own counters); these parcels never leave the
machine. Wire bytes inside them (frames, headers) stay big-endian as the client sent them.

Which role writes which parcel to whom: the ring graph in topology.py, drawn once. The ring's
unit is a parcel of ipc/ring.py; the broker's parcels are not the CommitLog's stored records
(message.py), which travel inside APPEND and in the runs of a REPLY.
"""

from __future__ import annotations

import dataclasses
import logging
import struct
from collections.abc import Sequence
from typing import Final, NamedTuple, TypeAlias

import numpy as np

from mqbox.message import java_utf8_decode, java_utf8_encode

Buffer: TypeAlias = bytes | bytearray | memoryview

log = logging.getLogger(__name__)


# Parcel types. Any int from 0 to 2**31 - 1 is a valid ring type; these are the broker's.
FRAME: Final = 1
CONNECTION_OPENED: Final = 2
CONNECTION_CLOSED: Final = 3
COMMAND: Final = 4
REPLY: Final = 5
RESPONSE: Final = 6
CLOSE_CONNECTION: Final = 7
COMPLETED: Final = 8
REQUEST_FAILED: Final = 9
APPEND: Final = 10
APPEND_ACK: Final = 11
WRITTEN: Final = 12
QUEUES_GREW: Final = 13
NO_ANSWER: Final = 14
REPLICATED: Final = 15
REPLICA: Final = 16
SPILLED_FLAG: Final = 1 << 24
PARCEL_TYPE_NAMES: Final = {
    FRAME: "FRAME",
    CONNECTION_OPENED: "CONNECTION_OPENED",
    CONNECTION_CLOSED: "CONNECTION_CLOSED",
    COMMAND: "COMMAND",
    REPLY: "REPLY",
    RESPONSE: "RESPONSE",
    CLOSE_CONNECTION: "CLOSE_CONNECTION",
    COMPLETED: "COMPLETED",
    REQUEST_FAILED: "REQUEST_FAILED",
    APPEND: "APPEND",
    APPEND_ACK: "APPEND_ACK",
    WRITTEN: "WRITTEN",
    QUEUES_GREW: "QUEUES_GREW",
    NO_ANSWER: "NO_ANSWER",
    REPLICATED: "REPLICATED",
    REPLICA: "REPLICA",
}

# Why a connection closed (CONNECTION_CLOSED.reason, CLOSE_CONNECTION.reason).
CLOSE_REASON_PEER: Final = 0  # the peer closed or reset the connection
CLOSE_REASON_PROTOCOL: Final = 1  # the peer broke the remoting protocol
CLOSE_REASON_IDLE: Final = 2  # no request for the worker's idle time
CLOSE_REASON_SLOW_READER: Final = 3  # the peer stopped reading: its output queue overflowed
CLOSE_REASON_REQUESTED: Final = 4  # a processor asked for it
CLOSE_REASON_READ_PLAN_GONE: Final = 5  # a commit-log segment of a response vanished
CLOSE_REASON_UNKNOWN: Final = 6  # asked to close a connection the reactor does not have

# REPLY.flags and RESPONSE.flags.
REPLY_FLAG_CLOSE_AFTER: Final = 1  # close the connection once this response is written
REPLY_FLAG_REQUEST: Final = 2  # a broker request to the client (40, 220, 307), not an answer

# APPEND.flags and QUEUES_GREW.flags.
APPEND_FLAG_WAIT_FLUSH: Final = 1  # SYNC_FLUSH: acknowledge once a flush covers the records
APPEND_FLAG_IDEMPOTENT: Final = 2  # drop records whose UNIQ_KEY the window holds (rule above)
QUEUES_GREW_FLAG_MANY: Final = 1  # too many queues grew to list: every held pull looks again

# How long the codec may hold COMPLETED notices before it sends them on their own. Each such send
# wakes the codec and the worker of an otherwise idle broker: at 20 ms (before issue 15) a client
# sending one request every 50 ms paid two wake-ups per request for them (bench/idle.py).
COMPLETED_FLUSH_INTERVAL_NS: Final = 500_000_000
COMPLETED_FLUSH_COUNT: Final = 1024

PEER_HOST_SIZE_BYTES_MAX: Final = 46  # INET6_ADDRSTRLEN: the longest textual IPv6 address + NUL

# Layouts: numpy dtypes (the documentation a reader can inspect) and struct twins (the hot path).

# FRAME: one complete remoting frame of one connection, exactly as received, length prefix
# included. The reactor has checked the length field only (frame.check_frame_length).
#
#     +0          +8
#     +-----------+--------------------------------------------------+
#     | conn_id   | frame: 4 + L bytes (protocol/frame.py draws it)  |
#     | u64       |                                                  |
#     +-----------+--------------------------------------------------+
CONN_ID = np.dtype([("conn_id", "<u8")])
CONN_ID_STRUCT = struct.Struct("<Q")


# CONNECTION_OPENED and CONNECTION_CLOSED (one layout, CONNECTION_EVENT):
#
#     +0          +8          +16     +18     +19     +20                          +66   +72
#     +-----------+-----------+-------+-------+-------+----------------------------+-----+
#     | conn_id   | time_ms   | peer  |reason | host  | peer_host: ASCII, zero     | pad |
#     | u64       | i64 epoch | port  | u8    | size  | padded (INET6_ADDRSTRLEN)  |     |
#     |           |           | u16   |       | u8    | 46 bytes                   |     |
#     +-----------+-----------+-------+-------+-------+----------------------------+-----+
CONNECTION_EVENT = np.dtype(
    {
        "names": ["conn_id", "time_ms", "peer_port", "reason", "peer_host_size", "peer_host"],
        "formats": ["<u8", "<i8", "<u2", "u1", "u1", f"S{PEER_HOST_SIZE_BYTES_MAX}"],
        "offsets": [0, 8, 16, 18, 19, 20],
        "itemsize": 72,
    }
)
CONNECTION_EVENT_STRUCT = struct.Struct(f"<QqHBB{PEER_HOST_SIZE_BYTES_MAX}s6x")


# COMMAND: one decoded request (or a client's response to a broker request). The codec decoded and
# checked the header; the parcel carries the header bytes as the client sent them, and the
# processor decodes them again with protocol.decode_command. Why not a re-encoded or typed header:
# the processor needs a whole RemotingCommand anyway, re-encoding costs the codec as much as the
# processor's second parse saves, and passing the client's bytes keeps every header format owned
# by mqbox/protocol alone (JSON with numbers or strings, or the ROCKETMQ binary layout).
#
#     +0        +8      +12     +16     +20      +24        +28   +30  +31  +32       +36   +40
#     +---------+-------+-------+-------+--------+----------+-----+----+----+---------+-----+
#     | conn_id | opaque| code  | flag  | version| peer_ipv4| peer| ser| lan| header  | gen |
#     | u64     | i32   | i32   | i32   | i32    | u32 (BE  | port| ial| gua| size    | u32 |
#     |         |       |       |       |        | octets)  | u16 | u8 | u8 | u32     |     |
#     +---------+-------+-------+-------+--------+----------+-----+----+----+---------+-----+
#     +40: header (header_size bytes), then the body (the rest of the payload)
#
#     gen: the generation of the processor the worker routed a tracked request to (worker.py,
#     "serving generation"); 0 from the codec, for untracked requests and for spilled parcels.
#     A processor drops a request stamped with an older generation than its own: the worker has
#     answered it SYSTEM_ERROR, and serving it again would store a failed send a second time.
COMMAND_HEAD = np.dtype(
    {
        "names": [
            "conn_id",
            "opaque",
            "code",
            "flag",
            "version",
            "peer_ipv4",
            "peer_port",
            "serialize_type",
            "language",
            "header_size",
            "serving_generation",
        ],
        "formats": ["<u8", "<i4", "<i4", "<i4", "<i4", "S4", "<u2", "u1", "u1", "<u4", "<u4"],
        "offsets": [0, 8, 12, 16, 20, 24, 28, 30, 31, 32, 36],
        "itemsize": 40,
    }
)
COMMAND_HEAD_STRUCT = struct.Struct("<Qiiii4sHBBII")
COMMAND_SERVING_GENERATION_STRUCT = struct.Struct("<I")
COMMAND_SERVING_GENERATION_POSITION_BYTES: Final = 36


# REPLY: what a processor answers, with the header already encoded by protocol.encode_header in the
# request's serialize type. Why pre-encoded: the processor holds the RemotingCommand it built, and
# encoding it there costs one orjson call; sending the fields instead would make the codec rebuild
# a dict and encode it again. The codec adds the frame prefix (it owns framing and the frame size
# limit) and picks the reactor.
#
#     +0        +8      +12   +13   +14   +16           +20         +24                +32
#     +---------+-------+-----+-----+-----+-------------+-----------+------------------+
#     | conn_id | opaque| ser | flags| pad | header_size | run_count | body_size        |
#     | u64     | i32   | u8  | u8  | u16 | u32         | u32       | u64              |
#     +---------+-------+-----+-----+-----+-------------+-----------+------------------+
#     +32: run_count runs (RUN, 24 bytes each), then the header, then the inline body
#          (run_count == 0) or nothing (the runs' bytes are the body: sendfile)
REPLY_HEAD = np.dtype(
    {
        "names": [
            "conn_id",
            "opaque",
            "serialize_type",
            "flags",
            "header_size",
            "run_count",
            "body_size",
        ],
        "formats": ["<u8", "<i4", "u1", "u1", "<u4", "<u4", "<u8"],
        "offsets": [0, 8, 12, 13, 16, 20, 24],
        "itemsize": 32,
    }
)
REPLY_HEAD_STRUCT = struct.Struct("<QiBB2xIIQ")


# RESPONSE: wire bytes for one connection: the whole frame, or (run_count > 0) the frame's prefix
# and header, which the reactor follows with os.sendfile of each run from the commit log.
#
#     +0        +8          +12      +16
#     +---------+-----------+--------+------------------------------------------+
#     | conn_id | run_count | flags  | runs (24 bytes each), then the bytes     |
#     | u64     | u32       | u32    |                                          |
#     +---------+-----------+--------+------------------------------------------+
RESPONSE_HEAD = np.dtype(
    {
        "names": ["conn_id", "run_count", "flags"],
        "formats": ["<u8", "<u4", "<u4"],
        "offsets": [0, 8, 12],
        "itemsize": 16,
    }
)
RESPONSE_HEAD_STRUCT = struct.Struct("<QII")


# RUN: one piece of a read plan: bytes [file_offset, file_offset + size) of the commit-log segment
# whose first byte is at log offset segment_start (store/layout.py names the file).
#
#     +0                +8                 +16            +24
#     | segment_start i64 | file_offset i64 | size i64    |
RUN = np.dtype(
    {
        "names": ["segment_start", "file_offset", "size"],
        "formats": ["<i8", "<i8", "<i8"],
        "offsets": [0, 8, 16],
        "itemsize": 24,
    }
)
RUN_STRUCT = struct.Struct("<qqq")


# CLOSE_CONNECTION: close this connection once its queued output is written (at once when the
# reason is CLOSE_REASON_IDLE: a connection idle that long with output queued does not read).
#
#     +0        +8       +12
#     | conn_id | reason | pad |
#     | u64     | u32    | u32 |
CLOSE_CONNECTION_HEAD = np.dtype(
    {"names": ["conn_id", "reason"], "formats": ["<u8", "<u4"], "offsets": [0, 8], "itemsize": 16}
)
CLOSE_CONNECTION_STRUCT = struct.Struct("<QI4x")


# NO_ANSWER: `count` frames of the connection that nobody answers (ONEWAY requests, the client's
# responses to broker requests), so the reactor's count of its requests in flight (reactor.py)
# drops by them; the codec sends at most one per connection per batch of frames.
#
#     +0        +8      +12
#     | conn_id | count | pad |
#     | u64     | u32   | u32 |
NO_ANSWER_HEAD = np.dtype(
    {"names": ["conn_id", "count"], "formats": ["<u8", "<u4"], "offsets": [0, 8], "itemsize": 16}
)
NO_ANSWER_STRUCT = struct.Struct("<QI4x")


# COMPLETED: requests the codec has answered, so the worker stops tracking them. Lazy: the codec
# sends these with other traffic to the same worker or after COMPLETED_FLUSH_INTERVAL_NS, never as
# a wake-up of their own (worker.py says why a late notice is harmless).
#
#     +0      +8
#     | count | pad | count x COMPLETED_ENTRY (conn_id u64, opaque i32, pad i32) |
COMPLETED_HEAD = np.dtype(
    {"names": ["count"], "formats": ["<u4"], "offsets": [0], "itemsize": 8},
)
COMPLETED_HEAD_STRUCT = struct.Struct("<I4x")
COMPLETED_ENTRY = np.dtype(
    {"names": ["conn_id", "opaque"], "formats": ["<u8", "<i4"], "offsets": [0, 8], "itemsize": 16}
)
COMPLETED_ENTRY_STRUCT = struct.Struct("<Qi4x")


# REQUEST_FAILED: the worker asks an admin processor to answer a request with an error (a processor
# died with the request in flight, and the worker has no ring to the codecs).
#
#     +0        +8      +12            +16   +17   +20          +24
#     | conn_id | opaque| response_code| ser | pad | remark_size| remark (UTF-8) |
#     | u64     | i32   | i32          | u8  |     | u32        |                |
REQUEST_FAILED_HEAD = np.dtype(
    {
        "names": ["conn_id", "opaque", "response_code", "serialize_type", "remark_size"],
        "formats": ["<u8", "<i4", "<i4", "u1", "<u4"],
        "offsets": [0, 8, 12, 16, 20],
        "itemsize": 24,
    }
)
REQUEST_FAILED_HEAD_STRUCT = struct.Struct("<QiiB3xI")


# APPEND: the stored records of one SEND (one message, or every element of a batch), all for one
# (topic, queue_id), encoded by the send processor with the store-side fields zero; the store
# writer patches QUEUEOFFSET, PHYSICALOFFSET, STORETIMESTAMP and STOREHOST as it copies them into
# the commit log. `flags` bit 0 (APPEND_FLAG_WAIT_FLUSH): under SYNC_FLUSH, acknowledge only once a
# flush covers the records (the message's WAIT property, true unless the client said false). Bit 1
# (APPEND_FLAG_IDEMPOTENT): the send asked for the idempotent window (store/idempotence.py); the
# writer drops each record whose (topic, UNIQ_KEY) it stored within the window.
#
#     +0           +8            +12       +16     +20          +24              +32
#     | request_id | record_count| queue_id| flags | topic_size | records_size   |
#     | u64        | u32         | i32     | u32   | u32        | u64            |
#     +32: topic (UTF-8, zero padded to a multiple of 8), then record_count sizes (i32, zero padded
#          to a multiple of 8), then the records back to back (records_size bytes)
APPEND_HEAD = np.dtype(
    {
        "names": [
            "request_id",
            "record_count",
            "queue_id",
            "flags",
            "topic_size",
            "records_size",
        ],
        "formats": ["<u8", "<u4", "<i4", "<u4", "<u4", "<u8"],
        "offsets": [0, 8, 12, 16, 20, 24],
        "itemsize": 32,
    }
)
APPEND_HEAD_STRUCT = struct.Struct("<QIiIIQ")


# APPEND_ACK: the store writer's answer to one APPEND, to the role that sent it (a send processor
# or the schedule role).
# response_code is the SEND response code (0 stored; 10 FLUSH_DISK_TIMEOUT only after a real
# sync-flush timeout; 13, 1, 14 refused, nothing stored), the remark says why.
#
#   +0           +8                +16           +24                 +32          +36      +40
#   | request_id | log_offset      | queue_index | store_timestamp_ms| record_count| code   | remark
#   | u64        | i64 first record| i64 first   | i64               | u32          | i32    | _size
#     +40: remark_size u32, duplicate_count u32; +48: remark (UTF-8)
#     then, only when duplicate_count > 0 (an idempotent APPEND some of whose records the window
#     already held): queue_id i32 of the first record, then record_count log offsets i64, one per
#     record of the APPEND in its order (a duplicate's is the record stored first), unaligned.
#     log_offset and queue_index then describe the first record, stored now or before.
APPEND_ACK_HEAD = np.dtype(
    {
        "names": [
            "request_id",
            "log_offset",
            "queue_index",
            "store_timestamp_ms",
            "record_count",
            "response_code",
            "remark_size",
            "duplicate_count",
        ],
        "formats": ["<u8", "<i8", "<i8", "<i8", "<u4", "<i4", "<u4", "<u4"],
        "offsets": [0, 8, 16, 24, 32, 36, 40, 44],
        "itemsize": 48,
    }
)
APPEND_ACK_HEAD_STRUCT = struct.Struct("<QqqqIiII")
_ACK_QUEUE_ID_STRUCT = struct.Struct("<i")


# WRITTEN: the commit log's write position moved (every byte below it is whole records or blanks).
# The dispatcher takes the largest it drained; the store writer sends at most one per loop turn.
#
#     +0                       +8
#     | write_log_offset_bytes | appended_record_total |
#     | i64                    | i64 (since the writer started) |
WRITTEN_HEAD = np.dtype(
    {
        "names": ["write_log_offset", "appended_record_total"],
        "formats": ["<i8", "<i8"],
        "offsets": [0, 8],
        "itemsize": 16,
    }
)
WRITTEN_HEAD_STRUCT = struct.Struct("<qq")


# REPLICATED (ha_service.0 -> store_writer on a master): the slaves' greatest acknowledged
# position moved, or the number of connected slaves changed. SYNC_MASTER acks wait on it.
#
#     +0                        +8
#     | acked_log_offset_bytes  | slave_count |
#     | i64                     | i64         |
REPLICATED_HEAD = np.dtype(
    {
        "names": ["acked_log_offset", "slave_count"],
        "formats": ["<i8", "<i8"],
        "offsets": [0, 8],
        "itemsize": 16,
    }
)
REPLICATED_HEAD_STRUCT = struct.Struct("<qq")


# REPLICA (ha_client.0 -> store_writer on a slave): the master's commit-log bytes from
# log_offset, whole records only, the last of them possibly a segment's end blank (the HA
# client drops the blank's padding). The store writer appends them byte-identically.
#
#     +0             +8
#     | log_offset   | data: the rest of the parcel |
#     | i64          |                              |
REPLICA_HEAD = np.dtype({"names": ["log_offset"], "formats": ["<i8"], "itemsize": 8})
REPLICA_HEAD_STRUCT = struct.Struct("<q")


# QUEUES_GREW: after a dispatch batch, the queues whose entry count grew, as queue_counters keys
# (64-bit hashes of (topic, queue_id)); with QUEUES_GREW_FLAG_MANY the list is empty and every
# held pull should look again.
#
#     +0                            +8          +12     +16
#     | dispatched_log_offset_bytes | key_count   | flags | keys: key_count x u64 |
#     | i64                         | u32         | u32   |                       |
QUEUES_GREW_HEAD = np.dtype(
    {
        "names": ["dispatched_log_offset", "key_count", "flags"],
        "formats": ["<i8", "<u4", "<u4"],
        "offsets": [0, 8, 12],
        "itemsize": 16,
    }
)
QUEUES_GREW_HEAD_STRUCT = struct.Struct("<qII")


# SPILLED (type = a type above | SPILLED_FLAG): a payload longer than the ring's inline maximum.
# Its fixed head stays inline, so a role that only forwards the parcel (the worker) routes it
# without reading the file; the rest of the payload is in a file in /dev/shm named
# `mqbox.<instance>.spill-<producer role>.<n>` (names.py's scheme, so the supervisor's sweep
# removes what a crash leaves). The file belongs to whoever holds the parcel: the role that uses
# the payload reads the file and unlinks it after it has released the parcel, so a parcel that is
# delivered again after a consumer crash still finds its file.
#
#     +0          +4          +8           +16
#     | head_size | name_size | file_size  | head (head_size) | name (name_size, file in /dev/shm) |
#     | u32       | u32       | u64        |                  |                                    |
SPILL_HEAD = np.dtype(
    {
        "names": ["head_size", "name_size", "file_size"],
        "formats": ["<u4", "<u4", "<u8"],
        "offsets": [0, 4, 8],
        "itemsize": 16,
    }
)
SPILL_HEAD_STRUCT = struct.Struct("<IIQ")

COMMAND_HEAD_SIZE_BYTES: Final = COMMAND_HEAD_STRUCT.size
REPLY_HEAD_SIZE_BYTES: Final = REPLY_HEAD_STRUCT.size
RESPONSE_HEAD_SIZE_BYTES: Final = RESPONSE_HEAD_STRUCT.size
RUN_SIZE_BYTES: Final = RUN_STRUCT.size
CONN_ID_SIZE_BYTES: Final = CONN_ID_STRUCT.size
COMPLETED_ENTRY_SIZE_BYTES: Final = COMPLETED_ENTRY_STRUCT.size


def _struct_fields_match(dtype: np.dtype[np.void], twin: struct.Struct) -> bool:
    """Pack distinct values with the dtype, unpack with the twin: same values, same order."""
    probe = np.zeros(1, dtype=dtype)
    expected: list[object] = []
    for number, name in enumerate(dtype.names or ()):
        kind = dtype.fields[name][0] if dtype.fields else None
        assert kind is not None
        value: object = bytes([65 + number]) * kind.itemsize if kind.kind == "S" else number + 1
        probe[name] = value
        expected.append(value)
    unpacked = twin.unpack(probe.tobytes())
    return list(unpacked) == expected


for _dtype, _twin in (
    (CONN_ID, CONN_ID_STRUCT),
    (CONNECTION_EVENT, CONNECTION_EVENT_STRUCT),
    (COMMAND_HEAD, COMMAND_HEAD_STRUCT),
    (REPLY_HEAD, REPLY_HEAD_STRUCT),
    (RESPONSE_HEAD, RESPONSE_HEAD_STRUCT),
    (RUN, RUN_STRUCT),
    (CLOSE_CONNECTION_HEAD, CLOSE_CONNECTION_STRUCT),
    (NO_ANSWER_HEAD, NO_ANSWER_STRUCT),
    (COMPLETED_HEAD, COMPLETED_HEAD_STRUCT),
    (COMPLETED_ENTRY, COMPLETED_ENTRY_STRUCT),
    (REQUEST_FAILED_HEAD, REQUEST_FAILED_HEAD_STRUCT),
    (APPEND_HEAD, APPEND_HEAD_STRUCT),
    (APPEND_ACK_HEAD, APPEND_ACK_HEAD_STRUCT),
    (WRITTEN_HEAD, WRITTEN_HEAD_STRUCT),
    (QUEUES_GREW_HEAD, QUEUES_GREW_HEAD_STRUCT),
    (REPLICATED_HEAD, REPLICATED_HEAD_STRUCT),
    (REPLICA_HEAD, REPLICA_HEAD_STRUCT),
    (SPILL_HEAD, SPILL_HEAD_STRUCT),
):
    assert _dtype.itemsize == _twin.size
    assert _twin.size % 8 == 0  # what follows a head starts 8-byte aligned
    assert _struct_fields_match(_dtype, _twin)
assert max(PARCEL_TYPE_NAMES) < SPILLED_FLAG
assert SPILLED_FLAG | max(PARCEL_TYPE_NAMES) <= 2**31 - 1


# ---------------------------------------------------------------------------------------------
# Connection ids
#
#    bit 63      56 55                       32 31                             0
#        +---------+---------------------------+-------------------------------+
#        | reactor | generation: the reactor's | counter, from 1, per reactor  |
#        | index   | pid, low 24 bits          | process                       |
#        +---------+---------------------------+-------------------------------+
#
# The reactor index in the top byte tells the codec where a response goes; the generation keeps a
# restarted reactor's ids apart from those its predecessor left in codec and worker tables.

CONN_ID_REACTOR_SHIFT: Final = 56
CONN_ID_GENERATION_SHIFT: Final = 32
CONN_ID_GENERATION_MASK: Final = (1 << 24) - 1
CONN_ID_COUNTER_MASK: Final = (1 << 32) - 1
REACTOR_COUNT_MAX: Final = 256


def make_conn_id(reactor_index: int, generation: int, counter: int) -> int:
    assert 0 <= reactor_index < REACTOR_COUNT_MAX
    assert 0 < counter <= CONN_ID_COUNTER_MASK
    return (
        (reactor_index << CONN_ID_REACTOR_SHIFT)
        | ((generation & CONN_ID_GENERATION_MASK) << CONN_ID_GENERATION_SHIFT)
        | counter
    )


def reactor_of(conn_id: int) -> int:
    """The index of the reactor that owns the connection's socket."""
    return conn_id >> CONN_ID_REACTOR_SHIFT


# ---------------------------------------------------------------------------------------------
# Packing and unpacking. Pack functions return the fixed head; variable parts follow it in the
# Outbox call, so nothing is joined twice.


@dataclasses.dataclass(frozen=True, slots=True)
class ConnectionEvent:
    """A CONNECTION_OPENED or CONNECTION_CLOSED parcel."""

    conn_id: int
    time_ms: int
    peer_host: str
    peer_port: int
    reason: int = CLOSE_REASON_PEER


def pack_connection_event(event: ConnectionEvent) -> bytes:
    host = event.peer_host.encode("ascii")
    assert len(host) < PEER_HOST_SIZE_BYTES_MAX
    assert 0 <= event.peer_port <= 0xFFFF
    return CONNECTION_EVENT_STRUCT.pack(
        event.conn_id, event.time_ms, event.peer_port, event.reason, len(host), host
    )


def unpack_connection_event(buffer: Buffer, offset: int = 0) -> ConnectionEvent:
    conn_id, time_ms, peer_port, reason, host_size, host = CONNECTION_EVENT_STRUCT.unpack_from(
        buffer, offset
    )
    assert host_size < PEER_HOST_SIZE_BYTES_MAX
    return ConnectionEvent(conn_id, time_ms, host[:host_size].decode("ascii"), peer_port, reason)


def pack_conn_id(conn_id: int) -> bytes:
    return CONN_ID_STRUCT.pack(conn_id)


def unpack_conn_id(buffer: Buffer, offset: int = 0) -> int:
    conn_id: int = CONN_ID_STRUCT.unpack_from(buffer, offset)[0]
    return conn_id


class CommandHead(NamedTuple):
    """The fixed part of a COMMAND parcel; header_size bytes of header follow, then the body."""

    conn_id: int
    opaque: int
    code: int
    flag: int
    version: int
    peer_ipv4: bytes  # 4 octets, network order; 0.0.0.0 for a peer that is not IPv4
    peer_port: int
    serialize_type: int
    language: int
    header_size: int
    serving_generation: int  # 0 from the codec; the worker stamps tracked requests


pack_command_head = COMMAND_HEAD_STRUCT.pack  # (conn_id, opaque, code, flag, version, peer_ipv4,
# peer_port, serialize_type, language, header_size, serving_generation): once per request, so no
# wrapper


def unpack_command_head(buffer: Buffer, offset: int = 0) -> CommandHead:
    return CommandHead._make(COMMAND_HEAD_STRUCT.unpack_from(buffer, offset))


def stamped_command_head(head: Buffer, serving_generation: int) -> bytearray:
    """A copy of a COMMAND's fixed head with its serving generation set (the worker's stamp)."""
    stamped = bytearray(head)
    assert len(stamped) == COMMAND_HEAD_SIZE_BYTES
    COMMAND_SERVING_GENERATION_STRUCT.pack_into(
        stamped, COMMAND_SERVING_GENERATION_POSITION_BYTES, serving_generation
    )
    return stamped


def command_serving_generation(buffer: Buffer, offset: int = 0) -> int:
    """The serving generation stamped on the COMMAND whose head is at `offset`; 0 if none."""
    (generation,) = COMMAND_SERVING_GENERATION_STRUCT.unpack_from(
        buffer, offset + COMMAND_SERVING_GENERATION_POSITION_BYTES
    )
    return int(generation)


def unpack_command_route(buffer: Buffer, offset: int = 0) -> tuple[int, int, int, int, int]:
    """(conn_id, opaque, code, flag, serialize_type) of a COMMAND: what the worker routes by."""
    fields = COMMAND_HEAD_STRUCT.unpack_from(buffer, offset)
    return fields[0], fields[1], fields[2], fields[3], fields[7]


@dataclasses.dataclass(frozen=True, slots=True)
class Run:
    """Bytes [file_offset, file_offset + size) of the commit-log segment starting at
    log offset segment_start."""

    segment_start: int
    file_offset: int
    size: int


def pack_runs(runs: Sequence[Run | tuple[int, int, int]]) -> bytes:
    parts = []
    for run in runs:
        segment_start, file_offset, size = (
            (run.segment_start, run.file_offset, run.size) if isinstance(run, Run) else run
        )
        assert segment_start >= 0
        assert file_offset >= 0
        assert size > 0
        parts.append(RUN_STRUCT.pack(segment_start, file_offset, size))
    return b"".join(parts)


def unpack_runs(buffer: Buffer, offset: int, run_count: int) -> list[Run]:
    return [
        Run(*fields) for fields in RUN_STRUCT.iter_unpack(buffer[offset : offset + run_count * 24])
    ]


class ReplyHead(NamedTuple):
    """The fixed part of a REPLY parcel."""

    conn_id: int
    opaque: int
    serialize_type: int
    flags: int
    header_size: int
    run_count: int
    body_size: int


def pack_reply_head(
    conn_id: int,
    opaque: int,
    serialize_type: int,
    flags: int,
    header_size: int,
    run_count: int,
    body_size: int,
) -> bytes:
    return REPLY_HEAD_STRUCT.pack(
        conn_id, opaque, serialize_type, flags, header_size, run_count, body_size
    )


def unpack_reply_head(buffer: Buffer, offset: int = 0) -> ReplyHead:
    return ReplyHead._make(REPLY_HEAD_STRUCT.unpack_from(buffer, offset))


def pack_response_head(conn_id: int, run_count: int, flags: int) -> bytes:
    return RESPONSE_HEAD_STRUCT.pack(conn_id, run_count, flags)


def unpack_response_head(buffer: Buffer, offset: int = 0) -> tuple[int, int, int]:
    """(conn_id, run_count, flags) of a RESPONSE."""
    fields: tuple[int, int, int] = RESPONSE_HEAD_STRUCT.unpack_from(buffer, offset)
    return fields


def pack_close_connection(conn_id: int, reason: int) -> bytes:
    return CLOSE_CONNECTION_STRUCT.pack(conn_id, reason)


def unpack_close_connection(buffer: Buffer, offset: int = 0) -> tuple[int, int]:
    """(conn_id, reason) of a CLOSE_CONNECTION."""
    fields: tuple[int, int] = CLOSE_CONNECTION_STRUCT.unpack_from(buffer, offset)
    return fields


def pack_no_answer(conn_id: int, count: int) -> bytes:
    assert count > 0
    return NO_ANSWER_STRUCT.pack(conn_id, count)


def unpack_no_answer(buffer: Buffer, offset: int = 0) -> tuple[int, int]:
    """(conn_id, count) of a NO_ANSWER parcel."""
    fields: tuple[int, int] = NO_ANSWER_STRUCT.unpack_from(buffer, offset)
    return fields


def pack_completed(entries: Sequence[tuple[int, int]]) -> bytes:
    """A COMPLETED payload for (conn_id, opaque) pairs."""
    parts = [COMPLETED_HEAD_STRUCT.pack(len(entries))]
    parts.extend(COMPLETED_ENTRY_STRUCT.pack(conn_id, opaque) for conn_id, opaque in entries)
    return b"".join(parts)


def unpack_completed(buffer: Buffer, offset: int, size: int) -> list[tuple[int, int]]:
    (count,) = COMPLETED_HEAD_STRUCT.unpack_from(buffer, offset)
    start = offset + COMPLETED_HEAD_STRUCT.size
    assert COMPLETED_HEAD_STRUCT.size + count * COMPLETED_ENTRY_SIZE_BYTES == size
    return list(COMPLETED_ENTRY_STRUCT.iter_unpack(buffer[start : start + count * 16]))


@dataclasses.dataclass(frozen=True, slots=True)
class RequestFailed:
    conn_id: int
    opaque: int
    response_code: int
    serialize_type: int
    remark: str


def pack_request_failed(failed: RequestFailed) -> bytes:
    remark = java_utf8_encode(failed.remark)
    head = REQUEST_FAILED_HEAD_STRUCT.pack(
        failed.conn_id, failed.opaque, failed.response_code, failed.serialize_type, len(remark)
    )
    return head + remark


def unpack_request_failed(buffer: Buffer, offset: int, size: int) -> RequestFailed:
    conn_id, opaque, response_code, serialize_type, remark_size = (
        REQUEST_FAILED_HEAD_STRUCT.unpack_from(buffer, offset)
    )
    start = offset + REQUEST_FAILED_HEAD_STRUCT.size
    assert REQUEST_FAILED_HEAD_STRUCT.size + remark_size == size
    remark = java_utf8_decode(buffer[start : start + remark_size])
    return RequestFailed(conn_id, opaque, response_code, serialize_type, remark)


def padded_size_bytes(size_bytes: int) -> int:
    """`size_bytes` rounded up to a multiple of 8 (the variable parts of APPEND are 8-aligned)."""
    return (size_bytes + 7) & ~7


class AppendView(NamedTuple):
    """Where the parts of an APPEND parcel lie in the buffer it was read from."""

    request_id: int
    record_count: int
    queue_id: int
    flags: int
    topic: bytes
    sizes_offset: int  # record_count int32 sizes start here (8-aligned in the ring)
    records_offset: int  # the records start here
    records_size: int


def pack_append_head(
    request_id: int,
    record_count: int,
    queue_id: int,
    flags: int,
    topic: bytes,
    records_size_bytes: int,
) -> bytes:
    """APPEND's fixed head and its zero-padded topic; the caller appends the sizes (padded with
    `padded_size_bytes`) and the records as the parcel's tail."""
    assert record_count > 0
    assert 0 < len(topic) <= 127
    assert records_size_bytes > 0
    head = APPEND_HEAD_STRUCT.pack(
        request_id, record_count, queue_id, flags, len(topic), records_size_bytes
    )
    return head + topic + bytes(padded_size_bytes(len(topic)) - len(topic))


def unpack_append(buffer: Buffer, offset: int, size: int) -> AppendView:
    """The parts of the APPEND parcel at `offset` (`size` bytes), checked against its size."""
    request_id, record_count, queue_id, flags, topic_size, records_size = (
        APPEND_HEAD_STRUCT.unpack_from(buffer, offset)
    )
    topic_offset = offset + APPEND_HEAD_STRUCT.size
    sizes_offset = topic_offset + padded_size_bytes(topic_size)
    records_offset = sizes_offset + padded_size_bytes(4 * record_count)
    assert records_offset + records_size == offset + size, "APPEND parts do not fill the parcel"
    topic = bytes(buffer[topic_offset : topic_offset + topic_size])
    return AppendView(
        request_id, record_count, queue_id, flags, topic, sizes_offset, records_offset, records_size
    )


class AppendAck(NamedTuple):
    """An APPEND_ACK parcel: where the records of one APPEND went, or why they did not."""

    request_id: int
    log_offset_bytes: int  # the first record's; -1 when nothing was stored
    queue_index: int  # the first record's QUEUEOFFSET
    store_timestamp_ms: int
    record_count: int
    response_code: int
    remark: str
    # An idempotent APPEND with records the window held: how many, the first record's queue id,
    # and every record's log offset (a duplicate's: the record stored first). 0, -1, () else.
    duplicate_count: int = 0
    queue_id: int = -1
    log_offsets_bytes: tuple[int, ...] = ()


def pack_append_ack(ack: AppendAck) -> bytes:
    remark = java_utf8_encode(ack.remark)
    head = APPEND_ACK_HEAD_STRUCT.pack(
        ack.request_id,
        ack.log_offset_bytes,
        ack.queue_index,
        ack.store_timestamp_ms,
        ack.record_count,
        ack.response_code,
        len(remark),
        ack.duplicate_count,
    )
    if not ack.duplicate_count:
        return head + remark
    assert len(ack.log_offsets_bytes) == ack.record_count
    offsets = np.array(ack.log_offsets_bytes, dtype="<i8").tobytes()
    return head + remark + _ACK_QUEUE_ID_STRUCT.pack(ack.queue_id) + offsets


def unpack_append_ack(buffer: Buffer, offset: int, size: int) -> AppendAck:
    (
        request_id,
        log_offset,
        queue_index,
        store_timestamp_ms,
        record_count,
        code,
        remark_size,
        duplicate_count,
    ) = APPEND_ACK_HEAD_STRUCT.unpack_from(buffer, offset)
    start = offset + APPEND_ACK_HEAD_STRUCT.size
    remark = java_utf8_decode(buffer[start : start + remark_size])
    if not duplicate_count:
        assert APPEND_ACK_HEAD_STRUCT.size + remark_size == size
        return AppendAck(
            request_id, log_offset, queue_index, store_timestamp_ms, record_count, code, remark
        )
    tail = start + remark_size
    assert size == APPEND_ACK_HEAD_STRUCT.size + remark_size + 4 + 8 * record_count
    (queue_id,) = _ACK_QUEUE_ID_STRUCT.unpack_from(buffer, tail)
    offsets = np.frombuffer(bytes(buffer[tail + 4 : tail + 4 + 8 * record_count]), dtype="<i8")
    return AppendAck(
        request_id,
        log_offset,
        queue_index,
        store_timestamp_ms,
        record_count,
        code,
        remark,
        duplicate_count,
        queue_id,
        tuple(offsets.tolist()),
    )


def pack_written(write_log_offset_bytes: int, appended_record_total: int) -> bytes:
    assert write_log_offset_bytes >= 0
    return WRITTEN_HEAD_STRUCT.pack(write_log_offset_bytes, appended_record_total)


def unpack_written(buffer: Buffer, offset: int = 0) -> tuple[int, int]:
    """(write_log_offset_bytes, appended_record_total) of a WRITTEN parcel."""
    fields: tuple[int, int] = WRITTEN_HEAD_STRUCT.unpack_from(buffer, offset)
    return fields


def pack_replicated(acked_log_offset_bytes: int, slave_count: int) -> bytes:
    assert acked_log_offset_bytes >= 0
    assert slave_count >= 0
    return REPLICATED_HEAD_STRUCT.pack(acked_log_offset_bytes, slave_count)


def unpack_replicated(buffer: Buffer, offset: int = 0) -> tuple[int, int]:
    """(acked_log_offset_bytes, slave_count) of a REPLICATED parcel."""
    fields: tuple[int, int] = REPLICATED_HEAD_STRUCT.unpack_from(buffer, offset)
    return fields


def unpack_replica(buffer: Buffer, offset: int, size: int) -> tuple[int, memoryview]:
    """(log_offset_bytes, data) of a REPLICA parcel; data is a view into `buffer`."""
    (log_offset_bytes,) = REPLICA_HEAD_STRUCT.unpack_from(buffer, offset)
    start = offset + REPLICA_HEAD_STRUCT.size
    return int(log_offset_bytes), memoryview(buffer)[start : offset + size]


def pack_queues_grew(dispatched_log_offset_bytes: int, keys: bytes, flags: int = 0) -> bytes:
    """QUEUES_GREW with `keys`, the packed little-endian u64 queue keys (an empty bytes with
    QUEUES_GREW_FLAG_MANY)."""
    assert len(keys) % 8 == 0
    assert not (flags & QUEUES_GREW_FLAG_MANY) or not keys
    return QUEUES_GREW_HEAD_STRUCT.pack(dispatched_log_offset_bytes, len(keys) // 8, flags) + keys


def unpack_queues_grew(buffer: Buffer, offset: int, size: int) -> tuple[int, int, list[int]]:
    """(dispatched_log_offset_bytes, flags, keys) of a QUEUES_GREW parcel."""
    dispatched, key_count, flags = QUEUES_GREW_HEAD_STRUCT.unpack_from(buffer, offset)
    start = offset + QUEUES_GREW_HEAD_STRUCT.size
    assert QUEUES_GREW_HEAD_STRUCT.size + 8 * key_count == size
    keys = np.frombuffer(buffer, dtype="<u8", count=key_count, offset=start).tolist()
    return dispatched, flags, keys


# ---------------------------------------------------------------------------------------------
# Spill files


def pack_spill(head: Buffer, name: str, file_size_bytes: int) -> bytes:
    name_bytes = name.encode("ascii")
    return (
        SPILL_HEAD_STRUCT.pack(len(head), len(name_bytes), file_size_bytes)
        + bytes(head)
        + name_bytes
    )


def command_head_offset(parcel_type: int, buffer: Buffer, offset: int) -> int:
    """Where the fixed head of the COMMAND parcel at `offset` starts: at `offset`, or inside
    the inline part of a SPILLED one."""
    assert parcel_type & ~SPILLED_FLAG == COMMAND
    if parcel_type == COMMAND:
        return offset
    return spill_head_view(buffer, offset)[0]


def spill_head_view(buffer: Buffer, offset: int) -> tuple[int, int, int, int]:
    """(head offset, head size, name offset, name size) inside a SPILLED parcel at `offset`."""
    head_size, name_size, _file_size = SPILL_HEAD_STRUCT.unpack_from(buffer, offset)
    head_offset = offset + SPILL_HEAD_STRUCT.size
    return head_offset, head_size, head_offset + head_size, name_size
