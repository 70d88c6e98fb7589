"""Goal: the index finds every key it was given (newest first, within the time range), survives
collisions, full files and reopening, and its numba kernels agree byte for byte with their
plain-Python twins.

Method: tiny geometries (a handful of slots and entries) in tmp_path, so collisions, long chains
and rolls happen in a few puts. Keys are hashed with a Java String.hashCode written here
(checked against the vectors in docs/protocol.md section 7.1). Hypothesis feeds the kernel
and `index_ref` the same batches on the same starting bytes and compares the bytes and the query
answers. A fake clock names the files, so rolls within one millisecond are covered.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqbox._jit import JIT_DISABLED, is_compiled
from mqbox.errors import StoreError
from mqbox.store.index import (
    IndexFile,
    IndexService,
    put_index_batch,
    query_index,
    warm_up_kernels,
)
from mqbox.store.index_ref import put_index_batch_ref, query_index_ref
from mqbox.store.layout import (
    INDEX_COUNT_INITIAL,
    INDEX_HEADER_DTYPE,
    StoreGeometry,
    index_file_name,
    parse_index_file_name,
)

T0_MS = 1_700_000_000_000


def java_string_hash(text: str) -> int:
    """Java's String.hashCode: 31 * h + c over UTF-16 code units, as a signed 32-bit value."""
    utf16 = text.encode("utf-16-be")
    value = 0
    for position in range(0, len(utf16), 2):
        value = (31 * value + int.from_bytes(utf16[position : position + 2], "big")) & 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value


def key_hash(topic: str, key: str) -> int:
    """RocketMQ's index key hash: abs(hashCode(topic#key)), with MIN_VALUE mapped to 0."""
    value = java_string_hash(f"{topic}#{key}")
    return 0 if value == -(1 << 31) else abs(value)


def test_java_string_hash_matches_jdk_vectors() -> None:
    vectors = {"TagA": 2598919, "TagB": 2598920, "XXX": 87384, "test": 3556498}
    vectors |= {"hello world": 1794106052, "中文": 646394, "😀": 1772899}
    for text, expected in vectors.items():
        assert java_string_hash(text) == expected


def new_index_file(directory: Path, geometry: StoreGeometry) -> IndexFile:
    return IndexFile.create(directory / index_file_name(T0_MS), geometry)


def test_new_file_header_starts_index_count_at_1(tmp_path: Path) -> None:
    geometry = StoreGeometry(index_slot_count=4, index_entry_count_max=4)
    index_file = new_index_file(tmp_path, geometry)
    assert index_file.index_count == INDEX_COUNT_INITIAL
    assert index_file.entry_count == 0
    assert index_file.query(5, 0, 1 << 62, 10) == []
    index_file.close()
    raw = (tmp_path / index_file_name(T0_MS)).read_bytes()
    assert len(raw) == geometry.index_file_size_bytes
    header = np.frombuffer(raw[:40], dtype=INDEX_HEADER_DTYPE)[0]
    assert int(header["index_count"]) == 1
    assert int(header["begin_timestamp_ms"]) == 0


def test_put_fills_header_and_query_follows_chain_newest_first(tmp_path: Path) -> None:
    geometry = StoreGeometry(index_slot_count=1, index_entry_count_max=10)  # one chain
    index_file = new_index_file(tmp_path, geometry)
    hashes = [key_hash("TopicA", key) for key in ("k1", "k2", "k1", "k3", "k1")]
    for position, hash_value in enumerate(hashes):
        assert index_file.put(hash_value, 1000 + position, T0_MS + 1500 * position)
    assert index_file.entry_count == 5
    assert index_file.slots_used == 1
    assert index_file.begin_timestamp_ms == T0_MS
    assert index_file.end_timestamp_ms == T0_MS + 6000
    assert index_file.begin_log_offset_bytes == 1000
    assert index_file.end_log_offset_bytes == 1004
    everything = (0, 1 << 62)
    assert index_file.query(hashes[0], *everything, 10) == [1004, 1002, 1000]
    assert index_file.query(hashes[0], *everything, 2) == [1004, 1002]
    assert index_file.query(hashes[1], *everything, 10) == [1001]
    assert index_file.query(key_hash("TopicA", "absent"), *everything, 10) == []


