"""Goal: the quarantine bookkeeping of transport.Inbox and runtime.ParcelMarks (runtime.py's
module docstring). While a parcel is handled, the role's handling words hold its ring's number
and its position, the byte count since the ring was made, also past a wrap of the ring with its
padding parcel; between batches they say "nothing". The parcel the control block quarantined is
not yielded: it goes to the on_quarantined hook, once, and the parcels around it are yielded.

Method: a real 4 KiB ring in /dev/shm and a real ControlBlock (anonymous shared memory, as the
supervisor makes it), with ParcelMarks given to the Inbox directly instead of through a role
process. Parcels of several sizes are written and drained one at a time, so the ring wraps
several times; each parcel's expected position is the batch's end minus the parcel's size
rounded up to the ring's 8-byte alignment, which holds with or without padding before it.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from mqbox.ipc import names
from mqbox.ipc.layout import PARCEL_ALIGNMENT_BYTES, PARCEL_HEADER_SIZE_BYTES
from mqbox.ipc.ring import Ring
from mqbox.server import control_block, runtime, transport
from mqbox.server.parcels import Buffer

ROLE_ID = "admin.0"


@pytest.fixture
def ring(shm_instance: str) -> Iterator[Ring]:
    created = Ring.create(names.shm_name(shm_instance, "marks", 0), 4096)
    try:
        yield created
    finally:
        created.unlink()
        created.close()


def aligned_size_bytes(payload_size_bytes: int) -> int:
    length = PARCEL_HEADER_SIZE_BYTES + payload_size_bytes
    return -(-length // PARCEL_ALIGNMENT_BYTES) * PARCEL_ALIGNMENT_BYTES


def test_handling_words_name_each_parcel_by_its_position_across_wraps(ring: Ring) -> None:
    control = control_block.ControlBlock.create([ROLE_ID])
    marks = runtime.ParcelMarks(control, ROLE_ID, ["other ring", ring.name])
    inbox = transport.Inbox(ring, "producer", marks)
    positions = []
    for number in range(60):  # about 15 KiB through a 4 KiB ring
        payload = bytes([number]) * (100 + 37 * (number % 9))
        assert ring.try_write_nowait(1, payload)
        batch = inbox.drain_nowait(1)
        for _type, buffer, offset, size in inbox.parcels(batch):
            assert bytes(memoryview(buffer)[offset : offset + size]) == payload
            position = batch.end_bytes - aligned_size_bytes(len(payload))
            assert control.handling(ROLE_ID) == (2, position)
            positions.append(position)
        assert control.handling(ROLE_ID) is None  # the batch is done
        inbox.release(batch)
    assert positions == sorted(set(positions))
    assert positions[-1] > 3 * ring.capacity_bytes


def test_the_quarantined_parcel_goes_to_the_hook_and_the_others_are_yielded(ring: Ring) -> None:
    control = control_block.ControlBlock.create([ROLE_ID])
    for number in range(3):
        assert ring.try_write_nowait(1, f"parcel {number}".encode())
    second_position = aligned_size_bytes(len(b"parcel 0"))
    control.quarantine(ROLE_ID, (1, second_position))
    inbox = transport.Inbox(ring, "producer", runtime.ParcelMarks(control, ROLE_ID, [ring.name]))
    skipped: list[bytes] = []

    def on_quarantined(parcel_type: int, buffer: Buffer, offset: int, size: int) -> None:
        skipped.append(bytes(memoryview(buffer)[offset : offset + size]))

    inbox.on_quarantined = on_quarantined
    batch = inbox.drain_nowait()
    yielded = [
        bytes(memoryview(buffer)[offset : offset + size])
        for _type, buffer, offset, size in inbox.parcels(batch)
    ]
    inbox.release(batch)
    assert yielded == [b"parcel 0", b"parcel 2"]
    assert skipped == [b"parcel 1"]
    assert inbox.quarantined_count == 1


def test_die_on_marker_reads_the_test_hook_setting() -> None:
    setting = "send.0:POISON,codec.0:OTHER"
    assert runtime.die_on_marker_of("send.0", setting) == b"POISON"
    assert runtime.die_on_marker_of("codec.0", setting) == b"OTHER"
    assert runtime.die_on_marker_of("admin.0", setting) is None
    assert runtime.die_on_marker_of("send.0", "") is None
