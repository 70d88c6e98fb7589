"""Fixed-size mmap'd segment files, the ordered queues of them, and the store's durability tools.

Owns: `MappedFile` (one preallocated file mapped read-write or read-only, with a numpy uint8 view
and range flushes), `MappedFileQueue` (the segments of one directory, named by the 20-digit
absolute offset of their first byte), `MapLru` (a budget of open maps shared by many queues), and
the small durability helpers other store modules use: `fsync_directory`, `ensure_directory`,
`write_file_atomically`, `data_end_bytes`.

Never: interpret the bytes (that is the caller's layout), keep write positions (the caller knows
how far it wrote and says what to flush), or touch a socket.

Invariants:
- Every segment in a queue has exactly `segment_size_bytes` bytes and starts at a multiple of it;
  the segments are contiguous. Loading a directory that breaks this raises StoreError.
- A segment is created with O_EXCL and sized with ftruncate before it is mapped, so a mapping
  never reaches past the end of its file. ftruncate leaves the file sparse: a write through the
  map on a full disk then faults (SIGBUS). The commit log should pass `reserve_disk=True`
  (posix_fallocate: ENOSPC surfaces as DiskFullError at creation); consume queues should not,
  because 10,000 queues would reserve 60 GB for files that mostly stay empty.
- A durable flush of a range covers the data (msync, which Linux implements as a ranged
  fdatasync), the file size, and the directory entries of segments and directories created
  since the last flush.
- Truncation zeroes with ftruncate (shrink, then grow back): no bytes are written, the page
  cache beyond the cut is dropped, and a 1 GiB segment costs two system calls. No other process
  may map a segment while it is truncated (recovery runs before readers start).
"""

from __future__ import annotations

import collections
import ctypes
import dataclasses
import errno
import mmap
import os
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from mqbox.errors import DiskFullError, StoreError
from mqbox.store.layout import (
    BACKUP_SUFFIX,
    DIRECTORY_MODE,
    FILE_MODE,
    TEMP_SUFFIX,
    parse_segment_name,
    segment_name,
)

PAGE_SIZE_BYTES = mmap.PAGESIZE
assert mmap.ALLOCATIONGRANULARITY % PAGE_SIZE_BYTES == 0

_DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


def store_error(error: OSError, action: str, path: Path) -> StoreError:
    """The operating error for an OSError raised while doing `action` on `path`."""
    message = f"{action} {path}: {error.strerror or error}"
    if error.errno in _DISK_FULL_ERRNOS:
        return DiskFullError(message)
    return StoreError(message)


# ---------------------------------------------------------------------------------------------
# Durability helpers
# ---------------------------------------------------------------------------------------------


