"""RemotingCommand: one request or response, and its header in both serialize types.

Owns: the command record, the JSON and ROCKETMQ (binary) header codecs, whole-frame encoding, and
the JSON helpers the body codecs in headers.py share. Never: buffering or I/O (connection.py),
meaning of extFields (headers.py).

Rules this module keeps (docs/protocol.md sections 2 and 12):

1. `RemotingCommand.ext_fields` is always a `dict[str, str]`. The C++ client sends 32-bit fields
   as JSON numbers and everything else as strings; numbers become their decimal text, booleans
   "true"/"false", nested JSON its compact text, and a null value is dropped, because Java reads a
   null field as an absent one. The conversion runs on the first read of `ext_fields`, not while
   decoding, because the SEND and PULL decoders of headers.py read the JSON values directly.
2. Encoded JSON headers carry `code`, `opaque` and `flag` as JSON numbers, `extFields` always
   (at least `{}`) with string values only, and `remark` as a string or null. A non-string value
   is mqbox's bug (LocalProtocolError): the C++ client silently ignores it, and a SEND reply
   without its fields crashes that client.
3. Text is decoded and encoded as Java decodes and encodes it (message.py states the rule):
   header bytes that are not valid UTF-8 decode with U+FFFD for each malformed sequence
   (message.java_utf8_decode), and a lone surrogate, which a JSON escape such as \\ud800 makes,
   encodes as '?' (message.java_utf8_encode). orjson refuses both, so it handles everything else,
   being several times faster (pyproject.toml), and the standard json module the rest.
"""

from __future__ import annotations

import json
import reprlib
import struct
from collections.abc import Mapping
from typing import Any, Final, NoReturn, TypeAlias

import orjson

from mqbox.message import java_utf8_decode, java_utf8_encode
from mqbox.protocol.codes import (
    FLAG_ONEWAY,
    FLAG_RESPONSE,
    VERSION_MQBOX,
    LanguageCode,
    SerializeType,
)
from mqbox.protocol.errors import LocalProtocolError, RemoteProtocolError
from mqbox.protocol.frame import (
    FRAME_LENGTH_SIZE_BYTES,
    FRAME_PREFIX,
    FRAME_SIZE_BYTES_MAX_DEFAULT,
    HEADER_SIZE_BYTES_MAX,
    HEADER_WORD_SIZE_BYTES,
    SERIALIZE_TYPE_SHIFT,
    encode_frame_prefix,
)

INT16_MIN: Final = -(2**15)
INT16_MAX: Final = 2**15 - 1
INT32_MIN: Final = -(2**31)
INT32_MAX: Final = 2**31 - 1
INT64_MIN: Final = -(2**63)
INT64_MAX: Final = 2**63 - 1

# Enum members as module constants: reading `LanguageCode.PYTHON` goes through the enum metaclass
# and costs several times a global lookup, which shows on a path run once per message.
_LANGUAGE_PYTHON: Final = LanguageCode.PYTHON
_LANGUAGE_OTHER: Final = LanguageCode.OTHER
_SERIALIZE_JSON: Final = SerializeType.JSON
_SERIALIZE_ROCKETMQ: Final = SerializeType.ROCKETMQ

# Every byte buffer the decoders accept: connection.py hands them bytes, tests hand them anything.
Buffer: TypeAlias = bytes | bytearray | memoryview


