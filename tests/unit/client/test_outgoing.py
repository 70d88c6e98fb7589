"""What the producer puts on the wire, before any socket: validation, encoding, results.

Goal: outgoing.py refuses what Java's Validators refuse (empty or oversized bodies, bad or
reserved topics, bad groups, reserved properties) with InvalidMessageError carrying code 13;
encodes a single message's properties as rule 2 orders them, with WAIT=true and the UNIQ_KEY,
compressing bodies from 4 KiB with zlib level 5 and sysflag 0x1 only; encodes a batch as the
broker's batch decoder reads it back (every element's body, flag and properties, its own
UNIQ_KEY), never compressed, with WAIT=true in the header; builds the V2 header the broker's
decoder reads back; and turns SEND answers into SendResults (0/10/11/12) or None.

Method: round trips through the broker-side decoders of mqbox.message and mqbox.protocol
(decode_batch, decode_properties_str, SendMessageRequestHeader.from_ext), which are what the
broker runs; hypothesis varies batch contents.
"""

from __future__ import annotations

import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mqbox.client.errors import InvalidMessageError
from mqbox.client.outgoing import (
    SEND_BATCH_CODE,
    SEND_SINGLE_CODE,
    Message,
    SendStatus,
    check_group,
    check_topic,
    encode_batch,
    encode_single,
    read_send_response,
    request_code,
    send_request_ext,
)
from mqbox.errors import MessageIllegalError
from mqbox.message import (
    SYSFLAG_COMPRESSED,
    decode_batch,
    decode_properties_str,
    encode_properties_str,
)
from mqbox.protocol.codes import ResponseCode
from mqbox.protocol.command import RemotingCommand, make_request
from mqbox.protocol.headers import MessageQueue, SendMessageRequestHeader

KEY = "0A0000010001000000020000000A0001"


def keys(count: int) -> list[str]:
    return [f"{index:032X}" for index in range(count)]


@pytest.mark.parametrize(
    "topic",
    ["", "a" * 128, "bad topic", "ü", "TBW102"],
)
def test_bad_topics_are_refused(topic: str) -> None:
    with pytest.raises(InvalidMessageError) as caught:
        check_topic(topic)
    assert caught.value.code == 13
    assert isinstance(caught.value, MessageIllegalError)


def test_good_topics_and_groups_pass() -> None:
    check_topic("a" * 127)
    check_topic("%RETRY%Orders|x_y-z")
    check_group("PG_1")


@pytest.mark.parametrize("group", ["", "g" * 256, "a group", "DEFAULT_PRODUCER"])
def test_bad_groups_are_refused(group: str) -> None:
    with pytest.raises(InvalidMessageError):
        check_group(group)


def test_single_message_properties_and_header_round_trip() -> None:
    message = encode_single(
        "Orders",
        b"body",
        uniq_key=KEY,
        tags="TagA",
        keys=["k1", "k2"],
        properties={"color": "红", "n": "1"},
        delay_level=3,
        flag=7,
    )
    assert (message.body, message.sysflag, message.flag, message.msg_id) == (b"body", 0, 7, KEY)
    properties = decode_properties_str(message.properties.encode("utf-8", "surrogateescape"))
    assert properties == {
        "color": "红",
        "n": "1",
        "TAGS": "TagA",
        "KEYS": "k1 k2",
        "DELAY": "3",
        "WAIT": "true",
        "UNIQ_KEY": KEY,
    }
    assert list(properties)[-2:] == ["WAIT", "UNIQ_KEY"]
    ext = send_request_ext("PG", message, 3, 1_700_000_000_123)
    header = SendMessageRequestHeader.from_ext(ext, request_code(message))
    assert request_code(message) == SEND_SINGLE_CODE
    assert (header.producer_group, header.topic, header.queue_id) == ("PG", "Orders", 3)
    assert (header.default_topic, header.default_topic_queue_nums) == ("TBW102", 4)
    assert (header.sys_flag, header.flag, header.born_timestamp_ms) == (0, 7, 1_700_000_000_123)
    assert header.properties == message.properties
    assert not header.batch


