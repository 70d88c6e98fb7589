"""RemotingCommand and its two header encodings.

Goal: decoded extFields are strings whatever JSON type the client used; encoded JSON headers follow
the rules the C++ client depends on (section 2.3); text is read and written as Java does (bytes
that are not UTF-8 become U+FFFD, a lone surrogate is written as '?'); the ROCKETMQ binary header
of section 2.4 round-trips and refuses bad lengths; misuse by mqbox is a LocalProtocolError.
Method: hand-built headers with known bytes, exact expected output, and hypothesis round trips of
the binary header.
"""

from __future__ import annotations

import struct

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqbox.protocol import (
    FLAG_RESPONSE,
    LanguageCode,
    LocalProtocolError,
    RemoteProtocolError,
    RemotingCommand,
    RequestCode,
    ResponseCode,
    SerializeType,
    decode_command,
    dumps_json,
    encode_command,
    encode_header,
    loads_json,
    make_request,
)


def decode_json(header: bytes, body: bytes = b"") -> RemotingCommand:
    return decode_command(SerializeType.JSON, header, body)


def test_ext_numbers_and_strings_both_read_as_strings() -> None:
    command = decode_json(
        b'{"code":10,"opaque":1,"flag":0,"extFields":'
        b'{"queueId":3,"bornTimestamp":"1795243948045","big":9007199254740993,"neg":-5,"s":"x"}}'
    )
    assert command.ext_fields == {
        "queueId": "3",
        "bornTimestamp": "1795243948045",
        "big": "9007199254740993",
        "neg": "-5",
        "s": "x",
    }


def test_ext_booleans_null_floats_and_nesting_read_as_java_would() -> None:
    command = decode_json(
        b'{"code":10,"opaque":1,"flag":0,"extFields":'
        b'{"t":true,"f":false,"gone":null,"x":1.5,"nested":{"a":[1,"b"]}}}'
    )
    assert command.ext_fields == {
        "t": "true",
        "f": "false",
        "x": "1.5",
        "nested": '{"a":[1,"b"]}',
    }


def test_ext_json_view_keeps_the_values_until_ext_fields_is_read() -> None:
    command = decode_json(b'{"code":10,"opaque":1,"flag":0,"extFields":{"queueId":3}}')
    assert command.ext_fields_json == {"queueId": 3}
    assert command.ext_fields == {"queueId": "3"}
    assert command.ext_fields_json == {"queueId": "3"}


def test_missing_or_null_ext_fields_read_as_empty() -> None:
    assert decode_json(b'{"code":10,"opaque":1,"flag":0}').ext_fields == {}
    assert decode_json(b'{"code":10,"opaque":1,"flag":0,"extFields":null}').ext_fields == {}


def test_unknown_language_and_missing_version_are_tolerated() -> None:
    command = decode_json(b'{"code":10,"opaque":1,"flag":0,"language":"COBOL"}')
    assert command.language is LanguageCode.OTHER
    assert command.version == 0
    assert command.remark is None


def test_response_header_has_numbers_string_values_and_ext_fields_always() -> None:
    request = make_request(RequestCode.GET_MAX_OFFSET, 77)
    response = request.make_response(ResponseCode.TOPIC_NOT_EXIST, remark="no such topic")
    header = encode_header(response)
    assert header == (
        b'{"code":17,"extFields":{},"flag":1,"language":"PYTHON","opaque":77,'
        b'"remark":"no such topic","version":317}'
    )
    fields = orjson.loads(header)
    assert type(fields["code"]) is int
    assert type(fields["opaque"]) is int
    assert type(fields["flag"]) is int


def test_response_answers_in_the_request_serialize_type_with_opaque_echoed() -> None:
    for serialize_type in SerializeType:
        request = make_request(RequestCode.HEART_BEAT, 9, serialize_type=serialize_type)
        response = request.make_response(ResponseCode.SUCCESS, {"k": "v"}, body=b"b")
        assert response.opaque == 9
        assert response.flag == FLAG_RESPONSE
        assert response.is_response
        assert response.serialize_type is serialize_type
        assert response.ext_fields == {"k": "v"}
        assert response.body == b"b"


def test_answering_a_response_is_our_bug() -> None:
    response = make_request(RequestCode.HEART_BEAT, 9).make_response(ResponseCode.SUCCESS)
    with pytest.raises(AssertionError):
        response.make_response(ResponseCode.SUCCESS)


@pytest.mark.parametrize("value", [5, None, b"bytes", 1.5, True])
def test_non_string_ext_value_is_a_local_protocol_error(value: object) -> None:
    command = make_request(RequestCode.SEND_MESSAGE, 1)
    command.ext_fields = {"queueOffset": value}  # type: ignore[dict-item]
    for serialize_type in SerializeType:
        command.serialize_type = serialize_type
        with pytest.raises(LocalProtocolError, match="queueOffset"):
            encode_command(command)


def test_non_string_ext_key_is_a_local_protocol_error() -> None:
    command = make_request(RequestCode.SEND_MESSAGE, 1)
    command.ext_fields = {1: "x"}  # type: ignore[dict-item]
    for serialize_type in SerializeType:
        command.serialize_type = serialize_type
        with pytest.raises(LocalProtocolError):
            encode_command(command)