class RemotingCommand:
    """One remoting request or response, header and body.

    Mutable and slotted so building one is cheap on the send path; `body` is the frame's body,
    copied once out of the receive buffer.

    `ext_fields` is always a `dict[str, str]`. A command decoded from JSON keeps extFields as
    orjson returned them and converts them on the first read of `ext_fields` (rule 1 of the module
    docstring). The SEND and PULL decoders of headers.py read `ext_fields_json` instead and skip the
    conversion: on a SEND it is a loop over 15 fields, about a tenth of the codec's time.
    """

    __slots__ = (
        "_ext",
        "_ext_pending",
        "body",
        "code",
        "flag",
        "language",
        "opaque",
        "remark",
        "serialize_type",
        "version",
    )

    def __init__(
        self,
        code: int,
        language: LanguageCode = _LANGUAGE_PYTHON,
        version: int = VERSION_MQBOX,
        opaque: int = 0,
        flag: int = 0,
        remark: str | None = None,
        ext_fields: dict[str, str] | None = None,
        body: bytes = b"",
        serialize_type: SerializeType = _SERIALIZE_JSON,
    ) -> None:
        self.code = code
        self.language = language
        self.version = version
        self.opaque = opaque
        self.flag = flag
        self.remark = remark
        self._ext: dict[str, Any] = {} if ext_fields is None else ext_fields
        self._ext_pending = False  # True while _ext may hold JSON values other than strings
        self.body = body
        self.serialize_type = serialize_type

    @property
    def ext_fields(self) -> dict[str, str]:
        """The custom header, every value a string."""
        if self._ext_pending:
            _normalize_ext(self._ext)
            self._ext_pending = False
        return self._ext

    @ext_fields.setter
    def ext_fields(self, ext_fields: dict[str, str]) -> None:
        self._ext = ext_fields
        self._ext_pending = False

    @property
    def ext_fields_json(self) -> Mapping[str, object]:
        """extFields as decoded: strings, or any JSON value a client sent (C++ sends numbers).

        For decoders that check the type of each field they read; everyone else reads ext_fields.
        """
        return self._ext

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RemotingCommand):
            return NotImplemented
        return (
            self.code == other.code
            and self.language == other.language
            and self.version == other.version
            and self.opaque == other.opaque
            and self.flag == other.flag
            and self.remark == other.remark
            and self.ext_fields == other.ext_fields
            and self.body == other.body
            and self.serialize_type == other.serialize_type
        )

    __hash__ = None  # type: ignore[assignment]  # mutable, so unhashable, as a dataclass would be

    def __repr__(self) -> str:
        return (
            f"RemotingCommand(code={self.code}, opaque={self.opaque}, flag={self.flag}, "
            f"language={self.language.name}, version={self.version}, remark={self.remark!r}, "
            f"ext_fields={self.ext_fields!r}, body=<{len(self.body)} bytes>, "
            f"serialize_type={self.serialize_type.name})"
        )

    @property
    def is_response(self) -> bool:
        """True when bit 0 of `flag` is set: this answers a request with the same opaque."""
        return self.flag & FLAG_RESPONSE != 0

    @property
    def is_oneway(self) -> bool:
        """True when bit 1 of `flag` is set. C++ never sets it on the wire, so do not rely on it."""
        return self.flag & FLAG_ONEWAY != 0

    def make_response(
        self,
        code: int,
        ext_fields: dict[str, str] | None = None,
        *,
        remark: str | None = None,
        body: bytes = b"",
    ) -> RemotingCommand:
        """The response to this request: same opaque and serialize type, RESPONSE flag set.

        The caller passes a fresh `ext_fields` dict (a typed header's `to_ext()`); it is not copied.
        """
        assert self.flag & FLAG_RESPONSE == 0
        return RemotingCommand(
            code,
            _LANGUAGE_PYTHON,
            VERSION_MQBOX,
            self.opaque,
            FLAG_RESPONSE,
            remark,
            ext_fields,
            body,
            self.serialize_type,
        )


def make_request(
    code: int,
    opaque: int,
    ext_fields: dict[str, str] | None = None,
    *,
    body: bytes = b"",
    oneway: bool = False,
    serialize_type: SerializeType = SerializeType.JSON,
) -> RemotingCommand:
    """A request from mqbox (client, or broker to client), with an opaque from `next_opaque()`."""
    assert INT32_MIN <= opaque <= INT32_MAX
    return RemotingCommand(
        code,
        _LANGUAGE_PYTHON,
        VERSION_MQBOX,
        opaque,
        FLAG_ONEWAY if oneway else 0,
        None,
        ext_fields,
        body,
        serialize_type,
    )


# ---------------------------------------------------------------------------------------------
# JSON, shared with headers.py