PROPERTY_TEXT = st.text("aZ \x01\x02é✓", max_size=6) | st.text(max_size=6)


@given(
    tags=st.one_of(st.none(), PROPERTY_TEXT),
    keys=st.one_of(PROPERTY_TEXT, st.lists(PROPERTY_TEXT, max_size=3)),
    delay_level=st.integers(0, 20),
)
def test_the_quick_properties_path_writes_what_the_general_one_writes(
    tags: str | None, keys: str | list[str], delay_level: int
) -> None:
    """encode_single writes messages without user properties as text at once; the general
    path (the property dict through message.encode_properties_str) must give the same string,
    or the same refusal."""
    fields: dict[str, str] = {}
    if tags:
        fields["TAGS"] = tags
    key_text = keys if isinstance(keys, str) else " ".join(keys)
    if key_text:
        fields["KEYS"] = key_text
    if delay_level:
        fields["DELAY"] = str(delay_level)
    fields.update({"WAIT": "true", "UNIQ_KEY": KEY})
    try:
        expected = encode_properties_str(fields).decode("utf-8", "surrogateescape")
    except MessageIllegalError:
        with pytest.raises(InvalidMessageError):
            encode_single("T", b"x", uniq_key=KEY, tags=tags, keys=keys, delay_level=delay_level)
        return
    message = encode_single("T", b"x", uniq_key=KEY, tags=tags, keys=keys, delay_level=delay_level)
    assert message.properties == expected


@pytest.mark.parametrize("batch", [False, True])
def test_the_header_filled_into_a_template_is_the_dataclass_header(batch: bool) -> None:
    message = (
        encode_batch("Orders", [b"a", b"b"], keys(2))
        if batch
        else encode_single("Orders", b"x" * 5000, uniq_key=KEY, tags="T", flag=-3)
    )
    for queue_id, born_ms in ((0, 1), (7, 1_700_000_000_123)):
        ext = send_request_ext("PG", message, queue_id, born_ms, default_topic_queue_nums=8)
        expected = SendMessageRequestHeader(
            "PG",
            "Orders",
            "TBW102",
            8,
            queue_id,
            message.sysflag,
            born_ms,
            message.flag,
            message.properties,
            batch=batch,
        ).to_ext_v2()
        assert ext == expected
        assert list(ext) == list(expected)  # the same JSON, key order included


def test_keys_may_be_one_string() -> None:
    message = encode_single("T", b"x", uniq_key=KEY, keys="a b")
    assert decode_properties_str(message.properties.encode())["KEYS"] == "a b"


def test_bodies_from_4_kib_are_zlib_compressed_with_bit_0_only() -> None:
    small = encode_single("T", b"s" * 4095, uniq_key=KEY)
    assert (small.sysflag, small.body) == (0, b"s" * 4095)
    big = encode_single("T", b"b" * 4096, uniq_key=KEY)
    assert big.sysflag == SYSFLAG_COMPRESSED
    assert big.body[:2] == b"\x78\x5e"  # level 5, as the C++ producer's streams start
    assert zlib.decompress(big.body) == b"b" * 4096


def test_size_limits_apply_to_the_plain_body() -> None:
    encode_single("T", b"z" * 64, uniq_key=KEY, body_size_bytes_max=64)
    with pytest.raises(InvalidMessageError, match="over the maximum"):
        encode_single("T", b"z" * 65, uniq_key=KEY, body_size_bytes_max=64)
    with pytest.raises(InvalidMessageError, match="empty"):
        encode_single("T", b"", uniq_key=KEY)


@pytest.mark.parametrize(
    ("properties", "fragment"),
    [
        ({"UNIQ_KEY": "x"}, "client's"),
        ({"TAGS": "x"}, "client's"),
        ({"": "x"}, "empty"),
        ({"x": ""}, "empty"),
        ({"x\x01": "y"}, "separator"),
        ({"x": "y\x02"}, "0x02"),
    ],
)
def test_bad_properties_are_refused(properties: dict[str, str], fragment: str) -> None:
    with pytest.raises(InvalidMessageError, match=fragment):
        encode_single("T", b"x", uniq_key=KEY, properties=properties)


