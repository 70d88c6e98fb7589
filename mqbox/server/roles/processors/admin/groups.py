"""Subscription groups: create or update, list and delete (RocketMQ 4.9's admin codes).

Owns the handlers of UPDATE_AND_CREATE_SUBSCRIPTIONGROUP (200), GET_ALL_SUBSCRIPTIONGROUP_CONFIG
(201) and DELETE_SUBSCRIPTIONGROUP (207), served by admin.0 alone (routing.py): it holds the
subscription group table and is the one writer of config/subscriptionGroup.json, which the send
processors read for send-backs. Each change bumps the table's dataVersion (counter + 1, timestamp
now) and saves the file at once, as Java's SubscriptionGroupManager does; a slave copies the
table from its master when the versions differ (slave_sync.py). A slave refuses 200 and 207 with
Java's remark. Bodies and fields: docs/protocol.md section 4.5.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TypeVar

from mqbox.protocol.codes import RequestCode, ResponseCode
from mqbox.protocol.command import RemotingCommand
from mqbox.protocol.headers import (
    DataVersion as WireDataVersion,
)
from mqbox.protocol.headers import (
    DeleteSubscriptionGroupRequestHeader,
    SubscriptionGroupWrapper,
)
from mqbox.protocol.headers import (
    SubscriptionGroupConfig as WireSubscriptionGroupConfig,
)
from mqbox.server.roles.processors import Request, handles
from mqbox.server.roles.processors.admin.base import AdminBase
from mqbox.store import config_files
from mqbox.store.config_files import (
    DataVersion,
    SubscriptionGroupConfig,
    SubscriptionGroupTable,
)

log = logging.getLogger("mqbox.admin")

T = TypeVar("T")

RETRY_QUEUE_COUNT_MAX = 1024  # as many queues as a topic may have (base.TOPIC_QUEUE_COUNT_MAX)


def same_fields(record: object, target: type[T]) -> T:
    """`record` as a `target`, a dataclass whose fields all have their namesakes in `record`:
    the wire and file forms of a topic's or a group's configuration (headers.py and
    config_files.py keep one each, as the protocol and the store import nothing of each other)."""
    names = [field.name for field in dataclasses.fields(target)]  # type: ignore[arg-type]
    return target(**{name: getattr(record, name) for name in names})


def stored_group(config: WireSubscriptionGroupConfig) -> SubscriptionGroupConfig:
    """The wire form of a group's configuration as subscriptionGroup.json holds it."""
    return same_fields(config, SubscriptionGroupConfig)


def wire_group(config: SubscriptionGroupConfig) -> WireSubscriptionGroupConfig:
    """subscriptionGroup.json's record of a group in its wire form (201)."""
    return same_fields(config, WireSubscriptionGroupConfig)


class SubscriptionGroupAdmin(AdminBase):
    """Handlers of the subscription group table (admin.0)."""

    def replace_subscription_groups(self, table: SubscriptionGroupTable) -> None:
        """Save `table` as subscriptionGroup.json and adopt it (this section's changes and the
        slave sync)."""
        config_files.save_subscription_groups(self.config_dir, table)
        self.subscription_groups = table

    def _next_group_version(self) -> DataVersion:
        version = self.subscription_groups.data_version
        return DataVersion(timestamp_ms=self.wall_clock_ms(), counter=version.counter + 1)

    @handles(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP)
    def _update_and_create_group(self, request: Request) -> RemotingCommand:
        """UPDATE_AND_CREATE_SUBSCRIPTIONGROUP (200): the body is a SubscriptionGroupConfig,
        which replaces the group's (created when absent); 0, no body. A group name outside
        group_name_problem's rule or a retryQueueNums outside [0, 1024] (Java has no bound;
        every send-back to a retry queue creates it): 1 with a remark."""
        refusal = self._slave_refusal(request)
        if refusal is not None:
            return refusal
        config = WireSubscriptionGroupConfig.from_json(request.command.body)
        self._check_group(config.group_name)
        if not 0 <= config.retry_queue_nums <= RETRY_QUEUE_COUNT_MAX:
            return request.make_response(
                ResponseCode.SYSTEM_ERROR,
                {},
                remark=f"mqbox: retryQueueNums = {config.retry_queue_nums} is outside "
                f"[0, {RETRY_QUEUE_COUNT_MAX}]",
            )
        groups = dict(self.subscription_groups.groups)
        groups[config.group_name] = stored_group(config)
        self.replace_subscription_groups(SubscriptionGroupTable(groups, self._next_group_version()))
        log.info("subscription group %s created or updated", config.group_name)
        return request.make_response(ResponseCode.SUCCESS, {})

    @handles(RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG)
    def _all_groups(self, request: Request) -> RemotingCommand:
        """GET_ALL_SUBSCRIPTIONGROUP_CONFIG (201): 0 with Java's SubscriptionGroupWrapper body,
        `{"subscriptionGroupTable":{group:config},"dataVersion":{"counter","timestamp"}}`."""
        table = self.subscription_groups
        body = SubscriptionGroupWrapper(
            {name: wire_group(config) for name, config in sorted(table.groups.items())},
            WireDataVersion(table.data_version.counter, table.data_version.timestamp_ms),
        ).to_json()
        return request.make_response(ResponseCode.SUCCESS, {}, body=body)

    @handles(RequestCode.DELETE_SUBSCRIPTIONGROUP)
    def _delete_group(self, request: Request) -> RemotingCommand:
        """DELETE_SUBSCRIPTIONGROUP (207): ext `groupName`, `removeOffset`. Removes the group's
        configuration (a group that is not there: still 0, as Java answers) and, with
        removeOffset, its committed offsets (saved at once). A group that heartbeats again gets
        a new configuration with the defaults (autoCreateSubscriptionGroup)."""
        refusal = self._slave_refusal(request)
        if refusal is not None:
            return refusal
        header = DeleteSubscriptionGroupRequestHeader.from_ext(request.command.ext_fields)
        groups = dict(self.subscription_groups.groups)
        if groups.pop(header.group_name, None) is not None:
            self.replace_subscription_groups(
                SubscriptionGroupTable(groups, self._next_group_version())
            )
            log.info("subscription group %s deleted", header.group_name)
        if header.remove_offset and self.offsets.remove_group(header.group_name, self.clock_ns()):
            self.offsets.persist_now()
        return request.make_response(ResponseCode.SUCCESS, {})
