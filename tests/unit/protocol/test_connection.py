"""Connection: framing over any split of the stream, bounds, end of stream and failure.

Goal: a Connection yields the same commands however the byte stream is cut, checks every size from
outside before buffering, treats bad input only as RemoteProtocolError and stays failed after it,
and carries requests both ways with opaques echoed. Method: known frames fed whole, one byte at a
time and at split points hypothesis chooses; hand-made bad prefixes and headers; hypothesis-made
garbage, truncations and mutations of valid frames; a ConnectionPair for round trips. No sockets.
"""

from __future__ import annotations

import itertools
import json
import struct

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqbox.protocol import (
    CLOSED,
    FLAG_ONEWAY,
    FLAG_RESPONSE,
    NEED_DATA,
    Connection,
    LocalProtocolError,
    MiB,
    RemoteProtocolError,
    RemotingCommand,
    RequestCode,
    ResponseCode,
    Role,
    SendMessageResponseHeader,
    SerializeType,
    make_request,
)
from tests.support.connection_pair import ConnectionPair, drain


def json_frame(
    header: dict[str, object] | bytes, body: bytes = b"", serialize_type: int = 0
) -> bytes:
    header_bytes = header if isinstance(header, bytes) else orjson.dumps(header)
    word = (serialize_type << 24) | len(header_bytes)
    return struct.pack(">iI", 4 + len(header_bytes) + len(body), word) + header_bytes + body


def sample_commands() -> list[RemotingCommand]:
    """A mix: C++-style requests, a response, a binary-header command, an empty body, a big one."""
    send = make_request(
        RequestCode.SEND_MESSAGE,
        1,
        {"topic": "test", "queueId": "0", "properties": "TAGS\x01a\x02"},
        body=bytes(range(256)),
    )
    pull_response = RemotingCommand(
        ResponseCode.PULL_NOT_FOUND,
        opaque=2,
        flag=FLAG_RESPONSE,
        remark="no new message",
        ext_fields={"nextBeginOffset": "0", "minOffset": "0", "maxOffset": "0"},
    )
    binary = make_request(
        RequestCode.HEART_BEAT,
        3,
        {"k": "v", "ключ": "значение"},
        body=b'{"clientID":"c"}',
        serialize_type=SerializeType.ROCKETMQ,
    )
    empty = make_request(RequestCode.GET_ROUTEINFO_BY_TOPIC, 4)
    big = make_request(RequestCode.SEND_MESSAGE, 5, body=b"\xab" * 70_000)
    return [send, pull_response, binary, empty, big]


def encode_all(commands: list[RemotingCommand]) -> bytes:
    sender = Connection(Role.CLIENT)
    return b"".join(sender.send(command) for command in commands)


def feed(chunks: list[bytes], *, eof: bool = False) -> list[RemotingCommand]:
    """Deliver non-empty chunks (b"" would mean end of stream), draining after each."""
    receiver = Connection(Role.BROKER)
    received: list[RemotingCommand] = []
    for chunk in filter(None, chunks):
        receiver.receive_data(chunk)
        received += drain(receiver)
    if eof:
        receiver.receive_data(b"")
        assert receiver.next_command() is CLOSED
        assert receiver.next_command() is CLOSED
    return received


def test_frames_in_one_chunk_decode_in_order() -> None:
    commands = sample_commands()
    assert feed([encode_all(commands)], eof=True) == commands


def test_one_byte_at_a_time_gives_the_same_commands() -> None:
    commands = sample_commands()[:4]  # the 70 kB frame one byte at a time is slow, not different
    wire = encode_all(commands)
    assert feed([wire[index : index + 1] for index in range(len(wire))], eof=True) == commands


@settings(deadline=None, max_examples=200)
@given(data=st.data())
def test_any_split_gives_the_same_commands(data: st.DataObject) -> None:
    commands = sample_commands()
    wire = encode_all(commands)
    cuts = data.draw(st.lists(st.integers(0, len(wire)), max_size=30).map(sorted))
    bounds = [0, *cuts, len(wire)]
    chunks = [wire[start:end] for start, end in itertools.pairwise(bounds)]
    assert feed(chunks, eof=True) == commands