def test_out_of_range_numbers_are_local_protocol_errors() -> None:
    with pytest.raises(LocalProtocolError, match="int32"):
        encode_command(RemotingCommand(2**31))
    with pytest.raises(LocalProtocolError, match="int16"):
        encode_command(RemotingCommand(40_000, serialize_type=SerializeType.ROCKETMQ))


def test_invalid_utf8_property_bytes_decode_as_java_decodes_them() -> None:
    properties = b"TAGS\x01\xe4\xb8\xad\xff\xfeA\xc3\x02KEYS\x01k\x80\x02"
    header = (
        b'{"code":10,"extFields":{"properties":"'
        + properties.replace(b"\x01", b"\\u0001").replace(b"\x02", b"\\u0002")
        + b'","topic":"t"},"flag":0,"language":"CPP","opaque":5,"remark":"","version":63}'
    )
    command = decode_json(header)
    text = command.ext_fields["properties"]
    # Java's new String(bytes, UTF_8): one U+FFFD per malformed sequence.
    assert text == "TAGS\x01\u4e2d\ufffd\ufffdA\ufffd\x02KEYS\x01k\ufffd\x02"
    # Written back by mqbox (a client resending, a broker echoing): valid UTF-8 of that text.
    reencoded = encode_header(command)
    assert text.encode() in reencoded.replace(b"\\u0001", b"\x01").replace(b"\\u0002", b"\x02")
    assert decode_json(reencoded).ext_fields["properties"] == text
    command.serialize_type = SerializeType.ROCKETMQ
    assert text.encode() in encode_header(command)
    binary = decode_command(SerializeType.ROCKETMQ, encode_header(command), b"")
    assert binary.ext_fields["properties"] == text


def test_invalid_utf8_in_a_binary_header_decodes_as_java_decodes_it() -> None:
    header = binary_header(10, 0, 0, 1, 0, b"r\xff", [(b"k\xed\xa0\x80", b"v\xc3")])
    command = decode_command(SerializeType.ROCKETMQ, header, b"")
    assert command.remark == "r\ufffd"
    assert command.ext_fields == {"k\ufffd": "v\ufffd"}  # ED A0 80 is one U+FFFD in Java


def test_lone_surrogate_escape_stays_in_the_str_and_encodes_as_a_question_mark() -> None:
    command = decode_json(b'{"code":10,"opaque":1,"flag":0,"extFields":{"k":"a\\ud800b"}}')
    assert command.ext_fields == {"k": "a\ud800b"}  # a Java String holds it too
    header = encode_header(command)
    assert b'"k":"a?b"' in header  # Java's getBytes(UTF_8) writes '?'
    command.serialize_type = SerializeType.ROCKETMQ
    assert b"a?b" in encode_header(command)


def test_an_ext_value_nested_too_deep_to_write_again_is_refused_not_a_crash() -> None:
    """Found by the fuzz test: orjson reads 1020 levels, the json module cannot write them."""
    nested = b"[" * 1020 + b"]" * 1020
    command = decode_json(b'{"code":10,"opaque":1,"flag":0,"extFields":{"k":' + nested + b"}}")
    with pytest.raises(RemoteProtocolError, match="nested too deep"):
        _ = command.ext_fields
    shallow = decode_json(b'{"code":10,"opaque":1,"flag":0,"extFields":{"k":[[1]]}}')
    assert shallow.ext_fields == {"k": "[[1]]"}
    for header in (
        b'{"code":10,"opaque":1,"flag":0,"version":' + nested + b"}",
        b'{"code":' + nested + b',"opaque":1,"flag":0}',
    ):
        with pytest.raises(RemoteProtocolError, match=r"\[\[\[\[\.\.\.\]\]\]\]"):
            decode_json(header)  # the remark shows the value cut short


def test_deeply_nested_json_is_refused_not_a_crash() -> None:
    # The invalid UTF-8 byte sends the text to the json module, whose recursion limit trips.
    with pytest.raises(RemoteProtocolError, match="invalid JSON"):
        loads_json(b"\xff" + b"[" * 100_000)
    with pytest.raises(RemoteProtocolError, match="invalid JSON"):
        loads_json(b'["\xff",' + b"[" * 100_000 + b"]" * 100_000 + b"]")


def test_json_helpers_read_and_write_text_as_java_does() -> None:
    assert dumps_json({"a": "x\udcff\ud800y", "b": [1, None, True]}) == (
        b'{"a":"x??y","b":[1,null,true]}'
    )
    assert loads_json(b'{"a":"x\xff\x80y"}') == {"a": "x\ufffd\ufffdy"}
    assert loads_json(b'{"a":"\\ud83d\\ude00\\udc00"}') == {"a": "\U0001f600\udc00"}