def test_query_respects_time_range_at_second_granularity(tmp_path: Path) -> None:
    geometry = StoreGeometry(index_slot_count=7, index_entry_count_max=10)
    index_file = new_index_file(tmp_path, geometry)
    hash_value = key_hash("TopicA", "order-1")
    # Stored at T0 + 0.25 s, T0 + 10.25 s, ..., T0 + 40.25 s: 10 s apart from the first.
    for position in range(5):
        index_file.put(hash_value, position, T0_MS + 10_000 * position + 250)
    assert index_file.query(hash_value, T0_MS + 10_000, T0_MS + 30_000, 10) == [2, 1]
    assert index_file.query(hash_value, T0_MS + 10_000, T0_MS + 30_250, 10) == [3, 2, 1]
    # The stored second [T0 + 20.25 s, T0 + 21.249 s] overlaps a range inside it.
    assert index_file.query(hash_value, T0_MS + 20_500, T0_MS + 20_600, 10) == [2]
    assert index_file.query(hash_value, T0_MS + 41_000, T0_MS + 99_000, 10) == [4]  # same second
    assert index_file.query(hash_value, T0_MS + 41_250, T0_MS + 99_000, 10) == []
    assert index_file.query(hash_value, 0, T0_MS - 1, 10) == []


@settings(max_examples=60)
@given(
    deltas_ms=st.lists(st.integers(min_value=0, max_value=5000), min_size=1, max_size=12),
    pick=st.integers(min_value=0),
)
def test_query_never_misses_a_key_stored_inside_the_range(
    tmp_path_factory: pytest.TempPathFactory, deltas_ms: list[int], pick: int
) -> None:
    geometry = StoreGeometry(index_slot_count=3, index_entry_count_max=20)
    index_file = new_index_file(tmp_path_factory.mktemp("index"), geometry)
    times_ms = list(itertools.accumulate(deltas_ms, initial=T0_MS))[1:]
    for position, time_ms in enumerate(times_ms):
        index_file.put(position % 2, position, time_ms)
    chosen = pick % len(times_ms)
    stored_ms = times_ms[chosen]
    # Candidates may include neighbours within a second (the caller checks the record), but
    # the record stored inside [begin, end] is always among them.
    found = index_file.query(chosen % 2, stored_ms, stored_ms, 20)
    assert chosen in found
    index_file.close()


def test_full_file_refuses_puts(tmp_path: Path) -> None:
    geometry = StoreGeometry(index_slot_count=3, index_entry_count_max=4)  # 3 usable entries
    index_file = new_index_file(tmp_path, geometry)
    hashes = np.arange(5, dtype=np.int64)
    offsets = np.arange(5, dtype=np.int64) * 10
    times = np.full(5, T0_MS, dtype=np.int64)
    assert index_file.put_batch(hashes, offsets, times) == 3
    assert index_file.is_full
    assert not index_file.put(1, 99, T0_MS)
    assert index_file.query(2, 0, 1 << 62, 10) == [20]


@pytest.mark.parametrize(
    ("bad_column", "bad_value"), [(0, -1), (0, 2**31), (1, -1), (2, -1)], ids=str
)
def test_out_of_range_key_writes_nothing(tmp_path: Path, bad_column: int, bad_value: int) -> None:
    """The kernel checks every key's ranges before it writes (so does its twin): a bad key
    anywhere in the batch leaves the file's bytes as they were, and put_batch refuses it."""
    geometry = StoreGeometry(index_slot_count=3, index_entry_count_max=8)
    index_file = new_index_file(tmp_path, geometry)
    index_file.put(1, 10, T0_MS)
    columns = [np.arange(3, dtype=np.int64), np.arange(3, dtype=np.int64) * 10 + 20]
    columns.append(np.full(3, T0_MS, dtype=np.int64))
    columns[bad_column][2] = bad_value
    buffer = index_file._mapped_file.buffer
    before = buffer.tobytes()
    twin_bytes = bytearray(before)
    slot_count, entry_count_max = geometry.index_slot_count, geometry.index_entry_count_max
    assert put_index_batch(buffer, slot_count, entry_count_max, *columns) == -3
    lists = [column.tolist() for column in columns]
    assert put_index_batch_ref(twin_bytes, slot_count, entry_count_max, *lists) == -3
    assert buffer.tobytes() == before == bytes(twin_bytes)
    with pytest.raises(AssertionError, match="out of range"):
        index_file.put_batch(*columns)
    assert buffer.tobytes() == before


