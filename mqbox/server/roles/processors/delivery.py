"""How a message changes on its way through delay levels, retry and the dead-letter queue.

Owns the rewrites of docs/protocol.md section 9, as pure functions over message.py's types:
- `route_delayed`: a message with DELAY > 0 (transaction type NOT or COMMIT) is stored under
  SCHEDULE_TOPIC_XXXX, queue level - 1, with REAL_TOPIC and REAL_QID saved and the level cut to
  the highest configured one (Java's CommitLog.putMessage);
- `route_from_schedule`: the message a due schedule entry delivers to REAL_TOPIC / REAL_QID
  (Java's ScheduleMessageService.messageTimeup);
- `send_back_message`: the message CONSUMER_SEND_MSG_BACK (36) stores for a failed one: to
  `%RETRY%<group>` with a delay level, or to `%DLQ%<group>` (Java's consumerSendMsgBack);
- `dead_letter_topic`: where a direct send to `%RETRY%<group>` past its limit goes instead
  (Java's SendMessageProcessor.handleRetryAndDLQ);
- `send_back_topics`: the topics a record sent back counts as (its own, and RETRY_TOPIC for a
  retried one), which the send processor checks against the group's before copying it.
The send processor and the schedule role (schedule.py) call them; the dispatcher puts the
delivery time (store time + the level's delay) into the consume-queue entry's tag field.

Never: I/O, clocks or randomness (callers pass queue ids and ids), topic configuration, or a
property it was not asked to change. Properties are handled as bytes (message.decode_properties),
so values that are not UTF-8 survive unchanged; the properties string is written anew, in the
order it was read with new names last (order carries no meaning, section 5.3).

Two choices where Java's bytes and its intent differ:
- Java 4.x serialises a delivered message's properties before it clears DELAY, so its stored
  copy keeps DELAY, REAL_TOPIC and REAL_QID (and routing ignores them). mqbox removes the three,
  which is what Java's code means to do: a delivered message then carries no stale level, and a
  later send-back of it cannot be delayed twice.
- The send-back sets WAIT=false, as Java's does, so the stored retry message says so too.

Errors: bad input from a client or the store (a DELAY that is not an integer, a schedule record
without a usable REAL_TOPIC / REAL_QID, a topic name too long) raises MessageIllegalError.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Final

from mqbox.errors import MessageIllegalError
from mqbox.message import (
    PROPERTY_DELAY,
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_RETRY_TOPIC,
    PROPERTY_WAIT,
    SYSFLAG_TRANSACTION_COMMIT_TYPE,
    SYSFLAG_TRANSACTION_MASK,
    SYSFLAG_TRANSACTION_NOT_TYPE,
    MessageToStore,
    StoredMessage,
    decode_properties,
    encode_properties,
    encode_topic,
)
from mqbox.server.roles.processors.topics import (
    DLQ_GROUP_TOPIC_PREFIX,
    RETRY_GROUP_TOPIC_PREFIX,
    SCHEDULE_TOPIC,
    TRANS_HALF_TOPIC,
)

DLQ_QUEUE_COUNT: Final = 1  # Java's DLQ_NUMS_PER_GROUP
# CONSUMER_SEND_MSG_BACK with delayLevel 0: the broker picks 3 + reconsumeTimes (10 s first).
SEND_BACK_DELAY_LEVEL_BASE: Final = 3
RECONSUME_TIMES_MAX_DEFAULT: Final = 16  # a subscription group's retryMaxTimes

_DELAY: Final = PROPERTY_DELAY.encode()
_REAL_TOPIC: Final = PROPERTY_REAL_TOPIC.encode()
_REAL_QUEUE_ID: Final = PROPERTY_REAL_QUEUE_ID.encode()
_RETRY_TOPIC: Final = PROPERTY_RETRY_TOPIC.encode()
_ORIGIN_MESSAGE_ID: Final = PROPERTY_ORIGIN_MESSAGE_ID.encode()
_WAIT: Final = PROPERTY_WAIT.encode()
_FALSE: Final = b"false"
# Java's Integer.parseInt: an optional sign and ASCII digits, nothing else (no spaces, no "_").
_JAVA_INT: Final = re.compile(rb"[+-]?[0-9]+")
_INT32_MIN: Final = -(2**31)
_INT32_MAX: Final = 2**31 - 1
_SCHEDULED_TRANSACTION_TYPES: Final = frozenset(
    {SYSFLAG_TRANSACTION_NOT_TYPE, SYSFLAG_TRANSACTION_COMMIT_TYPE}
)
# Topics a schedule entry must never deliver to: itself (a loop), and a transaction's half
# messages (Java discards such an entry as a bug).
_UNDELIVERABLE_TOPICS: Final = frozenset({SCHEDULE_TOPIC, TRANS_HALF_TOPIC})


def java_int(value: bytes, what: str) -> int:
    """`value` read as Java's Integer.parseInt reads it; MessageIllegalError if it would throw."""
    if _JAVA_INT.fullmatch(value) is None:
        raise MessageIllegalError(f"{what} {value[:40]!r} is not an integer")
    number = int(value)
    if not _INT32_MIN <= number <= _INT32_MAX:
        raise MessageIllegalError(f"{what} {value[:40]!r} is out of the int range")
    return number


