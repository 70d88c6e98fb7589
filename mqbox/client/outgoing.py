"""What a producer puts on the wire, and what it reads back: pure functions, no I/O.

Owns (docs/client.md A.4, A.5, A.7, A.8; docs/protocol.md section 4.2):

    Message                 one message of a batch (or of send(), spelled as keywords there)
    check_topic/check_group Java's Validators.checkTopic and checkGroup
    encode_single()         one message: properties with UNIQ_KEY and WAIT, the body compressed
                            from COMPRESS_THRESHOLD_BYTES (zlib level 5, sysflag bit 0)
    encode_batch()          RocketMQ's batch body (message.encode_batch_elements), a UNIQ_KEY per
                            element, never compressed, sent as SEND_BATCH_MESSAGE (320)
    encode_plain_batch()    the same for plain bodies, in one kernel call (batch_kernels.py)
    encode_retry()          a consumer's failed message resent to `%RETRY%<group>` (the
                            send-back fallback, docs/client.md B.9), system properties included
    send_request_ext()      the V2 header (310 / 320) of one attempt at one queue, with
                            mqboxIdempotent when the message asks for the broker's window
    read_send_response()    Java's processSendResponse: SendResult for 0/10/11/12, else None

Never: sockets, clocks (the caller passes `born_timestamp_ms` and the UNIQ_KEYs), retries or queue
choice (producer.py, fault.py).

Rules:

1. Validation runs before anything is sent, on what the user gave: the topic (1..127 characters
   of [%|a-zA-Z0-9_-], not TBW102 itself), a non-empty body of at most `body_size_bytes_max`
   before compression (Java checks the plain body), property names the client does not own, and
   for a batch every element and the whole encoded body. A refusal is InvalidMessageError.
2. Properties go out as `name 0x01 value 0x02` pairs: the user's, then TAGS, KEYS (joined by
   spaces), DELAY, WAIT=true and UNIQ_KEY. A batch element carries the user's, TAGS, KEYS and its
   own UNIQ_KEY; WAIT=true travels once, in the batch header's properties, as Java and C++ send it.
3. Compression sets sysflag bit 0 only (0x1), as C++ and Java up to 4.9.3 do: every consumer
   inflates on that bit, and 4.9.4's extra type bits (0x300, zlib) say nothing more.
"""

from __future__ import annotations

import enum
import functools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

import numpy as np

from mqbox.client.errors import InvalidMessageError
from mqbox.errors import MessageIllegalError
from mqbox.message import (
    PROPERTIES_SIZE_BYTES_MAX,
    PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS,
    PROPERTY_CLUSTER,
    PROPERTY_DELAY,
    PROPERTY_KEYS,
    PROPERTY_KEYS_SEPARATOR,
    PROPERTY_MAX_OFFSET,
    PROPERTY_MAX_RECONSUME_TIMES,
    PROPERTY_MIN_OFFSET,
    PROPERTY_MSG_REGION,
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_RECONSUME_TIME,
    PROPERTY_RETRY_TOPIC,
    PROPERTY_TAGS,
    PROPERTY_TRACE_ON,
    PROPERTY_TRANSACTION_CHECK_TIMES,
    PROPERTY_TRANSACTION_PREPARED,
    PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET,
    PROPERTY_UNIQ_KEY,
    PROPERTY_WAIT,
    SYSFLAG_COMPRESSED,
    deflate,
    encode_batch_elements,
    encode_properties_str,
)
from mqbox.protocol.codes import RequestCode, ResponseCode
from mqbox.protocol.command import INT32_MAX, INT32_MIN, RemotingCommand
from mqbox.protocol.headers import (
    SEND_IDEMPOTENT_KEY,
    SEND_V2_KEY_BY_FIELD,
    MessageQueue,
    SendMessageRequestHeader,
    SendMessageResponseHeader,
    validate_topic,
)