def test_malformed_chain_ends_the_query(tmp_path: Path) -> None:
    geometry = StoreGeometry(index_slot_count=1, index_entry_count_max=8)
    index_file = new_index_file(tmp_path, geometry)
    for position in range(3):
        index_file.put(9, position, T0_MS)
    buffer = index_file._mapped_file.buffer
    entry_2_prev = 40 + 4 + 2 * 20 + 16
    buffer[entry_2_prev : entry_2_prev + 4] = [0, 0, 0, 3]  # points forward: a cycle
    assert index_file.query(9, 0, 1 << 62, 10) == [2, 1]


def test_open_rejects_wrong_size(tmp_path: Path) -> None:
    geometry = StoreGeometry(index_slot_count=3, index_entry_count_max=4)
    path = tmp_path / index_file_name(T0_MS)
    path.write_bytes(bytes(10))
    with pytest.raises(StoreError):
        IndexFile.open(path, geometry, writable=False)


def test_kernels_are_compiled_unless_jit_is_disabled() -> None:
    warm_up_kernels()
    assert is_compiled(put_index_batch) != JIT_DISABLED
    assert is_compiled(query_index) != JIT_DISABLED


# -- kernel against twin -------------------------------------------------------------------------


@st.composite
def batches(draw: st.DrawFn) -> tuple[int, int, list[list[tuple[int, int, int]]]]:
    slot_count = draw(st.integers(min_value=1, max_value=7))
    entry_count_max = draw(st.integers(min_value=2, max_value=16))
    hashes = st.one_of(st.integers(min_value=0, max_value=20), st.sampled_from([0, 2**31 - 1]))
    key_batches = []
    log_offset_bytes = draw(st.integers(min_value=0, max_value=2**40))
    timestamp_ms = T0_MS
    for _ in range(draw(st.integers(min_value=1, max_value=4))):
        batch = []
        for _ in range(draw(st.integers(min_value=0, max_value=8))):
            log_offset_bytes += draw(st.integers(min_value=1, max_value=5000))
            # Clocks step back sometimes; time diffs then clamp to 0.
            timestamp_ms = max(timestamp_ms + draw(st.integers(-3000, 400_000)), 0)
            batch.append((draw(hashes), log_offset_bytes, timestamp_ms))
        key_batches.append(batch)
    return slot_count, entry_count_max, key_batches


@settings(max_examples=150)
@given(
    case=batches(),
    queries=st.lists(
        st.tuples(
            st.integers(0, 21),
            st.integers(0, 3_000_000),
            st.integers(0, 3_000_000),
            st.integers(0, 6),
        ),
        max_size=6,
    ),
)
def test_kernel_and_twin_agree(
    case: tuple[int, int, list[list[tuple[int, int, int]]]],
    queries: list[tuple[int, int, int, int]],
) -> None:
    slot_count, entry_count_max, key_batches = case
    geometry = StoreGeometry(index_slot_count=slot_count, index_entry_count_max=entry_count_max)
    size_bytes = geometry.index_file_size_bytes
    kernel_bytes = np.zeros(size_bytes, dtype=np.uint8)
    kernel_bytes[36:40] = [0, 0, 0, 1]
    twin_bytes = bytearray(kernel_bytes.tobytes())
    for batch in key_batches:
        hashes = np.array([key for key, _, _ in batch], dtype=np.int64)
        offsets = np.array([offset for _, offset, _ in batch], dtype=np.int64)
        times = np.array([time_ms for _, _, time_ms in batch], dtype=np.int64)
        kernel_count = put_index_batch(
            kernel_bytes, slot_count, entry_count_max, hashes, offsets, times
        )
        twin_count = put_index_batch_ref(
            twin_bytes,
            slot_count,
            entry_count_max,
            hashes.tolist(),
            offsets.tolist(),
            times.tolist(),
        )
        assert kernel_count == twin_count
        assert kernel_bytes.tobytes() == bytes(twin_bytes)
    for hash_value, begin_delta_ms, span_ms, count_max in queries:
        begin_ms = T0_MS + begin_delta_ms
        out = np.zeros(count_max, dtype=np.int64)
        found_count = query_index(
            kernel_bytes, slot_count, hash_value, begin_ms, begin_ms + span_ms, out
        )
        expected = query_index_ref(
            twin_bytes, slot_count, hash_value, begin_ms, begin_ms + span_ms, count_max
        )
        assert [int(offset) for offset in out[:found_count]] == expected


