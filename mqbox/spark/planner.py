"""The driver's side of a read: the topics' queues and each queue's offsets, asked of the name
server and the brokers.

Owns: QueuePlanner, one ClientInstance (routes, not started: no heartbeat, no thread until a
connection is made) and the offset calls of broker_reads; turning startingOffsets /
endingOffsets / startingTimestamp into one offset per queue (rules below); committing a
consumer group's offsets.

Never: reads records for a query (reading.py does, in the executors) or keeps offsets of its
own (Spark's checkpoint holds them).

Rules (docs/spark.md section 3):
1. The queues of a topic are the readable queues of its route, on every broker that has it; a
   topic without a route is an OptionError ("does it exist?").
2. earliest = GET_MIN_OFFSET, latest = GET_MAX_OFFSET; `group` = the consumer group's committed
   offset (QUERY_CONSUMER_OFFSET), earliest where it has none; JSON: its offsets, -2 and -1 as
   earliest and latest, earliest for the queues it does not name.
3. startingTimestamp: SEARCH_OFFSET_BY_TIMESTAMP answers the offset whose store time is nearest;
   when that record was stored before the time, the next one is the first at or after it (the
   store times of a queue only grow), so each queue costs one search and one PULL of one record.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from mqbox.client.errors import ClientError
from mqbox.client.instance import ClientInstance
from mqbox.client.pull import PullStatus
from mqbox.client.pull_kernels import COLUMN_STORE_TIMESTAMP_MS
from mqbox.spark.broker_reads import BrokerReads, broker_reads
from mqbox.spark.offsets import (
    EARLIEST,
    LATEST,
    OffsetsError,
    QueueKey,
    offsets_from_json,
)
from mqbox.spark.options import OptionError, ReadOptions


class QueuePlanner:
    """Routes and offsets for one query's topics (module docstring)."""

    def __init__(self, options: ReadOptions) -> None:
        self.options = options
        self.instance = ClientInstance(
            options.namesrv_addr,
            timeout_ms=options.pull_timeout_ms,
            credentials=options.credentials,
        )
        self.addresses: dict[str, str] = {}

    def close(self) -> None:
        self.instance.shutdown()

    def queues(self) -> list[QueueKey]:
        """Every readable queue of the options' topics, in key order (rule 1)."""
        keys: list[QueueKey] = []
        for topic in self.options.topics:
            try:
                self.instance.update_route(topic)
            except ClientError as error:
                raise OptionError(f"the route of topic {topic} was not found: {error}") from None
            queues = self.instance.subscribe_queues(topic)
            if not queues:
                raise OptionError(
                    f"topic {topic} has no route on {self.options.namesrv_addr}: does it exist?"
                )
            for queue in queues:
                address = self.instance.master_address(queue.broker_name)
                if address is None:
                    raise OptionError(f"broker {queue.broker_name} of topic {topic} has no master")
                self.addresses[queue.broker_name] = address
                keys.append(QueueKey(topic, queue.broker_name, queue.queue_id))
        return sorted(keys)

    def reads(self, broker: str) -> BrokerReads:
        return broker_reads(
            self.addresses[broker], broker, self.options.pull_timeout_ms, self.options.credentials
        )

    def brokers_by_topic(self, keys: Iterable[QueueKey]) -> dict[str, list[str]]:
        found: dict[str, set[str]] = {}
        for key in keys:
            found.setdefault(key.topic, set()).add(key.broker)
        return {topic: sorted(brokers) for topic, brokers in found.items()}

    def earliest(self, keys: Iterable[QueueKey]) -> dict[QueueKey, int]:
        return {key: self.reads(key.broker).min_offset(key.topic, key.queue_id) for key in keys}

    def latest(self, keys: Iterable[QueueKey]) -> dict[QueueKey, int]:
        return {key: self.reads(key.broker).max_offset(key.topic, key.queue_id) for key in keys}

    def committed(self, group: str, keys: Iterable[QueueKey]) -> dict[QueueKey, int]:
        offsets: dict[QueueKey, int] = {}
        for key in keys:
            reads = self.reads(key.broker)
            committed = reads.committed_offset(group, key.topic, key.queue_id)
            offsets[key] = (
                reads.min_offset(key.topic, key.queue_id) if committed is None else committed
            )
        return offsets

    def resolve(
        self, spec: str | None, default: str, keys: Sequence[QueueKey], what: str
    ) -> dict[QueueKey, int]:
        """One offset per queue for an option value (rule 2); `default` when not given."""
        text = (spec if spec is not None else default).strip()
        lowered = text.lower()
        if lowered == "earliest":
            return self.earliest(keys)
        if lowered == "latest":
            return self.latest(keys)
        if lowered == "group":
            assert self.options.consumer_group is not None
            return self.committed(self.options.consumer_group, keys)
        try:
            given = offsets_from_json(text, what=what, brokers_by_topic=self.brokers_by_topic(keys))
        except OffsetsError as error:
            raise OptionError(str(error)) from None
        unknown = sorted(set(given) - set(keys))
        if unknown:
            raise OptionError(f"{what} names queues the topics do not have: {unknown[0]}")
        offsets: dict[QueueKey, int] = {}
        for key in keys:
            offset = given.get(key, EARLIEST)
            if offset == EARLIEST:
                offset = self.reads(key.broker).min_offset(key.topic, key.queue_id)
            elif offset == LATEST:
                offset = self.reads(key.broker).max_offset(key.topic, key.queue_id)
            offsets[key] = offset
        return offsets

    def at_timestamp(self, timestamp_ms: int, keys: Sequence[QueueKey]) -> dict[QueueKey, int]:
        """The first offset stored at or after `timestamp_ms` in each queue (rule 3)."""
        offsets: dict[QueueKey, int] = {}
        for key in keys:
            reads = self.reads(key.broker)
            nearest = reads.offset_at(key.topic, key.queue_id, timestamp_ms)
            end = reads.max_offset(key.topic, key.queue_id)
            offset = min(nearest, end)
            if offset < end:
                answer = reads.pull_async(key.topic, key.queue_id, offset, 1).result()
                if answer.status is PullStatus.FOUND:
                    table = answer.batch.table
                    stored_ms = table[COLUMN_STORE_TIMESTAMP_MS]
                    if stored_ms.size and int(np.int64(stored_ms[0])) < timestamp_ms:
                        offset += 1
            offsets[key] = offset
        return offsets

    def starting(self, keys: Sequence[QueueKey], default: str) -> dict[QueueKey, int]:
        options = self.options
        if options.starting_timestamp_ms is not None:
            return self.at_timestamp(options.starting_timestamp_ms, keys)
        return self.resolve(options.starting_offsets, default, keys, "startingOffsets")

    def commit(self, group: str, offsets: Mapping[QueueKey, int]) -> None:
        """UPDATE_CONSUMER_OFFSET of every queue, so `mqbox offset show` shows the query's lag."""
        for key, offset in offsets.items():
            if key.broker in self.addresses:
                self.reads(key.broker).commit_offset(group, key.topic, key.queue_id, offset)