def test_receive_data_copies_a_mutable_buffer() -> None:
    wire = bytearray(encode_all(sample_commands()[:1]))
    receiver = Connection(Role.BROKER)
    receiver.receive_data(wire[:10])
    receiver.receive_data(memoryview(wire)[10:])
    wire[-1] ^= 0xFF
    (command,) = drain(receiver)
    assert command.body == bytes(range(256))


def test_partial_frame_waits_then_completes() -> None:
    wire = encode_all(sample_commands()[:1])
    receiver = Connection(Role.BROKER)
    receiver.receive_data(wire[:-1])
    assert receiver.next_command() is NEED_DATA
    assert receiver.statistics().bytes_buffered == len(wire) - 1
    receiver.receive_data(wire[-1:])
    assert isinstance(receiver.next_command(), RemotingCommand)
    assert receiver.next_command() is NEED_DATA
    assert receiver.statistics().bytes_buffered == 0


def test_end_of_stream_inside_a_frame_is_an_error_and_stays_one() -> None:
    wire = encode_all(sample_commands()[:1])
    receiver = Connection(Role.BROKER)
    receiver.receive_data(wire[:7])
    receiver.receive_data(b"")
    with pytest.raises(RemoteProtocolError, match="end of stream inside a frame"):
        receiver.next_command()
    assert receiver.failed
    with pytest.raises(RemoteProtocolError, match="already failed"):
        receiver.next_command()


def test_receive_data_after_end_of_stream_is_our_bug() -> None:
    receiver = Connection(Role.BROKER)
    receiver.receive_data(b"")
    with pytest.raises(LocalProtocolError):
        receiver.receive_data(b"x")


@pytest.mark.parametrize(
    ("prefix", "message"),
    [
        (struct.pack(">i", -1), "below the minimum"),
        (struct.pack(">i", 0), "below the minimum"),
        (struct.pack(">i", 3), "below the minimum"),
        (struct.pack(">i", 16 * MiB - 3), "exceeds the maximum"),
        (struct.pack(">i", 2**31 - 1), "exceeds the maximum"),
    ],
)
def test_bad_frame_length_is_refused_from_its_four_bytes(prefix: bytes, message: str) -> None:
    receiver = Connection(Role.BROKER)
    receiver.receive_data(prefix)  # nothing else arrives: no waiting for a frame that is refused
    with pytest.raises(RemoteProtocolError, match=message):
        receiver.next_command()
    assert receiver.statistics().bytes_buffered == 0


def test_largest_frame_is_accepted_and_one_byte_more_is_not() -> None:
    limit = 1024
    body = b"b" * (limit - 8 - 2)
    fits = json_frame(b"{}", body)
    assert len(fits) == limit
    receiver = Connection(Role.BROKER, frame_size_bytes_max=limit)
    receiver.receive_data(fits)
    with pytest.raises(RemoteProtocolError, match="no code"):
        receiver.next_command()  # got past framing: the header is the problem
    receiver = Connection(Role.BROKER, frame_size_bytes_max=limit)
    receiver.receive_data(json_frame(b"{}", body + b"b")[:8])
    with pytest.raises(RemoteProtocolError, match="exceeds the maximum"):
        receiver.next_command()


