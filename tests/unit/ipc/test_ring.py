"""Goal: a ring delivers exactly the parcels written, in order, across wrap-arounds and padding,
refuses what does not fit, and survives a producer that dies between a payload and its header;
the Python paths for one parcel (write) and small batches (drain) leave the segment exactly as
the kernels do.

Method: one process holds both ends of a real shared-memory ring. A plain-Python twin of the
parcel format (struct.unpack_from over a copy of the data area, sharing no helper with the
kernels) parses the ring after every step of a hypothesis-chosen sequence of batch writes and
drains, and must agree with a deque model and with what drain returns; a plain-Python twin of the
placement rule predicts where head ends up. Two rings driven by the same hypothesis-chosen steps,
one through try_write_nowait and drain_nowait (the Python paths where they apply) and one through
the kernels alone (a batch of one, and the scan), must hold byte-identical segments (counters
included) after every step. Producer death is injected deterministically: the test hook stops a
write after staging, and a patched publish stores only part of a batch.
"""

from __future__ import annotations

import collections
import itertools
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import posix_ipc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from numpy.typing import NDArray

from mqbox.errors import ConfigError, MessageTooLargeError
from mqbox.ipc import layout, names
from mqbox.ipc import ring as ring_module
from mqbox.ipc.ring import Ring

CAPACITY_BYTES = layout.CAPACITY_BYTES_MIN
_index = itertools.count()


@pytest.fixture
def instance(shm_instance: str) -> Iterator[str]:
    """A unique instance name; every object left under it is swept after the test."""
    yield shm_instance
    names.unlink_instance(shm_instance)


def new_ring(instance: str, capacity_bytes: int = CAPACITY_BYTES) -> Ring:
    return Ring.create(names.shm_name(instance, "test", next(_index)), capacity_bytes)


def payload_of(number: int, size_bytes: int) -> bytes:
    return bytes((number * 7 + index) % 251 for index in range(size_bytes))


def batch_arrays(
    parcels: list[tuple[int, bytes]],
) -> tuple[NDArray[np.int32], NDArray[np.uint8], NDArray[np.int64], NDArray[np.int64]]:
    types = np.array([parcel_type for parcel_type, _ in parcels], dtype=np.int32)
    sizes = np.array([len(payload) for _, payload in parcels], dtype=np.int64)
    offsets = np.zeros(len(parcels), dtype=np.int64)
    if len(parcels) > 1:
        offsets[1:] = np.cumsum(sizes)[:-1]
    flat = np.frombuffer(b"".join(payload for _, payload in parcels), dtype=np.uint8).copy()
    return types, flat, offsets, sizes


# The plain-Python twin of the parcel format and of the producer's placement rule.


def parse_reference(ring: Ring) -> list[tuple[int, bytes]]:
    """Every published parcel from the consumer's tail on, read with struct alone."""
    statistics = ring.statistics()
    data = bytes(ring._data)
    capacity_bytes = len(data)
    position = statistics.tail_bytes
    parcels: list[tuple[int, bytes]] = []
    while position < statistics.tail_bytes + capacity_bytes:
        start = position % capacity_bytes
        length, parcel_type = struct.unpack_from("<ii", data, start)
        if length == 0:
            break
        if parcel_type == -1:
            assert start + length == capacity_bytes
            position += length
            continue
        parcels.append((parcel_type, data[start + 8 : start + length]))
        position += (length + 7) // 8 * 8
    return parcels


def place_reference(
    head_bytes: int, tail_bytes: int, capacity_bytes: int, payload_sizes: list[int]
) -> tuple[int, int]:
    """(parcels that fit, head afterwards) for a batch written at head_bytes."""
    written = 0
    for size_bytes in payload_sizes:
        parcel_bytes = (8 + size_bytes + 7) // 8 * 8
        to_end_bytes = capacity_bytes - head_bytes % capacity_bytes
        if parcel_bytes > to_end_bytes:
            if head_bytes + to_end_bytes + 8 > tail_bytes + capacity_bytes:
                break
            head_bytes += to_end_bytes
        if head_bytes + parcel_bytes + 8 > tail_bytes + capacity_bytes:
            break
        head_bytes += parcel_bytes
        written += 1
    return written, head_bytes


