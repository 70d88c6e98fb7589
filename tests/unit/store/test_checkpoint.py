"""Goal: the checkpoint page holds RocketMQ's three timestamps at 0, 8 and 16 and mqbox's three
flushed log offsets in a CRC-checked block at 64, offsets only ever move forward, and a crash
while writing it leaves the previous page whole.

Method: round-trip values (hypothesis), compare the page with `struct`, reject malformed times,
drop (not trust) a damaged offsets block, read a page written before the offsets existed as
having none, and simulate a crash between the temp write and the rename by making the rename
raise.
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mqbox.errors import StoreError
from mqbox.store.checkpoint import (
    Checkpoint,
    CheckpointState,
    decode_checkpoint,
    encode_checkpoint,
    read_checkpoint,
    write_checkpoint,
)

timestamps_ms = st.integers(min_value=0, max_value=(1 << 63) - 1)
offsets_bytes = st.integers(min_value=0, max_value=(1 << 63) - 1)


@given(timestamps_ms, timestamps_ms, timestamps_ms, offsets_bytes, offsets_bytes, offsets_bytes)
def test_page_round_trips(
    physic_ms: int,
    logics_ms: int,
    index_ms: int,
    physic_bytes: int,
    logics_bytes: int,
    index_bytes: int,
) -> None:
    state = CheckpointState(physic_ms, logics_ms, index_ms, physic_bytes, logics_bytes, index_bytes)
    page = encode_checkpoint(state)
    assert len(page) == 4096
    assert page[:24] == struct.pack(">qqq", physic_ms, logics_ms, index_ms)
    assert page[24:64] == bytes(40)
    block = b"MQBXPOS1" + struct.pack(">qqq", physic_bytes, logics_bytes, index_bytes)
    assert page[64:96] == block
    assert page[96:100] == struct.pack(">I", zlib.crc32(block))
    assert page[100:] == bytes(4096 - 100)
    assert decode_checkpoint(page, Path("checkpoint")) == state


def test_page_without_offsets_reads_as_times_only(tmp_path: Path) -> None:
    page = struct.pack(">qqq", 1, 2, 3) + bytes(4096 - 24)  # RocketMQ's, or an older mqbox's
    (tmp_path / "checkpoint").write_bytes(page)
    state = read_checkpoint(tmp_path / "checkpoint")
    assert state == CheckpointState(1, 2, 3)
    assert state is not None
    assert not state.has_offsets
    assert encode_checkpoint(CheckpointState(1, 2, 3)) == page


@pytest.mark.parametrize("damaged_at", [64, 70, 80, 95, 97])
def test_damaged_offsets_block_is_dropped_not_trusted(tmp_path: Path, damaged_at: int) -> None:
    page = bytearray(encode_checkpoint(CheckpointState(1, 2, 3, 100, 200, 300)))
    page[damaged_at] ^= 0x40
    state = decode_checkpoint(bytes(page), tmp_path / "checkpoint")
    assert state == CheckpointState(1, 2, 3)


def test_negative_offset_is_dropped(tmp_path: Path) -> None:
    page = bytearray(encode_checkpoint(CheckpointState(1, 2, 3, 100, 200, 300)))
    block = b"MQBXPOS1" + struct.pack(">qqq", -1, 200, 300)
    page[64:96] = block
    page[96:100] = struct.pack(">I", zlib.crc32(block))
    assert decode_checkpoint(bytes(page), tmp_path / "checkpoint") == CheckpointState(1, 2, 3)


def test_missing_file_reads_as_none(tmp_path: Path) -> None:
    assert read_checkpoint(tmp_path / "checkpoint") is None
    checkpoint = Checkpoint(tmp_path / "checkpoint")
    assert not checkpoint.existed
    assert checkpoint.state == CheckpointState(0, 0, 0, 0, 0, 0)


def test_bytes_after_the_fields_are_ignored(tmp_path: Path) -> None:
    page = bytearray(encode_checkpoint(CheckpointState(1, 2, 3, 4, 5, 6)))
    page[24:40] = struct.pack(">qq", 99, 98)  # RocketMQ 5 writes more fields here
    page[200:208] = b"whatever"
    (tmp_path / "checkpoint").write_bytes(bytes(page))
    assert read_checkpoint(tmp_path / "checkpoint") == CheckpointState(1, 2, 3, 4, 5, 6)


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
    checkpoint.update(physic_log_offset_bytes=1000)
    assert checkpoint.state_flushed == CheckpointState(0, 0, 0, 0, 0, 0)
    assert checkpoint.flush()
    checkpoint.update(logics_msg_timestamp_ms=20, logics_log_offset_bytes=900)
    assert checkpoint.flush()
    assert Checkpoint(path).state == CheckpointState(10, 20, 30, 1000, 900, 0)
    assert sorted(child.name for child in tmp_path.iterdir()) == ["checkpoint"]


def test_offsets_never_move_back_except_by_a_repair_clamp(tmp_path: Path) -> None:
    checkpoint = Checkpoint(tmp_path / "checkpoint")
    checkpoint.update(physic_log_offset_bytes=500, logics_log_offset_bytes=400)
    checkpoint.update(physic_log_offset_bytes=300, logics_log_offset_bytes=450)
    assert checkpoint.state.physic_log_offset_bytes == 500
    assert checkpoint.state.logics_log_offset_bytes == 450
    checkpoint.clamp_offsets(420)
    assert checkpoint.state == CheckpointState(0, 0, 0, 420, 420, 0)


def test_a_store_from_before_the_offsets_starts_them_at_zero(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint"
    write_checkpoint(path, CheckpointState(7, 8, 9))
    checkpoint = Checkpoint(path)
    assert checkpoint.state_flushed == CheckpointState(7, 8, 9)
    assert checkpoint.state == CheckpointState(7, 8, 9, 0, 0, 0)
    checkpoint.update(physic_log_offset_bytes=64)
    assert checkpoint.flush()
    assert read_checkpoint(path) == CheckpointState(7, 8, 9, 64, 0, 0)


def test_crash_between_temp_write_and_rename_keeps_old_page(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "checkpoint"
    write_checkpoint(path, CheckpointState(1, 1, 1, 1, 1, 1))

    def crash(self: Path, target: Path) -> Path:
        raise OSError(5, "simulated crash")

    monkeypatch.setattr(Path, "replace", crash)
    with pytest.raises(StoreError):
        write_checkpoint(path, CheckpointState(2, 2, 2, 2, 2, 2))
    monkeypatch.undo()
    assert read_checkpoint(path) == CheckpointState(1, 1, 1, 1, 1, 1)
    write_checkpoint(path, CheckpointState(3, 3, 3, 3, 3, 3))
    assert read_checkpoint(path) == CheckpointState(3, 3, 3, 3, 3, 3)
