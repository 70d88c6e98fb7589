"""A consumer group's offsets in this client: Java's RemoteBrokerOffsetStore (clustering) and
LocalFileOffsetStore (broadcasting), over offset_store.OffsetTable.

Owns (docs/client.md B.8): the table of offsets this client committed, under one lock (pull
callbacks, consume threads and the scheduler all touch it), reading a queue's offset from the
store (QUERY_CONSUMER_OFFSET, or the local file), and persisting (UPDATE_CONSUMER_OFFSET to the
queue's master, or the local file written atomically). Never: deciding what to commit (the
consumers' in-flight tables do) or when (their timers).

Rules:

1. `update` never blocks on I/O: it changes memory only, once per consumed batch.
2. Reading from the store: an offset (>= 0); -1 when the store has none (the broker answered
   22, or the file lacks the queue); -2 when asking failed (no address, a timeout): the caller
   skips the queue this round (B.6).
3. `persist_all(assigned)` sends every held offset of an assigned queue (changed or not) and
   forgets the others, as Java's persistAll. Remote: one UPDATE_CONSUMER_OFFSET per queue, all
   sent at once and awaited together within the timeout (Java sends them oneway; awaiting them
   lets a failure be counted and logged, and a shutdown know its offsets arrived). Local: the
   file is rewritten with those offsets.
4. Addresses: the master of the queue's broker (findBrokerAddressInSubscribe(name, 0, true));
   without one, the topic's route is asked again, then any address of the broker.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Collection, Iterable
from concurrent.futures import Future, wait
from pathlib import Path
from typing import Final

from mqbox.client.errors import ClientError, NoRouteError, RemotingTimeoutError
from mqbox.client.instance import ClientInstance
from mqbox.client.offset_store import (
    OFFSET_FETCH_FAILED,
    OFFSET_NOT_FOUND,
    OffsetFileError,
    OffsetTable,
    ReadOffsetType,
    fetch_local_offset,
    persist_local_offsets,
    read_offsets_file,
)
from mqbox.client.pull import query_consumer_offset
from mqbox.client.route_table import MASTER_ID
from mqbox.client.transport import Transport
from mqbox.protocol.codes import RequestCode, ResponseCode
from mqbox.protocol.command import RemotingCommand
from mqbox.protocol.headers import MessageQueue, UpdateConsumerOffsetRequestHeader

log = logging.getLogger("mqbox.client.consumer_offsets")

PERSIST_INTERVAL_MS: Final = 5_000  # persistConsumerOffsetInterval
PERSIST_INITIAL_DELAY_MS: Final = 10_000  # Java's first persistence, after start
_ANSWER_SLACK_S: Final = 0.25
_UPDATE_CODE: Final = int(RequestCode.UPDATE_CONSUMER_OFFSET)


class OffsetStore:
    """The offsets one consumer group committed here (module docstring); thread-safe."""

    def __init__(self, group: str, instance: ClientInstance) -> None:
        self.group: Final = group
        self.instance: Final = instance
        self._lock = threading.Lock()
        self._table = OffsetTable()
        self.persisted = 0  # offsets the store acknowledged (or wrote)
        self.persist_failures = 0

    # -- memory (rule 1) --------------------------------------------------------------------------

    def update(self, queue: MessageQueue, offset: int, increase_only: bool) -> None:
        with self._lock:
            self._table.update(queue, offset, increase_only)

    def read_memory(self, queue: MessageQueue) -> int:
        """The offset held for `queue`, -1 when none."""
        with self._lock:
            return self._table.read_memory(queue)

    def remove(self, queue: MessageQueue) -> None:
        with self._lock:
            self._table.remove(queue)

    def snapshot(self, queues: Iterable[MessageQueue] | None = None) -> dict[MessageQueue, int]:
        with self._lock:
            return self._table.snapshot(queues)

    # -- the store ----------------------------------------------------------------------------

    def read_store(self, queue: MessageQueue) -> int:
        """Rule 2; the answer is held in memory too."""
        fetched = self._fetch(queue)
        with self._lock:
            if fetched is None:
                return OFFSET_NOT_FOUND
            if fetched < 0:
                return OFFSET_FETCH_FAILED
            return self._table.read(queue, ReadOffsetType.READ_FROM_STORE, lambda _: fetched)

    def _fetch(self, queue: MessageQueue) -> int | None:
        """The store's offset, None when it has none, -2 when asking failed."""
        raise NotImplementedError

    def persist_all(self, assigned: Collection[MessageQueue], timeout_ms: int) -> int:
        """Rule 3; how many offsets failed to persist."""
        raise NotImplementedError

    def persist(self, queue: MessageQueue, timeout_ms: int) -> bool:
        """Persist one queue's held offset (a queue leaving this client); True when stored."""
        with self._lock:
            offsets = self._table.snapshot((queue,))
        if not offsets:
            return True
        return self._persist(offsets, timeout_ms) == 0

    def _persist(self, offsets: dict[MessageQueue, int], timeout_ms: int) -> int:
        raise NotImplementedError