# Round trips.


def test_single_parcels_round_trip_with_every_bytes_like(instance: str) -> None:
    ring = new_ring(instance)
    try:
        payloads: list[bytes | bytearray | memoryview] = [
            b"",
            b"x",
            bytearray(b"seven b"),
            memoryview(b"eight by"),
            payload_of(1, 1000),
        ]
        for parcel_type, payload in enumerate(payloads):
            assert ring.try_write_nowait(parcel_type, payload)
        for parcel_type, payload in enumerate(payloads):
            assert ring.read_nowait() == (parcel_type, bytes(payload))
        assert ring.read_nowait() is None
        statistics = ring.statistics()
        assert statistics.parcel_count_written == statistics.parcel_count_read == len(payloads)
        assert statistics.used_bytes == 0
    finally:
        ring.close()
        ring.unlink()


def test_batch_write_and_drain_views_round_trip(instance: str) -> None:
    ring = new_ring(instance, 1 << 16)
    try:
        parcels = [(number % 5, payload_of(number, number % 40)) for number in range(300)]
        assert ring.try_write_batch_nowait(*batch_arrays(parcels)) == len(parcels)
        received: list[tuple[int, bytes]] = []
        while len(received) < len(parcels):
            batch = ring.drain_nowait(64)
            assert 0 < batch.count <= 64
            received += [
                (int(batch.types[i]), batch.payload(i).tobytes()) for i in range(batch.count)
            ]
            ring.release(batch)
        assert received == parcels
        assert ring.drain_nowait(64).count == 0
    finally:
        ring.close()
        ring.unlink()


def test_drain_into_copies_and_releases(instance: str) -> None:
    ring = new_ring(instance, 1 << 16)
    try:
        parcels = [(7, payload_of(number, 24 + number)) for number in range(50)]
        assert ring.try_write_batch_nowait(*batch_arrays(parcels)) == len(parcels)
        target = np.zeros(ring.payload_size_bytes_max, dtype=np.uint8)
        batch = ring.drain_into_nowait(target, 1000)
        assert batch.count == len(parcels)
        assert batch.data is target
        assert [batch.payload(i).tobytes() for i in range(batch.count)] == [p for _, p in parcels]
        assert ring.statistics().used_bytes == 0  # released already
    finally:
        ring.close()
        ring.unlink()


def test_attached_handle_sees_the_same_ring(instance: str) -> None:
    ring = new_ring(instance)
    other = Ring.attach(ring.name)
    try:
        assert other.capacity_bytes == ring.capacity_bytes
        assert other.try_write_nowait(3, b"from the other handle")
        assert ring.read_nowait() == (3, b"from the other handle")
        assert other.statistics().parcel_count_read == 1
    finally:
        other.close()
        ring.close()
        ring.unlink()


# Refusals and errors.


def test_full_ring_refuses_then_accepts_after_a_drain(instance: str) -> None:
    ring = new_ring(instance)
    try:
        # 128-byte parcels: 32 would fill the data area, but the zero word after the last one
        # must stay free, so 31 fit.
        written = 0
        while ring.try_write_nowait(1, payload_of(written, 120)):
            written += 1
        assert written == CAPACITY_BYTES // 128 - 1
        assert not ring.try_write_nowait(1, b"y" * 120)
        statistics = ring.statistics()
        assert statistics.full_count == 2
        assert statistics.padding_count_written == 0
        assert statistics.used_bytes == CAPACITY_BYTES - 128
        assert ring.read_nowait() == (1, payload_of(0, 120))
        assert ring.try_write_nowait(1, payload_of(written, 120))
        assert ring.statistics().used_bytes == CAPACITY_BYTES - 128
    finally:
        ring.close()
        ring.unlink()


