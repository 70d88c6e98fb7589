"""The consumers' decisions, as pure functions: where a queue starts, which queues a rebalance
drops and adds, when the next pull goes, what an orderly handler's answer does, what a reset
tells the client.

Owns (docs/client.md B.5 to B.10, and protocol.md section 4.4 for resets): ConsumeFrom and the
start-position table (B.6); the queue changes of a rebalance round (B.5); the order of the pull
loop's checks and the wait each one costs (B.7); the orderly answer's outcome, with the
reconsume limit (B.10); the reconsume limits' defaults (B.9, B.10); the consume timestamp's
forms; the RESET_CONSUMER_CLIENT_OFFSET body in both forms a broker sends. Never: sockets,
threads or clocks: callers pass what the broker said and `now_ms`, and do what is decided.
"""

from __future__ import annotations

import datetime
import enum
import json
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from mqbox.client.allocate import sort_queues
from mqbox.client.offset_store import OFFSET_NOT_FOUND
from mqbox.client.process_queue import FLOW_CONTROL_DELAY_MS, FlowControl
from mqbox.errors import ConfigError, MqboxError
from mqbox.protocol.codes import ConsumeFromWhere
from mqbox.protocol.headers import MessageQueue

# docs/client.md G.
PULL_DELAY_MS_WHEN_EXCEPTION: Final = 1_000  # pullTimeDelayMillsWhenException (ClientConfig)
PULL_DELAY_MS_WHEN_PAUSED: Final = 1_000
PULL_DELAY_MS_WHEN_BROKER_FLOW_CONTROL: Final = 20  # a 215 FLOW_CONTROL answer
OFFSET_ILLEGAL_REPAIR_DELAY_MS: Final = 10_000
CONSUME_TIMESTAMP_LOOKBACK_MS: Final = 30 * 60 * 1000  # Java: construction time - 30 min
RECONSUME_TIMES_MAX_CONCURRENT: Final = 16  # maxReconsumeTimes -1, concurrent
RECONSUME_TIMES_MAX_ORDERLY: Final = 2**31 - 1  # Integer.MAX_VALUE, orderly
SUSPEND_MS_DEFAULT: Final = 1_000  # suspendCurrentQueueTimeMillis
SUSPEND_MS_MIN: Final = 10
SUSPEND_MS_MAX: Final = 30_000
SEND_BACK_LOCAL_RETRY_DELAY_MS: Final = 5_000  # consumed again here after both sends failed
CONSUME_TIMEOUT_MS_DEFAULT: Final = 15 * 60 * 1000  # consumeTimeout
CONSUME_TIMEOUT_DELAY_LEVEL: Final = 3  # cleanExpiredMsg sends back at this level
TIMESTAMP_TEXT_FORMAT: Final = "%Y%m%d%H%M%S"  # Java's yyyyMMddHHmmss, local time


class ConsumeFrom(enum.Enum):
    """Where a group with nothing committed starts a queue (docs/client.md B.6)."""

    LAST = "last"
    FIRST = "first"
    TIMESTAMP = "timestamp"

    @property
    def where(self) -> ConsumeFromWhere:
        """The heartbeat's consumeFromWhere."""
        return _WHERE[self]


_WHERE: Final = {
    ConsumeFrom.LAST: ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET,
    ConsumeFrom.FIRST: ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
    ConsumeFrom.TIMESTAMP: ConsumeFromWhere.CONSUME_FROM_TIMESTAMP,
}


def parse_consume_from(value: str | ConsumeFrom) -> ConsumeFrom:
    if isinstance(value, ConsumeFrom):
        return value
    try:
        return ConsumeFrom(value)
    except ValueError:
        raise ConfigError(f"consume_from {value!r} is not last, first or timestamp") from None


def consume_timestamp_ms(value: int | str | datetime.datetime | None, now_ms: int) -> int:
    """The TIMESTAMP start as ms since the epoch: given as ms, as a datetime (naive means local
    time), or as Java's `yyyyMMddHHmmss` in local time; None means Java's default, 30 minutes
    before `now_ms` (the consumer's construction)."""
    if value is None:
        return now_ms - CONSUME_TIMESTAMP_LOOKBACK_MS
    if isinstance(value, datetime.datetime):
        return int(value.timestamp() * 1000)
    if isinstance(value, str):
        try:
            parsed = datetime.datetime.strptime(value, TIMESTAMP_TEXT_FORMAT)
        except ValueError:
            raise ConfigError(f"consume_timestamp {value!r} is not yyyyMMddHHmmss") from None
        return int(parsed.timestamp() * 1000)
    if value < 0:
        raise ConfigError(f"consume_timestamp {value} is negative")
    return value


