"""Goal: mqbox.message writes and reads exactly the RocketMQ formats of docs/protocol.md
sections 4.2, 5, 6 and 7, and refuses anything from outside that breaks them with
MessageIllegalError (or MessageTooLargeError), never another exception.

Method: round trips under hypothesis (records, properties including non-UTF-8 bytes, batches,
compressed batches), the documents' test vectors (tag hashes, msgId, CRC), byte-level checks of
each named field position, Java's UTF-8 decoder checked against Python's where the two must agree
and against its rules stated byte by byte, Java's UTF-8 encoder on its vectors,
and targeted corruptions (truncation, bad magic, lengths, CRC, zlib bombs) that must be refused.
"""

from __future__ import annotations

import contextlib
import struct
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqbox import message as m
from mqbox.errors import MessageIllegalError, MessageTooLargeError

INT32 = st.integers(-(2**31), 2**31 - 1)
INT64 = st.integers(-(2**63), 2**63 - 1)
TOPIC_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789%|_-"
topics = st.text(alphabet=TOPIC_ALPHABET, min_size=1, max_size=m.TOPIC_SIZE_BYTES_MAX)
hosts = st.builds(
    m.pack_host,
    st.tuples(*[st.integers(0, 255)] * 4).map(lambda parts: ".".join(map(str, parts))),
    st.integers(0, 0xFFFF),
)
property_names = st.binary(min_size=1, max_size=12).filter(
    lambda name: b"\x01" not in name and b"\x02" not in name
)
property_values = st.binary(min_size=1, max_size=24).filter(lambda value: b"\x02" not in value)
property_maps = st.dictionaries(property_names, property_values, max_size=6)

messages = st.builds(
    m.MessageToStore,
    topic=topics,
    queue_id=st.integers(0, 2**31 - 1),
    body=st.binary(max_size=200),
    properties=st.binary(max_size=300),
    flag=INT32,
    sysflag=INT32.map(lambda sysflag: sysflag & ~m.SYSFLAG_HOSTS_V6),
    born_timestamp_ms=INT64,
    born_host=hosts,
    reconsume_times=INT32,
    prepared_transaction_log_offset_bytes=INT64,
)


def encode_sample(**overrides: object) -> bytearray:
    fields: dict[str, object] = {
        "topic": "TopicTest",
        "queue_id": 3,
        "body": b"hello-1",
        "properties": b"TAGS\x01TagA\x02",
    }
    fields.update(overrides)
    return m.encode_record(m.MessageToStore(**fields))  # type: ignore[arg-type]


# --- Layout -------------------------------------------------------------------------------------


def test_record_size_is_91_plus_variable_fields() -> None:
    record = encode_sample(body=b"", topic="T", properties=b"")
    assert len(record) == m.RECORD_SIZE_BYTES_MIN + 1
    assert m.record_size_bytes(10, 5, 7) == 91 + 10 + 5 + 7


def test_each_field_sits_at_its_named_position() -> None:
    born_host = m.pack_host("10.1.2.3", 40000)
    store_host = m.pack_host("127.0.0.1", 10911)
    message = m.MessageToStore(
        topic="TopicTest",
        queue_id=7,
        body=b"body!",
        properties=b"TAGS\x01TagA\x02",
        flag=-5,
        sysflag=m.SYSFLAG_COMPRESSED | m.SYSFLAG_TRANSACTION_COMMIT_TYPE,
        born_timestamp_ms=1795243948045,
        born_host=born_host,
        reconsume_times=2,
        prepared_transaction_log_offset_bytes=77,
    )
    record = m.encode_record(
        message,
        queue_index=123,
        log_offset_bytes=4096,
        store_timestamp_ms=1795243948999,
        store_host=store_host,
    )

    def read(fmt: str, position_bytes: int) -> object:
        return struct.unpack_from(fmt, record, position_bytes)[0]

    assert read(">i", m.TOTALSIZE_POSITION_BYTES) == len(record) == 91 + 5 + 9 + 10
    assert read(">I", m.MAGICCODE_POSITION_BYTES) == m.MESSAGE_MAGIC
    assert read(">i", m.BODYCRC_POSITION_BYTES) == zlib.crc32(b"body!") & 0x7FFFFFFF
    assert read(">i", m.QUEUEID_POSITION_BYTES) == 7
    assert read(">i", m.FLAG_POSITION_BYTES) == -5
    assert read(">q", m.QUEUEOFFSET_POSITION_BYTES) == 123
    assert read(">q", m.PHYSICALOFFSET_POSITION_BYTES) == 4096
    assert read(">i", m.SYSFLAG_POSITION_BYTES) == 0x9
    assert read(">q", m.BORNTIMESTAMP_POSITION_BYTES) == 1795243948045
    assert read("8s", m.BORNHOST_POSITION_BYTES) == bytes([10, 1, 2, 3, 0, 0, 0x9C, 0x40])
    assert read(">q", m.STORETIMESTAMP_POSITION_BYTES) == 1795243948999
    assert read("8s", m.STOREHOST_POSITION_BYTES) == bytes.fromhex("7F00000100002A9F")
    assert read(">i", m.RECONSUMETIMES_POSITION_BYTES) == 2
    assert read(">q", m.PREPARED_TRANSACTION_OFFSET_POSITION_BYTES) == 77
    assert read(">i", m.BODY_LENGTH_POSITION_BYTES) == 5
    assert record[m.BODY_POSITION_BYTES : m.BODY_POSITION_BYTES + 5] == b"body!"
    assert record[93] == 9
    assert record[94:103] == b"TopicTest"
    assert read(">h", 103) == 10
    assert record[105:] == b"TAGS\x01TagA\x02"


