"""Pull bodies for the client decode tests: stored records back to back, valid or damaged.

Records come from message.encode_record; IPv6 ones are widened from IPv4 ones as a Java broker
stores IPv6 peers (16-byte addresses, sysflag 0x10 / 0x20), which encode_record refuses to make.
Damage follows tests/unit/store/test_kernels.py: torn, overwritten, a header field nudged, an
inner byte hit, noise appended, or pure noise.
"""

from __future__ import annotations

import dataclasses
import struct
from dataclasses import dataclass

from hypothesis import strategies as st

from mqbox import message as m
from tests.support.stored_records import INT64, messages


def widen_hosts(record: bytes, born_v6: bool, store_v6: bool) -> bytes:
    """`record` (IPv4 hosts) with 16-byte host addresses, as a Java broker stores IPv6 peers."""
    (size,) = struct.unpack_from(">i", record, 0)
    (sysflag,) = struct.unpack_from(">i", record, 36)
    born = record[48:52]
    store = record[64:68]
    new_born = (b"\x20\x01\x0d\xb8" + bytes(8) + born) if born_v6 else born
    new_store = (b"\xfe\x80" + bytes(10) + store) if store_v6 else store
    extra = (12 if born_v6 else 0) + (12 if store_v6 else 0)
    sysflag |= (0x10 if born_v6 else 0) | (0x20 if store_v6 else 0)
    head = (
        struct.pack(">i", size + extra) + record[4:36] + struct.pack(">i", sysflag) + record[40:48]
    )
    return head + new_born + record[52:64] + new_store + record[68:]


# --- Bodies -------------------------------------------------------------------------------------

# Born at an IPv4 address that widen_hosts() turns into 2001:db8::a01:203.
pulled_messages = messages.map(
    lambda message: dataclasses.replace(message, born_host=m.pack_host("10.1.2.3", 50123))
)


@dataclass(frozen=True)
class Body:
    data: bytes
    record_positions_bytes: list[int]


@st.composite
def bodies(draw: st.DrawFn, ipv6: bool | None = None) -> Body:
    data = bytearray()
    positions: list[int] = []
    for message in draw(st.lists(pulled_messages, max_size=5)):
        record = bytes(
            m.encode_record(
                message,
                queue_index=draw(st.integers(0, 2**63 - 1)),
                log_offset_bytes=draw(st.integers(0, 2**63 - 1)),
                store_timestamp_ms=draw(INT64),
                store_host=m.pack_host("127.0.0.1", 10911),
            )
        )
        widen = draw(st.booleans()) if ipv6 is None else ipv6
        if widen:
            record = widen_hosts(record, draw(st.booleans()), draw(st.booleans()))
        positions.append(len(data))
        data += record
    return Body(bytes(data), positions)


# Header fields a "nudge" may hit: TOTALSIZE, MAGICCODE, SYSFLAG (whose 0x10 / 0x20 bits move
# every field after the hosts), and the amounts added to them.
NUDGED_FIELDS = ((0, ">i"), (4, ">I"), (36, ">i"))
NUDGES = (-3, -1, 1, 2, 0x10, 0x20, 24)


@st.composite
def damaged_bodies(draw: st.DrawFn) -> Body:
    """A body from bodies(), then one kind of damage (or none), drawn by hypothesis."""
    body = draw(bodies())
    data = bytearray(body.data)
    records = body.record_positions_bytes
    kind = draw(st.sampled_from(["none", "tear", "overwrite", "nudge", "hit", "append", "noise"]))
    if kind == "noise":
        data = bytearray(draw(st.binary(max_size=200)))
    elif kind == "append":
        data.extend(draw(st.binary(max_size=24)))
    elif kind in ("tear", "overwrite") and data:
        at = draw(st.integers(0, len(data) - 1))
        replacement = b"" if kind == "tear" else draw(st.binary(min_size=1, max_size=8))
        data[at : len(data) if kind == "tear" else at + len(replacement)] = replacement
    elif kind == "nudge" and records:
        record_at = draw(st.sampled_from(records))
        field_at, fmt = draw(st.sampled_from(NUDGED_FIELDS))
        width = struct.calcsize(fmt)
        (value,) = struct.unpack_from(fmt, data, record_at + field_at)
        value = (value + draw(st.sampled_from(NUDGES))) % (1 << (8 * width))
        data[record_at + field_at : record_at + field_at + width] = value.to_bytes(width, "big")
    elif kind == "hit" and records:
        record_at = draw(st.sampled_from(records))
        (size,) = struct.unpack_from(">i", data, record_at)
        data[record_at + draw(st.integers(72, size - 1))] = draw(st.integers(0, 255))
    return Body(bytes(data), records)