def start_offset(
    stored: int,
    consume_from: ConsumeFrom,
    is_retry_topic: bool,
    *,
    max_offset: Callable[[], int],
    search_offset: Callable[[int], int],
    timestamp_ms: int,
) -> int:
    """Java's computePullFromWhereWithException (B.6): the stored offset when there is one
    (>= 0); -1 (skip the queue this round) when reading it failed (<= -2); otherwise, the broker
    having none (-1), the table's answer. `max_offset()` asks the master for GET_MAX_OFFSET,
    `search_offset(ms)` for SEARCH_OFFSET_BY_TIMESTAMP; their errors propagate (the rebalancer
    tries the queue again next round)."""
    if stored >= 0:
        return stored
    if stored != OFFSET_NOT_FOUND:
        return -1
    if consume_from is ConsumeFrom.FIRST:
        return 0
    if consume_from is ConsumeFrom.LAST:
        return 0 if is_retry_topic else max_offset()
    if is_retry_topic:
        return max_offset()
    return search_offset(timestamp_ms)


def reconsume_times_max(configured: int | None, *, orderly: bool) -> int:
    """maxReconsumeTimes: as configured, or -1's meaning (16 concurrent, unlimited orderly)."""
    if configured is not None and configured >= 0:
        return configured
    return RECONSUME_TIMES_MAX_ORDERLY if orderly else RECONSUME_TIMES_MAX_CONCURRENT


def clamp_suspend_ms(suspend_ms: int) -> int:
    """suspendCurrentQueueTimeMillis kept within [10, 30000] ms, as Java does."""
    return max(SUSPEND_MS_MIN, min(SUSPEND_MS_MAX, suspend_ms))


# --- rebalance ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class QueueChanges:
    """One topic's round of updateProcessQueueTableInRebalance: queues to drop (no longer mine,
    or not pulled for 120 s) and queues to add, each sorted as the allocation sorts."""

    drop: tuple[MessageQueue, ...]
    add: tuple[MessageQueue, ...]


def queue_changes(
    held: Mapping[MessageQueue, bool], allocated: Collection[MessageQueue]
) -> QueueChanges:
    """`held` maps each queue this client pulls to whether its pulls expired (B.5)."""
    allocated_set = frozenset(allocated)
    drop = [queue for queue, expired in held.items() if queue not in allocated_set or expired]
    add = [queue for queue in allocated_set if queue not in held]
    return QueueChanges(tuple(sort_queues(drop)), tuple(sort_queues(add)))


def queues_by_broker(queues: Iterable[MessageQueue]) -> dict[str, list[MessageQueue]]:
    """Queues grouped by broker name, each group sorted (lockAll sends one 41 per broker)."""
    grouped: dict[str, list[MessageQueue]] = {}
    for queue in sort_queues(queues):
        grouped.setdefault(queue.broker_name, []).append(queue)
    return grouped


# --- the pull loop ------------------------------------------------------------------------------


def pull_delay_ms(
    *,
    dropped: bool,
    running: bool,
    paused: bool,
    flow: FlowControl | None,
    orderly_unlocked: bool,
) -> int | None:
    """B.7's checks in Java's order: None when the queue is dropped (stop pulling it), else how
    long the next pull waits (0: pull now). `orderly_unlocked`: an orderly clustering queue
    without a live lock (check 7)."""
    if dropped:
        return None
    if not running:
        return PULL_DELAY_MS_WHEN_EXCEPTION
    if paused:
        return PULL_DELAY_MS_WHEN_PAUSED
    if flow is not None:
        return FLOW_CONTROL_DELAY_MS
    if orderly_unlocked:
        return PULL_DELAY_MS_WHEN_EXCEPTION
    return 0


# --- orderly answers ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class OrderlyOutcome:
    """What an orderly handler's answer does to the messages it was given (positions into that
    batch): commit (all consumed or dead-lettered), or retry some after `suspend_ms`."""

    commit: bool
    retry: tuple[int, ...]  # consumed again, first, after suspend_ms; their counts go up by one
    dead_letter: tuple[int, ...]  # past the reconsume limit: to %DLQ%, then counted consumed
    suspend_ms: int


