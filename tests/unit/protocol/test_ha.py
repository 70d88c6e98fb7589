"""The HA codec (mqbox/protocol/ha.py): any split of the stream gives the same reports and
frames, and every size from the peer is bounded.

Goal: (1) reports and transfer frames survive any cut of the byte stream; (2) the master keeps
only the newest report of a read; (3) a body over the bound, a negative offset, or a flood of
unread reports is a RemoteProtocolError.
Method: hypothesis cuts encoded streams at random points.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mqbox.protocol.errors import RemoteProtocolError
from mqbox.protocol.ha import (
    REPORT_BUFFER_SIZE_BYTES_MAX,
    ReportReader,
    TransferFrame,
    TransferReader,
    encode_report,
    encode_transfer_header,
)

frames = st.lists(
    st.tuples(st.integers(0, 2**62), st.binary(max_size=300)), min_size=1, max_size=20
)


def _cut(stream: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({0, len(stream), *(c % (len(stream) + 1) for c in cuts)})
    return [stream[a:b] for a, b in itertools.pairwise(points)]


@given(frames, st.lists(st.integers(0, 10_000), max_size=30))
def test_transfer_frames_survive_any_split(sent: list[tuple[int, bytes]], cuts: list[int]) -> None:
    stream = b"".join(encode_transfer_header(o, len(b)) + b for o, b in sent)
    reader = TransferReader(body_size_bytes_max=300)
    received: list[TransferFrame] = []
    for piece in _cut(stream, cuts):
        reader.receive_data(piece)
        while (frame := reader.next_frame()) is not None:
            received.append(frame)
    assert received == [TransferFrame(o, b) for o, b in sent]
    assert reader.buffered_size_bytes == 0


@given(st.lists(st.integers(0, 2**62), min_size=1, max_size=20), st.lists(st.integers(0, 999)))
def test_the_master_keeps_the_newest_report(reports: list[int], cuts: list[int]) -> None:
    stream = b"".join(encode_report(value) for value in reports)
    reader = ReportReader()
    newest: int | None = None
    for piece in _cut(stream, cuts):
        value = reader.receive_data(piece)
        if value is not None:
            newest = value
    assert newest == reports[-1]
    assert reader.report_total == len(reports)


def test_sizes_from_the_peer_are_bounded() -> None:
    reader = TransferReader(body_size_bytes_max=100)
    reader.receive_data(encode_transfer_header(0, 101))
    with pytest.raises(RemoteProtocolError, match="101-byte body"):
        reader.next_frame()
    negative = TransferReader()
    negative.receive_data(b"\xff" * 8 + b"\x00" * 4)
    with pytest.raises(RemoteProtocolError, match="negative"):
        negative.next_frame()
    with pytest.raises(RemoteProtocolError, match="negative"):
        ReportReader().receive_data(b"\xff" * 8)
    with pytest.raises(RemoteProtocolError, match="unread"):
        ReportReader().receive_data(b"\x00" * (REPORT_BUFFER_SIZE_BYTES_MAX + 1))