def test_crc_vector_from_the_document() -> None:
    assert m.body_crc(b"hello-1") == 1648445226


# --- Records ------------------------------------------------------------------------------------


@settings(deadline=None)
@given(
    message=messages,
    queue_index=st.integers(0, 2**63 - 1),
    log_offset_bytes=st.integers(0, 2**63 - 1),
    store_timestamp_ms=INT64,
    store_host=hosts,
    prefix=st.binary(max_size=16),
)
def test_record_round_trips(
    message: m.MessageToStore,
    queue_index: int,
    log_offset_bytes: int,
    store_timestamp_ms: int,
    store_host: bytes,
    prefix: bytes,
) -> None:
    record = m.encode_record(
        message,
        queue_index=queue_index,
        log_offset_bytes=log_offset_bytes,
        store_timestamp_ms=store_timestamp_ms,
        store_host=store_host,
    )
    decoded = m.decode_record(prefix + bytes(record) + b"\x00\x07", len(prefix))
    assert decoded.size_bytes == len(record)
    assert decoded.body_crc == m.body_crc(message.body)
    assert decoded.topic == message.topic
    assert decoded.queue_id == message.queue_id
    assert decoded.body == message.body
    assert decoded.properties == m.terminate_properties(message.properties)
    assert m.decode_properties(decoded.properties) == m.decode_properties(message.properties)
    assert decoded.flag == message.flag
    assert decoded.sysflag == message.sysflag
    assert decoded.born_timestamp_ms == message.born_timestamp_ms
    assert decoded.born_host == message.born_host
    assert decoded.reconsume_times == message.reconsume_times
    assert (
        decoded.prepared_transaction_log_offset_bytes
        == message.prepared_transaction_log_offset_bytes
    )
    assert decoded.queue_index == queue_index
    assert decoded.log_offset_bytes == log_offset_bytes
    assert decoded.store_timestamp_ms == store_timestamp_ms
    assert decoded.store_host == store_host


@settings(deadline=None)
@given(
    message=messages,
    queue_index=st.integers(0, 2**63 - 1),
    log_offset_bytes=st.integers(0, 2**63 - 1),
    store_timestamp_ms=INT64,
    store_host=hosts,
)
def test_patch_helpers_write_what_encode_would(
    message: m.MessageToStore,
    queue_index: int,
    log_offset_bytes: int,
    store_timestamp_ms: int,
    store_host: bytes,
) -> None:
    expected = m.encode_record(
        message,
        queue_index=queue_index,
        log_offset_bytes=log_offset_bytes,
        store_timestamp_ms=store_timestamp_ms,
        store_host=store_host,
    )
    buffer = bytearray(b"\xee" * 5) + m.encode_record(message) + bytearray(b"\xee" * 3)
    m.patch_queue_index(buffer, 5, queue_index)
    m.patch_log_offset(buffer, 5, log_offset_bytes)
    m.patch_store_timestamp(buffer, 5, store_timestamp_ms)
    m.patch_store_host(memoryview(buffer), 5, store_host)
    assert buffer == b"\xee" * 5 + expected + b"\xee" * 3


def test_patch_refuses_a_position_that_is_not_a_record() -> None:
    buffer = bytearray(1) + encode_sample()
    with pytest.raises(AssertionError):
        m.patch_log_offset(buffer, 0, 0)


def test_decode_refuses_every_truncation() -> None:
    record = bytes(encode_sample())
    for size_bytes in range(len(record)):
        with pytest.raises(MessageIllegalError):
            m.decode_record(record[:size_bytes])


