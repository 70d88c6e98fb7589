"""Goal: the checkpoint page holds RocketMQ's three timestamps at 0, 8 and 16, and a crash while
writing it leaves the previous page whole.

Method: round-trip values (hypothesis), compare the page with `struct`, reject malformed files,
and simulate a crash between the temp write and the rename by making the rename raise.
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mqbox.errors import StoreError
from mqbox.store.checkpoint import (
    Checkpoint,
    CheckpointTimestamps,
    decode_checkpoint,
    encode_checkpoint,
    read_checkpoint,
    write_checkpoint,
)

timestamps_ms = st.integers(min_value=0, max_value=(1 << 63) - 1)


@given(timestamps_ms, timestamps_ms, timestamps_ms)
def test_page_round_trips(physic_ms: int, logics_ms: int, index_ms: int) -> None:
    timestamps = CheckpointTimestamps(physic_ms, logics_ms, index_ms)
    page = encode_checkpoint(timestamps)
    assert len(page) == 4096
    assert page[:24] == struct.pack(">qqq", physic_ms, logics_ms, index_ms)
    assert page[24:] == bytes(4096 - 24)
    assert decode_checkpoint(page, Path("checkpoint")) == timestamps


def test_missing_file_reads_as_none(tmp_path: Path) -> None:
    assert read_checkpoint(tmp_path / "checkpoint") is None
    checkpoint = Checkpoint(tmp_path / "checkpoint")
    assert not checkpoint.existed
    assert checkpoint.timestamps == CheckpointTimestamps()


def test_bytes_after_the_fields_are_ignored(tmp_path: Path) -> None:
    page = bytearray(encode_checkpoint(CheckpointTimestamps(1, 2, 3)))
    page[24:40] = struct.pack(">qq", 99, 98)  # RocketMQ 5 writes more fields here
    (tmp_path / "checkpoint").write_bytes(bytes(page))
    assert read_checkpoint(tmp_path / "checkpoint") == CheckpointTimestamps(1, 2, 3)


@pytest.mark.parametrize(
    "content", [b"", b"\x00" * 4095, b"\x00" * 4097, struct.pack(">q", -1) + bytes(4088)]
)
def test_malformed_page_raises_store_error(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "checkpoint"
    path.write_bytes(content)
    with pytest.raises(StoreError, match="checkpoint"):
        read_checkpoint(path)


def test_flush_writes_only_changes(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint"
    checkpoint = Checkpoint(path)
    assert checkpoint.flush()  # the first flush creates the file even with zeros
    assert not checkpoint.flush()
    checkpoint.update(physic_msg_timestamp_ms=10, index_msg_timestamp_ms=30)
    assert checkpoint.timestamps_flushed == CheckpointTimestamps()
    assert checkpoint.flush()
    checkpoint.update(logics_msg_timestamp_ms=20)
    assert checkpoint.flush()
    assert Checkpoint(path).timestamps == CheckpointTimestamps(10, 20, 30)
    assert sorted(child.name for child in tmp_path.iterdir()) == ["checkpoint"]


def test_crash_between_temp_write_and_rename_keeps_old_page(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "checkpoint"
    write_checkpoint(path, CheckpointTimestamps(1, 1, 1))

    def crash(self: Path, target: Path) -> Path:
        raise OSError(5, "simulated crash")

    monkeypatch.setattr(Path, "replace", crash)
    with pytest.raises(StoreError):
        write_checkpoint(path, CheckpointTimestamps(2, 2, 2))
    monkeypatch.undo()
    assert read_checkpoint(path) == CheckpointTimestamps(1, 1, 1)
    write_checkpoint(path, CheckpointTimestamps(3, 3, 3))
    assert read_checkpoint(path) == CheckpointTimestamps(3, 3, 3)