@pytest.mark.parametrize(
    ("frame", "message"),
    [
        (json_frame(b"{}", serialize_type=2), "unknown serialize type 2"),
        (json_frame(b"{}", serialize_type=255), "unknown serialize type 255"),
        (struct.pack(">iI", 6, 3) + b"{}", "header length 3 exceeds"),
        (json_frame(b"{not json"), "invalid JSON"),
        (json_frame(b""), "invalid JSON"),
        (json_frame(b"[1,2]"), "not an object"),
        (json_frame(b'"code"'), "not an object"),
        (json_frame({"opaque": 1, "flag": 0}), "no code"),
        (json_frame({"code": 10, "flag": 0}), "no opaque"),
        (json_frame({"code": 10, "opaque": 1}), "no flag"),
        (json_frame({"code": "10", "opaque": 1, "flag": 0}), "code is '10'"),
        (json_frame({"code": True, "opaque": 1, "flag": 0}), "code is True"),
        (json_frame({"code": 10.0, "opaque": 1, "flag": 0}), "code is 10.0"),
        (json_frame({"code": 10, "opaque": 2**31, "flag": 0}), "not a 32-bit"),
        (json_frame({"code": 10, "opaque": 1, "flag": -(2**31) - 1}), "not a 32-bit"),
        (json_frame({"code": 10, "opaque": 1, "flag": 0, "extFields": []}), "extFields is"),
        (json_frame({"code": 10, "opaque": 1, "flag": 0, "remark": 5}), "remark is"),
        (json_frame({"code": 10, "opaque": 1, "flag": 0, "version": "63"}), "version"),
        (json_frame(b"\x00" * 20, serialize_type=1), "binary header"),
    ],
)
def test_bad_frame_raises_remote_protocol_error_and_fails_the_connection(
    frame: bytes, message: str
) -> None:
    receiver = Connection(Role.BROKER)
    receiver.receive_data(frame)
    with pytest.raises(RemoteProtocolError, match=message):
        receiver.next_command()
    with pytest.raises(RemoteProtocolError, match="already failed"):
        receiver.next_command()
    receiver.receive_data(b"more bytes are dropped")
    assert receiver.statistics().bytes_buffered == 0


def test_invalid_utf8_json_header_still_decodes() -> None:
    header = (
        b'{"code":10,"extFields":{"properties":"TAGS\\u0001\xff\xfe\\u0002"},"flag":0,"opaque":3}'
    )
    (command,) = feed([json_frame(header)])
    assert command.ext_fields["properties"] == "TAGS\x01\ufffd\ufffd\x02"  # as Java reads it


def drain_until_done(receiver: Connection) -> None:
    """Decode until NEED_DATA or CLOSED; anything but RemoteProtocolError propagates."""
    while True:
        command = receiver.next_command()
        if command is NEED_DATA or command is CLOSED:
            return
        assert isinstance(command, RemotingCommand)
        # What a processor would touch: every value must come out as a string.
        assert all(type(value) is str for value in command.ext_fields.values())


def must_fail_cleanly(chunks: list[bytes], *, eof: bool) -> None:
    receiver = Connection(Role.BROKER, frame_size_bytes_max=64 * 1024)
    try:
        for chunk in filter(None, chunks):
            receiver.receive_data(chunk)
            drain_until_done(receiver)
        if eof:
            receiver.receive_data(b"")
            drain_until_done(receiver)
    except RemoteProtocolError:
        assert receiver.failed
        with pytest.raises(RemoteProtocolError):
            receiver.next_command()


@settings(deadline=None, max_examples=300)
@given(chunks=st.lists(st.binary(max_size=64), max_size=8), eof=st.booleans())
def test_random_bytes_raise_only_remote_protocol_error(chunks: list[bytes], eof: bool) -> None:
    must_fail_cleanly(chunks, eof=eof)


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3)
    ),
    max_leaves=8,
)
top_level_keys = st.sampled_from(
    ["code", "opaque", "flag", "extFields", "remark", "language", "version", "other"]
)


@settings(deadline=None, max_examples=300)
@given(
    header=st.dictionaries(top_level_keys, json_values, max_size=8),
    serialize_type=st.sampled_from([0, 1]),
    body=st.binary(max_size=16),
)
def test_random_json_headers_raise_only_remote_protocol_error(
    header: dict[str, object], serialize_type: int, body: bytes
) -> None:
    # The json module, because orjson refuses integers beyond 64 bits, which clients may send.
    must_fail_cleanly([json_frame(json.dumps(header).encode(), body, serialize_type)], eof=True)