@pytest.mark.parametrize(
    ("position_bytes", "replacement", "reason"),
    [
        (m.MAGICCODE_POSITION_BYTES, struct.pack(">I", m.BLANK_MAGIC), "magic"),
        (m.MAGICCODE_POSITION_BYTES, b"\x00\x00\x00\x00", "magic"),
        (m.TOTALSIZE_POSITION_BYTES, struct.pack(">i", 90), "under"),
        (m.TOTALSIZE_POSITION_BYTES, struct.pack(">i", -1), "under"),
        (m.SYSFLAG_POSITION_BYTES, struct.pack(">i", m.SYSFLAG_BORNHOST_V6), "IPv6"),
        (m.SYSFLAG_POSITION_BYTES, struct.pack(">i", m.SYSFLAG_STOREHOST_V6), "IPv6"),
        (m.BODY_LENGTH_POSITION_BYTES, struct.pack(">i", -1), "body length"),
        (m.BODY_LENGTH_POSITION_BYTES, struct.pack(">i", 1000), "body length"),
        (m.BODY_LENGTH_POSITION_BYTES, struct.pack(">i", 6), "TOTALSIZE"),
        (m.BODY_POSITION_BYTES, b"X", "BODYCRC"),
        (m.BODY_POSITION_BYTES + 7, b"\x80", "topic length"),
        (m.BODY_POSITION_BYTES + 7, b"\x0a", "TOTALSIZE"),
        (m.BODY_POSITION_BYTES + 7, b"\x7f", "topic runs past"),
        (m.BODY_POSITION_BYTES + 17, b"\xff\xff", "TOTALSIZE"),
        (m.BODY_POSITION_BYTES + 17, b"\x00\x09", "TOTALSIZE"),
    ],
)
def test_decode_refuses_an_inconsistent_record(
    position_bytes: int, replacement: bytes, reason: str
) -> None:
    record = encode_sample()
    assert record[m.BODY_POSITION_BYTES + 7] == len("TopicTest")
    record[position_bytes : position_bytes + len(replacement)] = replacement
    with pytest.raises(MessageIllegalError, match=reason):
        m.decode_record(record)


def test_decode_without_crc_check_accepts_a_changed_body() -> None:
    record = encode_sample()
    record[m.BODY_POSITION_BYTES] ^= 0xFF
    assert m.decode_record(record, check_crc=False).body[1:] == b"ello-1"


def test_decode_refuses_a_size_past_the_buffer() -> None:
    record = encode_sample()
    struct.pack_into(">i", record, 0, len(record) + 1)
    with pytest.raises(MessageIllegalError, match="past the buffer"):
        m.decode_record(record)


@settings(deadline=None)
@given(record=st.binary(max_size=300), flips=st.lists(st.tuples(st.integers(0), st.binary())))
def test_decode_raises_only_message_illegal_on_any_bytes(
    record: bytes, flips: list[tuple[int, bytes]]
) -> None:
    valid = bytearray(encode_sample(body=record[:50]))
    for position_bytes, replacement in flips:
        at = position_bytes % len(valid)
        valid[at : at + len(replacement)] = replacement
    for candidate in (record, bytes(valid)):
        with contextlib.suppress(MessageIllegalError):
            m.decode_record(candidate)


@pytest.mark.parametrize(
    ("overrides", "error", "reason"),
    [
        ({"topic": ""}, MessageIllegalError, "empty"),
        ({"topic": "T" * 128}, MessageIllegalError, "over 127"),
        ({"topic": "\ud800"}, MessageIllegalError, "Unicode"),
        ({"properties": b"x" * 32768}, MessageIllegalError, "over 32767"),
        ({"body": b"x" * (m.BODY_SIZE_BYTES_MAX_DEFAULT + 1)}, MessageTooLargeError, "body"),
        ({"sysflag": m.SYSFLAG_BORNHOST_V6}, MessageIllegalError, "IPv6"),
        ({"sysflag": m.SYSFLAG_STOREHOST_V6}, MessageIllegalError, "IPv6"),
        ({"flag": 2**31}, MessageIllegalError, "out of range"),
        ({"queue_id": -(2**31) - 1}, MessageIllegalError, "out of range"),
        ({"reconsume_times": 2**31}, MessageIllegalError, "out of range"),
    ],
)
def test_encode_refuses_what_breaks_a_limit(
    overrides: dict[str, object], error: type[Exception], reason: str
) -> None:
    with pytest.raises(error, match=reason):
        encode_sample(**overrides)


def test_encode_accepts_the_limits_themselves() -> None:
    record = encode_sample(topic="T" * 127, properties=b"x" * 32766 + b"\x02", body=b"b" * 10)
    decoded = m.decode_record(record)
    assert decoded.topic == "T" * 127
    assert len(decoded.properties) == 32767
    with pytest.raises(MessageTooLargeError):
        m.encode_record(m.MessageToStore("T", 0, b"b" * 11), body_size_bytes_max=10)


