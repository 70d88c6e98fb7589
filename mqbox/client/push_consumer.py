"""PushConsumer: RocketMQ's DefaultMQPushConsumer for Python: handlers called with batches of
messages as they arrive, concurrently or in order.

    def handle(messages):                        # a Sequence[ReceivedMessage], lazy
        for message in messages:
            print(message.topic, message.queue_offset, message.body)
        return ConsumeResult.SUCCESS             # or RECONSUME_LATER

    with PushConsumer("CG", "127.0.0.1:9876", consume_batch_size=32) as consumer:
        consumer.subscribe("Orders", "A || B", handle)
        ...                                      # started by `with`; shut down at its end

Owns: handlers by topic, the consume threads (`threads`, 4), and what a handler's answer does:
concurrent consumption with send-back (docs/client.md B.9) or orderly consumption with queue
locks (B.10). Subscriptions, rebalance, pulls and offsets are consumer_core.py's.

Concurrent (the default), per consume batch of up to `consume_batch_size` messages (Java's
consumeMessageBatchMaxSize, 1 by default; a bench or a busy handler wants hundreds):

1. The pulled body is cut into batches in the transport's reading thread: each gets one
   InFlight in the queue's BatchQueue (batch_queue.py: its first and last queue offsets, count
   and bytes; no object per message) and is queued for the consume threads.
2. A consume thread calls the handler with a MessageBatch (lazy ReceivedMessage views). SUCCESS
   acknowledges the batch. Anything else (RECONSUME_LATER, None, an exception) sends each
   message back (CONSUMER_SEND_MSG_BACK, 36, to the master of its broker, at `retry_delay_level`,
   0 letting the broker choose 3 + reconsume times, with `max_reconsume_times`, 16 by default);
   a message 36 cannot send goes to `%RETRY%<group>` through the inner producer
   (outgoing.encode_retry); one that fails both is consumed here again after 5 s, its batch
   still in flight. Broadcasting logs failures and sends nothing back.
3. The acknowledged batch leaves the BatchQueue, whose answer (the oldest batch still in flight,
   else past everything pulled) becomes the queue's offset, increase-only: the committed offset
   never passes a message still being consumed (batch_queue.py rule 1).
4. Every `consume_timeout_ms` (15 min) the oldest batches in flight longer than that are sent
   back at delay level 3 and acknowledged (Java's cleanExpiredMsg); a handler still running on
   one finishes unheeded.

Orderly (`orderly=True`), per queue:

5. CLUSTERING queues are consumed only under the broker's lock: a queue is added only once a
   one-queue LOCK_BATCH_MQ (41) grants it, every queue's lock is renewed every `lock_interval_ms`
   (20 s, first after 1 s), a lock older than 30 s is not trusted, and pulls of an unlocked queue
   wait 1 s. A dropped queue waits up to 1 s for its consuming thread, persists its offset
   (answered, so the next owner reads it), then unlocks (42); a batch that thread finished
   meanwhile is committed first (Java drops its result, and the next owner consumes it again);
   at shutdown, every queue is persisted, then unlocked.
6. One thread at a time consumes a queue (its consume_lock), taking up to `consume_batch_size`
   messages in queue order from its ProcessQueue. SUCCESS commits them (the offset set, not
   increase-only). SUSPEND_CURRENT_QUEUE_A_MOMENT (or a failure) puts them back, first, to be
   consumed again after `suspend_ms` (1000 ms); a message whose reconsume times (the stored count
   plus this client's retries) reached `max_reconsume_times` (unlimited by default) goes to
   `%DLQ%<group>` (36 with delay level -1) and counts as consumed. A thread yields a queue after
   60 s of continuous consumption.

Threads: the consume threads run handlers and send-backs only; pulls and decoding happen on
consumer_core.py's threads, so a slow handler never delays a pull (flow control does, B.7).
Shutdown (bounded): no new batch starts; running handlers get half of what is left of the time;
then consumer_core.py's rule 4.
"""

from __future__ import annotations

import functools
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, wait
from pathlib import Path
from typing import Any, Final, Unpack

