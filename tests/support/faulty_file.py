"""Crash simulation for store tests: what a disk may hold after a crash, made on purpose.

Owns: helpers that damage store files the way a crash can (a tail torn at a chosen byte, zeros
where pages never reached the disk, garbage where a sector held something else, a mix of the
last flushed version and the newest one chunk by chunk), `abandon_store()`, which drops a
MessageStore without any of close()'s flushing (the abort file stays, as after a SIGKILL), and
`open_store_with_recovery()`, which opens a store the way the broker will once recovery.recover()
is wired into MessageStore.open.

Never: used by mqbox itself; every helper works on closed files (the store's maps dropped).
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mqbox.store.layout import segment_name
from mqbox.store.message_store import MessageStore, StoreConfig
from mqbox.store.recovery import RecoveryReport

# --- Opening and dropping a store ------------------------------------------------------------


def open_store_with_recovery(
    root: Path,
    config: StoreConfig,
    *,
    clock_ms: Callable[[], int] | None = None,
    **recover_options: Any,
) -> tuple[MessageStore, RecoveryReport]:
    """MessageStore.open with its recovery report, for tests that look at the report."""
    if clock_ms is None:
        store = MessageStore.open(root, config, **recover_options)
    else:
        store = MessageStore.open(root, config, clock_ms=clock_ms, **recover_options)
    assert store.recovery_report is not None
    return store, store.recovery_report


def abandon_store(store: MessageStore) -> None:
    """Drop `store` as a crash would: no dispatch, no flush, no checkpoint, the abort file stays.
    Only the maps are released (their dirty pages stay in the page cache, as after SIGKILL)."""
    store.stop_background_threads()
    store.reader.close()
    store.commit_log.close()
    store.consume_queues.close()
    store.index.close()


# --- Damage -------------------------------------------------------------------------------------


def read_range(path: Path, start_bytes: int, end_bytes: int) -> bytes:
    """Bytes [start, end) of `path`."""
    with path.open("rb") as file:
        file.seek(start_bytes)
        return file.read(end_bytes - start_bytes)


def write_range(path: Path, start_bytes: int, data: bytes) -> None:
    """Overwrite `path` at `start_bytes` with `data` (the file keeps its size if data fits)."""
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        view = memoryview(data)
        position_bytes = start_bytes
        while view:
            written_bytes = os.pwrite(fd, view, position_bytes)
            assert written_bytes > 0
            view = view[written_bytes:]
            position_bytes += written_bytes
    finally:
        os.close(fd)


def zero_range(path: Path, start_bytes: int, end_bytes: int) -> None:
    """Zero bytes [start, end) of `path` (pages that never reached the disk)."""
    if end_bytes > start_bytes:
        write_range(path, start_bytes, bytes(end_bytes - start_bytes))


def garbage(size_bytes: int, seed: int) -> bytes:
    """`size_bytes` reproducible random bytes."""
    return random.Random(seed).randbytes(size_bytes)


def commit_log_segment_path(root: Path, segment_start_bytes: int) -> Path:
    """Path of the commit-log segment starting at `segment_start_bytes`."""
    return root / "commitlog" / segment_name(segment_start_bytes)


def tear_commit_log(
    root: Path,
    segment_size_bytes: int,
    tear_log_offset_bytes: int,
    end_log_offset_bytes: int,
    *,
    garbage_size_bytes: int = 0,
    seed: int = 0,
) -> None:
    """Make the commit log look as if only the bytes below `tear_log_offset_bytes` reached the
    disk: zero [tear, end) in every segment it spans, then write `garbage_size_bytes` random
    bytes at the tear (clipped to its segment), as a sector holding something else would."""
    position_bytes = tear_log_offset_bytes
    while position_bytes < end_log_offset_bytes:
        segment_start_bytes = position_bytes - position_bytes % segment_size_bytes
        path = commit_log_segment_path(root, segment_start_bytes)
        stop_bytes = min(end_log_offset_bytes, segment_start_bytes + segment_size_bytes)
        if path.exists():
            zero_range(path, position_bytes - segment_start_bytes, stop_bytes - segment_start_bytes)
        position_bytes = stop_bytes
    if garbage_size_bytes > 0:
        segment_start_bytes = tear_log_offset_bytes - tear_log_offset_bytes % segment_size_bytes
        path = commit_log_segment_path(root, segment_start_bytes)
        at_bytes = tear_log_offset_bytes - segment_start_bytes
        size_bytes = min(garbage_size_bytes, segment_size_bytes - at_bytes)
        if path.exists() and size_bytes > 0:
            write_range(path, at_bytes, garbage(size_bytes, seed))


def snapshot_files(directory: Path) -> dict[Path, bytes]:
    """The content of every regular file under `directory` (recursively)."""
    if not directory.is_dir():
        return {}
    return {path: path.read_bytes() for path in sorted(directory.rglob("*")) if path.is_file()}


def mix_chunks(path: Path, old: bytes, chunk_size_bytes: int, rng: random.Random) -> None:
    """Let each `chunk_size_bytes` chunk of `path` be its old (flushed) or its current content,
    at random: pages and sectors that reached the disk out of order. A missing or short old
    version counts as zeros (a file created after the flush)."""
    current = path.read_bytes()
    mixed = bytearray(current)
    for start_bytes in range(0, len(current), chunk_size_bytes):
        end_bytes = min(start_bytes + chunk_size_bytes, len(current))
        if rng.random() < 0.5:
            old_chunk = old[start_bytes:end_bytes]
            old_chunk += bytes(end_bytes - start_bytes - len(old_chunk))
            mixed[start_bytes:end_bytes] = old_chunk
    if mixed != current:
        write_range(path, 0, bytes(mixed))