def test_stored_properties_always_end_with_their_separator() -> None:
    """Recovery trusts that a whole record's last byte is not zero (store/recovery.py)."""
    for properties, stored in (
        (b"", b""),
        (b"a\x01b", b"a\x01b\x02"),
        (b"a\x01b\x02", b"a\x01b\x02"),
        (b"a\x01\x00", b"a\x01\x00\x02"),
    ):
        assert m.terminate_properties(properties) == stored
        assert m.decode_record(encode_sample(properties=properties)).properties == stored
    with pytest.raises(MessageIllegalError, match="32768 bytes"):
        encode_sample(properties=b"x" * 32767)


def test_blank_is_eight_bytes_of_size_and_magic() -> None:
    blank = m.encode_blank(4000)
    assert blank == struct.pack(">iI", 4000, 0xCBD43194)
    assert m.is_blank(b"\x00" + blank, 1)
    assert not m.is_blank(blank[:7], 0)
    assert not m.is_blank(encode_sample(), 0)
    with pytest.raises(MessageIllegalError, match="magic"):
        m.decode_record(blank + bytes(100))


# --- Hosts --------------------------------------------------------------------------------------


def test_hosts_pack_as_ipv4_and_port() -> None:
    assert m.pack_host("127.0.0.1", 10911) == bytes.fromhex("7F00000100002A9F")
    assert m.pack_host("::ffff:10.0.0.1", 80) == bytes([10, 0, 0, 1, 0, 0, 0, 80])
    assert m.unpack_host(m.pack_host("192.168.7.9", 65535)) == ("192.168.7.9", 65535)


@pytest.mark.parametrize("ip", ["::1", "fe80::1", "localhost", "1.2.3", ""])
def test_hosts_other_than_ipv4_are_refused(ip: str) -> None:
    with pytest.raises(MessageIllegalError):
        m.pack_host(ip, 1)


# --- Properties ---------------------------------------------------------------------------------


@settings(deadline=None)
@given(properties=property_maps)
def test_properties_round_trip(properties: dict[bytes, bytes]) -> None:
    encoded = m.encode_properties(properties)
    assert encoded.endswith(b"\x02") or not properties
    assert m.decode_properties(encoded) == properties
    assert m.decode_properties(encoded[:-1]) == properties  # Java 4.9 leaves the final 0x02 off


@settings(deadline=None)
@given(encoded=st.binary(max_size=200))
def test_properties_parse_any_bytes_and_reencode_stably(encoded: bytes) -> None:
    decoded = m.decode_properties(encoded)
    for name, value in decoded.items():
        assert name
        assert value
        assert b"\x01" not in name
        assert b"\x02" not in name + value
    assert m.decode_properties(m.encode_properties(decoded)) == decoded


@settings(deadline=None)
@given(
    properties=st.dictionaries(
        st.text(min_size=1, max_size=8).filter(lambda name: not set(name) & {"\x01", "\x02"}),
        st.binary(min_size=1, max_size=16)
        .filter(lambda value: b"\x02" not in value)
        .map(lambda value: value.decode("utf-8", "surrogateescape")),
        max_size=5,
    )
)
def test_properties_str_round_trip_keeps_non_utf8_bytes(properties: dict[str, str]) -> None:
    encoded = m.encode_properties_str(properties)
    assert m.decode_properties_str(encoded) == properties
    assert m.encode_properties_str(m.decode_properties_str(encoded)) == encoded


def test_properties_parse_rules() -> None:
    encoded = (
        b"KEYS\x01k1 k2\x02\x02=novalue\x02\x01noname\x02EMPTY\x01\x02TAGS\x01A\x01B\x02TAGS\x01C"
    )
    assert m.decode_properties(encoded) == {b"KEYS": b"k1 k2", b"TAGS": b"C"}
    assert m.decode_properties(b"TAGS\x01A\x01B") == {b"TAGS": b"A\x01B"}
    assert m.decode_properties(b"") == {}
    assert m.decode_properties_str(b"TAGS\x01\xe4\xb8\xad\xff\x02") == {"TAGS": "中\udcff"}


def test_properties_encode_in_order_and_drop_empty_entries() -> None:
    encoded = m.encode_properties_str({"WAIT": "true", "TAGS": "TagA", "EMPTY": "", "": "x"})
    assert encoded == b"WAIT\x01true\x02TAGS\x01TagA\x02"


@pytest.mark.parametrize(
    "properties",
    [{b"A\x01B": b"v"}, {b"A\x02": b"v"}, {b"A": b"v\x02"}, {b"K": b"v" * 32766}],
)
def test_properties_encode_refuses_what_a_parser_would_misread(
    properties: dict[bytes, bytes],
) -> None:
    with pytest.raises(MessageIllegalError):
        m.encode_properties(properties)


