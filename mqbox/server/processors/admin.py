"""The admin processor: every request that is neither a SEND nor a PULL.

Owns, in admin.0 (the only process that holds them; topology.py sends it the pulls' commits):
- the client tables (client_manager.py): HEART_BEAT (34), UNREGISTER_CLIENT (35), closed
  connections (CONNECTION_CLOSED from the workers) and 120 s of silence; the consumer list (38);
  NOTIFY_CONSUMER_IDS_CHANGED (40), sent as a broker request on each member's connection when a
  group's membership changes; a consumer group's first heartbeat creates its subscription group
  (config/subscriptionGroup.json, this process is its only writer) and its `%RETRY%<group>`
  topic (1 queue, perm 6, through topics.py, so it becomes routable); the group-subscriptions
  file that the pull processors read (admin_records.py);
- consumer offsets (consumer_offsets.py): QUERY_CONSUMER_OFFSET (14), UPDATE_CONSUMER_OFFSET (15),
  COMMIT_OFFSET records from the pull processors, consumerOffset.json every 5 s while changed and
  at an orderly stop;
- queue locks of orderly consumers (locks.py): LOCK_BATCH_MQ (41), UNLOCK_BATCH_MQ (42);
- the calls to clients: GET_CONSUMER_RUNNING_INFO (307) from an admin tool is sent on to the
  consumer's own connection and its answer relayed (below); RESET_CONSUMER_CLIENT_OFFSET (220)
  goes to every online member of a group whose offsets were reset (10003 or Java's
  INVOKE_BROKER_TO_RESET_OFFSET 222).
The worker sends admin_records.ADMIN_ZERO_CODES and every client's response to a broker request
to admin.0, whatever the connection, so any admin pool size serves them.
And, in every admin processor: the store queries through a read-only MessageStoreReader bounded
by the dispatcher's published counts (GET_MAX_OFFSET 30, GET_MIN_OFFSET 31,
SEARCH_OFFSET_BY_TIMESTAMP 29, GET_EARLIEST_MSG_STORETIME 32, VIEW_MESSAGE_BY_ID 33, QUERY_MESSAGE
12); topic admin through topics.py's file lock (UPDATE_AND_CREATE_TOPIC 17, DELETE_TOPIC_IN_BROKER
215, GET_ALL_TOPIC_CONFIG 21; the services role sees topics.json change and registers again);
CHECK_CLIENT_CONFIG (46: SUCCESS for TAG subscriptions, as Java answers; SYSTEM_ERROR naming the
expression type for SQL92 and the rest, Java's answer with enablePropertyFilter off, mqbox's
only mode); mqbox's own admin views (below); MQBOX_NOOP; REQUEST_CODE_NOT_SUPPORTED (3, with the
Java broker's remark) for every other code; and the admin pool's share of the base class's plumbing
(the workers' REQUEST_FAILED and idle CLOSE_CONNECTION).

DELETE_TOPIC_IN_BROKER removes the topic's configuration only (17 if there is none; system topics
stay, 1): the consume queues belong to the dispatcher and committed offsets stay, as in Java.
Should admin.k (k > 0) ever get one of ADMIN_ZERO_CODES, it answers SYSTEM_ERROR with a remark
(a worker bug; it holds no tables to answer from).

Never: writes the store, or holds a request other than a 307 waiting for its client (every other
answer goes out at once: the C++ client gives a lock request 1 s and closes its connection on a
timeout). A held 307 is a table entry, not a wait: the loop keeps serving everyone meanwhile.

Calls to clients (307), as Java's AdminBrokerProcessor.callConsumer: the member named by ext
`consumerGroup` and `clientId` must be online (else 1, "not online"); the request goes out on its
connection with the admin's ext and body and an opaque from this process's counter, and the
client's answer (code, remark, ext, body: the C++ body is not strict JSON, so it is relayed as
bytes) becomes the admin's answer. No answer within `client_call_timeout_ms` (10 s, Java's
callClient) gives 207 CONSUME_MSG_TIMEOUT, Java's code for that case; the client's connection
closing first gives 1 at once; more than CLIENT_CALL_COUNT_MAX calls in flight give 2
SYSTEM_BUSY. A client's response that matches no call (an answer to a oneway 40 or 220, or one
that came too late) is counted and dropped.

Limits (broker.conf, issue 9): a heartbeat naming more than mqboxHeartbeatGroupCountMax groups
(producer and consumer) or a consumer group with more than mqboxHeartbeatSubscriptionCountMax
subscriptions gets SYSTEM_ERROR (1) with a remark and changes nothing. New consumer groups are
created up to mqboxAutoCreateGroupCountMax configured groups; those past it are neither created
nor recorded, and the heartbeat gets 26 SUBSCRIPTION_GROUP_NOT_EXIST naming them (the others are
recorded). Retry topics past mqboxAutoCreateTopicCountMax (topics.py) give 17 TOPIC_NOT_EXIST;
their groups are recorded. Java bounds none of these; a client that named 1,500 groups left
1,514 topics behind. With autoCreateSubscriptionGroup=false an unknown group is recorded without
a config and the heartbeat succeeds, as in Java.

Bad input: a typed header or body that does not parse is answered SYSTEM_ERROR (1) with a remark
naming the field (RemoteProtocolError, answered by the base class); a group name outside
[A-Za-z0-9%|_-]{1,255} or a negative queue id, 1 as well; a topic that topics.json does not hold,
17 TOPIC_NOT_EXIST. Nothing from outside reaches an assert.

Broker requests (40) travel as REPLY records: the codec frames whatever command a REPLY holds, so
a request with flag ONEWAY and an opaque from this process's counter goes out on the client's
connection like a response. The counter starts at 2**30, far above the opaques clients use
(both the C++ and the Java client count theirs up from 0), because the codec tells the worker
the (connection, opaque) it saw, and the worker would stop tracking a client request with the
same opaque.

mqbox's own request codes (RocketMQ has GET_TOPIC_STATS_INFO 202 and GET_CONSUME_STATS 208, but
their bodies are maps keyed by JSON objects, which is not JSON; the private range 10000-10099
keeps mqbox's CLI off RocketMQ's numbers). Every ext value is a string, every body standard JSON:
- MQBOX_NOOP (10000): no ext, no body; SUCCESS at once (bench/hop.py).
- MQBOX_TOPIC_STATUS (10001): ext `topic`. Body {"topic", "queues": [{"queueId", "minOffset",
  "maxOffset", "lastUpdateTimestamp"}]}, one per queue id below max(read, write queue count);
  lastUpdateTimestamp is the newest message's store time (0 for an empty queue). 17 if unknown.
- MQBOX_CONSUMER_PROGRESS (10002): ext `consumerGroup`, optional `topic`. Body {"group",
  "clientIds", "totalLag", "queues": [{"topic", "queueId", "brokerOffset", "consumerOffset",
  "lag"}]} over the topics the group committed offsets for or subscribes to (or only `topic`).
  consumerOffset is -1 when nothing is committed; lag is brokerOffset minus consumerOffset, or
  minus minOffset when nothing is committed (where a new group would start, checklist rule 7).
  26 SUBSCRIPTION_GROUP_NOT_EXIST for a group nobody knows.
- MQBOX_RESET_CONSUMER_OFFSET (10003): ext `consumerGroup`, `topic`, `to` ("earliest", "latest"
  or "timestamp") and, for "timestamp", `timestamp` (ms). Sets the group's index of every read
  queue of the topic (to minOffset, maxOffset, or SEARCH_OFFSET_BY_TIMESTAMP's answer), saves
  consumerOffset.json at once, sends RESET_CONSUMER_CLIENT_OFFSET (220) to every online member
  of the group, and answers {"group", "topic", "queues": [{"queueId", "previousOffset",
  "offset"}], "clientsNotified"}.

Offset resets reach live consumers as Java's Broker2Client.resetOffset tells them: a oneway 220
on each member's connection, ext `topic`, `group`, `timestamp` (ms; -1 for latest, 0 for
earliest) and `isForce`, body the new offset table. The body is ResetOffsetBodyForC (a JSON list)
for members whose heartbeat said language CPP, and ResetOffsetBody (keyed by message queue, not
JSON) for the others, since neither client reads the other's form (admin_records.py). The C++
client drops its pull requests of those queues, commits the new offsets (15), and rebalances,
which starts them again from the broker's offset. Java's INVOKE_BROKER_TO_RESET_OFFSET (222, ext
`topic`, `group`, `timestamp` with -1 for the max offset, `isForce`) does the same, with Java's
rules: without isForce a queue only moves back; no online member gives 206 CONSUMER_NOT_ONLINE
and changes nothing; the answer's body is ResetOffsetBody. Unlike Java, mqbox also stores the new
offsets itself, so a client that ignores 220 cannot leave the broker's table stale for long.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import struct
import time
from collections.abc import Callable, Iterator
from typing import Any, Final, NoReturn

from mqbox.errors import ConfigError, MqboxError
from mqbox.message import STORETIMESTAMP_POSITION_BYTES
from mqbox.protocol.codes import FLAG_RESPONSE, LanguageCode, RequestCode, ResponseCode
from mqbox.protocol.command import (
    INT64_MAX,
    INT64_MIN,
    RemotingCommand,
    dumps_json,
    encode_header,
    loads_json,
    make_request,
)
from mqbox.protocol.errors import RemoteProtocolError
from mqbox.protocol.headers import (
    ConsumerGroupRequestHeader,
    ConsumerListBody,
    DataVersion,
    DeleteTopicRequestHeader,
    GetEarliestMsgStoretimeResponseHeader,
    HeartbeatData,
    LockBatchRequestBody,
    LockBatchResponseBody,
    OffsetResponseHeader,
    QueryConsumerOffsetRequestHeader,
    QueryMessageRequestHeader,
    QueryMessageResponseHeader,
    QueueRequestHeader,
    SearchOffsetRequestHeader,
    SubscriptionData,
    UnregisterClientRequestHeader,
    UpdateAndCreateTopicRequestHeader,
    UpdateConsumerOffsetRequestHeader,
    ViewMessageRequestHeader,
    parse_bool,
    validate_topic,
)
from mqbox.protocol.headers import TopicConfig as WireTopicConfig
from mqbox.server import admin_records, records
from mqbox.server.admin_records import (
    ADMIN_ZERO_CODES,
    INVOKE_BROKER_TO_RESET_OFFSET,
    MQBOX_CODE_FIRST,
    MQBOX_CODE_LAST,
    MQBOX_CONSUMER_PROGRESS,
    MQBOX_NOOP,
    MQBOX_RESET_CONSUMER_OFFSET,
    MQBOX_TOPIC_STATUS,
    RESET_TO_EARLIEST,
    RESET_TO_LATEST,
    RESET_TO_TIMESTAMP,
)
from mqbox.server.processors import Processor, Request, run_processor
from mqbox.server.processors.client_manager import (
    CLIENT_EXPIRY_MS_DEFAULT,
    ClientChange,
    ClientManager,
    group_name_problem,
)
from mqbox.server.processors.consumer_offsets import (
    PERSIST_INTERVAL_MS_DEFAULT,
    ConsumerOffsets,
    starting_queue_index,
)
from mqbox.server.processors.locks import LOCK_LIFETIME_MS_DEFAULT, QueueLocks
from mqbox.server.processors.topics import (
    PERM_READ_WRITE,
    RETRY_GROUP_TOPIC_PREFIX,
    TopicConfigStore,
    system_topics,
)
from mqbox.server.queue_counters import (
    QueueCounters,
    StorePositions,
    queue_counters_name,
    store_positions_name,
)
from mqbox.server.records import ConnectionEvent, Run
from mqbox.server.runtime import RoleContext
from mqbox.server.store_writer import store_config_of
from mqbox.server.topology import RoleKind
from mqbox.store import config_files
from mqbox.store.config_files import (
    SubscriptionGroupConfig,
    SubscriptionGroupTable,
    TopicConfig,
)
from mqbox.store.layout import config_dir
from mqbox.store.message_store import MessageStoreReader
from mqbox.store.read_plan import GetMessageStatus

log = logging.getLogger("mqbox.admin")

__all__ = [  # mqbox's own codes live in admin_records.py; these names stay importable from here
    "MQBOX_CODE_FIRST",
    "MQBOX_CODE_LAST",
    "MQBOX_CONSUMER_PROGRESS",
    "MQBOX_NOOP",
    "MQBOX_RESET_CONSUMER_OFFSET",
    "MQBOX_TOPIC_STATUS",
    "AdminProcessor",
    "main",
]

NOTIFY_OPAQUE_FIRST: Final = 1 << 30
NOTIFY_OPAQUE_LAST: Final = (1 << 31) - 1
HOUSEKEEPING_INTERVAL_NS: Final = 1_000_000_000
STORE_ATTACH_RETRY_NS: Final = 1_000_000_000
QUERY_MESSAGE_COUNT_MAX: Final = 64  # Java's maxMsgsNumBatch
UNIQUE_KEY_QUERY_COUNT: Final = 32  # Java's defaultQueryMaxNum, forced for UNIQ_KEY queries
QUERY_MESSAGE_BODY_SIZE_BYTES_MAX: Final = 8 << 20  # stay well below the 16 MiB frame limit
TOPIC_QUEUE_COUNT_MAX: Final = 1024  # as many as BenchmarkTest, the largest system topic
PERM_MAX: Final = 0xF
_STORE_TIMESTAMP: Final = struct.Struct(">q")
CLIENT_CALL_TIMEOUT_MS_DEFAULT: Final = 10_000  # Java's Broker2Client.callClient
CLIENT_CALL_COUNT_MAX: Final = 1024  # calls to clients (307) in flight at once
RESET_TIMESTAMP_LATEST: Final = -1  # 220/222 `timestamp` meaning "the max offset" (Java)
EXPRESSION_TYPE_TAG: Final = "TAG"
REMARK_NO_CONSUMER: Final = "no consumer for this group"
REMARK_QUERY_NOT_FOUND: Final = "mqbox: nothing committed, and the queue no longer starts at 0"

Handler = Callable[[Request], RemotingCommand | None]


def _wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


def _required(ext: dict[str, str], key: str, where: str) -> str:
    value = ext.get(key)
    if value is None:
        raise RemoteProtocolError(f"{where}: required field {key!r} is missing")
    return value


def _shown(text: str) -> str:
    """Text from outside, cut short for a remark."""
    return text if len(text) <= 100 else text[:97] + "..."


def _required_int(ext: dict[str, str], key: str, where: str) -> int:
    """A required 64-bit integer field (Java's long), as headers.py reads them."""
    text = _required(ext, key, where)
    try:
        value = int(text)
    except ValueError:
        raise RemoteProtocolError(
            f"{where}: field {key!r} is {text[:40]!r}, not an integer"
        ) from None
    if not INT64_MIN <= value <= INT64_MAX:
        raise RemoteProtocolError(f"{where}: field {key!r} = {text[:40]} does not fit 64 bits")
    return value


class StoreView:
    """The admin's read-only view of the store: a MessageStoreReader bounded by the published
    counts (queue_counters.py). Attached lazily and retried at most once a second, so a broker
    without store roles (the front-only topologies of the tests) still answers everything else."""

    def __init__(self, ctx: RoleContext, clock_ns: Callable[[], int]) -> None:
        self._ctx = ctx
        self._clock_ns = clock_ns
        self._reader: MessageStoreReader | None = None
        self._counters: QueueCounters | None = None
        self._positions: StorePositions | None = None
        self._retry_due_ns = 0

    def _attach(self) -> None:
        if self._reader is not None and self._counters is not None and self._positions is not None:
            return
        now_ns = self._clock_ns()
        if now_ns < self._retry_due_ns:
            return
        self._retry_due_ns = now_ns + STORE_ATTACH_RETRY_NS
        instance = self._ctx.instance
        if self._counters is None:
            with contextlib.suppress(FileNotFoundError, ConfigError):
                self._counters = QueueCounters.attach(queue_counters_name(instance))
        if self._positions is None:
            with contextlib.suppress(FileNotFoundError, ConfigError):
                self._positions = StorePositions.attach(store_positions_name(instance))
        if self._reader is None and self._counters is not None:
            # Only once the dispatcher published its table: before that the store may still be
            # in recovery, and the reader would fix its view of each queue too early.
            try:
                self._reader = MessageStoreReader.open(
                    self._ctx.store_root, store_config_of(self._ctx)
                )
            except (MqboxError, OSError) as error:
                log.warning("the store is not readable yet: %s", error)

    def for_queue(self, topic: str, queue_id: int) -> MessageStoreReader | None:
        """The reader with the queue's published entry count applied; None without a store."""
        assert queue_id >= 0
        self._attach()
        reader = self._reader
        if reader is None:
            return None
        counters = self._counters
        if counters is not None:
            count = counters.entry_count(topic.encode("utf-8"), queue_id)
            if count is not None:
                reader.observe_max_offset(topic, queue_id, count)
        if self._positions is not None:
            reader.observe_commit_log_min(self._positions.min_log_offset_bytes)
        return reader

    def for_log(self) -> MessageStoreReader | None:
        """The reader with the writer's published position applied (reads by log offset)."""
        self._attach()
        reader = self._reader
        if reader is None:
            return None
        if self._positions is not None:
            reader.observe_commit_log_end(self._positions.write_log_offset_bytes)
        return reader

    def last_store_timestamp_ms(self, topic: str, queue_id: int) -> int:
        """Store time of the queue's newest message; 0 if it has none or it is gone."""
        reader = self.for_queue(topic, queue_id)
        if reader is None:
            return 0
        max_queue_index = reader.max_offset(topic, queue_id)
        if max_queue_index <= reader.min_offset(topic, queue_id):
            return 0
        plan = reader.get_messages(topic, queue_id, max_queue_index - 1, 1)
        if plan.status is not GetMessageStatus.FOUND:
            return 0
        record = reader.read_plan_bytes(plan)
        value: int = _STORE_TIMESTAMP.unpack_from(record, STORETIMESTAMP_POSITION_BYTES)[0]
        return value

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        if self._counters is not None:
            self._counters.close()
            self._counters = None
        if self._positions is not None:
            self._positions.close()
            self._positions = None


@dataclasses.dataclass(frozen=True, slots=True)
class AdminStatistics:
    owns_state: bool
    client_responses: int  # clients' answers to broker requests, dropped
    unsupported_requests: int
    notifications_sent: int  # NOTIFY_CONSUMER_IDS_CHANGED requests
    commit_records: int  # COMMIT_OFFSET records from pull processors
    commit_records_refused: int  # with a bad group or topic name
    subscriptions_file_writes: int
    consumer_count: int
    producer_count: int
    offsets_persisted: int
    locks_held: int
    client_calls_pending: int  # 307s waiting for their client
    client_calls_relayed: int
    client_calls_failed: int  # timed out, or the client's connection closed first
    reset_notices_sent: int  # RESET_CONSUMER_CLIENT_OFFSET requests


@dataclasses.dataclass(slots=True)
class _ClientCall:
    """A 307 sent on to a client, waiting for its answer."""

    request: Request  # the admin's request, answered with the client's response
    group: str
    client_id: str
    deadline_ns: int  # self.clock_ns() terms


class AdminProcessor(Processor):
    """Answers by request code from `handlers`; codes without a handler get 3."""

    kind = RoleKind.ADMIN

    def __init__(
        self,
        ctx: RoleContext,
        *,
        clock_ns: Callable[[], int] = time.monotonic_ns,
        wall_clock_ms: Callable[[], int] = _wall_clock_ms,
        client_expiry_ms: int = CLIENT_EXPIRY_MS_DEFAULT,
        lock_lifetime_ms: int = LOCK_LIFETIME_MS_DEFAULT,
        offset_persist_interval_ms: int = PERSIST_INTERVAL_MS_DEFAULT,
        client_call_timeout_ms: int = CLIENT_CALL_TIMEOUT_MS_DEFAULT,
        **options: Any,
    ) -> None:
        super().__init__(ctx, **options)
        assert client_call_timeout_ms > 0
        self.client_call_timeout_ns = client_call_timeout_ms * 1_000_000
        self.clock_ns = clock_ns
        self.wall_clock_ms = wall_clock_ms
        # admin.0 owns the client, offset and lock tables and the files behind them.
        self.owns_state = ctx.role.index == 0
        self.config_dir = config_dir(ctx.store_root)
        self.clients = ClientManager(expiry_ns=client_expiry_ms * 1_000_000)
        self.offsets = ConsumerOffsets(
            self.config_dir if self.owns_state else None,
            persist_interval_ns=offset_persist_interval_ms * 1_000_000,
        )
        self.locks = QueueLocks(lifetime_ns=lock_lifetime_ms * 1_000_000)
        self.topics = TopicConfigStore(ctx.store_root, ctx.broker)
        self.store = StoreView(ctx, clock_ns)
        self.subscription_groups: SubscriptionGroupTable = SubscriptionGroupTable()
        if self.owns_state:
            self.offsets.load()
            self.subscription_groups = config_files.load_subscription_groups(
                self.config_dir, use_backup_if_corrupt=True
            )
        self._system_topic_names = frozenset(t.topic_name for t in system_topics(ctx.broker))
        self._notify_pending: set[str] = set()
        # (client conn id, opaque of the request sent to it) -> the 307 waiting for the answer
        self._client_calls: dict[tuple[int, int], _ClientCall] = {}
        self._notify_opaques = self._opaque_counter()
        self._subscriptions_version = 0
        self._housekeeping_due_ns = clock_ns() + HOUSEKEEPING_INTERVAL_NS
        self.handlers: dict[int, Handler] = {
            RequestCode.HEART_BEAT: self._heartbeat,
            RequestCode.UNREGISTER_CLIENT: self._unregister_client,
            RequestCode.GET_CONSUMER_LIST_BY_GROUP: self._consumer_list,
            RequestCode.QUERY_CONSUMER_OFFSET: self._query_consumer_offset,
            RequestCode.UPDATE_CONSUMER_OFFSET: self._update_consumer_offset,
            RequestCode.GET_MAX_OFFSET: self._max_offset,
            RequestCode.GET_MIN_OFFSET: self._min_offset,
            RequestCode.SEARCH_OFFSET_BY_TIMESTAMP: self._search_offset,
            RequestCode.GET_EARLIEST_MSG_STORETIME: self._earliest_store_time,
            RequestCode.VIEW_MESSAGE_BY_ID: self._view_message,
            RequestCode.QUERY_MESSAGE: self._query_message,
            RequestCode.LOCK_BATCH_MQ: self._lock_batch,
            RequestCode.UNLOCK_BATCH_MQ: self._unlock_batch,
            RequestCode.UPDATE_AND_CREATE_TOPIC: self._update_and_create_topic,
            RequestCode.DELETE_TOPIC_IN_BROKER: self._delete_topic,
            RequestCode.GET_ALL_TOPIC_CONFIG: self._all_topic_config,
            RequestCode.CHECK_CLIENT_CONFIG: self._check_client_config,
            RequestCode.GET_CONSUMER_RUNNING_INFO: self._consumer_running_info,
            INVOKE_BROKER_TO_RESET_OFFSET: self._invoke_broker_to_reset_offset,
            MQBOX_NOOP: self._acknowledge,
            MQBOX_TOPIC_STATUS: self._topic_status,
            MQBOX_CONSUMER_PROGRESS: self._consumer_progress,
            MQBOX_RESET_CONSUMER_OFFSET: self._reset_consumer_offset,
        }
        self.client_responses = 0
        self.unsupported_requests = 0
        self._notifications_sent = 0
        self._commit_records = 0
        self._commit_records_refused = 0
        self._subscriptions_file_writes = 0
        self._client_calls_relayed = 0
        self._client_calls_failed = 0
        self._reset_notices_sent = 0

    # -- the loop ---------------------------------------------------------------------------------

    def _on_stop_requested(self) -> None:
        """The base's stop, plus the offsets saved before an orderly exit (SIGTERM)."""
        self.on_stop()
        self._flush()

    def on_stop(self) -> None:
        """Save what must survive the stop: the offsets committed since the last save."""
        self.offsets.persist_now()

    def handle(self, request: Request) -> None:
        if request.flag & FLAG_RESPONSE:
            self._on_client_response(request)
            return
        handler = self.handlers.get(request.code)
        if handler is None:
            self.unsupported_requests += 1
            super().handle(request)  # REQUEST_CODE_NOT_SUPPORTED
            return
        if not self.owns_state and request.code in ADMIN_ZERO_CODES:
            self.reply(
                request,
                request.make_response(
                    ResponseCode.SYSTEM_ERROR,
                    {},
                    remark=f"mqbox: {self.role_id} does not hold the client and offset tables; "
                    f"code {request.code} belongs to admin.0 (a routing bug in the worker)",
                ),
            )
            return
        response = handler(request)
        if response is not None:
            self.reply(request, response)

    def on_connection_closed(self, event: ConnectionEvent) -> None:
        if self.owns_state:
            self._apply(self.clients.connection_closed(event.conn_id))
        if self._client_calls:
            for key in [key for key in self._client_calls if key[0] == event.conn_id]:
                call = self._client_calls.pop(key)
                self._fail_client_call(call, ResponseCode.SYSTEM_ERROR, "its connection closed")

    def on_record(self, producer: str, record_type: int, payload: memoryview) -> None:
        if record_type != admin_records.COMMIT_OFFSET:
            super().on_record(producer, record_type, payload)
            return
        assert self.owns_state, "COMMIT_OFFSET reaches admin.0 only (topology.py)"
        commit = admin_records.unpack_commit_offset(payload, 0, len(payload))
        self._commit_records += 1
        if (
            group_name_problem(commit.group) is not None
            or validate_topic(commit.topic) is not None
            or not self.offsets.commit(
                commit.group, commit.topic, commit.queue_id, commit.queue_index, self.clock_ns()
            )
        ):
            self._commit_records_refused += 1

    def on_tick(self, now_ns: int) -> None:
        self._send_notifications()
        clock_now_ns = self.clock_ns()
        if self._client_calls:
            self._expire_client_calls(clock_now_ns)
        if clock_now_ns >= self._housekeeping_due_ns:
            self._housekeeping_due_ns = clock_now_ns + HOUSEKEEPING_INTERVAL_NS
            self.housekeeping(clock_now_ns)

    def next_deadline_ns(self) -> int | None:
        # Notifications wait for the end of the turn, so a burst of heartbeats sends one each.
        return 0 if self._notify_pending else None

    def housekeeping(self, now_ns: int) -> None:
        """Once a second (on_tick): silent clients, expired locks, the offsets' save schedule."""
        if not self.owns_state:
            return
        self._apply(self.clients.expire(now_ns))
        self.locks.expire(now_ns)
        self.offsets.persist_if_due(now_ns)
        self._send_notifications()

    # -- clients ----------------------------------------------------------------------------------

    def _heartbeat(self, request: Request) -> RemotingCommand:
        """HEART_BEAT (34), within the limits of broker.conf (module docstring, "Limits")."""
        command = request.command
        data = HeartbeatData.from_json(command.body)
        limits = self.ctx.broker.limits
        group_count = len(data.producer_data_set) + len(data.consumer_data_set)
        if group_count > limits.heartbeat_group_count_max:
            return request.make_response(
                ResponseCode.SYSTEM_ERROR,
                {},
                remark=f"mqbox: the heartbeat names {group_count} groups, more than "
                f"mqboxHeartbeatGroupCountMax={limits.heartbeat_group_count_max}",
            )
        for consumer in data.consumer_data_set:
            problem = group_name_problem(consumer.group_name)
            if problem is not None:
                raise RemoteProtocolError(f"HeartbeatData.consumerDataSet[].groupName: {problem}")
            subscription_count = len(consumer.subscription_data_set)
            if subscription_count > limits.heartbeat_subscription_count_max:
                return request.make_response(
                    ResponseCode.SYSTEM_ERROR,
                    {},
                    remark=f"mqbox: group {consumer.group_name} has {subscription_count} "
                    f"subscriptions, more than mqboxHeartbeatSubscriptionCountMax="
                    f"{limits.heartbeat_subscription_count_max}",
                )
        groups_refused, topics_refused = self._ensure_groups(
            [consumer.group_name for consumer in data.consumer_data_set]
        )
        if groups_refused:
            data = dataclasses.replace(
                data,
                consumer_data_set=tuple(
                    consumer
                    for consumer in data.consumer_data_set
                    if consumer.group_name not in groups_refused
                ),
            )
        change = self.clients.heartbeat(
            data,
            request.conn_id,
            self.clock_ns(),
            language=command.language.name,
            version=command.version,
        )
        self._apply(change)
        if groups_refused:
            return request.make_response(
                ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
                {},
                remark=f"mqbox: subscription groups not created, the broker holds "
                f"{len(self.subscription_groups.groups)}, mqboxAutoCreateGroupCountMax="
                f"{limits.auto_create_group_count_max}: {_listed(sorted(groups_refused))}",
            )
        if topics_refused:
            return request.make_response(
                ResponseCode.TOPIC_NOT_EXIST,
                {},
                remark=f"mqbox: retry topics not created, the broker holds "
                f"{len(self.topics.topics())} topics, mqboxAutoCreateTopicCountMax="
                f"{limits.auto_create_topic_count_max}: {_listed(topics_refused)}",
            )
        return request.make_response(ResponseCode.SUCCESS, {})

    def _unregister_client(self, request: Request) -> RemotingCommand:
        header = UnregisterClientRequestHeader.from_ext(request.command.ext_fields)
        self._apply(
            self.clients.unregister(header.client_id, header.producer_group, header.consumer_group)
        )
        return request.make_response(ResponseCode.SUCCESS, {})

    def _consumer_list(self, request: Request) -> RemotingCommand:
        header = ConsumerGroupRequestHeader.from_ext(request.command.ext_fields)
        client_ids = self.clients.consumer_ids(header.consumer_group)
        if not client_ids:
            return request.make_response(ResponseCode.SYSTEM_ERROR, {}, remark=REMARK_NO_CONSUMER)
        body = ConsumerListBody(tuple(client_ids)).to_json()
        return request.make_response(ResponseCode.SUCCESS, {}, body=body)

    def _check_client_config(self, request: Request) -> RemotingCommand:
        """CHECK_CLIENT_CONFIG (46), as Java's ClientManageProcessor answers it with
        enablePropertyFilter off: TAG subscriptions (type absent, "" or "TAG") and a body
        without subscriptionData are fine; any other expression type cannot be served."""
        where = "CheckClientRequestBody"
        body = request.command.body
        if not body:
            raise RemoteProtocolError(f"{where}: the body is empty")
        document = loads_json(body)
        if not isinstance(document, dict):
            raise RemoteProtocolError(f"{where}: the body is not a JSON object")
        value = document.get("subscriptionData")
        if value is None:
            return request.make_response(ResponseCode.SUCCESS, {})
        subscription = SubscriptionData.from_json_value(value, f"{where}.subscriptionData")
        expression_type = subscription.expression_type
        if expression_type in ("", EXPRESSION_TYPE_TAG):
            return request.make_response(ResponseCode.SUCCESS, {})
        return request.make_response(
            ResponseCode.SYSTEM_ERROR,
            {},
            remark=f"The broker does not support consumer to filter message by "
            f"{_shown(expression_type)}: mqbox filters by TAG only",
        )

    def _ensure_groups(self, names: list[str]) -> tuple[frozenset[str], list[str]]:
        """Each consumer group's subscription group config and `%RETRY%<group>` topic, made by
        a heartbeat when missing, as the Java broker makes them (docs/protocol.md section
        4.3); returns (the groups refused, the retry topics refused), both for full tables.
        Looked at on every heartbeat (two dict lookups per group), so a retry topic deleted by
        any admin processor comes back with the group's next heartbeat.

        All the groups of one heartbeat cost one write of subscriptionGroup.json and one of
        topics.json: a heartbeat of 1,500 new groups wrote both files whole once per group,
        3,000 growing files and 6,000 fsyncs, 16.7 s during which admin.0 served nobody."""
        groups = self.subscription_groups.groups
        missing = [name for name in dict.fromkeys(names) if name not in groups]
        refused: frozenset[str] = frozenset()
        if missing and self.ctx.broker.auto_create_subscription_group:
            room = max(0, self.ctx.broker.limits.auto_create_group_count_max - len(groups))
            refused = frozenset(missing[room:])
            if room:
                groups = dict(groups)
                groups.update((name, SubscriptionGroupConfig(name)) for name in missing[:room])
                version = self.subscription_groups.data_version
                table = SubscriptionGroupTable(
                    groups,
                    config_files.DataVersion(self.wall_clock_ms(), version.counter + 1),
                )
                config_files.save_subscription_groups(self.config_dir, table)
                self.subscription_groups = table
        retry_topics: list[TopicConfig] = []
        for name in dict.fromkeys(names):
            config = groups.get(name)
            retry_topic = RETRY_GROUP_TOPIC_PREFIX + name
            if (
                config is not None
                and self.topics.get(retry_topic) is None
                and validate_topic(retry_topic) is None
            ):
                queue_count = max(1, config.retry_queue_nums)
                retry_topics.append(
                    TopicConfig(retry_topic, queue_count, queue_count, PERM_READ_WRITE)
                )
        _created, topics_refused = self.topics.create_many_if_absent(retry_topics)
        return refused, topics_refused

    def _apply(self, change: ClientChange) -> None:
        """Act on what a client table change did: the pulls' file, then notices at turn end."""
        if change.subscriptions_changed:
            self._subscriptions_version += 1
            admin_records.write_group_subscriptions(
                self.ctx.store_root,
                self.clients.group_subscriptions(),
                self._subscriptions_version,
                self.wall_clock_ms(),
            )
            self._subscriptions_file_writes += 1
        self._notify_pending.update(change.groups_changed)

    def _send_notifications(self) -> None:
        if not self._notify_pending:
            return
        pending = sorted(self._notify_pending)
        self._notify_pending.clear()
        for group in pending:
            config = self.subscription_groups.groups.get(group)
            if config is not None and not config.notify_consumer_ids_changed_enable:
                continue
            ext = ConsumerGroupRequestHeader(group).to_ext()
            for conn_id in self.clients.consumer_connections(group):
                self.send_request(
                    conn_id,
                    make_request(
                        RequestCode.NOTIFY_CONSUMER_IDS_CHANGED,
                        next(self._notify_opaques),
                        dict(ext),
                        oneway=True,
                    ),
                )
                self._notifications_sent += 1

    def send_request(self, conn_id: int, command: RemotingCommand) -> None:
        """Send a broker request to a client on its connection (module docstring): oneway (40,
        220), or a call (307) whose answer comes back through handle() with the same opaque."""
        assert command.flag & FLAG_RESPONSE == 0
        assert NOTIFY_OPAQUE_FIRST <= command.opaque <= NOTIFY_OPAQUE_LAST
        header = encode_header(command)
        # Marked as a request, so the codec does not count it as an answer (in-flight limit).
        self._append_reply(
            conn_id,
            command,
            header,
            b"",
            len(command.body),
            command.body,
            records.REPLY_FLAG_REQUEST,
        )

    # -- calls to clients -------------------------------------------------------------------------

    def _consumer_running_info(self, request: Request) -> RemotingCommand | None:
        """307 from an admin: send it on to the consumer and answer later with its response
        (module docstring); None when the call is out."""
        command = request.command
        ext = command.ext_fields
        where = "GetConsumerRunningInfoRequestHeader"
        group = _required(ext, "consumerGroup", where)
        client_id = _required(ext, "clientId", where)
        self._check_group(group)
        member = self.clients.consumer_member(group, client_id)
        if member is None:
            return request.make_response(
                ResponseCode.SYSTEM_ERROR,
                {},
                remark=f"The Consumer <{group}> <{_shown(client_id)}> not online",
            )
        if len(self._client_calls) >= CLIENT_CALL_COUNT_MAX:
            return request.make_response(
                ResponseCode.SYSTEM_BUSY,
                {},
                remark=f"mqbox: {CLIENT_CALL_COUNT_MAX} calls to clients are in flight already",
            )
        header_size = len(encode_header(command))
        if header_size + len(command.body) > self.frame_size_bytes_max // 2:
            return request.make_response(
                ResponseCode.SYSTEM_ERROR, {}, remark="mqbox: the request is too large to forward"
            )
        opaque = next(self._notify_opaques)
        self.send_request(
            member.conn_id,
            make_request(
                RequestCode.GET_CONSUMER_RUNNING_INFO, opaque, dict(ext), body=command.body
            ),
        )
        deadline_ns = self.clock_ns() + self.client_call_timeout_ns
        self._client_calls[(member.conn_id, opaque)] = _ClientCall(
            request, group, client_id, deadline_ns
        )
        return None

    def _on_client_response(self, response: Request) -> None:
        """A client answered a broker request: relay it if a 307 waits for it, else drop it."""
        call = self._client_calls.pop((response.conn_id, response.opaque), None)
        if call is None:
            self.client_responses += 1  # to a oneway 40 or 220, or too late: nothing waits
            return
        answer = response.command
        self._client_calls_relayed += 1
        self.reply(
            call.request,
            call.request.make_response(
                answer.code, dict(answer.ext_fields), remark=answer.remark, body=answer.body
            ),
        )

    def _expire_client_calls(self, now_ns: int) -> None:
        expired = [key for key, call in self._client_calls.items() if call.deadline_ns <= now_ns]
        timeout_ms = self.client_call_timeout_ns // 1_000_000
        for key in expired:
            call = self._client_calls.pop(key)
            why = f"no answer within {timeout_ms} ms"
            self._fail_client_call(call, ResponseCode.CONSUME_MSG_TIMEOUT, why)

    def _fail_client_call(self, call: _ClientCall, code: int, why: str) -> None:
        self._client_calls_failed += 1
        remark = f"mqbox: consumer <{call.group}> <{_shown(call.client_id)}>: {why}"
        self.reply(call.request, call.request.make_response(code, {}, remark=remark))

    def _notify_offset_reset(
        self, group: str, topic: str, offsets: dict[int, int], timestamp_ms: int, is_force: bool
    ) -> int:
        """RESET_CONSUMER_CLIENT_OFFSET (220, oneway) to every online member of the group, in
        its language's body form (module docstring); how many were told."""
        members = self.clients.consumer_members(group)
        if not members:
            return 0
        ext = {
            "topic": topic,
            "group": group,
            "timestamp": str(timestamp_ms),
            "isForce": "true" if is_force else "false",
        }
        broker_name = self.ctx.broker.broker_name
        body_cpp = admin_records.encode_reset_offset_body_cpp(broker_name, topic, offsets)
        body_java = admin_records.encode_reset_offset_body_java(broker_name, topic, offsets)
        for member in members:
            body = body_cpp if member.language == LanguageCode.CPP.name else body_java
            self.send_request(
                member.conn_id,
                make_request(
                    RequestCode.RESET_CONSUMER_CLIENT_OFFSET,
                    next(self._notify_opaques),
                    dict(ext),
                    body=body,
                    oneway=True,
                ),
            )
        self._reset_notices_sent += len(members)
        return len(members)

    @staticmethod
    def _opaque_counter() -> Iterator[int]:
        while True:
            yield from range(NOTIFY_OPAQUE_FIRST, NOTIFY_OPAQUE_LAST + 1)

    # -- offsets ----------------------------------------------------------------------------------

    def _check_group(self, group: str) -> None:
        problem = group_name_problem(group)
        if problem is not None:
            raise RemoteProtocolError(f"consumerGroup: {problem}")

    @staticmethod
    def _check_queue_id(queue_id: int) -> None:
        if queue_id < 0:
            raise RemoteProtocolError(f"queueId: {queue_id} is negative")

    def _unknown_queue(self, request: Request, topic: str, queue_id: int) -> RemotingCommand | None:
        """_unknown_topic's answer, or SYSTEM_ERROR for a queue id the topic does not have
        (negative, or at least max(read, write queue count)); None for a queue that exists.
        Java answers such queues as empty ones; mqbox refuses them, so no offset is ever
        committed for a queue that cannot exist."""
        self._check_queue_id(queue_id)
        config = self._topic_or_error(request, topic)
        if isinstance(config, RemotingCommand):
            return config
        queue_count = max(config.read_queue_nums, config.write_queue_nums)
        if queue_id >= queue_count:
            return request.make_response(
                ResponseCode.SYSTEM_ERROR,
                {},
                remark=f"mqbox: queueId {queue_id} is illegal: topic {topic} has {queue_count} "
                "queues",
            )
        return None

    def _unknown_topic(self, request: Request, topic: str) -> RemotingCommand | None:
        """17 TOPIC_NOT_EXIST if topics.json does not hold `topic`; None if it does."""
        found = self._topic_or_error(request, topic)
        return found if isinstance(found, RemotingCommand) else None

    def _topic_or_error(self, request: Request, topic: str) -> TopicConfig | RemotingCommand:
        """The topic's configuration (looked at afresh on a miss, as another process may have
        made it a moment ago), or 17 TOPIC_NOT_EXIST. Callers keep the configuration they got:
        asking again may find the topic deleted meanwhile."""
        config = self.topics.get(topic) or self.topics.get_fresh(topic)
        if config is not None:
            return config
        return request.make_response(
            ResponseCode.TOPIC_NOT_EXIST,
            {},
            remark=f"mqbox: topic {_shown(topic)} does not exist on this broker",
        )

    def _no_store(self, request: Request) -> RemotingCommand:
        return request.make_response(
            ResponseCode.SYSTEM_ERROR, {}, remark="mqbox: the store is not readable yet"
        )

    def _query_consumer_offset(self, request: Request) -> RemotingCommand:
        header = QueryConsumerOffsetRequestHeader.from_ext(request.command.ext_fields)
        self._check_group(header.consumer_group)
        error = self._unknown_queue(request, header.topic, header.queue_id)
        if error is not None:
            return error
        committed = self.offsets.query(header.consumer_group, header.topic, header.queue_id)
        min_queue_index = 0
        if committed is None:
            reader = self.store.for_queue(header.topic, header.queue_id)
            if reader is not None:
                min_queue_index = reader.min_offset(header.topic, header.queue_id)
        queue_index = starting_queue_index(committed, min_queue_index)
        if queue_index is None:
            return request.make_response(
                ResponseCode.QUERY_NOT_FOUND, {}, remark=REMARK_QUERY_NOT_FOUND
            )
        return request.make_response(
            ResponseCode.SUCCESS, OffsetResponseHeader(queue_index).to_ext()
        )

    def _update_consumer_offset(self, request: Request) -> RemotingCommand:
        header = UpdateConsumerOffsetRequestHeader.from_ext(request.command.ext_fields)
        self._check_group(header.consumer_group)
        error = self._unknown_queue(request, header.topic, header.queue_id)
        if error is not None:
            return error
        if header.commit_queue_index < 0:
            raise RemoteProtocolError(f"commitOffset: {header.commit_queue_index} is negative")
        self.offsets.commit(
            header.consumer_group,
            header.topic,
            header.queue_id,
            header.commit_queue_index,
            self.clock_ns(),
        )
        return request.make_response(ResponseCode.SUCCESS, {})

    # -- store queries ----------------------------------------------------------------------------

    def _queue_reader(
        self, request: Request, header: QueueRequestHeader | SearchOffsetRequestHeader
    ) -> MessageStoreReader | RemotingCommand:
        error = self._unknown_queue(request, header.topic, header.queue_id)
        if error is not None:
            return error
        reader = self.store.for_queue(header.topic, header.queue_id)
        return self._no_store(request) if reader is None else reader

    def _max_offset(self, request: Request) -> RemotingCommand:
        header = QueueRequestHeader.from_ext(request.command.ext_fields)
        reader = self._queue_reader(request, header)
        if isinstance(reader, RemotingCommand):
            return reader
        queue_index = reader.max_offset(header.topic, header.queue_id)
        return request.make_response(
            ResponseCode.SUCCESS, OffsetResponseHeader(queue_index).to_ext()
        )

    def _min_offset(self, request: Request) -> RemotingCommand:
        header = QueueRequestHeader.from_ext(request.command.ext_fields)
        reader = self._queue_reader(request, header)
        if isinstance(reader, RemotingCommand):
            return reader
        queue_index = reader.min_offset(header.topic, header.queue_id)
        return request.make_response(
            ResponseCode.SUCCESS, OffsetResponseHeader(queue_index).to_ext()
        )

    def _search_offset(self, request: Request) -> RemotingCommand:
        header = SearchOffsetRequestHeader.from_ext(request.command.ext_fields)
        reader = self._queue_reader(request, header)
        if isinstance(reader, RemotingCommand):
            return reader
        queue_index = reader.search_offset_by_timestamp(
            header.topic, header.queue_id, header.timestamp_ms
        )
        return request.make_response(
            ResponseCode.SUCCESS, OffsetResponseHeader(queue_index).to_ext()
        )

    def _earliest_store_time(self, request: Request) -> RemotingCommand:
        header = QueueRequestHeader.from_ext(request.command.ext_fields)
        reader = self._queue_reader(request, header)
        if isinstance(reader, RemotingCommand):
            return reader
        timestamp_ms = reader.earliest_message_store_timestamp_ms(header.topic, header.queue_id)
        return request.make_response(
            ResponseCode.SUCCESS, GetEarliestMsgStoretimeResponseHeader(timestamp_ms).to_ext()
        )

    def _record_run(self, log_offset_bytes: int, size_bytes: int) -> Run:
        """Where a stored record lies in its commit-log segment: the reactor sends it from there
        with os.sendfile, as a pull's body. A copy in the reply would travel as spill files and
        sit in the reactor's memory for a client that does not read (issue 9: 3.3 GB of spill
        files for 24 such clients asking 40 times each for a 3.9 MB message)."""
        segment_size_bytes = self.ctx.broker.commit_log_segment_size_bytes
        file_offset_bytes = log_offset_bytes % segment_size_bytes
        assert file_offset_bytes + size_bytes <= segment_size_bytes, "records never span segments"
        return Run(log_offset_bytes - file_offset_bytes, file_offset_bytes, size_bytes)

    def _view_message(self, request: Request) -> RemotingCommand | None:
        header = ViewMessageRequestHeader.from_ext(request.command.ext_fields)
        reader = self.store.for_log()
        if reader is None:
            return self._no_store(request)
        record = reader.read_message(header.log_offset_bytes)
        if record is None:
            return request.make_response(
                ResponseCode.SYSTEM_ERROR,
                {},
                remark=f"no message at commit log offset {header.log_offset_bytes}",
            )
        run = self._record_run(header.log_offset_bytes, len(record))
        self.reply_with_runs(request, request.make_response(ResponseCode.SUCCESS, {}), [run])
        return None

    def _query_message(self, request: Request) -> RemotingCommand | None:
        header = QueryMessageRequestHeader.from_ext(request.command.ext_fields)
        error = self._unknown_topic(request, header.topic)
        if error is not None:
            return error
        reader = self.store.for_log()
        if reader is None:
            return self._no_store(request)
        if header.unique_key_query:
            count_max = UNIQUE_KEY_QUERY_COUNT
        else:
            count_max = min(max(header.message_count_max, 1), QUERY_MESSAGE_COUNT_MAX)
        found = reader.query_records_by_key(
            header.topic,
            header.key,
            header.begin_timestamp_ms,
            header.end_timestamp_ms,
            count_max,
        )
        runs: list[Run] = []
        size_bytes = 0
        newest_ms = 0
        newest_log_offset_bytes = 0
        for log_offset_bytes, record in found:
            if runs and size_bytes + len(record) > QUERY_MESSAGE_BODY_SIZE_BYTES_MAX:
                break
            runs.append(self._record_run(log_offset_bytes, len(record)))
            size_bytes += len(record)
            store_ms: int = _STORE_TIMESTAMP.unpack_from(record, STORETIMESTAMP_POSITION_BYTES)[0]
            newest_ms = max(newest_ms, store_ms)
            newest_log_offset_bytes = max(newest_log_offset_bytes, log_offset_bytes)
        if not runs:
            return request.make_response(
                ResponseCode.QUERY_NOT_FOUND,
                {},
                remark="mqbox: no message of this topic carries the key in the time range",
            )
        # Java answers with the index file's newest entry; mqbox with the newest record found,
        # which is what a client merging answers from several brokers compares.
        ext = QueryMessageResponseHeader(newest_ms, newest_log_offset_bytes).to_ext()
        self.reply_with_runs(request, request.make_response(ResponseCode.SUCCESS, ext), runs)
        return None

    # -- orderly consumers ------------------------------------------------------------------------

    def _lock_batch(self, request: Request) -> RemotingCommand:
        body = LockBatchRequestBody.from_json(request.command.body)
        granted = self.locks.lock(body.consumer_group, body.client_id, body.mq_set, self.clock_ns())
        return request.make_response(
            ResponseCode.SUCCESS, {}, body=LockBatchResponseBody(tuple(granted)).to_json()
        )

    def _unlock_batch(self, request: Request) -> RemotingCommand:
        body = LockBatchRequestBody.from_json(request.command.body)
        self.locks.unlock(body.consumer_group, body.client_id, body.mq_set)
        return request.make_response(ResponseCode.SUCCESS, {})

    # -- topic admin ------------------------------------------------------------------------------

    def _update_and_create_topic(self, request: Request) -> RemotingCommand:
        header = UpdateAndCreateTopicRequestHeader.from_ext(request.command.ext_fields)
        topic = header.topic
        problem = validate_topic(topic)
        if problem is None and topic == self.ctx.broker.broker_cluster_name:
            problem = f"the topic {topic} is named after the cluster, which is reserved"
        if problem is None:
            for name, count in (
                ("readQueueNums", header.read_queue_nums),
                ("writeQueueNums", header.write_queue_nums),
            ):
                if not 1 <= count <= TOPIC_QUEUE_COUNT_MAX:
                    problem = f"{name} = {count} is outside [1, {TOPIC_QUEUE_COUNT_MAX}]"
        if problem is None and not 0 <= header.perm <= PERM_MAX:
            problem = f"perm = {header.perm} is outside [0, {PERM_MAX}]"
        if problem is not None:
            return request.make_response(ResponseCode.SYSTEM_ERROR, {}, remark=problem)
        self.topics.put(
            TopicConfig(
                topic,
                header.read_queue_nums,
                header.write_queue_nums,
                header.perm,
                header.topic_filter_type,
                header.topic_sys_flag,
                header.order,
            )
        )
        return request.make_response(ResponseCode.SUCCESS, {})

    def _delete_topic(self, request: Request) -> RemotingCommand:
        """Deletes the configuration only: the consume queues belong to the dispatcher, and the
        committed offsets stay (as in Java); sending to the topic again brings it back."""
        header = DeleteTopicRequestHeader.from_ext(request.command.ext_fields)
        if header.topic in self._system_topic_names:
            return request.make_response(
                ResponseCode.SYSTEM_ERROR,
                {},
                remark=f"mqbox: {header.topic} is a system topic and stays",
            )
        if not self.topics.delete(header.topic):
            return request.make_response(
                ResponseCode.TOPIC_NOT_EXIST,
                {},
                remark=f"mqbox: topic {header.topic} does not exist on this broker",
            )
        return request.make_response(ResponseCode.SUCCESS, {})

    def _all_topic_config(self, request: Request) -> RemotingCommand:
        self.topics.reload_if_changed()
        version = self.topics.data_version
        table = {
            name: WireTopicConfig(
                config.topic_name,
                config.read_queue_nums,
                config.write_queue_nums,
                config.perm,
                config.topic_filter_type,
                config.topic_sys_flag,
                config.order,
            ).to_json_value()
            for name, config in sorted(self.topics.topics().items())
        }
        body = dumps_json(
            {
                "topicConfigTable": table,
                "dataVersion": DataVersion(version.counter, version.timestamp_ms).to_json_value(),
            }
        )
        return request.make_response(ResponseCode.SUCCESS, {}, body=body)

    # -- mqbox's own views ------------------------------------------------------------------------

    def _acknowledge(self, request: Request) -> RemotingCommand:
        return request.make_response(ResponseCode.SUCCESS, {})

    def _topic_status(self, request: Request) -> RemotingCommand:
        topic = _required(request.command.ext_fields, "topic", "MQBOX_TOPIC_STATUS")
        config = self._topic_or_error(request, topic)
        if isinstance(config, RemotingCommand):
            return config
        queues: list[dict[str, int]] = []
        for queue_id in range(max(config.read_queue_nums, config.write_queue_nums)):
            reader = self.store.for_queue(topic, queue_id)
            if reader is None:
                return self._no_store(request)
            queues.append(
                {
                    "queueId": queue_id,
                    "minOffset": reader.min_offset(topic, queue_id),
                    "maxOffset": reader.max_offset(topic, queue_id),
                    "lastUpdateTimestamp": self.store.last_store_timestamp_ms(topic, queue_id),
                }
            )
        body = dumps_json({"topic": topic, "queues": queues})
        return request.make_response(ResponseCode.SUCCESS, {}, body=body)

    def _consumer_progress(self, request: Request) -> RemotingCommand:
        ext = request.command.ext_fields
        group = _required(ext, "consumerGroup", "MQBOX_CONSUMER_PROGRESS")
        self._check_group(group)
        only_topic = ext.get("topic") or None
        known = self.clients.consumer_group(group)
        if only_topic is not None:
            topics = [only_topic]
        else:
            subscribed = set(known.subscriptions) if known is not None else set()
            topics = sorted(subscribed | set(self.offsets.topics_of(group)))
        if (
            not topics
            and known is None
            and group not in self.subscription_groups.groups
            and only_topic is None
        ):
            return request.make_response(
                ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
                {},
                remark=f"mqbox: no client, offset or configuration knows group {group}",
            )
        queues: list[dict[str, Any]] = []
        total_lag = 0
        for topic in topics:
            config = self.topics.get(topic)
            committed = self.offsets.topic_offsets(group, topic)
            if config is not None:
                queue_count = max(config.read_queue_nums, config.write_queue_nums)
            else:
                queue_count = max(committed, default=-1) + 1
            for queue_id in range(queue_count):
                reader = self.store.for_queue(topic, queue_id)
                if reader is None:
                    return self._no_store(request)
                broker_offset = reader.max_offset(topic, queue_id)
                consumer_offset = committed.get(queue_id, -1)
                start = (
                    consumer_offset if consumer_offset >= 0 else reader.min_offset(topic, queue_id)
                )
                lag = max(0, broker_offset - start)
                total_lag += lag
                queues.append(
                    {
                        "topic": topic,
                        "queueId": queue_id,
                        "brokerOffset": broker_offset,
                        "consumerOffset": consumer_offset,
                        "lag": lag,
                    }
                )
        body = dumps_json(
            {
                "group": group,
                "clientIds": self.clients.consumer_ids(group),
                "totalLag": total_lag,
                "queues": queues,
            }
        )
        return request.make_response(ResponseCode.SUCCESS, {}, body=body)

    def _reset_consumer_offset(self, request: Request) -> RemotingCommand:
        ext = request.command.ext_fields
        where = "MQBOX_RESET_CONSUMER_OFFSET"
        group = _required(ext, "consumerGroup", where)
        self._check_group(group)
        topic = _required(ext, "topic", where)
        target = _required(ext, "to", where)
        if target not in (RESET_TO_EARLIEST, RESET_TO_LATEST, RESET_TO_TIMESTAMP):
            raise RemoteProtocolError(
                f"{where}: field 'to' is {target[:40]!r}, not earliest, latest or timestamp"
            )
        timestamp_ms = _required_int(ext, "timestamp", where) if target == RESET_TO_TIMESTAMP else 0
        config = self._topic_or_error(request, topic)
        if isinstance(config, RemotingCommand):
            return config
        offsets = self._reset_targets(config, target, timestamp_ms)
        if offsets is None:
            return self._no_store(request)
        previous = self.offsets.topic_offsets(group, topic)
        self.offsets.replace_topic(group, topic, offsets, self.clock_ns())
        self.offsets.persist_now()
        # What 220 says the reset was, in Java's terms: a time, or -1 for the max offset.
        latest = target == RESET_TO_LATEST
        notice_timestamp_ms = RESET_TIMESTAMP_LATEST if latest else timestamp_ms
        notified = self._notify_offset_reset(group, topic, offsets, notice_timestamp_ms, True)
        body = dumps_json(
            {
                "group": group,
                "topic": topic,
                "queues": [
                    {
                        "queueId": queue_id,
                        "previousOffset": previous.get(queue_id, -1),
                        "offset": queue_index,
                    }
                    for queue_id, queue_index in sorted(offsets.items())
                ],
                "clientsNotified": notified,
            }
        )
        return request.make_response(ResponseCode.SUCCESS, {}, body=body)

    def _reset_targets(
        self, config: TopicConfig, target: str, timestamp_ms: int
    ) -> dict[int, int] | None:
        """queue id -> the index a reset to `target` gives, for every read queue of the topic;
        None while the store is not readable."""
        topic = config.topic_name
        offsets: dict[int, int] = {}
        for queue_id in range(config.read_queue_nums):
            reader = self.store.for_queue(topic, queue_id)
            if reader is None:
                return None
            if target == RESET_TO_EARLIEST:
                queue_index = reader.min_offset(topic, queue_id)
            elif target == RESET_TO_LATEST:
                queue_index = reader.max_offset(topic, queue_id)
            else:
                queue_index = reader.search_offset_by_timestamp(topic, queue_id, timestamp_ms)
            offsets[queue_id] = max(0, queue_index)
        return offsets

    def _invoke_broker_to_reset_offset(self, request: Request) -> RemotingCommand:
        """Java's INVOKE_BROKER_TO_RESET_OFFSET (222) with Java's rules (module docstring)."""
        ext = request.command.ext_fields
        where = "ResetOffsetRequestHeader"
        topic = _required(ext, "topic", where)
        group = _required(ext, "group", where)
        self._check_group(group)
        timestamp_ms = _required_int(ext, "timestamp", where)
        is_force = parse_bool(ext.get("isForce", ""))
        config = self.topics.get(topic) or self.topics.get_fresh(topic)
        if config is None:
            return request.make_response(
                ResponseCode.SYSTEM_ERROR,
                {},
                remark=f"[reset-offset] reset offset failed, no topic in this broker. "
                f"topic={_shown(topic)}",
            )
        if timestamp_ms == RESET_TIMESTAMP_LATEST:
            targets = self._reset_targets(config, RESET_TO_LATEST, 0)
        else:
            targets = self._reset_targets(config, RESET_TO_TIMESTAMP, timestamp_ms)
        if targets is None:
            return self._no_store(request)
        committed = self.offsets.topic_offsets(group, topic)
        offsets = {
            queue_id: target
            if is_force or queue_id not in committed or target < committed[queue_id]
            else committed[queue_id]
            for queue_id, target in targets.items()
        }
        if not self.clients.consumer_members(group):
            return request.make_response(
                ResponseCode.CONSUMER_NOT_ONLINE,
                {},
                remark=f"Consumer not online, so can not reset offset, Group: {group} "
                f"Topic: {topic} Timestamp: {timestamp_ms}",
            )
        self.offsets.replace_topic(group, topic, offsets, self.clock_ns())
        self.offsets.persist_now()
        self._notify_offset_reset(group, topic, offsets, timestamp_ms, is_force)
        body = admin_records.encode_reset_offset_body_java(
            self.ctx.broker.broker_name, topic, offsets
        )
        return request.make_response(ResponseCode.SUCCESS, {}, body=body)

    # -- statistics -------------------------------------------------------------------------------

    def statistics_admin(self) -> AdminStatistics:
        clients = self.clients.statistics()
        return AdminStatistics(
            owns_state=self.owns_state,
            client_responses=self.client_responses,
            unsupported_requests=self.unsupported_requests,
            notifications_sent=self._notifications_sent,
            commit_records=self._commit_records,
            commit_records_refused=self._commit_records_refused,
            subscriptions_file_writes=self._subscriptions_file_writes,
            consumer_count=clients.consumer_count,
            producer_count=clients.producer_count,
            offsets_persisted=self.offsets.statistics().persist_count,
            locks_held=self.locks.statistics().lock_count,
            client_calls_pending=len(self._client_calls),
            client_calls_relayed=self._client_calls_relayed,
            client_calls_failed=self._client_calls_failed,
            reset_notices_sent=self._reset_notices_sent,
        )

    def close(self) -> None:
        """Release the store maps (tests; a role process just exits)."""
        self.store.close()


def _listed(names: list[str], count_max: int = 5) -> str:
    """The first names of a list for a remark, and how many more there are."""
    shown = ", ".join(names[:count_max])
    return shown if len(names) <= count_max else f"{shown} and {len(names) - count_max} more"


def main(ctx: RoleContext) -> NoReturn:
    """The admin processor role: serve until SIGTERM (runtime.py)."""
    run_processor(ctx, AdminProcessor)