def test_batch_write_stops_at_the_first_parcel_that_does_not_fit(instance: str) -> None:
    ring = new_ring(instance)
    try:
        parcels = [(0, payload_of(number, 500)) for number in range(20)]
        written = ring.try_write_batch_nowait(*batch_arrays(parcels))
        expected, _ = place_reference(0, 0, CAPACITY_BYTES, [500] * 20)
        assert written == expected
        assert [ring.read_nowait() for _ in range(written)] == parcels[:written]
        assert ring.read_nowait() is None
    finally:
        ring.close()
        ring.unlink()


def test_oversized_parcel_is_refused_and_nothing_of_its_batch_is_written(instance: str) -> None:
    ring = new_ring(instance)
    try:
        largest = ring.payload_size_bytes_max
        assert largest == CAPACITY_BYTES // 2 - 8
        assert ring.try_write_nowait(0, b"z" * largest)
        assert ring.read_nowait() == (0, b"z" * largest)
        with pytest.raises(MessageTooLargeError, match="payload_size_bytes_max"):
            ring.try_write_nowait(0, b"z" * (largest + 1))
        parcels = [(0, b"small"), (0, b"z" * (largest + 1))]
        with pytest.raises(MessageTooLargeError):
            ring.try_write_batch_nowait(*batch_arrays(parcels))
        assert ring.read_nowait() is None
    finally:
        ring.close()
        ring.unlink()


def test_malformed_batch_is_a_programmer_error_and_writes_nothing(instance: str) -> None:
    ring = new_ring(instance)
    try:
        types, flat, offsets, sizes = batch_arrays([(0, b"abc"), (0, b"defg")])
        sizes[1] = 5  # one byte past the end of `flat`
        with pytest.raises(AssertionError, match="past the end"):
            ring.try_write_batch_nowait(types, flat, offsets, sizes)
        types[0] = -1  # negative types are reserved for the ring itself
        sizes[1] = 4
        with pytest.raises(AssertionError):
            ring.try_write_batch_nowait(types, flat, offsets, sizes)
        assert ring.read_nowait() is None
    finally:
        ring.close()
        ring.unlink()


def test_configured_payload_maximum_is_enforced(instance: str) -> None:
    name = names.shm_name(instance, "test", next(_index))
    ring = Ring.create(name, CAPACITY_BYTES, payload_size_bytes_max=100)
    try:
        assert ring.try_write_nowait(0, b"a" * 100)
        with pytest.raises(MessageTooLargeError):
            ring.try_write_nowait(0, b"a" * 101)
    finally:
        ring.close()
        ring.unlink()


@pytest.mark.parametrize(
    ("capacity_bytes", "payload_size_bytes_max"),
    [(4095, None), (3 * 4096, None), (2048, None), (2**31, None), (4096, 4096)],
)
def test_create_rejects_bad_sizes(
    instance: str, capacity_bytes: int, payload_size_bytes_max: int | None
) -> None:
    name = names.shm_name(instance, "test", next(_index))
    with pytest.raises(ConfigError):
        Ring.create(name, capacity_bytes, payload_size_bytes_max)
    assert names.instance_paths(instance) == []


def test_create_twice_and_attach_missing_fail_clearly(instance: str) -> None:
    ring = new_ring(instance)
    try:
        with pytest.raises(FileExistsError):
            Ring.create(ring.name, CAPACITY_BYTES)
    finally:
        ring.close()
        ring.unlink()
    with pytest.raises(FileNotFoundError):
        Ring.attach(ring.name)


def test_attach_refuses_memory_that_is_not_a_ring(instance: str) -> None:
    name = names.shm_name(instance, "test", next(_index))
    memory = posix_ipc.SharedMemory(name, flags=posix_ipc.O_CREX, size=8192)
    memory.close_fd()
    with pytest.raises(ConfigError, match="magic"):
        Ring.attach(name)