def fsync_directory(directory: Path) -> None:
    """Make the entries of `directory` (creations, renames, deletions) durable."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as error:
        raise store_error(error, "fsync directory", directory) from error


_LIBC = ctypes.CDLL(None, use_errno=True)
_SYNCFS = getattr(_LIBC, "syncfs", None)


def sync_filesystem(path: Path) -> None:
    """Make every dirty page and all metadata of the file system holding `path` durable.

    syncfs(2): one journal commit instead of one per file. The consume-queue table uses it when
    many queues are dirty at once; 10,000 msyncs plus directory fsyncs cost seconds, this costs
    one flush of whatever the file system holds (the commit log's dirty pages included, which
    are written first anyway). Linux waits for the writes and, since 5.8, reports their errors.
    """
    if _SYNCFS is None:  # not Linux: sync every file system
        os.sync()
        return
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as error:
        raise store_error(error, "open", path) from error
    try:
        if _SYNCFS(fd) != 0:
            code = ctypes.get_errno()
            raise store_error(OSError(code, os.strerror(code)), "syncfs", path)
    finally:
        os.close(fd)


def ensure_directory(directory: Path) -> list[Path]:
    """Create `directory` and its missing parents (DIRECTORY_MODE, 0700); return the directories
    whose entries changed.

    The caller fsyncs the returned directories (parents of what was created) before it counts
    anything inside `directory` as durable.
    """
    missing: list[Path] = []
    probe = directory
    while not probe.is_dir():
        missing.append(probe)
        assert probe.parent != probe
        probe = probe.parent
    changed: list[Path] = []
    for created in reversed(missing):
        try:
            created.mkdir(mode=DIRECTORY_MODE, exist_ok=True)
        except OSError as error:
            raise store_error(error, "create directory", created) from error
        changed.append(created.parent)
    return changed


def write_file_atomically(path: Path, data: bytes, *, keep_backup: bool = False) -> None:
    """Replace `path` with `data` so that a crash at any point leaves the old or the new file.

    Method: write `<name>.tmp` (FILE_MODE, 0600) in the same directory, fsync it, rename it over
    `<name>`, fsync the directory. With `keep_backup`, the previous version first becomes
    `<name>.bak` through a hard link, so `<name>` itself never goes missing (RocketMQ's
    ConfigManager keeps the same `.bak`, though it deletes the file before renaming).
    """
    temp_path = path.with_name(path.name + TEMP_SUFFIX)
    try:
        fd = os.open(temp_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, FILE_MODE)
        try:
            view = memoryview(data)
            while view:
                written_bytes = os.write(fd, view)
                assert written_bytes > 0
                view = view[written_bytes:]
            os.fsync(fd)
        finally:
            os.close(fd)
        if keep_backup and path.exists():
            backup_path = path.with_name(path.name + BACKUP_SUFFIX)
            backup_temp_path = backup_path.with_name(backup_path.name + TEMP_SUFFIX)
            backup_temp_path.unlink(missing_ok=True)
            backup_temp_path.hardlink_to(path)
            backup_temp_path.replace(backup_path)
        temp_path.replace(path)
    except OSError as error:
        raise store_error(error, "write", path) from error
    fsync_directory(path.parent)


def data_end_bytes(path: Path) -> int:
    """End of the last data region of `path`: bytes after it are a hole and read as zeros.

    Uses SEEK_DATA/SEEK_HOLE, so scanning a mostly empty 6 MB segment touches only the pages
    that hold data instead of faulting in the sparse tail. A file system without them reports
    the file size, which is still a correct (if loose) bound.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as error:
        raise store_error(error, "open", path) from error
    try:
        file_size_bytes = os.fstat(fd).st_size
        end_bytes = 0
        position_bytes = 0
        while position_bytes < file_size_bytes:
            try:
                data_start_bytes = os.lseek(fd, position_bytes, os.SEEK_DATA)
            except OSError as error:
                if error.errno == errno.ENXIO:  # no data at or after position_bytes
                    break
                if error.errno == errno.EINVAL:  # SEEK_DATA not supported here
                    return file_size_bytes
                raise store_error(error, "seek data in", path) from error
            hole_start_bytes = os.lseek(fd, data_start_bytes, os.SEEK_HOLE)
            assert hole_start_bytes > data_start_bytes
            end_bytes = hole_start_bytes
            position_bytes = hole_start_bytes
        assert end_bytes <= file_size_bytes
        return end_bytes
    finally:
        os.close(fd)


# ---------------------------------------------------------------------------------------------
# One segment
# ---------------------------------------------------------------------------------------------