def orderly_outcome(
    succeeded: bool, reconsume_times: Sequence[int], reconsume_max: int, suspend_ms: int
) -> OrderlyOutcome:
    """B.10: SUCCESS commits. SUSPEND_CURRENT_QUEUE_A_MOMENT (or a failure) sends each message
    that reached `reconsume_max` to the dead-letter queue and puts the others back, to be
    consumed again, first, after `suspend_ms` (clamped); when every message went to the DLQ the
    batch is committed. Java puts the dead-lettered ones back too, so they are dead-lettered
    again next time; here they stay consumed."""
    if succeeded:
        return OrderlyOutcome(True, (), (), 0)
    retry = tuple(at for at, times in enumerate(reconsume_times) if times < reconsume_max)
    dead = tuple(at for at, times in enumerate(reconsume_times) if times >= reconsume_max)
    return OrderlyOutcome(not retry, retry, dead, clamp_suspend_ms(suspend_ms) if retry else 0)


# --- RESET_CONSUMER_CLIENT_OFFSET (220) ---------------------------------------------------------


class ResetBodyError(MqboxError):
    """A RESET_CONSUMER_CLIENT_OFFSET body in neither form a broker sends."""


def parse_reset_offsets(body: bytes) -> dict[MessageQueue, int]:
    """The offset table of a 220 body: Java's ResetOffsetBody, whose map keys are objects (not
    JSON: `{"offsetTable":{{"brokerName":..,"queueId":..,"topic":..}:17,...}}`), or the C++
    form ResetOffsetBodyForC (`{"offsetTable":[{brokerName, offset, queueId, topic}, ...]}`)."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ResetBodyError(f"reset body is not UTF-8: {error}") from None
    try:
        document = json.loads(text)
    except json.JSONDecodeError:
        return _parse_object_keyed(text)
    table = document.get("offsetTable") if isinstance(document, dict) else None
    if isinstance(table, dict) and not table:
        return {}
    if not isinstance(table, list):
        raise ResetBodyError("reset body has no offsetTable list")
    offsets: dict[MessageQueue, int] = {}
    for entry in table:
        if not isinstance(entry, dict):
            raise ResetBodyError(f"reset entry {entry!r} is not an object")
        offsets[_queue(entry)] = _offset(entry.get("offset"))
    return offsets


_OBJECT_KEYED_PREFIX: Final = '{"offsetTable":{'


def _parse_object_keyed(text: str) -> dict[MessageQueue, int]:
    """Java's fastjson map with object keys, read key by key with the JSON decoder."""
    compact = text.strip()
    if not compact.startswith(_OBJECT_KEYED_PREFIX):
        raise ResetBodyError("reset body is neither JSON nor Java's ResetOffsetBody")
    decoder = json.JSONDecoder()
    at = len(_OBJECT_KEYED_PREFIX)
    offsets: dict[MessageQueue, int] = {}
    try:
        while compact[at] != "}":
            key, at = decoder.raw_decode(compact, at)
            if compact[at] != ":":
                raise ResetBodyError(f"reset body: no ':' at {at}")
            value, at = decoder.raw_decode(compact, at + 1)
            if not isinstance(key, dict):
                raise ResetBodyError(f"reset body: key {key!r} is not a queue")
            offsets[_queue(key)] = _offset(value)
            if compact[at] == ",":
                at += 1
        if compact[at:] != "}}":
            raise ResetBodyError("reset body: trailing text after the offset table")
    except (IndexError, json.JSONDecodeError) as error:
        raise ResetBodyError(f"reset body is cut or malformed: {error}") from None
    return offsets


def _queue(fields: dict[str, Any]) -> MessageQueue:
    topic = fields.get("topic")
    broker_name = fields.get("brokerName")
    queue_id = fields.get("queueId")
    if not isinstance(topic, str) or not isinstance(broker_name, str):
        raise ResetBodyError(f"reset entry {fields!r} lacks a topic or brokerName")
    if type(queue_id) is not int or not 0 <= queue_id < 2**31:
        raise ResetBodyError(f"reset entry {fields!r} has no valid queueId")
    return MessageQueue(topic, broker_name, queue_id)


def _offset(value: object) -> int:
    if type(value) is not int or not 0 <= value < 2**63:
        raise ResetBodyError(f"reset offset {value!r} is not a queue index")
    return value
