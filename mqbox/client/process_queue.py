"""ProcessQueue: one consumed queue's messages between pull and acknowledgement.

Owns: Java 4.9.7's ProcessQueue (docs/client.md B.5, B.7, B.9, B.10) as a single-owner
table: the messages pulled and not yet acknowledged, by queue index; their count and body bytes
for flow control; the offset a consumer may commit; the orderly "consuming" set with commit,
rollback and make_message_to_consume_again; the dropped flag, the lock flag and the pull,
consume and lock timestamps with their expiry rules.

Never: threads, locks, clocks or I/O. Java guards the table with a read/write lock because a
pull thread and consume threads share it; here the caller serialises access (one owner thread,
or its own lock), and passes `now_ms` (wall-clock ms) to every method that stamps or checks time.

Rules:

1. The committed offset never passes a message still being consumed: remove() answers the
   smallest queue index still cached, or one past the largest index ever cached when nothing is,
   or -1 when nothing was cached before the call (commit nothing). While pulls bring increasing
   queue indexes (as brokers send them), its answers never decrease.
2. cached_count and cached_size_bytes cover every message put and not yet removed or committed,
   orderly "consuming" messages included, as Java's msgCount and msgSize do. Sizes are the stored
   (possibly compressed) body sizes: bodies are inflated lazily (pull_decode.py), whereas Java
   counts inflated bodies. Flow control compares them with thresholds, so this only shifts when a
   queue of compressed messages pauses.
3. Orderly: take() moves the smallest cached messages to "consuming"; commit() forgets them and
   answers the largest of them + 1 (never past a message put back and waiting); rollback() and
   make_message_to_consume_again() put them back, so they are taken again, first.
4. `queue_offset_max` is the largest index ever put. Java keeps the last newly put index, which
   is the same while indexes increase; the maximum keeps rule 1 true if they ever do not.

Data structure: Java's TreeMap becomes a dict (index -> message) plus a sorted list of indexes
with lazy deletion: an index in the list is live when the dict holds it. Appending an increasing
index is O(1), acknowledgement is a dict pop, and the first and last live indexes are found by
skipping dead entries from either end (each skipped once), so a pull-and-acknowledge round costs
O(1) per message. `check_invariants()` states the structure's invariants; tests call it after
every operation.
"""

from __future__ import annotations

import bisect
import enum
import itertools
import operator
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final, Generic, Protocol, TypeVar

# Java's ProcessQueue constants (system properties rocketmq.client.rebalance.lockMaxLiveTime,
# rocketmq.client.rebalance.lockInterval and rocketmq.client.pull.pullMaxIdleTime).
LOCK_MAX_LIVE_TIME_MS: Final = 30_000  # the client's lock counts as expired after this
LOCK_INTERVAL_MS: Final = 20_000  # lockAll renews every orderly queue's lock this often
PULL_MAX_IDLE_TIME_MS: Final = 120_000  # a push queue not pulled for this long is dropped
# cleanExpiredMsg looks at this many of the oldest messages per pass (concurrent only).
EXPIRED_SCAN_COUNT_MAX: Final = 16

# Flow control (DefaultMQPushConsumer defaults, B.7 checks 4 to 6): past one of these, the next
# pull of the queue waits FLOW_CONTROL_DELAY_MS.
PULL_THRESHOLD_COUNT_DEFAULT: Final = 1_000  # pullThresholdForQueue
PULL_THRESHOLD_SIZE_MIB_DEFAULT: Final = 100  # pullThresholdSizeForQueue, compared in whole MiB
CONSUME_MAX_SPAN_DEFAULT: Final = 2_000  # consumeConcurrentlyMaxSpan
FLOW_CONTROL_DELAY_MS: Final = 50
MIB: Final = 1024 * 1024

_COMPACT_HEAD_MIN: Final = 256  # dead entries at the front before the list is compacted


def _strictly_increasing(indexes: list[int]) -> bool:
    return indexes == sorted(indexes) and len(set(indexes)) == len(indexes)


class CachedMessage(Protocol):
    """What a ProcessQueue needs of a message: its queue index and body size."""

    @property
    def queue_index(self) -> int: ...

    @property
    def body_size_bytes(self) -> int: ...


M = TypeVar("M", bound=CachedMessage)
_QUEUE_INDEX: Final = operator.attrgetter("queue_index")
_BODY_SIZE_BYTES: Final = operator.attrgetter("body_size_bytes")


class FlowControl(enum.Enum):
    """Why the next pull of a queue waits FLOW_CONTROL_DELAY_MS (Java's checks 4 to 6)."""

    COUNT = "cached message count over pullThresholdForQueue"
    SIZE = "cached MiB over pullThresholdSizeForQueue"
    SPAN = "cached queue index span over consumeConcurrentlyMaxSpan"