# Wrap-around and padding.


def test_padding_parcel_fills_the_end_and_the_consumer_skips_it(instance: str) -> None:
    ring = new_ring(instance)
    try:
        # 3 parcels of 1000 payload bytes (1008 in the ring) leave 1072 bytes before the end.
        first = [(1, payload_of(number, 1000)) for number in range(3)]
        assert ring.try_write_batch_nowait(*batch_arrays(first)) == 3
        assert [ring.read_nowait() for _ in range(3)] == first
        # 1500 bytes do not fit in the remaining 1072: padding, then the parcel at offset 0.
        assert ring.try_write_nowait(2, payload_of(9, 1500))
        statistics = ring.statistics()
        assert statistics.padding_count_written == 1
        assert statistics.head_bytes == CAPACITY_BYTES + layout.parcel_size_bytes(1500)
        assert ring.read_nowait() == (2, payload_of(9, 1500))
    finally:
        ring.close()
        ring.unlink()


def test_padding_alone_is_published_when_the_parcel_must_wait(instance: str) -> None:
    ring = new_ring(instance)
    try:
        assert ring.try_write_nowait(0, b"p" * 2000)  # 2008 bytes
        assert ring.read_nowait() == (0, b"p" * 2000)  # tail at 2008
        assert ring.try_write_nowait(0, b"q" * 1000)  # 1008 bytes; head at 3016, 1080 to the end
        # 2000 bytes do not fit before the end, and after a padding parcel they would run into
        # the tail: only the padding is written, so the parcel fits once the consumer has moved
        # past it (waiting to write both at once could wait forever).
        assert not ring.try_write_nowait(0, b"r" * 2000)
        statistics = ring.statistics()
        assert statistics.padding_count_written == 1
        assert statistics.head_bytes == CAPACITY_BYTES
        assert ring.read_nowait() == (0, b"q" * 1000)
        assert ring.read_nowait() is None  # consumed the padding
        assert ring.statistics().tail_bytes == CAPACITY_BYTES
        assert ring.try_write_nowait(0, b"r" * 2000)
        assert ring.read_nowait() == (0, b"r" * 2000)
    finally:
        ring.close()
        ring.unlink()