def delay_level_of(properties: Mapping[bytes, bytes]) -> int:
    """The DELAY level of decoded properties; 0 without one (Message.getDelayTimeLevel)."""
    value = properties.get(_DELAY)
    if value is None:
        return 0
    return java_int(value, "the DELAY property")


def is_schedulable(sysflag: int) -> bool:
    """True for the transaction types a delay applies to (NOT and COMMIT, not PREPARED or
    ROLLBACK), as Java's CommitLog decides."""
    return sysflag & SYSFLAG_TRANSACTION_MASK in _SCHEDULED_TRANSACTION_TYPES


def route_delayed(message: MessageToStore, level_count: int) -> MessageToStore:
    """`message` as the commit log stores it: unchanged without a DELAY > 0 or with a
    transaction type that takes no delay; otherwise under SCHEDULE_TOPIC_XXXX, queue
    level - 1, with REAL_TOPIC and REAL_QID naming where it goes when due, and a level above
    `level_count` (the configured levels) cut to the highest (DELAY rewritten, as Java does).
    MessageIllegalError for a DELAY that is not an integer."""
    assert level_count > 0
    properties = decode_properties(message.properties)
    level = delay_level_of(properties)
    if level <= 0 or not is_schedulable(message.sysflag):
        return message
    if level > level_count:
        level = level_count
        properties[_DELAY] = str(level).encode()
    properties[_REAL_TOPIC] = encode_topic(message.topic)
    properties[_REAL_QUEUE_ID] = str(message.queue_id).encode()
    return dataclasses.replace(
        message,
        topic=SCHEDULE_TOPIC,
        queue_id=level - 1,
        properties=encode_properties(properties),
    )


def route_from_schedule(stored: StoredMessage) -> MessageToStore:
    """The message a due entry of SCHEDULE_TOPIC_XXXX delivers: topic and queue from REAL_TOPIC
    and REAL_QID; DELAY, REAL_TOPIC and REAL_QID removed (module docstring); body, flag,
    sysflag, born time and host, reconsume times and every other property as stored.
    MessageIllegalError when REAL_TOPIC or REAL_QID is missing or unusable, or names the
    schedule topic itself or the transaction half topic."""
    properties = decode_properties(stored.properties)
    real_topic = properties.pop(_REAL_TOPIC, None)
    real_queue_id = properties.pop(_REAL_QUEUE_ID, None)
    properties.pop(_DELAY, None)
    if real_topic is None or real_queue_id is None:
        raise MessageIllegalError("a schedule record without REAL_TOPIC or REAL_QID")
    try:
        topic = real_topic.decode("utf-8")
    except UnicodeDecodeError:
        raise MessageIllegalError(f"REAL_TOPIC {real_topic[:40]!r} is not UTF-8") from None
    encode_topic(topic)  # MessageIllegalError if empty or over 127 bytes
    if topic in _UNDELIVERABLE_TOPICS:
        raise MessageIllegalError(f"a schedule record for {topic}, which takes no deliveries")
    queue_id = java_int(real_queue_id, "REAL_QID")
    if queue_id < 0:
        raise MessageIllegalError(f"REAL_QID {queue_id} is negative")
    return MessageToStore(
        topic,
        queue_id,
        stored.body,
        encode_properties(properties),
        stored.flag,
        stored.sysflag,
        stored.born_timestamp_ms,
        stored.born_host,
        stored.reconsume_times,
    )


