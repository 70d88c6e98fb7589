"""Offset table and local offset file: Java's read/update/persist rules, and a file that survives
a crash at any step of its replacement.

Goal: OffsetTable updates (increase-only or set), reads (-1 and -2 where Java's
RemoteBrokerOffsetStore answers them) and chooses what persistAll sends and forgets as Java 4.9.7
does; the local file's JSON round-trips any table, refuses what is not its format, and reading
falls back to `.bak` exactly in the cases the module docstring lists.

Method: worked examples with a fetch function that answers, answers "none" or raises; for the
file, real files under pytest's tmp_path, including the three states a crash inside
write_file_atomically can leave (checked by building each state by hand), and a hypothesis
round trip of encode/decode.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mqbox.client.offset_store import (
    OFFSET_FETCH_FAILED,
    OFFSET_NOT_FOUND,
    OffsetFileError,
    OffsetTable,
    ReadOffsetType,
    backup_path,
    decode_offsets,
    encode_offsets,
    fetch_local_offset,
    local_offset_path,
    persist_local_offsets,
    read_offsets_file,
    temporary_path,
    write_file_atomically,
)
from mqbox.errors import ConfigError, MqboxError
from mqbox.protocol.headers import MessageQueue

Q0 = MessageQueue("Orders", "broker-a", 0)
Q1 = MessageQueue("Orders", "broker-a", 1)
Q2 = MessageQueue("Payments", "broker-b", 0)


class UnreachableError(MqboxError):
    pass


def failing(queue: MessageQueue) -> int | None:
    raise UnreachableError("no broker address")


def must_not_fetch(queue: MessageQueue) -> int | None:
    raise AssertionError("read from memory only")


# --- OffsetTable --------------------------------------------------------------------------------


def test_update_increase_only_never_lowers_and_set_does() -> None:
    table = OffsetTable()
    table.update(Q0, 10, increase_only=True)
    table.update(Q0, 7, increase_only=True)
    assert table.read_memory(Q0) == 10
    table.update(Q0, 12, increase_only=True)
    assert table.read_memory(Q0) == 12
    table.update(Q0, 3, increase_only=False)
    assert table.read_memory(Q0) == 3
    assert table.read_memory(Q1) == OFFSET_NOT_FOUND


def test_read_answers_like_remote_broker_offset_store() -> None:
    table = OffsetTable()
    assert table.read(Q0, ReadOffsetType.READ_FROM_MEMORY, must_not_fetch) == -1
    assert table.read(Q0, ReadOffsetType.READ_FROM_STORE, lambda queue: 42) == 42
    assert table.read(Q0, ReadOffsetType.READ_FROM_MEMORY, must_not_fetch) == 42  # now held
    assert table.read(Q0, ReadOffsetType.MEMORY_FIRST_THEN_STORE, must_not_fetch) == 42
    assert table.read(Q1, ReadOffsetType.MEMORY_FIRST_THEN_STORE, lambda queue: None) == -1
    assert table.read(Q1, ReadOffsetType.READ_FROM_MEMORY, must_not_fetch) == -1  # not held
    assert table.read(Q1, ReadOffsetType.READ_FROM_STORE, failing) == OFFSET_FETCH_FAILED == -2
    table.update(Q0, 50, increase_only=True)
    assert table.read(Q0, ReadOffsetType.READ_FROM_STORE, lambda queue: 40) == 40  # set, not max
    assert table.read_memory(Q0) == 40


def test_offsets_to_persist_sends_assigned_and_forgets_the_rest() -> None:
    table = OffsetTable()
    for queue, offset in ((Q0, 1), (Q1, 2), (Q2, 3)):
        table.update(queue, offset, increase_only=False)
    assert table.offsets_to_persist([]) == []
    assert table.snapshot() == {Q0: 1, Q1: 2, Q2: 3}  # nothing forgotten for an empty set
    assert sorted(table.offsets_to_persist([Q0, Q2]), key=str) == sorted(
        [(Q0, 1), (Q2, 3)], key=str
    )
    assert table.snapshot() == {Q0: 1, Q2: 3}
    assert table.clone_offset_table("Orders") == {Q0: 1}
    assert table.clone_offset_table() == {Q0: 1, Q2: 3}
    table.remove(Q0)
    assert table.snapshot([Q0, Q2]) == {Q2: 3}


# --- File format --------------------------------------------------------------------------------


def test_local_offset_path_is_javas_layout_and_refuses_odd_components(tmp_path: Path) -> None:
    path = local_offset_path(tmp_path, "10.0.0.1@4242#93841234567890", "CG")
    assert path == tmp_path / "10.0.0.1@4242#93841234567890" / "CG" / "offsets.json"
    for client_id, group in (("", "CG"), ("..", "CG"), ("a/b", "CG"), ("id", "."), ("id", "x\0")):
        with pytest.raises(ConfigError):
            local_offset_path(tmp_path, client_id, group)


def test_encoded_file_is_sorted_standard_json() -> None:
    content = encode_offsets({Q2: 9, Q1: 5, Q0: -1})
    assert content == (
        b'{"offsetTable": [\n'
        b'  {"brokerName": "broker-a", "offset": -1, "queueId": 0, "topic": "Orders"},\n'
        b'  {"brokerName": "broker-a", "offset": 5, "queueId": 1, "topic": "Orders"},\n'
        b'  {"brokerName": "broker-b", "offset": 9, "queueId": 0, "topic": "Payments"}\n'
        b"],\n"
        b' "version": 1}\n'
    )
    assert decode_offsets(encode_offsets({})) == {}


queue_tables = st.dictionaries(
    st.builds(
        MessageQueue,
        st.text(min_size=1, max_size=8),
        st.text(max_size=8),
        st.integers(0, 2**31 - 1),
    ),
    st.integers(-(2**63), 2**63 - 1),
    max_size=20,
)


@given(offsets=queue_tables)
def test_encode_decode_round_trip(offsets: dict[MessageQueue, int]) -> None:
    assert decode_offsets(encode_offsets(offsets)) == offsets


def entry_file(entry: bytes) -> bytes:
    return b'{"offsetTable": [{' + entry + b'}], "version": 1}'


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"\xff",
        b'{"offsetTable":{{"brokerName":"b","queueId":0,"topic":"T"}:1}}',  # Java's fastjson
        b'{"offsetTable": []}',  # no version
        b'{"offsetTable": {}, "version": 1}',
        b'{"offsetTable": [1], "version": 1}',
        entry_file(b'"brokerName": "b", "offset": 1, "queueId": -1, "topic": "T"'),
        entry_file(b'"brokerName": "b", "offset": 1.5, "queueId": 0, "topic": "T"'),
        entry_file(b'"brokerName": "b", "offset": true, "queueId": 0, "topic": "T"'),
        entry_file(b'"offset": 1, "queueId": 0, "topic": "T"'),
        entry_file(b'"brokerName": "b", "offset": 1, "queueId": 0, "topic": ""'),
    ],
)
def test_decode_refuses_what_is_not_the_format(content: bytes) -> None:
    with pytest.raises(OffsetFileError):
        decode_offsets(content)


# --- Files --------------------------------------------------------------------------------------


def offsets_file(tmp_path: Path) -> Path:
    return local_offset_path(tmp_path, "127.0.0.1@DEFAULT", "CG")


def test_write_creates_the_directories_and_keeps_the_previous_file_as_bak(tmp_path: Path) -> None:
    path = offsets_file(tmp_path)
    write_file_atomically(path, encode_offsets({Q0: 1}))
    assert read_offsets_file(path) == {Q0: 1}
    assert not backup_path(path).exists()
    write_file_atomically(path, encode_offsets({Q0: 2}))
    assert read_offsets_file(path) == {Q0: 2}
    assert decode_offsets(backup_path(path).read_bytes()) == {Q0: 1}
    assert not temporary_path(path).exists()


def test_every_crash_state_of_a_write_reads_the_old_or_the_new_offsets(tmp_path: Path) -> None:
    path = offsets_file(tmp_path)
    old, new = encode_offsets({Q0: 1}), encode_offsets({Q0: 2})
    path.parent.mkdir(parents=True)
    # 1. the temporary file written, nothing renamed yet
    path.write_bytes(old)
    temporary_path(path).write_bytes(new)
    assert read_offsets_file(path) == {Q0: 1}
    # 2. the old file renamed to .bak, the new one not yet in place
    path.replace(backup_path(path))
    assert read_offsets_file(path) == {Q0: 1}
    # 3. the new file in place
    temporary_path(path).replace(path)
    assert read_offsets_file(path) == {Q0: 2}


def test_reading_falls_back_to_bak_and_refuses_to_guess(tmp_path: Path) -> None:
    path = offsets_file(tmp_path)
    assert read_offsets_file(path) == {}  # a new consumer
    path.parent.mkdir(parents=True)
    path.write_bytes(b"")
    assert read_offsets_file(path) == {}  # empty, no .bak: nothing stored yet
    path.write_bytes(b"{damaged")
    with pytest.raises(OffsetFileError):
        read_offsets_file(path)  # Java would start over silently
    backup_path(path).write_bytes(encode_offsets({Q1: 7}))
    assert read_offsets_file(path) == {Q1: 7}
    path.unlink()
    assert read_offsets_file(path) == {Q1: 7}
    backup_path(path).write_bytes(b"[]")
    with pytest.raises(OffsetFileError):
        read_offsets_file(path)


def test_persist_and_fetch_local_offsets(tmp_path: Path) -> None:
    path = offsets_file(tmp_path)
    table = OffsetTable()
    table.update(Q0, 11, increase_only=False)
    table.update(Q2, 22, increase_only=False)
    persist_local_offsets(path, table, [])
    assert not path.exists()
    persist_local_offsets(path, table, [Q0, Q1])
    assert read_offsets_file(path) == {Q0: 11}
    assert table.snapshot() == {Q0: 11, Q2: 22}  # local persist forgets nothing
    restarted = OffsetTable()
    restarted.load(read_offsets_file(path))
    assert restarted.read_memory(Q0) == 11
    assert (
        restarted.read(Q2, ReadOffsetType.READ_FROM_STORE, lambda q: fetch_local_offset(path, q))
        == -1
    )
    path.write_bytes(b"{damaged")
    assert fetch_local_offset(path, Q0) is None


def test_a_write_that_cannot_happen_raises_offset_file_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_bytes(b"")
    with pytest.raises(OffsetFileError):
        write_file_atomically(blocker / "CG" / "offsets.json", b"{}")
