"""The stored-message (CommitLog record) format, and the small formats that travel with it.

Owns: the byte layout of one stored record (drawn once, below), the end-of-segment blank, the
sysflag bits, the property names and the properties string, the two message ids (offset msgId and
UNIQ_KEY), Java's String.hashCode for tags and index keys, the batch body of SEND_MESSAGE (10 with
batch=1, and 320), and zlib body compression. Changed only with the formats it describes; read
by `protocol/`, `store/` and the processors.

Never: imports anything from mqbox (this is the leaf both `protocol` and `store` stand on), imports
numba, sockets or clocks, or decides policy. Callers pass in every time, host and limit.

Invariants:
- Every record encode_record() returns is self-consistent: TOTALSIZE equals 91 + body + topic +
  properties bytes, hosts are IPv4 (sysflag 0x10 and 0x20 clear), BODYCRC covers the stored body.
  decode_record() checks the same facts again when the record is read back (docs/style.md section 3:
  each fact guarded on both sides of the disk).
- Every size that comes from outside is bounded before anything is allocated from it: topic <= 127
  bytes, properties <= 32767 bytes, body <= a caller-given maximum, and every inflate is bounded
  by a caller-given size_bytes_max.
- Bad input from outside raises MessageIllegalError (or MessageTooLargeError); a broken internal
  contract is an assert.

Stored record, big-endian, IPv4 hosts (docs/protocol.md section 5.1). X_POSITION_BYTES
is where field X starts, counted from the record's first byte; n, t and p are the body, topic and
properties lengths::

    byte 0         4         8         12        16        20
         +---------+---------+---------+---------+---------+
         |TOTALSIZE|MAGICCODE| BODYCRC | QUEUEID |  FLAG   |
         |  int32  | uint32  |  int32  |  int32  |  int32  |
         +---------+---------+---------+---------+---------+
    byte 20                  28                  36        40
         +-------------------+-------------------+---------+
         |    QUEUEOFFSET    |  PHYSICALOFFSET   | SYSFLAG |
         |  int64 queue_index| int64 log_offset  |  int32  |
         +-------------------+-------------------+---------+
    byte 40                  48                  56
         +-------------------+-------------------+
         |   BORNTIMESTAMP   |     BORNHOST      |
         |     int64 ms      | IPv4 4 + port int32
         +-------------------+-------------------+
    byte 56                  64                  72        76                  84
         +-------------------+-------------------+---------+-------------------+
         |  STORETIMESTAMP   |     STOREHOST     |RECONSUME| PREPARED TX OFFSET|
         |     int64 ms      | IPv4 4 + port int32  int32  |       int64       |
         +-------------------+-------------------+---------+-------------------+
    byte 84        88            88+n     89+n          89+n+t   91+n+t       91+n+t+p
         +---------+---- ... ----+--------+---- ... ----+--------+---- ... ----+
         | BODYLEN |   BODY n    |TOPICLEN|   TOPIC t   |PROPSLEN|  PROPS p    |
         |  int32  |             | uint8  |   UTF-8     | int16  |  (below)    |
         +---------+---- ... ----+--------+---- ... ----+--------+---- ... ----+

End of a segment: when a record of L bytes does not fit with 8 bytes to spare, the writer puts
an 8-byte blank, [bytes left int32][BLANK_MAGIC uint32], and starts the next segment.

Properties: `name 0x01 value 0x02`, repeated; a final 0x02 is written, and the parser also accepts
it missing (Java 4.9 leaves it off). Parsing splits on 0x02, then each part on its first 0x01, and
drops parts with an empty name or an empty value; a later duplicate name wins (Java's HashMap). A
stored record's properties are empty or end with 0x02: encode_record() and the batch kernel add
the final 0x02 a client left off (terminate_properties), which no parser can tell apart. Recovery
relies on it: the last byte of a whole record is never zero (store/recovery.py,
find_unfinished_record), whatever the client sent.

Text from the wire follows one rule, Java's, so a client reads from mqbox the bytes the Java
broker would give it: bytes become text with `java_utf8_decode` (each malformed sequence is one
U+FFFD) and text becomes bytes with `java_utf8_encode` (a lone surrogate, which only a JSON
escape such as \\ud800 can make, is '?'). Every site that turns wire text into stored or
re-encoded bytes uses this pair: JSON and binary headers (protocol/command.py), a SEND's
properties, heartbeat bodies and the files admin.0 writes from them, and the names and remarks
that ride on ring parcels. A str from the wire may hold a lone surrogate, as a Java String may;
the bytes mqbox makes of it are always valid UTF-8. Bytes stored as they came stay as they are: a
batch element's properties are copied byte for byte, as Java's batch encoder copies them (with
the final 0x02 added when it is missing).
"""

from __future__ import annotations

import codecs
import datetime
import ipaddress
import struct
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from mqbox.errors import MessageIllegalError, MessageTooLargeError

# --- Stored record: field positions -------------------------------------------------------------

TOTALSIZE_POSITION_BYTES = 0
MAGICCODE_POSITION_BYTES = 4
BODYCRC_POSITION_BYTES = 8
QUEUEID_POSITION_BYTES = 12
FLAG_POSITION_BYTES = 16
QUEUEOFFSET_POSITION_BYTES = 20
PHYSICALOFFSET_POSITION_BYTES = 28
SYSFLAG_POSITION_BYTES = 36
BORNTIMESTAMP_POSITION_BYTES = 40
BORNHOST_POSITION_BYTES = 48
STORETIMESTAMP_POSITION_BYTES = 56
STOREHOST_POSITION_BYTES = 64
RECONSUMETIMES_POSITION_BYTES = 72
PREPARED_TRANSACTION_OFFSET_POSITION_BYTES = 76
BODY_LENGTH_POSITION_BYTES = 84
BODY_POSITION_BYTES = 88

HOST_SIZE_BYTES = 8  # IPv4 address (4) + port (int32); the only host form mqbox stores
RECORD_HEADER_SIZE_BYTES = BODY_POSITION_BYTES  # the fixed part, up to the first body byte
TOPIC_LENGTH_SIZE_BYTES = 1
PROPERTIES_LENGTH_SIZE_BYTES = 2
# The smallest record: empty body, topic and properties. Each variable field adds its length.
RECORD_SIZE_BYTES_MIN = (
    RECORD_HEADER_SIZE_BYTES + TOPIC_LENGTH_SIZE_BYTES + PROPERTIES_LENGTH_SIZE_BYTES
)