BODY_SIZE_BYTES_MAX_DEFAULT: Final = 4 * 1024 * 1024  # Java's maxMessageSize
COMPRESS_THRESHOLD_BYTES_DEFAULT: Final = 4096  # compressMsgBodyOverHowmuch
COMPRESS_LEVEL_DEFAULT: Final = 5  # rocketmq.message.compressLevel
DEFAULT_TOPIC: Final = "TBW102"  # AUTO_CREATE_TOPIC_KEY_TOPIC: the template of auto-creation
DEFAULT_TOPIC_QUEUE_NUMS: Final = 4  # defaultTopicQueueNums of Java's producer
GROUP_SIZE_CHARS_MAX: Final = 255  # Validators.CHARACTER_MAX_LENGTH
RETRY_GROUP_TOPIC_PREFIX: Final = "%RETRY%"
DEFAULT_PRODUCER_GROUP: Final = "DEFAULT_PRODUCER"

_GROUP_PATTERN: Final = re.compile(r"[%|a-zA-Z0-9_-]+")
_WAIT_TRUE: Final = {PROPERTY_WAIT: "true"}
_BATCH_HEADER_PROPERTIES: Final = encode_properties_str(_WAIT_TRUE).decode()

SEND_SINGLE_CODE: Final = int(RequestCode.SEND_MESSAGE_V2)
SEND_BATCH_CODE: Final = int(RequestCode.SEND_BATCH_MESSAGE)

# Names the client writes itself or brokers own (Java's MessageConst.STRING_HASH_SET, the part
# docs/protocol.md section 5.3 lists): a user property of one of these names is refused.
RESERVED_PROPERTY_NAMES: Final = frozenset(
    {
        PROPERTY_KEYS,
        PROPERTY_TAGS,
        PROPERTY_UNIQ_KEY,
        PROPERTY_WAIT,
        PROPERTY_DELAY,
        PROPERTY_REAL_TOPIC,
        PROPERTY_REAL_QUEUE_ID,
        PROPERTY_RETRY_TOPIC,
        PROPERTY_ORIGIN_MESSAGE_ID,
        PROPERTY_RECONSUME_TIME,
        PROPERTY_MAX_RECONSUME_TIMES,
        PROPERTY_TRANSACTION_PREPARED,
        PROPERTY_PRODUCER_GROUP,
        PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET,
        PROPERTY_TRANSACTION_CHECK_TIMES,
        PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS,
        PROPERTY_MIN_OFFSET,
        PROPERTY_MAX_OFFSET,
        PROPERTY_CLUSTER,
        PROPERTY_MSG_REGION,
        PROPERTY_TRACE_ON,
    }
)

# Broker codes a sync send retries on another broker (Java's retryResponseCodes, A.4).
RETRY_RESPONSE_CODES: Final = frozenset(
    {
        int(ResponseCode.TOPIC_NOT_EXIST),
        int(ResponseCode.SERVICE_NOT_AVAILABLE),
        int(ResponseCode.SYSTEM_ERROR),
        int(ResponseCode.NO_PERMISSION),
        int(ResponseCode.NO_BUYER_ID),
        int(ResponseCode.NOT_IN_CURRENT_UNIT),
    }
)


class SendStatus(enum.Enum):
    """How a stored message fared (Java's SendStatus); anything else is an exception."""

    SEND_OK = 0
    FLUSH_DISK_TIMEOUT = 10
    SLAVE_NOT_AVAILABLE = 11
    FLUSH_SLAVE_TIMEOUT = 12


_STATUS_BY_CODE: Final = {status.value: status for status in SendStatus}


@dataclass(frozen=True, slots=True)
class SendResult:
    """A send the broker acknowledged.

    `msg_id` is the client's UNIQ_KEY (a batch: its elements' keys joined by commas, as Java's);
    `offset_msg_id` the broker's id of the stored record (store host + commit-log offset; a
    batch: one per element, joined by commas); `queue` the topic, broker and queue id it went
    to; `queue_offset` its index in that queue (a batch: the first element's).
    """

    status: SendStatus
    msg_id: str
    offset_msg_id: str
    queue: MessageQueue
    queue_offset: int


