"""What the admin processor's sections share: their state, the store view, and the checks.

Owns: `AdminBase` (the tables and files admin.0 owns, built in one __init__; the broker requests
to clients; topic, queue and group checks answered the same way by every section), `StoreView`
(a read-only MessageStoreReader bounded by the published counts), the statistics. Never: a
handler (clients.py, offsets.py, queries.py, topic_admin.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import struct
import time
from collections.abc import Callable, Iterator
from typing import Any, Final

from mqbox.clock import wall_clock_ms
from mqbox.config import BrokerConfig, BrokerRole
from mqbox.errors import ConfigError, MqboxError
from mqbox.message import STORETIMESTAMP_POSITION_BYTES
from mqbox.protocol.codes import FLAG_RESPONSE, ResponseCode
from mqbox.protocol.command import (
    INT64_MAX,
    INT64_MIN,
    RemotingCommand,
    encode_header,
)
from mqbox.protocol.errors import RemoteProtocolError
from mqbox.run_files import read_json
from mqbox.server import parcels
from mqbox.server.queue_counters import (
    QueueCounters,
    StorePositions,
    queue_counters_name,
    store_positions_name,
)
from mqbox.server.roles.processors import TICK_INTERVAL_NS, Processor, Request
from mqbox.server.roles.processors.admin.runtime_info import broker_boot_timestamp_ms
from mqbox.server.roles.processors.client_manager import (
    CLIENT_EXPIRY_MS_DEFAULT,
    ClientManager,
    group_name_problem,
)
from mqbox.server.roles.processors.consumer_offsets import (
    PERSIST_INTERVAL_MS_DEFAULT,
    ConsumerOffsets,
)
from mqbox.server.roles.processors.locks import QueueLocks
from mqbox.server.roles.processors.topics import TopicConfigStore
from mqbox.server.roles.store_writer import store_config_of
from mqbox.server.runtime import RoleContext
from mqbox.server.statistics_history import statistics_file_path
from mqbox.server.topology import RoleKind
from mqbox.store import config_files
from mqbox.store.config_files import (
    SubscriptionGroupTable,
    TopicConfig,
)
from mqbox.store.layout import config_dir
from mqbox.store.message_store import MessageStoreReader
from mqbox.store.read_plan import GetMessageStatus

log = logging.getLogger("mqbox.admin")

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
CLIENT_CALL_COUNT_MAX: Final = 1024  # calls to clients (307, 309, 221) in flight at once
EXPRESSION_TYPE_TAG: Final = "TAG"
REMARK_NO_CONSUMER: Final = "no consumer for this group"
REMARK_QUERY_NOT_FOUND: Final = "mqbox: nothing committed, and the queue no longer starts at 0"
# Java's AdminBrokerProcessor.validateSlave, for 17, 215, 200 and 207 on a slave.
REMARK_SLAVE_READ_ONLY: Final = (
    "Can't modify topic or subscription group from slave broker, please execute it from master "
    "broker."
)


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


def _listed(names: list[str], count_max: int = 5) -> str:
    """The first names of a list for a remark, and how many more there are."""
    shown = ", ".join(names[:count_max])
    return shown if len(names) <= count_max else f"{shown} and {len(names) - count_max} more"


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
        return self.store_timestamp_ms(topic, queue_id, reader.max_offset(topic, queue_id) - 1)

    def store_timestamp_ms(self, topic: str, queue_id: int, queue_index: int) -> int:
        """Store time of the queue's message at `queue_index` (Java's getMessageStoreTimeStamp);
        0 if the queue no longer or not yet holds it."""
        reader = self.for_queue(topic, queue_id)
        if reader is None or not reader.min_offset(topic, queue_id) <= queue_index:
            return 0
        if queue_index >= reader.max_offset(topic, queue_id):
            return 0
        plan = reader.get_messages(topic, queue_id, queue_index, 1)
        if plan.status is not GetMessageStatus.FOUND:
            return 0
        record = reader.read_plan_bytes(plan)
        value: int = _STORE_TIMESTAMP.unpack_from(record, STORETIMESTAMP_POSITION_BYTES)[0]
        return value

    def positions(self) -> StorePositions | None:
        """The store writer's published positions (queue_counters.py); None before it runs."""
        self._attach()
        return self._positions

    def counters(self) -> QueueCounters | None:
        """The dispatcher's published counters; None before it runs."""
        self._attach()
        return self._counters

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
    commit_parcels: int  # COMMIT_OFFSET parcels from pull processors
    commit_parcels_refused: int  # with a bad group or topic name
    subscriptions_file_writes: int
    consumer_count: int
    producer_count: int
    offsets_persisted: int
    locks_held: int
    client_calls_pending: int  # calls (307, 309, 221) waiting for their client
    client_calls_relayed: int
    client_calls_failed: int  # timed out, or the client's connection closed first
    reset_notices_sent: int  # RESET_CONSUMER_CLIENT_OFFSET requests


