"""The pull processor: PULL_MESSAGE (11), with long polling.

Owns: the checks of a pull (topic, read permission, queue id, filter type), its tag filter (the
subscription's tags, Java-hashed as the consume queue stores them), the read of the consume queue
through a read-only MessageStoreReader bounded by the dispatcher's published entry counts
(queue_counters.QueueCounters), the answer (codes 0/19/20/21 from read_plan's table, with
nextBeginOffset, minOffset, maxOffset and suggestWhichBrokerId as strings, and for 0 a body of
commit-log runs the reactor sends with os.sendfile), and the pulls it holds (long polling).

Never: copies a message byte (the body is a read plan; the reactor sends it from its own
descriptors), writes the store, blocks: a held pull is a table entry, and this loop keeps serving
every other request (of every connection, and of the same one) meanwhile.

Long polling (docs/protocol.md section 4.3): a pull that would get 19 (nothing new) with the
SUSPEND bit is held until the dispatcher's QUEUES_GREW names its queue (or says MANY) and the
published count passed the pull's index, or until min(suspendTimeoutMillis, 30 s) passes; then it
runs once more without suspending and gets whatever that finds. The dispatcher sends QUEUES_GREW
only while this processor's holding word (control_block.py) is 1, so a broker whose consumers
hold nothing is not woken here by every send. The word is 1 whenever pulls are held: raised
before a hold counts as made (check-after-set: store the word, fence, then read the queue's
count again, and answer now if it grew meanwhile, since the dispatcher may have published that
count and read the word before the store; the dispatcher stores counts, fences, then reads the
word), lowered once no pull is held. With longPollingEnable=false it
is held for shortPollingTimeMills and only the timer wakes it. A pull without the SUSPEND bit is
answered at once.

Errors go out after `error_delay_ms` (1 s by default): the C++ push consumer pulls again at once
after an error, and the Python PullConsumer loops on one, so an immediate error makes them spin.
An existing queue that is simply empty never gets an error (19, or 21 with nextBeginOffset 0).

Limits: maxMsgNums is honoured up to 1024 messages (Java caps it at 32 from memory); a pull of
at most 32 messages carries at most 256 KiB (Java's in-memory limit), a larger one up to 4 MiB,
so a client asking for big batches gets them (the first message is always sent whole).

suggestWhichBrokerId (docs/replication.md, "Slave service"; Java's PullMessageProcessor and
DefaultMessageStore.getMessage): 0 unless slaveReadEnable. With it, a read that scanned entries
is "behind" when the commit log's end is more than accessMessageInMemoryMaxRatio percent of the
host's RAM past the last scanned entry's record; then the answer suggests the group's
whichBrokerWhenConsumeSlowly (1 by default), else the group's brokerId (0), on a master and on a
slave alike. On a slave without offsetCheckInSlave, 21 OFFSET_MOVED becomes 20 with the group's
brokerId suggested, so the client asks again (the master may know the queue further), and an
answer from the queue's bounds keeps the asked index as nextBeginOffset (Java's
nextOffsetCorrection): a slave whose queue trails the master's never moves a consumer back. Group
settings come from subscriptionGroup.json (defaults for a group it lacks); the default path
(slaveReadEnable off, a master) reads neither the file nor the entry.

A group whose subscriptionGroup.json entry has consumeEnable=false (set by 200) is refused with
16 and Java's remark "subscription group no permission, <group>"; the view of the file is looked
at once a second, so a change takes up to a second to apply.

Subscriptions: with the SUBSCRIPTION bit clear (the Java push consumer's default), the group's
subscription comes from its heartbeat, which admin.0 writes to config/mqboxSubscriptions.json
(admin_parcels.GroupSubscriptionsReader); none gives 24, an older one 25. The commitOffset
piggyback (bit 0) goes to admin.0, the offsets' one owner, on the pull's first run only.

Closed connections: the worker sends CONNECTION_CLOSED to pull.(conn % P), the processor that
got the connection's pulls, on the same ring and so after them; every pull held for it (and
every error answer waiting out its delay) is dropped then, instead of at its timeout.

MQBOX_PULL_STATUS (10004, protocol/mqbox_codes.py; the worker routes it like a pull, so it reaches
pull.(conn % P)): no ext; body {"role", "pulls", "found", "empty", "heldNow", "holds", "woken",
"timedOut", "releasedOnClose", "errors"}, this process's PullStatistics. With P > 1 each
connection sees one pull processor; "role" says which.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import time
from typing import Any, Final, NoReturn

import numpy as np
import psutil
from numpy.typing import NDArray

from mqbox.config import BrokerRole
from mqbox.errors import AutoCreateLimitError
from mqbox.ipc.doorbell import memory_fence
from mqbox.ipc.ring import Ring
from mqbox.message import tag_hash
from mqbox.protocol.codes import (
    PERM_READ,
    PULL_FLAG_COMMIT_OFFSET,
    PULL_FLAG_SUBSCRIPTION,
    PULL_FLAG_SUSPEND,
    RequestCode,
    ResponseCode,
)
from mqbox.protocol.command import RemotingCommand, dumps_json
from mqbox.protocol.headers import (
    PullMessageRequestHeader,
    PullMessageResponseHeader,
    validate_topic,
)
from mqbox.protocol.mqbox_codes import MQBOX_PULL_STATUS
from mqbox.server import admin_parcels, parcels, runtime
from mqbox.server.admin_parcels import GroupSubscriptionsReader
from mqbox.server.parcels import ConnectionEvent
from mqbox.server.queue_counters import (
    QueueCounters,
    StorePositions,
    queue_counters_name,
    queue_key,
    store_positions_name,
)
from mqbox.server.roles.processors import Processor, Request, handles, run_processor
from mqbox.server.roles.processors.client_manager import group_name_problem
from mqbox.server.roles.processors.group_configs import SubscriptionGroupsView
from mqbox.server.roles.processors.topics import (
    PERM_READ_WRITE,
    RETRY_GROUP_TOPIC_PREFIX,
    TopicConfigStore,
)
from mqbox.server.roles.store_writer import store_config_of
from mqbox.server.runtime import RoleContext
from mqbox.server.statistics import S_PULL_FOUND, S_PULL_MISSED, S_PULL_REQUESTS
from mqbox.server.topology import RoleKind
from mqbox.server.transport import Outbox
from mqbox.store.config_files import SubscriptionGroupConfig, TopicConfig
from mqbox.store.message_store import READ_PLAN_MESSAGE_COUNT_MAX, MessageStoreReader
from mqbox.store.read_plan import (
    NO_TAG_FILTER,
    PULL_MESSAGE_COUNT_MAX,
    PULL_NOT_FOUND,
    PULL_OFFSET_MOVED,
    PULL_RETRY_IMMEDIATELY,
    PULL_SIZE_BYTES_MAX,
    PULL_SUCCESS,
    GetMessageStatus,
    ReadPlan,
)

HOLD_MS_MAX: Final = 30_000
ERROR_DELAY_MS_DEFAULT: Final = 1000
PULL_MESSAGE_COUNT_LIMIT: Final = READ_PLAN_MESSAGE_COUNT_MAX
PULL_SIZE_BYTES_MAX_LARGE: Final = 4 << 20
TAG_FILTER_CACHE_SIZE_MAX: Final = 4096
SUBSCRIPTION_ALL: Final = "*"
SUBSCRIPTION_SEPARATOR: Final = "||"
EXPRESSION_TYPE_TAG: Final = "TAG"
MASTER_ID: Final = 0
# Reads that scanned consume-queue entries (Java computes the fall-behind only for these).
_SCANNED: Final = frozenset(
    {
        GetMessageStatus.FOUND,
        GetMessageStatus.NO_MATCHED_MESSAGE,
        GetMessageStatus.MESSAGE_WAS_REMOVING,
    }
)
# Reads whose nextBeginOffset is a correction from the queue's bounds, which a slave does not make
# (Java's nextOffsetCorrection): its queues may trail the master's.
_CORRECTED: Final = frozenset(
    {
        GetMessageStatus.NO_MESSAGE_IN_QUEUE,
        GetMessageStatus.NO_MATCHED_LOGIC_QUEUE,
        GetMessageStatus.OFFSET_TOO_SMALL,
        GetMessageStatus.OFFSET_OVERFLOW_ONE,
        GetMessageStatus.OFFSET_OVERFLOW_BADLY,
    }
)


def tag_hashes_of(subscription: str | None) -> NDArray[np.int64]:
    """The consume-queue tag filter of a subscription expression: empty (take everything) for
    None, "" or "*"; else the Java hash of each tag of "TagA || TagB", trimmed, sorted, once."""
    if subscription is None:
        return NO_TAG_FILTER
    expression = subscription.strip()
    if not expression or expression == SUBSCRIPTION_ALL:
        return NO_TAG_FILTER
    tags = {part.strip() for part in expression.split(SUBSCRIPTION_SEPARATOR)}
    tags.discard("")
    if not tags:
        return NO_TAG_FILTER
    hashes = np.array(sorted({tag_hash(tag) for tag in tags}), dtype=np.int64)
    hashes.flags.writeable = False
    return hashes


@dataclasses.dataclass(slots=True)
class _Queue:
    """What the processor remembers about one (topic, queue_id)."""

    topic: str
    queue_id: int
    topic_bytes: bytes
    key: int  # queue_counters key
    counter_slot: int  # -1 until the dispatcher published the queue


@dataclasses.dataclass(slots=True)
class _Held:
    """A held pull, or (queue None) an error answer waiting out its delay."""

    request: Request
    header: PullMessageRequestHeader | None
    queue: _Queue | None
    tag_hashes: NDArray[np.int64]
    deadline_ns: int
    response: RemotingCommand | None = None
    done: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class PullStatistics:
    pulls: int
    found: int
    empty: int  # answered 19 at once or after a hold
    held_now: int
    holds: int
    woken: int
    timed_out: int
    released_on_close: int  # held pulls dropped because their connection closed
    errors: int


class PullProcessor(Processor):
    """Answers pulls from a read-only view of the store; holds empty suspend-flagged ones."""

    kind = RoleKind.PULL

    def __init__(
        self,
        ctx: RoleContext,
        *,
        error_delay_ms: int = ERROR_DELAY_MS_DEFAULT,
        hold_ms_max: int = HOLD_MS_MAX,
        **options: Any,
    ) -> None:
        super().__init__(ctx, **options)
        assert error_delay_ms >= 0
        assert hold_ms_max >= 0
        broker = ctx.broker
        self.error_delay_ns = error_delay_ms * 1_000_000
        self.hold_ms_max = hold_ms_max
        self.long_polling_enable = broker.long_polling_enable
        self.short_polling_time_ms = broker.short_polling_time_ms
        self.reader = MessageStoreReader.open(ctx.store_root, store_config_of(ctx))
        self.counters = QueueCounters.attach(queue_counters_name(ctx.instance))
        # The commit log's minimum, moved by the store writer just before it unlinks a
        # segment: reads below it answer "offset moved" instead of meeting a gone file.
        self.positions = StorePositions.attach(store_positions_name(ctx.instance))
        self.topics = TopicConfigStore(ctx.store_root, broker)
        # Consumer offsets have one owner, admin.0: commits piggybacked on pulls go there.
        admin0 = ctx.topology.roles_of(RoleKind.ADMIN)[0].role_id
        self.commit_outbox = Outbox(
            Ring.attach(ctx.topology.ring(self.role_id, admin0).name), self.spill_writer
        )
        self.extra_outboxes.append(self.commit_outbox)
        self.commits_enabled = broker.broker_role is not BrokerRole.SLAVE
        self.is_slave = broker.broker_role is BrokerRole.SLAVE
        self.slave_read_enable = broker.slave_read_enable
        self.offset_check_in_slave = broker.offset_check_in_slave
        # Java: (long) (TOTAL_PHYSICAL_MEMORY_SIZE * (accessMessageInMemoryMaxRatio / 100.0))
        self.in_memory_bytes_max = int(
            psutil.virtual_memory().total
            * (broker.access_message_in_memory_max_ratio_percent / 100.0)
        )
        self.groups = SubscriptionGroupsView(ctx.store_root)
        # Subscriptions from heartbeats, written by admin.0, for pulls that carry none (Java).
        self.subscriptions = GroupSubscriptionsReader(ctx.store_root)
        self._queues: dict[tuple[str, int], _Queue] = {}
        self._tag_filters: dict[str, NDArray[np.int64]] = {}
        self._held: dict[int, list[_Held]] = {}
        self._held_count = 0
        # The holding word (module docstring, "Long polling"); None without a control block
        # (unit tests: the dispatcher then wakes this processor on every growth).
        control = getattr(ctx, "control", None)
        self._holding_word = None if control is None else control.holding_words(self.role_id)
        if self._holding_word is not None:
            self._holding_word[0] = 0
        # conn id -> opaque -> what waits for that connection (held pulls, delayed errors)
        self._waiting_by_conn: dict[int, dict[int, _Held]] = {}
        self._timers: list[tuple[int, int, _Held]] = []
        self._timer_sequence = itertools.count()
        self._pulls = 0
        self._found = 0
        self._empty = 0
        self._holds = 0
        self._woken = 0
        self._timed_out = 0
        self._released_on_close = 0
        self._errors = 0
        self.stats = runtime.statistics_writer(ctx)

    # -- requests ---------------------------------------------------------------------------------

    @handles(RequestCode.PULL_MESSAGE)
    def _pull(self, request: Request) -> None:
        """PULL_MESSAGE (11): served now, or held until its queue grows or its time runs out
        (module docstring)."""
        header = PullMessageRequestHeader.from_command(request.command)
        self._pulls += 1
        self._serve(request, header, may_hold=True)

    def _serve(self, request: Request, header: PullMessageRequestHeader, *, may_hold: bool) -> None:
        topic = header.topic
        queue_id = header.queue_id
        config = self.topics.get(topic)
        if config is None:
            try:
                config = self._missing_topic(topic)
            except AutoCreateLimitError as error:
                self._error(request, ResponseCode.TOPIC_NOT_EXIST, str(error))
                return
            if config is None:
                self._error(
                    request,
                    ResponseCode.TOPIC_NOT_EXIST,
                    f"topic[{topic}] not exist, apply first please!",
                )
                return
        if not config.perm & PERM_READ:
            self._error(
                request,
                ResponseCode.NO_PERMISSION,
                f"the topic[{topic}] pulling message is forbidden (perm {config.perm})",
            )
            return
        if not 0 <= queue_id < config.read_queue_nums:
            self._error(
                request,
                ResponseCode.SYSTEM_ERROR,
                f"queueId[{queue_id}] is illegal, topic:[{topic}] readQueueNums:"
                f"[{config.read_queue_nums}] consumer:[{header.consumer_group}]",
            )
            return
        group_config = self.groups.get(header.consumer_group, fresh_on_miss=False)
        if group_config is not None and not group_config.consume_enable:
            self._error(
                request,
                ResponseCode.NO_PERMISSION,
                f"subscription group no permission, {header.consumer_group}",
            )
            return
        expression_type = header.expression_type
        if expression_type is not None and expression_type.upper() != EXPRESSION_TYPE_TAG:
            self._error(
                request,
                ResponseCode.SUBSCRIPTION_PARSE_FAILED,
                f"mqbox filters by TAG only, not by {expression_type}",
            )
            return
        if (
            may_hold
            and header.sys_flag & PULL_FLAG_COMMIT_OFFSET
            and self.commits_enabled
            and group_name_problem(header.consumer_group) is None
        ):
            # Only on the first run of a pull (not the re-run after a hold), as Java does.
            self.commit_outbox.append(
                admin_parcels.COMMIT_OFFSET,
                admin_parcels.pack_commit_offset(
                    header.consumer_group, topic, queue_id, header.commit_queue_index
                ),
            )
        if header.sys_flag & PULL_FLAG_SUBSCRIPTION:
            tag_hashes = self._tag_filter(header.subscription)
        else:
            group = header.consumer_group
            subscription = self.subscriptions.get(group, topic) or self.subscriptions.get_fresh(
                group, topic
            )
            if subscription is None:
                self._error(
                    request,
                    ResponseCode.SUBSCRIPTION_NOT_EXIST,
                    f"the consumer's subscription not exist, group: {group} topic: {topic}",
                )
                return
            if subscription.sub_version < header.sub_version:
                self._error(
                    request,
                    ResponseCode.SUBSCRIPTION_NOT_LATEST,
                    f"the consumer's subscription not latest, group: {group} topic: {topic}",
                )
                return
            if subscription.expression_type.upper() != EXPRESSION_TYPE_TAG:
                self._error(
                    request,
                    ResponseCode.SUBSCRIPTION_PARSE_FAILED,
                    f"mqbox filters by TAG only, not by {subscription.expression_type}",
                )
                return
            tag_hashes = self._tag_filter(subscription.sub_string)
        queue = self._queue(topic, queue_id)
        self._run(request, header, queue, tag_hashes, may_hold=may_hold)

    def _missing_topic(self, topic: str) -> TopicConfig | None:
        """A topic this process has not seen: maybe made a moment ago by another process; a
        `%RETRY%` topic is also made here if a pull for it comes before the group's first
        heartbeat (admin.0 makes it then), so a push consumer's retry queue answers 19, not an
        error. AutoCreateLimitError when the topic table is full."""
        config = self.topics.get_fresh(topic)
        if (
            config is None
            and topic.startswith(RETRY_GROUP_TOPIC_PREFIX)
            and validate_topic(topic) is None
        ):
            config, _created = self.topics.create_if_absent(
                TopicConfig(topic, 1, 1, PERM_READ_WRITE)
            )
        return config

    def _tag_filter(self, subscription: str | None) -> NDArray[np.int64]:
        if subscription is None:
            return NO_TAG_FILTER
        found = self._tag_filters.get(subscription)
        if found is None:
            found = tag_hashes_of(subscription)
            if len(self._tag_filters) >= TAG_FILTER_CACHE_SIZE_MAX:
                self._tag_filters.clear()
            self._tag_filters[subscription] = found
        return found

    def _queue(self, topic: str, queue_id: int) -> _Queue:
        key = (topic, queue_id)
        queue = self._queues.get(key)
        if queue is None:
            topic_bytes = topic.encode("utf-8")
            queue = _Queue(topic, queue_id, topic_bytes, queue_key(topic_bytes, queue_id), -1)
            self._queues[key] = queue
        return queue

    def _published_count(self, queue: _Queue) -> int | None:
        """The dispatcher's entry count of `queue`, or None if it has published none (the
        queue then holds what was on disk when the reader opened it)."""
        slot = queue.counter_slot
        if slot < 0:
            slot = self.counters.find_slot(queue.topic_bytes, queue.queue_id, queue.key)
            if slot < 0:
                return None
            queue.counter_slot = slot
        return self.counters.entry_count_at(slot)

    def _run(
        self,
        request: Request,
        header: PullMessageRequestHeader,
        queue: _Queue,
        tag_hashes: NDArray[np.int64],
        *,
        may_hold: bool,
    ) -> None:
        """Read the queue and answer, or hold the pull when it found nothing new."""
        count = self._published_count(queue)
        if count is not None:
            self.reader.observe_max_offset(queue.topic, queue.queue_id, count)
        self.reader.observe_commit_log_min(self.positions.min_log_offset_bytes)
        count_max = header.message_count_max
        if count_max < 1:
            count_max = 1
        elif count_max > PULL_MESSAGE_COUNT_LIMIT:
            count_max = PULL_MESSAGE_COUNT_LIMIT
        size_max = (
            PULL_SIZE_BYTES_MAX
            if count_max <= PULL_MESSAGE_COUNT_MAX
            else PULL_SIZE_BYTES_MAX_LARGE
        )
        plan = self.reader.get_messages(
            queue.topic, queue.queue_id, header.queue_index, count_max, size_max, tag_hashes
        )
        code = plan.pull_response_code
        if code == PULL_NOT_FOUND and may_hold and header.sys_flag & PULL_FLAG_SUSPEND:
            if self.long_polling_enable:
                hold_ms = min(header.suspend_timeout_ms, self.hold_ms_max)
            else:
                hold_ms = self.short_polling_time_ms
            if hold_ms > 0:
                self._hold(request, header, queue, tag_hashes, hold_ms, count)
                return
        suggested = MASTER_ID
        next_queue_index = plan.next_queue_index
        if self.slave_read_enable or self.is_slave:
            code, suggested = self._suggestion(header, queue, plan, code)
            if self.is_slave and not self.offset_check_in_slave and plan.status in _CORRECTED:
                next_queue_index = header.queue_index  # Java's nextOffsetCorrection on a slave
        response = request.make_response(
            code,
            PullMessageResponseHeader(
                next_queue_index, plan.min_queue_index, plan.max_queue_index, suggested
            ).to_ext(),
        )
        stats = self.stats
        stats.add(S_PULL_REQUESTS)
        if code == PULL_SUCCESS:
            self._found += 1
            stats.add(S_PULL_FOUND)
            stats.count_get(header.consumer_group, queue.topic, plan.message_count, plan.size_bytes)
            self.reply_with_runs(request, response, plan.runs)
            return
        stats.add(S_PULL_MISSED)
        if code == PULL_NOT_FOUND:
            self._empty += 1
        self.reply(request, response)

    def _suggestion(
        self, header: PullMessageRequestHeader, queue: _Queue, plan: ReadPlan, code: int
    ) -> tuple[int, int]:
        """(response code, suggestWhichBrokerId) by the module docstring's rule."""
        group = self.groups.get(header.consumer_group) or SubscriptionGroupConfig(
            header.consumer_group
        )
        suggested = MASTER_ID
        if self.slave_read_enable:
            suggested = group.broker_id
            if self._behind(queue, plan):
                suggested = group.which_broker_when_consume_slowly
        if self.is_slave and code == PULL_OFFSET_MOVED and not self.offset_check_in_slave:
            return PULL_RETRY_IMMEDIATELY, group.broker_id
        return code, suggested

    def _behind(self, queue: _Queue, plan: ReadPlan) -> bool:
        """Java's isSuggestPullingFromSlave: the commit log's end minus the last scanned entry's
        log offset exceeds the in-memory share of RAM; False when the read scanned nothing."""
        if plan.status not in _SCANNED:
            return False
        last = self.reader.entry_log_offset_bytes(
            queue.topic, queue.queue_id, plan.next_queue_index - 1
        )
        if last is None:
            return False
        behind_bytes = self.positions.write_log_offset_bytes - last
        return behind_bytes > self.in_memory_bytes_max

    def _error(self, request: Request, code: int, remark: str) -> None:
        self._errors += 1
        response = request.make_response(code, {}, remark=remark)
        if self.error_delay_ns <= 0:
            self.reply(request, response)
            return
        deadline_ns = time.monotonic_ns() + self.error_delay_ns
        held = _Held(request, None, None, NO_TAG_FILTER, deadline_ns, response)
        heapq.heappush(self._timers, (held.deadline_ns, next(self._timer_sequence), held))
        self._waiting_by_conn.setdefault(request.conn_id, {})[request.opaque] = held

    # -- long polling -----------------------------------------------------------------------------

    def _hold(
        self,
        request: Request,
        header: PullMessageRequestHeader,
        queue: _Queue,
        tag_hashes: NDArray[np.int64],
        hold_ms: int,
        seen_count: int | None,
    ) -> None:
        """Hold a pull that found nothing new in the `seen_count` entries of its queue."""
        deadline_ns = time.monotonic_ns() + hold_ms * 1_000_000
        held = _Held(request, header, queue, tag_hashes, deadline_ns)
        heapq.heappush(self._timers, (held.deadline_ns, next(self._timer_sequence), held))
        self._waiting_by_conn.setdefault(request.conn_id, {})[request.opaque] = held
        self._held_count += 1
        self._holds += 1
        if not self.long_polling_enable:
            return  # only its timer answers it
        waiting = self._held.setdefault(queue.key, [])
        waiting.append(held)
        word = self._holding_word
        if word is not None and word[0] == 0:
            word[0] = 1
            memory_fence()
            count = self._published_count(queue)
            if count is not None and (seen_count is None or count > seen_count):
                self._wake(queue.key, waiting)  # grew before the dispatcher saw the word
                self._release_holding_word()

    def _release_holding_word(self) -> None:
        """Lower the holding word once no pull waits for a queue to grow (a word left high
        only costs a wake-up per growth)."""
        word = self._holding_word
        if word is not None and word[0] and not self._held:
            word[0] = 0

    def _finish(self, held: _Held) -> None:
        """`held` is answered or dropped now: out of the timers' way and its connection's."""
        assert not held.done
        held.done = True
        if held.response is None:
            self._held_count -= 1
        request = held.request
        waiting = self._waiting_by_conn.get(request.conn_id)
        if waiting is not None and waiting.get(request.opaque) is held:
            del waiting[request.opaque]
            if not waiting:
                del self._waiting_by_conn[request.conn_id]

    def on_connection_closed(self, event: ConnectionEvent) -> None:
        """Drop what waits for the closed connection: its answers could only be dropped by the
        reactor, and a held pull kept until its timeout costs a table entry for 15 s or more."""
        waiting = self._waiting_by_conn.pop(event.conn_id, None)
        if waiting is None:
            return
        for held in waiting.values():
            if held.done:
                continue
            held.done = True  # the timer and the queue's list skip it from now on
            if held.response is None:
                self._held_count -= 1
                self._released_on_close += 1
                assert held.queue is not None
                queue_waiting = self._held.get(held.queue.key)
                if queue_waiting is not None:
                    queue_waiting.remove(held)
                    if not queue_waiting:
                        del self._held[held.queue.key]
        self._release_holding_word()

    def on_parcel(self, producer: str, parcel_type: int, payload: memoryview) -> None:
        if parcel_type != parcels.QUEUES_GREW:
            super().on_parcel(producer, parcel_type, payload)
            return
        _dispatched, flags, keys = parcels.unpack_queues_grew(payload, 0, len(payload))
        if not self._held:
            self._release_holding_word()
            return
        if flags & parcels.QUEUES_GREW_FLAG_MANY:
            keys = list(self._held)
        for key in keys:
            waiting = self._held.get(key)
            if waiting is not None:
                self._wake(key, waiting)
        self._release_holding_word()

    def _wake(self, key: int, waiting: list[_Held]) -> None:
        """Run again the held pulls of one queue whose index the queue's count passed."""
        still: list[_Held] = []
        for held in waiting:
            if held.done:
                continue
            assert held.queue is not None
            assert held.header is not None
            count = self._published_count(held.queue)
            if count is None or count <= held.header.queue_index:
                still.append(held)
                continue
            self._finish(held)
            self._woken += 1
            self._run_again(held)
        if still:
            self._held[key] = still
        else:
            del self._held[key]

    def on_tick(self, now_ns: int) -> None:
        timers = self._timers
        while timers and timers[0][0] <= now_ns:
            _deadline, _sequence, held = heapq.heappop(timers)
            if held.done:
                continue
            self._finish(held)
            if held.response is not None:
                self.reply(held.request, held.response)
                continue
            assert held.queue is not None
            assert held.header is not None
            self._timed_out += 1
            waiting = self._held.get(held.queue.key)
            if waiting is not None:
                waiting.remove(held)
                if not waiting:
                    del self._held[held.queue.key]
            self._run_again(held)
        self._release_holding_word()

    def _run_again(self, held: _Held) -> None:
        """Answer a held pull with what its queue has now, inside the request boundary."""
        self.guarded(
            held.request,
            self._run,
            held.request,
            held.header,
            held.queue,
            held.tag_hashes,
            may_hold=False,
        )

    def next_deadline_ns(self) -> int | None:
        timers = self._timers
        while timers and timers[0][2].done:
            heapq.heappop(timers)
        return timers[0][0] if timers else None

    def statistics_pull(self) -> PullStatistics:
        return PullStatistics(
            pulls=self._pulls,
            found=self._found,
            empty=self._empty,
            held_now=self._held_count,
            holds=self._holds,
            woken=self._woken,
            timed_out=self._timed_out,
            released_on_close=self._released_on_close,
            errors=self._errors,
        )

    @handles(MQBOX_PULL_STATUS)
    def _status_response(self, request: Request) -> RemotingCommand:
        """MQBOX_PULL_STATUS (10004): this pull processor's counters as a JSON body."""
        statistics = self.statistics_pull()
        body = dumps_json(
            {
                "role": self.role_id,
                "pulls": statistics.pulls,
                "found": statistics.found,
                "empty": statistics.empty,
                "heldNow": statistics.held_now,
                "holds": statistics.holds,
                "woken": statistics.woken,
                "timedOut": statistics.timed_out,
                "releasedOnClose": statistics.released_on_close,
                "errors": statistics.errors,
            }
        )
        return request.make_response(ResponseCode.SUCCESS, {}, body=body)


def main(ctx: RoleContext) -> NoReturn:
    """The pull processor role: serve until SIGTERM (runtime.py)."""
    run_processor(ctx, PullProcessor)
