"""Which processor pool serves each request code: the one table.

Owns: `ROUTES`, request code -> `Route` (the pool's RoleKind, and whether only member 0 of the
pool may serve it), and `DEFAULT_ROUTE` for every code not listed. The worker forwards by it
(worker.py), admin.k (k > 0) refuses a member-0 code by it, and each processor's handler table
(`processors.handles`) must serve exactly the codes routed to its kind
(tests/unit/server/test_routing.py). Never: how a code is served (the handlers), or which member
of a pool a connection reaches (the worker: `conn % pool size`).

Member 0 only: state with one owner. admin.0 alone holds the client, offset and lock tables (and
the calls to clients, 307, 309 and 223, which need a client's connection from those tables), so
the worker sends those codes to admin.0 whatever the connection, and any admin pool size serves
them.

The default route is the admin pool, whose processors answer REQUEST_CODE_NOT_SUPPORTED (3) for a
code they have no handler for, as the Java broker does. ARCHITECTURE.md ("Adding a RocketMQ
admin code") says what else a new code touches.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final, NamedTuple

from mqbox.protocol.codes import RequestCode
from mqbox.protocol.mqbox_codes import (
    INVOKE_BROKER_TO_RESET_OFFSET,
    MQBOX_BROKER_STATUS,
    MQBOX_NOOP,
    MQBOX_PULL_STATUS,
    MQBOX_RESET_CONSUMER_OFFSET,
)
from mqbox.server.topology import RoleKind


class Route(NamedTuple):
    """Where a request code goes."""

    kind: RoleKind
    member_zero_only: bool = False


_SEND: Final = Route(RoleKind.SEND)
_PULL: Final = Route(RoleKind.PULL)
_ADMIN: Final = Route(RoleKind.ADMIN)
_ADMIN_ZERO: Final = Route(RoleKind.ADMIN, member_zero_only=True)

ROUTES: Final[Mapping[int, Route]] = {
    # send.py
    RequestCode.SEND_MESSAGE: _SEND,
    RequestCode.SEND_MESSAGE_V2: _SEND,
    RequestCode.SEND_BATCH_MESSAGE: _SEND,
    RequestCode.CONSUMER_SEND_MSG_BACK: _SEND,  # stores a retry or DLQ message
    # pull.py
    RequestCode.PULL_MESSAGE: _PULL,
    MQBOX_PULL_STATUS: _PULL,  # a pull processor's counters
    # admin/clients.py
    RequestCode.HEART_BEAT: _ADMIN_ZERO,
    RequestCode.UNREGISTER_CLIENT: _ADMIN_ZERO,
    RequestCode.GET_CONSUMER_LIST_BY_GROUP: _ADMIN_ZERO,
    RequestCode.GET_CONSUMER_RUNNING_INFO: _ADMIN_ZERO,
    RequestCode.CHECK_CLIENT_CONFIG: _ADMIN,
    RequestCode.GET_CONSUMER_CONNECTION_LIST: _ADMIN_ZERO,
    RequestCode.GET_PRODUCER_CONNECTION_LIST: _ADMIN_ZERO,
    RequestCode.CONSUME_MESSAGE_DIRECTLY: _ADMIN_ZERO,  # relayed like 307
    RequestCode.INVOKE_BROKER_TO_GET_CONSUMER_STATUS: _ADMIN_ZERO,  # 221 to each member
    # admin/offsets.py
    RequestCode.QUERY_CONSUMER_OFFSET: _ADMIN_ZERO,
    RequestCode.UPDATE_CONSUMER_OFFSET: _ADMIN_ZERO,
    RequestCode.LOCK_BATCH_MQ: _ADMIN_ZERO,
    RequestCode.UNLOCK_BATCH_MQ: _ADMIN_ZERO,
    INVOKE_BROKER_TO_RESET_OFFSET: _ADMIN_ZERO,
    RequestCode.GET_CONSUME_STATS: _ADMIN_ZERO,
    RequestCode.GET_BROKER_CONSUME_STATS: _ADMIN_ZERO,
    RequestCode.QUERY_TOPIC_CONSUME_BY_WHO: _ADMIN_ZERO,
    MQBOX_RESET_CONSUMER_OFFSET: _ADMIN_ZERO,
    RequestCode.GET_ALL_CONSUMER_OFFSET: _ADMIN_ZERO,
    RequestCode.GET_ALL_DELAY_OFFSET: _ADMIN,  # reads delayOffset.json
    # admin/groups.py: admin.0 holds the subscription group table
    RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP: _ADMIN_ZERO,
    RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG: _ADMIN_ZERO,
    RequestCode.DELETE_SUBSCRIPTIONGROUP: _ADMIN_ZERO,
    # admin/queries.py
    RequestCode.GET_MAX_OFFSET: _ADMIN,
    RequestCode.GET_MIN_OFFSET: _ADMIN,
    RequestCode.SEARCH_OFFSET_BY_TIMESTAMP: _ADMIN,
    RequestCode.GET_EARLIEST_MSG_STORETIME: _ADMIN,
    RequestCode.VIEW_MESSAGE_BY_ID: _ADMIN,
    RequestCode.QUERY_MESSAGE: _ADMIN,
    RequestCode.VIEW_BROKER_STATS_DATA: _ADMIN,
    RequestCode.GET_TOPIC_STATS_INFO: _ADMIN,
    # admin/broker_info.py
    RequestCode.GET_BROKER_RUNTIME_INFO: _ADMIN,
    RequestCode.GET_BROKER_CONFIG: _ADMIN,
    RequestCode.UPDATE_BROKER_CONFIG: _ADMIN,
    RequestCode.GET_SYSTEM_TOPIC_LIST_FROM_BROKER: _ADMIN,
    # admin/broker_status.py
    MQBOX_BROKER_STATUS: _ADMIN,
    # admin/topic_admin.py
    RequestCode.UPDATE_AND_CREATE_TOPIC: _ADMIN,
    RequestCode.DELETE_TOPIC_IN_BROKER: _ADMIN,
    RequestCode.GET_ALL_TOPIC_CONFIG: _ADMIN,
    MQBOX_NOOP: _ADMIN,
}
DEFAULT_ROUTE: Final = _ADMIN
# A client's response to a broker request goes back to admin.0, which sent the request.
CLIENT_RESPONSE_ROUTE: Final = _ADMIN_ZERO


def route_of(code: int) -> Route:
    return ROUTES.get(code, DEFAULT_ROUTE)


def codes_of(kind: RoleKind) -> frozenset[int]:
    """The codes routed to `kind`'s pool by name (not by default)."""
    return frozenset(code for code, route in ROUTES.items() if route.kind is kind)


MEMBER_ZERO_CODES: Final = frozenset(
    code for code, route in ROUTES.items() if route.member_zero_only
)