def flow_control_verdict(
    count: int,
    size_bytes: int,
    span: int,
    *,
    count_max: int,
    size_mib_max: int,
    span_max: int,
) -> FlowControl | None:
    """Java's checks 4 to 6, in order, over a queue's cached count, bytes and index span."""
    if count > count_max:
        return FlowControl.COUNT
    if size_bytes // MIB > size_mib_max:
        return FlowControl.SIZE
    if span > span_max:
        return FlowControl.SPAN
    return None


@dataclass(frozen=True, slots=True)
class ProcessQueueStatistics:
    """A snapshot for status views (Java's ProcessQueueInfo)."""

    cached_count: int
    cached_size_bytes: int
    cached_queue_index_min: int | None
    cached_queue_index_max: int | None
    consuming_count: int
    queue_offset_max: int
    dropped: bool
    locked: bool
    last_pull_timestamp_ms: int
    last_consume_timestamp_ms: int
    last_lock_timestamp_ms: int
    try_unlock_times: int


class ProcessQueue(Generic[M]):
    """The in-flight table of one message queue; see the module docstring for its rules."""

    __slots__ = (
        "_consume_started_ms",
        "_consuming",
        "_count",
        "_head",
        "_messages",
        "_order",
        "_size_bytes",
        "accumulated_count",
        "consuming",
        "dropped",
        "last_consume_timestamp_ms",
        "last_lock_timestamp_ms",
        "last_pull_timestamp_ms",
        "locked",
        "queue_offset_max",
        "try_unlock_times",
    )

    def __init__(self, now_ms: int) -> None:
        self._messages: dict[int, M] = {}  # Java's msgTreeMap, ordered by _order
        self._order: list[int] = []  # sorted; live entries are keys of _messages
        self._head = 0  # _order[:_head] is all dead
        self._consuming: dict[int, M] = {}  # orderly: taken, not yet committed
        self._consume_started_ms: dict[int, int] = {}  # concurrent: for consume timeouts
        self._count = 0
        self._size_bytes = 0
        self.queue_offset_max = 0
        self.accumulated_count = 0  # msgAccCnt: broker max offset - last pulled index
        self.consuming = False  # orderly: a consume task is already submitted for this queue
        self.dropped = False
        self.locked = False
        self.try_unlock_times = 0
        self.last_pull_timestamp_ms = now_ms
        self.last_consume_timestamp_ms = now_ms
        self.last_lock_timestamp_ms = now_ms

    # --- Counts -------------------------------------------------------------------------------

    @property
    def cached_count(self) -> int:
        """Messages put and not yet removed or committed (rule 2)."""
        return self._count

    @property
    def cached_size_bytes(self) -> int:
        """Their stored body bytes (rule 2)."""
        return self._size_bytes

    def first_queue_index(self) -> int | None:
        """The smallest cached index not being consumed (TreeMap.firstKey), None if none."""
        order = self._order
        messages = self._messages
        if not messages:  # everything in _order is dead: drop it at C speed
            order.clear()
            self._head = 0
            return None
        head = self._head
        while head < len(order) and order[head] not in messages:
            head += 1
        if head >= _COMPACT_HEAD_MIN and head * 2 >= len(order):
            del order[:head]
            head = 0
        self._head = head
        return order[head] if head < len(order) else None

    def last_queue_index(self) -> int | None:
        """The largest cached index not being consumed (TreeMap.lastKey), None if none."""
        order = self._order
        messages = self._messages
        while order and order[-1] not in messages:
            order.pop()
        self._head = min(self._head, len(order))
        return order[-1] if order else None

    def max_span(self) -> int:
        """last - first cached index (Java's getMaxSpan), 0 when nothing is cached."""
        first = self.first_queue_index()
        if first is None:
            return 0
        last = self.last_queue_index()
        assert last is not None
        return last - first

    def has_temp_message(self) -> bool:
        """True when messages wait to be consumed (orderly: not yet taken)."""
        return bool(self._messages)

    # --- Pull side ----------------------------------------------------------------------------

    def put(self, messages: Sequence[M], max_offset: int | None = None) -> bool:
        """Cache pulled `messages`; True when an orderly consume task should be submitted.

        An index already cached is replaced and not counted again (Java's TreeMap put); one that
        is being consumed (orderly) is ignored. `max_offset` is the pull response's maxOffset;
        it sets accumulated_count from the last message, as Java does with MAX_OFFSET.
        """
        messages_by_index = self._messages
        indexes = list(map(_QUEUE_INDEX, messages))
        if indexes and indexes[0] > self.queue_offset_max and _strictly_increasing(indexes):
            # The common case, a pull past everything cached so far, at C speed: new indexes
            # above queue_offset_max are in neither table, and they extend _order in order.
            messages_by_index.update(zip(indexes, messages, strict=True))
            self._order.extend(indexes)
            self._count += len(indexes)
            self._size_bytes += sum(map(_BODY_SIZE_BYTES, messages))
            self.queue_offset_max = indexes[-1]
            messages = ()
        for message in messages:
            queue_index = message.queue_index
            if queue_index in messages_by_index:
                messages_by_index[queue_index] = message
                continue
            if queue_index in self._consuming:
                continue
            messages_by_index[queue_index] = message
            self._count += 1
            self._size_bytes += message.body_size_bytes
            if queue_index > self.queue_offset_max:
                self.queue_offset_max = queue_index
            self._insert_order(queue_index)
        if max_offset is not None and indexes:
            accumulated = max_offset - indexes[-1]
            if accumulated > 0:
                self.accumulated_count = accumulated
        if messages_by_index and not self.consuming:
            self.consuming = True
            return True
        return False

    def _insert_order(self, queue_index: int) -> None:
        order = self._order
        if not order or queue_index > order[-1]:
            order.append(queue_index)
            return
        at = bisect.bisect_left(order, queue_index)
        if at == len(order) or order[at] != queue_index:
            order.insert(at, queue_index)
        # else: a dead entry of the same index comes back to life where it is.
        if at < self._head:
            self._head = at  # everything between is dead: the head only ever passes dead ones

    def mark_pulled(self, now_ms: int) -> None:
        """Stamp a pull request taken for this queue (Java sets lastPullTimestamp then)."""
        self.last_pull_timestamp_ms = now_ms

    def is_pull_expired(self, now_ms: int) -> bool:
        """True when no pull for more than 120 s: rebalance drops the push queue."""
        return now_ms - self.last_pull_timestamp_ms > PULL_MAX_IDLE_TIME_MS

    def flow_control(
        self,
        *,
        orderly: bool,
        count_max: int = PULL_THRESHOLD_COUNT_DEFAULT,
        size_mib_max: int = PULL_THRESHOLD_SIZE_MIB_DEFAULT,
        span_max: int = CONSUME_MAX_SPAN_DEFAULT,
    ) -> FlowControl | None:
        """Why the next pull must wait FLOW_CONTROL_DELAY_MS, or None; checks in Java's order.

        The span check is for concurrent consumers only (orderly ones consume in order anyway).
        """
        return flow_control_verdict(
            self._count,
            self._size_bytes,
            0 if orderly else self.max_span(),
            count_max=count_max,
            size_mib_max=size_mib_max,
            span_max=span_max,
        )

    # --- Concurrent consumption ---------------------------------------------------------------

    def remove(self, queue_indexes: Iterable[int], now_ms: int) -> int:
        """Forget acknowledged messages; the offset to commit (rule 1), -1 for none.

        Indexes not cached are ignored (a message acknowledged twice, or by a stale task).
        """
        self.last_consume_timestamp_ms = now_ms
        messages = self._messages
        if not messages:
            return -1
        if self._consume_started_ms:
            queue_indexes = list(queue_indexes)
            started_ms_pop = self._consume_started_ms.pop
            for _ in map(started_ms_pop, queue_indexes, itertools.repeat(None)):
                pass
        removed = [
            message
            for message in map(messages.pop, queue_indexes, itertools.repeat(None))
            if message is not None
        ]
        self._count -= len(removed)
        self._size_bytes -= sum(map(_BODY_SIZE_BYTES, removed))
        first = self.first_queue_index()
        return self.queue_offset_max + 1 if first is None else first

    def mark_consume_started(self, queue_indexes: Iterable[int], now_ms: int) -> None:
        """Stamp messages handed to the listener (Java's CONSUME_START_TIME property)."""
        self._consume_started_ms.update(dict.fromkeys(queue_indexes, now_ms))

    def oldest_expired(self, now_ms: int, consume_timeout_ms: int) -> M | None:
        """The first cached message if it started consuming more than consume_timeout_ms ago.

        Java's cleanExpiredMsg (concurrent only): every 15 min, up to EXPIRED_SCAN_COUNT_MAX
        times, it sends this message back with delay level 3 and removes it if it is still
        first. The caller loops; this answers one step.
        """
        first = self.first_queue_index()
        if first is None:
            return None
        started_ms = self._consume_started_ms.get(first)
        if started_ms is None or now_ms - started_ms <= consume_timeout_ms:
            return None
        return self._messages[first]

    # --- Orderly consumption ------------------------------------------------------------------

    def take(self, batch_size: int, now_ms: int) -> list[M]:
        """Move up to `batch_size` of the smallest cached messages to "consuming" (rule 3).

        An empty answer clears `consuming`, so the next put() submits a consume task again.
        """
        assert batch_size > 0
        self.last_consume_timestamp_ms = now_ms
        taken: list[M] = []
        while len(taken) < batch_size:
            first = self.first_queue_index()
            if first is None:
                break
            message = self._messages.pop(first)
            self._consuming[first] = message
            taken.append(message)
        if not taken:
            self.consuming = False
        return taken

    def commit(self) -> int:
        """Forget the consuming messages; the offset to commit, or -1 when none was consuming.

        The offset is the largest of them + 1 (Java's commit), lowered to the smallest waiting
        index if that is smaller. Java only ever puts a whole batch back, so the two agree; the
        lower bound keeps rule 1 when a caller puts back part of one.
        """
        consuming = self._consuming
        if not consuming:
            return -1
        offset = max(consuming) + 1
        first_waiting = self.first_queue_index()
        if first_waiting is not None and first_waiting < offset:
            offset = first_waiting  # rule 3: after a partial make_message_to_consume_again
        if self._consume_started_ms:
            for queue_index in consuming:
                self._consume_started_ms.pop(queue_index, None)
        self._count -= len(consuming)
        self._size_bytes -= sum(message.body_size_bytes for message in consuming.values())
        consuming.clear()
        return offset

    def rollback(self) -> None:
        """Put every consuming message back, to be taken again first."""
        consuming = self._consuming
        self._messages.update(consuming)
        for queue_index in consuming:
            self._insert_order(queue_index)
        consuming.clear()

    def make_message_to_consume_again(self, messages: Iterable[M]) -> None:
        """Put these consuming messages back (SUSPEND_CURRENT_QUEUE_A_MOMENT)."""
        for message in messages:
            queue_index = message.queue_index
            assert queue_index in self._consuming, "only consuming messages go back"
            del self._consuming[queue_index]
            self._messages[queue_index] = message
            self._insert_order(queue_index)

    # --- Locks and lifetime -------------------------------------------------------------------

    def set_locked(self, now_ms: int) -> None:
        """The broker granted (or renewed) this queue's lock at `now_ms`."""
        self.locked = True
        self.last_lock_timestamp_ms = now_ms

    def is_lock_expired(self, now_ms: int) -> bool:
        """True when the lock was last granted more than 30 s ago (the broker keeps it 60 s)."""
        return now_ms - self.last_lock_timestamp_ms > LOCK_MAX_LIVE_TIME_MS

    def holds_lock(self, now_ms: int) -> bool:
        """Locked and not expired: what the orderly consume loop needs before consuming."""
        return self.locked and not self.is_lock_expired(now_ms)

    def clear(self) -> None:
        """Drop every message, consuming ones included (Java's clear())."""
        self._messages.clear()
        self._order.clear()
        self._head = 0
        self._consuming.clear()
        self._consume_started_ms.clear()
        self._count = 0
        self._size_bytes = 0
        self.queue_offset_max = 0

    def statistics(self) -> ProcessQueueStatistics:
        return ProcessQueueStatistics(
            cached_count=self._count,
            cached_size_bytes=self._size_bytes,
            cached_queue_index_min=self.first_queue_index(),
            cached_queue_index_max=self.last_queue_index(),
            consuming_count=len(self._consuming),
            queue_offset_max=self.queue_offset_max,
            dropped=self.dropped,
            locked=self.locked,
            last_pull_timestamp_ms=self.last_pull_timestamp_ms,
            last_consume_timestamp_ms=self.last_consume_timestamp_ms,
            last_lock_timestamp_ms=self.last_lock_timestamp_ms,
            try_unlock_times=self.try_unlock_times,
        )

    def check_invariants(self) -> None:
        """Assert the structure's invariants (tests call this after every operation)."""
        order = self._order
        assert 0 <= self._head <= len(order)
        live = order[self._head :]
        assert all(before < after for before, after in itertools.pairwise(live))
        assert set(self._messages) <= set(live)
        assert not set(self._messages) & set(self._consuming)
        everything = [*self._messages.values(), *self._consuming.values()]
        assert self._count == len(everything)
        assert self._size_bytes == sum(message.body_size_bytes for message in everything)
        assert set(self._consume_started_ms) <= set(self._messages) | set(self._consuming)
        if everything:
            assert self.queue_offset_max >= max(message.queue_index for message in everything)