@dataclass(frozen=True, slots=True)
class Message:
    """One message of `Producer.send_batch`; `keys` is one string of space-separated keys or a
    sequence of keys, joined by spaces on the wire. A batch refuses a `delay_level` (Java)."""

    body: bytes
    tags: str | None = None
    keys: str | Sequence[str] = ()
    properties: Mapping[str, str] = field(default_factory=dict)
    flag: int = 0
    delay_level: int = 0


@dataclass(slots=True)
class OutgoingMessage:
    """A message or a batch, checked and encoded once, sent by one or more attempts. Not frozen:
    a frozen dataclass's __init__ costs a send a microsecond; nothing changes one after it."""

    topic: str
    body: bytes  # as sent: compressed when sysflag says so, a batch body for a batch
    sysflag: int
    flag: int
    properties: str  # the header's properties, surrogate-escaped text
    msg_id: str  # UNIQ_KEY, or the batch's keys joined by commas
    batch: bool
    message_count: int
    reconsume_times: int = 0  # the header's reconsumeTimes (a retry message only)
    reconsume_times_max: int | None = None  # the header's maxReconsumeTimes (likewise)
    # Ask the broker's idempotent window to drop elements whose UNIQ_KEY it stored lately
    # (docs/idempotence.md): the header field SEND_IDEMPOTENT_KEY.
    idempotent: bool = False


def check_topic(topic: str) -> None:
    """Validators.checkTopic; InvalidMessageError saying why a topic cannot be sent to."""
    problem = _topic_problem(topic)
    if problem is not None:
        raise InvalidMessageError(problem)


@functools.lru_cache(maxsize=4096)
def _topic_problem(topic: str) -> str | None:
    """Why `topic` cannot be sent to, or None; remembered, as a producer names few topics."""
    problem = validate_topic(topic)
    if problem is None and topic == DEFAULT_TOPIC:
        problem = f"the topic {topic} is the auto-creation template (TBW102)"
    return problem


def check_group(group: str) -> None:
    """Validators.checkGroup, and Java's refusal of the DEFAULT_PRODUCER group."""
    if not group:
        raise InvalidMessageError("the group name is empty")
    if len(group) > GROUP_SIZE_CHARS_MAX:
        raise InvalidMessageError(f"the group name is longer than {GROUP_SIZE_CHARS_MAX}")
    if not _GROUP_PATTERN.fullmatch(group):
        raise InvalidMessageError(
            f"the group name {group!r} has characters outside [%|a-zA-Z0-9_-]"
        )
    if group == DEFAULT_PRODUCER_GROUP:
        raise InvalidMessageError(f"{DEFAULT_PRODUCER_GROUP} is reserved; name the producer group")


def _check_body(body: bytes, body_size_bytes_max: int, topic: str) -> None:
    if not isinstance(body, bytes | bytearray | memoryview):
        raise InvalidMessageError(f"topic {topic}: the body is a {type(body).__name__}, not bytes")
    if len(body) == 0:
        raise InvalidMessageError(f"topic {topic}: the body is empty")
    if len(body) > body_size_bytes_max:
        raise InvalidMessageError(
            f"topic {topic}: the body is {len(body)} bytes, over the maximum {body_size_bytes_max}"
        )


def _check_flag(flag: int) -> None:
    if not INT32_MIN <= flag <= INT32_MAX:
        raise InvalidMessageError(f"the flag {flag} is not a 32-bit integer")