def test_properties_bounds() -> None:
    with pytest.raises(MessageIllegalError, match="over 32767"):
        m.decode_properties(b"A\x01" + b"v" * 32766)
    with pytest.raises(MessageIllegalError, match="UTF-8"):
        m.encode_properties_str({"TAGS": "\ud800"})


# --- Java hashes --------------------------------------------------------------------------------

JAVA_HASH_VECTORS = [
    ("TagA", 2598919),
    ("TagB", 2598920),
    ("XXX", 87384),
    ("test", 3556498),
    ("hello world", 1794106052),
    ("中文", 646394),
    ("😀", 1772899),
    ("", 0),
    ("polygenelubricants", -(2**31)),
]


@pytest.mark.parametrize(("text", "expected"), JAVA_HASH_VECTORS)
def test_java_string_hash_vectors(text: str, expected: int) -> None:
    assert m.java_string_hash(text) == expected
    assert m.tag_hash(text.encode("utf-8")) == expected
    assert m.tag_hash(text) == expected


def test_tag_hash_is_zero_without_tags() -> None:
    assert m.tag_hash(None) == 0
    assert m.tag_hash("") == 0
    assert m.tag_hash(b"") == 0


def test_index_key_hash_is_abs_of_topic_hash_key() -> None:
    assert m.index_key_hash("TopicTest", "k1") == abs(m.java_string_hash("TopicTest#k1"))
    assert m.java_string_hash("TopicTest#k3134480zv") == -(2**31)
    assert m.index_key_hash("TopicTest", "k3134480zv") == 0


@settings(deadline=None)
@given(data=st.binary(max_size=40))
def test_java_utf8_decode_equals_python_replace_away_from_encoded_surrogates(data: bytes) -> None:
    """Java and Python both replace maximal subparts, except for ED A0..BF (see the docstring)."""
    data = data.replace(b"\xed", b"\xee")
    assert m.java_utf8_decode(data) == data.decode("utf-8", "replace")


@settings(deadline=None)
@given(text=st.text(max_size=30))
def test_java_utf8_decode_reads_valid_utf8(text: str) -> None:
    encoded = text.encode("utf-8", "surrogatepass")
    if any(0xD800 <= ord(char) <= 0xDFFF for char in text):
        assert "\ufffd" in m.java_utf8_decode(encoded)
    else:
        assert m.java_utf8_decode(encoded) == text


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"\xed\xa0\x80", "\ufffd"),  # an encoded surrogate is one U+FFFD in Java, three in Python
        (b"\xed\xbf\xbfA", "\ufffdA"),
        (b"\xed\xa0A", "\ufffdA"),
        (b"\xed\xa0", "\ufffd"),
        (b"\xed\x9f\xbf", "\ud7ff"),
        (b"\xf0\x9f\x98\x80", "😀"),
        (b"\xf0\x9f\x98", "\ufffd"),
        (b"\xf0\x9f\x98A", "\ufffdA"),
        (b"\xf4\x90\x80\x80", "\ufffd" * 4),
        (b"\xc0\x80", "\ufffd\ufffd"),
    ],
)
def test_java_utf8_decode_vectors(data: bytes, expected: str) -> None:
    assert m.java_utf8_decode(data) == expected
    assert java_utf8_decode_by_byte(data) == expected


REPLACEMENT = "\ufffd"


def _is_continuation(byte: int) -> bool:
    return byte & 0xC0 == 0x80


def _malformed4_length(data: bytes, at: int) -> int:
    """How many bytes Java's decoder replaces for a bad 4-byte sequence with 3 bytes after it."""
    lead = data[at]
    second = data[at + 1]
    if (
        lead > 0xF4
        or (lead == 0xF0 and not 0x90 <= second <= 0xBF)
        or (lead == 0xF4 and second & 0xF0 != 0x80)
        or not _is_continuation(second)
    ):
        return 1
    if not _is_continuation(data[at + 2]):
        return 2
    return 3


