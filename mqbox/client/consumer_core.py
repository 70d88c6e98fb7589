"""ConsumerCore: what the push and lite pull consumers share: subscriptions, rebalance, the pull
loop, offsets, and the seam with the ClientInstance.

Owns (docs/client.md B.2 to B.8): the group's subscriptions; the table of queues this client
pulls (QueueState: the queue, its in-flight table, its next offset, the broker id to pull from);
the rebalance (every `rebalance_interval_ms`, at start, on NOTIFY_CONSUMER_IDS_CHANGED and after
a reset): allocation over the sorted queue and consumer id lists, queues dropped with their
offsets persisted first, queues added at the offset B.6 gives; the pull loop; the offset store
and its persistence every `persist_interval_ms`; the broker requests of the group (40, 220, 221,
307, 309); start and a bounded shutdown. Never: consuming (push_consumer.py hands messages to
handlers, pull_consumer.py to poll()): subclasses say how a pulled batch is delivered, how a
queue's in-flight table is made and checked, and what dropping a queue needs.

Threads and who does what:

    instance scheduler   rebalance, offset persistence, (orderly) lock renewal: one at a time
    instance requests    40 (rebalance soon), 220 (reset), 307, 309
    pull timer thread    one per consumer: the pull loop's checks (B.7) and sending each PULL
                         (async); delayed retries of consumption
    transport readers    each PULL answer: decoded (one kernel call), delivered to the subclass,
                         the queue's next pull handed back to the pull timer thread
    (subclasses)         push: the consume threads; lite: the caller of poll()

Rules:

1. One pull per queue is outstanding or scheduled at a time: a QueueState is pulled again only
   from its own answer (or from the timer that delayed it), never twice.
2. A dropped queue is never pulled, delivered or committed again: its `pq.dropped` is checked
   before each pull, under the queue's lock before each delivery, and by consumers before each
   commit. Its offset is persisted before it leaves the table (B.5).
3. Rebalance rounds run one at a time (`_rebalance_lock`); so do resets, which share the lock.
4. Shutdown is bounded by its `timeout_ms`: the rebalance and persist tasks are cancelled, the
   pull thread stopped, the subclass's consumption stopped within half of what is left, the
   offsets persisted, (orderly) the queues unlocked, the group unregistered, and the instance
   this consumer owns shut down, each with what is left of the time.
5. Errors: a pull that fails waits 1 s (20 ms for 215 FLOW_CONTROL), as Java; each kind of
   failure is logged at most once per 10 s; nothing is dropped silently.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import random
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Final, Self, TypedDict

from mqbox.acl.signature import SessionCredentials
from mqbox.client.allocate import STRATEGIES, AllocationInputError, Strategy, allocate
from mqbox.client.batch_queue import BatchQueue
from mqbox.client.consume_rules import (
    OFFSET_ILLEGAL_REPAIR_DELAY_MS,
    PULL_DELAY_MS_WHEN_BROKER_FLOW_CONTROL,
    PULL_DELAY_MS_WHEN_EXCEPTION,
    ConsumeFrom,
    ResetBodyError,
    consume_timestamp_ms,
    parse_consume_from,
    parse_reset_offsets,
    pull_delay_ms,
    queue_changes,
    start_offset,
)
from mqbox.client.consumer_offsets import (
    PERSIST_INITIAL_DELAY_MS,
    PERSIST_INTERVAL_MS,
    LocalOffsetStore,
    OffsetStore,
    RemoteOffsetStore,
)
from mqbox.client.errors import BrokerError, ClientError, ClientStateError, NoRouteError
from mqbox.client.instance import ClientInstance, HeartbeatConsumer
from mqbox.client.messages import RETRY_TOPIC_PREFIX
from mqbox.client.offset_store import LOCAL_OFFSET_DIR_DEFAULT, local_offset_path
from mqbox.client.outgoing import check_group
from mqbox.client.process_queue import (
    CONSUME_MAX_SPAN_DEFAULT,
    PULL_THRESHOLD_COUNT_DEFAULT,
    PULL_THRESHOLD_SIZE_MIB_DEFAULT,
    FlowControl,
    ProcessQueue,
)
from mqbox.client.pull import PullResult, PullStatus, max_offset, pull_callback, search_offset
from mqbox.client.remoting import TIMEOUT_MS_DEFAULT
from mqbox.client.scheduler import Scheduler
from mqbox.client.subscription import Subscription, build_subscription
from mqbox.client.transport import Transport
from mqbox.clock import wall_clock_ms
from mqbox.errors import ConfigError, MqboxError
from mqbox.protocol import admin_bodies
from mqbox.protocol.codes import ConsumeType, MessageModel, RequestCode, ResponseCode
from mqbox.protocol.command import RemotingCommand, dumps_json
from mqbox.protocol.headers import ConsumerListBody, MessageQueue
from mqbox.resources import RateLimitedLog

log = logging.getLogger("mqbox.client.consumer")

REBALANCE_INTERVAL_MS: Final = 20_000  # rocketmq.client.rebalance.waitInterval
PULL_BATCH_SIZE_DEFAULT: Final = 32  # pullBatchSize
SUSPEND_TIMEOUT_MS_DEFAULT: Final = 15_000  # BROKER_SUSPEND_MAX_TIME_MILLIS
PULL_TIMEOUT_MS_DEFAULT: Final = 30_000  # CONSUMER_TIMEOUT_MILLIS_WHEN_SUSPEND
SHUTDOWN_TIMEOUT_MS_DEFAULT: Final = 5_000
PULL_BATCH_SIZE_MAX: Final = 1024  # what an mqbox broker honours per pull


InFlightTable = BatchQueue | ProcessQueue[Any]


class QueueState:
    """One queue this client pulls: its in-flight table and where its next pull goes. `lock`
    guards `pq` between the pulling and the consuming threads."""

    __slots__ = (
        "attempts",
        "broker_id",
        "consume_lock",
        "consumed_offset",
        "is_retry",
        "lock",
        "next_offset",
        "pq",
        "queue",
        "releasing",
        "repairing",
    )

    def __init__(self, queue: MessageQueue, pq: InFlightTable, next_offset: int) -> None:
        self.queue = queue
        self.pq = pq
        self.lock = threading.Lock()
        self.next_offset = next_offset
        self.broker_id = 0  # suggestWhichBrokerId of the last answer
        self.is_retry = queue.topic.startswith(RETRY_TOPIC_PREFIX)
        self.consume_lock = threading.Lock()  # orderly: one consuming thread per queue
        self.attempts: dict[int, int] = {}  # orderly: local retries by queue index
        self.consumed_offset = -1  # lite: what poll() handed out, the next commit
        self.repairing = False  # dropped by OFFSET_ILLEGAL, waiting for its repair (B.7)
        self.releasing = False  # dropped by a rebalance: its offset is persisted after this

    def dropped(self) -> bool:
        """Rule 2's flag, read afresh (a method: other threads set it)."""
        return self.pq.dropped

    def __repr__(self) -> str:
        return f"QueueState({self.queue}, next_offset={self.next_offset})"


