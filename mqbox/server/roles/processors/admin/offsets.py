"""Consumers' offsets and locks: commits, queries, resets, progress, orderly consumers' locks.

Owns the handlers of QUERY_CONSUMER_OFFSET (14), UPDATE_CONSUMER_OFFSET (15), LOCK_BATCH_MQ (41),
UNLOCK_BATCH_MQ (42), Java's INVOKE_BROKER_TO_RESET_OFFSET (222), GET_CONSUME_STATS (208),
GET_BROKER_CONSUME_STATS (317), QUERY_TOPIC_CONSUME_BY_WHO (300), MQBOX_RESET_CONSUMER_OFFSET
(10003), GET_ALL_CONSUMER_OFFSET (43), GET_ALL_DELAY_OFFSET (45), and the
RESET_CONSUMER_CLIENT_OFFSET (220) a reset sends to the group's members. consumerOffset.json is
saved every 5 s while changed and at an orderly stop (consumer_offsets.py). All but 45 are served
by admin.0 alone (routing.py); 45 reads delayOffset.json, which any admin processor may.
"""

from __future__ import annotations

import logging
from typing import Any

from mqbox.protocol import admin_bodies
from mqbox.protocol.codes import LanguageCode, RequestCode, ResponseCode
from mqbox.protocol.command import (
    RemotingCommand,
    dumps_json,
    make_request,
)
from mqbox.protocol.errors import RemoteProtocolError
from mqbox.protocol.headers import (
    ConsumerOffsetSerializeWrapper,
    DelayOffsetSerializeWrapper,
    LockBatchRequestBody,
    LockBatchResponseBody,
    MessageQueue,
    OffsetResponseHeader,
    QueryConsumerOffsetRequestHeader,
    UpdateConsumerOffsetRequestHeader,
    parse_bool,
)
from mqbox.protocol.mqbox_codes import (
    INVOKE_BROKER_TO_RESET_OFFSET,
    MQBOX_RESET_CONSUMER_OFFSET,
    RESET_TIMESTAMP_LATEST,
    RESET_TO_EARLIEST,
    RESET_TO_LATEST,
    RESET_TO_TIMESTAMP,
    encode_reset_offset_body_cpp,
    encode_reset_offset_body_java,
)
from mqbox.server.roles.processors import Request, handles
from mqbox.server.roles.processors.admin.base import (
    REMARK_QUERY_NOT_FOUND,
    AdminBase,
    _required,
    _required_int,
    _shown,
)
from mqbox.server.roles.processors.consumer_offsets import starting_queue_index
from mqbox.store import config_files
from mqbox.store.config_files import TOPIC_GROUP_SEPARATOR, TopicConfig

log = logging.getLogger("mqbox.admin")


