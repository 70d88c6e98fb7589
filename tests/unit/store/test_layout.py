"""Goal: the store's names and byte layouts are RocketMQ's and agree with each other.

Method: compare each numpy dtype against `struct` formats written independently from
docs/protocol.md section 7, round-trip the file names (hypothesis over the whole range),
and check the defaults and the geometry's validation.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mqbox.errors import ConfigError
from mqbox.store import layout


def test_defaults_are_rocketmq_sizes() -> None:
    assert layout.COMMIT_LOG_SEGMENT_SIZE_BYTES_DEFAULT == 1024**3
    assert layout.CQ_SEGMENT_SIZE_BYTES_DEFAULT == 300_000 * 20
    assert layout.INDEX_FILE_SIZE_BYTES_DEFAULT == 40 + 5_000_000 * 4 + 20_000_000 * 20
    assert layout.CHECKPOINT_FILE_SIZE_BYTES == 4096


def test_cq_entry_dtype_is_big_endian_packed_20_bytes() -> None:
    entry = np.zeros(1, dtype=layout.CQ_ENTRY_DTYPE)
    entry["log_offset_bytes"] = 0x0102030405060708
    entry["size_bytes"] = 0x0A0B0C0D
    entry["tag_hash"] = -2
    assert entry.tobytes() == struct.pack(">qiq", 0x0102030405060708, 0x0A0B0C0D, -2)


def test_index_dtypes_match_struct_formats() -> None:
    header = np.zeros(1, dtype=layout.INDEX_HEADER_DTYPE)
    header[0] = (1, 2, 3, 4, 5, 6)
    assert header.tobytes() == struct.pack(">qqqqii", 1, 2, 3, 4, 5, 6)
    entry = np.zeros(1, dtype=layout.INDEX_ENTRY_DTYPE)
    entry[0] = (7, 8, 9, 10)
    assert entry.tobytes() == struct.pack(">iqii", 7, 8, 9, 10)


def test_index_positions() -> None:
    assert layout.index_entries_position_bytes(5_000_000) == 20_000_040
    assert layout.index_slots_position_bytes() == 40
    assert layout.index_file_size_bytes(2, 3) == 40 + 8 + 60


@given(st.integers(min_value=0, max_value=layout.INT64_MAX))
def test_segment_name_round_trips(start_offset_bytes: int) -> None:
    name = layout.segment_name(start_offset_bytes)
    assert len(name) == 20
    assert layout.parse_segment_name(name) == start_offset_bytes


def test_segment_names_sort_like_offsets() -> None:
    offsets = [0, 6_000_000, 12_000_000, 1024**3, 10 * 1024**3]
    names = [layout.segment_name(offset) for offset in offsets]
    assert sorted(names) == names
    assert names[1] == "00000000000006000000"


@pytest.mark.parametrize(
    "name", ["", "0", "0000000000000000000", "000000000000000000000", "0000000000000000000a",
             "00000000000000000000.tmp", "99999999999999999999"]
)  # fmt: skip
def test_parse_segment_name_rejects_strays(name: str) -> None:
    assert layout.parse_segment_name(name) is None


@given(st.integers(min_value=0, max_value=253_402_300_799_999))  # up to 9999-12-31
def test_index_file_name_round_trips(timestamp_ms: int) -> None:
    name = layout.index_file_name(timestamp_ms)
    assert len(name) == 17
    assert layout.parse_index_file_name(name) == timestamp_ms


@given(st.lists(st.integers(min_value=0, max_value=4_102_444_800_000), min_size=2, max_size=8))
def test_index_file_names_sort_like_times(timestamps_ms: list[int]) -> None:
    names = [layout.index_file_name(timestamp_ms) for timestamp_ms in sorted(timestamps_ms)]
    assert sorted(names) == names


def test_index_file_name_is_utc() -> None:
    assert layout.index_file_name(0) == "19700101000000000"
    assert layout.index_file_name(1_700_000_000_123) == "20231114221320123"


@pytest.mark.parametrize("name", ["2023111422132012", "20231314221320123", "x0231114221320123"])
def test_parse_index_file_name_rejects_strays(name: str) -> None:
    assert layout.parse_index_file_name(name) is None


def test_paths_follow_rocketmq_layout(tmp_path: Path) -> None:
    assert layout.commit_log_dir(tmp_path) == tmp_path / "commitlog"
    assert layout.consume_queue_dir(tmp_path, "TopicA", 3) == tmp_path / "consumequeue/TopicA/3"
    assert layout.index_dir(tmp_path) == tmp_path / "index"
    assert layout.config_dir(tmp_path) == tmp_path / "config"
    assert layout.checkpoint_path(tmp_path) == tmp_path / "checkpoint"
    assert layout.abort_path(tmp_path) == tmp_path / "abort"


@pytest.mark.parametrize("topic", ["", ".", "..", "a/b", "a\0b"])
def test_unsafe_topic_dir_names(topic: str) -> None:
    assert not layout.is_safe_topic_dir_name(topic)


def test_safe_topic_dir_names() -> None:
    assert layout.is_safe_topic_dir_name("%RETRY%group-1")
    assert layout.is_safe_topic_dir_name("SCHEDULE_TOPIC_XXXX")


def test_geometry_defaults_and_derived_sizes() -> None:
    geometry = layout.StoreGeometry()
    assert geometry.cq_segment_size_bytes == 6_000_000
    assert geometry.index_file_size_bytes == 420_000_040
    tiny = layout.StoreGeometry(
        cq_segment_entry_count=4, index_slot_count=3, index_entry_count_max=5
    )
    assert tiny.cq_segment_size_bytes == 80
    assert tiny.index_file_size_bytes == 40 + 12 + 100


@pytest.mark.parametrize(
    "arguments",
    [
        {"commit_log_segment_size_bytes": 0},
        {"cq_segment_entry_count": 0},
        {"index_slot_count": 0},
        {"index_slot_count": 1 << 31},
        {"index_entry_count_max": 1},
        {"index_entry_count_max": 1 << 31},
    ],
)
def test_geometry_rejects_bad_sizes(arguments: dict[str, int]) -> None:
    with pytest.raises(ConfigError):
        layout.StoreGeometry(**arguments)