from mqbox.client.batch_queue import BatchQueue, InFlight
from mqbox.client.consume_rules import (
    CONSUME_TIMEOUT_DELAY_LEVEL,
    CONSUME_TIMEOUT_MS_DEFAULT,
    SEND_BACK_LOCAL_RETRY_DELAY_MS,
    SUSPEND_MS_DEFAULT,
    clamp_suspend_ms,
    orderly_outcome,
    queues_by_broker,
    reconsume_times_max,
)
from mqbox.client.consumer_core import (
    PULL_BATCH_SIZE_DEFAULT,
    SHUTDOWN_TIMEOUT_MS_DEFAULT,
    SUSPEND_TIMEOUT_MS_DEFAULT,
    ConsumerCore,
    ConsumerOptions,
    InFlightTable,
    QueueState,
)
from mqbox.client.errors import ClientError
from mqbox.client.messages import ConsumeResult, MessageBatch, ReceivedMessage, retry_topic
from mqbox.client.outgoing import encode_retry
from mqbox.client.process_queue import (
    LOCK_INTERVAL_MS,
    FlowControl,
    ProcessQueue,
)
from mqbox.client.producer import Producer
from mqbox.client.pull import PullResult
from mqbox.client.pull_decode import PullBodyError, decode_pull_body
from mqbox.clock import wall_clock_ms
from mqbox.errors import ConfigError
from mqbox.message import PROPERTY_RETRY_TOPIC
from mqbox.protocol.codes import ConsumeType, RequestCode, ResponseCode
from mqbox.protocol.command import RemotingCommand
from mqbox.protocol.headers import (
    ConsumerSendMsgBackRequestHeader,
    LockBatchRequestBody,
    LockBatchResponseBody,
    MessageQueue,
)

log = logging.getLogger("mqbox.client.push_consumer")

Handler = Callable[[Sequence[ReceivedMessage]], ConsumeResult | None]

THREADS_DEFAULT: Final = 4
CONSUME_BATCH_SIZE_DEFAULT: Final = 1  # consumeMessageBatchMaxSize
SEND_BACK_TIMEOUT_MS: Final = 5_000
LOCK_TIMEOUT_MS: Final = 1_000  # C++ allows 41/42 one second
LOCK_INITIAL_DELAY_MS: Final = 1_000
CONSUME_LOCK_WAIT_S: Final = 1.0  # a dropped orderly queue waits this long for its consumer
CONSUME_CONTINUOUSLY_MAX_NS: Final = 60_000 * 1_000_000  # MAX_TIME_CONSUME_CONTINUOUSLY
ORDERLY_RETRY_LOCK_DELAY_MS: Final = 10
ORDERLY_LOCK_FAILED_DELAY_MS: Final = 3_000
EXPIRED_SWEEP_COUNT_MAX: Final = 16
INNER_PRODUCER_GROUP: Final = "CLIENT_INNER_PRODUCER"
DEAD_LETTER_NOW: Final = -1  # 36's delayLevel below 0: the DLQ at once
_ANSWER_SLACK_S: Final = 0.25
_SEND_BACK_CODE: Final = int(RequestCode.CONSUMER_SEND_MSG_BACK)