write_steps = st.lists(st.integers(0, CAPACITY_BYTES // 2 - 8), min_size=1, max_size=12)
drain_steps = st.integers(1, 16)


@settings(max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(st.one_of(write_steps, drain_steps), min_size=1, max_size=40))
def test_wrap_around_with_varied_sizes_matches_the_model(
    instance: str, steps: list[list[int] | int]
) -> None:
    ring = new_ring(instance)
    model: collections.deque[tuple[int, bytes]] = collections.deque()
    number = 0
    try:
        for step in steps:
            before = ring.statistics()
            if isinstance(step, list):
                parcels = [(n % 3, payload_of(number + n, size)) for n, size in enumerate(step)]
                written = ring.try_write_batch_nowait(*batch_arrays(parcels))
                expected = place_reference(
                    before.head_bytes, before.tail_bytes, CAPACITY_BYTES, step
                )
                assert written == expected[0]
                # head also moves over a padding parcel written alone
                assert ring.statistics().head_bytes == expected[1]
                model.extend(parcels[:written])
                number += len(step)
            else:
                batch = ring.drain_nowait(step)
                drained = [
                    (int(batch.types[i]), batch.payload(i).tobytes()) for i in range(batch.count)
                ]
                ring.release(batch)
                expected_parcels = [model.popleft() for _ in range(min(step, len(model)))]
                assert drained == expected_parcels
            assert parse_reference(ring) == list(model)
        statistics = ring.statistics()
        assert statistics.head_bytes - statistics.tail_bytes <= CAPACITY_BYTES - 8
    finally:
        ring.close()
        ring.unlink()


# The Python paths against the kernels.


def segment_bytes(ring: Ring) -> bytes:
    """The whole segment: descriptor, both sides' counters, doorbell line and data area."""
    header = ring._header.tobytes()
    return header + ring._data.tobytes()


def write_through_kernel(ring: Ring, parcel_type: int, payload: bytes) -> bool:
    """try_write_nowait's contract, through stage_parcels and publish_headers (a batch of 1)."""
    types, flat, offsets, sizes = batch_arrays([(parcel_type, payload)])
    return ring.try_write_batch_nowait(types, flat, offsets, sizes) == 1


def drain_through_kernel(ring: Ring, batch_count_max: int) -> ring_module.ParcelBatch:
    """drain_nowait's contract, through scan_parcels whatever the batch."""
    assert ring._pending_end_bytes is None
    tail_bytes = ring._tail_bytes if ring._tail_bytes is not None else ring._claim_consumer()
    return ring._drain_scan(tail_bytes, batch_count_max, ring_module._UNLIMITED_BYTES)


def batch_contents(batch: ring_module.ParcelBatch) -> tuple[object, ...]:
    return (
        batch.count,
        batch.types.tolist(),
        batch.offsets.tolist(),
        batch.sizes.tolist(),
        [batch.payload(index).tobytes() for index in range(batch.count)],
        batch.payload_size_bytes,
        batch.start_bytes,
        batch.end_bytes,
    )


# A write is (type, payload size); a drain is a batch_count_max. Sizes up to half the ring make
# padding parcels, padding written alone, wrap-arounds and full rings all common.
single_steps = st.one_of(
    st.tuples(st.integers(0, layout.PARCEL_TYPE_MAX), st.integers(0, CAPACITY_BYTES // 2 - 8)),
    st.tuples(st.integers(0, 9), st.integers(0, 64)),
    st.integers(1, 6),
)


@settings(max_examples=300, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(single_steps, min_size=1, max_size=60))
def test_python_paths_and_kernels_leave_byte_identical_rings(
    instance: str, steps: list[tuple[int, int] | int]
) -> None:
    python_ring = new_ring(instance)
    kernel_ring = new_ring(instance)
    # The segment as each path left it just before its first header store: the staging must
    # match too, or a consumer could see different bytes while a header is being published.
    staged: dict[str, list[bytes]] = {"python": [], "kernel": []}
    python_ring._test_hook_before_publish = lambda: staged["python"].append(
        segment_bytes(python_ring)
    )
    kernel_ring._test_hook_before_publish = lambda: staged["kernel"].append(
        segment_bytes(kernel_ring)
    )
    number = 0
    try:
        for step in steps:
            if isinstance(step, tuple):
                parcel_type, size_bytes = step
                payload = payload_of(number, size_bytes)
                number += 1
                if number % 2:
                    written = python_ring.try_write_nowait(parcel_type, payload)
                else:  # the gather path, in parts of every Bytes-like kind
                    cut = size_bytes // 3
                    parts: tuple[bytes | bytearray | memoryview, ...] = (
                        payload[:cut],
                        bytearray(payload[cut : 2 * cut]),
                        memoryview(payload)[2 * cut :],
                    )
                    written = python_ring.try_write_parts_nowait(parcel_type, parts)
                assert written == write_through_kernel(kernel_ring, parcel_type, payload)
                assert staged["python"] == staged["kernel"]
            else:
                python_batch = python_ring.drain_nowait(step)
                kernel_batch = drain_through_kernel(kernel_ring, step)
                assert batch_contents(python_batch) == batch_contents(kernel_batch)
                python_ring.release(python_batch)
                kernel_ring.release(kernel_batch)
            assert segment_bytes(python_ring) == segment_bytes(kernel_ring)
            assert python_ring._head_bytes == kernel_ring._head_bytes
            assert python_ring._tail_bytes == kernel_ring._tail_bytes
    finally:
        for ring in (python_ring, kernel_ring):
            ring.close()
            ring.unlink()


def test_small_batches_are_drained_in_python_and_larger_ones_by_the_kernel(
    instance: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    ring = new_ring(instance, 1 << 16)
    scans: list[int] = []
    original = ring._drain_scan

    def counting_scan(
        tail_bytes: int, batch_count_max: int, payload_budget_bytes: int
    ) -> ring_module.ParcelBatch:
        scans.append(batch_count_max)
        return original(tail_bytes, batch_count_max, payload_budget_bytes)

    monkeypatch.setattr(ring, "_drain_scan", counting_scan)
    try:
        small = [(number, payload_of(number, number * 3)) for number in range(4)]
        for parcel_type, payload in small:
            assert ring.try_write_nowait(parcel_type, payload)
        batch = ring.drain_nowait(64)
        assert [(int(t), batch.payload(i).tobytes()) for i, t in enumerate(batch.types)] == small
        ring.release(batch)
        assert scans == []
        larger = [
            (7, payload_of(number, 16)) for number in range(ring_module.SMALL_BATCH_COUNT_MAX + 1)
        ]
        for parcel_type, payload in larger:
            assert ring.try_write_nowait(parcel_type, payload)
        batch = ring.drain_nowait(64)
        assert batch.count == len(larger)
        ring.release(batch)
        assert scans == [64]
        # Small batches into the caller's buffer too, before any scan sized the offsets.
        fresh = new_ring(instance)
        try:
            for parcel_type, payload in small:
                assert fresh.try_write_nowait(parcel_type, payload)
            target = np.zeros(fresh.payload_size_bytes_max, dtype=np.uint8)
            copied = fresh.drain_into_nowait(target, 16)
            assert [copied.payload(i).tobytes() for i in range(copied.count)] == [
                payload for _, payload in small
            ]
            assert fresh.statistics().used_bytes == 0
        finally:
            fresh.close()
            fresh.unlink()
        assert ring.statistics().parcel_count_read == len(small) + len(larger)
    finally:
        ring.close()
        ring.unlink()


# A producer that dies mid-write.


class ProducerDiedError(Exception):
    """Stands in for SIGKILL inside one process."""


def test_producer_dead_after_staging_leaves_the_ring_readable(instance: str) -> None:
    ring = new_ring(instance)
    producer = Ring.attach(ring.name)
    try:
        published = [(1, payload_of(number, 60)) for number in range(5)]
        assert producer.try_write_batch_nowait(*batch_arrays(published)) == 5

        def die() -> None:
            raise ProducerDiedError

        producer._test_hook_before_publish = die
        with pytest.raises(ProducerDiedError):
            producer.try_write_nowait(2, b"S" * 48)
        producer.close()
        # The payload is in the ring, but its header word is still zero.
        head_bytes = ring.statistics().head_bytes
        start = head_bytes % CAPACITY_BYTES
        assert bytes(ring._data[start + 8 : start + 56]) == b"S" * 48
        assert ring._words[start // 8] == 0
        assert parse_reference(ring) == published
        assert [ring.read_nowait() for _ in range(5)] == published
        assert ring.read_nowait() is None
        # A restarted producer writes over the unpublished parcel.
        restarted = Ring.attach(ring.name)
        assert restarted.try_write_nowait(3, b"after")
        assert ring.read_nowait() == (3, b"after")
        restarted.close()
    finally:
        ring.close()
        ring.unlink()


@pytest.mark.parametrize("consumer_reads_first", [False, True])
def test_producer_dead_mid_publish_is_continued_after_the_last_header(
    instance: str, monkeypatch: pytest.MonkeyPatch, consumer_reads_first: bool
) -> None:
    ring = new_ring(instance)
    producer = Ring.attach(ring.name)
    try:
        original = ring_module.publish_headers

        def publish_three_then_die(
            words: NDArray[np.int64],
            header_positions: NDArray[np.int64],
            header_words: NDArray[np.int64],
            header_count: int,
        ) -> int:
            original(words, header_positions, header_words, min(3, header_count))
            raise ProducerDiedError

        parcels = [(4, payload_of(number, 30)) for number in range(6)]
        monkeypatch.setattr(ring_module, "publish_headers", publish_three_then_die)
        with pytest.raises(ProducerDiedError):
            producer.try_write_batch_nowait(*batch_arrays(parcels))
        monkeypatch.undo()
        producer.close()
        assert ring.statistics().head_bytes == 0  # the head was never stored
        assert parse_reference(ring) == parcels[:3]
        if consumer_reads_first:  # the tail passes the stored head
            assert [ring.read_nowait() for _ in range(3)] == parcels[:3]
        restarted = Ring.attach(ring.name)
        assert restarted.try_write_nowait(5, b"next")
        assert restarted.statistics().head_bytes == 3 * layout.parcel_size_bytes(30) + 16
        restarted.close()
        expected = [(5, b"next")] if consumer_reads_first else [*parcels[:3], (5, b"next")]
        assert [ring.read_nowait() for _ in expected] == expected
        assert ring.read_nowait() is None
    finally:
        ring.close()
        ring.unlink()


def test_consumer_asserts_on_a_corrupt_header(instance: str) -> None:
    ring = new_ring(instance)
    try:
        assert ring.try_write_nowait(0, b"fine")
        ring._words[0] = (5 << 32) | 4  # length below the header size
        with pytest.raises(AssertionError, match="corrupt header"):
            ring.drain_nowait(10)
    finally:
        ring.close()
        ring.unlink()


# Release rules and the consumer's side of the doorbell.


def test_drain_requires_release_of_the_previous_batch(instance: str) -> None:
    ring = new_ring(instance)
    try:
        for number in range(3):
            assert ring.try_write_nowait(0, payload_of(number, 8))
        batch = ring.drain_nowait(1)
        with pytest.raises(AssertionError):
            ring.drain_nowait(1)
        ring.release(batch)
        with pytest.raises(AssertionError):
            ring.release(batch)
        assert ring.read_nowait() == (0, payload_of(1, 8))
    finally:
        ring.close()
        ring.unlink()


def test_restarted_consumer_gets_unreleased_parcels_again(instance: str) -> None:
    ring = new_ring(instance)
    try:
        for number in range(4):
            assert ring.try_write_nowait(0, payload_of(number, 8))
        assert ring.read_nowait() == (0, payload_of(0, 8))
        ring.drain_nowait(2)  # drained, never released: this consumer "dies"
        restarted = Ring.attach(ring.name)
        assert [restarted.read_nowait() for _ in range(3)] == [
            (0, payload_of(number, 8)) for number in (1, 2, 3)
        ]
        restarted.close()
    finally:
        ring.close()
        ring.unlink()


def test_consumer_restarted_after_dying_asleep_can_sleep_again(instance: str) -> None:
    ring = new_ring(instance)
    try:
        assert ring.arm_doorbell_nowait()  # this consumer "dies" while armed
        restarted = Ring.attach(ring.name)
        assert not restarted.wait_readable(0)
        assert ring.try_write_nowait(0, b"x")
        assert restarted.wait_readable(0)
        restarted.close()
    finally:
        ring.close()
        ring.unlink()


def test_wait_readable_returns_at_once_or_after_the_timeout(instance: str) -> None:
    ring = new_ring(instance)
    try:
        start_ns = time.monotonic_ns()
        assert not ring.wait_readable(50)
        waited_ms = (time.monotonic_ns() - start_ns) / 1e6
        assert 45 <= waited_ms < 2000
        assert ring.statistics().doorbell_count_waited == 1
        assert ring.try_write_nowait(0, b"now")
        assert ring.wait_readable(10_000)
        assert ring.read_nowait() == (0, b"now")
    finally:
        ring.close()
        ring.unlink()


def test_arming_reports_a_readable_ring_and_a_write_rings_an_armed_bell(instance: str) -> None:
    ring = new_ring(instance)
    try:
        assert ring.arm_doorbell_nowait()
        assert ring.try_write_nowait(0, b"wake")
        assert ring.statistics().doorbell_count_rung == 1
        assert ring.try_write_nowait(0, b"again")  # one ring per sleep
        assert ring.statistics().doorbell_count_rung == 1
        assert ring._doorbell.wait_rung(0)
        ring.disarm_doorbell()
        assert not ring._doorbell.wait_rung(0)
        assert not ring.arm_doorbell_nowait()  # parcels are readable: do not sleep
        assert ring.try_write_nowait(0, b"unarmed")
        assert ring.statistics().doorbell_count_rung == 1
    finally:
        ring.close()
        ring.unlink()


def test_arming_many_rings_sleeps_only_when_all_are_empty(instance: str) -> None:
    rings = [new_ring(instance) for _ in range(3)]
    try:
        assert Ring.arm_doorbells_nowait(rings)
        assert all(ring.statistics().doorbell_count_waited == 1 for ring in rings)
        assert rings[2].try_write_nowait(0, b"wake")  # the producer sees the flag: it rings
        assert rings[2].statistics().doorbell_count_rung == 1
        for ring in rings:
            ring.disarm_doorbell(rung=ring is rings[2])
        assert not rings[2]._doorbell.wait_rung(0)  # cleared
        # A readable ring: nothing armed, nobody sleeps, a write rings no bell.
        assert not Ring.arm_doorbells_nowait(rings)
        assert rings[0].try_write_nowait(0, b"no bell")
        assert rings[0].statistics().doorbell_count_rung == 0
        assert all(ring.statistics().doorbell_count_waited == 1 for ring in rings)
        # Disarmed without reading the FIFO: a ring that came late wakes the next sleep once.
        assert rings[2].read_nowait() == (0, b"wake")
        assert rings[0].read_nowait() == (0, b"no bell")
        assert Ring.arm_doorbells_nowait(rings)
        assert rings[1].try_write_nowait(0, b"late")
        for ring in rings:
            ring.disarm_doorbell(rung=False)
        assert rings[1]._doorbell.wait_rung(0)  # still pending
        rings[1].disarm_doorbell()
        assert not rings[1]._doorbell.wait_rung(0)
    finally:
        for ring in rings:
            ring.close()
            ring.unlink()


def test_close_is_idempotent_and_unlink_removes_both_names(instance: str) -> None:
    ring = new_ring(instance)
    assert len(names.instance_paths(instance)) == 2  # the segment and its doorbell
    ring.close()
    ring.close()
    ring.unlink()
    ring.unlink()
    assert names.instance_paths(instance) == []


def test_warm_up_checks_the_kernels_against_the_layout() -> None:
    ring_module.warm_up()


def _resident_bytes_of_mapping(name: str) -> int:
    """Rss of this process's mapping of the shared memory object `name` (/proc/self/smaps)."""
    resident = 0
    inside = False
    with Path("/proc/self/smaps").open(encoding="ascii", errors="replace") as smaps:
        for line in smaps:
            fields = line.split()
            if "-" in fields[0] and len(fields) >= 5:
                inside = len(fields) >= 6 and fields[5] == f"/dev/shm{name}"
            elif inside and fields[0] == "Rss:":
                resident += int(fields[1]) * 1024
    return resident


def test_create_and_attach_map_every_page_of_the_ring(instance: str) -> None:
    ring = Ring.create(names.shm_name(instance, "populate", 0), 1 << 20)
    try:
        segment_size_bytes = layout.segment_size_bytes(1 << 20)
        assert _resident_bytes_of_mapping(ring.name) >= segment_size_bytes
        other = Ring.attach(ring.name)
        try:
            # Two mappings of one object: both populated, so twice the segment is resident.
            assert _resident_bytes_of_mapping(ring.name) >= 2 * segment_size_bytes
        finally:
            other.close()
    finally:
        ring.close()
        ring.unlink()