def _properties(
    tags: str | None,
    keys: str | Sequence[str],
    user: Mapping[str, str] | None,
    delay_level: int,
) -> dict[str, str]:
    """Rule 2's properties without WAIT and UNIQ_KEY; InvalidMessageError for a reserved or
    empty user property."""
    properties: dict[str, str] = {}
    if user:
        for name, value in user.items():
            if not name or not value:
                raise InvalidMessageError(
                    f"the property {name!r}: names and values must not be empty"
                )
            if name in RESERVED_PROPERTY_NAMES:
                raise InvalidMessageError(f"the property {name} is the client's; use the keyword")
            properties[name] = value
    if tags:
        properties[PROPERTY_TAGS] = tags
    key_text = keys if isinstance(keys, str) else PROPERTY_KEYS_SEPARATOR.join(keys)
    if key_text:
        properties[PROPERTY_KEYS] = key_text
    if delay_level:
        if delay_level < 0:
            raise InvalidMessageError(f"the delay level {delay_level} is negative")
        properties[PROPERTY_DELAY] = str(delay_level)
    return properties


_UNIQ_KEY_PREFIX_BYTES: Final = PROPERTY_UNIQ_KEY.encode() + b"\x01"
_TAGS_PREFIX: Final = PROPERTY_TAGS + "\x01"
_KEYS_PREFIX: Final = PROPERTY_KEYS + "\x01"
_DELAY_PREFIX: Final = PROPERTY_DELAY + "\x01"
_WAIT_AND_UNIQ_KEY_PREFIX: Final = f"{PROPERTY_WAIT}\x01true\x02{PROPERTY_UNIQ_KEY}\x01"


def _plain_properties_text(
    tags: str | None, key_text: str, delay_level: int, uniq_key: str
) -> str | None:
    """Rule 2's properties without user properties, written as text at once: the same string
    the general path (_properties, then message.encode_properties_str) makes, for ASCII tags and
    keys without a 0x02 (most messages: a send is a fifth faster for it, bench/client_latency.py).
    None for anything else, which the general path decides."""
    parts: list[str] = []
    if tags:
        if not tags.isascii() or "\x02" in tags:
            return None
        parts.append(_TAGS_PREFIX + tags + "\x02")
    if key_text:
        if not key_text.isascii() or "\x02" in key_text:
            return None
        parts.append(_KEYS_PREFIX + key_text + "\x02")
    if delay_level:
        parts.append(f"{_DELAY_PREFIX}{delay_level}\x02")
    parts.append(_WAIT_AND_UNIQ_KEY_PREFIX + uniq_key + "\x02")
    text = "".join(parts)
    if len(text) > PROPERTIES_SIZE_BYTES_MAX or not uniq_key.isascii():
        return None
    return text


def _encode_properties(properties: Mapping[str, str]) -> bytes:
    try:
        return encode_properties_str(properties)
    except MessageIllegalError as error:
        raise InvalidMessageError(str(error)) from None


def _compressed(body: bytes, threshold_bytes: int, level: int) -> tuple[bytes, int]:
    """Rule 3: the body as sent and its sysflag; deflated from `threshold_bytes` on."""
    if len(body) >= threshold_bytes:
        return deflate(body, level), SYSFLAG_COMPRESSED
    return bytes(body), 0


def encode_single(
    topic: str,
    body: bytes,
    *,
    uniq_key: str,
    tags: str | None = None,
    keys: str | Sequence[str] = (),
    properties: Mapping[str, str] | None = None,
    delay_level: int = 0,
    flag: int = 0,
    body_size_bytes_max: int = BODY_SIZE_BYTES_MAX_DEFAULT,
    compress_threshold_bytes: int = COMPRESS_THRESHOLD_BYTES_DEFAULT,
    compress_level: int = COMPRESS_LEVEL_DEFAULT,
) -> OutgoingMessage:
    """One message, checked (rule 1) and encoded (rules 2 and 3)."""
    check_topic(topic)
    _check_body(body, body_size_bytes_max, topic)
    _check_flag(flag)
    encoded = None
    if not properties and delay_level >= 0:
        key_text = keys if isinstance(keys, str) else PROPERTY_KEYS_SEPARATOR.join(keys)
        encoded = _plain_properties_text(tags, key_text, delay_level, uniq_key)
    if encoded is None:
        fields = _properties(tags, keys, properties, delay_level)
        fields[PROPERTY_WAIT] = "true"
        fields[PROPERTY_UNIQ_KEY] = uniq_key
        encoded = _encode_properties(fields).decode("utf-8", "surrogateescape")
    data, sysflag = _compressed(body, compress_threshold_bytes, compress_level)
    return OutgoingMessage(topic, data, sysflag, flag, encoded, uniq_key, False, 1)