def java_utf8_decode_by_byte(encoded: bytes | bytearray | memoryview) -> str:
    """Java's `new String(bytes, UTF_8)`, byte by byte: the rules of message.java_utf8_decode
    stated again without Python's decoder, to check that one against.

    Valid UTF-8 decodes as usual. Each malformed sequence becomes one U+FFFD, and Java (JDK 8 to
    21, sun.nio.cs.UTF_8) chooses its length thus: a bad lead byte, a C0/C1 lead or an overlong
    E0/F0 start is 1 byte; a valid prefix cut by a bad byte is the prefix; an encoded surrogate
    (ED A0..BF xx) or a code point past U+10FFFF as a whole complete sequence is one U+FFFD;
    an incomplete sequence at the end is one U+FFFD. This equals Python's errors="replace" except
    for sequences starting ED A0..ED BF, which Python replaces byte by byte.
    """
    data = bytes(encoded)
    size = len(data)
    characters: list[str] = []
    at = 0
    while at < size:
        lead = data[at]
        if lead < 0x80:
            characters.append(chr(lead))
            at += 1
        elif 0xC2 <= lead <= 0xDF:
            if at + 1 < size and _is_continuation(data[at + 1]):
                characters.append(chr((lead & 0x1F) << 6 | data[at + 1] & 0x3F))
                at += 2
            else:
                characters.append(REPLACEMENT)
                at += 1
        elif 0xE0 <= lead <= 0xEF:
            if at + 2 < size:
                second = data[at + 1]
                third = data[at + 2]
                bad_second = (lead == 0xE0 and second & 0xE0 == 0x80) or not _is_continuation(
                    second
                )
                if bad_second:
                    characters.append(REPLACEMENT)
                    at += 1
                elif not _is_continuation(third):
                    characters.append(REPLACEMENT)
                    at += 2
                else:
                    code_point = (lead & 0x0F) << 12 | (second & 0x3F) << 6 | third & 0x3F
                    is_surrogate = 0xD800 <= code_point <= 0xDFFF
                    characters.append(REPLACEMENT if is_surrogate else chr(code_point))
                    at += 3
            else:
                characters.append(REPLACEMENT)
                if at + 1 < size:
                    second = data[at + 1]
                    bad_second = (lead == 0xE0 and second & 0xE0 == 0x80) or not (
                        _is_continuation(second)
                    )
                    at = at + 1 if bad_second else size
                else:
                    at = size
        elif 0xF0 <= lead <= 0xF7:
            if at + 3 < size:
                second, third, fourth = data[at + 1], data[at + 2], data[at + 3]
                code_point = (
                    (lead & 0x07) << 18
                    | (second & 0x3F) << 12
                    | (third & 0x3F) << 6
                    | fourth & 0x3F
                )
                well_formed = (
                    _is_continuation(second)
                    and _is_continuation(third)
                    and _is_continuation(fourth)
                    and 0x10000 <= code_point <= 0x10FFFF
                )
                if well_formed:
                    characters.append(chr(code_point))
                    at += 4
                else:
                    characters.append(REPLACEMENT)
                    at += _malformed4_length(data, at)
            else:
                characters.append(REPLACEMENT)
                bad_second = at + 1 < size and (
                    (lead == 0xF0 and not 0x90 <= data[at + 1] <= 0xBF)
                    or (lead == 0xF4 and data[at + 1] & 0xF0 != 0x80)
                    or not _is_continuation(data[at + 1])
                )
                if lead > 0xF4 or bad_second:
                    at += 1
                elif at + 2 < size and not _is_continuation(data[at + 2]):
                    at += 2
                else:
                    at = size
        else:
            characters.append(REPLACEMENT)
            at += 1
    return "".join(characters)


# Bytes around the sequences where Java and Python part ways: encoded surrogates, 4-byte leads.
_UTF8_EDGES = st.lists(
    st.sampled_from([b"\xed", b"\xa0", b"\xbf", b"\x80", b"\xf0", b"\xf4", b"\x90", b"A"])
    | st.binary(max_size=3),
    max_size=12,
).map(b"".join)


@settings(deadline=None, max_examples=500)
@given(data=_UTF8_EDGES | st.binary(max_size=40))
def test_java_utf8_decode_equals_the_byte_by_byte_rules(data: bytes) -> None:
    assert m.java_utf8_decode(data) == java_utf8_decode_by_byte(data)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("plain", b"plain"),
        ("a\ud800b", b"a?b"),  # a lone surrogate: '?', as Java's getBytes(UTF_8) writes it
        ("\udcff", b"?"),
        ("\ud83d\ude00", "\U0001f600".encode()),  # a pair as two code points: one character
        ("\ude00\ud83d", b"??"),  # the wrong order is no pair
        ("x\ud83d", b"x?"),  # a high surrogate at the end
        ("中\ufffd", "中\ufffd".encode()),
    ],
)
def test_java_utf8_encode_vectors(text: str, expected: bytes) -> None:
    assert m.java_utf8_encode(text) == expected


@settings(deadline=None)
@given(text=st.text(st.characters(codec="utf-16", exclude_categories=()), max_size=30))
def test_java_utf8_encode_is_valid_utf8_that_reads_back_where_text_was_valid(text: str) -> None:
    encoded = m.java_utf8_encode(text)
    decoded = encoded.decode("utf-8")  # always valid UTF-8
    if not any(0xD800 <= ord(char) <= 0xDFFF for char in text):
        assert decoded == text
        assert m.java_utf8_decode(encoded) == text


# --- Message ids --------------------------------------------------------------------------------


