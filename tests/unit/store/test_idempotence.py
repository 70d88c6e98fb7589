"""Goal: the idempotent window's parts keep their promises. hash_record_keys reports what its
plain twin reports on whole, torn and noisy record runs; the tables probe exactly as their twin
(first and next candidates, inserts); the window finds a key for at least `window_ms` and until
`key_count_max` newer keys went in, holds at most two generations, and never allocates before the
first insert; the rebuild at open puts back the keys of the named topics stored within the window,
in log order, and no others; record_identity reads topic, UNIQ_KEY and queue position back.

Method: records from message.encode_record (hypothesis strategies of tests/support), fed to the
kernel and to idempotence_ref.py; operation sequences drawn by hypothesis applied to a table and
to its twin; the rebuild runs over a real CommitLog in tmp_path with tiny segments.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from mqbox import message as m
from mqbox.store import idempotence as idem
from mqbox.store import idempotence_ref as ref
from mqbox.store.commit_log import CommitLog
from mqbox.store.layout import StoreGeometry
from tests.support.stored_records import messages


def encode(
    message: m.MessageToStore, *, store_timestamp_ms: int = 0, queue_index: int = 0
) -> bytes:
    return bytes(
        m.encode_record(message, store_timestamp_ms=store_timestamp_ms, queue_index=queue_index)
    )


def kernel_scan(
    buffer: bytes, start: int, end: int, capacity: int
) -> tuple[list[tuple[int, int, int, int, bool]], int, int]:
    array = np.frombuffer(buffer, dtype=np.uint8)
    positions = np.zeros(capacity, dtype=np.int64)
    key_hashes = np.zeros(capacity, dtype=np.uint64)
    topic_hashes = np.zeros(capacity, dtype=np.uint64)
    times = np.zeros(capacity, dtype=np.int64)
    has_key = np.zeros(capacity, dtype=np.bool_)
    count, stop, reason = idem.hash_record_keys(
        array, start, end, positions, key_hashes, topic_hashes, times, has_key
    )
    found = [
        (
            int(positions[i]),
            int(key_hashes[i]),
            int(topic_hashes[i]),
            int(times[i]),
            bool(has_key[i]),
        )
        for i in range(count)
    ]
    return found, stop, reason


@st.composite
def record_runs(draw: st.DrawFn) -> bytes:
    """Records back to back, then maybe a blank, a torn record or noise."""
    run = b"".join(
        encode(message, store_timestamp_ms=draw(st.integers(0, 2**40)))
        for message in draw(st.lists(messages, max_size=5))
    )
    tail = draw(st.sampled_from(["none", "blank", "torn", "noise"]))
    if tail == "blank":
        run += m.encode_blank(64)
    elif tail == "torn":
        whole = encode(draw(messages))
        run += whole[: draw(st.integers(1, len(whole) - 1))]
    elif tail == "noise":
        run += draw(st.binary(min_size=1, max_size=120))
    return run


@given(record_runs(), st.integers(1, 6))
@settings(max_examples=300)
def test_hash_record_keys_agrees_with_its_twin(run: bytes, capacity: int) -> None:
    assert kernel_scan(run, 0, len(run), capacity) == ref.hash_record_keys_ref(
        run, 0, len(run), capacity
    )


def test_the_key_hash_covers_topic_and_uniq_key_and_nothing_else() -> None:
    def keyed(topic: str, uniq_key: bytes, body: bytes) -> int:
        record = encode(
            m.MessageToStore(topic, 0, body, m.encode_properties({b"UNIQ_KEY": uniq_key}))
        )
        found, _stop, _reason = kernel_scan(record, 0, len(record), 1)
        assert found[0][4]
        return found[0][1]

    first = keyed("T", b"K1", b"a")
    assert keyed("T", b"K1", b"other body") == first
    assert keyed("T", b"K2", b"a") != first
    assert keyed("U", b"K1", b"a") != first
    assert first == ref.key_hash_ref(b"T", b"K1")
    assert idem.topic_hash(b"T") == ref.finish_ref(ref.fnv1a_ref(b"T"))


table_operations = st.lists(
    st.tuples(
        st.sampled_from(["insert", "find"]),
        st.integers(0, 40),  # key hashes from a small set, so that they repeat and collide
        st.integers(0, 2**40),
    ),
    max_size=30,
)


@given(table_operations)
@settings(max_examples=300)
def test_tables_probe_as_their_twin(operations: list[tuple[str, int, int]]) -> None:
    slot_count = 64
    hashes = np.zeros(slot_count, dtype=np.uint64)
    offsets = np.zeros(slot_count, dtype=np.int64)
    twin = ref.TableRef(slot_count)
    out_slot = np.empty(1, dtype=np.int64)
    for operation, small_hash, log_offset in operations:
        key_hash = small_hash * 0x9E3779B97F4A7C15 % 2**64
        key = np.array([key_hash], dtype=np.uint64)
        if operation == "insert":
            put = idem.table_insert(
                hashes,
                offsets,
                key,
                np.array([log_offset], dtype=np.int64),
                np.ones(1, dtype=np.bool_),
                0,
                1,
            )
            assert put == 1
            twin.insert(key_hash, log_offset)
            continue
        idem.table_find_first(hashes, offsets, key, np.ones(1, dtype=np.bool_), out_slot)
        slot = int(out_slot[0])
        assert slot == twin.find_first(key_hash)
        while slot >= 0:
            following = idem.table_find_next(hashes, offsets, key[0], slot)
            assert following == twin.find_next(key_hash, slot)
            slot = following
    assert hashes.tolist() == twin.hashes
    assert offsets.tolist() == twin.offsets


def insert_keys(
    window: idem.IdempotenceWindow, key_hashes: list[int], offsets: list[int], time_ms: int
) -> int:
    count = len(key_hashes)
    return window.insert(
        np.array(key_hashes, dtype=np.uint64),
        np.array(offsets, dtype=np.int64),
        np.ones(count, dtype=np.bool_),
        np.full(count, time_ms, dtype=np.int64),
    )


def found(window: idem.IdempotenceWindow, key_hash: int) -> list[int]:
    return list(window.candidates(key_hash))


def test_a_window_holds_keys_for_its_time_then_forgets_them() -> None:
    window = idem.IdempotenceWindow(window_ms=1000, key_count_max=100)
    assert window.statistics().keys_current == 0
    insert_keys(window, [11], [5], time_ms=0)
    insert_keys(window, [12], [6], time_ms=999)  # same generation
    assert found(window, 11) == [5]
    insert_keys(window, [13], [7], time_ms=1000)  # the first generation retires
    assert found(window, 11) == [5]  # still held, in the previous generation
    insert_keys(window, [14], [8], time_ms=2000)  # and now dropped
    assert found(window, 11) == []
    assert found(window, 13) == [7]
    statistics = window.statistics()
    assert statistics.rotations == 3
    assert statistics.keys_current + statistics.keys_previous == 2


def test_a_window_holds_at_least_key_count_max_newer_keys_and_at_most_twice_that() -> None:
    window = idem.IdempotenceWindow(window_ms=10**9, key_count_max=4)
    insert_keys(window, list(range(1, 11)), list(range(10)), time_ms=0)
    statistics = window.statistics()
    assert statistics.keys_current + statistics.keys_previous <= 8
    held = [key for key in range(1, 11) if found(window, key)]
    # Generations [1-4], [5-8], [9-10]: the first was dropped. Every key with fewer than four
    # newer ones (7 to 10) must be held; 5 and 6 are held beyond the promise.
    assert held == list(range(5, 11))
    first = window.first_candidates(np.arange(1, 11, dtype=np.uint64), np.ones(10, dtype=np.bool_))
    assert first.tolist() == [key >= 5 for key in range(1, 11)]


def test_keys_without_a_uniq_key_are_neither_held_nor_counted() -> None:
    window = idem.IdempotenceWindow(window_ms=1000, key_count_max=2)
    put = window.insert(
        np.array([1, 2, 3], dtype=np.uint64),
        np.array([0, 1, 2], dtype=np.int64),
        np.array([True, False, True]),
        np.zeros(3, dtype=np.int64),
    )
    assert put == 2
    assert found(window, 2) == []
    assert window.statistics().rotations == 1


def test_equal_hashes_are_all_candidates_newest_generation_first() -> None:
    window = idem.IdempotenceWindow(window_ms=1000, key_count_max=2)
    insert_keys(window, [9, 9], [1, 2], time_ms=0)
    insert_keys(window, [9], [3], time_ms=0)
    assert found(window, 9) == [3, 1, 2]


def test_record_identity_reads_topic_uniq_key_and_queue_position() -> None:
    properties = m.encode_properties({b"TAGS": b"A", b"UNIQ_KEY": b"K-17"})
    record = encode(m.MessageToStore("Topic", 3, b"body", properties), queue_index=41)
    identity = idem.record_identity(b"pad" + record, 3)
    assert identity == idem.RecordIdentity(b"Topic", b"K-17", 3, 41)
    assert idem.record_identity(encode(m.MessageToStore("T", 0, b"x"))).uniq_key is None


def test_the_topics_file_round_trips_and_starts_empty(tmp_path: Path) -> None:
    (tmp_path / "config").mkdir()
    assert idem.load_idempotent_topics(tmp_path) == set()
    idem.save_idempotent_topics(tmp_path, {"b", "a"})
    assert idem.load_idempotent_topics(tmp_path) == {"a", "b"}


SEGMENT_SIZE_BYTES = 4096


def test_the_rebuild_puts_back_the_named_topics_keys_stored_within_the_window(
    tmp_path: Path,
) -> None:
    geometry = StoreGeometry(commit_log_segment_size_bytes=SEGMENT_SIZE_BYTES)
    log = CommitLog.open(tmp_path, geometry, writable=True, record_size_bytes_max=1024)
    log.set_write_position(0)
    offsets: dict[tuple[str, bytes], int] = {}
    # 60 records of about 230 bytes: several segments; store times 0, 100, ..., 5900 ms.
    for number in range(60):
        topic = "Wanted" if number % 3 else "Other"
        key = f"K{number:03d}".encode()
        properties = m.encode_properties({b"UNIQ_KEY": key}) if number != 7 else b""
        record = np.frombuffer(
            encode(m.MessageToStore(topic, 0, b"x" * 100, properties)), dtype=np.uint8
        )
        sizes = np.array([record.size], dtype=np.int32)
        result = log.append_batch(record.copy(), sizes, topic, 0, store_timestamp_ms=number * 100)
        offsets[(topic, key)] = result.log_offset_bytes
    assert len(log.segment_starts_bytes) >= 3
    window = idem.IdempotenceWindow(window_ms=3000, key_count_max=1000)
    now_ms = 6000
    inserted = idem.rebuild_window(
        window, log, log.write_log_offset_bytes, {"Wanted"}, now_ms=now_ms
    )
    expected = {
        (topic, key): offset
        for (topic, key), offset in offsets.items()
        if topic == "Wanted" and int(key[1:]) * 100 >= now_ms - 3000 and key != b"K007"
    }
    assert inserted == len(expected)
    for (topic, key), offset in offsets.items():
        candidates = found(window, ref.key_hash_ref(topic.encode(), key))
        assert candidates == ([offset] if (topic, key) in expected else [])
    start = idem.rebuild_start_log_offset(log, log.write_log_offset_bytes, now_ms - 3000)
    assert start is not None
    assert start in log.segment_starts_bytes
    assert start > 0  # the first segment holds only records older than the window
    log.close()


def test_kernels_warm_up() -> None:
    idem.warm_up_kernels()