@dataclasses.dataclass(slots=True)
class _StatusGather:
    """A 223 waiting for its members' answers to 221: the answer goes out when `pending` is
    empty (each call answered, timed out, or its connection closed)."""

    request: Request
    pending: set[tuple[int, int]]  # keys of AdminBase._client_calls still out
    results: dict[str, Any]  # client id -> its messageQueueTable ({MessageQueue: offset})


@dataclasses.dataclass(slots=True)
class _ClientCall:
    """A request (307, 309, 221) sent on to a client, waiting for its answer."""

    request: Request  # the admin's request, answered with the client's response
    group: str
    client_id: str
    deadline_ns: int  # self.clock_ns() terms
    gather: _StatusGather | None = None  # a 221 of a 223: its answer joins the gather instead


class AdminBase(Processor):
    """State and checks of the admin processor, under its sections of handlers."""

    kind = RoleKind.ADMIN
    # Silent clients, expired locks, the offsets' save schedule and calls to clients run on it.
    tick_interval_ns = TICK_INTERVAL_NS

    def published_statistics(self) -> dict[str, Any] | None:
        """The statistics sampler's last document (server/statistics_history.py); None before
        its first write (or without a sampler)."""
        return read_json(statistics_file_path(self.ctx.home))

    def __init__(
        self,
        ctx: RoleContext,
        *,
        clock_ns: Callable[[], int] = time.monotonic_ns,
        wall_clock_ms: Callable[[], int] = wall_clock_ms,
        client_expiry_ms: int = CLIENT_EXPIRY_MS_DEFAULT,
        lock_lifetime_ms: int | None = None,
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
        self.is_slave = ctx.broker.broker_role is BrokerRole.SLAVE
        self.config_dir = config_dir(ctx.store_root)
        self.clients = ClientManager(expiry_ns=client_expiry_ms * 1_000_000)
        self.offsets = ConsumerOffsets(
            self.config_dir if self.owns_state else None,
            persist_interval_ns=offset_persist_interval_ms * 1_000_000,
        )
        if lock_lifetime_ms is None:  # mqboxRebalanceLockMaxLiveTimeMs
            lock_lifetime_ms = ctx.broker.rebalance_lock_max_live_time_ms
        self.locks = QueueLocks(lifetime_ns=lock_lifetime_ms * 1_000_000)
        self.topics = TopicConfigStore(ctx.store_root, ctx.broker)
        self.store = StoreView(ctx, clock_ns)
        self.subscription_groups: SubscriptionGroupTable = SubscriptionGroupTable()
        if self.owns_state:
            self.offsets.load()
            self.subscription_groups = config_files.load_subscription_groups(
                self.config_dir, use_backup_if_corrupt=True
            )
        self._notify_pending: set[str] = set()
        # (client conn id, opaque of the request sent to it) -> the call waiting for the answer
        self._client_calls: dict[tuple[int, int], _ClientCall] = {}
        self._notify_opaques = self._opaque_counter()
        self._subscriptions_version = 0
        self._housekeeping_due_ns = clock_ns() + HOUSEKEEPING_INTERVAL_NS
        self.client_responses = 0
        self.unsupported_requests = 0
        self._notifications_sent = 0
        self._commit_parcels = 0
        self._commit_parcels_refused = 0
        self._subscriptions_file_writes = 0
        self._client_calls_relayed = 0
        self._client_calls_failed = 0
        self._reset_notices_sent = 0
        self.boot_timestamp_ms = broker_boot_timestamp_ms()

    def on_broker_config(self, broker: BrokerConfig) -> None:
        """The topic store reads autoCreateTopicEnable from its copy (runtime_config.py)."""
        self.topics.broker = broker

    def send_request(self, conn_id: int, command: RemotingCommand) -> None:
        """Send a broker request to a client on its connection: oneway (40, 220), or a call
        (307) whose answer comes back through handle() with the same opaque.

        Broker requests travel as REPLY parcels: the codec frames whatever command a REPLY
        holds, so a request with an opaque from this process's counter goes out on the client's
        connection like a response. The counter starts at 2**30, far above the opaques clients
        use (both the C++ and the Java client count theirs up from 0), because the codec tells
        the worker the (connection, opaque) it saw, and the worker would stop tracking a client
        request with the same opaque."""
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
            parcels.REPLY_FLAG_REQUEST,
        )

    @staticmethod
    def _opaque_counter() -> Iterator[int]:
        while True:
            yield from range(NOTIFY_OPAQUE_FIRST, NOTIFY_OPAQUE_LAST + 1)

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

    def _slave_refusal(self, request: Request) -> RemotingCommand | None:
        """SYSTEM_ERROR with Java's remark for a change of topics or subscription groups on a
        slave (its master's copy is what the slave sync brings); None on a master."""
        if not self.is_slave:
            return None
        return request.make_response(ResponseCode.SYSTEM_ERROR, {}, remark=REMARK_SLAVE_READ_ONLY)

    def _no_store(self, request: Request) -> RemotingCommand:
        return request.make_response(
            ResponseCode.SYSTEM_ERROR, {}, remark="mqbox: the store is not readable yet"
        )