MESSAGE_MAGIC = 0xDAA320A7  # Java's int -626843481, read as unsigned
BLANK_MAGIC = 0xCBD43194  # Java's int -875286124, read as unsigned
BLANK_SIZE_BYTES = 8  # [bytes left int32][BLANK_MAGIC]
BODYCRC_MASK = 0x7FFFFFFF  # BODYCRC keeps CRC32's low 31 bits, as Java's store does

# Limits on sizes that come from outside (Java's limits; docs section 4.2).
TOPIC_SIZE_BYTES_MAX = 127  # C++ reads TOPICLEN as a signed char
PROPERTIES_SIZE_BYTES_MAX = 32767  # PROPSLEN is a signed int16
BODY_SIZE_BYTES_MAX_DEFAULT = 4 * 1024 * 1024  # maxMessageSize
# A whole record must fit TOTALSIZE, a signed int32, with every variable field at its maximum.
BODY_SIZE_BYTES_MAX_LIMIT = (
    2**31 - 1 - RECORD_SIZE_BYTES_MIN - TOPIC_SIZE_BYTES_MAX - PROPERTIES_SIZE_BYTES_MAX
)

_HEADER = struct.Struct(">iIiiiqqiq8sq8siqi")  # every field from TOTALSIZE through BODYLEN
_BLANK = struct.Struct(">iI")
_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_UINT32 = struct.Struct(">I")
_INT64 = struct.Struct(">q")
_HOST = struct.Struct(">4si")

assert TOTALSIZE_POSITION_BYTES == 0
assert MAGICCODE_POSITION_BYTES == TOTALSIZE_POSITION_BYTES + 4
assert BODYCRC_POSITION_BYTES == MAGICCODE_POSITION_BYTES + 4
assert QUEUEID_POSITION_BYTES == BODYCRC_POSITION_BYTES + 4
assert FLAG_POSITION_BYTES == QUEUEID_POSITION_BYTES + 4
assert QUEUEOFFSET_POSITION_BYTES == FLAG_POSITION_BYTES + 4
assert PHYSICALOFFSET_POSITION_BYTES == QUEUEOFFSET_POSITION_BYTES + 8
assert SYSFLAG_POSITION_BYTES == PHYSICALOFFSET_POSITION_BYTES + 8
assert BORNTIMESTAMP_POSITION_BYTES == SYSFLAG_POSITION_BYTES + 4
assert BORNHOST_POSITION_BYTES == BORNTIMESTAMP_POSITION_BYTES + 8
assert STORETIMESTAMP_POSITION_BYTES == BORNHOST_POSITION_BYTES + HOST_SIZE_BYTES
assert STOREHOST_POSITION_BYTES == STORETIMESTAMP_POSITION_BYTES + 8
assert RECONSUMETIMES_POSITION_BYTES == STOREHOST_POSITION_BYTES + HOST_SIZE_BYTES
assert PREPARED_TRANSACTION_OFFSET_POSITION_BYTES == RECONSUMETIMES_POSITION_BYTES + 4
assert BODY_LENGTH_POSITION_BYTES == PREPARED_TRANSACTION_OFFSET_POSITION_BYTES + 8
assert BODY_POSITION_BYTES == BODY_LENGTH_POSITION_BYTES + 4
assert _HEADER.size == RECORD_HEADER_SIZE_BYTES
assert _HOST.size == HOST_SIZE_BYTES
assert RECORD_SIZE_BYTES_MIN == 91  # docs section 5.1: 91 + body + topic + properties
assert _BLANK.size == BLANK_SIZE_BYTES
assert BLANK_SIZE_BYTES < RECORD_SIZE_BYTES_MIN  # a blank is never mistaken for a record's room
assert MESSAGE_MAGIC != BLANK_MAGIC
assert TOPIC_SIZE_BYTES_MAX < 2**7
assert PROPERTIES_SIZE_BYTES_MAX == 2**15 - 1
assert BODY_SIZE_BYTES_MAX_DEFAULT <= BODY_SIZE_BYTES_MAX_LIMIT

# --- Sysflag bits (docs section 5.2) ------------------------------------------------------------

SYSFLAG_COMPRESSED = 0x1  # the body is a zlib stream
SYSFLAG_MULTI_TAGS = 0x2
SYSFLAG_TRANSACTION_MASK = 0xC  # bits 2-3: one of the four types below
SYSFLAG_TRANSACTION_NOT_TYPE = 0x0
SYSFLAG_TRANSACTION_PREPARED_TYPE = 0x4
SYSFLAG_TRANSACTION_COMMIT_TYPE = 0x8
SYSFLAG_TRANSACTION_ROLLBACK_TYPE = 0xC
SYSFLAG_BORNHOST_V6 = 0x10  # never set by mqbox: C++ consumers always assume 8-byte hosts
SYSFLAG_STOREHOST_V6 = 0x20  # never set by mqbox, as above
SYSFLAG_HOSTS_V6 = SYSFLAG_BORNHOST_V6 | SYSFLAG_STOREHOST_V6
SYSFLAG_NEED_UNWRAP = 0x40
SYSFLAG_INNER_BATCH = 0x80
SYSFLAG_COMPRESSION_TYPE_MASK = 0x700  # bits 8-10, Java 4.9.7: set together with 0x1
SYSFLAG_COMPRESSION_TYPE_SHIFT = 8
COMPRESSION_TYPE_LZ4 = 1
COMPRESSION_TYPE_ZSTD = 2
COMPRESSION_TYPE_ZLIB = 3
COMPRESS_LEVEL_DEFAULT = 5  # the C++ producer's default; its streams start with 78 5E

assert SYSFLAG_TRANSACTION_ROLLBACK_TYPE & ~SYSFLAG_TRANSACTION_MASK == 0
assert SYSFLAG_COMPRESSION_TYPE_MASK >> SYSFLAG_COMPRESSION_TYPE_SHIFT == 0x7

# --- Property names (docs section 5.3) ----------------------------------------------------------