def test_offset_msg_id_example_from_the_document() -> None:
    store_host = m.pack_host("127.0.0.1", 10911)
    msg_id = m.encode_offset_msg_id(store_host, 0)
    assert msg_id == "7F00000100002A9F0000000000000000"
    assert m.decode_offset_msg_id(msg_id) == (store_host, 0)


@settings(deadline=None)
@given(store_host=hosts, log_offset_bytes=st.integers(0, 2**63 - 1))
def test_offset_msg_id_round_trips(store_host: bytes, log_offset_bytes: int) -> None:
    msg_id = m.encode_offset_msg_id(store_host, log_offset_bytes)
    assert len(msg_id) == 32
    assert msg_id == msg_id.upper()
    assert m.decode_offset_msg_id(msg_id) == (store_host, log_offset_bytes)
    assert m.decode_offset_msg_id(msg_id.lower()) == (store_host, log_offset_bytes)


@pytest.mark.parametrize(
    "msg_id",
    [
        "",
        "7F00000100002A9F000000000000000",
        "7F00000100002A9F00000000000000000",
        "7F00000100002A9F000000000000000G",
        "7F00000100002A9F 000000000000000",
        "7F00000100002A9F8000000000000000",
    ],
)
def test_offset_msg_id_decode_refuses_malformed_ids(msg_id: str) -> None:
    with pytest.raises(MessageIllegalError):
        m.decode_offset_msg_id(msg_id)


def test_uniq_key_layout_and_counter() -> None:
    generator = m.UniqKeyGenerator(bytes([127, 0, 0, 1]), pid=0x12345, salt=0xDEADBEEF)
    month_start_ms = 1_793_491_200_000  # 2026-11-01T00:00:00Z
    first = generator.next_key(month_start_ms + 1234)
    second = generator.next_key(month_start_ms + 1234)
    assert len(first) == 32
    assert first == first.upper()
    assert first == "7F0000012345DEADBEEF000004D20000"
    assert second == "7F0000012345DEADBEEF000004D20001"


def test_uniq_key_time_restarts_each_month_and_counter_wraps() -> None:
    generator = m.UniqKeyGenerator(bytes(4), pid=1, salt=2)
    december_ms = 1_796_083_200_000  # 2026-12-01T00:00:00Z
    keys = [generator.next_key(december_ms - 1) for _ in range(0x10001)]
    assert keys[0][-4:] == "0000"
    assert keys[0xFFFF][-4:] == "FFFF"
    assert keys[0x10000][-4:] == "0000"
    elapsed_ms = int(keys[0][20:28], 16)
    assert elapsed_ms == (30 * 86_400_000 - 1) & 0xFFFFFFFF
    after = generator.next_key(december_ms + 5)
    assert int(after[20:28], 16) == 5


@given(
    counter=st.integers(0, 0xFFFF),
    counts=st.lists(st.integers(0, 300), max_size=5),
    now_ms=st.integers(1_700_000_000_000, 1_900_000_000_000),
)
def test_uniq_keys_in_bulk_equal_one_by_one(counter: int, counts: list[int], now_ms: int) -> None:
    bulk = m.UniqKeyGenerator(bytes([10, 0, 0, 7]), pid=77, salt=5)
    single = m.UniqKeyGenerator(bytes([10, 0, 0, 7]), pid=77, salt=5)
    bulk.next_keys(now_ms, counter)
    for _ in range(counter):
        single.next_key(now_ms)
    for count in counts:
        assert bulk.next_keys(now_ms, count) == [single.next_key(now_ms) for _ in range(count)]
    assert bulk.next_key(now_ms + 1) == single.next_key(now_ms + 1)


# --- Compression --------------------------------------------------------------------------------


@settings(deadline=None)
@given(body=st.binary(max_size=5000), sysflag=INT32.map(lambda flag: flag & ~0x701))
def test_body_compression_round_trips_and_flips_the_bit(body: bytes, sysflag: int) -> None:
    compressed, compressed_sysflag = m.compress_body(body, sysflag)
    assert compressed_sysflag == sysflag | m.SYSFLAG_COMPRESSED
    assert compressed[:2] == b"\x78\x5e"  # level 5, as the C++ producer writes
    plain, plain_sysflag = m.decompress_body(
        compressed, compressed_sysflag, size_bytes_max=len(body)
    )
    assert (plain, plain_sysflag) == (body, sysflag)
    assert m.decompress_body(body, sysflag, size_bytes_max=len(body)) == (body, sysflag)