class MappedFile:
    """One fixed-size file mapped into memory (MAP_SHARED), read-write or read-only.

    The owner of the object owns the write position. `buffer` is a numpy uint8 view of the whole
    file; views taken from it stay valid after `close()` (the mapping is then released when the
    last view is), so an eviction never leaves a dangling pointer, only a late munmap.
    Python's mmap keeps a duplicate of the descriptor, so each open map costs one descriptor
    and one kernel mapping; the descriptor used to create the map is closed at once.
    """

    __slots__ = ("_buffer", "_mapping", "file_size_bytes", "path", "writable")

    def __init__(self, path: Path, file_size_bytes: int, mapping: mmap.mmap, writable: bool):
        assert len(mapping) == file_size_bytes
        self.path = path
        self.file_size_bytes = file_size_bytes
        self.writable = writable
        self._mapping: mmap.mmap | None = mapping
        self._buffer: NDArray[np.uint8] | None = None

    @classmethod
    def create(cls, path: Path, file_size_bytes: int, *, reserve_disk: bool = False) -> MappedFile:
        """Create `path` (it must not exist) at its full size and map it read-write.

        `reserve_disk` allocates the blocks now (posix_fallocate), so a full disk is reported
        here as DiskFullError rather than as a fault on a later write through the map.
        """
        assert file_size_bytes > 0
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, FILE_MODE)
        except OSError as error:
            raise store_error(error, "create", path) from error
        try:
            if reserve_disk:
                os.posix_fallocate(fd, 0, file_size_bytes)
            else:
                os.ftruncate(fd, file_size_bytes)
            mapping = mmap.mmap(fd, file_size_bytes, access=mmap.ACCESS_WRITE)
        except OSError as error:
            path.unlink(missing_ok=True)
            raise store_error(error, "size and map", path) from error
        finally:
            os.close(fd)
        return cls(path, file_size_bytes, mapping, writable=True)

    @classmethod
    def open(cls, path: Path, file_size_bytes: int, *, writable: bool) -> MappedFile:
        """Map the existing file `path`, which must hold exactly `file_size_bytes` bytes.

        Raises FileNotFoundError if `path` is gone (a reader may race a retention delete),
        StoreError for a wrong size or any other failure.
        """
        assert file_size_bytes > 0
        flags = (os.O_RDWR if writable else os.O_RDONLY) | os.O_CLOEXEC
        fd = os.open(path, flags)  # FileNotFoundError passes through on purpose
        try:
            size_bytes = os.fstat(fd).st_size
            if size_bytes != file_size_bytes:
                raise StoreError(f"{path}: {size_bytes} bytes, expected {file_size_bytes}")
            access = mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ
            mapping = mmap.mmap(fd, file_size_bytes, access=access)
        except OSError as error:
            raise store_error(error, "map", path) from error
        finally:
            os.close(fd)
        return cls(path, file_size_bytes, mapping, writable=writable)

    @property
    def closed(self) -> bool:
        """True after `close()` (or an LRU eviction)."""
        return self._mapping is None

    @property
    def buffer(self) -> NDArray[np.uint8]:
        """The whole file as a numpy uint8 array (read-only if the map is)."""
        if self._buffer is None:
            assert self._mapping is not None
            self._buffer = np.frombuffer(self._mapping, dtype=np.uint8)
        assert len(self._buffer) == self.file_size_bytes
        return self._buffer

    def flush(self, start_file_offset_bytes: int = 0, end_file_offset_bytes: int = -1) -> None:
        """Write [start, end) of this file to disk and wait (msync MS_SYNC); -1 means the end.

        The range is widened to whole pages, as msync requires.
        """
        assert self.writable
        assert self._mapping is not None
        if end_file_offset_bytes < 0:
            end_file_offset_bytes = self.file_size_bytes
        assert 0 <= start_file_offset_bytes <= end_file_offset_bytes
        assert end_file_offset_bytes <= self.file_size_bytes
        if start_file_offset_bytes == end_file_offset_bytes:
            return
        start_page_bytes = start_file_offset_bytes - start_file_offset_bytes % PAGE_SIZE_BYTES
        end_page_bytes = min(
            -(-end_file_offset_bytes // PAGE_SIZE_BYTES) * PAGE_SIZE_BYTES, self.file_size_bytes
        )
        try:
            self._mapping.flush(start_page_bytes, end_page_bytes - start_page_bytes)
        except OSError as error:
            raise store_error(error, "flush", self.path) from error

    def madvise_random(self) -> None:
        """Tell the kernel that access is random (no read-ahead); for the index files."""
        assert self._mapping is not None
        self._mapping.madvise(mmap.MADV_RANDOM)

    def close(self) -> bool:
        """Release the map; True if it was unmapped now, False if views keep it alive a while."""
        mapping = self._mapping
        if mapping is None:
            return True
        self._mapping = None
        self._buffer = None
        try:
            mapping.close()
        except BufferError:
            # Views from `buffer` are still alive. Dropping our reference lets the last of them
            # unmap it; writes through them still reach the file (MAP_SHARED).
            return False
        return True

    def unlink(self) -> None:
        """Close the map and delete the file (the caller fsyncs the directory)."""
        self.close()
        try:
            self.path.unlink()
        except OSError as error:
            raise store_error(error, "delete", self.path) from error


# ---------------------------------------------------------------------------------------------
# A budget of open maps
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class MapLruStatistics:
    """Counters of a MapLru since it was made."""

    open_count: int
    open_count_max: int
    opened_total: int
    evicted_total: int
    deferred_close_total: int


class MapLru:
    """Least-recently-used set of open maps, shared by the queues of one store.

    Each open map costs a file descriptor and a kernel mapping (vm.max_map_count defaults to
    65530). Queues register every map they open with `touch()`; past `map_count_max` the least
    recently used map is closed, and its queue reopens it on next use. Dirty pages survive the
    munmap in the page cache, and a later flush of the range reopens the file and syncs them.
    """

    def __init__(self, map_count_max: int):
        assert map_count_max >= 2  # a roll touches the old segment and the new one
        self.map_count_max = map_count_max
        self._maps: collections.OrderedDict[MappedFile, None] = collections.OrderedDict()
        self._opened_total = 0
        self._evicted_total = 0
        self._deferred_close_total = 0

    def touch(self, mapped_file: MappedFile) -> None:
        """Mark `mapped_file` as just used; evict the oldest maps beyond the budget."""
        assert not mapped_file.closed
        if mapped_file in self._maps:
            self._maps.move_to_end(mapped_file)
            return
        self._maps[mapped_file] = None
        self._opened_total += 1
        while len(self._maps) > self.map_count_max:
            oldest, _ = self._maps.popitem(last=False)
            assert oldest is not mapped_file
            self._evicted_total += 1
            if not oldest.close():
                self._deferred_close_total += 1
        assert len(self._maps) <= self.map_count_max

    def forget(self, mapped_file: MappedFile) -> None:
        """Stop tracking `mapped_file` (its owner closed or deleted it)."""
        self._maps.pop(mapped_file, None)

    def statistics(self) -> MapLruStatistics:
        """Counters since creation."""
        return MapLruStatistics(
            open_count=len(self._maps),
            open_count_max=self.map_count_max,
            opened_total=self._opened_total,
            evicted_total=self._evicted_total,
            deferred_close_total=self._deferred_close_total,
        )


# ---------------------------------------------------------------------------------------------
# The segments of one directory
# ---------------------------------------------------------------------------------------------


class MappedFileQueue:
    """The ordered, contiguous segments of one directory; RocketMQ's MappedFileQueue.

    Offsets are absolute bytes in the queue's byte space: segment `<20-digit S>` holds
    [S, S + segment_size_bytes). Segments are mapped lazily, on first use, and the map may be
    closed by the shared MapLru at any time between calls; a MappedFile returned by a method
    is good until the next call into any queue sharing the LRU.

    Writable queues create, delete and truncate segments. Read-only queues (another process's
    view) re-list the directory when asked for an offset past their last known segment, and
    ignore a last segment that is still being created.
    """

    def __init__(
        self,
        directory: Path,
        segment_size_bytes: int,
        *,
        writable: bool,
        map_lru: MapLru | None = None,
        reserve_disk: bool = False,
        random_access: bool = False,
    ):
        """`random_access` maps every segment with MADV_RANDOM: no read-around, so touching a
        hole of a sparse file (a consume queue's next page) faults in one page, not 32."""
        assert segment_size_bytes > 0
        self.directory = directory
        self.random_access = random_access
        self.segment_size_bytes = segment_size_bytes
        self.writable = writable
        self.reserve_disk = reserve_disk
        self._map_lru = map_lru
        self._starts_bytes: list[int] = []
        self._maps: dict[int, MappedFile] = {}
        # Directories whose entries changed since the last flush (created segments and dirs).
        self._directories_unsynced: set[Path] = set()

    # -- listing -------------------------------------------------------------------------------

    def load(self) -> None:
        """List the segments on disk; check names, sizes and contiguity. Maps nothing."""
        self._close_maps()
        starts_bytes: list[int] = []
        sizes_bytes: dict[int, int] = {}
        try:
            with os.scandir(self.directory) as entries:
                for entry in entries:
                    start_offset_bytes = parse_segment_name(entry.name)
                    if start_offset_bytes is None:
                        continue
                    try:
                        if not entry.is_file(follow_symlinks=False):
                            continue
                        size_bytes = entry.stat(follow_symlinks=False).st_size
                    except FileNotFoundError:  # deleted by retention while we listed
                        continue
                    starts_bytes.append(start_offset_bytes)
                    sizes_bytes[start_offset_bytes] = size_bytes
        except FileNotFoundError:
            pass
        except OSError as error:
            raise store_error(error, "list", self.directory) from error
        starts_bytes.sort()
        if not self.writable:
            starts_bytes = self._newest_contiguous(starts_bytes)
        for position, start_offset_bytes in enumerate(starts_bytes):
            if start_offset_bytes % self.segment_size_bytes != 0:
                raise StoreError(
                    f"{self.directory}: segment {segment_name(start_offset_bytes)} is not "
                    f"aligned to {self.segment_size_bytes} bytes"
                )
            if position > 0 and start_offset_bytes != starts_bytes[position - 1] + (
                self.segment_size_bytes
            ):
                raise StoreError(
                    f"{self.directory}: gap before segment {segment_name(start_offset_bytes)}"
                )
        for position, start_offset_bytes in enumerate(starts_bytes):
            size_bytes = sizes_bytes[start_offset_bytes]
            is_last = position == len(starts_bytes) - 1
            if size_bytes == self.segment_size_bytes:
                continue
            if not is_last or size_bytes > self.segment_size_bytes:
                raise StoreError(
                    f"{self.directory}: segment {segment_name(start_offset_bytes)} has "
                    f"{size_bytes} bytes, expected {self.segment_size_bytes}"
                )
        if starts_bytes and sizes_bytes[starts_bytes[-1]] != self.segment_size_bytes:
            # A crash between create and ftruncate reaching the disk leaves a short last
            # segment. Its missing tail was never written, so growing it back is exact.
            last_path = self.directory / segment_name(starts_bytes[-1])
            if self.writable:
                try:
                    os.truncate(last_path, self.segment_size_bytes)
                except OSError as error:
                    raise store_error(error, "extend", last_path) from error
            else:
                starts_bytes.pop()  # still being created by the writer
        self._starts_bytes = starts_bytes

    def _newest_contiguous(self, starts_bytes: list[int]) -> list[int]:
        """A reader's listing (sorted): the contiguous run of segments that ends at the newest.

        Retention deletes the oldest segments one by one while a reader lists the directory,
        and a listing is no snapshot: it can hold an old segment read before its unlink and
        miss a younger one read after. Whatever lies before a gap is on its way out, so a
        reader drops it instead of calling the queue broken (the writer's own listing still
        raises: nothing deletes behind its back)."""
        size_bytes = self.segment_size_bytes
        keep_from = len(starts_bytes) - 1
        while (
            keep_from > 0
            and starts_bytes[keep_from] % size_bytes == 0
            and starts_bytes[keep_from - 1] + size_bytes == starts_bytes[keep_from]
        ):
            keep_from -= 1
        return starts_bytes[max(keep_from, 0) :]

    @property
    def segment_starts_bytes(self) -> tuple[int, ...]:
        """Start offsets of the segments, oldest first."""
        return tuple(self._starts_bytes)

    @property
    def segment_count(self) -> int:
        """How many segments the queue holds."""
        return len(self._starts_bytes)

    @property
    def min_offset_bytes(self) -> int | None:
        """Start of the first segment, or None when there is none."""
        return self._starts_bytes[0] if self._starts_bytes else None

    @property
    def end_offset_bytes(self) -> int | None:
        """End of the last segment (its start plus its size), or None when there is none."""
        if not self._starts_bytes:
            return None
        return self._starts_bytes[-1] + self.segment_size_bytes

    def segment_start_bytes(self, offset_bytes: int) -> int:
        """Start of the segment that holds `offset_bytes`, whether or not it exists."""
        assert offset_bytes >= 0
        return offset_bytes - offset_bytes % self.segment_size_bytes

    def has_segment(self, start_offset_bytes: int) -> bool:
        """True when a segment starts at `start_offset_bytes` (O(1): segments are contiguous)."""
        if not self._starts_bytes or start_offset_bytes % self.segment_size_bytes != 0:
            return False
        return self._starts_bytes[0] <= start_offset_bytes <= self._starts_bytes[-1]

    def segment_path(self, start_offset_bytes: int) -> Path:
        """Path of the segment starting at `start_offset_bytes`."""
        assert start_offset_bytes % self.segment_size_bytes == 0
        return self.directory / segment_name(start_offset_bytes)

    # -- mapping -------------------------------------------------------------------------------

    def segment(self, start_offset_bytes: int) -> MappedFile:
        """The mapped segment starting at `start_offset_bytes`, which must exist."""
        assert self.has_segment(start_offset_bytes)
        mapped_file = self._maps.get(start_offset_bytes)
        if mapped_file is None or mapped_file.closed:
            path = self.segment_path(start_offset_bytes)
            try:
                mapped_file = MappedFile.open(path, self.segment_size_bytes, writable=self.writable)
            except FileNotFoundError as error:
                raise StoreError(f"segment vanished: {path}") from error
            if self.random_access:
                mapped_file.madvise_random()
            self._maps[start_offset_bytes] = mapped_file
        if self._map_lru is not None:
            self._map_lru.touch(mapped_file)
        return mapped_file

    def find_segment(self, offset_bytes: int) -> MappedFile | None:
        """The mapped segment holding `offset_bytes`, or None if no segment holds it."""
        assert offset_bytes >= 0
        start_offset_bytes = self.segment_start_bytes(offset_bytes)
        if not self.has_segment(start_offset_bytes):
            if self.writable:
                return None
            self.load()  # a reader learns of new and deleted segments by listing again
            if not self.has_segment(start_offset_bytes):
                return None
        if self.writable:
            return self.segment(start_offset_bytes)
        try:
            return self.segment(start_offset_bytes)
        except StoreError:
            if (self.directory / segment_name(start_offset_bytes)).exists():
                raise
            self.load()  # deleted by the writer's retention since we listed
            return None

    def create_segment(self, start_offset_bytes: int) -> MappedFile:
        """Create and map the segment at `start_offset_bytes`: the first, or the next one."""
        assert self.writable
        assert start_offset_bytes % self.segment_size_bytes == 0
        if self._starts_bytes:
            assert start_offset_bytes == self._starts_bytes[-1] + self.segment_size_bytes
        else:
            self._directories_unsynced.update(ensure_directory(self.directory))
        path = self.segment_path(start_offset_bytes)
        mapped_file = MappedFile.create(
            path, self.segment_size_bytes, reserve_disk=self.reserve_disk
        )
        if self.random_access:
            mapped_file.madvise_random()
        self._starts_bytes.append(start_offset_bytes)
        self._maps[start_offset_bytes] = mapped_file
        self._directories_unsynced.add(self.directory)
        if self._map_lru is not None:
            self._map_lru.touch(mapped_file)
        return mapped_file

    def segment_for_write(self, offset_bytes: int) -> MappedFile:
        """The segment holding `offset_bytes`, created first if it is the next one (a roll)."""
        assert self.writable
        start_offset_bytes = self.segment_start_bytes(offset_bytes)
        if self.has_segment(start_offset_bytes):
            return self.segment(start_offset_bytes)
        return self.create_segment(start_offset_bytes)

    # -- durability ----------------------------------------------------------------------------

    def flush(self, start_offset_bytes: int, end_offset_bytes: int) -> None:
        """Make bytes [start, end) durable, and the segments and directories created so far."""
        assert self.writable
        assert 0 <= start_offset_bytes <= end_offset_bytes
        position_bytes = start_offset_bytes
        while position_bytes < end_offset_bytes:
            segment_start_bytes = self.segment_start_bytes(position_bytes)
            segment_end_bytes = min(segment_start_bytes + self.segment_size_bytes, end_offset_bytes)
            if self.has_segment(segment_start_bytes):
                self.segment(segment_start_bytes).flush(
                    position_bytes - segment_start_bytes, segment_end_bytes - segment_start_bytes
                )
            position_bytes = segment_end_bytes
        self.sync_directories()

    def note_synced(self) -> None:
        """The caller made the whole file system durable (sync_filesystem): nothing is pending."""
        self._directories_unsynced.clear()

    def sync_directories(self) -> None:
        """fsync every directory whose entries changed since the last call."""
        for directory in sorted(self._directories_unsynced, key=lambda path: len(path.parts)):
            if directory.is_dir():
                fsync_directory(directory)
        self._directories_unsynced.clear()

    # -- removal -------------------------------------------------------------------------------

    def delete_segments_below(self, offset_bytes: int) -> int:
        """Delete every segment that ends at or before `offset_bytes`, but never the last one.

        Returns how many were deleted. Keeping the last segment keeps the queue's end offset
        on disk (RocketMQ's retention keeps it too).
        """
        paths = self.detach_segments_below(offset_bytes)
        self.unlink_detached(paths)
        return len(paths)

    def detach_segments_below(self, offset_bytes: int) -> list[Path]:
        """The first half of delete_segments_below: take the segments out of the queue (their
        maps closed) and return their paths, still on disk, for `unlink_detached`. A caller
        that holds a lock around the queue unlinks after releasing it."""
        assert self.writable
        paths: list[Path] = []
        while len(self._starts_bytes) > 1:
            start_offset_bytes = self._starts_bytes[0]
            if start_offset_bytes + self.segment_size_bytes > offset_bytes:
                break
            mapped_file = self._maps.pop(start_offset_bytes, None)
            if mapped_file is not None:
                if self._map_lru is not None:
                    self._map_lru.forget(mapped_file)
                mapped_file.close()
            paths.append(self.segment_path(start_offset_bytes))
            self._starts_bytes.pop(0)
        return paths

    def unlink_detached(self, paths: list[Path]) -> None:
        """The second half: delete the files, oldest first, then fsync the directory."""
        for path in paths:
            try:
                path.unlink()
            except OSError as error:
                raise store_error(error, "delete", path) from error
        if paths:
            fsync_directory(self.directory)

    def truncate(self, offset_bytes: int) -> None:
        """Make every byte at or beyond `offset_bytes` zero, durably.

        Segments that start after the segment holding `offset_bytes` are deleted; that segment
        keeps its size and is zeroed from `offset_bytes` on (it may end up empty, and it is the
        first segment, emptied, if `offset_bytes` lies before the queue).
        """
        assert self.writable
        assert offset_bytes >= 0
        if not self._starts_bytes:
            return
        last_end_bytes = self._starts_bytes[-1] + self.segment_size_bytes
        if offset_bytes >= last_end_bytes:
            return
        keep_start_bytes = max(self.segment_start_bytes(offset_bytes), self._starts_bytes[0])
        cut_file_offset_bytes = max(offset_bytes - keep_start_bytes, 0)
        while self._starts_bytes[-1] > keep_start_bytes:
            self._delete_segment(self._starts_bytes.pop())
        assert self._starts_bytes[-1] == keep_start_bytes
        mapped_file = self._maps.pop(keep_start_bytes, None)
        if mapped_file is not None:
            if self._map_lru is not None:
                self._map_lru.forget(mapped_file)
            mapped_file.close()
        path = self.segment_path(keep_start_bytes)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
            try:
                # POSIX: bytes past the shrunken end read as zeros once the file grows again.
                os.ftruncate(fd, cut_file_offset_bytes)
                os.ftruncate(fd, self.segment_size_bytes)
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as error:
            raise store_error(error, "truncate", path) from error
        self._directories_unsynced.add(self.directory)
        self.sync_directories()

    def _delete_segment(self, start_offset_bytes: int) -> None:
        mapped_file = self._maps.pop(start_offset_bytes, None)
        if mapped_file is not None:
            if self._map_lru is not None:
                self._map_lru.forget(mapped_file)
            mapped_file.close()
        path = self.segment_path(start_offset_bytes)
        try:
            path.unlink()
        except OSError as error:
            raise store_error(error, "delete", path) from error

    def destroy(self) -> None:
        """Delete every segment and then the directory itself (if it is empty)."""
        assert self.writable
        while self._starts_bytes:
            self._delete_segment(self._starts_bytes.pop())
        try:
            self.directory.rmdir()
        except FileNotFoundError:
            pass
        except OSError as error:
            raise store_error(error, "remove directory", self.directory) from error
        self._directories_unsynced.discard(self.directory)
        if self.directory.parent.is_dir():
            fsync_directory(self.directory.parent)

    def close(self) -> None:
        """Release every map; the queue can be used again (maps reopen lazily)."""
        self._close_maps()

    def _close_maps(self) -> None:
        for mapped_file in self._maps.values():
            if self._map_lru is not None:
                self._map_lru.forget(mapped_file)
            mapped_file.close()
        self._maps.clear()