class ConsumerOptions(TypedDict, total=False):
    """The keywords both consumers take, with ConsumerCore's defaults: a shared `instance`
    (else one made from `namesrv` and `instance_name`, owned and shut down by the consumer),
    the allocation strategy (averagely, averagely_by_circle, consistent_hash, or a function of
    allocate.py's Strategy type), where a group with nothing committed starts (last, first,
    timestamp: B.6) and the timestamp (ms, a datetime, or yyyyMMddHHmmss; default 30 minutes
    before now), the per-queue flow control thresholds (B.7: 1000 messages, 100 MiB, a span of
    2000), the pull's RPC timeout (30 s), the rebalance and offset persistence intervals (20 s,
    5 s), the timeout of every other call (3 s), and a random source (tests)."""

    instance: ClientInstance | None
    instance_name: str | None
    allocate: str | Strategy
    consume_from: str | ConsumeFrom
    consume_timestamp: int | str | datetime.datetime | None
    pull_threshold_count: int
    pull_threshold_size_mib: int
    consume_max_span: int
    pull_timeout_ms: int
    rebalance_interval_ms: int
    persist_interval_ms: int
    timeout_ms: int
    rng: random.Random | None
    credentials: SessionCredentials | None  # sign every request (plain ACL, docs/acl.md)


@dataclass(frozen=True, slots=True)
class ConsumerStatistics:
    """What one consumer did since it started."""

    group: str
    client_id: str
    queues: tuple[MessageQueue, ...]  # pulled now
    rebalances: int  # rounds run
    queue_changes: int  # queues added or dropped by those rounds
    pulls: int  # PULL requests sent
    pull_failures: int  # pulls that failed (no answer, an error code, no route)
    pulled_messages: int  # messages delivered to the consume side (after the tag check)
    flow_control_waits: int  # pulls delayed by B.7 checks 4 to 6
    offset_illegal: int  # OFFSET_ILLEGAL answers
    consumed_messages: int  # acknowledged: handler SUCCESS, or handed out by poll()
    reconsumed_messages: int  # handler failures (RECONSUME_LATER, SUSPEND, exceptions)
    sent_back: int  # messages sent back (36) or to %RETRY% by the fallback
    send_back_failures: int
    dead_lettered: int  # orderly messages sent to %DLQ% past their reconsume limit
    offsets_persisted: int
    offset_persist_failures: int