class ConsumerOffsetHandlers(AdminBase):
    """Handlers of the offset and lock tables (admin.0)."""

    @handles(RequestCode.GET_ALL_CONSUMER_OFFSET)
    def _all_consumer_offsets(self, request: Request) -> RemotingCommand:
        """GET_ALL_CONSUMER_OFFSET (43): 0 with Java's ConsumerOffsetManager body,
        `{"offsetTable":{"<topic>@<group>":{"<queueId>":<offset>}}}`, the table as committed now
        (also what is not saved yet). A slave asks its master with it (slave_sync.py)."""
        table = {
            f"{topic}{TOPIC_GROUP_SEPARATOR}{group}": queues
            for (topic, group), queues in sorted(self.offsets.snapshot().items())
        }
        body = ConsumerOffsetSerializeWrapper(table).to_json()
        return request.make_response(ResponseCode.SUCCESS, {}, body=body)

    @handles(RequestCode.GET_ALL_DELAY_OFFSET)
    def _all_delay_offsets(self, request: Request) -> RemotingCommand:
        """GET_ALL_DELAY_OFFSET (45): 0 with Java's DelayOffsetSerializeWrapper body,
        `{"offsetTable":{"<delayLevel>":<offset>}}`, as delayOffset.json holds it: the schedule
        role saves its progress there (schedule.py), so the answer may trail the role's memory
        by one save, where Java answers from memory. No file yet: an empty table."""
        offsets = config_files.load_delay_offsets(self.config_dir, use_backup_if_corrupt=True)
        body = DelayOffsetSerializeWrapper(dict(offsets)).to_json()
        return request.make_response(ResponseCode.SUCCESS, {}, body=body)

    @handles(RequestCode.QUERY_CONSUMER_OFFSET)
    def _query_consumer_offset(self, request: Request) -> RemotingCommand:
        """QUERY_CONSUMER_OFFSET (14): the group's committed index, or where a new group
        starts (consumer_offsets.starting_queue_index); 22 QUERY_NOT_FOUND when nothing is
        committed and the queue no longer starts at 0."""
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

    @handles(RequestCode.UPDATE_CONSUMER_OFFSET)
    def _update_consumer_offset(self, request: Request) -> RemotingCommand:
        """UPDATE_CONSUMER_OFFSET (15): commit the group's index of a queue that exists."""
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

    @handles(RequestCode.LOCK_BATCH_MQ)
    def _lock_batch(self, request: Request) -> RemotingCommand:
        """LOCK_BATCH_MQ (41), an orderly consumer's queue locks (locks.py): the queues granted."""
        body = LockBatchRequestBody.from_json(request.command.body)
        granted = self.locks.lock(body.consumer_group, body.client_id, body.mq_set, self.clock_ns())
        return request.make_response(
            ResponseCode.SUCCESS, {}, body=LockBatchResponseBody(tuple(granted)).to_json()
        )

    @handles(RequestCode.UNLOCK_BATCH_MQ)
    def _unlock_batch(self, request: Request) -> RemotingCommand:
        """UNLOCK_BATCH_MQ (42): release the client's locks of those queues."""
        body = LockBatchRequestBody.from_json(request.command.body)
        self.locks.unlock(body.consumer_group, body.client_id, body.mq_set)
        return request.make_response(ResponseCode.SUCCESS, {})

    def consume_tps(self, group: str, topic: str) -> float:
        """ConsumeStats.consumeTps of the group on one topic (Java: messages gotten per second
        over the last minute). 0.0 until issue 16's statistics count gets per group."""
        return 0.0

    def _stats_topics(self, group: str, only_topic: str | None) -> list[str]:
        """The topics a consume-stats answer covers: `only_topic`, else those the group
        committed offsets for (Java's whichTopicByConsumer) and, unlike Java, those its online
        members subscribe to, so a group shows its lag before its first commit."""
        if only_topic is not None:
            return [only_topic]
        known = self.clients.consumer_group(group)
        subscribed = set(known.subscriptions) if known is not None else set()
        return sorted(subscribed | set(self.offsets.topics_of(group)))

    def _consume_stats(
        self, group: str, topics: list[str], *, write_queues: bool, order_only: bool = False
    ) -> dict[str, Any] | None:
        """ConsumeStats of `group` over `topics` (Java's getConsumeStats loop): topics without a
        configuration, or that an online group does not subscribe to, are left out; one
        OffsetWrapper per read queue (write queues for 317, as Java). None without a store."""
        known = self.clients.consumer_group(group)
        broker_name = self.ctx.broker.broker_name
        offsets: dict[MessageQueue, dict[str, int]] = {}
        consume_tps = 0.0
        for topic in topics:
            config = self.topics.get(topic)
            if config is None or (order_only and not config.order):
                continue
            if known is not None and known.subscriptions and topic not in known.subscriptions:
                continue
            committed = self.offsets.topic_offsets(group, topic)
            queue_count = config.write_queue_nums if write_queues else config.read_queue_nums
            for queue_id in range(queue_count):
                reader = self.store.for_queue(topic, queue_id)
                if reader is None:
                    return None
                consumer_offset = max(0, committed.get(queue_id, 0))
                offsets[MessageQueue(topic, broker_name, queue_id)] = admin_bodies.offset_wrapper(
                    max(0, reader.max_offset(topic, queue_id)),
                    consumer_offset,
                    self.store.store_timestamp_ms(topic, queue_id, consumer_offset - 1),
                )
            consume_tps += self.consume_tps(group, topic)
        return admin_bodies.consume_stats(offsets, consume_tps)

    @handles(RequestCode.GET_CONSUME_STATS)
    def _get_consume_stats(self, request: Request) -> RemotingCommand:
        """GET_CONSUME_STATS (208): ext `consumerGroup`, optional `topic`. Java's ConsumeStats
        {consumeTps, offsetTable: {MessageQueue: OffsetWrapper {brokerOffset, consumerOffset,
        lastTimestamp}}} (fastjson text); consumerOffset is 0 where nothing is committed, and
        lastTimestamp the store time of the last message consumed (0 for none). A group nobody
        knows gets 0 and an empty table, as in Java (whose admin then reports the group not
        online)."""
        header = admin_bodies.GetConsumeStatsRequestHeader.from_ext(request.command.ext_fields)
        self._check_group(header.consumer_group)
        topics = self._stats_topics(header.consumer_group, header.topic)
        stats = self._consume_stats(header.consumer_group, topics, write_queues=False)
        if stats is None:
            return self._no_store(request)
        body = admin_bodies.dumps_fastjson(stats)
        return request.make_response(ResponseCode.SUCCESS, {}, body=body)

    @handles(RequestCode.GET_BROKER_CONSUME_STATS)
    def _broker_consume_stats(self, request: Request) -> RemotingCommand:
        """GET_BROKER_CONSUME_STATS (317): ext `isOrder`. Java's ConsumeStatsList: for every
        subscription group, the ConsumeStats of each topic it committed offsets for (only the
        order topics when isOrder), over write queues; totalDiff sums brokerOffset -
        consumerOffset over every row."""
        header = admin_bodies.GetConsumeStatsInBrokerHeader.from_ext(request.command.ext_fields)
        groups: list[tuple[str, list[dict[str, Any]]]] = []
        total_diff = 0
        for group in sorted(self.subscription_groups.groups):
            per_topic: list[dict[str, Any]] = []
            for topic in self.offsets.topics_of(group):
                stats = self._consume_stats(
                    group, [topic], write_queues=True, order_only=header.is_order
                )
                if stats is None:
                    return self._no_store(request)
                if not stats["offsetTable"]:
                    continue
                per_topic.append(stats)
                total_diff += sum(
                    row["brokerOffset"] - row["consumerOffset"]
                    for row in stats["offsetTable"].values()
                )
            groups.append((group, per_topic))
        body = admin_bodies.dumps_fastjson(
            admin_bodies.consume_stats_list(self.ctx.broker_address, groups, total_diff)
        )
        return request.make_response(ResponseCode.SUCCESS, {}, body=body)

    @handles(RequestCode.QUERY_TOPIC_CONSUME_BY_WHO)
    def _topic_consumed_by(self, request: Request) -> RemotingCommand:
        """QUERY_TOPIC_CONSUME_BY_WHO (300): ext `topic`. Java's GroupList: the groups whose
        online members subscribe to the topic, and those that committed offsets for it."""
        header = admin_bodies.TopicRequestHeader.from_ext(request.command.ext_fields)
        groups = {
            group
            for group in self.clients.consumer_groups()
            if self.clients.group_subscription(group, header.topic) is not None
        }
        groups.update(group for topic, group in self.offsets.snapshot() if topic == header.topic)
        body = admin_bodies.dumps_fastjson(admin_bodies.group_list(groups))
        return request.make_response(ResponseCode.SUCCESS, {}, body=body)

    @handles(MQBOX_RESET_CONSUMER_OFFSET)
    def _reset_consumer_offset(self, request: Request) -> RemotingCommand:
        """MQBOX_RESET_CONSUMER_OFFSET (10003): ext `consumerGroup`, `topic`, `to` ("earliest",
        "latest" or "timestamp") and, for "timestamp", `timestamp` (ms). Sets the group's index
        of every read queue of the topic (to minOffset, maxOffset, or
        SEARCH_OFFSET_BY_TIMESTAMP's answer), saves consumerOffset.json at once, tells every
        online member (220, `_notify_offset_reset`), and answers {"group", "topic", "queues":
        [{"queueId", "previousOffset", "offset"}], "clientsNotified"}."""
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

    @handles(INVOKE_BROKER_TO_RESET_OFFSET)
    def _invoke_broker_to_reset_offset(self, request: Request) -> RemotingCommand:
        """Java's INVOKE_BROKER_TO_RESET_OFFSET (222, ext `topic`, `group`, `timestamp` with -1
        for the max offset, `isForce`), with Java's rules: without isForce a queue only moves
        back; no online member gives 206 CONSUMER_NOT_ONLINE and changes nothing; the answer's
        body is ResetOffsetBody. Unlike Java, mqbox also stores the new offsets itself, so a
        client that ignores 220 cannot leave the broker's table stale for long."""
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
        body = encode_reset_offset_body_java(self.ctx.broker.broker_name, topic, offsets)
        return request.make_response(ResponseCode.SUCCESS, {}, body=body)

    def _notify_offset_reset(
        self, group: str, topic: str, offsets: dict[int, int], timestamp_ms: int, is_force: bool
    ) -> int:
        """RESET_CONSUMER_CLIENT_OFFSET (220, oneway) to every online member of the group, as
        Java's Broker2Client.resetOffset tells them: ext `topic`, `group`, `timestamp` (ms; -1
        for latest, 0 for earliest) and `isForce`, body the new offset table:
        ResetOffsetBodyForC (a JSON list) for members whose heartbeat said language CPP, and
        ResetOffsetBody (keyed by message queue, not JSON) for the others, since neither client
        reads the other's form (protocol/mqbox_codes.py). The C++ client drops its pull requests
        of those queues, commits the new offsets (15), and rebalances, which starts them again
        from the broker's offset. Returns how many members were told."""
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
        body_cpp = encode_reset_offset_body_cpp(broker_name, topic, offsets)
        body_java = encode_reset_offset_body_java(broker_name, topic, offsets)
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
