"""PullConsumer: RocketMQ's DefaultLitePullConsumer for Python: the application polls.

    with PullConsumer("SG", "127.0.0.1:9876") as consumer:
        consumer.subscribe("Orders", "*")             # rebalanced with the group's members
        while running:
            for message in consumer.poll(1000):       # a list of ReceivedMessage
                ...
        # auto-commit: what poll() returned is committed every 5 s and at shutdown

    consumer = PullConsumer("SG", "127.0.0.1:9876", auto_commit=False)
    consumer.assign([MessageQueue("Orders", "broker-a", 0)])   # these queues, no rebalance
    consumer.start()
    consumer.seek(MessageQueue("Orders", "broker-a", 0), 100)
    messages = consumer.poll(1000)
    consumer.commit()                                 # answered by the broker when it returns

Owns (docs/client.md B.12): subscribe or assign (mutually exclusive), seek, poll, commit and
auto-commit, over consumer_core.py's pulls: each queue pulled `pull_batch_size` (10) at a time,
sysflag LITE_PULL + SUBSCRIPTION + SUSPEND without the commit piggyback, suspended up to 20 s;
pulled batches wait in one ready list for poll(). Never: handlers or send-back (a polled message
counts as consumed when poll() returns it; the application decides what to do with failures).

Rules:

1. poll(timeout_ms) returns the messages of one pulled batch, oldest ready first, or [] when
   none arrives within the time (default `poll_timeout_ms`, 5 s). What it returns counts as
   consumed: the queue's consumed offset becomes BatchQueue.remove()'s answer, so the offset to
   commit never passes a message pulled but not yet returned.
2. Flow control (B.12): a queue waits 50 ms past 1000 ready messages, 100 MiB or a span of
   2000, and every queue waits while the ready list holds more than `pull_threshold_count_all`
   (10000) messages.
3. With `auto_commit` (the default), poll() copies every consumed offset into the offset store
   once `auto_commit_interval_ms` (5 s, at least 1 s) passed since the last copy; the store is
   persisted every 5 s, when a queue leaves this client and at shutdown. commit() copies and
   persists at once, answered by the broker (Java's commitSync(map, persist=true)); without
   auto_commit, nothing is ever committed but what commit() commits.
4. assign() pulls exactly the queues given and registers nothing with the brokers: the group's
   members (which rebalance by their heartbeats) never see an assigning client, so `mqbox tail`
   can read any group's queues without moving it. subscribe() takes part in its group's
   rebalance (Java's lite consumer registers in both modes).
5. seek(queue, offset) needs an assigned queue and min <= offset <= max (asked of the master);
   the queue's ready batches are forgotten and its pulls start again at `offset`, which becomes
   its consumed offset.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Iterable
from typing import Final, Unpack

from mqbox.client.batch_queue import BatchQueue, InFlight
from mqbox.client.consumer_core import (
    SHUTDOWN_TIMEOUT_MS_DEFAULT,
    ConsumerCore,
    ConsumerOptions,
    QueueState,
)
from mqbox.client.errors import ClientStateError, OffsetOutOfRangeError
from mqbox.client.messages import MessageBatch, ReceivedMessage
from mqbox.client.process_queue import (
    FlowControl,
)
from mqbox.client.pull import PullResult, max_offset, min_offset, query_consumer_offset
from mqbox.client.subscription import SUB_ALL
from mqbox.clock import wall_clock_ms
from mqbox.errors import ConfigError
from mqbox.protocol.codes import ConsumeType
from mqbox.protocol.headers import MessageQueue

PULL_BATCH_SIZE_DEFAULT: Final = 10  # DefaultLitePullConsumer.pullBatchSize
PULL_THRESHOLD_COUNT_ALL_DEFAULT: Final = 10_000  # pullThresholdForAll
SUSPEND_TIMEOUT_MS_DEFAULT: Final = 20_000  # brokerSuspendMaxTimeMillis
AUTO_COMMIT_INTERVAL_MS_DEFAULT: Final = 5_000
AUTO_COMMIT_INTERVAL_MS_MIN: Final = 1_000
POLL_TIMEOUT_MS_DEFAULT: Final = 5_000


class PullConsumer(ConsumerCore):
    """A lite pull consumer of one group (module docstring)."""

    consume_type = ConsumeType.CONSUME_ACTIVELY
    lite = True

    def __init__(
        self,
        group: str,
        namesrv: str | None = None,
        *,
        auto_commit: bool = True,
        auto_commit_interval_ms: int = AUTO_COMMIT_INTERVAL_MS_DEFAULT,
        poll_timeout_ms: int = POLL_TIMEOUT_MS_DEFAULT,
        pull_batch_size: int = PULL_BATCH_SIZE_DEFAULT,
        pull_threshold_count_all: int = PULL_THRESHOLD_COUNT_ALL_DEFAULT,
        suspend_timeout_ms: int = SUSPEND_TIMEOUT_MS_DEFAULT,
        **options: Unpack[ConsumerOptions],
    ) -> None:
        """As PushConsumer's (ConsumerOptions, consumer_core.py); the consumer is CLUSTERING
        (its offsets live on the brokers)."""
        super().__init__(
            group,
            namesrv,
            model="clustering",
            pull_batch_size=pull_batch_size,
            suspend_timeout_ms=suspend_timeout_ms,
            offset_store_dir=None,
            **options,
        )
        self.auto_commit: Final = auto_commit
        self.auto_commit_interval_ms: Final = max(
            AUTO_COMMIT_INTERVAL_MS_MIN, auto_commit_interval_ms
        )
        self.poll_timeout_ms: Final = poll_timeout_ms
        self.pull_threshold_count_all: Final = pull_threshold_count_all
        self._mode: str | None = None  # "subscribe" or "assign"
        self._assigned: frozenset[MessageQueue] = frozenset()
        self._ready: collections.deque[tuple[QueueState, InFlight, MessageBatch]] = (
            collections.deque()
        )
        self._ready_count = 0
        self._ready_changed = threading.Condition()
        self._next_auto_commit_ns = 0

    # -- choosing queues (rule 4) -----------------------------------------------------------------

    def _choose(self, mode: str) -> None:
        if self._mode not in (None, mode):
            raise ClientStateError("Subscribe and assign are mutually exclusive.")
        self._mode = mode

    def subscribe(self, topic: str, expression: str = SUB_ALL) -> None:
        """Take part in the group's rebalance of `topic`, messages whose tag is in
        `expression`."""
        self._choose("subscribe")
        self._subscribe(topic, expression)

    def assign(self, queues: Iterable[MessageQueue], expression: str = SUB_ALL) -> None:
        """Pull exactly `queues` (replacing an earlier assignment), tags in `expression`."""
        self._choose("assign")
        assigned = frozenset(queues)
        for topic in sorted({queue.topic for queue in assigned} - set(self._subscriptions)):
            self._subscribe(topic, expression)
        self._assigned = assigned
        self.rebalance_soon()

    def assignment(self) -> list[MessageQueue]:
        """The queues pulled now (allocated by the rebalance, or assigned)."""
        return self.queues()

    def fetch_queues(self, topic: str) -> list[MessageQueue]:
        """Every readable queue of `topic` (Java's fetchMessageQueues), to assign from."""
        return self._topic_queues(topic)

    def _allocated_queues(self, topic: str) -> list[MessageQueue] | None:
        if self._mode == "assign":
            return [queue for queue in self._assigned if queue.topic == topic]
        return super()._allocated_queues(topic)

    # -- lifecycle --------------------------------------------------------------------------------

    def _registers(self) -> bool:
        return self._mode != "assign"

    def start(self) -> None:
        """Start pulling; ClientStateError when started before. subscribe() or assign() may
        come before or after."""
        self._next_auto_commit_ns = time.monotonic_ns() + self.auto_commit_interval_ms * 1_000_000
        self._start()

    def shutdown(self, timeout_ms: int = SHUTDOWN_TIMEOUT_MS_DEFAULT) -> None:
        """With auto_commit, commit what poll() returned; then consumer_core.py rule 4."""
        if self.running and self.auto_commit:
            self._copy_consumed()
        super().shutdown(timeout_ms)
        with self._ready_changed:
            self._ready.clear()
            self._ready_count = 0
            self._ready_changed.notify_all()

    # -- consumer_core duties ---------------------------------------------------------------------

    def _flow_control(self, state: QueueState) -> FlowControl | None:
        if self._ready_count > self.pull_threshold_count_all:
            return FlowControl.COUNT
        return super()._flow_control(state)

    def _deliver(self, state: QueueState, result: PullResult, next_offset: int) -> None:
        messages = result.messages
        with state.lock:
            pq = state.pq
            assert isinstance(pq, BatchQueue)
            if pq.dropped:
                return
            pq.advance(next_offset)
            if not messages:
                return
            flight = pq.put(
                messages.first_offset,
                messages.last_offset,
                len(messages),
                messages.body_size_bytes(),
                wall_clock_ms(),
            )
        with self._ready_changed:
            self._ready.append((state, flight, messages))
            self._ready_count += len(messages)
            self._ready_changed.notify()

    def _release_queue(self, state: QueueState, timeout_ms: int) -> bool:
        if self.auto_commit and state.consumed_offset >= 0:
            self.offsets.update(state.queue, state.consumed_offset, increase_only=False)
        return super()._release_queue(state, timeout_ms)

    # -- polling (rules 1 to 3) -------------------------------------------------------------------

    def poll(self, timeout_ms: int | None = None) -> list[ReceivedMessage]:
        """Rule 1; ClientStateError when the consumer is not running."""
        if not self.running:
            raise ClientStateError(f"consumer {self.group} is {self._state}, not running")
        if self.auto_commit and time.monotonic_ns() >= self._next_auto_commit_ns:
            self._copy_consumed()
            self._next_auto_commit_ns = (
                time.monotonic_ns() + self.auto_commit_interval_ms * 1_000_000
            )
        wait_ms = self.poll_timeout_ms if timeout_ms is None else timeout_ms
        deadline_ns = time.monotonic_ns() + wait_ms * 1_000_000
        while True:
            with self._ready_changed:
                while not self._ready:
                    left_s = (deadline_ns - time.monotonic_ns()) / 1e9
                    if left_s <= 0 or not self.running:
                        return []
                    self._ready_changed.wait(left_s)
                state, flight, messages = self._ready.popleft()
                self._ready_count -= len(messages)
            with state.lock:
                pq = state.pq
                assert isinstance(pq, BatchQueue)
                if pq.dropped or flight.done:
                    continue  # a queue sought or dropped since: its batches are stale
                offset = pq.remove(flight, wall_clock_ms())
                if offset >= 0:
                    state.consumed_offset = offset
            self._count("consumed_messages", len(messages))
            return list(messages)

    def _copy_consumed(self) -> dict[MessageQueue, int]:
        """Every queue's consumed offset into the offset store (Java's commitAll)."""
        with self._states_lock:
            states = list(self._states.values())
        copied = {}
        for state in states:
            if state.consumed_offset >= 0 and not state.pq.dropped:
                self.offsets.update(state.queue, state.consumed_offset, increase_only=False)
                copied[state.queue] = state.consumed_offset
        return copied

    def commit(self) -> dict[MessageQueue, int]:
        """Rule 3: copy every consumed offset and persist it now; the offsets committed. The
        failures are counted in statistics() and logged."""
        if not self.running:
            raise ClientStateError(f"consumer {self.group} is {self._state}, not running")
        copied = self._copy_consumed()
        self.offsets.persist_all(list(copied), self.timeout_ms)
        return copied

    def committed(self, queue: MessageQueue) -> int | None:
        """The group's offset of `queue` as its broker holds it; None when it holds none."""
        return query_consumer_offset(
            self._master_transport(queue), self.group, queue.topic, queue.queue_id
        )

    # -- seeking (rule 5) -------------------------------------------------------------------------

    def seek(self, queue: MessageQueue, offset: int) -> None:
        """Pull `queue` from `offset` on; OffsetOutOfRangeError outside [min, max]."""
        if not self.running:
            raise ClientStateError(f"consumer {self.group} is {self._state}, not running")
        with self._states_lock:
            known = queue in self._states or queue in self._assigned
        if not known:
            raise ConfigError(f"{queue} is not assigned to this consumer")
        transport = self._master_transport(queue)
        lowest = min_offset(transport, queue.topic, queue.queue_id)
        highest = max_offset(transport, queue.topic, queue.queue_id)
        if not lowest <= offset <= highest:
            raise OffsetOutOfRangeError(queue, offset, lowest, highest)
        with self._rebalance_lock:
            state = self._begin(queue, offset)
            state.consumed_offset = offset

    def seek_to_begin(self, queue: MessageQueue) -> None:
        self.seek(queue, min_offset(self._master_transport(queue), queue.topic, queue.queue_id))

    def seek_to_end(self, queue: MessageQueue) -> None:
        self.seek(queue, max_offset(self._master_transport(queue), queue.topic, queue.queue_id))