# repr that stops three levels down and after a few items: a JSON value from outside may be
# nested a thousand deep (orjson's limit), which a plain repr cannot print (RecursionError), or
# hold megabytes it would copy only to cut them.
_SHORT_REPR: Final = reprlib.Repr()
_SHORT_REPR.maxlevel = 3
_SHORT_REPR.maxlist = _SHORT_REPR.maxdict = 4
_SHORT_REPR.maxstring = _SHORT_REPR.maxlong = _SHORT_REPR.maxother = 60


def short_repr(value: object) -> str:
    """repr of a value from outside, cut short: error messages must stay small."""
    shown = _SHORT_REPR.repr(value)
    return shown if len(shown) <= 60 else shown[:57] + "..."


def loads_json(data: Buffer) -> Any:
    """Parse JSON from the wire; RemoteProtocolError if it is not JSON.

    orjson first. Anything it refuses (invalid UTF-8 and lone surrogate escapes above all) goes to
    the standard json module, decoded as Java decodes it (rule 3): each malformed sequence is one
    U+FFFD, and an escaped lone surrogate stays in the str, as in a Java String. The fallback also
    reads NaN and integers beyond 64 bits, which callers must range check anyway, and its
    recursion limit is turned into the same error.
    """
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        pass
    try:
        return json.loads(java_utf8_decode(data))
    except (ValueError, RecursionError) as error:
        raise RemoteProtocolError(f"invalid JSON: {error}") from None


def dumps_json(value: Any) -> bytes:
    """Compact JSON bytes, always valid UTF-8: a lone surrogate in a string is '?' (rule 3)."""
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError:
        pass
    return _dumps_json_fallback(value)


def _dumps_json_fallback(value: Any) -> bytes:
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return java_utf8_encode(text)


# ---------------------------------------------------------------------------------------------
# JSON header

_LANGUAGE_BY_NAME: Final = {language.name: language for language in LanguageCode}
_LANGUAGE_NAMES: Final = tuple(language.name for language in LanguageCode)
assert all(language.value == index for index, language in enumerate(LanguageCode))


def decode_json_command(header: Buffer, body: bytes) -> RemotingCommand:
    """The command of a frame whose header is JSON (serialize type 0)."""
    try:
        fields = orjson.loads(header)
    except orjson.JSONDecodeError:
        fields = loads_json(header)
    if type(fields) is not dict:
        raise RemoteProtocolError(f"header is a JSON {type(fields).__name__}, not an object")
    get = fields.get
    code = get("code")
    opaque = get("opaque")
    flag = get("flag")
    # `type(...) is int` also refuses JSON true/false, which Python reads as ints.
    if (
        type(code) is not int
        or type(opaque) is not int
        or type(flag) is not int
        or not INT32_MIN <= code <= INT32_MAX
        or not INT32_MIN <= opaque <= INT32_MAX
        or not INT32_MIN <= flag <= INT32_MAX
    ):
        _raise_bad_top_level(fields)
    ext = get("extFields")
    if ext is None:
        ext = {}
    elif type(ext) is not dict:
        raise RemoteProtocolError(f"extFields is a JSON {type(ext).__name__}, not an object")
    remark = get("remark")
    if remark is not None and type(remark) is not str:
        raise RemoteProtocolError(f"remark is a JSON {type(remark).__name__}, not a string")
    language_name = get("language")
    language = (
        _LANGUAGE_BY_NAME.get(language_name, _LANGUAGE_OTHER)
        if type(language_name) is str
        else _LANGUAGE_OTHER
    )
    version = get("version", 0)
    if type(version) is not int or not INT32_MIN <= version <= INT32_MAX:
        raise RemoteProtocolError(f"version {short_repr(version)} is not a 32-bit integer")
    command = RemotingCommand(
        code, language, version, opaque, flag, remark, ext, body, _SERIALIZE_JSON
    )
    command._ext_pending = True  # values are converted when first read (RemotingCommand)
    return command