@settings(max_examples=60)
@given(case=batches())
def test_index_finds_every_key_put(case: tuple[int, int, list[list[tuple[int, int, int]]]]) -> None:
    slot_count, entry_count_max, key_batches = case
    geometry = StoreGeometry(index_slot_count=slot_count, index_entry_count_max=entry_count_max)
    buffer = bytearray(geometry.index_file_size_bytes)
    buffer[36:40] = (1).to_bytes(4, "big")
    put: list[tuple[int, int, int]] = []
    for batch in key_batches:
        count = put_index_batch_ref(
            buffer,
            slot_count,
            entry_count_max,
            [key for key, _, _ in batch],
            [offset for _, offset, _ in batch],
            [time_ms for _, _, time_ms in batch],
        )
        put.extend(batch[:count])
    for hash_value in {key for key, _, _ in put}:
        expected = [offset for key, offset, _ in reversed(put) if key == hash_value]
        assert query_index_ref(buffer, slot_count, hash_value, 0, 1 << 62, 1000) == expected


# -- the service -------------------------------------------------------------------------------


class FakeClock:
    """A clock that stays on one millisecond unless moved."""

    def __init__(self, now_ms: int) -> None:
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms


GEOMETRY = StoreGeometry(index_slot_count=5, index_entry_count_max=4)  # 3 entries per file


def put_keys(service: IndexService, keys: list[tuple[str, int, int]]) -> None:
    service.put_batch(
        np.array([key_hash("TopicA", key) for key, _, _ in keys], dtype=np.int64),
        np.array([offset for _, offset, _ in keys], dtype=np.int64),
        np.array([time_ms for _, _, time_ms in keys], dtype=np.int64),
    )


def test_service_rolls_full_files_with_increasing_names(tmp_path: Path) -> None:
    clock = FakeClock(T0_MS)
    service = IndexService(tmp_path, GEOMETRY, writable=True, clock_ms=clock)
    service.load()
    put_keys(service, [(f"k{n % 3}", 100 * n, T0_MS + 1000 * n) for n in range(8)])
    names = sorted(path.name for path in (tmp_path / "index").iterdir())
    assert len(names) == 3
    assert [parse_index_file_name(name) for name in names] == [T0_MS, T0_MS + 1, T0_MS + 2]
    assert service.statistics().roll_total == 3
    assert [index_file.writable for index_file in service.files] == [False, False, True]
    assert service.query(key_hash("TopicA", "k1"), 0, 1 << 62, 10) == [700, 400, 100]
    assert service.query(key_hash("TopicA", "k1"), 0, 1 << 62, 2) == [700, 400]
    assert service.query(key_hash("TopicA", "k0"), T0_MS + 2000, T0_MS + 5000, 10) == [300]
    assert service.end_log_offset_bytes == 700
    assert service.flush() == T0_MS + 7000


