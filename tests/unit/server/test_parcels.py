"""Goal: every ring parcel of the broker packs and unpacks to the same fields, its numpy dtype
and its struct twin describe the same bytes, connection ids keep the reactor index in the top
byte, and the Outbox/Inbox pair carries parcels through a real ring in order, spilling payloads
above the ring's inline maximum to files that the consumer reads and removes.

Method: hypothesis-chosen field values through each pack/unpack pair, read back a second time
through the dtype (np.frombuffer); Outbox and Inbox around rings created in /dev/shm under a
unique instance name, unlinked (with every spill file) in `finally`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mqbox.ipc import names
from mqbox.ipc.ring import Ring
from mqbox.server import parcels, transport

U64 = st.integers(0, 2**64 - 1)
I32 = st.integers(-(2**31), 2**31 - 1)
U32 = st.integers(0, 2**32 - 1)
U16 = st.integers(0, 2**16 - 1)
U8 = st.integers(0, 255)
I64_NON_NEGATIVE = st.integers(0, 2**63 - 1)


@given(U64, st.integers(-(2**63), 2**63 - 1), U16, U8, st.text("0123456789abcdef.:", max_size=45))
def test_connection_event_round_trips(
    conn_id: int, time_ms: int, port: int, reason: int, host: str
) -> None:
    event = parcels.ConnectionEvent(conn_id, time_ms, host, port, reason)
    packed = parcels.pack_connection_event(event)
    assert len(packed) == parcels.CONNECTION_EVENT.itemsize
    assert parcels.unpack_connection_event(packed) == event
    view = np.frombuffer(packed, dtype=parcels.CONNECTION_EVENT)[0]
    assert int(view["conn_id"]) == conn_id
    assert int(view["peer_port"]) == port
    assert bytes(view["peer_host"]).rstrip(b"\0") == host.encode()


@given(U64, I32, I32, I32, I32, st.binary(min_size=4, max_size=4), U16, U8, U8, U32, U32)
def test_command_head_round_trips(
    conn_id: int,
    opaque: int,
    code: int,
    flag: int,
    version: int,
    peer_ipv4: bytes,
    peer_port: int,
    serialize_type: int,
    language: int,
    header_size: int,
    serving_generation: int,
) -> None:
    fields = (
        conn_id,
        opaque,
        code,
        flag,
        version,
        peer_ipv4,
        peer_port,
        serialize_type,
        language,
        header_size,
        0,
    )
    packed = parcels.pack_command_head(*fields)
    assert len(packed) == parcels.COMMAND_HEAD_SIZE_BYTES
    assert tuple(parcels.unpack_command_head(packed + b"tail")) == fields
    assert parcels.unpack_command_route(packed) == (conn_id, opaque, code, flag, serialize_type)
    view = np.frombuffer(packed, dtype=parcels.COMMAND_HEAD)[0]
    assert int(view["code"]) == code
    assert int(view["header_size"]) == header_size
    assert parcels.command_serving_generation(packed) == 0
    stamped = parcels.stamped_command_head(packed, serving_generation)
    assert tuple(parcels.unpack_command_head(stamped)) == (*fields[:-1], serving_generation)
    assert parcels.command_serving_generation(b"x" + stamped, 1) == serving_generation


@given(U64, I32, U8, U8, U32, U32, I64_NON_NEGATIVE)
def test_reply_head_round_trips(
    conn_id: int,
    opaque: int,
    serialize_type: int,
    flags: int,
    header_size: int,
    run_count: int,
    body_size: int,
) -> None:
    fields = (conn_id, opaque, serialize_type, flags, header_size, run_count, body_size)
    packed = parcels.pack_reply_head(*fields)
    assert len(packed) == parcels.REPLY_HEAD_SIZE_BYTES
    assert tuple(parcels.unpack_reply_head(packed)) == fields
    assert int(np.frombuffer(packed, dtype=parcels.REPLY_HEAD)[0]["body_size"]) == body_size


@given(U64, U32, U32)
def test_response_head_round_trips(conn_id: int, run_count: int, flags: int) -> None:
    packed = parcels.pack_response_head(conn_id, run_count, flags)
    assert parcels.unpack_response_head(packed) == (conn_id, run_count, flags)


@given(
    st.lists(
        st.tuples(I64_NON_NEGATIVE, I64_NON_NEGATIVE, st.integers(1, 2**40)),
        min_size=1,
        max_size=20,
    )
)
def test_runs_round_trip_at_any_offset(runs: list[tuple[int, int, int]]) -> None:
    packed = b"xyz" + parcels.pack_runs(runs)
    unpacked = parcels.unpack_runs(packed, 3, len(runs))
    assert [(run.segment_start, run.file_offset, run.size) for run in unpacked] == runs
    as_array = np.frombuffer(packed[3:], dtype=parcels.RUN)
    assert as_array["size"].tolist() == [size for _, _, size in runs]


@given(U64, U32)
def test_close_connection_round_trips(conn_id: int, reason: int) -> None:
    packed = parcels.pack_close_connection(conn_id, reason)
    assert parcels.unpack_close_connection(packed) == (conn_id, reason)


@given(st.lists(st.tuples(U64, I32), max_size=50))
def test_completed_round_trips(entries: list[tuple[int, int]]) -> None:
    packed = parcels.pack_completed(entries)
    assert parcels.unpack_completed(b"\0" * 8 + packed, 8, len(packed)) == entries
    as_array = np.frombuffer(packed[8:], dtype=parcels.COMPLETED_ENTRY)
    assert as_array["opaque"].tolist() == [opaque for _, opaque in entries]


@given(U64, I32, I32, U8, st.text(max_size=200))
def test_request_failed_round_trips(
    conn_id: int, opaque: int, code: int, serialize_type: int, remark: str
) -> None:
    failed = parcels.RequestFailed(conn_id, opaque, code, serialize_type, remark)
    packed = parcels.pack_request_failed(failed)
    assert parcels.unpack_request_failed(packed, 0, len(packed)) == failed


@given(st.integers(0, 255), st.integers(0, 2**40), st.integers(1, 2**32 - 1))
def test_conn_id_keeps_the_reactor_in_the_top_byte(
    reactor_index: int, generation: int, counter: int
) -> None:
    conn_id = parcels.make_conn_id(reactor_index, generation, counter)
    assert 0 <= conn_id < 2**64
    assert parcels.reactor_of(conn_id) == reactor_index
    assert conn_id & parcels.CONN_ID_COUNTER_MASK == counter


def test_every_fixed_head_keeps_what_follows_aligned() -> None:
    for dtype in (
        parcels.CONN_ID,
        parcels.COMMAND_HEAD,
        parcels.REPLY_HEAD,
        parcels.RESPONSE_HEAD,
        parcels.RUN,
        parcels.CLOSE_CONNECTION_HEAD,
        parcels.COMPLETED_HEAD,
        parcels.REQUEST_FAILED_HEAD,
        parcels.SPILL_HEAD,
    ):
        assert dtype.itemsize % 8 == 0


# ---------------------------------------------------------------------------------------------
# Outbox, Inbox and spill files through a real ring

CAPACITY_BYTES = 4096  # the smallest ring: inline payloads up to 2040 bytes


@pytest.fixture
def ring(shm_instance: str) -> Iterator[Ring]:
    created = Ring.create(names.shm_name(shm_instance, "t", 0), CAPACITY_BYTES)
    try:
        yield created
    finally:
        created.unlink()
        created.close()
        names.unlink_instance(shm_instance)


def drain_all(inbox: transport.Inbox) -> list[tuple[int, bytes]]:
    batch = inbox.drain_nowait()
    found = [
        (parcel_type, bytes(memoryview(buffer)[offset : offset + size]))
        for parcel_type, buffer, offset, size in inbox.parcels(batch)
    ]
    inbox.release(batch)
    return found


def spill_files(instance: str) -> list[Path]:
    return [path for path in names.instance_paths(instance) if ".spill-" in path.name]


def test_outbox_writes_parcels_in_order_in_one_batch(ring: Ring, shm_instance: str) -> None:
    outbox = transport.Outbox(ring, transport.SpillWriter(shm_instance, "codec.0"))
    inbox = transport.Inbox(ring, "codec.0")
    outbox.append(parcels.FRAME, b"12345678", b"abc")
    outbox.append(parcels.COMMAND, b"x" * 40)
    outbox.append(parcels.CLOSE_CONNECTION, parcels.pack_close_connection(7, 1))
    assert outbox.pending_count == 3
    assert outbox.flush_nowait()
    assert outbox.pending_count == 0
    assert drain_all(inbox) == [
        (parcels.FRAME, b"12345678abc"),
        (parcels.COMMAND, b"x" * 40),
        (parcels.CLOSE_CONNECTION, parcels.pack_close_connection(7, 1)),
    ]
    statistics = outbox.statistics()
    assert statistics.parcel_count_written == 3
    assert statistics.batch_count_written == 1


def test_outbox_keeps_what_a_full_ring_refuses_and_sends_it_later(
    ring: Ring, shm_instance: str
) -> None:
    outbox = transport.Outbox(ring, transport.SpillWriter(shm_instance, "reactor.0"))
    inbox = transport.Inbox(ring, "reactor.0")
    payloads = [bytes([index]) * 1000 for index in range(10)]  # 10 KB into a 4 KiB ring
    for payload in payloads:
        outbox.append(parcels.FRAME, payload)
    received: list[bytes] = []
    for _ in range(20):
        done = outbox.flush_nowait()
        received += [payload for _, payload in drain_all(inbox)]
        if done:
            break
    assert received == payloads
    assert outbox.statistics().full_count > 0
    assert spill_files(shm_instance) == []


def test_a_large_parcel_goes_straight_into_the_ring_after_what_is_staged(
    ring: Ring, shm_instance: str
) -> None:
    """Large payloads (transport.py): written at once, parts copied straight in, after the
    staged parcels before them; staged like any other when the ring has no room now."""
    outbox = transport.Outbox(
        ring, transport.SpillWriter(shm_instance, "codec.0"), direct_write_size_bytes_min=500
    )
    inbox = transport.Inbox(ring, "codec.0")
    outbox.append(parcels.COMMAND, b"small")  # staged: its part is under the minimum
    assert outbox.pending_count == 1
    outbox.append(parcels.FRAME, b"head", memoryview(b"B" * 600))
    assert outbox.pending_count == 0  # the staged one went first, then the large one
    assert drain_all(inbox) == [(parcels.COMMAND, b"small"), (parcels.FRAME, b"head" + b"B" * 600)]
    # Fill the ring; the next large parcel is staged, and the small one after it waits behind.
    large = [bytes([index]) * 1500 for index in range(4)]
    for payload in large:
        outbox.append(parcels.FRAME, b"", payload)
    outbox.append(parcels.COMMAND, b"after")
    assert outbox.pending_count > 0
    received: list[tuple[int, bytes]] = []
    for _ in range(20):
        done = outbox.flush_nowait()
        received += drain_all(inbox)
        if done:
            break
    assert received == [
        *((parcels.FRAME, payload) for payload in large),
        (parcels.COMMAND, b"after"),
    ]
    statistics = outbox.statistics()
    assert statistics.direct_count_written >= 2  # the first of the four fitted at once
    assert statistics.parcel_count_written == 7


def test_payload_above_the_inline_maximum_travels_as_a_spill_file(
    ring: Ring, shm_instance: str
) -> None:
    outbox = transport.Outbox(ring, transport.SpillWriter(shm_instance, "reactor.0"))
    inbox = transport.Inbox(ring, "reactor.0")
    head = parcels.pack_conn_id(42)
    tail = os.urandom(ring.payload_size_bytes_max + 1000)
    outbox.append(parcels.FRAME, head, tail)
    outbox.append(parcels.FRAME, head, b"small")
    assert outbox.flush_nowait()
    assert len(spill_files(shm_instance)) == 1
    batch = inbox.drain_nowait()
    assert batch.types.tolist() == [parcels.FRAME | parcels.SPILLED_FLAG, parcels.FRAME]
    # The inline head is readable without opening the file (what the worker routes by).
    buffer = memoryview(batch.data.data)
    head_offset, head_size, _name_offset, _name_size = parcels.spill_head_view(
        buffer, int(batch.offsets[0])
    )
    assert bytes(buffer[head_offset : head_offset + head_size]) == head
    found = [
        (parcel_type, bytes(memoryview(payload)[offset : offset + size]))
        for parcel_type, payload, offset, size in inbox.parcels(batch)
    ]
    assert found == [(parcels.FRAME, head + tail), (parcels.FRAME, head + b"small")]
    assert len(spill_files(shm_instance)) == 1, "the file stays until the parcel is released"
    inbox.release(batch)
    assert spill_files(shm_instance) == []
    assert outbox.statistics().spill_count == 1


def test_a_spilled_parcel_forwarded_unread_keeps_its_file(ring: Ring, shm_instance: str) -> None:
    """The worker forwards a SPILLED COMMAND as it is: the file belongs to the next consumer."""
    outbox = transport.Outbox(ring, transport.SpillWriter(shm_instance, "codec.0"))
    head = parcels.pack_command_head(1, 2, 10, 0, 63, b"\x7f\0\0\x01", 9, 0, 1, 5, 0)
    outbox.append(parcels.COMMAND, head, b"x" * (ring.payload_size_bytes_max + 1))
    assert outbox.flush_nowait()
    batch = ring.drain_nowait(16)
    assert batch.count == 1
    payload = memoryview(batch.payload(0).data)
    route = parcels.unpack_command_route(payload, parcels.spill_head_view(payload, 0)[0])
    assert route == (1, 2, 10, 0, 0)
    ring.release(batch)
    assert len(spill_files(shm_instance)) == 1


def test_a_spill_file_gone_before_the_read_is_counted_and_skipped(
    ring: Ring, shm_instance: str
) -> None:
    outbox = transport.Outbox(ring, transport.SpillWriter(shm_instance, "codec.0"))
    inbox = transport.Inbox(ring, "codec.0")
    outbox.append(parcels.FRAME, b"h" * 8, b"x" * (ring.payload_size_bytes_max + 1))
    outbox.append(parcels.FRAME, b"h" * 8, b"y")
    assert outbox.flush_nowait()
    for path in spill_files(shm_instance):
        path.unlink()
    assert drain_all(inbox) == [(parcels.FRAME, b"h" * 8 + b"y")]
    assert inbox.spill_missing_count == 1


def test_staged_spilled_parcels_count_their_files_in_the_back_pressure(
    ring: Ring, shm_instance: str
) -> None:
    """Issue 9: a SPILLED parcel is a few bytes in the ring but megabytes in /dev/shm; the
    high-water marks of the roles see the megabytes."""
    big = b"x" * (ring.payload_size_bytes_max + 1000)
    outbox = transport.Outbox(ring, transport.SpillWriter(shm_instance, "codec.0"))
    filler = b"f" * ring.payload_size_bytes_max
    outbox.append(parcels.FRAME, filler)  # the ring takes this one, not the three after it
    outbox.append(parcels.FRAME, filler)
    outbox.append(parcels.FRAME, b"h" * 8, big)
    outbox.append(parcels.FRAME, b"h" * 8, big)
    assert not outbox.flush_nowait()
    assert outbox.pending_count == 3
    assert outbox.pending_size_bytes >= len(filler) + 2 * len(big)
    drain_all(transport.Inbox(ring, "codec.0"))
    assert outbox.flush_nowait()
    assert outbox.pending_size_bytes == 0
    # A role that forwards them unread (the worker) counts their files as well.
    forwarder = transport.Outbox(ring, transport.SpillWriter(shm_instance, "worker.0"))
    inbox = transport.Inbox(ring, "codec.0")
    batch = inbox.drain_nowait()
    for parcel_type, buffer, offset, size in inbox.parcels(batch, frozenset({parcels.FRAME})):
        if parcel_type & parcels.SPILLED_FLAG:
            forwarder.append_spilled(parcel_type, memoryview(buffer)[offset : offset + size])
    ring.release(batch)
    assert forwarder.pending_count == 2
    assert forwarder.pending_size_bytes >= 2 * len(big)


def test_the_spill_budget_counts_the_instances_files_and_lets_a_lone_payload_go(
    shm_instance: str,
) -> None:
    budget = transport.SpillBudget(shm_instance, 1000)
    assert budget.used_bytes() == 0
    assert budget.has_room_nowait(5000)  # nothing else spilled: a big payload still goes
    writer = transport.SpillWriter(shm_instance, "reactor.0")
    other = transport.SpillWriter(shm_instance + "x", "reactor.0")  # another instance
    try:
        writer.write([b"a" * 600])
        other.write([b"b" * 5000])
        assert budget.used_bytes() == 600
        assert budget.has_room_nowait(400)
        assert not budget.has_room_nowait(401)
        assert budget.refusal_count == 1
    finally:
        names.unlink_instance(shm_instance)
        names.unlink_instance(shm_instance + "x")


def test_spill_writer_skips_names_left_by_an_earlier_process(shm_instance: str) -> None:
    writer = transport.SpillWriter(shm_instance, "reactor.0")
    leftover = names.SHM_DIRECTORY / names.shm_name(shm_instance, writer.role_part, 0).removeprefix(
        "/"
    )
    leftover.write_bytes(b"old")
    try:
        name = writer.write([b"new"])
        assert name.endswith(".1")
        assert leftover.read_bytes() == b"old"
        assert (names.SHM_DIRECTORY / name).read_bytes() == b"new"
        assert {path.name for path in spill_files(shm_instance)} == {leftover.name, name}
    finally:
        names.unlink_instance(shm_instance)
