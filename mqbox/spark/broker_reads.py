"""The connector's calls to a broker, over mqbox.client's shared pull API (mqbox/client/pull.py),
and the process-wide table of connections they go through.

Owns: BrokerReads, which binds one Transport (and the broker's name) to the calls the connector
makes: PULL without suspending, GET_MIN_OFFSET, GET_MAX_OFFSET, SEARCH_OFFSET_BY_TIMESTAMP, and
a group's offsets (QUERY_CONSUMER_OFFSET, UPDATE_CONSUMER_OFFSET answered); and `broker_reads`,
the table of them by address: a Spark Python worker runs task after task, so its connections
outlive a task, as Spark's Kafka consumers are cached per executor.

Never: decides what an answer means for the query (source.py and reading.py do: data loss,
retries, where to go on), holds a pull at the broker (no SUSPEND bit: a range is planned below
what the broker had, so a read never waits for new messages), or commits offsets on a pull (no
COMMIT_OFFSET bit).
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import Final

from mqbox.acl.signature import SessionCredentials
from mqbox.client.pull import (
    PullResult,
    max_offset,
    min_offset,
    pull_async,
    query_consumer_offset,
    search_offset,
    update_consumer_offset,
)
from mqbox.client.transport import Transport

READ_GROUP_DEFAULT: Final = "mqbox_spark"  # the consumerGroup a PULL names when none is given


class BrokerReads:
    """The connector's calls to the broker at one address (module docstring)."""

    def __init__(self, transport: Transport, broker_name: str = "") -> None:
        self.transport = transport
        self.broker_name = broker_name or transport.address

    def pull_async(
        self,
        topic: str,
        queue_id: int,
        queue_index: int,
        count_max: int,
        subscription: str = "*",
        *,
        group: str = READ_GROUP_DEFAULT,
        timeout_ms: int | None = None,
    ) -> Future[PullResult]:
        """PULL_MESSAGE (11) of up to `count_max` records from `queue_index`, filtered by tag
        hash at the broker when `subscription` is not "*", without waiting: the Future gets the
        PullResult, or BrokerError for a code that is none of the four pull statuses."""
        return pull_async(
            self.transport,
            self.broker_name,
            topic,
            queue_id,
            queue_index,
            count_max,
            group=group,
            subscription=subscription,
            timeout_ms=timeout_ms,
        )

    def min_offset(self, topic: str, queue_id: int, *, timeout_ms: int | None = None) -> int:
        """GET_MIN_OFFSET (31): the first offset still stored."""
        return min_offset(self.transport, topic, queue_id, timeout_ms=timeout_ms)

    def max_offset(self, topic: str, queue_id: int, *, timeout_ms: int | None = None) -> int:
        """GET_MAX_OFFSET (30): the next offset to be written (what a read can reach)."""
        return max_offset(self.transport, topic, queue_id, timeout_ms=timeout_ms)

    def offset_at(
        self, topic: str, queue_id: int, timestamp_ms: int, *, timeout_ms: int | None = None
    ) -> int:
        """SEARCH_OFFSET_BY_TIMESTAMP (29): the offset whose store time is nearest (RocketMQ's
        answer, not Kafka's "first at or after"; the caller corrects it)."""
        return search_offset(self.transport, topic, queue_id, timestamp_ms, timeout_ms=timeout_ms)

    def committed_offset(
        self, group: str, topic: str, queue_id: int, *, timeout_ms: int | None = None
    ) -> int | None:
        """QUERY_CONSUMER_OFFSET (14): the group's committed offset, None when it has none."""
        return query_consumer_offset(self.transport, group, topic, queue_id, timeout_ms=timeout_ms)

    def commit_offset(
        self,
        group: str,
        topic: str,
        queue_id: int,
        queue_index: int,
        *,
        timeout_ms: int | None = None,
    ) -> None:
        """UPDATE_CONSUMER_OFFSET (15), answered: the group's next offset to read."""
        update_consumer_offset(
            self.transport, group, topic, queue_id, queue_index, oneway=False, timeout_ms=timeout_ms
        )


_LOCK: Final = threading.Lock()
_BY_ADDRESS: dict[str, BrokerReads] = {}


def broker_reads(
    address: str,
    broker_name: str = "",
    timeout_ms: int = 30_000,
    credentials: SessionCredentials | None = None,
) -> BrokerReads:
    """This process's BrokerReads for `address` (and account), made on first use and kept."""
    key = address if credentials is None else f"{address} {credentials.access_key}"
    reads = _BY_ADDRESS.get(key)
    if reads is None:
        with _LOCK:
            reads = _BY_ADDRESS.get(key)
            if reads is None:
                transport = Transport(address, timeout_ms, credentials=credentials)
                reads = BrokerReads(transport, broker_name)
                _BY_ADDRESS[key] = reads
    return reads


def close_all() -> None:
    """Close every cached connection (tests; a worker's exit closes them anyway)."""
    with _LOCK:
        for reads in _BY_ADDRESS.values():
            reads.transport.close()
        _BY_ADDRESS.clear()
