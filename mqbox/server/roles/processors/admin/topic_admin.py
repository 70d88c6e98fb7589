"""Topics and broker admin: create, delete and list topics; MQBOX_NOOP.

Owns the handlers of UPDATE_AND_CREATE_TOPIC (17), DELETE_TOPIC_IN_BROKER (215),
GET_ALL_TOPIC_CONFIG (21) and MQBOX_NOOP (10000), through topics.py's file lock; the services
role sees topics.json change and registers again. Any admin processor serves them. System
topics (TBW102, SCHEDULE_TOPIC_XXXX, RMQ_SYS_*, the cluster- and broker-named ones) are neither
created, replaced nor deleted, and a group's `%RETRY%` / `%DLQ%` topic keeps the permission the
broker needs (topics.py's refusals: 1 with a remark, as Java 4.9.x answers).
"""

from __future__ import annotations

import logging

from mqbox.protocol.codes import RequestCode, ResponseCode
from mqbox.protocol.command import (
    RemotingCommand,
    dumps_json,
)
from mqbox.protocol.headers import (
    DataVersion,
    DeleteTopicRequestHeader,
    UpdateAndCreateTopicRequestHeader,
    validate_topic,
)
from mqbox.protocol.headers import TopicConfig as WireTopicConfig
from mqbox.protocol.mqbox_codes import MQBOX_NOOP
from mqbox.server.roles.processors import Request, handles
from mqbox.server.roles.processors.admin.base import (
    PERM_MAX,
    TOPIC_QUEUE_COUNT_MAX,
    AdminBase,
)
from mqbox.server.roles.processors.topics import group_topic_perm_refusal, system_topic_refusal
from mqbox.store.config_files import TopicConfig

log = logging.getLogger("mqbox.admin")


class TopicAdmin(AdminBase):
    """Handlers of topic admin (any admin processor)."""

    @handles(RequestCode.UPDATE_AND_CREATE_TOPIC)
    def _update_and_create_topic(self, request: Request) -> RemotingCommand:
        """UPDATE_AND_CREATE_TOPIC (17): create or replace the topic's configuration under
        topics.py's file lock (the services role sees topics.json change and registers again).
        A slave refuses it (1, Java's remark): its topics are its master's."""
        header = UpdateAndCreateTopicRequestHeader.from_ext(request.command.ext_fields)
        refusal = self._slave_refusal(request)
        if refusal is not None:
            return refusal
        topic = header.topic
        problem = validate_topic(topic) or system_topic_refusal(topic, self.ctx.broker)
        if problem is None:
            for name, count in (
                ("readQueueNums", header.read_queue_nums),
                ("writeQueueNums", header.write_queue_nums),
            ):
                if not 1 <= count <= TOPIC_QUEUE_COUNT_MAX:
                    problem = f"{name} = {count} is outside [1, {TOPIC_QUEUE_COUNT_MAX}]"
        if problem is None and not 0 <= header.perm <= PERM_MAX:
            problem = f"perm = {header.perm} is outside [0, {PERM_MAX}]"
        if problem is None:
            problem = group_topic_perm_refusal(topic, header.perm)
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

    @handles(RequestCode.DELETE_TOPIC_IN_BROKER)
    def _delete_topic(self, request: Request) -> RemotingCommand:
        """DELETE_TOPIC_IN_BROKER (215): deletes the configuration only (17 if there is none;
        system topics stay, 1 with Java's remark): the consume queues belong to the dispatcher,
        and the committed offsets stay (as in Java); sending to the topic again brings it back.
        A slave refuses it, as 17."""
        header = DeleteTopicRequestHeader.from_ext(request.command.ext_fields)
        slave_refusal = self._slave_refusal(request)
        if slave_refusal is not None:
            return slave_refusal
        refusal = system_topic_refusal(header.topic, self.ctx.broker)
        if refusal is not None:
            return request.make_response(ResponseCode.SYSTEM_ERROR, {}, remark=refusal)
        if not self.topics.delete(header.topic):
            return request.make_response(
                ResponseCode.TOPIC_NOT_EXIST,
                {},
                remark=f"mqbox: topic {header.topic} does not exist on this broker",
            )
        return request.make_response(ResponseCode.SUCCESS, {})

    @handles(RequestCode.GET_ALL_TOPIC_CONFIG)
    def _all_topic_config(self, request: Request) -> RemotingCommand:
        """GET_ALL_TOPIC_CONFIG (21): topics.json's table and data version, as Java's
        TopicConfigSerializeWrapper."""
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

    @handles(MQBOX_NOOP)
    def _acknowledge(self, request: Request) -> RemotingCommand:
        """MQBOX_NOOP (10000): no ext, no body; SUCCESS at once (bench/hop.py)."""
        return request.make_response(ResponseCode.SUCCESS, {})