def _raise_bad_top_level(fields: dict[str, Any]) -> NoReturn:
    for key in ("code", "opaque", "flag"):
        value = fields.get(key)
        if value is None:
            raise RemoteProtocolError(f"header has no {key}")
        if type(value) is not int:
            raise RemoteProtocolError(f"header {key} is {short_repr(value)}, not a JSON integer")
        if not INT32_MIN <= value <= INT32_MAX:
            raise RemoteProtocolError(f"header {key} {short_repr(value)} is not a 32-bit integer")
    raise AssertionError("unreachable")


def _normalize_ext(ext: dict[str, Any]) -> None:
    """Turn every extFields value into the string Java's fastjson would have made, in place.

    Numbers become decimal text, booleans "true"/"false", and nested JSON its compact text, so this
    fails only for nesting too deep to write again (RemoteProtocolError; orjson reads up to 1024
    levels, the json module writes fewer): any other bad value fails later, in the typed header
    that reads it, with that field's name. A null is dropped, because Java reads a null field as
    an absent one. Replacing a value does not resize the dict, so the loop may do it while
    iterating.
    """
    absent: list[str] = []
    for key, value in ext.items():
        kind = type(value)
        if kind is str:
            continue
        if kind is int:
            ext[key] = str(value)
        elif kind is bool:
            ext[key] = "true" if value else "false"
        elif value is None:
            absent.append(key)
        elif kind is float:
            ext[key] = repr(value)  # never sent by a known client; fails any int field
        else:
            try:
                ext[key] = dumps_json(value).decode("utf-8")  # always valid UTF-8
            except RecursionError:
                raise RemoteProtocolError(
                    f"extFields value of {key[:60]!r} is nested too deep"
                ) from None
    for key in absent:
        del ext[key]


def normalize_ext_fields(ext: Mapping[str, object]) -> dict[str, str]:
    """A copy of `ext` with every value a string, converted as `RemotingCommand.ext_fields` does."""
    normalized: dict[str, Any] = dict(ext)
    _normalize_ext(normalized)
    return normalized


def _encode_json_header(command: RemotingCommand) -> bytes:
    # The slot rather than the property: one Python call less per response.
    ext = command.ext_fields if command._ext_pending else command._ext
    # Typed as holding objects: the check is for callers that broke the dict[str, str] contract.
    checked: Mapping[str, object] = ext
    for value in checked.values():
        if not isinstance(value, str):
            _raise_bad_ext(checked)
    code = command.code
    opaque = command.opaque
    flag = command.flag
    if (
        not INT32_MIN <= code <= INT32_MAX
        or not INT32_MIN <= opaque <= INT32_MAX
        or not INT32_MIN <= flag <= INT32_MAX
    ):
        raise LocalProtocolError(f"code/opaque/flag out of int32 range in {command!r}")
    header = {
        "code": code,
        "extFields": ext,
        "flag": flag,
        "language": _LANGUAGE_NAMES[command.language],
        "opaque": opaque,
        "remark": command.remark,
        "version": command.version,
    }
    try:
        return orjson.dumps(header)
    except orjson.JSONEncodeError:
        pass
    for key in ext:
        if not isinstance(key, str):
            raise LocalProtocolError(f"extFields key {key!r} is not a str")
    return _dumps_json_fallback(header)


def _raise_bad_ext(ext: Mapping[str, object]) -> NoReturn:
    for key, value in ext.items():
        if not isinstance(value, str):
            raise LocalProtocolError(
                f"extFields value of {key!r} is {type(value).__name__} {value!r}, not a str: "
                "the C++ client ignores non-string values"
            )
    raise AssertionError("unreachable")


# ---------------------------------------------------------------------------------------------
# ROCKETMQ binary header (docs/protocol.md section 2.4)
#
#   code int16 | language int8 | version int16 | opaque int32 | flag int32
#   | remark length int32 | remark UTF-8 (length 0 means null)
#   | extFields length int32 | repeated [key length int16][key][value length int32][value]

_BINARY_FIXED: Final = struct.Struct(">hbhii")
_INT16: Final = struct.Struct(">h")
_INT32: Final = struct.Struct(">i")
_BINARY_FIXED_SIZE_BYTES: Final = _BINARY_FIXED.size  # 13