PROPERTY_NAME_VALUE_SEPARATOR = 0x01
PROPERTY_SEPARATOR = 0x02
PROPERTY_KEYS = "KEYS"  # user keys separated by spaces; indexed
PROPERTY_KEYS_SEPARATOR = " "
PROPERTY_TAGS = "TAGS"  # one tag; its hash goes into the consume queue
PROPERTY_UNIQ_KEY = "UNIQ_KEY"  # the client-made message id; indexed
PROPERTY_WAIT = "WAIT"  # "true"/"false": wait for the flush
PROPERTY_DELAY = "DELAY"  # delay level 1..18
PROPERTY_REAL_TOPIC = "REAL_TOPIC"
PROPERTY_REAL_QUEUE_ID = "REAL_QID"
PROPERTY_RETRY_TOPIC = "RETRY_TOPIC"
PROPERTY_ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
PROPERTY_RECONSUME_TIME = "RECONSUME_TIME"
PROPERTY_MAX_RECONSUME_TIMES = "MAX_RECONSUME_TIMES"
PROPERTY_TRANSACTION_PREPARED = "TRAN_MSG"
PROPERTY_PRODUCER_GROUP = "PGROUP"
PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET = "TRAN_PREPARED_QUEUE_OFFSET"
PROPERTY_TRANSACTION_CHECK_TIMES = "TRANSACTION_CHECK_TIMES"
PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS = "CHECK_IMMUNITY_TIME_IN_SECONDS"
PROPERTY_MIN_OFFSET = "MIN_OFFSET"
PROPERTY_MAX_OFFSET = "MAX_OFFSET"
PROPERTY_CLUSTER = "CLUSTER"
PROPERTY_MSG_REGION = "MSG_REGION"
PROPERTY_TRACE_ON = "TRACE_ON"

# --- Hosts --------------------------------------------------------------------------------------

HOST_ZERO = bytes(HOST_SIZE_BYTES)  # 0.0.0.0:0, the placeholder before the store host is known


def pack_host(ip: str, port: int) -> bytes:
    """The 8 stored bytes of an IPv4 host: address (4) then port (int32).

    An IPv4-mapped IPv6 peer (`::ffff:a.b.c.d`) is stored as its IPv4 address, because the C++
    client always decodes 8-byte hosts. Any other IPv6 address raises MessageIllegalError.
    """
    assert 0 <= port <= 0xFFFF
    try:
        address = ipaddress.ip_address(ip)
    except ValueError as error:
        raise MessageIllegalError(f"not an IP address: {ip!r}") from error
    if isinstance(address, ipaddress.IPv6Address):
        mapped = address.ipv4_mapped
        if mapped is None:
            raise MessageIllegalError(f"IPv6 hosts are not stored: {ip!r}")
        address = mapped
    return _HOST.pack(address.packed, port)


def unpack_host(host: bytes) -> tuple[str, int]:
    """(dotted IPv4 address, port) of 8 stored host bytes."""
    assert len(host) == HOST_SIZE_BYTES
    address, port = _HOST.unpack(host)
    return str(ipaddress.IPv4Address(address)), port


# --- Records ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MessageToStore:
    """One message as a send processor hands it to the commit log.

    `properties` is the encoded properties string (encode_properties). `body` is stored as it is:
    when sysflag has SYSFLAG_COMPRESSED it is already a zlib stream. Hosts are packed with
    pack_host(). The store fills in the queue index, log offset, store time and store host.
    """

    topic: str
    queue_id: int
    body: bytes
    properties: bytes = b""
    flag: int = 0
    sysflag: int = 0
    born_timestamp_ms: int = 0
    born_host: bytes = HOST_ZERO
    reconsume_times: int = 0
    prepared_transaction_log_offset_bytes: int = 0


@dataclass(frozen=True, slots=True)
class StoredMessage:
    """One record as decode_record() read it back; field names follow MessageToStore."""

    size_bytes: int
    body_crc: int
    queue_id: int
    flag: int
    queue_index: int
    log_offset_bytes: int
    sysflag: int
    born_timestamp_ms: int
    born_host: bytes
    store_timestamp_ms: int
    store_host: bytes
    reconsume_times: int
    prepared_transaction_log_offset_bytes: int
    body: bytes
    topic: str
    properties: bytes


def record_size_bytes(
    body_size_bytes: int, topic_size_bytes: int, properties_size_bytes: int
) -> int:
    """TOTALSIZE of a record with IPv4 hosts and the given variable-field lengths."""
    return RECORD_SIZE_BYTES_MIN + body_size_bytes + topic_size_bytes + properties_size_bytes


def body_crc(body: bytes | bytearray | memoryview) -> int:
    """BODYCRC of a stored body: CRC32 (zlib's, which equals java.util.zip.CRC32) & 0x7FFFFFFF."""
    return zlib.crc32(body) & BODYCRC_MASK


def encode_topic(topic: str) -> bytes:
    """The stored bytes of a topic name; raises MessageIllegalError if empty or over 127 bytes."""
    try:
        topic_bytes = topic.encode("utf-8")
    except UnicodeEncodeError as error:
        raise MessageIllegalError("topic is not valid Unicode") from error
    if not topic_bytes:
        raise MessageIllegalError("topic is empty")
    if len(topic_bytes) > TOPIC_SIZE_BYTES_MAX:
        raise MessageIllegalError(f"topic is {len(topic_bytes)} bytes, over {TOPIC_SIZE_BYTES_MAX}")
    return topic_bytes