def encode_retry(
    group: str,
    body: bytes,
    properties: Mapping[str, str],
    *,
    origin_topic: str,
    origin_msg_id: str,
    reconsume_times: int,
    reconsume_times_max: int,
    flag: int = 0,
    body_size_bytes_max: int = BODY_SIZE_BYTES_MAX_DEFAULT,
    compress_threshold_bytes: int = COMPRESS_THRESHOLD_BYTES_DEFAULT,
    compress_level: int = COMPRESS_LEVEL_DEFAULT,
) -> OutgoingMessage:
    """A consumed message sent anew to `%RETRY%<group>` (Java's sendMessageBack fallback,
    docs/client.md B.9): its (inflated) body and properties, RETRY_TOPIC = the topic it was
    first sent to, ORIGIN_MESSAGE_ID kept or set, DELAY = 3 + `reconsume_times`; the reconsume
    counts travel in the header, as Java's sendKernelImpl moves them there, so the broker sends
    it to `%DLQ%<group>` once they reach the limit. Its UNIQ_KEY is kept (Java's setUniqID only
    sets a missing one)."""
    check_group(group)
    topic = RETRY_GROUP_TOPIC_PREFIX + group
    _check_body(body, body_size_bytes_max, topic)
    _check_flag(flag)
    fields = dict(properties)
    for name in (
        PROPERTY_RECONSUME_TIME,
        PROPERTY_MAX_RECONSUME_TIMES,
        PROPERTY_TRANSACTION_PREPARED,
    ):
        fields.pop(name, None)
    fields.setdefault(PROPERTY_RETRY_TOPIC, origin_topic)
    if not fields.get(PROPERTY_ORIGIN_MESSAGE_ID):
        fields[PROPERTY_ORIGIN_MESSAGE_ID] = origin_msg_id
    fields[PROPERTY_DELAY] = str(3 + reconsume_times)
    fields[PROPERTY_WAIT] = "true"
    uniq_key = fields.setdefault(PROPERTY_UNIQ_KEY, origin_msg_id)
    encoded = _encode_properties(fields).decode("utf-8", "surrogateescape")
    data, sysflag = _compressed(body, compress_threshold_bytes, compress_level)
    return OutgoingMessage(
        topic,
        data,
        sysflag,
        flag,
        encoded,
        uniq_key,
        False,
        1,
        reconsume_times + 1,
        reconsume_times_max,
    )