def _decode_binary_header(header: Buffer, body: bytes) -> RemotingCommand:
    view = memoryview(header)
    end = len(view)
    if end < _BINARY_FIXED_SIZE_BYTES + 8:
        raise RemoteProtocolError(f"binary header of {end} bytes is too short")
    code, language_code, version, opaque, flag = _BINARY_FIXED.unpack_from(view, 0)
    position = _BINARY_FIXED_SIZE_BYTES
    (remark_size_bytes,) = _INT32.unpack_from(view, position)
    position += 4
    if not 0 <= remark_size_bytes <= end - position - 4:
        raise RemoteProtocolError(
            f"binary header remark length {remark_size_bytes} is out of range"
        )
    remark = (
        java_utf8_decode(view[position : position + remark_size_bytes])
        if remark_size_bytes > 0
        else None
    )
    position += remark_size_bytes
    (ext_size_bytes,) = _INT32.unpack_from(view, position)
    position += 4
    if ext_size_bytes != end - position:
        raise RemoteProtocolError(
            f"binary header extFields length {ext_size_bytes} != the {end - position} bytes left"
        )
    ext: dict[str, str] = {}
    while position < end:
        if end - position < 2:
            raise RemoteProtocolError("binary header ends inside an extFields key length")
        (key_size_bytes,) = _INT16.unpack_from(view, position)
        position += 2
        if not 0 <= key_size_bytes <= end - position - 4:
            raise RemoteProtocolError(f"binary header key length {key_size_bytes} is out of range")
        key = java_utf8_decode(view[position : position + key_size_bytes])
        position += key_size_bytes
        (value_size_bytes,) = _INT32.unpack_from(view, position)
        position += 4
        if not 0 <= value_size_bytes <= end - position:
            raise RemoteProtocolError(
                f"binary header value length {value_size_bytes} is out of range"
            )
        ext[key] = java_utf8_decode(view[position : position + value_size_bytes])
        position += value_size_bytes
    language = (
        LanguageCode(language_code)
        if 0 <= language_code < len(_LANGUAGE_NAMES)
        else LanguageCode.OTHER
    )
    return RemotingCommand(
        code, language, version, opaque, flag, remark, ext, body, SerializeType.ROCKETMQ
    )


def _encode_binary_header(command: RemotingCommand) -> bytes:
    code = command.code
    version = command.version
    if not INT16_MIN <= code <= INT16_MAX:
        raise LocalProtocolError(f"code {code} does not fit the binary header's int16")
    if not INT16_MIN <= version <= INT16_MAX:
        raise LocalProtocolError(f"version {version} does not fit the binary header's int16")
    if not INT32_MIN <= command.opaque <= INT32_MAX or not INT32_MIN <= command.flag <= INT32_MAX:
        raise LocalProtocolError(f"opaque/flag out of int32 range in {command!r}")
    parts = [_BINARY_FIXED.pack(code, int(command.language), version, command.opaque, command.flag)]
    remark = b"" if command.remark is None else java_utf8_encode(command.remark)
    parts.append(_INT32.pack(len(remark)))
    parts.append(remark)
    ext_parts: list[bytes] = []
    for key, value in command.ext_fields.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise LocalProtocolError(f"extFields entry {key!r}: {value!r} is not str to str")
        key_bytes = java_utf8_encode(key)
        if len(key_bytes) > INT16_MAX:
            raise LocalProtocolError(f"extFields key of {len(key_bytes)} bytes exceeds int16")
        value_bytes = java_utf8_encode(value)
        ext_parts += (_INT16.pack(len(key_bytes)), key_bytes, _INT32.pack(len(value_bytes)))
        ext_parts.append(value_bytes)
    ext_bytes = b"".join(ext_parts)
    parts.append(_INT32.pack(len(ext_bytes)))
    parts.append(ext_bytes)
    return b"".join(parts)


# ---------------------------------------------------------------------------------------------
# Whole commands