class RemoteOffsetStore(OffsetStore):
    """CLUSTERING: offsets live on the brokers."""

    def _address(self, queue: MessageQueue) -> str:
        """Rule 4; NoRouteError without any address."""
        found = self.instance.subscribe_address(queue.broker_name, MASTER_ID, True)
        if found is None:
            self.instance.update_route(queue.topic)
            found = self.instance.subscribe_address(queue.broker_name, MASTER_ID, False)
        if found is None:
            raise NoRouteError(queue.topic, f"broker {queue.broker_name} has no address")
        return found[0]

    def _fetch(self, queue: MessageQueue) -> int | None:
        try:
            transport = self.instance.transport(self._address(queue))
            return query_consumer_offset(
                transport, self.group, queue.topic, queue.queue_id, timeout_ms=None
            )
        except ClientError as error:
            log.warning("%s: reading the offset of %s failed: %s", self.group, queue, error)
            return OFFSET_FETCH_FAILED

    def persist_all(self, assigned: Collection[MessageQueue], timeout_ms: int) -> int:
        with self._lock:
            offsets = dict(self._table.offsets_to_persist(assigned))
        return self._persist(offsets, timeout_ms) if offsets else 0

    def _persist(self, offsets: dict[MessageQueue, int], timeout_ms: int) -> int:
        pending: dict[MessageQueue, tuple[str, Future[RemotingCommand]]] = {}
        failures = 0
        for queue, offset in offsets.items():
            try:
                transport: Transport = self.instance.transport(self._address(queue))
            except ClientError as error:
                log.warning(
                    "%s: offset %d of %s not persisted: %s", self.group, offset, queue, error
                )
                failures += 1
                continue
            ext = UpdateConsumerOffsetRequestHeader(
                self.group, queue.topic, queue.queue_id, offset
            ).to_ext()
            pending[queue] = (
                transport.address,
                transport.invoke_async(_UPDATE_CODE, ext, b"", timeout_ms),
            )
        wait([future for _, future in pending.values()], timeout_ms / 1000 + _ANSWER_SLACK_S)
        for queue, (address, future) in pending.items():
            problem: str | None = None
            if not future.done():
                problem = str(RemotingTimeoutError("no answer in time", address))
            elif (failure := future.exception()) is not None:
                if not isinstance(failure, ClientError):
                    raise failure  # a bug, not a broker's answer
                problem = str(failure)
            elif future.result().code != ResponseCode.SUCCESS:
                response = future.result()
                problem = f"{address}: answered {response.code}: {response.remark}"
            if problem is None:
                self.persisted += 1
            else:
                failures += 1
                log.warning("%s: offset of %s not persisted: %s", self.group, queue, problem)
        self.persist_failures += failures
        return failures


class LocalOffsetStore(OffsetStore):
    """BROADCASTING: offsets live in this host's file (offset_store.py), read at start."""

    def __init__(self, group: str, instance: ClientInstance, path: Path) -> None:
        super().__init__(group, instance)
        self.path: Final = path

    def load(self) -> None:
        """LocalFileOffsetStore.load: hold every offset of the file. Raises OffsetFileError for
        a damaged file without a usable .bak (offset_store.py), rather than start over."""
        offsets = read_offsets_file(self.path)
        with self._lock:
            self._table.load(offsets)

    def _fetch(self, queue: MessageQueue) -> int | None:
        return fetch_local_offset(self.path, queue)

    def persist_all(self, assigned: Collection[MessageQueue], timeout_ms: int) -> int:
        with self._lock:
            try:
                persist_local_offsets(self.path, self._table, assigned)
            except OffsetFileError as error:
                log.warning("%s: %s", self.group, error)
                self.persist_failures += 1
                return 1
            self.persisted += len(assigned)
            return 0

    def _persist(self, offsets: dict[MessageQueue, int], timeout_ms: int) -> int:
        # The file holds every queue: one queue is persisted by writing them all.
        with self._lock:
            assigned = set(self._table.snapshot())
        return self.persist_all(assigned, timeout_ms)