def encode_record(
    message: MessageToStore,
    *,
    body_size_bytes_max: int = BODY_SIZE_BYTES_MAX_DEFAULT,
    queue_index: int = 0,
    log_offset_bytes: int = 0,
    store_timestamp_ms: int = 0,
    store_host: bytes = HOST_ZERO,
) -> bytearray:
    """The stored bytes of `message` (its properties given their final 0x02 if they lack it), a
    bytearray the patch_* helpers can finish in place.

    The commit log usually encodes with the store-side fields at their defaults and patches them
    once it knows the position (patch_queue_index, patch_log_offset, ...). Raises
    MessageTooLargeError for a body over `body_size_bytes_max`, and MessageIllegalError for a
    topic or properties over their limits, IPv6 sysflag bits, or a number out of its field's range.
    """
    assert 0 <= body_size_bytes_max <= BODY_SIZE_BYTES_MAX_LIMIT
    assert len(message.born_host) == HOST_SIZE_BYTES
    assert len(store_host) == HOST_SIZE_BYTES
    topic_bytes = encode_topic(message.topic)
    body = message.body
    properties = terminate_properties(bytes(message.properties))
    if len(body) > body_size_bytes_max:
        raise MessageTooLargeError(f"body is {len(body)} bytes, over {body_size_bytes_max}")
    if len(properties) > PROPERTIES_SIZE_BYTES_MAX:
        raise MessageIllegalError(
            f"properties are {len(properties)} bytes, over {PROPERTIES_SIZE_BYTES_MAX}"
        )
    if message.sysflag & SYSFLAG_HOSTS_V6:
        raise MessageIllegalError("sysflag asks for IPv6 hosts; mqbox stores IPv4 hosts only")
    size_bytes = record_size_bytes(len(body), len(topic_bytes), len(properties))
    record = bytearray(size_bytes)
    try:
        _HEADER.pack_into(
            record,
            0,
            size_bytes,
            MESSAGE_MAGIC,
            body_crc(body),
            message.queue_id,
            message.flag,
            queue_index,
            log_offset_bytes,
            message.sysflag,
            message.born_timestamp_ms,
            message.born_host,
            store_timestamp_ms,
            store_host,
            message.reconsume_times,
            message.prepared_transaction_log_offset_bytes,
            len(body),
        )
    except struct.error as error:
        raise MessageIllegalError(f"a record field is out of range: {error}") from error
    topic_length_position_bytes = BODY_POSITION_BYTES + len(body)
    properties_length_position_bytes = (
        topic_length_position_bytes + TOPIC_LENGTH_SIZE_BYTES + len(topic_bytes)
    )
    record[BODY_POSITION_BYTES:topic_length_position_bytes] = body
    record[topic_length_position_bytes] = len(topic_bytes)
    record[
        topic_length_position_bytes + TOPIC_LENGTH_SIZE_BYTES : properties_length_position_bytes
    ] = topic_bytes
    _INT16.pack_into(record, properties_length_position_bytes, len(properties))
    record[properties_length_position_bytes + PROPERTIES_LENGTH_SIZE_BYTES :] = properties
    assert len(record) == size_bytes
    return record


def decode_record(
    buffer: bytes | bytearray | memoryview, position_bytes: int = 0, *, check_crc: bool = True
) -> StoredMessage:
    """Read the record that starts at `position_bytes` of `buffer`.

    Raises MessageIllegalError if the bytes there are not one complete, self-consistent record:
    too few bytes, a wrong magic (a blank included: check is_blank() first where one may be),
    TOTALSIZE past the end or not equal to 91 + body + topic + properties, IPv6 sysflag bits, a
    topic over 127 bytes, or (with check_crc) a BODYCRC that does not match the body.
    """
    assert position_bytes >= 0
    view = memoryview(buffer).cast("B")
    available_bytes = len(view) - position_bytes
    if available_bytes < RECORD_SIZE_BYTES_MIN:
        raise MessageIllegalError(f"{available_bytes} bytes left, fewer than a record needs")
    (
        size_bytes,
        magic,
        stored_body_crc,
        queue_id,
        flag,
        queue_index,
        log_offset_bytes,
        sysflag,
        born_timestamp_ms,
        born_host,
        store_timestamp_ms,
        store_host,
        reconsume_times,
        prepared_transaction_log_offset_bytes,
        body_size_bytes,
    ) = _HEADER.unpack_from(view, position_bytes)
    if magic != MESSAGE_MAGIC:
        raise MessageIllegalError(f"magic code {magic:#010x} is not a message's")
    if size_bytes < RECORD_SIZE_BYTES_MIN:
        raise MessageIllegalError(f"TOTALSIZE {size_bytes} is under {RECORD_SIZE_BYTES_MIN}")
    if size_bytes > available_bytes:
        raise MessageIllegalError(f"TOTALSIZE {size_bytes} runs past the buffer end")
    if sysflag & SYSFLAG_HOSTS_V6:
        raise MessageIllegalError("sysflag says IPv6 hosts; mqbox stores IPv4 hosts only")
    if body_size_bytes < 0 or body_size_bytes > size_bytes - RECORD_SIZE_BYTES_MIN:
        raise MessageIllegalError(f"body length {body_size_bytes} does not fit TOTALSIZE")
    body_position_bytes = position_bytes + BODY_POSITION_BYTES
    topic_length_position_bytes = body_position_bytes + body_size_bytes
    topic_size_bytes = view[topic_length_position_bytes]
    if topic_size_bytes > TOPIC_SIZE_BYTES_MAX:
        raise MessageIllegalError(f"topic length {topic_size_bytes} is over the limit")
    topic_position_bytes = topic_length_position_bytes + TOPIC_LENGTH_SIZE_BYTES
    properties_length_position_bytes = topic_position_bytes + topic_size_bytes
    if record_size_bytes(body_size_bytes, topic_size_bytes, 0) > size_bytes:
        raise MessageIllegalError("topic runs past TOTALSIZE")
    (properties_size_bytes,) = _INT16.unpack_from(view, properties_length_position_bytes)
    if record_size_bytes(body_size_bytes, topic_size_bytes, properties_size_bytes) != size_bytes:
        raise MessageIllegalError("TOTALSIZE does not match the body, topic and properties")
    properties_position_bytes = properties_length_position_bytes + PROPERTIES_LENGTH_SIZE_BYTES
    body = bytes(view[body_position_bytes:topic_length_position_bytes])
    if check_crc and body_crc(body) != stored_body_crc:
        raise MessageIllegalError("BODYCRC does not match the body")
    topic = bytes(view[topic_position_bytes:properties_length_position_bytes]).decode(
        "utf-8", "surrogateescape"
    )
    properties = bytes(
        view[properties_position_bytes : properties_position_bytes + properties_size_bytes]
    )
    return StoredMessage(
        size_bytes=size_bytes,
        body_crc=stored_body_crc,
        queue_id=queue_id,
        flag=flag,
        queue_index=queue_index,
        log_offset_bytes=log_offset_bytes,
        sysflag=sysflag,
        born_timestamp_ms=born_timestamp_ms,
        born_host=born_host,
        store_timestamp_ms=store_timestamp_ms,
        store_host=store_host,
        reconsume_times=reconsume_times,
        prepared_transaction_log_offset_bytes=prepared_transaction_log_offset_bytes,
        body=body,
        topic=topic,
        properties=properties,
    )


def _assert_is_record(buffer: bytearray | memoryview, position_bytes: int) -> None:
    """Pair check for the patch helpers: the bytes there begin a message record."""
    assert position_bytes >= 0
    assert position_bytes + RECORD_SIZE_BYTES_MIN <= len(buffer)
    assert (
        _UINT32.unpack_from(buffer, position_bytes + MAGICCODE_POSITION_BYTES)[0] == MESSAGE_MAGIC
    )