def binary_header(
    code: int,
    language: int,
    version: int,
    opaque: int,
    flag: int,
    remark: bytes,
    ext: list[tuple[bytes, bytes]],
) -> bytes:
    """The section 2.4 layout written out by hand, independent of the codec."""
    fields = b"".join(
        struct.pack(">h", len(key)) + key + struct.pack(">i", len(value)) + value
        for key, value in ext
    )
    return (
        struct.pack(">hbhii", code, language, version, opaque, flag)
        + struct.pack(">i", len(remark))
        + remark
        + struct.pack(">i", len(fields))
        + fields
    )


def test_binary_header_decodes_the_documented_layout() -> None:
    header = binary_header(
        310, 0, 407, 12345, 0, b"", [(b"a", b"PG"), (b"b", b"test"), ("ключ".encode(), b"\xff")]
    )
    command = decode_command(SerializeType.ROCKETMQ, header, b"body")
    assert command.code == RequestCode.SEND_MESSAGE_V2
    assert command.language is LanguageCode.JAVA
    assert command.version == 407
    assert command.opaque == 12345
    assert command.remark is None
    assert command.serialize_type is SerializeType.ROCKETMQ
    assert command.ext_fields == {"a": "PG", "b": "test", "ключ": "\ufffd"}  # Java's decode
    assert command.body == b"body"
    fields = [(b"a", b"PG"), (b"b", b"test"), ("ключ".encode(), "\ufffd".encode())]
    assert encode_header(command) == binary_header(310, 0, 407, 12345, 0, b"", fields)


@pytest.mark.parametrize(
    ("header", "message"),
    [
        (b"\x00" * 20, "too short"),
        (binary_header(1, 0, 0, 0, 0, b"", [])[:-1], "too short"),
        (struct.pack(">hbhiii", 1, 0, 0, 0, 0, 100) + struct.pack(">i", 0), "remark length"),
        (struct.pack(">hbhiii", 1, 0, 0, 0, 0, -1) + struct.pack(">i", 0), "remark length"),
        (binary_header(1, 0, 0, 0, 0, b"", []) + b"x", "extFields length"),
        (struct.pack(">hbhiiii", 1, 0, 0, 0, 0, 0, 1) + b"\x00", "ends inside"),
        (struct.pack(">hbhiiii", 1, 0, 0, 0, 0, 0, 6) + b"\x00\x09" + b"\x00" * 4, "key length"),
        (
            struct.pack(">hbhiiii", 1, 0, 0, 0, 0, 0, 7) + b"\x00\x01k" + b"\x00\x00\x00\x09",
            "value length",
        ),
    ],
)
def test_bad_binary_header_raises_remote_protocol_error(header: bytes, message: str) -> None:
    with pytest.raises(RemoteProtocolError, match=message):
        decode_command(SerializeType.ROCKETMQ, header, b"")


text = st.text(max_size=12)


@settings(deadline=None, max_examples=200)
@given(
    code=st.integers(-(2**15), 2**15 - 1),
    language=st.sampled_from(LanguageCode),
    version=st.integers(-(2**15), 2**15 - 1),
    opaque=st.integers(-(2**31), 2**31 - 1),
    flag=st.integers(-(2**31), 2**31 - 1),
    remark=st.none() | text.filter(bool),
    ext=st.dictionaries(text, text, max_size=6),
    body=st.binary(max_size=32),
)
def test_binary_header_round_trips(
    code: int,
    language: LanguageCode,
    version: int,
    opaque: int,
    flag: int,
    remark: str | None,
    ext: dict[str, str],
    body: bytes,
) -> None:
    command = RemotingCommand(
        code, language, version, opaque, flag, remark, ext, body, SerializeType.ROCKETMQ
    )
    frame = encode_command(command)
    assert struct.unpack_from(">iI", frame) == (
        len(frame) - 4,
        (1 << 24) | (len(frame) - 8 - len(body)),
    )
    decoded = decode_command(SerializeType.ROCKETMQ, frame[8 : len(frame) - len(body)], body)
    assert decoded == command


@settings(deadline=None, max_examples=200)
@given(
    code=st.integers(-(2**31), 2**31 - 1),
    opaque=st.integers(-(2**31), 2**31 - 1),
    flag=st.integers(-(2**31), 2**31 - 1),
    remark=st.none() | text,
    ext=st.dictionaries(text, text, max_size=6),
)
def test_json_header_round_trips(
    code: int, opaque: int, flag: int, remark: str | None, ext: dict[str, str]
) -> None:
    command = RemotingCommand(code, LanguageCode.GO, 99, opaque, flag, remark, ext)
    decoded = decode_json(encode_header(command))
    assert decoded == command


def test_equality_compares_ext_fields_as_strings_and_repr_hides_the_body() -> None:
    decoded = decode_json(
        b'{"code":10,"opaque":1,"flag":0,"language":"PYTHON","version":317,'
        b'"extFields":{"queueId":3}}'
    )
    built = RemotingCommand(10, opaque=1, ext_fields={"queueId": "3"})
    assert decoded == built
    assert decoded != RemotingCommand(10, opaque=2, ext_fields={"queueId": "3"})
    built.body = b"secret" * 100
    assert "secret" not in repr(built)
    assert "600 bytes" in repr(built)