def decode_command(serialize_type: int, header: Buffer, body: bytes) -> RemotingCommand:
    """The command carried by one frame's header and body; RemoteProtocolError if malformed.

    `serialize_type` has been checked by frame.check_header_word.
    """
    if serialize_type == _SERIALIZE_JSON:
        return decode_json_command(header, body)
    assert serialize_type == _SERIALIZE_ROCKETMQ
    return _decode_binary_header(header, body)


def encode_header(command: RemotingCommand) -> bytes:
    """The header bytes of `command` in its own serialize type."""
    if command.serialize_type == _SERIALIZE_JSON:
        return _encode_json_header(command)
    assert command.serialize_type == _SERIALIZE_ROCKETMQ
    return _encode_binary_header(command)


_LANGUAGE_NAME_PYTHON: Final = LanguageCode.PYTHON.name


def encode_response_header(
    opaque: int,
    serialize_type: int,
    code: int,
    ext_fields: dict[str, str],
    remark: str | None = None,
) -> bytes:
    """The header bytes of the response to a request with `opaque` and `serialize_type`: exactly
    `encode_header(request.make_response(code, ext_fields, remark=remark))`, without building the
    RemotingCommand. The send path answers every message, so this saves about a tenth of the
    codec's time per SEND (bench/codec.py); anything unusual takes the general path."""
    if serialize_type == _SERIALIZE_JSON and INT32_MIN <= code <= INT32_MAX:
        for value in ext_fields.values():
            if type(value) is not str:
                break
        else:
            try:
                return orjson.dumps(
                    {
                        "code": code,
                        "extFields": ext_fields,
                        "flag": FLAG_RESPONSE,
                        "language": _LANGUAGE_NAME_PYTHON,
                        "opaque": opaque,
                        "remark": remark,
                        "version": VERSION_MQBOX,
                    }
                )
            except orjson.JSONEncodeError:
                pass  # a lone surrogate: the general path writes it as Java does (rule 3)
    return encode_header(
        RemotingCommand(
            code,
            _LANGUAGE_PYTHON,
            VERSION_MQBOX,
            opaque,
            FLAG_RESPONSE,
            remark,
            ext_fields,
            b"",
            SerializeType(serialize_type),
        )
    )


def encode_command(
    command: RemotingCommand, frame_size_bytes_max: int = FRAME_SIZE_BYTES_MAX_DEFAULT
) -> bytes:
    """The whole frame of `command`: prefix, header, body.

    Packs the prefix itself rather than through frame.encode_frame_prefix, which it calls only to
    raise the precise error: one Python call less on every response.
    """
    serialize_type = command.serialize_type
    if serialize_type == _SERIALIZE_JSON:
        header = _encode_json_header(command)
    else:
        assert serialize_type == _SERIALIZE_ROCKETMQ
        header = _encode_binary_header(command)
    body = command.body
    header_size_bytes = len(header)
    frame_length = HEADER_WORD_SIZE_BYTES + header_size_bytes + len(body)
    if (
        header_size_bytes > HEADER_SIZE_BYTES_MAX
        or frame_length + FRAME_LENGTH_SIZE_BYTES > frame_size_bytes_max
    ):
        encode_frame_prefix(serialize_type, header_size_bytes, len(body), frame_size_bytes_max)
        raise AssertionError("unreachable")
    prefix = FRAME_PREFIX.pack(
        frame_length, (serialize_type << SERIALIZE_TYPE_SHIFT) | header_size_bytes
    )
    return b"".join((prefix, header, body))


def encode_command_head(
    command: RemotingCommand,
    body_size_bytes: int,
    frame_size_bytes_max: int = FRAME_SIZE_BYTES_MAX_DEFAULT,
) -> bytes:
    """Prefix and header of a frame whose body of `body_size_bytes` the caller sends itself.

    For PULL replies: the reactor follows these bytes with `os.sendfile` from the commit log, so the
    records never pass through Python. `command.body` must be empty.
    """
    assert not command.body
    header = encode_header(command)
    prefix = encode_frame_prefix(
        command.serialize_type, len(header), body_size_bytes, frame_size_bytes_max
    )
    return prefix + header