class ConsumerCore:
    """The shared consumer runtime (module docstring); PushConsumer and PullConsumer extend it."""

    consume_type: ClassVar[ConsumeType] = ConsumeType.CONSUME_PASSIVELY
    lite: ClassVar[bool] = False

    def __init__(
        self,
        group: str,
        namesrv: str | None,
        *,
        model: str,
        pull_batch_size: int,
        suspend_timeout_ms: int,
        offset_store_dir: str | Path | None,
        instance: ClientInstance | None = None,
        instance_name: str | None = None,
        allocate: str | Strategy = "averagely",
        consume_from: str | ConsumeFrom = "last",
        consume_timestamp: int | str | datetime.datetime | None = None,
        pull_threshold_count: int = PULL_THRESHOLD_COUNT_DEFAULT,
        pull_threshold_size_mib: int = PULL_THRESHOLD_SIZE_MIB_DEFAULT,
        consume_max_span: int = CONSUME_MAX_SPAN_DEFAULT,
        pull_timeout_ms: int = PULL_TIMEOUT_MS_DEFAULT,
        rebalance_interval_ms: int = REBALANCE_INTERVAL_MS,
        persist_interval_ms: int = PERSIST_INTERVAL_MS,
        timeout_ms: int = TIMEOUT_MS_DEFAULT,
        rng: random.Random | None = None,
        credentials: SessionCredentials | None = None,
    ) -> None:
        check_group(group)
        if (namesrv is None) == (instance is None):
            raise ConfigError("give a consumer either `namesrv` or `instance`")
        if model not in ("clustering", "broadcasting"):
            raise ConfigError(f"model {model!r} is not clustering or broadcasting")
        if isinstance(allocate, str):
            if allocate not in STRATEGIES:
                raise ConfigError(f"allocate {allocate!r} is not one of {', '.join(STRATEGIES)}")
            allocate = STRATEGIES[allocate]
        if not 0 < pull_batch_size <= PULL_BATCH_SIZE_MAX:
            raise ConfigError(f"pull_batch_size {pull_batch_size} is not in 1..1024")
        assert suspend_timeout_ms >= 0
        assert pull_timeout_ms > suspend_timeout_ms
        assert rebalance_interval_ms > 0
        assert persist_interval_ms > 0
        self.group: Final = group
        self.model: Final = (
            MessageModel.CLUSTERING if model == "clustering" else MessageModel.BROADCASTING
        )
        self.clustering: Final = self.model is MessageModel.CLUSTERING
        self.strategy: Final[Strategy] = allocate
        self.consume_from: Final = parse_consume_from(consume_from)
        self.consume_timestamp_ms: Final = consume_timestamp_ms(consume_timestamp, wall_clock_ms())
        self.pull_batch_size: Final = pull_batch_size
        self.suspend_timeout_ms: Final = suspend_timeout_ms
        self.pull_timeout_ms: Final = pull_timeout_ms
        self.pull_threshold_count: Final = pull_threshold_count
        self.pull_threshold_size_mib: Final = pull_threshold_size_mib
        self.consume_max_span: Final = consume_max_span
        self.rebalance_interval_ms: Final = rebalance_interval_ms
        self.persist_interval_ms: Final = persist_interval_ms
        self.timeout_ms: Final = timeout_ms
        self._rng = rng if rng is not None else random.Random()
        self._owns_instance = instance is None
        if instance is None:
            assert namesrv is not None
            # Java renames the instance pid#nanotime for clustering only: a broadcasting
            # consumer keeps "DEFAULT", so its id, and its local offset file, survive a restart.
            if instance_name is None and not self.clustering:
                instance_name = "DEFAULT"
            instance = ClientInstance(
                namesrv,
                instance_name=instance_name,
                timeout_ms=timeout_ms,
                rng=self._rng,
                credentials=credentials,
            )
        self.instance: Final = instance
        self.client_id: Final = instance.client_id
        self.offsets: Final[OffsetStore] = (
            RemoteOffsetStore(group, instance)
            if self.clustering
            else LocalOffsetStore(
                group,
                instance,
                local_offset_path(
                    Path(offset_store_dir or LOCAL_OFFSET_DIR_DEFAULT).expanduser(),
                    instance.client_id,
                    group,
                ),
            )
        )
        self._subscriptions: dict[str, Subscription] = {}
        self._states: dict[MessageQueue, QueueState] = {}
        self._states_lock = threading.Lock()
        self._rebalance_lock = threading.Lock()
        self._rebalance_pending = False
        self._state = "created"
        self.paused = False
        self._timers = Scheduler(f"mqbox-pull-{group}-{self.client_id}")
        self._task_names = tuple(
            f"{kind}-{group}" for kind in ("rebalance", "persist", "lock", "consume-timeout")
        )
        self._pull_log = RateLimitedLog(log)
        self._counts_lock = threading.Lock()
        self._counts: dict[str, int] = dict.fromkeys(
            (
                "rebalances",
                "queue_changes",
                "pulls",
                "pull_failures",
                "pulled_messages",
                "flow_control_waits",
                "offset_illegal",
                "consumed_messages",
                "reconsumed_messages",
                "sent_back",
                "send_back_failures",
                "dead_lettered",
            ),
            0,
        )

    def _count(self, name: str, count: int = 1) -> None:
        """Add to a counter of statistics(); any thread."""
        with self._counts_lock:
            self._counts[name] += count

    # -- subclass duties --------------------------------------------------------------------------

    def _new_in_flight_table(self, now: int) -> InFlightTable:
        """The in-flight table of a queue added now."""
        return BatchQueue(now)

    def _flow_control(self, state: QueueState) -> FlowControl | None:
        """B.7 checks 4 to 6 for `state` (called under state.lock)."""
        pq = state.pq
        assert isinstance(pq, BatchQueue)
        return pq.flow_control(
            count_max=self.pull_threshold_count,
            size_mib_max=self.pull_threshold_size_mib,
            span_max=self.consume_max_span,
        )

    def _orderly_unlocked(self, state: QueueState) -> bool:
        """B.7 check 7: an orderly clustering queue without its lock."""
        return False

    def _deliver(self, state: QueueState, result: PullResult, next_offset: int) -> None:
        """Hand a FOUND pull's messages to the consume side (a transport's reading thread: it
        must not block). Check `state.pq.dropped` under state.lock (rule 2)."""
        raise NotImplementedError

    def _release_queue(self, state: QueueState, timeout_ms: int) -> bool:
        """A dropped queue leaves the table (B.5): persist its offset first; False postpones
        its removal to the next round (an orderly queue still consuming)."""
        self.offsets.persist(state.queue, timeout_ms)
        self.offsets.remove(state.queue)
        return True

    def _add_queue_allowed(self, queue: MessageQueue) -> bool:
        """True when a queue the allocation gave may be added now (orderly: its lock, B.5)."""
        return True

    def _stop_consuming(self, timeout_ms: int) -> None:
        """Shutdown (rule 4): stop consuming within `timeout_ms`."""

    def _after_persist_at_shutdown(self, states: list[QueueState], timeout_ms: int) -> None:
        """Shutdown, after the offsets were persisted (orderly: unlock the queues)."""

    def _registers(self) -> bool:
        """True when the group registers with the instance (heartbeats, broker requests)."""
        return True

    def _extra_tasks(self) -> None:
        """Schedule the subclass's periodic tasks on the instance's scheduler at start."""

    def _allocated_queues(self, topic: str) -> list[MessageQueue] | None:
        """The queues of `topic` this client should pull, None to leave the topic alone this
        round (B.3): broadcasting takes them all, clustering allocates."""
        queues = self._topic_queues(topic)
        if not queues:
            return None
        if not self.clustering:
            return queues
        client_ids = self._consumer_ids(topic)
        if not client_ids:
            return None
        try:
            return allocate(self.strategy, self.client_id, queues, client_ids)
        except AllocationInputError as error:
            log.info("%s: no allocation for %s this round: %s", self.group, topic, error)
            return None

    # -- lifecycle --------------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._state == "running"

    def start(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.shutdown()

    def _check_created(self) -> None:
        if self._state != "created":
            raise ClientStateError(f"consumer {self.group} is {self._state}")

    def _start(self) -> None:
        self._check_created()
        if self._owns_instance:
            self.instance.start()
        if isinstance(self.offsets, LocalOffsetStore):
            self.offsets.load()
        if self._registers():
            self.instance.register_consumer(self.group, self)
        self._timers.start()
        self._state = "running"
        for topic in list(self._subscriptions):
            self._update_route(topic)
        # Java heartbeats before its first rebalance, so the broker lists this client in time.
        self.instance.heartbeat()
        rebalance_name, persist_name, _, _ = self._task_names
        scheduler = self.instance.scheduler
        scheduler.schedule_every(
            rebalance_name, self.rebalance_interval_ms, self.rebalance, self.rebalance_interval_ms
        )
        scheduler.schedule_every(
            persist_name,
            self.persist_interval_ms,
            self.persist_offsets,
            min(PERSIST_INITIAL_DELAY_MS, self.persist_interval_ms),
        )
        self._extra_tasks()
        self.rebalance_soon()

    def _update_route(self, topic: str) -> None:
        try:
            self.instance.update_route(topic)
        except ClientError as error:
            log.warning("%s: no route for %s yet: %s", self.group, topic, error)

    def shutdown(self, timeout_ms: int = SHUTDOWN_TIMEOUT_MS_DEFAULT) -> None:
        """Rule 4: stop pulling and consuming, persist the offsets, unregister, within
        `timeout_ms`. Idempotent; a consumer never started just becomes shut down."""
        if self._state != "running":
            self._state = "shut down"
            return
        self._state = "stopping"
        deadline_ns = time.monotonic_ns() + timeout_ms * 1_000_000

        def left_ms() -> int:
            return max(1, (deadline_ns - time.monotonic_ns()) // 1_000_000)

        try:
            for name in self._task_names:
                self.instance.scheduler.cancel(name)
            self._timers.shutdown(min(left_ms(), 1_000) / 1000)
            self._stop_consuming(left_ms() // 2)
            with self._states_lock:
                states = list(self._states.values())
            self.offsets.persist_all([state.queue for state in states], left_ms())
            self._after_persist_at_shutdown(states, left_ms())
            with self._states_lock:
                for state in self._states.values():
                    state.pq.dropped = True
                self._states.clear()
            if self._registers():
                self.instance.unregister_consumer(self.group, left_ms())
        finally:
            self._state = "shut down"
            if self._owns_instance:
                self.instance.shutdown(left_ms())

    # -- ClientInstance hooks ---------------------------------------------------------------------

    def heartbeat_consumer(self) -> HeartbeatConsumer:
        return HeartbeatConsumer(
            self.group,
            self.consume_type,
            self.model,
            self.consume_from.where,
            tuple(self._subscriptions.values()),
        )

    def topics(self) -> Iterable[str]:
        return tuple(self._subscriptions)

    def on_broker_request(self, transport: Transport, request: RemotingCommand) -> None:
        code = request.code
        if code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED:
            self.rebalance_soon()
        elif code == RequestCode.RESET_CONSUMER_CLIENT_OFFSET:
            self._reset_offsets(request.body)
        elif code == RequestCode.GET_CONSUMER_RUNNING_INFO:
            transport.respond(request, ResponseCode.SUCCESS, body=self._running_info())
        elif code == RequestCode.GET_CONSUMER_STATUS_FROM_CLIENT:
            transport.respond(request, ResponseCode.SUCCESS, body=self._consumer_status(request))
        elif code == RequestCode.CONSUME_MESSAGE_DIRECTLY:
            self._answer_consume_directly(transport, request)
        else:
            transport.respond(
                request,
                ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                remark=f"mqbox client: request code {code} not supported",
            )

    def _consumer_status(self, request: RemotingCommand) -> bytes:
        """GET_CONSUMER_STATUS_FROM_CLIENT (221): Java's GetConsumerStatusBody whose
        messageQueueTable holds this client's offsets of the topic (ext `topic`), as Java's
        MQClientInstance.getConsumerStatus answers (fastjson text, protocol/admin_bodies.py)."""
        topic = request.ext_fields.get("topic", "")
        offsets = self.offsets.snapshot()
        mine = {queue: offset for queue, offset in offsets.items() if queue.topic == topic}
        return admin_bodies.dumps_fastjson(admin_bodies.get_consumer_status_body({}, mine))

    def consume_directly(self, record: bytes, broker_name: str) -> dict[str, Any] | None:
        """CONSUME_MESSAGE_DIRECTLY's work: hand the stored record to the group's handler and
        give Java's ConsumeMessageDirectlyResult; None where the consumer has no handler (a
        pull consumer: Java answers only for push consumers)."""
        return None

    def _answer_consume_directly(self, transport: Transport, request: RemotingCommand) -> None:
        broker_name = request.ext_fields.get("brokerName", "")
        try:
            result = self.consume_directly(request.body, broker_name)
        except MqboxError as error:
            transport.respond(request, ResponseCode.SYSTEM_ERROR, remark=f"mqbox client: {error}")
            return
        if result is None:
            transport.respond(
                request,
                ResponseCode.SYSTEM_ERROR,
                remark=f"The Consumer Group <{self.group}> not exist in this consumer",
            )
            return
        body = admin_bodies.dumps_fastjson(result)
        transport.respond(request, ResponseCode.SUCCESS, body=body)

    def _running_info(self) -> bytes:
        """GET_CONSUMER_RUNNING_INFO's body: Java's ConsumerRunningInfo in plain JSON (its
        mqTable keyed by "topic@broker@queue" strings, not objects)."""
        statistics = self.statistics()
        with self._states_lock:
            states = list(self._states.values())
        return dumps_json(
            {
                "properties": {
                    "consumerGroup": self.group,
                    "clientId": self.client_id,
                    "messageModel": self.model.name,
                    "consumeType": self.consume_type.name,
                    "consumeFromWhere": self.consume_from.where.name,
                    "PROP_CONSUMER_START_TIMESTAMP": str(self.consume_timestamp_ms),
                },
                "subscriptionSet": [sub.to_json_value() for sub in self._subscriptions.values()],
                "mqTable": {
                    f"{s.queue.topic}@{s.queue.broker_name}@{s.queue.queue_id}": {
                        "nextOffset": s.next_offset,
                        "cachedMsgCount": s.pq.cached_count,
                        "cachedMsgSizeInMiB": s.pq.cached_size_bytes // (1024 * 1024),
                        "droped": s.pq.dropped,
                    }
                    for s in states
                },
                "statistics": {
                    name: value
                    for name, value in dataclasses.asdict(statistics).items()
                    if isinstance(value, int)
                },
            }
        )

    # -- subscriptions ----------------------------------------------------------------------------

    def _subscribe(self, topic: str, expression: str) -> Subscription:
        """FilterAPI's subscription of `topic`; after start, a heartbeat and a rebalance soon."""
        subscription = build_subscription(topic, expression, wall_clock_ms())
        self._subscriptions = {**self._subscriptions, topic: subscription}
        if self.running:
            self._update_route(topic)
            self.instance.heartbeat_soon()
            self.rebalance_soon()
        return subscription

    def subscription(self, topic: str) -> Subscription | None:
        return self._subscriptions.get(topic)

    # -- rebalance --------------------------------------------------------------------------------

    def rebalance_soon(self) -> None:
        """Rebalance on the instance's scheduler as soon as it is free (once, however often
        asked before it runs)."""
        if not self.running or self._rebalance_pending:
            return
        self._rebalance_pending = True

        def run() -> None:
            self._rebalance_pending = False
            self.rebalance()

        self.instance.scheduler.call_soon(self._task_names[0], run)

    def rebalance(self) -> None:
        """One round (B.3, B.5) over every subscribed topic; a topic that fails is logged and
        left as it was, the others go on. Then queues of topics no longer subscribed go."""
        if not self.running:
            return
        with self._rebalance_lock:
            self._count("rebalances")
            subscriptions = self._subscriptions
            for topic in subscriptions:
                try:
                    allocated = self._allocated_queues(topic)
                except MqboxError as error:
                    log.warning("%s: rebalancing %s failed: %s", self.group, topic, error)
                    continue
                if allocated is not None:
                    self._apply(topic, allocated)
            with self._states_lock:
                orphans = [s for s in self._states.values() if s.queue.topic not in subscriptions]
            for state in orphans:
                self._drop(state)

    def _topic_queues(self, topic: str) -> list[MessageQueue]:
        queues = list(self.instance.subscribe_queues(topic))
        if not queues:
            self.instance.update_route(topic)
            queues = list(self.instance.subscribe_queues(topic))
        return queues

    def _consumer_ids(self, topic: str) -> list[str] | None:
        """GET_CONSUMER_LIST_BY_GROUP (38) to a random broker of the topic's route, its master
        if it has one (findBrokerAddrByTopic); None when none answers with a list."""
        route = self.instance.route(topic)
        if route is None or not route.broker_datas:
            return None
        broker = self._rng.choice(route.broker_datas)
        addresses = broker.broker_addrs
        address = addresses.get(0) or (addresses[min(addresses)] if addresses else None)
        if address is None:
            return None
        response = self.instance.transport(address).invoke(
            RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": self.group}, b""
        )
        if response.code != ResponseCode.SUCCESS:
            log.info("%s: no consumer list from %s: %s", self.group, address, response.remark)
            return None
        return list(ConsumerListBody.from_json(response.body).consumer_id_list)

    def _apply(self, topic: str, allocated: list[MessageQueue]) -> None:
        """updateProcessQueueTableInRebalance for one topic (B.5)."""
        now = wall_clock_ms()
        with self._states_lock:
            held = {
                # A queue waiting for its OFFSET_ILLEGAL repair stays until the repair takes it
                # out, as Java keeps its dropped ProcessQueue in the table until then.
                queue: (state.pq.dropped and not state.repairing)
                or (not self.lite and state.pq.is_pull_expired(now))
                for queue, state in self._states.items()
                if queue.topic == topic
            }
        changes = queue_changes(held, allocated)
        changed = 0
        for queue in changes.drop:
            with self._states_lock:
                state = self._states.get(queue)
            if state is not None and self._drop(state):
                changed += 1
        for queue in changes.add:
            if self._add(queue):
                changed += 1
        if changed:
            self._count("queue_changes", changed)
            log.info("%s: %s now pulls %s", self.group, self.client_id, self.queues(topic))
            self.instance.heartbeat_soon()

    def _drop(self, state: QueueState) -> bool:
        """Rule 2: stop the queue, persist its offset, and take it out of the table unless the
        subclass postpones it."""
        state.releasing = True  # before `dropped`: a consumer seeing `dropped` may rely on it
        state.pq.dropped = True
        if not self._release_queue(state, self.timeout_ms):
            return False
        with self._states_lock:
            if self._states.get(state.queue) is state:
                del self._states[state.queue]
        return True

    def _add(self, queue: MessageQueue) -> bool:
        if not self._add_queue_allowed(queue):
            return False
        self.offsets.remove(queue)  # removeDirtyOffset
        try:
            offset = self._start_offset(queue)
        except ClientError as error:
            log.warning("%s: %s not added this round: %s", self.group, queue, error)
            return False
        if offset < 0:
            return False
        self._begin(queue, offset)
        return True

    def _begin(self, queue: MessageQueue, offset: int) -> QueueState:
        """Put a new QueueState for `queue` at `offset` into the table and pull it."""
        state = QueueState(queue, self._new_in_flight_table(wall_clock_ms()), offset)
        self._prepare(state)
        with self._states_lock:
            old = self._states.get(queue)
            if old is not None:
                old.pq.dropped = True
            self._states[queue] = state
        self._pull_soon(state, 0)
        return state

    def _prepare(self, state: QueueState) -> None:
        """A new state, before its first pull (orderly: it holds its lock already)."""

    def _master_transport(self, queue: MessageQueue) -> Transport:
        address = self.instance.master_address(queue.broker_name)
        if address is None:
            self.instance.update_route(queue.topic)
            address = self.instance.master_address(queue.broker_name)
        if address is None:
            raise NoRouteError(queue.topic, f"broker {queue.broker_name} has no master")
        return self.instance.transport(address)

    def _start_offset(self, queue: MessageQueue) -> int:
        """B.6 for `queue`; ClientError when asking the broker failed."""
        return start_offset(
            self.offsets.read_store(queue),
            self.consume_from,
            queue.topic.startswith(RETRY_TOPIC_PREFIX),
            max_offset=lambda: max_offset(
                self._master_transport(queue), queue.topic, queue.queue_id
            ),
            search_offset=lambda timestamp_ms: search_offset(
                self._master_transport(queue), queue.topic, queue.queue_id, timestamp_ms
            ),
            timestamp_ms=self.consume_timestamp_ms,
        )

    def queues(self, topic: str | None = None) -> list[MessageQueue]:
        """The queues this client pulls now (of `topic` only when given), sorted."""
        with self._states_lock:
            found = [queue for queue in self._states if topic is None or queue.topic == topic]
        return sorted(found, key=lambda q: (q.topic, q.broker_name, q.queue_id))

    # -- offsets ----------------------------------------------------------------------------------

    def persist_offsets(self) -> None:
        """persistConsumerOffset: every held offset of the queues pulled now (B.8)."""
        if not self.running:
            return
        with self._states_lock:
            queues = list(self._states)
        self.offsets.persist_all(queues, self.timeout_ms)

    def _reset_offsets(self, body: bytes) -> None:
        """RESET_CONSUMER_CLIENT_OFFSET (220): drop the queues named, hold and persist their new
        offsets, then rebalance (their states come back at those offsets). Java's resetOffset."""
        try:
            offsets = parse_reset_offsets(body)
        except ResetBodyError as error:
            log.warning("%s: reset ignored: %s", self.group, error)
            return
        with self._rebalance_lock:
            for queue, offset in offsets.items():
                with self._states_lock:
                    state = self._states.pop(queue, None)
                if state is not None:
                    state.pq.dropped = True
                self.offsets.update(queue, offset, increase_only=False)
            for queue, offset in offsets.items():
                if not self.offsets.persist(queue, self.timeout_ms):
                    log.warning(
                        "%s: reset offset %d of %s not persisted", self.group, offset, queue
                    )
        log.info("%s: offsets reset for %d queues", self.group, len(offsets))
        self.rebalance_soon()

    # -- the pull loop ----------------------------------------------------------------------------

    def _pull_soon(self, state: QueueState, delay_ms: int) -> None:
        if delay_ms:
            self._timers.call_later("pull-later", delay_ms, lambda: self._pull(state))
        else:
            self._timers.call_soon("pull", lambda: self._pull(state))

    def _pull(self, state: QueueState) -> None:
        """B.7's checks, then one async PULL (rule 1). On the pull timer thread."""
        pq = state.pq
        if pq.dropped or self._state == "shut down":
            return
        pq.mark_pulled(wall_clock_ms())
        with state.lock:
            flow = self._flow_control(state)
        delay = pull_delay_ms(
            dropped=pq.dropped,
            running=self.running,
            paused=self.paused,
            flow=flow,
            orderly_unlocked=self._orderly_unlocked(state),
        )
        if delay is None:
            return
        if delay:
            if flow is not None:
                self._count("flow_control_waits")
            self._pull_soon(state, delay)
            return
        queue = state.queue
        subscription = self._subscriptions.get(queue.topic)
        if subscription is None:  # check 8: unsubscribed meanwhile; the rebalance drops it
            self._pull_soon(state, PULL_DELAY_MS_WHEN_EXCEPTION)
            return
        commit_offset = None
        if self.clustering and not self.lite:
            held = self.offsets.read_memory(queue)
            commit_offset = held if held > 0 else None
        self._count("pulls")
        pull_callback(
            self.instance,
            queue.broker_name,
            queue.topic,
            queue.queue_id,
            state.next_offset,
            self.pull_batch_size,
            lambda result, error: self._pulled(state, subscription, result, error),
            group=self.group,
            subscription=subscription,
            suspend_timeout_ms=self.suspend_timeout_ms,
            commit_offset=commit_offset,
            broker_id=state.broker_id,
            lite=self.lite,
            timeout_ms=self.pull_timeout_ms,
        )

    def _pulled(
        self,
        state: QueueState,
        subscription: Subscription,
        result: PullResult | None,
        error: ClientError | None,
    ) -> None:
        """A PULL's answer (a transport's reading thread; B.7's outcomes)."""
        if error is not None:
            self._count("pull_failures")
            if not state.pq.dropped and self.running:
                self._pull_log.warning("%s: pull of %s failed: %s", self.group, state.queue, error)
            delay = PULL_DELAY_MS_WHEN_EXCEPTION
            if isinstance(error, BrokerError) and error.code == ResponseCode.FLOW_CONTROL:
                delay = PULL_DELAY_MS_WHEN_BROKER_FLOW_CONTROL
            self._pull_soon(state, delay)
            return
        assert result is not None
        if state.pq.dropped:
            return
        state.broker_id = result.suggest_which_broker_id
        status = result.status
        if status is PullStatus.FOUND:
            next_offset = result.next_begin_offset
            delay = 0
            if not result.batch.complete:  # pull_decode.py: deliver what is whole, pull again
                damaged_next = result.damaged_next_offset
                self._pull_log.warning(
                    "%s: the pull of %s at %d has a damaged record (%d whole before it)",
                    self.group,
                    state.queue,
                    state.next_offset,
                    len(result.batch),
                )
                if damaged_next is None:
                    next_offset, delay = state.next_offset, PULL_DELAY_MS_WHEN_EXCEPTION
                else:
                    next_offset = damaged_next
            self._count("pulled_messages", len(result.messages))
            self._deliver(state, result, next_offset)
            state.next_offset = next_offset
            self._pull_soon(state, delay)
            return
        if status is PullStatus.OFFSET_ILLEGAL:
            self._count("offset_illegal")
            log.warning(
                "%s: offset %d of %s is illegal; the broker says %d",
                self.group,
                state.next_offset,
                state.queue,
                result.next_begin_offset,
            )
            state.next_offset = result.next_begin_offset
            if self.lite:  # DefaultLitePullConsumer only logs it and goes on
                self._pull_soon(state, 0)
                return
            state.repairing = True
            state.pq.dropped = True
            self._timers.call_later(
                "offset-illegal",
                OFFSET_ILLEGAL_REPAIR_DELAY_MS,
                lambda: self._repair_illegal_offset(state, result.next_begin_offset),
            )
            return
        # NO_NEW_MSG, NO_MATCHED_MSG: correctTagsOffset, then pull again at once.
        state.next_offset = result.next_begin_offset
        self._correct_offset(state, result.next_begin_offset)
        self._pull_soon(state, 0)

    def _correct_offset(self, state: QueueState, next_offset: int) -> None:
        """Nothing cached: the group may commit `next_offset` (Java's correctTagsOffset)."""
        if self.lite:
            return
        with state.lock:
            empty = state.pq.cached_count == 0 and not state.pq.dropped
            if empty and isinstance(state.pq, BatchQueue):
                state.pq.advance(next_offset)
        if empty:
            self.offsets.update(state.queue, next_offset, increase_only=True)

    def _repair_illegal_offset(self, state: QueueState, offset: int) -> None:
        """10 s after OFFSET_ILLEGAL (B.7): hold and persist the broker's offset, forget the
        queue; the next rebalance brings it back there."""
        self.offsets.update(state.queue, offset, increase_only=False)
        self.offsets.persist(state.queue, self.timeout_ms)
        with self._states_lock:
            if self._states.get(state.queue) is state:
                del self._states[state.queue]
        self.rebalance_soon()

    # -- inspection -------------------------------------------------------------------------------

    def statistics(self) -> ConsumerStatistics:
        counts = self._counts
        return ConsumerStatistics(
            group=self.group,
            client_id=self.client_id,
            queues=tuple(self.queues()),
            rebalances=counts["rebalances"],
            queue_changes=counts["queue_changes"],
            pulls=counts["pulls"],
            pull_failures=counts["pull_failures"],
            pulled_messages=counts["pulled_messages"],
            flow_control_waits=counts["flow_control_waits"],
            offset_illegal=counts["offset_illegal"],
            consumed_messages=counts["consumed_messages"],
            reconsumed_messages=counts["reconsumed_messages"],
            sent_back=counts["sent_back"],
            send_back_failures=counts["send_back_failures"],
            dead_lettered=counts["dead_lettered"],
            offsets_persisted=self.offsets.persisted,
            offset_persist_failures=self.offsets.persist_failures,
        )