def send_back_message(
    stored: StoredMessage,
    *,
    group: str,
    delay_level: int,
    reconsume_times_max: int,
    retry_queue_id: int,
    origin_msg_id: str,
) -> MessageToStore:
    """What CONSUMER_SEND_MSG_BACK stores for `stored`, the record a consumer of `group` failed
    to consume (before `route_delayed`, which the caller applies next):
    - to `%DLQ%<group>`, queue 0, when its reconsume times reached `reconsume_times_max` or
      `delay_level` < 0; otherwise to `%RETRY%<group>`, queue `retry_queue_id`, with DELAY =
      `delay_level`, or 3 + its reconsume times when `delay_level` is 0;
    - RETRY_TOPIC = its topic unless it has one; ORIGIN_MESSAGE_ID = `origin_msg_id` (its offset
      msgId) unless it has a non-empty one; WAIT=false; reconsume times + 1;
    - body, flag, sysflag, born time and host and every other property as stored."""
    assert retry_queue_id >= 0
    properties = decode_properties(stored.properties)
    if _RETRY_TOPIC not in properties:
        properties[_RETRY_TOPIC] = encode_topic(stored.topic)
    properties[_WAIT] = _FALSE
    if stored.reconsume_times >= reconsume_times_max or delay_level < 0:
        topic = DLQ_GROUP_TOPIC_PREFIX + group
        queue_id = 0
    else:
        topic = RETRY_GROUP_TOPIC_PREFIX + group
        queue_id = retry_queue_id
        if delay_level == 0:
            delay_level = SEND_BACK_DELAY_LEVEL_BASE + stored.reconsume_times
        properties[_DELAY] = str(delay_level).encode()
    if not properties.get(_ORIGIN_MESSAGE_ID):
        properties[_ORIGIN_MESSAGE_ID] = origin_msg_id.encode("ascii")
    return MessageToStore(
        topic,
        queue_id,
        stored.body,
        encode_properties(properties),
        stored.flag,
        stored.sysflag,
        stored.born_timestamp_ms,
        stored.born_host,
        stored.reconsume_times + 1,
    )


def send_back_topics(stored: StoredMessage) -> tuple[str, ...]:
    """The topics a record sent back with CONSUMER_SEND_MSG_BACK counts as: its own, and for a
    retried one (stored under a `%RETRY%` topic) the topic it was first sent to, from its
    RETRY_TOPIC property. The send processor lets a group send a record back only when one of
    them is a topic the group consumes (group_topics.py)."""
    if not stored.topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
        return (stored.topic,)
    original = decode_properties(stored.properties).get(_RETRY_TOPIC)
    if not original:
        return (stored.topic,)
    return (stored.topic, original.decode("utf-8", "replace"))


def dead_letter_topic(topic: str, reconsume_times: int, reconsume_times_max: int) -> str | None:
    """`%DLQ%<group>` when a SEND to `topic` = `%RETRY%<group>` carries reconsume times that
    reached the limit, else None (the send goes where it asked)."""
    if not topic.startswith(RETRY_GROUP_TOPIC_PREFIX) or reconsume_times < reconsume_times_max:
        return None
    return DLQ_GROUP_TOPIC_PREFIX + topic.removeprefix(RETRY_GROUP_TOPIC_PREFIX)
