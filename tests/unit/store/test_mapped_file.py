"""Goal: segments are created at full size, mapped as asked, flushed, evicted and truncated without
losing or inventing a byte; small files are replaced atomically.

Method: tiny segments in tmp_path. Each behaviour is driven through the public API and checked
against the file as `os` and `Path` see it (sizes, bytes, directory listings, /proc/self/fd).
Truncation is checked against a bytearray model with hypothesis. A crash between the temp write
and the rename is simulated by making the rename raise.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqbox.errors import StoreError
from mqbox.store.layout import segment_name
from mqbox.store.mapped_file import (
    PAGE_SIZE_BYTES,
    MapLru,
    MappedFile,
    MappedFileQueue,
    data_end_bytes,
    ensure_directory,
    write_file_atomically,
)

SEGMENT_SIZE_BYTES = 3 * PAGE_SIZE_BYTES + 100  # not page-aligned on purpose


def open_fd_count() -> int:
    return sum(1 for _ in Path("/proc/self/fd").iterdir())


# -- MappedFile ------------------------------------------------------------------------------


def test_create_sizes_file_sparse_and_maps_it_writable(tmp_path: Path) -> None:
    path = tmp_path / "segment"
    mapped_file = MappedFile.create(path, SEGMENT_SIZE_BYTES)
    assert path.stat().st_size == SEGMENT_SIZE_BYTES
    assert path.stat().st_blocks == 0  # ftruncate allocates nothing
    assert mapped_file.writable
    assert not mapped_file.buffer.any()
    mapped_file.buffer[5:8] = [1, 2, 3]
    mapped_file.flush()
    mapped_file.close()
    assert path.read_bytes()[5:8] == b"\x01\x02\x03"


def test_create_with_reserve_disk_allocates_blocks(tmp_path: Path) -> None:
    path = tmp_path / "segment"
    MappedFile.create(path, SEGMENT_SIZE_BYTES, reserve_disk=True).close()
    assert path.stat().st_size == SEGMENT_SIZE_BYTES
    assert path.stat().st_blocks * 512 >= SEGMENT_SIZE_BYTES


def test_create_refuses_an_existing_file(tmp_path: Path) -> None:
    path = tmp_path / "segment"
    path.write_bytes(b"old")
    with pytest.raises(StoreError):
        MappedFile.create(path, SEGMENT_SIZE_BYTES)
    assert path.read_bytes() == b"old"


def test_open_checks_size_and_reports_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "segment"
    path.write_bytes(b"x" * 10)
    with pytest.raises(StoreError, match="expected"):
        MappedFile.open(path, SEGMENT_SIZE_BYTES, writable=False)
    with pytest.raises(FileNotFoundError):
        MappedFile.open(tmp_path / "missing", SEGMENT_SIZE_BYTES, writable=False)


def test_read_only_map_gives_read_only_view(tmp_path: Path) -> None:
    path = tmp_path / "segment"
    MappedFile.create(path, SEGMENT_SIZE_BYTES).close()
    mapped_file = MappedFile.open(path, SEGMENT_SIZE_BYTES, writable=False)
    assert not mapped_file.buffer.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        mapped_file.buffer[0] = 1
    mapped_file.close()


@pytest.mark.parametrize(
    ("start", "end"), [(0, 1), (1, 2), (PAGE_SIZE_BYTES - 1, PAGE_SIZE_BYTES + 1), (0, -1)]
)
def test_flush_accepts_any_range(tmp_path: Path, start: int, end: int) -> None:
    mapped_file = MappedFile.create(tmp_path / "segment", SEGMENT_SIZE_BYTES)
    mapped_file.buffer[:] = 7
    mapped_file.flush(start, end)
    mapped_file.flush(SEGMENT_SIZE_BYTES - 1, SEGMENT_SIZE_BYTES)
    mapped_file.close()


def test_close_with_live_view_defers_unmap_and_keeps_writes(tmp_path: Path) -> None:
    path = tmp_path / "segment"
    mapped_file = MappedFile.create(path, SEGMENT_SIZE_BYTES)
    view = mapped_file.buffer[10:20]
    assert mapped_file.close() is False
    assert mapped_file.closed
    view[:] = 9  # still mapped, still MAP_SHARED
    del view
    assert path.read_bytes()[10:20] == b"\x09" * 10


def test_unlink_removes_file(tmp_path: Path) -> None:
    path = tmp_path / "segment"
    MappedFile.create(path, SEGMENT_SIZE_BYTES).unlink()
    assert not path.exists()


# -- helpers -----------------------------------------------------------------------------------


def test_data_end_bytes_skips_sparse_tail(tmp_path: Path) -> None:
    path = tmp_path / "segment"
    mapped_file = MappedFile.create(path, 64 * PAGE_SIZE_BYTES)
    assert data_end_bytes(path) == 0
    mapped_file.buffer[PAGE_SIZE_BYTES + 5] = 1
    mapped_file.flush()
    end_bytes = data_end_bytes(path)
    assert PAGE_SIZE_BYTES + 6 <= end_bytes < 64 * PAGE_SIZE_BYTES
    mapped_file.close()


def test_ensure_directory_reports_changed_parents(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "c"
    assert ensure_directory(target) == [tmp_path, tmp_path / "a", tmp_path / "a" / "b"]
    assert target.is_dir()
    assert ensure_directory(target) == []


def test_write_file_atomically_replaces_and_keeps_backup(tmp_path: Path) -> None:
    path = tmp_path / "file.json"
    write_file_atomically(path, b"one", keep_backup=True)
    assert not (tmp_path / "file.json.bak").exists()
    write_file_atomically(path, b"two", keep_backup=True)
    assert path.read_bytes() == b"two"
    assert (tmp_path / "file.json.bak").read_bytes() == b"one"
    assert sorted(child.name for child in tmp_path.iterdir()) == ["file.json", "file.json.bak"]


def test_write_file_atomically_crash_before_rename_keeps_old(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "file"
    write_file_atomically(path, b"old")

    def crash(self: Path, target: Path) -> Path:
        raise OSError(5, "simulated crash")

    monkeypatch.setattr(Path, "replace", crash)
    with pytest.raises(StoreError, match="simulated crash"):
        write_file_atomically(path, b"new")
    monkeypatch.undo()
    assert path.read_bytes() == b"old"
    assert (tmp_path / "file.tmp").read_bytes() == b"new"  # the leftover is harmless
    write_file_atomically(path, b"newer")
    assert path.read_bytes() == b"newer"


# -- MapLru ------------------------------------------------------------------------------------


def test_map_lru_closes_least_recently_used(tmp_path: Path) -> None:
    lru = MapLru(2)
    files = [MappedFile.create(tmp_path / f"s{n}", SEGMENT_SIZE_BYTES) for n in range(3)]
    lru.touch(files[0])
    lru.touch(files[1])
    lru.touch(files[0])
    lru.touch(files[2])
    assert [mapped_file.closed for mapped_file in files] == [False, True, False]
    statistics = lru.statistics()
    assert statistics.open_count == 2
    assert statistics.evicted_total == 1
    assert statistics.opened_total == 3
    for mapped_file in files:
        mapped_file.close()


# -- MappedFileQueue ---------------------------------------------------------------------------


def make_queue(
    directory: Path, *, writable: bool = True, lru: MapLru | None = None
) -> MappedFileQueue:
    queue = MappedFileQueue(directory, SEGMENT_SIZE_BYTES, writable=writable, map_lru=lru)
    queue.load()
    return queue


def test_queue_on_missing_directory_is_empty(tmp_path: Path) -> None:
    queue = make_queue(tmp_path / "missing")
    assert queue.segment_count == 0
    assert queue.min_offset_bytes is None
    assert queue.end_offset_bytes is None
    assert queue.find_segment(0) is None


def test_queue_rolls_segments_named_by_start_offset(tmp_path: Path) -> None:
    directory = tmp_path / "q"
    queue = make_queue(directory)
    first = queue.segment_for_write(0)
    second = queue.segment_for_write(SEGMENT_SIZE_BYTES + 1)
    assert first.path.name == segment_name(0)
    assert second.path.name == segment_name(SEGMENT_SIZE_BYTES)
    assert queue.segment_starts_bytes == (0, SEGMENT_SIZE_BYTES)
    assert queue.end_offset_bytes == 2 * SEGMENT_SIZE_BYTES
    second.buffer[1] = 42
    queue.flush(SEGMENT_SIZE_BYTES, SEGMENT_SIZE_BYTES + 2)
    queue.close()
    reopened = make_queue(directory, writable=False)
    found = reopened.find_segment(SEGMENT_SIZE_BYTES + 1)
    assert found is not None
    assert found.buffer[1] == 42
    reopened.close()


def test_queue_load_rejects_gap_misalignment_and_wrong_size(tmp_path: Path) -> None:
    for name, size, message in [
        (segment_name(2 * SEGMENT_SIZE_BYTES), SEGMENT_SIZE_BYTES, "gap"),
        (segment_name(SEGMENT_SIZE_BYTES + 1), SEGMENT_SIZE_BYTES, "aligned"),
    ]:
        directory = tmp_path / message
        directory.mkdir()
        (directory / segment_name(0)).write_bytes(bytes(SEGMENT_SIZE_BYTES))
        (directory / name).write_bytes(bytes(size))
        with pytest.raises(StoreError, match=message):
            make_queue(directory)
    directory = tmp_path / "size"
    directory.mkdir()
    (directory / segment_name(0)).write_bytes(bytes(10))
    (directory / segment_name(SEGMENT_SIZE_BYTES)).write_bytes(bytes(SEGMENT_SIZE_BYTES))
    with pytest.raises(StoreError, match="expected"):
        make_queue(directory)


def test_a_reader_listing_that_raced_retention_keeps_the_newest_contiguous_run(
    tmp_path: Path,
) -> None:
    # What a listing can see while the writer deletes segments 1 and 2 (in that order): segment
    # 1's name read before its unlink, segment 2's read after. Only the writer calls that broken.
    for start in (0, SEGMENT_SIZE_BYTES, 3 * SEGMENT_SIZE_BYTES, 4 * SEGMENT_SIZE_BYTES):
        (tmp_path / segment_name(start)).write_bytes(bytes(SEGMENT_SIZE_BYTES))
    reader = make_queue(tmp_path, writable=False)
    assert reader.segment_starts_bytes == (3 * SEGMENT_SIZE_BYTES, 4 * SEGMENT_SIZE_BYTES)
    assert reader.find_segment(0) is None
    with pytest.raises(StoreError, match="gap"):
        make_queue(tmp_path)


def test_detached_segments_leave_the_queue_first_and_the_disk_second(tmp_path: Path) -> None:
    queue = make_queue(tmp_path)
    for segment_index in range(3):
        queue.segment_for_write(segment_index * SEGMENT_SIZE_BYTES)
    paths = queue.detach_segments_below(2 * SEGMENT_SIZE_BYTES)
    assert paths == [tmp_path / segment_name(0), tmp_path / segment_name(SEGMENT_SIZE_BYTES)]
    assert queue.segment_starts_bytes == (2 * SEGMENT_SIZE_BYTES,)
    assert all(path.exists() for path in paths)
    queue.unlink_detached(paths)
    assert [path.name for path in tmp_path.iterdir()] == [segment_name(2 * SEGMENT_SIZE_BYTES)]


def test_queue_load_ignores_stray_files(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("hello")
    (tmp_path / (segment_name(0) + ".tmp")).write_bytes(b"")
    assert make_queue(tmp_path).segment_count == 0


def test_short_last_segment_is_extended_by_writer_and_ignored_by_reader(tmp_path: Path) -> None:
    (tmp_path / segment_name(0)).write_bytes(bytes(SEGMENT_SIZE_BYTES))
    (tmp_path / segment_name(SEGMENT_SIZE_BYTES)).write_bytes(b"")
    reader = make_queue(tmp_path, writable=False)
    assert reader.segment_starts_bytes == (0,)
    writer = make_queue(tmp_path)
    assert writer.segment_starts_bytes == (0, SEGMENT_SIZE_BYTES)
    assert (tmp_path / segment_name(SEGMENT_SIZE_BYTES)).stat().st_size == SEGMENT_SIZE_BYTES


def test_reader_sees_segments_the_writer_adds_and_deletes(tmp_path: Path) -> None:
    writer = make_queue(tmp_path)
    writer.segment_for_write(0)
    reader = make_queue(tmp_path, writable=False)
    assert reader.segment_starts_bytes == (0,)
    writer.segment_for_write(SEGMENT_SIZE_BYTES).buffer[0] = 5
    found = reader.find_segment(SEGMENT_SIZE_BYTES)
    assert found is not None
    assert found.buffer[0] == 5
    reader.close()  # drop the map so the reader must reopen it
    assert writer.delete_segments_below(SEGMENT_SIZE_BYTES) == 1
    assert reader.find_segment(0) is None
    assert reader.segment_starts_bytes == (SEGMENT_SIZE_BYTES,)


def test_delete_segments_below_keeps_the_last(tmp_path: Path) -> None:
    queue = make_queue(tmp_path)
    for segment_index in range(4):
        queue.segment_for_write(segment_index * SEGMENT_SIZE_BYTES)
    assert queue.delete_segments_below(SEGMENT_SIZE_BYTES + 1) == 1  # segment 1 still in use
    assert queue.delete_segments_below(100 * SEGMENT_SIZE_BYTES) == 2
    assert queue.segment_starts_bytes == (3 * SEGMENT_SIZE_BYTES,)
    assert [path.name for path in tmp_path.iterdir()] == [segment_name(3 * SEGMENT_SIZE_BYTES)]


def fill_queue(queue: MappedFileQueue, segment_count: int, seed: int) -> bytearray:
    """Fill every byte of `segment_count` segments with non-zero noise; return the model."""
    generator = np.random.default_rng(seed)
    model = bytearray()
    for segment_index in range(segment_count):
        noise = generator.integers(1, 256, SEGMENT_SIZE_BYTES, dtype=np.uint8)
        queue.segment_for_write(segment_index * SEGMENT_SIZE_BYTES).buffer[:] = noise
        model += noise.tobytes()
    return model


def queue_bytes(directory: Path) -> bytes:
    return b"".join(path.read_bytes() for path in sorted(directory.iterdir()))


@settings(max_examples=25)
@given(
    segment_count=st.integers(min_value=1, max_value=3),
    cut_bytes=st.integers(min_value=0, max_value=4 * SEGMENT_SIZE_BYTES),
    seed=st.integers(min_value=0, max_value=2**32 - 1),
)
def test_truncate_zeroes_everything_at_and_after_the_cut(
    tmp_path_factory: pytest.TempPathFactory, segment_count: int, cut_bytes: int, seed: int
) -> None:
    directory = tmp_path_factory.mktemp("truncate")
    queue = make_queue(directory, lru=MapLru(2))
    model = fill_queue(queue, segment_count, seed)
    queue.truncate(cut_bytes)
    kept_segment_count = min(max(cut_bytes // SEGMENT_SIZE_BYTES + 1, 1), segment_count)
    assert queue.segment_count == kept_segment_count
    expected = bytearray(model[: kept_segment_count * SEGMENT_SIZE_BYTES])
    expected[cut_bytes:] = bytes(max(len(expected) - cut_bytes, 0))
    assert queue_bytes(directory) == bytes(expected)
    # The maps the queue hands out afterwards see the zeros too.
    last_start = queue.segment_starts_bytes[-1]
    assert bytes(queue.segment(last_start).buffer) == bytes(expected[last_start:])
    queue.close()


def test_truncate_before_the_first_segment_empties_it(tmp_path: Path) -> None:
    queue = make_queue(tmp_path)
    fill_queue(queue, 3, seed=1)
    assert queue.delete_segments_below(SEGMENT_SIZE_BYTES) == 1
    queue.truncate(0)
    assert queue.segment_starts_bytes == (SEGMENT_SIZE_BYTES,)
    assert queue_bytes(tmp_path) == bytes(SEGMENT_SIZE_BYTES)


def test_destroy_removes_files_and_directory(tmp_path: Path) -> None:
    directory = tmp_path / "q"
    queue = make_queue(directory)
    fill_queue(queue, 2, seed=2)
    queue.destroy()
    assert not directory.exists()


def test_lru_bounds_open_descriptors_across_queues(tmp_path: Path) -> None:
    lru = MapLru(4)
    queues = [make_queue(tmp_path / f"q{n}", lru=lru) for n in range(20)]
    baseline = open_fd_count()
    for round_index in range(3):
        for queue in queues:
            queue.segment_for_write(round_index * SEGMENT_SIZE_BYTES).buffer[0] = 1
    assert open_fd_count() <= baseline + 4
    assert lru.statistics().open_count == 4
    for queue in queues:  # evicted maps reopen, and the data is there
        segment = queue.find_segment(0)
        assert segment is not None
        assert segment.buffer[0] == 1
        queue.flush(0, 3 * SEGMENT_SIZE_BYTES)
    assert open_fd_count() <= baseline + 4