def patch_queue_index(
    buffer: bytearray | memoryview, position_bytes: int, queue_index: int
) -> None:
    """Write QUEUEOFFSET of the record at `position_bytes`; clients commit offsets from it."""
    _assert_is_record(buffer, position_bytes)
    assert queue_index >= 0
    _INT64.pack_into(buffer, position_bytes + QUEUEOFFSET_POSITION_BYTES, queue_index)


def patch_log_offset(
    buffer: bytearray | memoryview, position_bytes: int, log_offset_bytes: int
) -> None:
    """Write PHYSICALOFFSET of the record at `position_bytes`: its own commit log position."""
    _assert_is_record(buffer, position_bytes)
    assert log_offset_bytes >= 0
    _INT64.pack_into(buffer, position_bytes + PHYSICALOFFSET_POSITION_BYTES, log_offset_bytes)


def patch_store_timestamp(
    buffer: bytearray | memoryview, position_bytes: int, store_timestamp_ms: int
) -> None:
    """Write STORETIMESTAMP (ms since the epoch) of the record at `position_bytes`."""
    _assert_is_record(buffer, position_bytes)
    _INT64.pack_into(buffer, position_bytes + STORETIMESTAMP_POSITION_BYTES, store_timestamp_ms)


def patch_store_host(
    buffer: bytearray | memoryview, position_bytes: int, store_host: bytes
) -> None:
    """Write STOREHOST (8 bytes from pack_host) of the record at `position_bytes`."""
    _assert_is_record(buffer, position_bytes)
    assert len(store_host) == HOST_SIZE_BYTES
    position_bytes += STOREHOST_POSITION_BYTES
    buffer[position_bytes : position_bytes + HOST_SIZE_BYTES] = store_host


def encode_blank(size_bytes: int) -> bytes:
    """The 8 bytes that end a segment with `size_bytes` left unused (the blank included)."""
    assert size_bytes >= BLANK_SIZE_BYTES
    return _BLANK.pack(size_bytes, BLANK_MAGIC)


def is_blank(buffer: bytes | bytearray | memoryview, position_bytes: int) -> bool:
    """True when an end-of-segment blank starts at `position_bytes`."""
    assert position_bytes >= 0
    if position_bytes + BLANK_SIZE_BYTES > len(buffer):
        return False
    size_bytes, magic = _BLANK.unpack_from(buffer, position_bytes)
    return bool(magic == BLANK_MAGIC and size_bytes >= BLANK_SIZE_BYTES)


# --- Properties ---------------------------------------------------------------------------------

_SEPARATORS = bytes((PROPERTY_NAME_VALUE_SEPARATOR, PROPERTY_SEPARATOR))


def encode_properties(properties: Mapping[bytes, bytes]) -> bytes:
    """`name 0x01 value 0x02` for each entry, final 0x02 included, in the mapping's order.

    Entries with an empty name or value are left out, because every parser drops them. Raises
    MessageIllegalError when a name holds 0x01 or 0x02, a value holds 0x02 (either would change
    what a parser reads back), or the result is over 32767 bytes.
    """
    parts: list[bytes] = []
    for name, value in properties.items():
        if not name or not value:
            continue
        if name.translate(None, _SEPARATORS) != name:
            raise MessageIllegalError(f"property name {name!r} holds a separator byte")
        if PROPERTY_SEPARATOR in value:
            raise MessageIllegalError(f"property {name!r} has a value holding 0x02")
        parts.append(name + b"\x01" + value + b"\x02")
    encoded = b"".join(parts)
    if len(encoded) > PROPERTIES_SIZE_BYTES_MAX:
        raise MessageIllegalError(
            f"properties are {len(encoded)} bytes, over {PROPERTIES_SIZE_BYTES_MAX}"
        )
    return encoded


def terminate_properties(encoded: bytes) -> bytes:
    """`encoded` with a final 0x02 added if it is not empty and lacks one: the same entries for
    every parser, in the form the store keeps (module docstring). The caller checks the length
    afterwards (it may grow by one byte past 32767)."""
    if encoded and encoded[-1] != PROPERTY_SEPARATOR:
        return encoded + b"\x02"
    return encoded


def decode_properties(encoded: bytes | bytearray | memoryview) -> dict[bytes, bytes]:
    """The entries of a properties string; see the module docstring for the parsing rules.

    Raises MessageIllegalError when `encoded` is over 32767 bytes.
    """
    data = bytes(encoded)
    if len(data) > PROPERTIES_SIZE_BYTES_MAX:
        raise MessageIllegalError(
            f"properties are {len(data)} bytes, over {PROPERTIES_SIZE_BYTES_MAX}"
        )
    properties: dict[bytes, bytes] = {}
    for part in data.split(b"\x02"):
        name, separator, value = part.partition(b"\x01")
        if separator and name and value:
            properties[name] = value
    return properties


def encode_properties_str(properties: Mapping[str, str]) -> bytes:
    """encode_properties() for str names and values, encoded as UTF-8 with surrogateescape.

    A str made by decode_properties_str() thus encodes back to the exact bytes it came from, even
    when those were not UTF-8. Raises MessageIllegalError for a str that cannot be encoded (a lone
    surrogate outside surrogateescape's range), besides encode_properties()'s reasons.
    """
    try:
        return encode_properties(
            {
                name.encode("utf-8", "surrogateescape"): value.encode("utf-8", "surrogateescape")
                for name, value in properties.items()
            }
        )
    except UnicodeEncodeError as error:
        raise MessageIllegalError("a property is not encodable as UTF-8") from error


def decode_properties_str(encoded: bytes | bytearray | memoryview) -> dict[str, str]:
    """decode_properties() with names and values decoded as UTF-8 with surrogateescape."""
    return {
        name.decode("utf-8", "surrogateescape"): value.decode("utf-8", "surrogateescape")
        for name, value in decode_properties(encoded).items()
    }


# --- Java String.hashCode: tags and index keys --------------------------------------------------

_REPLACEMENT = "\ufffd"
_INT32_SIGN = 0x80000000
_UINT32_MASK = 0xFFFFFFFF


def java_string_hash(text: str) -> int:
    """Java's String.hashCode of `text`: signed 32-bit, over its UTF-16 code units.

    A character above U+FFFF counts as its surrogate pair; a lone surrogate in `text` counts as
    itself, as in a Java string.
    """
    units = text.encode("utf-16-be", "surrogatepass")
    hash_value = 0
    for (unit,) in struct.iter_unpack(">H", units):
        hash_value = (hash_value * 31 + unit) & _UINT32_MASK
    return hash_value - (hash_value & _INT32_SIGN) * 2