def encode_batch(
    topic: str,
    messages: Sequence[Message | bytes],
    uniq_keys: Sequence[str],
    *,
    body_size_bytes_max: int = BODY_SIZE_BYTES_MAX_DEFAULT,
) -> OutgoingMessage:
    """A batch: every element checked (Java's MessageBatch.generateFromList and checkMessage),
    its properties with its own UNIQ_KEY (`uniq_keys[i]`, one per element), the batch body of
    message.encode_batch_elements, itself at most `body_size_bytes_max` bytes (rule 1).

    Written for speed (bench/client_produce.py): a plain-bytes element costs a few appends; its
    body checks run once over all the sizes."""
    assert len(messages) == len(uniq_keys)
    check_topic(topic)
    if topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
        raise InvalidMessageError("a batch cannot go to a retry topic")
    if not messages:
        raise InvalidMessageError(f"topic {topic}: the batch is empty")
    bodies: list[bytes] = []
    properties: list[bytes] = []
    flags: list[int] = []
    for message, uniq_key in zip(messages, uniq_keys, strict=True):
        key = _UNIQ_KEY_PREFIX_BYTES + uniq_key.encode() + b"\x02"
        if type(message) is bytes:
            bodies.append(message)
            properties.append(key)
            flags.append(0)
            continue
        if not isinstance(message, Message):
            _check_body(message, body_size_bytes_max, topic)  # bytearray, memoryview, or wrong
            bodies.append(bytes(message))
            properties.append(key)
            flags.append(0)
            continue
        _check_body(message.body, body_size_bytes_max, topic)
        _check_flag(message.flag)
        if message.delay_level:
            raise InvalidMessageError("a batch cannot hold a delayed message")
        fields = _properties(message.tags, message.keys, message.properties, 0)
        bodies.append(bytes(message.body))
        properties.append(_encode_properties(fields) + key if fields else key)
        flags.append(message.flag)
    sizes = list(map(len, bodies))
    if min(sizes) == 0 or max(sizes) > body_size_bytes_max:
        for body in bodies:  # the first offender, for the message
            _check_body(body, body_size_bytes_max, topic)
    body = encode_batch_elements(bodies, properties, flags)
    if len(body) > body_size_bytes_max:
        raise InvalidMessageError(
            f"topic {topic}: the batch body is {len(body)} bytes, "
            f"over the maximum {body_size_bytes_max}"
        )
    return OutgoingMessage(
        topic, body, 0, 0, _BATCH_HEADER_PROPERTIES, ",".join(uniq_keys), True, len(bodies)
    )


def encode_plain_batch(
    topic: str,
    bodies: Sequence[bytes],
    key_head: str,
    counter_start: int,
    *,
    body_size_bytes_max: int = BODY_SIZE_BYTES_MAX_DEFAULT,
) -> OutgoingMessage:
    """encode_batch for a batch of plain bodies (bytes, nothing else), in one kernel call
    (batch_kernels.encode_plain_batch): the same checks and bytes as encode_batch given the keys
    of UniqKeyGenerator.reserve's `key_head` and `counter_start`."""
    # Imported here: numba costs a CLI command (mqbox send) a tenth of a second it never needs.
    from mqbox.client import batch_kernels

    check_topic(topic)
    if topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
        raise InvalidMessageError("a batch cannot go to a retry topic")
    count = len(bodies)
    if count == 0:
        raise InvalidMessageError(f"topic {topic}: the batch is empty")
    sizes = np.fromiter(map(len, bodies), dtype=np.int64, count=count)
    if sizes.min() == 0 or sizes.max() > body_size_bytes_max:
        for body in bodies:  # the first offender, for the message
            _check_body(body, body_size_bytes_max, topic)
    joined = b"".join(bodies)
    size_bytes = batch_kernels.plain_batch_size_bytes(len(joined), count)
    if size_bytes > body_size_bytes_max:
        raise InvalidMessageError(
            f"topic {topic}: the batch body is {size_bytes} bytes, "
            f"over the maximum {body_size_bytes_max}"
        )
    head = key_head.encode("ascii")
    assert len(head) == batch_kernels.UNIQ_KEY_HEAD_SIZE_CHARS
    out = np.empty(size_bytes, dtype=np.uint8)
    out_keys = np.empty(batch_kernels.joined_keys_size_bytes(count), dtype=np.uint8)
    written = batch_kernels.encode_plain_batch(
        np.frombuffer(joined, dtype=np.uint8),
        sizes,
        np.frombuffer(head, dtype=np.uint8),
        counter_start,
        out,
        out_keys,
    )
    assert written == size_bytes
    return OutgoingMessage(
        topic,
        out.tobytes(),
        0,
        0,
        _BATCH_HEADER_PROPERTIES,
        out_keys.tobytes().decode("ascii"),
        True,
        count,
    )