def test_service_reopens_and_continues(tmp_path: Path) -> None:
    service = IndexService(tmp_path, GEOMETRY, writable=True, clock_ms=FakeClock(T0_MS))
    service.load()
    put_keys(service, [("a", 1, T0_MS), ("b", 2, T0_MS), ("c", 3, T0_MS), ("d", 4, T0_MS)])
    service.flush()
    service.close()
    reopened = IndexService(tmp_path, GEOMETRY, writable=True, clock_ms=FakeClock(T0_MS + 5))
    reopened.load()
    assert len(reopened.files) == 2
    put_keys(reopened, [("a", 5, T0_MS + 1000)])
    assert reopened.query(key_hash("TopicA", "a"), 0, 1 << 62, 10) == [5, 1]
    assert len(reopened.files) == 2  # the second file had room
    reader = IndexService(tmp_path, GEOMETRY, writable=False)
    reader.load()
    assert reader.query(key_hash("TopicA", "d"), 0, 1 << 62, 10) == [4]


def test_service_retention_and_recovery_deletes(tmp_path: Path) -> None:
    clock = FakeClock(T0_MS)
    service = IndexService(tmp_path, GEOMETRY, writable=True, clock_ms=clock)
    service.load()
    keys = [(f"k{n}", 100 * n, T0_MS + 1000 * n) for n in range(9)]  # three full files
    put_keys(service, keys)
    assert service.delete_below_log_offset(250) == 1  # first file ends at offset 200
    assert service.delete_below_log_offset(10_000) == 1  # the newest file stays
    assert len(service.files) == 1
    assert service.query(key_hash("TopicA", "k7"), 0, 1 << 62, 10) == [700]
    assert service.delete_newer_than(T0_MS + 100_000) == 0
    assert service.delete_newer_than(T0_MS + 7000) == 1
    assert service.files == []
    put_keys(service, [("k9", 900, T0_MS + 9000)])
    assert service.query(key_hash("TopicA", "k9"), 0, 1 << 62, 10) == [900]


def test_a_reader_loading_while_retention_deletes_skips_the_vanished_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    service = IndexService(tmp_path, GEOMETRY, writable=True, clock_ms=FakeClock(T0_MS))
    service.load()
    put_keys(service, [(f"k{n}", 100 * n, T0_MS + 1000 * n) for n in range(9)])
    service.flush()
    oldest = service.files[0].path
    real_open = IndexFile.open

    def open_after_retention(path: Path, geometry: StoreGeometry, *, writable: bool) -> IndexFile:
        if path == oldest:
            assert service.delete_below_log_offset(250) == 1  # between listing and mapping
        return real_open(path, geometry, writable=writable)

    monkeypatch.setattr(IndexFile, "open", open_after_retention)
    reader = IndexService(tmp_path, GEOMETRY, writable=False)
    reader.load()
    assert len(reader.files) == 2
    assert reader.query(key_hash("TopicA", "k7"), 0, 1 << 62, 10) == [700]
    reader.close()
    service.close()


def test_service_query_skips_files_outside_the_time_range(tmp_path: Path) -> None:
    service = IndexService(tmp_path, GEOMETRY, writable=True, clock_ms=FakeClock(T0_MS))
    service.load()
    day_ms = 86_400_000
    put_keys(service, [("same", n, T0_MS + day_ms * n) for n in range(6)])
    hash_value = key_hash("TopicA", "same")
    assert service.query(hash_value, T0_MS + day_ms, T0_MS + 4 * day_ms, 10) == [4, 3, 2, 1]
    assert service.query(hash_value, T0_MS + 10 * day_ms, T0_MS + 11 * day_ms, 10) == []
    assert service.statistics().query_total == 2


def test_service_handles_many_keys_in_one_batch(tmp_path: Path) -> None:
    geometry = StoreGeometry(index_slot_count=64, index_entry_count_max=1000)
    service = IndexService(tmp_path, geometry, writable=True, clock_ms=FakeClock(T0_MS))
    service.load()
    key_count = 5000
    hashes = np.array([key_hash("T", f"key-{n}") for n in range(key_count)], dtype=np.int64)
    offsets = np.arange(key_count, dtype=np.int64) * 64
    times = T0_MS + np.arange(key_count, dtype=np.int64)
    service.put_batch(hashes, offsets, times)
    assert len(service.files) == 6  # 999 entries per file
    for n in itertools.chain(range(0, key_count, 613), [key_count - 1]):
        assert offsets[n] in service.query(int(hashes[n]), 0, 1 << 62, 10)