def test_inflate_is_bounded_while_it_runs() -> None:
    bomb = zlib.compress(bytes(64 * 1024 * 1024), 9)
    assert len(bomb) < 100_000
    with pytest.raises(MessageTooLargeError):
        m.inflate(bomb, 1024 * 1024)
    assert m.inflate(zlib.compress(b"x" * 1000), 1000) == b"x" * 1000
    with pytest.raises(MessageTooLargeError):
        m.inflate(zlib.compress(b"x" * 1001), 1000)


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"not zlib at all", "not a zlib stream"),
        (zlib.compress(b"hello" * 100)[:-5], "truncated"),
        (zlib.compress(b"hello") + b"tail", "follow"),
        (b"", "truncated"),
    ],
)
def test_inflate_refuses_a_broken_stream(data: bytes, reason: str) -> None:
    with pytest.raises(MessageIllegalError, match=reason):
        m.inflate(data, 1 << 20)


def test_decompress_refuses_other_compression_types() -> None:
    lz4_sysflag = m.SYSFLAG_COMPRESSED | m.COMPRESSION_TYPE_LZ4 << m.SYSFLAG_COMPRESSION_TYPE_SHIFT
    with pytest.raises(MessageIllegalError, match="compression type 1"):
        m.decompress_body(zlib.compress(b"x"), lz4_sysflag, size_bytes_max=10)
    zlib_sysflag = (
        m.SYSFLAG_COMPRESSED | m.COMPRESSION_TYPE_ZLIB << m.SYSFLAG_COMPRESSION_TYPE_SHIFT
    )
    assert m.decompress_body(zlib.compress(b"x"), zlib_sysflag, size_bytes_max=10) == (b"x", 0)


# --- Batches ------------------------------------------------------------------------------------

batch_elements = st.builds(
    m.BatchElement,
    body=st.binary(max_size=100),
    flag=INT32,
    properties=property_maps.map(m.encode_properties),
)


@settings(deadline=None)
@given(elements=st.lists(batch_elements, min_size=1, max_size=8))
def test_batch_round_trips(elements: list[m.BatchElement]) -> None:
    body = m.encode_batch(elements)
    assert m.decode_batch(body) == elements
    assert m.decode_batch_request(body, 0, batch_size_bytes_max=len(body)) == (elements, 0)


def test_batch_element_layout() -> None:
    body = m.encode_batch([m.BatchElement(b"abc", 7, b"TAGS\x01A\x02")])
    assert body == (
        struct.pack(">iIiii", 20 + 3 + 2 + 7, 0, 0, 7, 3) + b"abc" + b"\x00\x07" + b"TAGS\x01A\x02"
    )


@settings(deadline=None)
@given(elements=st.lists(batch_elements, min_size=1, max_size=8), sysflag=st.sampled_from([0, 8]))
def test_compressed_cpp_batch_is_inflated_then_split(
    elements: list[m.BatchElement], sysflag: int
) -> None:
    plain = m.encode_batch(elements)
    compressed, compressed_sysflag = m.compress_body(plain, sysflag)
    decoded, element_sysflag = m.decode_batch_request(
        compressed, compressed_sysflag, batch_size_bytes_max=len(plain)
    )
    assert decoded == elements
    assert element_sysflag == sysflag
    with pytest.raises(MessageTooLargeError):
        m.decode_batch_request(compressed, compressed_sysflag, batch_size_bytes_max=len(plain) - 1)


def test_batch_request_bounds_a_plain_body() -> None:
    body = m.encode_batch([m.BatchElement(b"x" * 10)])
    with pytest.raises(MessageTooLargeError):
        m.decode_batch_request(body, 0, batch_size_bytes_max=len(body) - 1)


def _element(body: bytes = b"abc", properties: bytes = b"") -> bytes:
    return m.encode_batch([m.BatchElement(body, 0, properties)])


@pytest.mark.parametrize(
    ("body", "error", "reason"),
    [
        (b"", MessageIllegalError, "empty"),
        (_element()[:-1], MessageIllegalError, "truncated"),
        (_element()[:21], MessageIllegalError, "truncated"),
        (struct.pack(">i", 21) + _element()[4:], MessageIllegalError, "too small"),
        (struct.pack(">i", 26) + _element()[4:] + b"\x00", MessageIllegalError, "match"),
        (_element()[:16] + struct.pack(">i", -1) + _element()[20:], MessageIllegalError, "fit"),
        (_element()[:16] + struct.pack(">i", 4) + _element()[20:], MessageIllegalError, "fit"),
        (_element(properties=b"p")[:-3] + b"\xff\xffp", MessageIllegalError, "match"),
        (_element(body=b"b" * 11), MessageTooLargeError, "over 10"),
        (_element() * 5, MessageIllegalError, "more than 4"),
    ],
)
def test_malformed_batches_are_refused(body: bytes, error: type[Exception], reason: str) -> None:
    with pytest.raises(error, match=reason):
        m.decode_batch(body, body_size_bytes_max=10, element_count_max=4)