@settings(deadline=None, max_examples=300)
@given(data=st.data())
def test_mutated_or_truncated_frames_raise_only_remote_protocol_error(
    data: st.DataObject,
) -> None:
    wire = bytearray(encode_all(sample_commands()[:4]))
    for _ in range(data.draw(st.integers(0, 4))):
        index = data.draw(st.integers(0, len(wire) - 1))
        wire[index] = data.draw(st.integers(0, 255))
    end = data.draw(st.integers(0, len(wire)))
    must_fail_cleanly([bytes(wire[:end])], eof=data.draw(st.booleans()))


def test_many_small_frames_leave_no_buffer_behind() -> None:
    command = make_request(RequestCode.HEART_BEAT, 1, body=b"x" * 100)
    wire = Connection(Role.CLIENT).send(command)
    receiver = Connection(Role.BROKER)
    count = 0
    for _ in range(50):  # several chunks of many frames each, one frame split across chunks
        chunk = wire * 40
        receiver.receive_data(chunk[:-5])
        count += len(drain(receiver))
        receiver.receive_data(chunk[-5:])
        count += len(drain(receiver))
    assert count == 50 * 40
    statistics = receiver.statistics()
    assert statistics.bytes_buffered == 0
    assert statistics.commands_received == count
    assert statistics.bytes_received == 50 * 40 * len(wire)


def test_opaques_start_at_zero_count_up_and_keep_the_sign_bit_clear() -> None:
    client = Connection(Role.CLIENT)
    assert [client.next_opaque() for _ in range(3)] == [0, 1, 2]
    client._opaque_next = 2**31 - 1  # jump to the end rather than count 2**31 requests
    assert client.next_opaque() == 2**31 - 1
    assert client.next_opaque() == 0


def test_send_refuses_a_frame_the_peer_would_refuse() -> None:
    sender = Connection(Role.BROKER, frame_size_bytes_max=1024)
    with pytest.raises(LocalProtocolError, match="exceeds the maximum"):
        sender.send(make_request(RequestCode.SEND_MESSAGE, 0, body=b"x" * 1024))


def test_send_head_leaves_room_for_the_body_the_caller_writes() -> None:
    pair = ConnectionPair()
    request = make_request(RequestCode.PULL_MESSAGE, pair.client.next_opaque())
    (received,) = pair.send(Role.CLIENT, request)
    records = b"stored records" * 10
    response = received.make_response(ResponseCode.SUCCESS, {"nextBeginOffset": "1"})
    head = pair.broker.send_head(response, len(records))
    (answer,) = pair.deliver(Role.BROKER, head + records)
    assert answer.opaque == request.opaque
    assert answer.body == records
    assert pair.broker.statistics().bytes_sent == len(head) + len(records)


def test_pair_round_trip_echoes_opaque_and_serialize_type() -> None:
    pair = ConnectionPair()
    for serialize_type in (SerializeType.JSON, SerializeType.ROCKETMQ):
        opaque = pair.client.next_opaque()
        request = make_request(
            RequestCode.SEND_MESSAGE,
            opaque,
            {"topic": "test", "queueId": "1"},
            body=b"hello",
            serialize_type=serialize_type,
        )
        (received,) = pair.send(Role.CLIENT, request, chunk_size_bytes=7)
        header = SendMessageResponseHeader("7F00000100002A9F0000000000000000", 1, 41)
        response = received.make_response(ResponseCode.SUCCESS, header.to_ext())
        (answer,) = pair.send(Role.BROKER, response, chunk_size_bytes=5)
        assert answer.is_response
        assert answer.opaque == opaque
        assert answer.serialize_type is serialize_type
        assert SendMessageResponseHeader.from_ext(answer.ext_fields) == header
    pair.close(Role.CLIENT)
    pair.close(Role.BROKER)


def test_broker_sends_requests_to_its_client_too() -> None:
    pair = ConnectionPair()
    notify = make_request(
        RequestCode.NOTIFY_CONSUMER_IDS_CHANGED,
        pair.broker.next_opaque(),
        {"consumerGroup": "CG_test"},
        oneway=True,
    )
    (received,) = pair.send(Role.BROKER, notify)
    assert received.is_oneway
    assert not received.is_response
    assert received.flag == FLAG_ONEWAY
    assert received.ext_fields == {"consumerGroup": "CG_test"}
