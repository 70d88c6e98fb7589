"""Client management: heartbeats, the consumer list, client config checks, calls to clients.

Owns the handlers of HEART_BEAT (34), UNREGISTER_CLIENT (35), GET_CONSUMER_LIST_BY_GROUP (38),
CHECK_CLIENT_CONFIG (46), GET_CONSUMER_CONNECTION_LIST (203), GET_PRODUCER_CONNECTION_LIST (204)
and the calls to clients: GET_CONSUMER_RUNNING_INFO (307) and CONSUME_MESSAGE_DIRECTLY (309)
relayed, INVOKE_BROKER_TO_GET_CONSUMER_STATUS (223) gathered from 221s; what a change of the
client tables (client_manager.py: heartbeats, closed connections, 120 s of silence) sets off:
NOTIFY_CONSUMER_IDS_CHANGED (40) on each member's connection when a group's membership changes,
and the group-subscriptions file the pull processors read (admin_parcels.py). Every code here but
46 is served by admin.0 alone (routing.py).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging

from mqbox.errors import MessageIllegalError
from mqbox.message import decode_offset_msg_id
from mqbox.protocol import admin_bodies
from mqbox.protocol.codes import RequestCode, ResponseCode
from mqbox.protocol.command import (
    RemotingCommand,
    encode_header,
    loads_json,
    make_request,
)
from mqbox.protocol.errors import RemoteProtocolError
from mqbox.protocol.headers import (
    ConsumerGroupRequestHeader,
    ConsumerListBody,
    HeartbeatData,
    SubscriptionData,
    UnregisterClientRequestHeader,
    validate_topic,
)
from mqbox.server import admin_parcels
from mqbox.server.roles.processors import Request, handles
from mqbox.server.roles.processors.admin.base import (
    CLIENT_CALL_COUNT_MAX,
    EXPRESSION_TYPE_TAG,
    REMARK_NO_CONSUMER,
    AdminBase,
    _ClientCall,
    _listed,
    _required,
    _shown,
    _StatusGather,
)
from mqbox.server.roles.processors.client_manager import (
    ClientChange,
    group_name_problem,
)
from mqbox.server.roles.processors.topics import (
    PERM_READ_WRITE,
    RETRY_GROUP_TOPIC_PREFIX,
)
from mqbox.store import config_files
from mqbox.store.config_files import (
    SubscriptionGroupConfig,
    SubscriptionGroupTable,
    TopicConfig,
)

log = logging.getLogger("mqbox.admin")


class ClientManagement(AdminBase):
    """Handlers of the client tables (admin.0)."""

    @handles(RequestCode.HEART_BEAT)
    def _heartbeat(self, request: Request) -> RemotingCommand:
        """HEART_BEAT (34): record the client's producer and consumer groups (client_manager.py).
        A consumer group's first heartbeat creates its subscription group
        (config/subscriptionGroup.json, admin.0 its only writer) and its `%RETRY%<group>` topic
        (`_ensure_groups`); a membership change sends NOTIFY_CONSUMER_IDS_CHANGED (40) to the
        group's members at the end of the turn.

        Limits (broker.conf, issue 9): a heartbeat naming more than mqboxHeartbeatGroupCountMax
        groups (producer and consumer) or a consumer group with more than
        mqboxHeartbeatSubscriptionCountMax subscriptions gets SYSTEM_ERROR (1) with a remark and
        changes nothing. New consumer groups are created up to mqboxAutoCreateGroupCountMax
        configured groups; those past it are neither created nor recorded, and the heartbeat gets
        26 SUBSCRIPTION_GROUP_NOT_EXIST naming them (the others are recorded). Retry topics past
        mqboxAutoCreateTopicCountMax (topics.py) give 17 TOPIC_NOT_EXIST; their groups are
        recorded. Java bounds none of these; a client that named 1,500 groups left 1,514 topics
        behind. With autoCreateSubscriptionGroup=false an unknown group is recorded without a
        config and the heartbeat succeeds, as in Java."""
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
            client_addr=f"{ipaddress.IPv4Address(request.peer_ipv4)}:{request.peer_port}",
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

    @handles(RequestCode.UNREGISTER_CLIENT)
    def _unregister_client(self, request: Request) -> RemotingCommand:
        """UNREGISTER_CLIENT (35): forget the client's groups."""
        header = UnregisterClientRequestHeader.from_ext(request.command.ext_fields)
        self._apply(
            self.clients.unregister(header.client_id, header.producer_group, header.consumer_group)
        )
        return request.make_response(ResponseCode.SUCCESS, {})

    @handles(RequestCode.GET_CONSUMER_LIST_BY_GROUP)
    def _consumer_list(self, request: Request) -> RemotingCommand:
        """GET_CONSUMER_LIST_BY_GROUP (38): the client ids of the group's online members; 1 and
        a remark for a group without any."""
        header = ConsumerGroupRequestHeader.from_ext(request.command.ext_fields)
        client_ids = self.clients.consumer_ids(header.consumer_group)
        if not client_ids:
            return request.make_response(ResponseCode.SYSTEM_ERROR, {}, remark=REMARK_NO_CONSUMER)
        body = ConsumerListBody(tuple(client_ids)).to_json()
        return request.make_response(ResponseCode.SUCCESS, {}, body=body)

    @handles(RequestCode.GET_CONSUMER_CONNECTION_LIST)
    def _consumer_connections(self, request: Request) -> RemotingCommand:
        """GET_CONSUMER_CONNECTION_LIST (203): ext `consumerGroup`. Java's ConsumerConnection:
        a Connection {clientId, clientAddr, language, version} per online member, the group's
        subscription table (topic -> SubscriptionData) and its consumeType, messageModel and
        consumeFromWhere by name. 206 CONSUMER_NOT_ONLINE with Java's remark for a group
        without members."""
        header = ConsumerGroupRequestHeader.from_ext(request.command.ext_fields)
        self._check_group(header.consumer_group)
        group = self.clients.consumer_group(header.consumer_group)
        if group is None or not group.members:
            return request.make_response(
                ResponseCode.CONSUMER_NOT_ONLINE,
                {},
                remark=f"the consumer group[{header.consumer_group}] not online",
            )
        connections = [
            admin_bodies.connection(m.client_id, m.client_addr, m.language, m.version)
            for m in self.clients.consumer_members(header.consumer_group)
        ]
        subscriptions = {
            topic: admin_bodies.subscription_data(
                s.topic, s.sub_string, s.tags, s.tag_hashes, s.sub_version, s.expression_type
            )
            for topic, s in sorted(group.subscriptions.items())
        }
        body = admin_bodies.dumps_fastjson(
            admin_bodies.consumer_connection(
                connections,
                subscriptions,
                group.consume_type.name,
                group.message_model.name,
                group.consume_from_where.name,
            )
        )
        return request.make_response(ResponseCode.SUCCESS, {}, body=body)

    @handles(RequestCode.GET_PRODUCER_CONNECTION_LIST)
    def _producer_connections(self, request: Request) -> RemotingCommand:
        """GET_PRODUCER_CONNECTION_LIST (204): ext `producerGroup`. Java's ProducerConnection,
        a Connection per member that named the group in its heartbeats' producerDataSet; 1 with
        Java's remark ("not exist") for a group without members."""
        header = admin_bodies.ProducerGroupRequestHeader.from_ext(request.command.ext_fields)
        members = self.clients.producer_members(header.producer_group)
        if not members:
            return request.make_response(
                ResponseCode.SYSTEM_ERROR,
                {},
                remark=f"the producer group[{_shown(header.producer_group)}] not exist",
            )
        connections = [
            admin_bodies.connection(m.client_id, m.client_addr, m.language, m.version)
            for m in members
        ]
        body = admin_bodies.dumps_fastjson(admin_bodies.producer_connection(connections))
        return request.make_response(ResponseCode.SUCCESS, {}, body=body)

    @handles(RequestCode.CHECK_CLIENT_CONFIG)
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
            admin_parcels.write_group_subscriptions(
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

    @handles(RequestCode.GET_CONSUMER_RUNNING_INFO)
    def _consumer_running_info(self, request: Request) -> RemotingCommand | None:
        """GET_CONSUMER_RUNNING_INFO (307) from an admin tool, as Java's
        AdminBrokerProcessor.callConsumer: the member named by ext `consumerGroup` and `clientId`
        must be online (else 1, "not online"); the request goes out on its connection with the
        admin's ext and body and an opaque from this process's counter, and the client's answer
        (code, remark, ext, body: the C++ body is not strict JSON, so it is relayed as bytes)
        becomes the admin's answer (`_on_client_response`). No answer within
        `client_call_timeout_ms` (10 s, Java's callClient) gives 207 CONSUME_MSG_TIMEOUT, Java's
        code for that case; the client's connection closing first gives 1 at once; more than
        CLIENT_CALL_COUNT_MAX calls in flight give 2 SYSTEM_BUSY. Returns None when the call is
        out: a held 307 is a table entry, not a wait."""
        command = request.command
        ext = command.ext_fields
        where = "GetConsumerRunningInfoRequestHeader"
        group = _required(ext, "consumerGroup", where)
        client_id = _required(ext, "clientId", where)
        return self._call_consumer(request, group, client_id, dict(ext), command.body)

    @handles(RequestCode.CONSUME_MESSAGE_DIRECTLY)
    def _consume_message_directly(self, request: Request) -> RemotingCommand | None:
        """CONSUME_MESSAGE_DIRECTLY (309) from an admin tool: ext `consumerGroup`, `clientId`,
        `msgId` (an offset message id). As Java's AdminBrokerProcessor.consumeMessageDirectly:
        the stored record at the id's offset becomes the body, ext `brokerName` is added, and
        the request is relayed to the member like 307; its answer (a
        ConsumeMessageDirectlyResult) is relayed back. A msgId that does not decode, or names
        no stored record, gets 1 with a remark (Java fails there without one)."""
        header = admin_bodies.ConsumeMessageDirectlyResultRequestHeader.from_ext(
            request.command.ext_fields
        )
        try:
            _host, log_offset_bytes = decode_offset_msg_id(header.msg_id)
        except MessageIllegalError as error:
            raise RemoteProtocolError(f"msgId: {error}") from None
        reader = self.store.for_log()
        if reader is None:
            return self._no_store(request)
        record = reader.read_message(log_offset_bytes)
        if record is None:
            return request.make_response(
                ResponseCode.SYSTEM_ERROR,
                {},
                remark=f"mqbox: no message at commit log offset {log_offset_bytes}",
            )
        ext = dict(request.command.ext_fields)
        ext["brokerName"] = self.ctx.broker.broker_name
        return self._call_consumer(request, header.consumer_group, header.client_id, ext, record)

    def _call_consumer(
        self, request: Request, group: str, client_id: str, ext: dict[str, str], body: bytes
    ) -> RemotingCommand | None:
        """Relay `request`'s code with `ext` and `body` to the online member `client_id` of
        `group` (Java's callConsumer; the rules are 307's); None when the call is out."""
        self._check_group(group)
        member = self.clients.consumer_member(group, client_id)
        if member is None:
            return request.make_response(
                ResponseCode.SYSTEM_ERROR,
                {},
                remark=f"The Consumer <{group}> <{_shown(client_id)}> not online",
            )
        refusal = self._client_call_refusal(request, len(body))
        if refusal is not None:
            return refusal
        opaque = next(self._notify_opaques)
        self.send_request(member.conn_id, make_request(request.code, opaque, ext, body=body))
        deadline_ns = self.clock_ns() + self.client_call_timeout_ns
        self._client_calls[(member.conn_id, opaque)] = _ClientCall(
            request, group, client_id, deadline_ns
        )
        return None

    def _client_call_refusal(self, request: Request, body_size: int) -> RemotingCommand | None:
        """2 when CLIENT_CALL_COUNT_MAX calls are out already, 1 for a request too large to
        forward; None when a call may go out."""
        if len(self._client_calls) >= CLIENT_CALL_COUNT_MAX:
            return request.make_response(
                ResponseCode.SYSTEM_BUSY,
                {},
                remark=f"mqbox: {CLIENT_CALL_COUNT_MAX} calls to clients are in flight already",
            )
        header_size = len(encode_header(request.command))
        if header_size + body_size > self.frame_size_bytes_max // 2:
            return request.make_response(
                ResponseCode.SYSTEM_ERROR, {}, remark="mqbox: the request is too large to forward"
            )
        return None

    @handles(RequestCode.INVOKE_BROKER_TO_GET_CONSUMER_STATUS)
    def _get_consumer_status(self, request: Request) -> RemotingCommand | None:
        """INVOKE_BROKER_TO_GET_CONSUMER_STATUS (223): ext `topic`, `group`, optional
        `clientAddr` (a client id). As Java's Broker2Client.getConsumeStatus: asks every online
        member of the group (or only that client) with GET_CONSUMER_STATUS_FROM_CLIENT (221,
        ext `topic` and `group`) and answers a GetConsumerStatusBody whose consumerTable maps
        each client id that answered 0 to its messageQueueTable; members that fail or stay
        silent (client_call_timeout_ms) are left out. No member online: 1 with Java's remark.
        Java asks the members one after another; mqbox asks them all at once."""
        header = admin_bodies.GetConsumerStatusRequestHeader.from_ext(request.command.ext_fields)
        self._check_group(header.group)
        members = [
            member
            for member in self.clients.consumer_members(header.group)
            if header.client_addr is None or member.client_id == header.client_addr
        ]
        if not self.clients.consumer_members(header.group):
            return request.make_response(
                ResponseCode.SYSTEM_ERROR,
                {},
                remark=f"No Any Consumer online in the consumer group: [{header.group}]",
            )
        if len(self._client_calls) + len(members) > CLIENT_CALL_COUNT_MAX:
            return request.make_response(
                ResponseCode.SYSTEM_BUSY,
                {},
                remark=f"mqbox: {CLIENT_CALL_COUNT_MAX} calls to clients are in flight already",
            )
        gather = _StatusGather(request, set(), {})
        ext = admin_bodies.GetConsumerStatusRequestHeader(header.topic, header.group).to_ext()
        deadline_ns = self.clock_ns() + self.client_call_timeout_ns
        for member in members:
            opaque = next(self._notify_opaques)
            self.send_request(
                member.conn_id,
                make_request(RequestCode.GET_CONSUMER_STATUS_FROM_CLIENT, opaque, dict(ext)),
            )
            key = (member.conn_id, opaque)
            gather.pending.add(key)
            self._client_calls[key] = _ClientCall(
                request, header.group, member.client_id, deadline_ns, gather
            )
        if not gather.pending:
            return self._status_answer(gather)
        return None

    @staticmethod
    def _status_answer(gather: _StatusGather) -> RemotingCommand:
        body = admin_bodies.dumps_fastjson(admin_bodies.get_consumer_status_body(gather.results))
        return gather.request.make_response(ResponseCode.SUCCESS, {}, body=body)

    def _gathered(self, call: _ClientCall, key: tuple[int, int], answer: Request | None) -> None:
        """One member's part of a 223: its table if it answered 0 with a body that reads;
        the 223's answer once no member is pending."""
        gather = call.gather
        assert gather is not None
        gather.pending.discard(key)
        if answer is not None and answer.command.code == ResponseCode.SUCCESS:
            try:
                status = admin_bodies.loads_fastjson(answer.command.body)
                table = status.get("messageQueueTable") if isinstance(status, dict) else None
            except RemoteProtocolError:
                table = None
            if isinstance(table, dict):
                gather.results[call.client_id] = table
        if not gather.pending:
            self.reply(gather.request, self._status_answer(gather))

    def _on_client_response(self, response: Request) -> None:
        """A client answered a broker request: relay it if a 307 or 309 waits for it, add it to
        its 223, else drop it."""
        key = (response.conn_id, response.opaque)
        call = self._client_calls.pop(key, None)
        if call is None:
            self.client_responses += 1  # to a oneway 40 or 220, or too late: nothing waits
            return
        self._client_calls_relayed += 1
        if call.gather is not None:
            self._gathered(call, key, response)
            return
        answer = response.command
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
            self._fail_client_call(key, call, ResponseCode.CONSUME_MSG_TIMEOUT, why)

    def _fail_client_call(
        self, key: tuple[int, int], call: _ClientCall, code: int, why: str
    ) -> None:
        self._client_calls_failed += 1
        if call.gather is not None:
            self._gathered(call, key, None)
            return
        remark = f"mqbox: consumer <{call.group}> <{_shown(call.client_id)}>: {why}"
        self.reply(call.request, call.request.make_response(code, {}, remark=remark))