def send_request_ext(
    producer_group: str,
    message: OutgoingMessage,
    queue_id: int,
    born_timestamp_ms: int,
    *,
    default_topic: str = DEFAULT_TOPIC,
    default_topic_queue_nums: int = DEFAULT_TOPIC_QUEUE_NUMS,
) -> dict[str, str]:
    """The V2 header of one attempt: SEND_MESSAGE_V2 (310) or SEND_BATCH_MESSAGE (320). The
    same dict as SendMessageRequestHeader(...).to_ext_v2(), filled into a copy of the producer
    and topic's header, made once: a third of the cost on every send."""
    ext = _send_header_template(
        producer_group, message.topic, default_topic, default_topic_queue_nums
    ).copy()
    ext[_QUEUE_ID_KEY] = str(queue_id)
    ext[_SYS_FLAG_KEY] = str(message.sysflag)
    ext[_BORN_TIMESTAMP_KEY] = str(born_timestamp_ms)
    ext[_FLAG_KEY] = str(message.flag)
    ext[_PROPERTIES_KEY] = message.properties
    if message.batch:
        ext[_BATCH_KEY] = "true"
    if message.reconsume_times:
        ext[_RECONSUME_TIMES_KEY] = str(message.reconsume_times)
    if message.reconsume_times_max is not None:
        ext[_RECONSUME_TIMES_MAX_KEY] = str(message.reconsume_times_max)
    if message.idempotent:
        ext[SEND_IDEMPOTENT_KEY] = "true"
    return ext


_QUEUE_ID_KEY: Final = SEND_V2_KEY_BY_FIELD["queue_id"]
_SYS_FLAG_KEY: Final = SEND_V2_KEY_BY_FIELD["sys_flag"]
_BORN_TIMESTAMP_KEY: Final = SEND_V2_KEY_BY_FIELD["born_timestamp_ms"]
_FLAG_KEY: Final = SEND_V2_KEY_BY_FIELD["flag"]
_PROPERTIES_KEY: Final = SEND_V2_KEY_BY_FIELD["properties"]
_BATCH_KEY: Final = SEND_V2_KEY_BY_FIELD["batch"]
_RECONSUME_TIMES_KEY: Final = SEND_V2_KEY_BY_FIELD["reconsume_times"]
_RECONSUME_TIMES_MAX_KEY: Final = SEND_V2_KEY_BY_FIELD["max_reconsume_times"]


@functools.lru_cache(maxsize=1024)
def _send_header_template(
    producer_group: str, topic: str, default_topic: str, default_topic_queue_nums: int
) -> dict[str, str]:
    """The header of a single message to `topic` with every per-send field at 0 (callers copy
    it). Bounded: a producer sending to more topics rebuilds the ones it dropped."""
    return SendMessageRequestHeader(
        producer_group, topic, default_topic, default_topic_queue_nums, 0, 0, 0, 0, ""
    ).to_ext_v2()


def request_code(message: OutgoingMessage) -> int:
    return SEND_BATCH_CODE if message.batch else SEND_SINGLE_CODE


def read_send_response(
    response: RemotingCommand, message: OutgoingMessage, broker_name: str
) -> SendResult | None:
    """SendResult for codes 0/10/11/12 (Java's processSendResponse), None for any other code
    (the caller raises BrokerError with it). RemoteProtocolError when a stored-message answer
    lacks its fields."""
    status = _STATUS_BY_CODE.get(response.code)
    if status is None:
        return None
    answer = SendMessageResponseHeader.from_command(response)
    return SendResult(
        status,
        message.msg_id,
        answer.msg_id,
        MessageQueue(message.topic, broker_name, answer.queue_id),
        answer.queue_index,
    )