class _Workers:
    """`count` daemon threads running queued calls in order of submission (Java's
    consumeExecutor). submit() never blocks; stop() is bounded."""

    def __init__(self, name: str, count: int) -> None:
        assert count > 0
        self._tasks: queue.SimpleQueue[tuple[Callable[..., None], tuple[Any, ...]] | None] = (
            queue.SimpleQueue()
        )
        self._threads = [
            threading.Thread(target=self._run, name=f"{name}-{index}", daemon=True)
            for index in range(count)
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def submit(self, function: Callable[..., None], *args: Any) -> None:
        self._tasks.put((function, args))

    def _run(self) -> None:
        tasks = self._tasks
        while True:
            task = tasks.get()
            if task is None:
                return
            function, args = task
            try:
                function(*args)
            except Exception:  # a bug in consumption must not end the thread
                log.exception("a consume task failed")

    def stop(self, timeout_s: float) -> bool:
        """Let queued calls drain (callers make them return at once), then end every thread
        within `timeout_s`; True when all ended."""
        for _ in self._threads:
            self._tasks.put(None)
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(max(0.0, deadline - time.monotonic()))
        return not any(thread.is_alive() for thread in self._threads)


class PushConsumer(ConsumerCore):
    """A push consumer of one group (module docstring)."""

    consume_type = ConsumeType.CONSUME_PASSIVELY

    def __init__(
        self,
        group: str,
        namesrv: str | None = None,
        *,
        model: str = "clustering",
        orderly: bool = False,
        threads: int = THREADS_DEFAULT,
        consume_batch_size: int = CONSUME_BATCH_SIZE_DEFAULT,
        pull_batch_size: int = PULL_BATCH_SIZE_DEFAULT,
        max_reconsume_times: int | None = None,
        retry_delay_level: int = 0,
        suspend_ms: int = SUSPEND_MS_DEFAULT,
        consume_timeout_ms: int = CONSUME_TIMEOUT_MS_DEFAULT,
        suspend_timeout_ms: int = SUSPEND_TIMEOUT_MS_DEFAULT,
        lock_interval_ms: int = LOCK_INTERVAL_MS,
        offset_store_dir: str | Path | None = None,
        **options: Unpack[ConsumerOptions],
    ) -> None:
        """`namesrv` (`;`-separated) makes a ClientInstance this consumer owns; the keywords of
        ConsumerOptions (consumer_core.py) are common to both consumers: allocate, consume_from,
        consume_timestamp, flow control thresholds, intervals. `offset_store_dir`: where
        broadcasting keeps its offsets (~/.rocketmq_offsets). The others are named as in Java,
        with Java's defaults; `max_reconsume_times` None means 16 (concurrent) or unlimited
        (orderly)."""
        if threads < 1:
            raise ConfigError(f"threads {threads} is not a positive count")
        if consume_batch_size < 1:
            raise ConfigError(f"consume_batch_size {consume_batch_size} is not positive")
        super().__init__(
            group,
            namesrv,
            model=model,
            pull_batch_size=pull_batch_size,
            suspend_timeout_ms=suspend_timeout_ms,
            offset_store_dir=offset_store_dir,
            **options,
        )
        self.orderly: Final = orderly
        self.threads: Final = threads
        self.consume_batch_size: Final = consume_batch_size
        self.max_reconsume_times: Final = reconsume_times_max(max_reconsume_times, orderly=orderly)
        self.retry_delay_level: Final = retry_delay_level
        self.suspend_ms: Final = clamp_suspend_ms(suspend_ms)
        self.consume_timeout_ms: Final = consume_timeout_ms
        self.lock_interval_ms: Final = lock_interval_ms
        self._handlers: dict[str, Handler] = {}
        self._workers = _Workers(f"mqbox-consume-{group}", threads)
        self._inner_producer: Producer | None = None
        self._producer_lock = threading.Lock()

    # -- the public surface -----------------------------------------------------------------------

    def subscribe(self, topic: str, expression: str, handler: Handler) -> None:
        """Consume `topic`'s messages whose tag is in `expression` ("*", "A || B") with
        `handler`. Before or after start(); a topic subscribed again takes the new expression
        and handler. Raises SubscriptionExpressionError for an expression of separators only."""
        self._handlers = {**self._handlers, topic: handler}
        self._subscribe(topic, expression)

    def start(self) -> None:
        """Start pulling: register the group, heartbeat, rebalance (and start the instance this
        consumer owns). ClientStateError when started before. Topics may be subscribed before
        or after."""
        self._check_created()
        if self.clustering:
            # copySubscription: CLUSTERING consumers take their group's retries too.
            self._subscribe(retry_topic(self.group), "*")
        self._workers.start()
        self._start()

    def pause(self) -> None:
        """Stop pulling (B.7 check 3) until resume(); consumption of what was pulled goes on."""
        self.paused = True

    def resume(self) -> None:
        self.paused = False

    def shutdown(self, timeout_ms: int = SHUTDOWN_TIMEOUT_MS_DEFAULT) -> None:
        """consumer_core.py rule 4, within `timeout_ms`. Idempotent."""
        try:
            super().shutdown(timeout_ms)
        finally:
            producer = self._inner_producer
            if producer is not None:
                producer.shutdown(max(1, timeout_ms // 4))

    # -- consumer_core duties ---------------------------------------------------------------------

    def _new_in_flight_table(self, now: int) -> InFlightTable:
        return ProcessQueue(now) if self.orderly else BatchQueue(now)

    def _flow_control(self, state: QueueState) -> FlowControl | None:
        pq = state.pq
        if isinstance(pq, ProcessQueue):
            return pq.flow_control(
                orderly=True,
                count_max=self.pull_threshold_count,
                size_mib_max=self.pull_threshold_size_mib,
                span_max=self.consume_max_span,
            )
        return super()._flow_control(state)

    def _locks_queues(self) -> bool:
        return self.orderly and self.clustering

    def _orderly_unlocked(self, state: QueueState) -> bool:
        pq = state.pq
        return self._locks_queues() and isinstance(pq, ProcessQueue) and not pq.locked

    def _extra_tasks(self) -> None:
        scheduler = self.instance.scheduler
        _, _, lock_name, timeout_name = self._task_names
        if self._locks_queues():
            scheduler.schedule_every(
                lock_name, self.lock_interval_ms, self._lock_all, LOCK_INITIAL_DELAY_MS
            )
        if not self.orderly:
            scheduler.schedule_every(
                timeout_name,
                self.consume_timeout_ms,
                self._send_back_expired,
                self.consume_timeout_ms,
            )

    def _stop_consuming(self, timeout_ms: int) -> None:
        if not self._workers.stop(timeout_ms / 1000):
            log.warning("%s: handlers still running at shutdown", self.group)

    def _call(self, handler: Handler, messages: Sequence[ReceivedMessage]) -> bool:
        """The handler's answer as success or not (an exception is a failure, logged)."""
        try:
            result = handler(messages)
        except Exception:
            log.exception("%s: the handler raised; its %d messages fail", self.group, len(messages))
            return False
        return result is ConsumeResult.SUCCESS

    def consume_directly(self, record: bytes, broker_name: str) -> dict[str, Any] | None:
        """CONSUME_MESSAGE_DIRECTLY (309): the stored record, decoded, goes to the topic's
        handler on the request thread, outside the consume threads and the queue's in-flight
        table (nothing is committed or sent back, as in Java's consumeMessageDirectly). Java's
        ConsumeMessageDirectlyResult: consumeResult CR_SUCCESS, CR_LATER (any other answer),
        CR_RETURN_NULL or CR_THROW_EXCEPTION (remark: the exception)."""
        if not self._handlers:
            return None
        batch = decode_pull_body(record, broker_name=broker_name)
        if len(batch) != 1:
            message = f"the body holds {len(batch)} whole stored records, not one"
            raise PullBodyError(message, batch.stop_position_bytes)
        messages = MessageBatch(batch, range(1))
        started_ms = wall_clock_ms()
        remark = ""
        try:
            answer = self._handler_of(messages[0].topic)(messages)
        except Exception as error:  # the handler's fault is the answer, as in Java
            outcome, remark = "CR_THROW_EXCEPTION", repr(error)
        else:
            if answer is None:
                outcome = "CR_RETURN_NULL"
            elif answer is ConsumeResult.SUCCESS:
                outcome = "CR_SUCCESS"
            else:
                outcome = "CR_LATER"
        return {
            "autoCommit": True,
            "consumeResult": outcome,
            "order": self.orderly,
            "remark": remark,
            "spentTimeMills": wall_clock_ms() - started_ms,
        }

    def _handler_of(self, topic: str) -> Handler:
        handlers = self._handlers
        handler = handlers.get(topic)
        if handler is None:  # a retry of a topic unsubscribed since: any handler of the group
            handler = next(iter(handlers.values()))
        return handler

    # -- concurrent consumption (rules 1 to 4) ----------------------------------------------------

    def _deliver(self, state: QueueState, result: PullResult, next_offset: int) -> None:
        if self.orderly:
            self._deliver_orderly(state, result, next_offset)
            return
        runs = self._handler_runs(state, result.messages)
        now = wall_clock_ms()
        size = self.consume_batch_size
        chunks = [
            (handler, chunk)
            for handler, run in runs
            for chunk in (run.chunks(size) if len(run) > size else (run,))
        ]
        with state.lock:
            pq = state.pq
            assert isinstance(pq, BatchQueue)
            if pq.dropped:
                return
            pq.advance(next_offset)
            flights = [
                pq.put(
                    chunk.first_offset, chunk.last_offset, len(chunk), chunk.body_size_bytes(), now
                )
                for _, chunk in chunks
            ]
            empty = pq.cached_count == 0
        if empty:  # the tag check left nothing in flight: correctTagsOffset
            self.offsets.update(state.queue, next_offset, increase_only=True)
        submit = self._workers.submit
        for (handler, chunk), flight in zip(chunks, flights, strict=True):
            flight.payload = (handler, chunk)
            submit(self._consume, state, flight, chunk, handler)

    def _handler_runs(
        self, state: QueueState, messages: MessageBatch
    ) -> list[tuple[Handler, MessageBatch]]:
        """The batch as consecutive runs of one handler: one run, unless a retry queue holds
        retries of topics with different handlers."""
        if not messages:
            return []
        if not state.is_retry or len(set(self._handlers.values())) == 1:
            return [(self._handler_of(state.queue.topic), messages)]
        runs: list[tuple[Handler, list[int]]] = []
        for position, message in zip(messages.positions, messages, strict=True):
            handler = self._handler_of(message.properties.get(PROPERTY_RETRY_TOPIC, ""))
            if runs and runs[-1][0] is handler:
                runs[-1][1].append(position)
            else:
                runs.append((handler, [position]))
        return [(handler, MessageBatch(messages.batch, positions)) for handler, positions in runs]

    def _consume(
        self, state: QueueState, flight: InFlight, messages: MessageBatch, handler: Handler
    ) -> None:
        """Rules 2 and 3 for one batch (a consume thread)."""
        if state.pq.dropped or flight.done or not self.running:
            return
        succeeded = self._call(handler, messages)
        if state.dropped():
            return  # Java drops the result of a dropped queue: the next owner consumes again
        if succeeded:
            self._count("consumed_messages", len(messages))
        else:
            self._count("reconsumed_messages", len(messages))
            if self.clustering:
                failed = self._send_back(messages, self.retry_delay_level)
                if failed is not None:
                    self._consume_later(state, flight, failed, handler)
                    return
            else:
                log.warning(
                    "%s: %d broadcast messages failed and are not retried",
                    self.group,
                    len(messages),
                )
        self._acknowledge(state, flight)

    def _acknowledge(self, state: QueueState, flight: InFlight) -> None:
        with state.lock:
            pq = state.pq
            assert isinstance(pq, BatchQueue)
            offset = pq.remove(flight, wall_clock_ms())
            dropped = pq.dropped
        if offset >= 0 and not dropped:
            self.offsets.update(state.queue, offset, increase_only=True)

    def _consume_later(
        self, state: QueueState, flight: InFlight, messages: MessageBatch, handler: Handler
    ) -> None:
        """Both send-backs failed: consume these again here after 5 s (Java's
        submitConsumeRequestLater); the batch stays in flight meanwhile."""
        self._timers.call_later(
            "consume-later",
            SEND_BACK_LOCAL_RETRY_DELAY_MS,
            functools.partial(
                self._workers.submit, self._consume, state, flight, messages, handler
            ),
        )

    def _send_back(
        self, messages: Sequence[ReceivedMessage], delay_level: int
    ) -> MessageBatch | None:
        """Rule 2's send-back of every message; None when all went back, else the ones that
        could not (36 and the fallback both failed)."""
        if not messages:
            return None
        batch = messages.batch if isinstance(messages, MessageBatch) else messages[0].batch
        broker = batch.broker_name
        listed = list(messages)
        failed = self._send_back_36(listed, broker, delay_level)
        still_failed = [message for message in failed if not self._send_to_retry(message)]
        sent = len(listed) - len(still_failed)
        self._count("sent_back", sent)
        if not still_failed:
            return None
        self._count("send_back_failures", len(still_failed))
        return MessageBatch(batch, [message.position for message in still_failed])

    def _send_back_36(
        self, messages: list[ReceivedMessage], broker: str, delay_level: int
    ) -> list[ReceivedMessage]:
        """CONSUMER_SEND_MSG_BACK for each message, all at once, to the master of `broker`;
        the messages it did not take."""
        try:
            transport = self._master_transport(
                MessageQueue(messages[0].pulled_topic, broker, messages[0].queue_id)
            )
        except ClientError as error:
            log.warning("%s: no master of %s to send back to: %s", self.group, broker, error)
            return messages
        pending: list[tuple[ReceivedMessage, Future[RemotingCommand]]] = []
        for message in messages:
            header = ConsumerSendMsgBackRequestHeader(
                self.group,
                message.commit_log_offset,
                delay_level,
                origin_msg_id=message.msg_id,
                origin_topic=message.topic,
                max_reconsume_times=self.max_reconsume_times,
            )
            pending.append(
                (
                    message,
                    transport.invoke_async(
                        _SEND_BACK_CODE, header.to_ext(), b"", SEND_BACK_TIMEOUT_MS
                    ),
                )
            )
        wait([future for _, future in pending], SEND_BACK_TIMEOUT_MS / 1000 + _ANSWER_SLACK_S)
        failed = []
        for message, future in pending:
            problem: object = None
            if not future.done():
                problem = "no answer in time"
            elif (failure := future.exception()) is not None:
                problem = failure
            elif future.result().code != ResponseCode.SUCCESS:
                problem = f"answered {future.result().code}: {future.result().remark}"
            if problem is not None:
                log.warning("%s: send-back of %s failed: %s", self.group, message, problem)
                failed.append(message)
        return failed

    def _producer(self) -> Producer:
        with self._producer_lock:
            if self._inner_producer is None:
                producer = Producer(INNER_PRODUCER_GROUP, instance=self.instance)
                producer.start()
                self._inner_producer = producer
            return self._inner_producer

    def _send_to_retry(self, message: ReceivedMessage) -> bool:
        """Java's fallback: the message sent anew to `%RETRY%<group>`; False when that fails."""
        try:
            outgoing = encode_retry(
                self.group,
                message.body,
                message.properties,
                origin_topic=message.topic,
                origin_msg_id=message.msg_id,
                reconsume_times=message.reconsume_times,
                reconsume_times_max=self.max_reconsume_times,
                flag=message.flag,
            )
            self._producer().send_prepared(outgoing)
        except ClientError as error:
            log.warning(
                "%s: resending %s to the retry topic failed: %s", self.group, message, error
            )
            return False
        return True

    def _send_back_expired(self) -> None:
        """Rule 4 (Java's cleanExpiredMsg), every consume_timeout_ms."""
        if not self.running:
            return
        with self._states_lock:
            states = list(self._states.values())
        for state in states:
            for _ in range(EXPIRED_SWEEP_COUNT_MAX):
                with state.lock:
                    pq = state.pq
                    assert isinstance(pq, BatchQueue)
                    flight = pq.oldest_expired(wall_clock_ms(), self.consume_timeout_ms)
                if flight is None or state.pq.dropped:
                    break
                _, messages = flight.payload
                log.warning("%s: consumption of %s timed out", self.group, messages)
                failed = self._send_back(messages, CONSUME_TIMEOUT_DELAY_LEVEL)
                if failed is not None:
                    break
                self._acknowledge(state, flight)

    # -- orderly consumption (rules 5 and 6) ------------------------------------------------------

    def _deliver_orderly(self, state: QueueState, result: PullResult, next_offset: int) -> None:
        messages = list(result.messages)
        with state.lock:
            pq = state.pq
            assert isinstance(pq, ProcessQueue)
            if pq.dropped:
                return
            submit = pq.put(messages, result.max_offset)
            empty = pq.cached_count == 0
        if empty:
            self.offsets.update(state.queue, next_offset, increase_only=True)
        if submit:
            self._workers.submit(self._consume_orderly, state)

    def _consume_orderly(self, state: QueueState) -> None:
        """Rule 6 for one queue, until its cache is empty, its lock is gone, a suspension, or
        60 s (a consume thread)."""
        pq = state.pq
        assert isinstance(pq, ProcessQueue)
        if pq.dropped or not self.running:
            return
        with state.consume_lock:
            began_ns = time.monotonic_ns()
            while True:
                if state.dropped() or not self.running:
                    return
                if self._locks_queues() and not pq.holds_lock(wall_clock_ms()):
                    self._lock_later(state, ORDERLY_RETRY_LOCK_DELAY_MS)
                    return
                if time.monotonic_ns() - began_ns > CONSUME_CONTINUOUSLY_MAX_NS:
                    self._consume_orderly_later(state, ORDERLY_RETRY_LOCK_DELAY_MS)
                    return
                with state.lock:
                    messages = pq.take(self.consume_batch_size, wall_clock_ms())
                if not messages:
                    return
                handler = self._handler_of(messages[0].topic)
                succeeded = self._call(handler, messages)
                if state.dropped():
                    self._commit_dropped(state, pq, succeeded)
                    return
                if not self._orderly_answer(state, pq, messages, succeeded):
                    return

    def _orderly_answer(
        self,
        state: QueueState,
        pq: ProcessQueue[Any],
        messages: list[ReceivedMessage],
        succeeded: bool,
    ) -> bool:
        """Commit, or put back and suspend (rule 6); True to go on consuming the queue."""
        attempts = state.attempts
        times = [
            message.reconsume_times + attempts.get(message.queue_index, 0) for message in messages
        ]
        outcome = orderly_outcome(succeeded, times, self.max_reconsume_times, self.suspend_ms)
        retry = [messages[at] for at in outcome.retry]
        for at in outcome.dead_letter:
            message = messages[at]
            if self._dead_letter(message):
                self._count("dead_lettered", 1)
            else:
                retry.append(message)
        if retry:
            retry.sort(key=lambda message: message.queue_index)
            self._count("reconsumed_messages", len(retry))
            with state.lock:
                pq.make_message_to_consume_again(retry)
            for message in retry:
                attempts[message.queue_index] = attempts.get(message.queue_index, 0) + 1
            self._consume_orderly_later(state, self.suspend_ms)
            return False
        self._count("consumed_messages", len(messages) - len(outcome.dead_letter))
        with state.lock:
            offset = pq.commit()
        for message in messages:
            attempts.pop(message.queue_index, None)
        if offset >= 0 and not pq.dropped:
            self.offsets.update(state.queue, offset, increase_only=False)
        return True

    def _commit_dropped(self, state: QueueState, pq: ProcessQueue[Any], succeeded: bool) -> None:
        """A batch that succeeded while a rebalance dropped its queue. Java drops the result,
        so the next owner consumes the batch again; here its offset is still held, because the
        rebalance persists only once this thread lets go of the queue's consume_lock (rule 5),
        and the next owner starts after it. Not after a reset (220), whose offsets win."""
        if not succeeded or not state.releasing:
            return
        with state.lock:
            offset = pq.commit()
        if offset >= 0:
            self.offsets.update(state.queue, offset, increase_only=False)

    def _dead_letter(self, message: ReceivedMessage) -> bool:
        """CONSUMER_SEND_MSG_BACK with delay level -1: straight to `%DLQ%<group>`."""
        return not self._send_back_36([message], message.broker_name, DEAD_LETTER_NOW)

    def _consume_orderly_later(self, state: QueueState, delay_ms: int) -> None:
        submit = functools.partial(self._workers.submit, self._consume_orderly, state)
        self._timers.call_later("consume-orderly-later", delay_ms, submit)

    def _lock_later(self, state: QueueState, delay_ms: int) -> None:
        """Java's tryLockLaterAndReconsume: lock the queue on a consume thread after `delay_ms`,
        then consume it 10 ms later, or 3 s later when the lock was refused."""
        submit = functools.partial(self._workers.submit, self._lock_and_consume, state)
        self._timers.call_later("lock-later", delay_ms, submit)

    def _lock_and_consume(self, state: QueueState) -> None:
        if state.pq.dropped or not self.running:
            return
        locked = state.queue in self._lock({state.queue})
        self._consume_orderly_later(
            state, ORDERLY_RETRY_LOCK_DELAY_MS if locked else ORDERLY_LOCK_FAILED_DELAY_MS
        )

    def _lock(self, queues: set[MessageQueue]) -> set[MessageQueue]:
        """LOCK_BATCH_MQ (41) per broker; the queues granted, each state's lock stamped."""
        granted: set[MessageQueue] = set()
        for broker, queues_of_broker in queues_by_broker(queues).items():
            body = LockBatchRequestBody(self.group, self.client_id, tuple(queues_of_broker))
            try:
                transport = self._master_transport(queues_of_broker[0])
                response = transport.invoke(
                    RequestCode.LOCK_BATCH_MQ, {}, body.to_json(), LOCK_TIMEOUT_MS
                )
            except ClientError as error:
                log.warning("%s: locking queues of %s failed: %s", self.group, broker, error)
                continue
            if response.code != ResponseCode.SUCCESS:
                log.warning("%s: %s refused locks: %s", self.group, broker, response.remark)
                continue
            granted.update(LockBatchResponseBody.from_json(response.body).lock_ok_mq_set)
        now = wall_clock_ms()
        with self._states_lock:
            states = [self._states.get(queue) for queue in queues]
        for state in states:
            if state is not None and isinstance(state.pq, ProcessQueue):
                with state.lock:
                    if state.queue in granted:
                        state.pq.set_locked(now)
                    else:
                        state.pq.locked = False
        return granted

    def _unlock(self, queues: list[MessageQueue], timeout_ms: int) -> None:
        """UNLOCK_BATCH_MQ (42) per broker, answered (the next owner's lock waits for it)."""
        for broker, queues_of_broker in queues_by_broker(queues).items():
            body = LockBatchRequestBody(self.group, self.client_id, tuple(queues_of_broker))
            try:
                transport = self._master_transport(queues_of_broker[0])
                transport.invoke(RequestCode.UNLOCK_BATCH_MQ, {}, body.to_json(), timeout_ms)
            except ClientError as error:
                log.warning("%s: unlocking queues of %s failed: %s", self.group, broker, error)

    def _lock_all(self) -> None:
        """Rule 5's renewal (Java's lockAll)."""
        if not self.running:
            return
        with self._states_lock:
            queues = {queue for queue, state in self._states.items() if not state.pq.dropped}
        if queues:
            self._lock(queues)

    def _add_queue_allowed(self, queue: MessageQueue) -> bool:
        return not self._locks_queues() or queue in self._lock({queue})

    def _prepare(self, state: QueueState) -> None:
        if self._locks_queues():
            assert isinstance(state.pq, ProcessQueue)
            state.pq.set_locked(wall_clock_ms())  # granted just now by _add_queue_allowed

    def _release_queue(self, state: QueueState, timeout_ms: int) -> bool:
        if not self._locks_queues():
            return super()._release_queue(state, timeout_ms)
        if not state.consume_lock.acquire(timeout=CONSUME_LOCK_WAIT_S):
            assert isinstance(state.pq, ProcessQueue)
            state.pq.try_unlock_times += 1
            return False
        try:
            super()._release_queue(state, timeout_ms)
            self._unlock([state.queue], LOCK_TIMEOUT_MS)
        finally:
            state.consume_lock.release()
        return True

    def _after_persist_at_shutdown(self, states: list[QueueState], timeout_ms: int) -> None:
        if self._locks_queues() and states:
            self._unlock([state.queue for state in states], min(timeout_ms, LOCK_TIMEOUT_MS))