def _is_continuation(byte: int) -> bool:
    return byte & 0xC0 == 0x80


def _java_utf8_errors(error: UnicodeError) -> tuple[str | bytes, int]:
    """The codec error handler JAVA_UTF8 names: Java's replacements for what UTF-8 cannot carry.

    Decoding: Python's decoder reports the same malformed sequences Java's does, one at a time,
    except that it stops at the second byte of an encoded surrogate (ED A0..BF), where Java
    replaces the whole sequence, or its valid prefix, with one U+FFFD. Encoding: a high surrogate
    followed by a low one is the pair's 4-byte sequence; any other surrogate is '?'.
    """
    if isinstance(error, UnicodeDecodeError):
        data = error.object
        at = error.start
        if data[at] == 0xED and at + 1 < len(data) and 0xA0 <= data[at + 1] <= 0xBF:
            end = at + 2
            if end < len(data) and _is_continuation(data[end]):
                end += 1
            return _REPLACEMENT, end
        return _REPLACEMENT, error.end
    assert isinstance(error, UnicodeEncodeError), error
    text = error.object
    encoded = bytearray()
    at = error.start
    while at < error.end:
        unit = ord(text[at])
        low = ord(text[at + 1]) if at + 1 < len(text) else 0
        if 0xD800 <= unit <= 0xDBFF and 0xDC00 <= low <= 0xDFFF:
            encoded += chr(0x10000 + ((unit - 0xD800) << 10) + (low - 0xDC00)).encode()
            at += 2
        else:
            encoded += b"?"
            at += 1
    return bytes(encoded), at


JAVA_UTF8 = "mqbox.java_utf8"
codecs.register_error(JAVA_UTF8, _java_utf8_errors)


def java_utf8_decode(encoded: bytes | bytearray | memoryview) -> str:
    """The string Java's `new String(bytes, UTF_8)` makes of `encoded`.

    Valid UTF-8 decodes as usual. Each malformed sequence becomes one U+FFFD, and Java (JDK 8 to
    21, sun.nio.cs.UTF_8) chooses its length thus: a bad lead byte, a C0/C1 lead or an overlong
    E0/F0 start is 1 byte; a valid prefix cut by a bad byte is the prefix; an encoded surrogate
    (ED A0..BF xx) or a code point past U+10FFFF as a whole complete sequence is one U+FFFD;
    an incomplete sequence at the end is one U+FFFD. This equals Python's errors="replace" except
    for sequences starting ED A0..ED BF, which Python replaces byte by byte: the JAVA_UTF8 error
    handler replaces those as Java does. tests/unit/test_message.py states the rules again,
    byte by byte, and checks the two agree.
    """
    return str(encoded, "utf-8", JAVA_UTF8)


def java_utf8_encode(text: str) -> bytes:
    """The bytes Java's `text.getBytes(UTF_8)` makes: UTF-8, where a surrogate pair is its
    4-byte sequence and a lone surrogate (a JSON escape such as \\ud800 makes one) is '?'. The
    result is always valid UTF-8; valid text encodes at the speed of a plain encode."""
    return text.encode("utf-8", JAVA_UTF8)


def tag_hash(tags: str | bytes | None) -> int:
    """The consume queue's tag field: Java String.hashCode of TAGS, sign-extended; 0 without tags.

    Bytes are decoded as Java would decode them (java_utf8_decode), so the hash equals the store
    kernel's, which hashes the stored bytes.
    """
    if not tags:
        return 0
    if isinstance(tags, bytes):
        return java_string_hash(java_utf8_decode(tags))
    return java_string_hash(tags)


def index_key_hash(topic: str, key: str) -> int:
    """The index file's key hash: abs(hashCode(topic + "#" + key)), with Integer.MIN_VALUE -> 0."""
    hash_value = abs(java_string_hash(topic + "#" + key))
    return 0 if hash_value == _INT32_SIGN else hash_value


# --- Message ids (docs section 6) ---------------------------------------------------------------

OFFSET_MSG_ID_SIZE_CHARS = 32
UNIQ_KEY_SIZE_CHARS = 32


def encode_offset_msg_id(store_host: bytes, log_offset_bytes: int) -> str:
    """The broker's msgId: store IPv4 + port + log offset as 32 uppercase hex characters."""
    assert len(store_host) == HOST_SIZE_BYTES
    assert log_offset_bytes >= 0
    msg_id = (store_host + _INT64.pack(log_offset_bytes)).hex().upper()
    assert len(msg_id) == OFFSET_MSG_ID_SIZE_CHARS
    return msg_id


def decode_offset_msg_id(msg_id: str) -> tuple[bytes, int]:
    """(store host bytes, log_offset_bytes) of an offset msgId from outside.

    Raises MessageIllegalError unless `msg_id` is 32 hex characters with a non-negative offset.
    """
    if len(msg_id) != OFFSET_MSG_ID_SIZE_CHARS:
        raise MessageIllegalError(f"msgId {msg_id!r} is not {OFFSET_MSG_ID_SIZE_CHARS} characters")
    try:
        raw = bytes.fromhex(msg_id)
    except ValueError as error:
        raise MessageIllegalError(f"msgId {msg_id!r} is not hexadecimal") from error
    if len(raw) != HOST_SIZE_BYTES + 8:  # fromhex skips whitespace
        raise MessageIllegalError(f"msgId {msg_id!r} is not hexadecimal")
    (log_offset_bytes,) = _INT64.unpack_from(raw, HOST_SIZE_BYTES)
    if log_offset_bytes < 0:
        raise MessageIllegalError(f"msgId {msg_id!r} holds a negative offset")
    return raw[:HOST_SIZE_BYTES], log_offset_bytes