def test_negative_delay_levels_and_wide_flags_are_refused() -> None:
    with pytest.raises(InvalidMessageError, match="negative"):
        encode_single("T", b"x", uniq_key=KEY, delay_level=-1)
    with pytest.raises(InvalidMessageError, match="32-bit"):
        encode_single("T", b"x", uniq_key=KEY, flag=2**31)


elements = st.lists(
    st.one_of(
        st.binary(min_size=1, max_size=300),
        st.builds(
            Message,
            body=st.binary(min_size=1, max_size=300),
            tags=st.one_of(st.none(), st.text("abcXYZ", min_size=1, max_size=5)),
            keys=st.lists(st.text("kq0", min_size=1, max_size=4), max_size=3),
            properties=st.dictionaries(
                st.text("pqr", min_size=1, max_size=3), st.text("vé", min_size=1, max_size=3)
            ),
            flag=st.integers(-(2**31), 2**31 - 1),
        ),
    ),
    min_size=1,
    max_size=20,
)


@given(elements)
def test_a_batch_reads_back_as_its_elements(messages: list[Message | bytes]) -> None:
    uniq_keys = keys(len(messages))
    batch = encode_batch("Orders", messages, uniq_keys)
    assert batch.batch
    assert request_code(batch) == SEND_BATCH_CODE
    assert batch.sysflag == 0  # never compressed
    assert batch.msg_id == ",".join(uniq_keys)
    assert decode_properties_str(batch.properties.encode()) == {"WAIT": "true"}
    decoded = decode_batch(batch.body)
    assert len(decoded) == len(messages)
    for element, message, uniq_key in zip(decoded, messages, uniq_keys, strict=True):
        properties = decode_properties_str(element.properties)
        assert properties.pop("UNIQ_KEY") == uniq_key
        if isinstance(message, bytes):
            assert (element.body, element.flag, properties) == (message, 0, {})
            continue
        expected = dict(message.properties)
        if message.tags:
            expected["TAGS"] = message.tags
        if message.keys:
            expected["KEYS"] = " ".join(message.keys)
        assert (element.body, element.flag, properties) == (message.body, message.flag, expected)
    header = SendMessageRequestHeader.from_ext(send_request_ext("PG", batch, 0, 1), SEND_BATCH_CODE)
    assert header.batch


def test_batch_refusals() -> None:
    with pytest.raises(InvalidMessageError, match="empty"):
        encode_batch("T", [], [])
    with pytest.raises(InvalidMessageError, match="delayed"):
        encode_batch("T", [Message(b"x", delay_level=2)], keys(1))
    with pytest.raises(InvalidMessageError, match="retry topic"):
        encode_batch("%RETRY%G", [b"x"], keys(1))
    with pytest.raises(InvalidMessageError, match="batch body"):
        encode_batch("T", [b"x" * 40, b"y" * 40], keys(2), body_size_bytes_max=100)


def response(code: int, ext: dict[str, str] | None = None) -> RemotingCommand:
    return make_request(7, 1).make_response(code, ext or {})


def test_send_answers_become_results_or_none() -> None:
    message = encode_single("Orders", b"x", uniq_key=KEY)
    ext = {"msgId": "7F0000010000B41D0000000000000000", "queueId": "2", "queueOffset": "41"}
    for status in SendStatus:
        result = read_send_response(response(status.value, dict(ext)), message, "broker-a")
        assert result is not None
        assert result.status is status
        assert (result.msg_id, result.offset_msg_id) == (KEY, ext["msgId"])
        assert result.queue == MessageQueue("Orders", "broker-a", 2)
        assert result.queue_offset == 41
    assert read_send_response(response(ResponseCode.TOPIC_NOT_EXIST), message, "b") is None
    assert read_send_response(response(ResponseCode.SYSTEM_BUSY), message, "b") is None
