"""The source's offsets: one per (topic, broker, queue), their JSON shape, and the planning of
what each read covers. Pure: no sockets, no Spark, no clock.

Owns: QueueKey, the offsets JSON (`{"topic": {"broker": {"queueId": offset}}}`, keys sorted, in
Spark's checkpoint and in the startingOffsets / endingOffsets options; docs/spark.md section 3),
QueueRange (a read of [start, end) of one queue, end exclusive, RocketMQ's "next offset to read"
meaning), `plan_ranges`, `limit_rows` (admission control: maxOffsetsPerTrigger pro-rated over
the queues) and `split_ranges` (minPartitions).

Rules:
1. In JSON options an offset of -2 means earliest and -1 latest (Kafka's); the short form
   `{"topic": {"queueId": offset}}` is read when the topic lives on one broker.
2. A queue a plan meets for the first time (new, or left out of the starting JSON) starts at its
   earliest offset; the caller resolves -2 with GET_MIN_OFFSET.
3. limit_rows gives each queue floor(limit * available / total) rows, then one more to the queues
   with the largest remainders (ties: key order), so the total is exactly the limit and the same
   inputs always give the same ends.
4. split_ranges cuts a range into ceil(size * minPartitions / total) pieces of nearly equal size,
   so there are at least minPartitions when there are that many rows.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from mqbox.errors import MqboxError

EARLIEST: Final = -2
LATEST: Final = -1

OffsetsJson = dict[str, dict[str, dict[str, int]]]


class OffsetsError(MqboxError):
    """An offsets option or checkpoint entry that does not say which queue starts where."""


@dataclasses.dataclass(frozen=True, order=True, slots=True)
class QueueKey:
    topic: str
    broker: str
    queue_id: int

    def __str__(self) -> str:
        return f"{self.topic}/{self.broker}/{self.queue_id}"


@dataclasses.dataclass(frozen=True, slots=True)
class QueueRange:
    """Offsets [start, end) of one queue; `address` is its broker's, where the read goes."""

    key: QueueKey
    start: int
    end: int
    address: str = ""

    @property
    def size(self) -> int:
        return self.end - self.start


def offsets_to_json(offsets: Mapping[QueueKey, int]) -> OffsetsJson:
    """The checkpoint's shape, every level in sorted order (Spark stores the dict as JSON text,
    so the same offsets always make the same text)."""
    document: OffsetsJson = {}
    for key in sorted(offsets):
        brokers = document.setdefault(key.topic, {})
        brokers.setdefault(key.broker, {})[str(key.queue_id)] = int(offsets[key])
    return document


def _as_document(value: str | Mapping[str, Any], what: str) -> Mapping[str, Any]:
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError as error:
            raise OffsetsError(f"{what} is not JSON: {error}") from None
        value = parsed
    if not isinstance(value, Mapping):
        raise OffsetsError(
            f'{what} must be a JSON object like {{"topic": {{"broker": {{"0": 5}}}}}}'
        )
    return value


def _offset(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < EARLIEST:
        raise OffsetsError(f"{where}: {value!r} is not an offset (>= 0, or -2 / -1)")
    return value


def _queue_id(text: str, where: str) -> int:
    try:
        queue_id = int(text)
    except ValueError:
        raise OffsetsError(f"{where}: {text!r} is not a queue id") from None
    if queue_id < 0 or str(queue_id) != text:
        raise OffsetsError(f"{where}: {text!r} is not a queue id")
    return queue_id


def offsets_from_json(
    value: str | Mapping[str, Any],
    *,
    what: str = "the offsets",
    brokers_by_topic: Mapping[str, Sequence[str]] | None = None,
) -> dict[QueueKey, int]:
    """Read the offsets JSON (rule 1). The short form needs `brokers_by_topic` (from the routes)
    to name the one broker of its topic."""
    document = _as_document(value, what)
    offsets: dict[QueueKey, int] = {}
    for topic, by_broker in document.items():
        if not isinstance(by_broker, Mapping):
            raise OffsetsError(f"{what}: topic {topic} must map brokers (or queue ids) to offsets")
        for name, inner in by_broker.items():
            if isinstance(inner, Mapping):
                for queue_text, offset in inner.items():
                    where = f"{what}: {topic}/{name}/{queue_text}"
                    key = QueueKey(topic, name, _queue_id(queue_text, where))
                    offsets[key] = _offset(offset, where)
                continue
            brokers = (brokers_by_topic or {}).get(topic, ())
            if len(brokers) != 1:
                raise OffsetsError(
                    f"{what}: topic {topic} lives on {len(brokers)} brokers "
                    f"({', '.join(brokers) or 'none known'}): name the broker, "
                    f'{{"{topic}": {{"<broker>": {{"{name}": {inner}}}}}}}'
                )
            where = f"{what}: {topic}/{name}"
            offsets[QueueKey(topic, brokers[0], _queue_id(name, where))] = _offset(inner, where)
    return offsets


def plan_ranges(
    start: Mapping[QueueKey, int],
    end: Mapping[QueueKey, int],
    addresses: Mapping[str, str] | None = None,
) -> list[QueueRange]:
    """One range per queue of `end` that has rows after its start (rule 2: 0 when `start` does
    not name it), in key order; `addresses` maps brokers to where reads go."""
    ranges: list[QueueRange] = []
    for key in sorted(end):
        first = start.get(key, 0)
        if end[key] > first:
            address = (addresses or {}).get(key.broker, "")
            ranges.append(QueueRange(key, first, end[key], address))
    return ranges


def limit_rows(
    start: Mapping[QueueKey, int], latest: Mapping[QueueKey, int], limit: int
) -> dict[QueueKey, int]:
    """The ends of a micro-batch of at most `limit` rows from `start` toward `latest` (rule 3)."""
    assert limit > 0
    available = {key: max(0, latest[key] - start.get(key, 0)) for key in latest}
    total = sum(available.values())
    if total <= limit:
        return dict(latest)
    shares = {key: limit * count // total for key, count in available.items()}
    remainders = sorted(available, key=lambda key: (-(limit * available[key] % total), key))
    for key in remainders[: limit - sum(shares.values())]:
        shares[key] += 1
    return {key: start.get(key, 0) + shares[key] for key in latest}


def split_ranges(ranges: Iterable[QueueRange], min_partitions: int | None) -> list[QueueRange]:
    """Rule 4; the ranges unchanged without minPartitions or when there are enough already."""
    listed = list(ranges)
    if not min_partitions or len(listed) >= min_partitions:
        return listed
    total = sum(piece.size for piece in listed)
    if total == 0:
        return listed
    split: list[QueueRange] = []
    for piece in listed:
        parts = min(piece.size, max(1, -(-piece.size * min_partitions // total)))
        for part in range(parts):
            first = piece.start + piece.size * part // parts
            last = piece.start + piece.size * (part + 1) // parts
            split.append(dataclasses.replace(piece, start=first, end=last))
    return split