class UniqKeyGenerator:
    """Makes UNIQ_KEYs in the Java client's layout, 16 bytes as 32 uppercase hex characters:

    IPv4 (4) + pid (2) + salt (4, Java's classloader hash) + ms since the start of the month
    (4, wrapping) + counter (2, wrapping), big-endian. Java counts the month in local time; mqbox
    counts it in UTC, which only shifts an opaque field. The caller passes the clock in.
    """

    __slots__ = ("_counter", "_month_end_ms", "_month_start_ms", "_prefix")

    def __init__(self, ip: bytes, pid: int, salt: int) -> None:
        assert len(ip) == 4
        self._prefix = ip + struct.pack(">HI", pid & 0xFFFF, salt & _UINT32_MASK)
        self._counter = 0
        self._month_start_ms = 0
        self._month_end_ms = 0

    def next_key(self, now_ms: int) -> str:
        """The next UNIQ_KEY at wall-clock time `now_ms` (ms since the epoch)."""
        if not self._month_start_ms <= now_ms < self._month_end_ms:
            self._month_start_ms, self._month_end_ms = _month_bounds_ms(now_ms)
        elapsed_ms = (now_ms - self._month_start_ms) & _UINT32_MASK
        key = self._prefix + struct.pack(">IH", elapsed_ms, self._counter)
        self._counter = (self._counter + 1) & 0xFFFF
        return key.hex().upper()

    def next_keys(self, now_ms: int, count: int) -> list[str]:
        """`count` keys at once, equal to `count` calls of next_key(now_ms): the shared part is
        made once and the counters are hexed in one pass (a batch's elements)."""
        head, start = self.reserve(now_ms, count)
        counters = struct.pack(f">{count}H", *((start + i) & 0xFFFF for i in range(count)))
        digits = counters.hex().upper()
        return [head + digits[at : at + 4] for at in range(0, 4 * count, 4)]

    def reserve(self, now_ms: int, count: int) -> tuple[str, int]:
        """Take `count` keys at time `now_ms` without making them: (the 28 hex characters they
        share, the first one's counter). Key i is the head and `(counter + i) & 0xFFFF` as 4
        uppercase hex digits (a kernel writes them: client/batch_kernels.py)."""
        assert count >= 0
        if not self._month_start_ms <= now_ms < self._month_end_ms:
            self._month_start_ms, self._month_end_ms = _month_bounds_ms(now_ms)
        elapsed_ms = (now_ms - self._month_start_ms) & _UINT32_MASK
        head = (self._prefix + struct.pack(">I", elapsed_ms)).hex().upper()
        start = self._counter
        self._counter = (start + count) & 0xFFFF
        return head, start


