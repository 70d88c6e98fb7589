"""Producer: RocketMQ's DefaultMQProducer for Python, over a ClientInstance.

Owns: the producer group, the sends of every kind (sync, async, asyncio, oneway, batch, orderly,
delayed), their queue choice (fault.MQFaultStrategy, latency fault avoidance off by default as in
RocketMQ), their retries and time budget, UNIQ_KEYs (message.UniqKeyGenerator, one per message and
per batch element) and the producer's counters. Never: sockets or wire formats (transport.py,
outgoing.py), routes or heartbeats (instance.py).

    with Producer("PG", "127.0.0.1:9876") as producer:  # a group, the name servers
        result = producer.send("Orders", b"body", tags="A", keys=["k", "l"], properties={"x": "1"})
        future = producer.send_async("Orders", b"...")     # Future[SendResult]
        result = await producer.send_aio("Orders", b"...")  # in a coroutine
        producer.send_oneway("Orders", b"...")
        producer.send_batch("Orders", [Message(b"a"), b"b"])
        producer.send_orderly("Orders", b"...", sharding_key="order-17")
        producer.send("Orders", b"...", delay_level=3)

Rules (docs/client.md A.2 to A.6):

1. Queues. A send takes the topic's publish queues from the instance (its route, asked on first
   use; without one, TBW102's route borrowed with `default_topic_queue_nums` queues when
   `create_topic_key` is set, so the broker auto-creates the topic), then one queue: round robin
   on another broker than the last attempt's, or with `latency_fault_enable` the next queue whose
   broker the fault strategy does not avoid. `send_orderly` takes selector.by_hash's queue for its
   sharding key, the same queue for the same key while the route is the same.
2. Attempts. A sync send and a sync batch make up to 1 + `retry_times` (2) attempts within one
   `send_timeout_ms` (3000 ms) budget, each on the broker the queue choice gives: the next
   attempt follows a transport failure (connect, timeout, closed), a broker without a master
   address, and a broker answer in outgoing.RETRY_RESPONSE_CODES (17, 14, 1, 16, 204, 205); any
   other broker code raises BrokerError at once. FLUSH_DISK_TIMEOUT, FLUSH_SLAVE_TIMEOUT and
   SLAVE_NOT_AVAILABLE are returned (the message is stored) unless
   `retry_another_broker_when_not_store_ok`. When the budget runs out the send raises
   RemotingTimeoutError; when the attempts run out, the last attempt's error with a note listing
   the earlier ones.
3. Async sends make up to 1 + `retry_times_async` (2) attempts, a new one only after a transport
   failure (Java resends only then), each on a freshly chosen queue of another broker (Java keeps
   the old queue id, which another broker may not have). Oneway and orderly sends make one
   attempt. `send_prepared_async` sends a message the caller encoded to the queue the caller
   chose, and its retries stay on that queue: a retry of an idempotent message
   (OutgoingMessage.idempotent) must meet the window of the broker that may have stored it.
4. Fault items. Every attempt of a sync, async or oneway send tells the fault strategy its
   latency; a transport failure, and a broker answer that is retried, isolate the broker (600 s
   with the default tables). Unlike Java, a broker answer that is not retried (13 MESSAGE_ILLEGAL,
   2 SYSTEM_BUSY, ...) does not isolate it: one bad message says nothing of the broker's health.
5. A failed attempt asks the instance to refresh the topic's route at once (in the scheduler), so
   a broker that left the name server stops being chosen within a round trip of it.
6. Input errors raise before anything is sent, from the calling thread, for every kind of send
   (InvalidMessageError, ClientStateError when not running). Everything after that reaches an
   async caller through its future; a future's done-callbacks run in a transport's reading
   thread and must not block (transport.py rule 5).
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Final, TypedDict, Unpack, cast

from mqbox.acl.signature import SessionCredentials
from mqbox.client import selector
from mqbox.client.errors import (
    BrokerError,
    ClientError,
    ClientStateError,
    InvalidMessageError,
    NoRouteError,
    RemotingError,
    RemotingResponseError,
    RemotingTimeoutError,
)
from mqbox.client.fault import MQFaultStrategy, TopicPublishInfo
from mqbox.client.instance import ClientInstance, ipv4_bytes
from mqbox.client.outgoing import (
    BODY_SIZE_BYTES_MAX_DEFAULT,
    COMPRESS_LEVEL_DEFAULT,
    COMPRESS_THRESHOLD_BYTES_DEFAULT,
    DEFAULT_TOPIC,
    DEFAULT_TOPIC_QUEUE_NUMS,
    RETRY_RESPONSE_CODES,
    Message,
    OutgoingMessage,
    SendResult,
    SendStatus,
    check_group,
    encode_batch,
    encode_plain_batch,
    encode_single,
    read_send_response,
    request_code,
    send_request_ext,
)
from mqbox.client.remoting import TIMEOUT_MS_DEFAULT
from mqbox.clock import wall_clock_ms
from mqbox.errors import ConfigError
from mqbox.message import UniqKeyGenerator
from mqbox.protocol.command import RemotingCommand
from mqbox.protocol.errors import RemoteProtocolError
from mqbox.protocol.headers import MessageQueue

RETRY_TIMES_DEFAULT: Final = 2  # retryTimesWhenSendFailed
RETRY_TIMES_ASYNC_DEFAULT: Final = 2  # retryTimesWhenSendAsyncFailed
SHUTDOWN_TIMEOUT_MS_DEFAULT: Final = 3_000


@dataclass(frozen=True, slots=True)
class ProducerStatistics:
    """What one producer did since it started."""

    group: str
    client_id: str
    sent: int  # sends acknowledged (a batch counts once)
    failed: int  # sends that raised or failed their future after their attempts
    attempts: int  # requests written (each try of each send)
    retries: int  # attempts after the first
    failed_attempts_by_broker: dict[str, int]  # transport failures and retried broker answers


class SendOptions(TypedDict, total=False):
    """The keywords of every one-message send: TAGS, KEYS (one string of space-separated keys,
    or a sequence), user properties, a delay level (1..18 on a default broker), the user's flag,
    and the time the whole send may take (default: the producer's send_timeout_ms)."""

    tags: str | None
    keys: str | Sequence[str]
    properties: Mapping[str, str] | None
    delay_level: int
    flag: int
    timeout_ms: int | None


class _AsyncSend:
    """One async send in flight: its message, its future, its budget and retries left, and the
    queue every attempt goes to when the caller chose it."""

    __slots__ = ("deadline_ns", "future", "message", "queue", "retries_left")

    def __init__(
        self,
        message: OutgoingMessage,
        future: Future[SendResult],
        deadline_ns: int,
        retries_left: int,
        queue: MessageQueue | None = None,
    ) -> None:
        self.message = message
        self.future = future
        self.deadline_ns = deadline_ns
        self.retries_left = retries_left
        self.queue = queue


def _warm_batch_kernel() -> None:
    encode_plain_batch("WarmUp", [b"x"], "0" * 28, 0)


def _remaining_ms(deadline_ns: int) -> int:
    return -((time.monotonic_ns() - deadline_ns) // 1_000_000)


def _now_ms() -> int:
    """The fault strategy's clock: monotonic, as only differences matter (fault.py)."""
    return time.monotonic_ns() // 1_000_000


class Producer:
    """A RocketMQ producer of one group (module docstring)."""

    def __init__(
        self,
        group: str,
        namesrv: str | None = None,
        *,
        instance: ClientInstance | None = None,
        instance_name: str | None = None,
        send_timeout_ms: int = TIMEOUT_MS_DEFAULT,
        retry_times: int = RETRY_TIMES_DEFAULT,
        retry_times_async: int = RETRY_TIMES_ASYNC_DEFAULT,
        retry_another_broker_when_not_store_ok: bool = False,
        latency_fault_enable: bool = False,
        body_size_bytes_max: int = BODY_SIZE_BYTES_MAX_DEFAULT,
        compress_threshold_bytes: int = COMPRESS_THRESHOLD_BYTES_DEFAULT,
        compress_level: int = COMPRESS_LEVEL_DEFAULT,
        create_topic_key: str | None = DEFAULT_TOPIC,
        default_topic_queue_nums: int = DEFAULT_TOPIC_QUEUE_NUMS,
        rng: random.Random | None = None,
        credentials: SessionCredentials | None = None,
    ) -> None:
        """`namesrv` (`;`-separated) makes a ClientInstance this producer owns and shuts down;
        `instance` shares one that the caller owns. `create_topic_key` None: a topic without a
        route raises NoRouteError instead of borrowing TBW102's (rule 1). `credentials` (with
        `namesrv`): every request of the instance is signed (plain ACL, docs/acl.md)."""
        check_group(group)
        if (namesrv is None) == (instance is None):
            raise ConfigError("give a producer either `namesrv` or `instance`")
        assert send_timeout_ms > 0
        assert retry_times >= 0
        assert retry_times_async >= 0
        assert 0 < body_size_bytes_max <= 2**31
        assert 0 <= compress_level <= 9
        assert default_topic_queue_nums > 0
        self.group: Final = group
        self.send_timeout_ms: Final = send_timeout_ms
        self.retry_times: Final = retry_times
        self.retry_times_async: Final = retry_times_async
        self.retry_another_broker_when_not_store_ok: Final = retry_another_broker_when_not_store_ok
        self.body_size_bytes_max: Final = body_size_bytes_max
        self.compress_threshold_bytes: Final = compress_threshold_bytes
        self.compress_level: Final = compress_level
        self.create_topic_key: Final = create_topic_key
        self.default_topic_queue_nums: Final = default_topic_queue_nums
        self._rng = rng if rng is not None else random.Random()
        self._owns_instance = instance is None
        if instance is None:
            assert namesrv is not None
            instance = ClientInstance(
                namesrv, instance_name=instance_name, rng=self._rng, credentials=credentials
            )
        self.instance: Final = instance
        self._fault = MQFaultStrategy(enabled=latency_fault_enable, rng=self._rng)
        self._fault_lock = threading.Lock()
        self._uniq = UniqKeyGenerator(
            ipv4_bytes(instance.client_ip), os.getpid(), self._rng.getrandbits(32)
        )
        self._uniq_lock = threading.Lock()
        self._header_default_topic = create_topic_key or DEFAULT_TOPIC
        self._state = "created"
        self._sent = 0
        self._failed = 0
        self._attempts = 0
        self._retries = 0
        self._failed_attempts: dict[str, int] = {}

    # -- lifecycle --------------------------------------------------------------------------------

    def start(self) -> None:
        """Register the group with the instance (and start the instance this producer owns)."""
        if self._state != "created":
            raise ClientStateError(f"producer {self.group} is {self._state}")
        if self._owns_instance:
            self.instance.start()
        self.instance.register_producer(self.group)
        self._state = "running"
        # The batch kernel compiles (or loads from numba's cache) on first use: do it now, off
        # the caller's thread, rather than inside the first batch's send budget.
        self.instance.scheduler.call_soon("warm-batch-kernel", _warm_batch_kernel)

    def shutdown(self, timeout_ms: int = SHUTDOWN_TIMEOUT_MS_DEFAULT) -> None:
        """Unregister the group (35 to every broker) and stop the instance this producer owns,
        within `timeout_ms`. Sends still in flight fail with a ClientError. Idempotent."""
        if self._state != "running":
            self._state = "shut down"
            return
        self._state = "shut down"
        deadline_ns = time.monotonic_ns() + timeout_ms * 1_000_000
        try:
            self.instance.unregister_producer(self.group, max(1, timeout_ms // 2))
        finally:
            if self._owns_instance:
                self.instance.shutdown(max(1, _remaining_ms(deadline_ns)))

    def __enter__(self) -> Producer:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.shutdown()

    @property
    def latency_fault_enable(self) -> bool:
        return self._fault.enabled

    @latency_fault_enable.setter
    def latency_fault_enable(self, enabled: bool) -> None:
        self._fault.enabled = enabled

    def _check_running(self) -> None:
        if self._state != "running":
            raise ClientStateError(f"producer {self.group} is {self._state}, not running")

    # -- sends ------------------------------------------------------------------------------------

    def send(
        self,
        topic: str,
        body: bytes,
        **options: Unpack[SendOptions],
    ) -> SendResult:
        """Send one message and wait for the broker's acknowledgement (rules 1, 2, 4, 5)."""
        begin_ns = time.monotonic_ns()
        message = self._single(topic, body, options)
        return self._send_sync(message, begin_ns, options.get("timeout_ms"), 1 + self.retry_times)

    def send_batch(
        self,
        topic: str,
        messages: Iterable[Message | bytes],
        *,
        timeout_ms: int | None = None,
    ) -> SendResult:
        """Send a batch (SEND_BATCH_MESSAGE, 320) to one queue, retried as `send` (rule 2);
        elements are Messages or plain bodies. `msg_id` joins the elements' UNIQ_KEYs."""
        begin_ns = time.monotonic_ns()
        message = self._batch(topic, messages)
        return self._send_sync(message, begin_ns, timeout_ms, 1 + self.retry_times)

    def send_async(
        self,
        topic: str,
        body: bytes,
        **options: Unpack[SendOptions],
    ) -> Future[SendResult]:
        """Send one message without waiting: the future gets its SendResult or its ClientError
        (rules 3 and 6)."""
        begin_ns = time.monotonic_ns()
        message = self._single(topic, body, options)
        return self._send_async(message, begin_ns, options.get("timeout_ms"))

    def send_batch_async(
        self,
        topic: str,
        messages: Iterable[Message | bytes],
        *,
        timeout_ms: int | None = None,
    ) -> Future[SendResult]:
        """send_batch without waiting, retried as send_async (rule 3)."""
        begin_ns = time.monotonic_ns()
        message = self._batch(topic, messages)
        return self._send_async(message, begin_ns, timeout_ms)

    def send_prepared_async(
        self,
        message: OutgoingMessage,
        queue: MessageQueue,
        *,
        timeout_ms: int | None = None,
    ) -> Future[SendResult]:
        """Send a message or batch the caller encoded (outgoing.encode_*, with UNIQ_KEYs of its
        own) to `queue`, without waiting; retried on that same queue after a transport failure
        (rule 3). The SendResult's msg_id is `message.msg_id` as the caller set it."""
        self._check_running()
        if message.topic != queue.topic:
            raise InvalidMessageError(f"a message for {message.topic} sent to a queue of {queue}")
        begin_ns = time.monotonic_ns()
        future: Future[SendResult] = Future()
        future.set_running_or_notify_cancel()
        deadline_ns = begin_ns + (timeout_ms or self.send_timeout_ms) * 1_000_000
        send = _AsyncSend(message, future, deadline_ns, self.retry_times_async, queue)
        self._async_attempt(send, None)
        return future

    async def send_aio(
        self,
        topic: str,
        body: bytes,
        **options: Unpack[SendOptions],
    ) -> SendResult:
        """send_async for asyncio: await the result without blocking the event loop."""
        import asyncio  # here: the broker's roles import this package and never need asyncio

        return await asyncio.wrap_future(self.send_async(topic, body, **options))

    def send_oneway(
        self,
        topic: str,
        body: bytes,
        **options: Unpack[SendOptions],
    ) -> None:
        """Send one message flagged ONEWAY, one attempt: it returns once the socket took the
        request and the broker does not answer, so nothing says whether it was stored."""
        begin_ns = time.monotonic_ns()
        message = self._single(topic, body, options)
        deadline_ns = begin_ns + (options.get("timeout_ms") or self.send_timeout_ms) * 1_000_000
        try:
            info = self._publish_info(topic)
            queue = self._select_queue(info, None)
            address = self._master_address(queue)
        except ClientError:
            self._failed += 1
            raise
        ext = self._ext(message, queue)
        started_ns = time.monotonic_ns()
        self._attempts += 1
        try:
            transport = self.instance.transport(address)
            transport.invoke_oneway(
                request_code(message), ext, message.body, _remaining_ms(deadline_ns)
            )
        except RemotingError as error:
            self._attempt_failed(queue, started_ns, error)
            self._failed += 1
            raise
        self._update_fault(queue.broker_name, started_ns, False)
        self._sent += 1

    def send_orderly(
        self,
        topic: str,
        body: bytes,
        *,
        sharding_key: str | int,
        **options: Unpack[SendOptions],
    ) -> SendResult:
        """Send to the queue selector.by_hash picks for `sharding_key` (Java's
        SelectMessageQueueByHash): one attempt, no retry, no fault avoidance (Java's
        sendSelectImpl), so messages of one key keep their order."""
        return self._send_once(
            topic, body, options, lambda info: selector.by_hash(info.queues, sharding_key)
        )

    def send_to_queue(
        self,
        topic: str,
        body: bytes,
        queue_id: int,
        *,
        broker_name: str | None = None,
        **options: Unpack[SendOptions],
    ) -> SendResult:
        """Send to one queue the caller names (Java's send(msg, MessageQueue)): queue `queue_id`
        of `broker_name`, else of the first broker by name that has it. One attempt, no retry
        on another queue (Java's sendKernelImpl for a given queue). NoRouteError when the
        topic's route has no such writable queue."""

        def named_queue(info: TopicPublishInfo) -> MessageQueue:
            candidates = sorted(
                (queue for queue in info.queues if queue.queue_id == queue_id),
                key=lambda queue: queue.broker_name,
            )
            if broker_name is not None:
                candidates = [queue for queue in candidates if queue.broker_name == broker_name]
            if not candidates:
                where = f" of broker {broker_name}" if broker_name is not None else ""
                raise NoRouteError(topic, f"topic {topic} has no writable queue {queue_id}{where}")
            return candidates[0]

        return self._send_once(topic, body, options, named_queue)

    def _send_once(
        self,
        topic: str,
        body: bytes,
        options: SendOptions,
        pick: Callable[[TopicPublishInfo], MessageQueue],
    ) -> SendResult:
        """One attempt to the queue `pick` chooses from the topic's publish info: no retry, no
        fault avoidance (Java's sendSelectImpl and send to a given queue)."""
        begin_ns = time.monotonic_ns()
        message = self._single(topic, body, options)
        deadline_ns = begin_ns + (options.get("timeout_ms") or self.send_timeout_ms) * 1_000_000
        try:
            queue = pick(self._publish_info(topic))
            address = self._master_address(queue)
            result = self._attempt(message, queue, address, deadline_ns, update_fault=False)
        except ClientError:
            self._failed += 1
            raise
        self._sent += 1
        return result

    def send_prepared(self, message: OutgoingMessage, timeout_ms: int | None = None) -> SendResult:
        """Send a message outgoing.py encoded for a consumer (outgoing.encode_retry: the
        send-back fallback), retried as `send` (rule 2). Its checks ran when it was encoded."""
        self._check_running()
        return self._send_sync(message, time.monotonic_ns(), timeout_ms, 1 + self.retry_times)

    # -- encoding ---------------------------------------------------------------------------------

    def _single(self, topic: str, body: bytes, options: SendOptions) -> OutgoingMessage:
        self._check_running()
        with self._uniq_lock:
            uniq_key = self._uniq.next_key(wall_clock_ms())
        return encode_single(
            topic,
            body,
            uniq_key=uniq_key,
            tags=options.get("tags"),
            keys=options.get("keys", ()),
            properties=options.get("properties"),
            delay_level=options.get("delay_level", 0),
            flag=options.get("flag", 0),
            body_size_bytes_max=self.body_size_bytes_max,
            compress_threshold_bytes=self.compress_threshold_bytes,
            compress_level=self.compress_level,
        )

    def _batch(self, topic: str, messages: Iterable[Message | bytes]) -> OutgoingMessage:
        self._check_running()
        elements = messages if isinstance(messages, list | tuple) else list(messages)
        if not elements:
            raise InvalidMessageError(f"topic {topic}: the batch is empty")
        now_ms = wall_clock_ms()
        if all(type(element) is bytes for element in elements):
            with self._uniq_lock:
                head, counter_start = self._uniq.reserve(now_ms, len(elements))
            return encode_plain_batch(
                topic,
                cast(Sequence[bytes], elements),
                head,
                counter_start,
                body_size_bytes_max=self.body_size_bytes_max,
            )
        with self._uniq_lock:
            uniq_keys = self._uniq.next_keys(now_ms, len(elements))
        return encode_batch(
            topic, elements, uniq_keys, body_size_bytes_max=self.body_size_bytes_max
        )

    def _ext(self, message: OutgoingMessage, queue: MessageQueue) -> dict[str, str]:
        return send_request_ext(
            self.group,
            message,
            queue.queue_id,
            wall_clock_ms(),
            default_topic=self._header_default_topic,
            default_topic_queue_nums=self.default_topic_queue_nums,
        )

    # -- queue choice -----------------------------------------------------------------------------

    def _publish_info(self, topic: str) -> TopicPublishInfo:
        """Rule 1's publish queues; NoRouteError when there is none to send to."""
        info = self.instance.publish_info(
            topic, self.create_topic_key, self.default_topic_queue_nums
        )
        if info is None:
            raise NoRouteError(
                topic, f"topic {topic} does not exist: the name server has no route for it"
            )
        if not info.ok():
            raise NoRouteError(topic, f"topic {topic} has no writable queue on a master")
        return info

    def _select_queue(self, info: TopicPublishInfo, last_broker: str | None) -> MessageQueue:
        with self._fault_lock:
            return self._fault.select_one(info, last_broker, _now_ms())

    def _update_fault(self, broker_name: str, started_ns: int, isolation: bool) -> None:
        """Tell the fault strategy how an attempt begun at `started_ns` went (rule 4)."""
        if self._fault.enabled:
            latency_ms = (time.monotonic_ns() - started_ns) // 1_000_000
            with self._fault_lock:
                self._fault.update_fault_item(broker_name, latency_ms, isolation, _now_ms())

    def _master_address(self, queue: MessageQueue) -> str:
        """The master of the queue's broker, the route asked again when it is not known
        (Java's sendKernelImpl); NoRouteError without one."""
        address = self.instance.master_address(queue.broker_name)
        if address is None:
            self.instance.update_route(queue.topic)
            address = self.instance.master_address(queue.broker_name)
        if address is None:
            raise NoRouteError(
                queue.topic, f"broker {queue.broker_name} of topic {queue.topic} has no master"
            )
        return address

    def _attempt_failed(self, queue: MessageQueue, started_ns: int, error: ClientError) -> None:
        """Rules 4 and 5 for an attempt that failed with `error`."""
        broker = queue.broker_name
        retried_answer = isinstance(error, BrokerError) and error.code in RETRY_RESPONSE_CODES
        if isinstance(error, RemotingResponseError) and not retried_answer:
            return
        self._failed_attempts[broker] = self._failed_attempts.get(broker, 0) + 1
        self._update_fault(broker, started_ns, True)
        self.instance.refresh_route_soon(queue.topic)

    # -- sync sends -------------------------------------------------------------------------------

    def _attempt(
        self,
        message: OutgoingMessage,
        queue: MessageQueue,
        address: str,
        deadline_ns: int,
        *,
        update_fault: bool = True,
    ) -> SendResult:
        """One request to the queue's broker at `address`: its SendResult, or the ClientError
        it met."""
        remaining_ms = _remaining_ms(deadline_ns)
        if remaining_ms <= 0:
            raise RemotingTimeoutError(f"no time left to send to {queue.topic}", address)
        ext = self._ext(message, queue)
        code = request_code(message)
        started_ns = time.monotonic_ns()
        self._attempts += 1
        try:
            response = self.instance.transport(address).invoke(
                code, ext, message.body, remaining_ms
            )
            result = self._read(response, message, queue, address)
        except ClientError as error:
            if update_fault:
                self._attempt_failed(queue, started_ns, error)
            raise
        if update_fault:
            self._update_fault(queue.broker_name, started_ns, False)
        return result

    def _read(
        self, response: RemotingCommand, message: OutgoingMessage, queue: MessageQueue, address: str
    ) -> SendResult:
        result = read_send_response(response, message, queue.broker_name)
        if result is None:
            raise BrokerError(
                queue.broker_name, address, request_code(message), response.code, response.remark
            )
        return result

    def _send_sync(
        self, message: OutgoingMessage, begin_ns: int, timeout_ms: int | None, attempt_count: int
    ) -> SendResult:
        """Rule 2."""
        timeout_ms = timeout_ms or self.send_timeout_ms
        deadline_ns = begin_ns + timeout_ms * 1_000_000
        failures: list[ClientError] = []
        try:
            info = self._publish_info(message.topic)
        except ClientError:
            self._failed += 1
            raise
        last_broker: str | None = None
        last_address = message.topic  # where the last attempt went, for a timeout's message
        for attempt in range(attempt_count):
            if time.monotonic_ns() >= deadline_ns:
                break
            if attempt:
                self._retries += 1
            queue = self._select_queue(info, last_broker)
            last_broker = queue.broker_name
            try:
                last_address = self._master_address(queue)
                result = self._attempt(message, queue, last_address, deadline_ns)
            except BrokerError as error:
                if error.code not in RETRY_RESPONSE_CODES:
                    self._failed += 1
                    raise
                failures.append(error)
                continue
            except (RemotingError, NoRouteError) as error:
                failures.append(error)
                continue
            if (
                result.status is SendStatus.SEND_OK
                or not self.retry_another_broker_when_not_store_ok
            ):
                self._sent += 1
                return result
            failures.append(
                BrokerError(
                    queue.broker_name,
                    last_address,
                    request_code(message),
                    result.status.value,
                    f"stored, but {result.status.name}",
                )
            )
        self._failed += 1
        if not failures or time.monotonic_ns() >= deadline_ns:
            timeout = RemotingTimeoutError(
                f"send to topic {message.topic} took its whole {timeout_ms} ms over "
                f"{len(failures)} failed attempts",
                last_address,
            )
            for failure in failures:
                timeout.add_note(f"attempt failed: {failure}")
            raise timeout
        last = failures[-1]
        for failure in failures[:-1]:
            last.add_note(f"an earlier attempt failed: {failure}")
        raise last

    # -- async sends ------------------------------------------------------------------------------

    def _send_async(
        self, message: OutgoingMessage, begin_ns: int, timeout_ms: int | None
    ) -> Future[SendResult]:
        future: Future[SendResult] = Future()
        future.set_running_or_notify_cancel()
        deadline_ns = begin_ns + (timeout_ms or self.send_timeout_ms) * 1_000_000
        self._async_attempt(_AsyncSend(message, future, deadline_ns, self.retry_times_async), None)
        return future

    def _async_attempt(self, send: _AsyncSend, last_broker: str | None) -> None:
        """One attempt of an async send (rule 3); its answer arrives in _async_answer."""
        message = send.message
        try:
            if time.monotonic_ns() >= send.deadline_ns:
                raise RemotingTimeoutError(
                    f"no time left to send to {message.topic}", message.topic
                )
            queue = send.queue
            if queue is None:
                queue = self._select_queue(self._publish_info(message.topic), last_broker)
            address = self._master_address(queue)
            transport = self.instance.transport(address)
        except ClientError as error:
            self._async_failed(send, error)
            return
        ext = self._ext(message, queue)
        started_ns = time.monotonic_ns()
        self._attempts += 1

        def answered(response: RemotingCommand | None, error: ClientError | None) -> None:
            self._async_answer(send, queue, address, started_ns, response, error)

        transport.invoke_callback(
            request_code(message), ext, message.body, answered, _remaining_ms(send.deadline_ns)
        )

    def _async_answer(
        self,
        send: _AsyncSend,
        queue: MessageQueue,
        address: str,
        started_ns: int,
        response: RemotingCommand | None,
        error: ClientError | None,
    ) -> None:
        if error is not None:
            self._attempt_failed(queue, started_ns, error)
            if send.retries_left > 0 and time.monotonic_ns() < send.deadline_ns:
                send.retries_left -= 1
                self._retries += 1
                self._async_attempt(send, queue.broker_name)
                return
            self._async_failed(send, error)
            return
        assert response is not None
        try:
            result = self._read(response, send.message, queue, address)
        except (ClientError, RemoteProtocolError) as failure:
            if isinstance(failure, ClientError):
                self._attempt_failed(queue, started_ns, failure)
            self._async_failed(send, failure)
            return
        self._update_fault(queue.broker_name, started_ns, False)
        self._sent += 1
        send.future.set_result(result)  # running from the start: nobody else completes it

    def _async_failed(self, send: _AsyncSend, error: Exception) -> None:
        self._failed += 1
        send.future.set_exception(error)

    # -- inspection -------------------------------------------------------------------------------

    def statistics(self) -> ProducerStatistics:
        return ProducerStatistics(
            self.group,
            self.instance.client_id,
            self._sent,
            self._failed,
            self._attempts,
            self._retries,
            dict(self._failed_attempts),
        )