def _month_bounds_ms(now_ms: int) -> tuple[int, int]:
    """(start, end) in ms since the epoch of the UTC calendar month holding `now_ms`."""
    now = datetime.datetime.fromtimestamp(now_ms // 1000, datetime.UTC)
    start = datetime.datetime(now.year, now.month, 1, tzinfo=datetime.UTC)
    if now.month == 12:
        end = datetime.datetime(now.year + 1, 1, 1, tzinfo=datetime.UTC)
    else:
        end = datetime.datetime(now.year, now.month + 1, 1, tzinfo=datetime.UTC)
    return int(start.timestamp()) * 1000, int(end.timestamp()) * 1000


# --- Compression --------------------------------------------------------------------------------


def inflate(compressed: bytes | bytearray | memoryview, size_bytes_max: int) -> bytes:
    """The bytes of one zlib stream, at most `size_bytes_max` of them.

    Output is bounded while it is made (decompressobj with max_length), so a small bomb never
    allocates more than size_bytes_max + 1 bytes. Raises MessageTooLargeError when the stream holds
    more, and MessageIllegalError when it is not one complete zlib stream (trailing bytes included).
    """
    assert size_bytes_max >= 0
    decompressor = zlib.decompressobj()
    try:
        inflated = decompressor.decompress(compressed, size_bytes_max + 1)
    except zlib.error as error:
        raise MessageIllegalError(f"body is not a zlib stream: {error}") from error
    if len(inflated) > size_bytes_max:
        raise MessageTooLargeError(f"body inflates to more than {size_bytes_max} bytes")
    if not decompressor.eof:
        raise MessageIllegalError("zlib stream is truncated")
    if decompressor.unused_data:
        raise MessageIllegalError("bytes follow the zlib stream")
    return inflated


def deflate(data: bytes | bytearray | memoryview, level: int = COMPRESS_LEVEL_DEFAULT) -> bytes:
    """One zlib stream (RFC 1950) of `data`, as the C++ producer makes it."""
    assert 0 <= level <= 9
    return zlib.compress(data, level)


def compress_body(
    body: bytes, sysflag: int, level: int = COMPRESS_LEVEL_DEFAULT
) -> tuple[bytes, int]:
    """(zlib stream of `body`, sysflag with SYSFLAG_COMPRESSED set)."""
    assert sysflag & SYSFLAG_COMPRESSED == 0
    return deflate(body, level), sysflag | SYSFLAG_COMPRESSED


def decompress_body(body: bytes, sysflag: int, *, size_bytes_max: int) -> tuple[bytes, int]:
    """(plain body, sysflag without the compression bits); `body` as it is when not compressed.

    Raises MessageTooLargeError when the plain body is over `size_bytes_max`, MessageIllegalError
    for a compression type other than zlib (Java 4.9.7's LZ4 and ZSTD), besides inflate()'s.
    """
    if sysflag & SYSFLAG_COMPRESSED == 0:
        if len(body) > size_bytes_max:
            raise MessageTooLargeError(f"body is {len(body)} bytes, over {size_bytes_max}")
        return body, sysflag
    compression_type = (sysflag & SYSFLAG_COMPRESSION_TYPE_MASK) >> SYSFLAG_COMPRESSION_TYPE_SHIFT
    if compression_type not in (0, COMPRESSION_TYPE_ZLIB):
        raise MessageIllegalError(f"compression type {compression_type} is not supported")
    plain_sysflag = sysflag & ~(SYSFLAG_COMPRESSED | SYSFLAG_COMPRESSION_TYPE_MASK)
    return inflate(body, size_bytes_max), plain_sysflag


# --- Batch bodies (docs section 4.2) ------------------------------------------------------------
#
# One element of a batch body; elements sit back to back with no padding. Clients write 0 into
# MAGIC and BODYCRC, and the broker ignores both::
#
#     byte 0         4         8         12        16        20           20+n      22+n
#          +---------+---------+---------+---------+---------+---- ... ----+---------+-- ... --+
#          |TOTALSIZE|  MAGIC  | BODYCRC |  FLAG   | BODYLEN |   BODY n    |PROPSLEN | PROPS p |
#          |  int32  | ignored | ignored |  int32  |  int32  |             |  int16  |         |
#          +---------+---------+---------+---------+---------+---- ... ----+---------+-- ... --+

BATCH_TOTALSIZE_POSITION_BYTES = 0
BATCH_MAGICCODE_POSITION_BYTES = 4
BATCH_BODYCRC_POSITION_BYTES = 8
BATCH_FLAG_POSITION_BYTES = 12
BATCH_BODY_LENGTH_POSITION_BYTES = 16
BATCH_BODY_POSITION_BYTES = 20
BATCH_ELEMENT_SIZE_BYTES_MIN = BATCH_BODY_POSITION_BYTES + PROPERTIES_LENGTH_SIZE_BYTES
BATCH_ELEMENT_COUNT_MAX_DEFAULT = 4096

_BATCH_HEADER = struct.Struct(">iIiii")
assert _BATCH_HEADER.size == BATCH_BODY_POSITION_BYTES
assert BATCH_BODY_LENGTH_POSITION_BYTES + 4 == BATCH_BODY_POSITION_BYTES
assert BATCH_ELEMENT_SIZE_BYTES_MIN == 22


@dataclass(frozen=True, slots=True)
class BatchElement:
    """One message of a batch: its body, user flag and encoded properties."""

    body: bytes
    flag: int = 0
    properties: bytes = b""


def encode_batch(elements: Iterable[BatchElement]) -> bytes:
    """A batch body as the clients write it (MAGIC and BODYCRC zero)."""
    listed = list(elements)
    return encode_batch_elements(
        [element.body for element in listed],
        [element.properties for element in listed],
        [element.flag for element in listed],
    )


def encode_batch_elements(
    bodies: Sequence[bytes], properties: Sequence[bytes], flags: Sequence[int]
) -> bytes:
    """encode_batch over three parallel sequences (element i: bodies[i], properties[i],
    flags[i]), without an object per element: a producer's batch path."""
    assert len(bodies) == len(properties) == len(flags)
    assert not properties or max(map(len, properties)) <= PROPERTIES_SIZE_BYTES_MAX
    parts: list[bytes] = []
    append = parts.append
    pack_header = _BATCH_HEADER.pack
    pack_length = _INT16.pack
    for body, encoded, flag in zip(bodies, properties, flags, strict=True):
        body_size_bytes = len(body)
        properties_size_bytes = len(encoded)
        append(
            pack_header(
                BATCH_ELEMENT_SIZE_BYTES_MIN + body_size_bytes + properties_size_bytes,
                0,
                0,
                flag,
                body_size_bytes,
            )
        )
        append(body)
        append(pack_length(properties_size_bytes))
        append(encoded)
    return b"".join(parts)


def decode_batch(
    body: bytes | bytearray | memoryview,
    *,
    body_size_bytes_max: int = BODY_SIZE_BYTES_MAX_DEFAULT,
    element_count_max: int = BATCH_ELEMENT_COUNT_MAX_DEFAULT,
) -> list[BatchElement]:
    """The elements of a (plain) batch body, in order.

    Raises MessageIllegalError for an empty batch, a truncated element, an element whose TOTALSIZE
    disagrees with its lengths, or more than `element_count_max` elements; MessageTooLargeError
    for an element body over `body_size_bytes_max`. The kernel split_batch keeps the same rules.
    """
    assert body_size_bytes_max >= 0
    assert element_count_max >= 1
    view = memoryview(body).cast("B")
    elements: list[BatchElement] = []
    position_bytes = 0
    while position_bytes < len(view):
        if len(elements) == element_count_max:
            raise MessageIllegalError(f"batch holds more than {element_count_max} messages")
        available_bytes = len(view) - position_bytes
        if available_bytes < BATCH_ELEMENT_SIZE_BYTES_MIN:
            raise MessageIllegalError("batch element is truncated")
        size_bytes, _magic, _crc, flag, element_body_size_bytes = _BATCH_HEADER.unpack_from(
            view, position_bytes
        )
        if size_bytes < BATCH_ELEMENT_SIZE_BYTES_MIN:
            raise MessageIllegalError(f"batch element TOTALSIZE {size_bytes} is too small")
        if size_bytes > available_bytes:
            raise MessageIllegalError("batch element is truncated")
        if not 0 <= element_body_size_bytes <= size_bytes - BATCH_ELEMENT_SIZE_BYTES_MIN:
            raise MessageIllegalError("batch element body length does not fit its TOTALSIZE")
        if element_body_size_bytes > body_size_bytes_max:
            raise MessageTooLargeError(
                f"batch element body is {element_body_size_bytes} bytes, over {body_size_bytes_max}"
            )
        body_position_bytes = position_bytes + BATCH_BODY_POSITION_BYTES
        properties_length_position_bytes = body_position_bytes + element_body_size_bytes
        (properties_size_bytes,) = _INT16.unpack_from(view, properties_length_position_bytes)
        if (
            BATCH_ELEMENT_SIZE_BYTES_MIN + element_body_size_bytes + properties_size_bytes
            != size_bytes
        ):
            raise MessageIllegalError("batch element TOTALSIZE does not match its lengths")
        properties_position_bytes = properties_length_position_bytes + PROPERTIES_LENGTH_SIZE_BYTES
        elements.append(
            BatchElement(
                body=bytes(view[body_position_bytes:properties_length_position_bytes]),
                flag=flag,
                properties=bytes(view[properties_position_bytes : position_bytes + size_bytes]),
            )
        )
        position_bytes += size_bytes
    if not elements:
        raise MessageIllegalError("batch is empty")
    return elements


def decode_batch_request(
    body: bytes | bytearray | memoryview,
    sysflag: int,
    *,
    batch_size_bytes_max: int,
    body_size_bytes_max: int = BODY_SIZE_BYTES_MAX_DEFAULT,
    element_count_max: int = BATCH_ELEMENT_COUNT_MAX_DEFAULT,
) -> tuple[list[BatchElement], int]:
    """(elements, sysflag for each element) of a SEND batch body as it came from a client.

    C++ 1.2.3 compresses a batch body of 4096 bytes or more as a whole and sets sysflag bit 0;
    such a body is inflated first (to at most `batch_size_bytes_max` bytes), then split, and the
    elements are stored with the compression bits cleared: they were never compressed one by one.
    """
    if sysflag & SYSFLAG_COMPRESSED:
        plain, sysflag = decompress_body(bytes(body), sysflag, size_bytes_max=batch_size_bytes_max)
    else:
        if len(body) > batch_size_bytes_max:
            raise MessageTooLargeError(f"batch is {len(body)} bytes, over {batch_size_bytes_max}")
        plain = bytes(body)
    elements = decode_batch(
        plain, body_size_bytes_max=body_size_bytes_max, element_count_max=element_count_max
    )
    return elements, sysflag
